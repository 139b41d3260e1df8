"""The side-car evaluator (issue 14) on real TensorFlow processes, in every mode.

A local inventory with an ``evaluator`` group: ``train --eval-every`` makes the trainers
checkpoint every so many steps instead of evaluating, and the evaluator reports one ``eval`` per
checkpoint it evaluated (always the final one) while the trainers evaluate only once, at the end.
"""
from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli, run_json

pytestmark = pytest.mark.tf

STEPS, EVERY = 256, 64

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    pscluster_env: {OMP_NUM_THREADS: 1, MNIST_MODEL: mlp}
  children:
    chief: {hosts: {localhost: }}
    ps: {hosts: {localhost: }}
    worker: {hosts: {localhost: {worker_tasks: 2}}}
    evaluator: {hosts: {localhost: }}
"""


def _events(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _events_of(state_dir, name: str, task: str) -> list[dict]:
    state = json.loads((state_dir / f"{name}.json").read_text())
    records = [r for r in state["processes"] if r["task"] == task and r["kind"] == "train"]
    return [event for record in records for event in _events(record["events"])]


@pytest.mark.parametrize("mode", ["async", *(pytest.param(m, marks=pytest.mark.extended) for m in ("sync", "sync-ps"))])
def test_an_evaluator_task_evaluates_each_checkpoint(tmp_path, mode):
    name, state_dir = f"local-evaluator-{mode}", tmp_path / "state"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    leader = "chief:0" if mode == "async" else "worker:0"
    shutil.rmtree(REPO / ".pscluster" / name / "tensorboard", ignore_errors=True)   # an earlier run's
    try:
        up = run_cli(["up", inventory, "--name", name, "--mode", mode, "--port-base", port_base()], state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        report = run_json(["train", "distributed_mnist", "--name", name, "--steps", STEPS, "--eval-every", EVERY,
                           "--checkpoint-dir", tmp_path / "ckpt"], state_dir=state_dir, timeout=900)
        assert report["global_step"] == STEPS and report["restarts"] == {}

        checkpoints = {e["step"] for e in _events_of(state_dir, name, leader) if e["event"] == "checkpoint"}
        assert checkpoints == set(range(EVERY, STEPS + 1, EVERY)), checkpoints   # --eval-every became the cadence
        side_car = [e for e in _events_of(state_dir, name, "evaluator:0") if e["event"] == "eval"]
        steps = [e["step"] for e in side_car]
        assert steps and steps == sorted(steps) and set(steps) <= checkpoints and steps[-1] == STEPS, steps
        assert all(0.5 < e["val_accuracy"] <= 1 for e in side_car), side_car
        # The final checkpoint holds the weights the leader evaluated last: the same accuracy.
        assert side_car[-1]["val_accuracy"] == pytest.approx(report["val_accuracy"], abs=1e-6)

        # TensorBoard's scalars (serialized Event protos: the tags and the plugin's name are plain bytes in them)
        # beside the leader's (one host, one workdir), so `pscluster tensorboard` shows them as run <job>/eval
        folder = REPO / ".pscluster" / name / "tensorboard" / "distributed_mnist" / "eval"
        summaries = b"".join(path.read_bytes() for path in folder.glob("events.out.tfevents.*"))
        assert all(tag in summaries for tag in (b"val_accuracy", b"val_loss", b"scalars")), summaries[:200]

        # The trainers did not evaluate periodically: only the leader's final evaluation.
        trainer_evals = [e["step"] for task in {leader, "worker:0", "worker:1"}
                         for e in _events_of(state_dir, name, task) if e["event"] == "eval"]
        assert trainer_evals == [STEPS], trainer_evals

        # --json reports the evaluator's evaluations, by task.
        reported = [(e["task"], e["step"]) for e in report["evals"]]
        assert [s for t, s in reported if t == "evaluator:0"] == steps and (leader, STEPS) in reported, reported
        status = run_json(["status", "--name", name], state_dir=state_dir)
        assert status["job"]["state"] == "done"
        rows = {(row["role"], row["index"]): row["state"] for row in status["tasks"]}
        assert rows[("evaluator", 0)] in ("exited", "stopped"), rows
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)
