"""pscluster on a real Slurm: `up --slurm` inside an allocation, training as job steps, `down`, `scancel`.

The CLI runs like on a login node: with the job's SLURM_* variables, in a mount namespace whose
/etc/hosts names the compute nodes (the lab's nodes resolve nowhere else, docs/platform-notes.md S1).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from cluster.state import StateStore
from tests.helpers import cli_argv, cli_env, port_base
from testbed.procs import cluster_pids

pytestmark = [pytest.mark.lab, pytest.mark.tf, pytest.mark.slow]

ACCURACY_GOAL = 0.985          # issue 13: "trains to the accuracy goal" (distributed_mnist's, README)
ACCURACY_GOAL_STEPS = 1875     # sync CNN, 2 workers, batch 128: 4 epochs, job.py's default (3 epochs: 98.85-98.97 % in job.py,
                               # but 98.49 % in one clean-clone run on 2026-11-25; 900 steps gave 98.43 %)


def _cli(lab, job_env, args, state_dir, timeout=600):
    env = cli_env(state_dir, {**lab.env, **job_env, "OMP_NUM_THREADS": "1"})
    return subprocess.run(lab.login_shell() + cli_argv(args), env=env, capture_output=True, text=True,
                          timeout=timeout)


def _up_and_train(lab, job, name, state_dir, inventory, err_path, *up_args):
    """``up --slurm`` (async, one ps) then ``train distributed_mnist`` without end, in the
    background (its stderr in ``err_path``): the Popen, for the test to stop."""
    up = _cli(lab, job, ["up", "--slurm", inventory, "--name", name, "--mode", "async", "--ps", 1,
                         "--port-base", port_base(), *up_args], state_dir)
    assert up.returncode == 0, up.stdout + up.stderr
    return subprocess.Popen(lab.login_shell() + cli_argv(["train", "distributed_mnist", "--name", name,
                                                          "--steps", 100000, "--json"]),
                            env=cli_env(state_dir, {**lab.env, **job, "OMP_NUM_THREADS": "1"}),
                            stdout=subprocess.DEVNULL, stderr=open(err_path, "w"))


def _wait_gone(lab, name, seconds=60.0):      # a wait for a state: Slurm's kill (KillWait 5 s) is slower under load
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (cluster_pids(name) or lab.cgroup_pids()):
        time.sleep(0.3)
    return cluster_pids(name), lab.cgroup_pids()


@pytest.mark.parametrize("mode", ["async", pytest.param("sync", marks=pytest.mark.extended)])
def test_up_train_down_inside_an_allocation(slurm_lab, tmp_path, mode):
    job = slurm_lab.salloc("-N2", "--ntasks-per-node=1", "--gres=gpu:2")
    name = f"slurm-{mode}"
    state_dir = tmp_path / "state"
    inventory = tmp_path / "slurm.yaml"
    started = time.monotonic()
    try:
        too_many = _cli(slurm_lab, job, ["up", "--slurm", inventory, "--name", name, "--gpus-per-worker", 3],
                        state_dir)
        assert too_many.returncode == 2 and "need 3 GPUs" in too_many.stderr and "granted 2" in too_many.stderr
        assert "Traceback" not in too_many.stderr and not cluster_pids(name)
        up = _cli(slurm_lab, job, ["up", "--slurm", inventory, "--name", name, "--mode", mode,
                                   "--port-base", port_base(), "--gpus-per-worker", 1], state_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        seconds_up = time.monotonic() - started
        text = inventory.read_text()
        assert "ansible_connection: slurm" in text and f"job {job['SLURM_JOB_ID']}" in text
        # One worker per node, each given the first GPU Slurm granted there (the step sees 0,1).
        assert yaml.safe_load(text)["all"]["children"]["worker"]["hosts"] == {
            node: {"worker_tasks": 1, "worker_gpus": [[0]]} for node in slurm_lab.nodes}
        status = _cli(slurm_lab, job, ["status", "--name", name], state_dir)
        assert status.returncode == 0 and slurm_lab.nodes[1] in status.stdout, status.stdout + status.stderr
        train = _cli(slurm_lab, job, ["train", "distributed_mnist", "--name", name, "--steps", 100, "--json"],
                     state_dir)
        assert train.returncode == 0, train.stdout + train.stderr
        report = json.loads(train.stdout)
        assert report["mode"] == mode and report["workers"] == 2 and report["global_step"] >= 100
        # The servers are steps of the job on its nodes (not plain processes of the caller).
        assert set(slurm_lab.cgroup_pids()) >= set(cluster_pids(name))
        print(f"slurm {mode}: up in {seconds_up:.1f} s, up+train {time.monotonic() - started:.1f} s")
        logs = _cli(slurm_lab, job, ["logs", "--name", name, "worker:1"], state_dir)
        assert logs.returncode == 0 and "pscluster:" in logs.stdout, logs.stdout + logs.stderr
        down = _cli(slurm_lab, job, ["down", "--name", name], state_dir)
        assert down.returncode == 0, down.stdout + down.stderr
        assert _wait_gone(slurm_lab, name) == ([], [])
    finally:
        subprocess.run(["scancel", job["SLURM_JOB_ID"]], env=slurm_lab.env, capture_output=True)
    assert _wait_gone(slurm_lab, name) == ([], [])


def test_scancel_mid_training_leaves_nothing(slurm_lab, tmp_path):
    job = slurm_lab.salloc("-N2", "--ntasks-per-node=1")
    name = "slurm-scancel"
    state_dir = tmp_path / "state"
    up = _cli(slurm_lab, job, ["up", "--slurm", tmp_path / "s.yaml", "--name", name, "--mode", "async",
                               "--port-base", port_base()], state_dir)
    assert up.returncode == 0, up.stdout + up.stderr
    env = cli_env(state_dir, {**slurm_lab.env, **job})
    train = subprocess.Popen(slurm_lab.login_shell() + cli_argv(["train", "distributed_mnist", "--name", name,
                                                                 "--steps", 100000]),
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(cluster_pids(name)) < 6:   # 2 ps + chief + 2 workers + driver
            time.sleep(0.5)
        assert cluster_pids(name), "no task of the cluster is running"
        subprocess.run(["scancel", job["SLURM_JOB_ID"]], env=slurm_lab.env, check=True)
        assert _wait_gone(slurm_lab, name) == ([], [])
    finally:
        train.terminate()
        train.wait(timeout=30)


@pytest.mark.extended
def test_exported_batch_script_trains_inside_its_own_job(slurm_lab, tmp_path):
    """Issue 13: a batch job from `export --format sbatch` trains to the accuracy goal (98.5 %).
    The CNN, sync mode, 2 workers, 4 epochs (3 epochs once ended at 98.49 %, 900 steps at 98.43 %);
    the MLP levels off near 98 %, so it cannot serve here."""
    name = f"batch{os.getpid() % 10000}"
    inventory = tmp_path / "shape.yaml"     # the shape only: two hosts, one worker each (plan touches no host)
    inventory.write_text(yaml.safe_dump({"all": {"vars": {"pscluster_mode": "sync"}, "children": {
        "worker": {"hosts": {"a": {}, "b": {}}}, "chief": {"hosts": {"a": {}}}}}}))
    state_dir = tmp_path / "state"
    script = tmp_path / "job.sh"
    steps = ACCURACY_GOAL_STEPS
    export = subprocess.run(cli_argv(["export", inventory, "--format", "sbatch", "--steps", steps, "--time", "0:20:00",
                                      "--name", name, "-o", script]),
                            env=cli_env(state_dir), capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    began = time.monotonic()
    batch = subprocess.run(["sbatch", "--wait", "--parsable", "-o", str(tmp_path / "out-%j.txt"), str(script)],
                           cwd=tmp_path, env=cli_env(state_dir, {**slurm_lab.env, "OMP_NUM_THREADS": "1"}),
                           capture_output=True, text=True, timeout=900)
    job = batch.stdout.strip().split(";")[0]
    output = (tmp_path / f"out-{job}.txt").read_text()
    assert batch.returncode == 0, output + batch.stderr
    assert "ansible_connection: slurm" in (tmp_path / f"slurm-{job}.yaml").read_text()
    assert re.search(rf"global step\W+{steps}\b", output), output      # train's summary table, from the batch step
    assert "resumed from step" not in output        # --resume with no checkpoint yet: a first run starts at 0
    accuracy = float(re.search(r"validation accuracy\W+([0-9.]+)", output).group(1))
    print(f"batch: {steps} sync steps, test accuracy {accuracy:.4f}, sbatch to done {time.monotonic() - began:.1f} s")
    assert accuracy >= ACCURACY_GOAL, output
    assert _wait_gone(slurm_lab, name) == ([], [])


def _job_state(lab, job: str) -> dict[str, str]:
    detail = subprocess.run(["scontrol", "show", "job", job], env=lab.env, capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", detail))


# The budget of a requeued batch job (MLP, async, ~30 steps/s here): the first run is stopped at
# its first checkpoint (step 100) or first step, so 700 steps (~20 s) are left to spare, and the
# second run trains the rest. 2,000 until the twenty-first session: its second run trained ~1,900
# steps, a minute, in three tests (issue 47).
REQUEUE_STEPS = 800


def _requeued_batch_job(lab, tmp_path, name: str, steps: int, checkpoint_every: int, ready, interrupt,
                        export_extra=(), requeued=None):
    """Submit an exported async batch job (MLP), wait until ``ready(job_progress)``, call
    ``interrupt(job_id)``, wait for the job to end after one requeue; the output of both runs."""
    inventory = tmp_path / "shape.yaml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": {"pscluster_mode": "async"}, "children": {
        "worker": {"hosts": {"a": {}, "b": {}}}, "chief": {"hosts": {"a": {}}}, "ps": {"hosts": {"a": {}}}}}}))
    state_dir = tmp_path / "state"
    script = tmp_path / "job.sh"
    export = subprocess.run(cli_argv(["export", inventory, "--format", "sbatch", "--steps", steps, "--time", "0:30:00",
                                      "--checkpoint-every", checkpoint_every, "--name", name, "-o", script,
                                      *export_extra]),
                            env=cli_env(state_dir), capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    env = cli_env(state_dir, {**lab.env, "OMP_NUM_THREADS": "1", "MNIST_MODEL": "mlp"})
    submit = subprocess.run(["sbatch", "--parsable", "-o", str(tmp_path / "out-%j.txt"), str(script)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    output = tmp_path / f"out-{job}.txt"
    store = StateStore(state_dir)
    began = time.monotonic()
    try:
        deadline = time.monotonic() + 300
        progress = None
        while time.monotonic() < deadline:
            state = store.load(name)
            progress = state.job if state is not None else None
            if progress is not None and ready(progress):
                break
            time.sleep(0.5)
        assert progress is not None and ready(progress), output.read_text() if output.exists() else ""
        assert (progress.step or 0) < steps
        interrupt(job)
        stopped = time.monotonic()
        deadline = time.monotonic() + 600
        fields = _job_state(lab, job)
        released = False
        while time.monotonic() < deadline and not (fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED")
                                                   and int(fields.get("Restarts", "0")) >= 1):
            if not released and fields.get("JobState") == "PENDING" and int(fields.get("Restarts", "0")) >= 1:
                # Slurm holds a requeued job back (BeginTime about two minutes ahead); the admin's
                # StartTime=now lets the second run start at once, as an idle cluster would soon.
                if requeued is not None:
                    requeued(job)
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=lab.env,
                               capture_output=True)
                released = True
            time.sleep(1.0)
            fields = _job_state(lab, job)
        text = output.read_text()
        assert fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1", (fields, text)
        print(f"{name}: stopped at step {progress.step} after {stopped - began:.1f} s; second run done "
              f"{time.monotonic() - stopped:.1f} s later")
    finally:
        subprocess.run(["scancel", job], env=lab.env, capture_output=True)
    first, _, second = text.partition(f"job {job}, run 2,")
    assert second, text
    return first, second, progress


@pytest.mark.extended
def test_a_requeued_batch_job_resumes_from_its_checkpoint(slurm_lab, tmp_path):
    """Issue 13 item 4: the time-limit warning (USR1 to the batch shell, what `--signal=B:USR1@N`
    sends) stops training with a checkpoint, takes the cluster down and requeues the job; its
    second run resumes from that checkpoint and finishes the budget."""
    name, steps = f"requeue{os.getpid() % 10000}", REQUEUE_STEPS
    # No periodic checkpoint: the one the second run restores is the first run's checkpoint on stop.
    first, second, _ = _requeued_batch_job(
        slurm_lab, tmp_path, name, steps, 100000, ready=lambda job: (job.step or 0) > 0,
        interrupt=lambda job: subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=slurm_lab.env,
                                             check=True))
    assert "requeueing job" in first and re.search(r"checkpoint saved at step \d+", first), first
    saved = int(re.search(r"checkpoint saved at step (\d+)", first).group(1))
    assert 0 < saved < steps
    # The second run's summary: resumed from the checkpoint the first one saved, and finished the budget.
    assert int(re.search(r"resumed from step\W+(\d+)", second).group(1)) == saved, second
    assert int(re.search(r"global step\W+(\d+)", second).group(1)) >= steps, second
    assert _wait_gone(slurm_lab, name) == ([], [])


def test_a_preempted_batch_job_resumes_from_its_last_periodic_checkpoint(slurm_lab, tmp_path):
    """A preemption as Slurm does it under PreemptMode=REQUEUE (`scontrol requeue`: SIGTERM to
    every process of the job, SIGKILL after KillWait=5 s, the job back in the queue): the second
    run takes down what the first left, resumes from a checkpoint and finishes the budget."""
    name, steps = f"preempt{os.getpid() % 10000}", REQUEUE_STEPS
    first, second, progress = _requeued_batch_job(
        slurm_lab, tmp_path, name, steps, 100, ready=lambda job: (job.checkpoint_step or 0) > 0,
        interrupt=lambda job: subprocess.run(["scontrol", "requeue", job], env=slurm_lab.env, check=True))
    assert "requeueing job" not in first      # Slurm requeued it: no self-requeue
    resumed = int(re.search(r"resumed from step\W+(\d+)", second).group(1))
    assert resumed >= (progress.checkpoint_step or 0) > 0, second
    assert int(re.search(r"global step\W+(\d+)", second).group(1)) >= steps, second
    assert _wait_gone(slurm_lab, name) == ([], [])
