"""No lost work on stop (issue 23, item 1), on real TensorFlow processes in every mode.

* `down` from another terminal, while `train` runs attached, first stops the job as `stop-job`
  does: the leader (every worker in sync mode) saves a checkpoint newer than the last periodic
  one, at the step it reached, and `train --resume` continues there (redoes no step).
* `down` of a job whose supervisor is gone does the same from the records.
* sync: a SIGTERM to one worker alone (a preemption notice) makes every worker save at one step;
  the supervisor then relaunches the group, which resumes there.
* `status` shows the step of the last checkpoint and the steps since.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base
from testbed.procs import cluster_pids

LOCAL = REPO / "tests" / "fixtures" / "local-mlp.yaml"      # inventories/local.yaml, the MLP
CHECKPOINT_EVERY = {"async": 320, "sync": 100, "sync-ps": 50}
PAST = 20           # steps past the periodic checkpoint before the stop

pytestmark = pytest.mark.tf


def cli(state_dir, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(args), cwd=REPO, env=cli_env(state_dir), capture_output=True, text=True,
                          timeout=timeout)


def job_record(state_dir, name) -> dict:
    try:
        return json.loads((state_dir / f"{name}.json").read_text()).get("job") or {}
    except FileNotFoundError:
        return {}


def cleanup(state_dir, name) -> None:
    cli(state_dir, "down", "--name", name, "--now", "--grace", "2", timeout=300)
    for pid in cluster_pids(name):
        os.kill(pid, signal.SIGKILL)
    assert_no_survivors(name)


def start_training(state_dir, name, ckpt, mode, *extra) -> subprocess.Popen:
    return subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", name, "--steps", "100000",
                                      "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(CHECKPOINT_EVERY[mode]),
                                      *extra]),
                            cwd=REPO, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_past_a_periodic_checkpoint(state_dir, name, train: subprocess.Popen | None = None) -> dict:
    """The job record once a periodic checkpoint exists and PAST more steps ran (a state, not a time)."""
    end = time.monotonic() + 600
    while True:
        if train is not None:
            assert train.poll() is None, train.stderr.read()[-3000:] if train.stderr else train.returncode
        assert time.monotonic() < end, f"never got {PAST} steps past a periodic checkpoint: {job_record(state_dir, name)}"
        job = job_record(state_dir, name)
        if job.get("checkpoint_step") and (job.get("step") or 0) >= job["checkpoint_step"] + PAST:
            return job
        time.sleep(0.3)


def latest_checkpoint_step(ckpt) -> int:
    """The step of the newest checkpoint TensorFlow's index file in ``ckpt`` names."""
    index = (ckpt / "checkpoint").read_text()
    line = next(line for line in index.splitlines() if line.startswith("model_checkpoint_path"))
    return int(line.split("ckpt-")[-1].strip().strip('"'))


MORE = 40          # steps the resumed job trains past the step it restored


