"""Sync modes under faults: scenarios 4-7 of the fault suite."""
from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.conftest import ACCURACY_BOUND, FAST_JOB_ENV

pytestmark = [pytest.mark.lab, pytest.mark.tf, pytest.mark.slow]

SYNC = {"worker": ["node-2", "node-3"]}
SYNC_PS = {"ps": ["node-1"], "worker": ["node-2", "node-3"]}
BUDGET = ("--steps", 300, "--checkpoint-every", 40)
# Sync mode with oneDNN trains 300 steps in ~5 s on a quiet machine: over before a test can see
# step 80 and act. The tests that interrupt a running sync job get a budget it cannot finish first;
# so does sync-ps since its trainers start in standbys (300 steps ~6 s after `train`, and a kill
# aimed at step 80 found the worker already done). 700, not 1500 (issue 47): the steps after the
# restart are the test's cost, and 700 leave a sync job 600 past the fault.
SYNC_STEPS = 700
SYNC_BUDGET = ("--steps", SYNC_STEPS, "--checkpoint-every", 40)


@pytest.mark.extended
def test_sync_worker_killed_group_restarts_and_completes(fault_cluster):
    cluster = fault_cluster()
    cluster.up(SYNC, "sync")
    training = cluster.train(*SYNC_BUDGET)
    job = training.wait_step(80)
    training.signal("worker:1", signal.SIGKILL)
    code, report = training.finish()
    assert code == 0, training.stderr
    assert report["global_step"] == SYNC_STEPS
    assert report["val_accuracy"] >= ACCURACY_BOUND
    assert report["restarts"] == {"worker:1": 1}
    assert report["restored_step"] >= job["checkpoint_step"] > 0
    assert "task-failed: worker:1@node-3: was killed by signal 9" in training.stderr


def test_sync_worker_frozen_is_detected_and_the_group_restarts(fault_cluster):
    cluster = fault_cluster()
    cluster.up(SYNC, "sync")
    training = cluster.train(*SYNC_BUDGET)
    training.wait_step(80)
    # Freeze the whole task (its guardian and the TensorFlow process under it), as a hung host would.
    frozen = training.record("worker:1")
    os.killpg(frozen["pgid"], signal.SIGSTOP)
    frozen_pid = frozen["pid"]
    stopped_at = time.monotonic()
    while not (training.job().get("restarts") or {}):
        assert time.monotonic() - stopped_at < 30, "the frozen worker was not detected within 30 s"
        time.sleep(0.2)
    detected = time.monotonic() - stopped_at
    code, report = training.finish()
    assert code == 0, training.stderr
    assert report["restarts"] == {"worker:1": 1}, training.stderr      # blamed: the frozen one
    assert "worker:1@node-3: is frozen" in training.stderr
    assert report["val_accuracy"] >= ACCURACY_BOUND
    restarted = [r for r in cluster.state()["processes"] if r["task"] == "worker:1" and r["kind"] == "train"]
    assert [r["pid"] for r in restarted][0] == frozen_pid and len(restarted) == 2
    print(f"frozen worker detected after {detected:.1f} s")


def test_sync_worker_that_never_starts_fails_the_job_naming_it(fault_cluster, tmp_path):
    broken = tmp_path / "broken-tf"
    (broken / "tensorflow").mkdir(parents=True)
    (broken / "tensorflow" / "__init__.py").write_text(
        "raise ImportError('libcudart.so.12: cannot open shared object file (worker host is broken)')\n")
    cluster = fault_cluster()
    groups = {"worker": {"node-2": {}, "node-3": {"pscluster_env": dict(FAST_JOB_ENV, PYTHONPATH=str(broken))}}}
    cluster.up(groups, "sync")
    training = cluster.train(*BUDGET, "--max-restarts", 2, "--start-timeout", 60)
    code, report = training.finish()
    assert code == 1
    assert report is None
    assert "worker:1@node-3" in training.stderr
    assert "restart budget exhausted (2 restart(s) used)" in training.stderr
    assert "libcudart.so.12: cannot open shared object file" in training.stderr    # its last log lines
    # Each attempt fails on its exit, not on the 60 s --start-timeout: three attempts waiting it
    # out would take 180 s or more. (Starting the group, stopping it and the backoffs take 2-3x
    # longer on a loaded machine: the bound is set against the 180 s.)
    assert training.elapsed < 2 * 60
    assert cluster.state()["job"]["state"] == "failed"
    live_training = [r for r in cluster.state()["processes"] if r["kind"] == "train" and not r["stopped"]]
    assert live_training == []


def test_syncps_worker_killed_group_restarts_and_completes(fault_cluster):
    cluster = fault_cluster()
    cluster.up(SYNC_PS, "sync-ps")
    training = cluster.train(*SYNC_BUDGET)
    job = training.wait_step(80)
    old_ps = training.record("ps:0", "server")
    training.signal("worker:1", signal.SIGKILL)
    code, report = training.finish()
    assert code == 0, training.stderr
    assert report["global_step"] >= 300
    assert report["val_accuracy"] >= ACCURACY_BOUND
    assert report["restarts"] == {"worker:1": 1}
    assert report["restored_step"] >= job["checkpoint_step"] > 0
    # The whole group restarted: the ps too (it holds the old graph's queues and accumulators).
    assert training.record("ps:0", "server")["pid"] != old_ps["pid"]
