"""The epoch shown with an evaluation: the trainer's own, else scaled from the last progress."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.events import RecordingReporter
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import RunState, StateStore
from cluster.supervisor import Supervisor
from cluster.training import JobRef, TrainOptions
from cluster.transport import TransportPool

from .conftest import INVENTORIES


@pytest.fixture
def supervisor(tmp_path):
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout", name="ep", mode="async"))
    store = StateStore(tmp_path / "state")
    store.save(RunState(name="ep", plan=plan, phase="up"))
    job = JobRef("distributed_mnist", "distributed_mnist", Path("/checkout/examples/distributed_mnist"), True)
    sup = Supervisor(store=store, name="ep", job=job, options=TrainOptions(), reporter=RecordingReporter(),
                     pool=TransportPool(), root=Path("/checkout"), clock=lambda: 100.0, sleep=lambda _: None,
                     wall=lambda: 1700000000.0)
    sup.state, sup.plan, sup.job_id = store.load("ep"), plan, 1
    sup.state.job = sup.new_job()
    sup.began = 90.0
    return sup


def _leader(sup):
    return SimpleNamespace(task=sup.leader, last_event=0.0, started=True)


def test_the_trainers_epoch_is_shown_even_before_any_progress_event(supervisor):
    supervisor.on_event(_leader(supervisor), {"event": "eval", "step": 128, "val_loss": 0.2,
                                               "val_accuracy": 0.95, "epoch": 0.2731}, now=100.0)
    (shown,) = supervisor.reporter.of("eval")
    assert (shown["step"], shown["epoch"], shown["seconds"]) == (128, 0.2731, 10.0)


def test_without_the_trainers_epoch_it_is_scaled_from_the_last_progress(supervisor):
    supervisor.set_job(step=100, epoch=0.5)
    supervisor.on_event(_leader(supervisor), {"event": "eval", "step": 150, "val_loss": 0.2,
                                               "val_accuracy": 0.95}, now=100.0)
    (shown,) = supervisor.reporter.of("eval")
    assert shown["epoch"] == 0.75
