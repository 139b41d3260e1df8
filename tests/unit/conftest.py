"""Fixtures of the unit tests: inventories written to a temporary directory.

Tests chdir into that directory and pass the file's bare name, so errors read exactly as a
user sees them (``lab.yaml:14: worker.hosts...``).
"""
from __future__ import annotations

import pathlib
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
INVENTORIES = REPO / "inventories"

# `plan --json` as the issue specifies it (extra keys are allowed).
PLAN_SCHEMA = {
    "type": "object",
    "required": ["cluster", "tasks"],
    "properties": {
        "cluster": {
            "type": "object",
            "propertyNames": {"enum": ["chief", "ps", "worker"]},
            "additionalProperties": {"type": "array", "items": {"type": "string", "pattern": r"^[^:]+:\d+$"}},
        },
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["role", "index", "host", "address", "port", "cuda_visible_devices", "tf_config",
                             "argv"],
                "properties": {
                    "role": {"enum": ["chief", "ps", "worker", "evaluator"]},
                    "index": {"type": "integer", "minimum": 0},
                    "host": {"type": "string"},
                    "address": {"type": "string"},
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "cuda_visible_devices": {"type": ["string", "null"]},
                    "tf_config": {"type": "object", "required": ["cluster", "task"]},
                    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                },
            },
        },
    },
}


@pytest.fixture
def write_inventory(tmp_path, monkeypatch):
    """``write_inventory(text, name="lab.yaml") -> "lab.yaml"`` (relative to the cwd, tmp_path)."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "lab.yaml") -> str:
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return name

    return write


def idle_supervisor(tmp_path, *, name: str, mode: str, options=None, inventory=None):
    """The executor of a training job (its kind a `TrainJob`) for the local inventory's plan, with
    its job record made and nothing started: for tests of what it decides and reports (the clock
    stands at 100 s, the job began at 90 s)."""
    from cluster.events import RecordingReporter
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    from cluster.state import RunState, StateStore
    from cluster.supervision.train_job import train_executor
    from cluster.supervision.train_spec import JobRef, JobOptions
    from cluster.transport import TransportPool

    plan = plan_cluster(load_inventory(str(inventory or INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout", name=name, mode=mode))
    store = StateStore(tmp_path / "state")
    store.save(RunState(name=name, plan=plan, phase="up"))
    job = JobRef("distributed_mnist", "distributed_mnist", pathlib.Path("/checkout/examples/distributed_mnist"), True)
    supervisor = train_executor(store=store, name=name, job=job, options=options or JobOptions(),
                                reporter=RecordingReporter(), pool=TransportPool(), root=pathlib.Path("/checkout"),
                                clock=lambda: 100.0, sleep=lambda _: None, wall=lambda: 1700000000.0)
    supervisor.begin()                 # job 1: the first of this cluster
    supervisor.began = 90.0
    return supervisor
