"""Detach and attach over real SSH (issue 14 item 4): a detached job on the 3-host lab, a worker
killed while nobody is attached, then ``attach`` sees the restart and the job finish. The
supervisor daemon runs on this (the control) machine and keeps one SSH watch stream per host."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from cluster.liveness import orchestrator_alive
from cluster.jobrecord import Orchestrator
from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base, run_cli, run_json

pytestmark = [pytest.mark.lab, pytest.mark.tf]
STEPS = 3000


def test_detach_kill_a_worker_attach_and_see_the_restart(tmp_path, lab3, write_lab_inventory):
    name, state_dir = "lab-detach", tmp_path / "state"
    work = {host: {"pscluster_workdir": str(tmp_path / f"work-{host}")} for host in ("node-1", "node-2", "node-3")}
    groups = {"chief": {"node-1": work["node-1"]}, "ps": {"node-1": work["node-1"], "node-2": work["node-2"]},
              "worker": {"node-2": work["node-2"], "node-3": work["node-3"]}}
    inventory = write_lab_inventory(lab3, tmp_path / "detach.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_mode": "async",
        "pscluster_env": {"MNIST_MODEL": "mlp", "OMP_NUM_THREADS": 1}, "pscluster_intra_op_threads": 1})
    path = state_dir / f"{name}.json"
    supervisor = None
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, timeout=600)
        assert up.returncode == 0, up.stderr
        # Started in its own session like a terminal's job, which is then killed whole.
        train = subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", name, "--steps", STEPS, "--detach"]),
                                 cwd=REPO, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        _, err = train.communicate(timeout=600)
        assert train.returncode == 0, err
        supervisor = Orchestrator(**json.loads(path.read_text())["job"]["orchestrator"])
        try:
            os.killpg(train.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        assert orchestrator_alive(supervisor) and os.getsid(supervisor.pid) == supervisor.pid

        deadline = time.monotonic() + 600
        while (json.loads(path.read_text())["job"].get("step") or 0) < 200:
            assert time.monotonic() < deadline, "no training progress"
            time.sleep(0.3)
        worker = next(r for r in json.loads(path.read_text())["processes"]
                      if r["task"] == "worker:1" and not r["stopped"])
        assert worker["host"] == "node-3"
        os.kill(worker["pid"], signal.SIGKILL)          # the lab's hosts share this machine's PID space

        attach = run_cli(["attach", "--name", name, "--json"], state_dir=state_dir, timeout=900)
        assert attach.returncode == 0, attach.stderr
        report = json.loads(attach.stdout)
        assert report["restarts"] == {"worker:1": 1} and report["global_step"] >= STEPS, report
        assert "task-restarted: worker:1@node-3" in attach.stderr
        status = run_json(["status", "--name", name], state_dir=state_dir)
        assert status["job"]["state"] == "done"
        assert {t["role"] + str(t["index"]): t["restarts"] for t in status["tasks"]}["worker1"] == 1
    finally:
        if path.exists():
            run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir, timeout=300)
    assert_no_survivors(name)
    assert supervisor is None or not orchestrator_alive(supervisor)
