"""Detach and attach (issue 14 item 4) on real TensorFlow processes: ``train --detach`` returns
once the job runs, its terminal's whole process group is killed, the supervisor daemon survives
and still restarts a killed worker while nobody watches; ``attach`` then sees the job finish.
A second ``train`` is refused while the job is live; ``down`` leaves nothing, daemon included."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest
import yaml

from cluster.liveness import orchestrator_alive
from cluster.jobrecord import Orchestrator
from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base, run_cli, run_json
from testbed.procs import cluster_pids

NAME = f"detach-local-{os.getpid()}"
STEPS = 4000           # MLP, async, 2 workers: long enough to kill a worker mid-run and see it come back

pytestmark = pytest.mark.tf


def state_of(state_dir) -> dict:
    return json.loads((state_dir / f"{NAME}.json").read_text())


def wait_for(what: str, check, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.extended
def test_detached_job_survives_its_terminal_restarts_a_worker_and_attach_sees_it_finish(tmp_path):
    state_dir = tmp_path / "state"
    data = yaml.safe_load((REPO / "inventories" / "local.yaml").read_text())
    data["all"]["vars"].update(pscluster_port_base=port_base(),
                               pscluster_env={"MNIST_MODEL": "mlp", "OMP_NUM_THREADS": 1})
    inventory = tmp_path / "local.yaml"
    inventory.write_text(yaml.safe_dump(data))
    supervisor = None
    up = run_cli(["up", inventory, "--name", NAME], state_dir=state_dir, timeout=600)
    try:
        assert up.returncode == 0, up.stderr
        # The "terminal": a shell in its own session runs `train --detach`, then lingers like a prompt.
        out, code = tmp_path / "train.out", tmp_path / "train.rc"
        train = shlex.join(cli_argv(["train", "distributed_mnist", "--name", NAME, "--steps", STEPS, "--detach"]))
        terminal = subprocess.Popen(["bash", "-c", f"{train} >{out} 2>&1; echo $? >{code}; sleep 600"],
                                    cwd=REPO, env=cli_env(state_dir), start_new_session=True)
        try:
            wait_for("train --detach to return", lambda: code.exists() and code.read_text().strip())
            assert code.read_text().strip() == "0", out.read_text()
            job = state_of(state_dir)["job"]
            assert job["state"] in ("running", "restarting")      # it returned once the processes started
            supervisor = Orchestrator(**job["orchestrator"])
            assert supervisor.detached and supervisor.pid != terminal.pid
            assert os.getsid(supervisor.pid) == supervisor.pid     # its own session: no terminal to lose
        finally:
            os.killpg(terminal.pid, signal.SIGHUP)       # the terminal closes...
            os.killpg(terminal.pid, signal.SIGKILL)      # ...and everything in its process group dies
            terminal.wait()
        time.sleep(1.0)
        status = run_json(["status", "--name", NAME], state_dir=state_dir)
        assert status["supervisor"]["state"] == "alive" and status["supervisor"]["pid"] == supervisor.pid
        assert status["job"]["state"] in ("running", "restarting")

        # A second train is refused while the job is live, and starts nothing.
        again = run_cli(["train", "distributed_mnist", "--name", NAME, "--steps", 10], state_dir=state_dir)
        assert again.returncode == 2, again.stderr
        assert "is still running" in again.stderr and "--replace" in again.stderr
        assert state_of(state_dir)["job"]["id"] == job["id"]

        # Kill worker:1's server while nobody is attached: the daemon restarts it.
        wait_for("training steps", lambda: (state_of(state_dir)["job"].get("step") or 0) >= 200)
        worker = next(r for r in state_of(state_dir)["processes"] if r["task"] == "worker:1" and not r["stopped"])
        os.kill(worker["pid"], signal.SIGKILL)
        wait_for("the restart of worker:1",
                 lambda: state_of(state_dir)["job"].get("restarts", {}).get("worker:1", 0) >= 1, 300)

        attach = run_cli(["attach", "--name", NAME, "--json"], state_dir=state_dir, timeout=900)
        assert attach.returncode == 0, attach.stderr
        report = json.loads(attach.stdout)
        assert report["global_step"] >= STEPS and report["restarts"] == {"worker:1": 1}, report
        assert "task-restarted: worker:1@localhost" in attach.stderr      # replayed from while detached
        final = state_of(state_dir)["job"]
        assert final["state"] == "done" and final["id"] == job["id"]
        wait_for("the daemon to leave with its job", lambda: not orchestrator_alive(supervisor), 60)
        status = run_json(["status", "--name", NAME], state_dir=state_dir)
        assert status["supervisor"]["state"] == "ended"
    finally:
        run_cli(["down", "--name", NAME, "--grace", "3"], state_dir=state_dir, timeout=300)
        for pid in cluster_pids(NAME):
            os.kill(pid, signal.SIGKILL)
    assert_no_survivors(NAME)
    assert supervisor is None or not orchestrator_alive(supervisor)
    assert not list(state_dir.glob("*.events"))


def test_stop_job_checkpoints_and_down_ends_a_detached_supervisor(tmp_path):
    """stop-job asks the daemon to stop (the chief checkpoints first); down ends a daemon too."""
    name, state_dir = "detach-stop", tmp_path / "state"
    data = yaml.safe_load((REPO / "inventories" / "local.yaml").read_text())
    data["all"]["vars"].update(pscluster_port_base=port_base(),
                               pscluster_env={"MNIST_MODEL": "mlp", "OMP_NUM_THREADS": 1})
    inventory = tmp_path / "local.yaml"
    inventory.write_text(yaml.safe_dump(data))
    daemons = []
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, timeout=600)
        assert up.returncode == 0, up.stderr
        path = state_dir / f"{name}.json"
        for _ in range(2):
            started = run_cli(["train", "distributed_mnist", "--name", name, "--steps", 100000, "--detach"],
                              state_dir=state_dir, timeout=600)
            assert started.returncode == 0, started.stderr
            daemons.append(Orchestrator(**json.loads(path.read_text())["job"]["orchestrator"]))
            wait_for("training steps", lambda: (json.loads(path.read_text())["job"].get("step") or 0) >= 100)
            if len(daemons) == 1:
                stop = run_cli(["stop-job", "--name", name], state_dir=state_dir, timeout=600)
                assert stop.returncode == 0, stop.stderr
                job = json.loads(path.read_text())["job"]
                assert job["state"] == "stopped" and job["checkpoint_step"] >= 100, job
                assert not orchestrator_alive(daemons[0])
                attach = run_cli(["attach", "--name", name], state_dir=state_dir)
                assert attach.returncode == 130, attach.stderr
        down = run_cli(["down", "--name", name], state_dir=state_dir, timeout=300)
        assert down.returncode == 0, down.stderr
        assert not orchestrator_alive(daemons[1])
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir, timeout=300)
    assert_no_survivors(name)
