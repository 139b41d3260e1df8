"""Async mode (ParameterServerStrategy) under faults: scenarios 1-3 of the fault suite."""
from __future__ import annotations

import signal

import pytest

from tests.faults.conftest import ACCURACY_BOUND

pytestmark = [pytest.mark.lab, pytest.mark.tf, pytest.mark.slow]

ASYNC = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}
CHECKPOINT_EVERY = 50
BUDGET = ("--steps", 600, "--checkpoint-every", CHECKPOINT_EVERY)


def test_worker_killed_is_restarted_and_the_job_completes(fault_cluster):
    cluster = fault_cluster()
    cluster.up(ASYNC, "async")
    training = cluster.train(*BUDGET)
    training.wait_step(100)
    killed = training.signal("worker:1", signal.SIGKILL)
    code, report = training.finish()
    assert code == 0, training.stderr
    assert report["global_step"] >= 600     # closures in flight on a dead task are re-run
    assert report["val_accuracy"] >= ACCURACY_BOUND
    assert report["restarts"] == {"worker:1": 1}
    assert "worker:1@node-3" in training.stderr          # the change was reported, naming task and host
    restarted = training.record("worker:1", "server")
    assert restarted["pid"] != killed["pid"] and restarted["attempt"] == 2
    status = cluster.cli("status", "--json", check=True)
    assert '"restarts": 1' in status.stdout


def test_ps_killed_job_resumes_from_the_last_checkpoint(fault_cluster):
    cluster = fault_cluster()
    cluster.up(ASYNC, "async")
    training = cluster.train(*BUDGET)
    job = training.wait_step(150)
    training.signal("ps:1", signal.SIGKILL)
    code, report = training.finish()
    assert code == 0, training.stderr
    assert report["global_step"] >= 600     # closures in flight on a dead task are re-run
    assert report["val_accuracy"] >= ACCURACY_BOUND
    assert report["restarts"].get("ps:1") == 1
    assert report["restarts"].get("chief:0", 0) >= 1        # the coordinator fails with its ps and is restarted
    assert report["restored_step"] >= job["checkpoint_step"] > 0
    assert report["restored_step"] % CHECKPOINT_EVERY == 0     # checkpoints fall on the boundaries
    # Scheduling never crosses a checkpoint boundary, so each recovery redoes at most one interval.
    assert 0 <= report["steps_redone"] <= CHECKPOINT_EVERY * report["restarts"]["chief:0"]


def test_chief_killed_job_resumes_from_the_last_checkpoint(fault_cluster):
    cluster = fault_cluster()
    cluster.up(ASYNC, "async")
    training = cluster.train(*BUDGET)
    job = training.wait_step(150)
    training.signal("chief:0", signal.SIGKILL)
    code, report = training.finish()
    assert code == 0, training.stderr
    assert report["global_step"] >= 600     # closures in flight on a dead task are re-run
    assert report["val_accuracy"] >= ACCURACY_BOUND
    assert report["restarts"] == {"chief:0": 1}
    assert report["restored_step"] >= job["checkpoint_step"] > 0
    assert report["restored_step"] % CHECKPOINT_EVERY == 0
    assert 0 <= report["steps_redone"] <= CHECKPOINT_EVERY     # one recovery: at most one interval redone