def resumed_step(state_dir, name, ckpt, mode, saved: int) -> int:
    """Bring the cluster up again and resume from ``saved`` for MORE steps (it goes on from there:
    the proof tests/local/test_training.py's resume test gave apart, issue 47); the step the job
    restored."""
    up = cli(state_dir, "up", LOCAL, "--name", name, "--mode", mode, "--port-base", port_base())
    assert up.returncode == 0, up.stderr
    out = cli(state_dir, "train", "distributed_mnist", "--name", name, "--resume", "--steps", str(saved + MORE),
              "--checkpoint-dir", str(ckpt), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["global_step"] == saved + MORE, report
    return report["restored_step"]


@contextlib.contextmanager
def local_cluster(tmp_path, tag: str, mode: str):
    """``up`` of inventories/local.yaml in ``mode``; yields (name, state dir, checkpoint dir);
    stops whatever is left afterwards."""
    name, state_dir, ckpt = f"keep-{tag}-{os.getpid()}", tmp_path / "state", tmp_path / "ckpt"
    up = cli(state_dir, "up", LOCAL, "--name", name, "--mode", mode, "--port-base", port_base())
    try:
        assert up.returncode == 0, up.stderr
        yield name, state_dir, ckpt
    finally:
        cleanup(state_dir, name)


@pytest.mark.parametrize("mode", ["async", *(pytest.param(m, marks=pytest.mark.extended) for m in ("sync", "sync-ps"))])
def test_down_mid_train_checkpoints_first_and_resume_redoes_no_step(tmp_path, mode):
    with local_cluster(tmp_path, mode, mode) as (name, state_dir, ckpt):
        train = start_training(state_dir, name, ckpt, mode)
        try:
            before = wait_past_a_periodic_checkpoint(state_dir, name, train)
            status = cli(state_dir, "status", "--name", name, "--json")
            assert status.returncode == 0, status.stderr
            shown = json.loads(status.stdout)["job"]
            assert shown["checkpoint_step"] >= before["checkpoint_step"], shown
            # (a checkpoint event can be recorded before the progress event of its step)
            assert shown["steps_since_checkpoint"] == max(0, shown["step"] - shown["checkpoint_step"]), shown
            down = cli(state_dir, "down", "--name", name)      # another terminal; no --now
            _, train_err = train.communicate(timeout=300)
        finally:
            if train.poll() is None:
                train.kill()
        assert down.returncode == 0, down.stderr
        assert train.returncode == 143, train_err
        said = " ".join(train_err.split())
        assert "checkpoint saved at step" in said, train_err
        saved = int(said.split("checkpoint saved at step ")[1].split(":")[0])
        assert saved > before["checkpoint_step"] and saved >= before["step"], (before, saved)
        assert latest_checkpoint_step(ckpt) == saved
        assert not cluster_pids(name), "down left processes running"
        # The trainer stops at the step it saves: resuming there redoes nothing it had trained.
        assert resumed_step(state_dir, name, ckpt, mode, saved) == saved


def test_down_checkpoints_a_job_whose_supervisor_is_gone(tmp_path):
    mode = "async"
    with local_cluster(tmp_path, "orphan", mode) as (name, state_dir, ckpt):
        train = start_training(state_dir, name, ckpt, mode)
        try:
            before = wait_past_a_periodic_checkpoint(state_dir, name, train)
        finally:
            train.kill()            # the supervisor dies; its job runs on, unsupervised
            train.communicate(timeout=60)
        down = cli(state_dir, "down", "--name", name)
        assert down.returncode == 0, down.stderr
        said = " ".join(down.stderr.split())
        assert "checkpoint saved at step" in said, down.stderr
        saved = latest_checkpoint_step(ckpt)
        assert saved > before["checkpoint_step"] and saved >= before["step"], (before, saved, down.stderr)
        assert f"checkpoint saved at step {saved}" in said
        assert not cluster_pids(name)


def stop_events(record: dict) -> list[dict]:
    """The ``error`` events of exception ``Stopped`` in one process record's events file."""
    lines = open(record["events"]).read().splitlines() if record.get("events") else []
    events = [json.loads(line) for line in lines if line.strip()]
    return [e for e in events if e.get("event") == "error" and e.get("exception") == "Stopped"]


def test_sigterm_to_one_sync_worker_makes_every_worker_save_and_the_group_resume_there(tmp_path):
    mode = "sync"
    with local_cluster(tmp_path, "preempt", mode) as (name, state_dir, ckpt):
        train = start_training(state_dir, name, ckpt, mode, "--max-restarts", "2")
        try:
            wait_past_a_periodic_checkpoint(state_dir, name, train)
            first = {r["task"]: r for r in json.loads((state_dir / f"{name}.json").read_text())["processes"]
                     if r["kind"] == "train" and not r.get("stopped")}
            os.kill(first["worker:1"]["pid"], signal.SIGTERM)     # worker 1 alone, as a preemption notice would
            end = time.monotonic() + 600
            while True:
                job = job_record(state_dir, name)
                if job.get("restored_step") and job.get("state") == "running" and job.get("step", 0) > job["restored_step"]:
                    break
                assert train.poll() is None, train.stderr.read()[-3000:]
                assert time.monotonic() < end, f"the group never resumed: {job}"
                time.sleep(0.3)
        finally:
            train.send_signal(signal.SIGTERM)
            _, train_err = train.communicate(timeout=300)
        # Each worker of the first attempt ended "Stopped" at one and the same step ...
        stops = {task: stop_events(record) for task, record in first.items()}
        assert all(len(found) == 1 for found in stops.values()), stops
        steps = {task: int(found[0]["message"].split(" at step ")[1].split(";")[0]) for task, found in stops.items()}
        assert len(set(steps.values())) == 1, steps
        assert "by SIGTERM" in stops["worker:1"][0]["message"] and "peer" in stops["worker:0"][0]["message"], stops
        # ... saved there, and the relaunched group restored that step: no step redone.
        assert job["restored_step"] == steps["worker:0"], (job, steps)
        assert job["restarts"], job


def test_a_stop_with_a_frozen_worker_ends_the_async_chief_instead_of_hanging_until_the_grace(tmp_path):
    """A closure that waits on a frozen (or lost) worker never returns, and TensorFlow holds the
    chief's writes (its save too) behind it: the chief hung until the stop's grace ran out and was
    killed. It now waits 2 s for its closures, then ends on its own, saying why. The job's
    --stop-grace here is 600 s and the stop is given 300: it cannot end by the grace's kill."""
    with local_cluster(tmp_path, "frozen", "async") as (name, state_dir, ckpt):
        train = start_training(state_dir, name, ckpt, "async", "--stop-grace", "600")
        frozen = None
        try:
            wait_past_a_periodic_checkpoint(state_dir, name, train)
            state = json.loads((state_dir / f"{name}.json").read_text())
            frozen = next(r["pid"] for r in state["processes"] if r["task"] == "worker:1" and not r.get("stopped"))
            os.kill(frozen, signal.SIGSTOP)
            # stop-job returns once the job is stopped: the chief ended by itself, well inside the grace.
            stop = cli(state_dir, "stop-job", "--name", name, timeout=300)
            assert stop.returncode == 0, stop.stderr
            _, err = train.communicate(timeout=300)
        finally:
            if frozen is not None:
                os.kill(frozen, signal.SIGCONT)
            if train.poll() is None:
                train.kill()
        logs = "".join(path.read_text() for path in (REPO / ".pscluster" / name).glob("job-*/chief-0.*.log"))
        assert "ending without a checkpoint" in logs, logs[-3000:]
        assert job_record(state_dir, name).get("state") == "stopped", err[-3000:]
