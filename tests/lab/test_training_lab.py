"""Training over real SSH: the 3-host lab, every host in its own workdir (code and jobs synced),
and `pscluster tensorboard` on the chief's host through the SSH forward."""
from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base, run_cli, run_json
from tests.local.test_tensorboard import read_scalars
from tests.local.test_training import USER_JOB

pytestmark = [pytest.mark.lab, pytest.mark.tf]


def test_async_training_across_three_hosts_with_synced_code(tmp_path, lab3, write_lab_inventory):
    name = "lab-train-async"
    state_dir = tmp_path / "state"
    workdirs = {host: tmp_path / f"work-{host}" for host in ("node-1", "node-2", "node-3")}
    groups = {"chief": {"node-1": {"pscluster_workdir": str(workdirs["node-1"])}},
              "ps": {"node-1": {"pscluster_workdir": str(workdirs["node-1"])},
                     "node-2": {"pscluster_workdir": str(workdirs["node-2"])}},
              "worker": {"node-2": {"pscluster_workdir": str(workdirs["node-2"])},
                         "node-3": {"pscluster_workdir": str(workdirs["node-3"])}}}
    inventory = write_lab_inventory(lab3, tmp_path / "train.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_mode": "async",
        "pscluster_env": {"OMP_NUM_THREADS": 1}, "pscluster_intra_op_threads": 1})
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        report = run_json(["train", "distributed_mnist", "--name", name, "--steps", 200, "--summary-every", 40],
                          state_dir=state_dir, timeout=900)
        assert report["mode"] == "async" and report["workers"] == 2 and report["global_step"] == 200
        assert report["val_accuracy"] >= 0.93
        # The chief kept the checkpoint on its own host, under its own workdir.
        assert report["checkpoint"].startswith(str(workdirs["node-1"]))
        state = json.loads((state_dir / f"{name}.json").read_text())
        chief = next(r for r in state["processes"] if r["task"] == "chief:0")
        # The chief ran in the standby `up` left on node-1 (TensorFlow imported; code synced again, unchanged).
        standby = next(r for r in state["processes"] if r["task"] == "chief:0" and r["kind"] == "standby")
        trainer = next(r for r in state["processes"] if r["task"] == "chief:0" and r["kind"] == "train")
        assert trainer["pid"] == standby["pid"] and standby["stopped"]
        environ = open(f"/proc/{state['processes'][0]['pid']}/environ", "rb").read().split(b"\0")
        assert b"PSCLUSTER_INTRA_OP_THREADS=1" in environ and b"OMP_NUM_THREADS=1" in environ
        assert chief["log"].startswith(str(workdirs["node-1"]))
        chief_summaries_served_through_the_forward(name, state_dir, workdirs)

        job = tmp_path / "control-machine-only" / "xor_job.py"
        job.parent.mkdir()
        job.write_text(USER_JOB)
        user = run_json(["train", job, "--name", name], state_dir=state_dir, timeout=600)
        assert user["val_accuracy"] >= 0.9
        copied = workdirs["node-1"] / ".pscluster" / name / "jobs" / "xor_job" / "xor_job.py"
        assert copied.read_text() == USER_JOB        # the job travelled to the chief's host
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)


def chief_summaries_served_through_the_forward(name, state_dir, workdirs) -> None:
    """The chief wrote the summaries on its own host, under its own workdir, and
    :func:`tensorboard_through_the_forward` serves them from there. (tests/lab/test_tensorboard_lab.py,
    extended: the same for a sync job's worker 0.)"""
    scalars = read_scalars(workdirs["node-1"] / ".pscluster" / name / "tensorboard" / "distributed_mnist")
    # One point per interval, at the first step the chief's closures reached at or past each
    # multiple of 40 (a closure may pass it: 82 for 80), the last at the budget.
    points = [step for step, _ in scalars["loss"]]
    assert len(points) == 5 and all(40 * n <= step < 40 * (n + 1) for n, step in enumerate(points, 1)), points
    assert points[-1] == 200, points
    assert not any((workdirs[host] / ".pscluster" / name / "tensorboard").exists() for host in ("node-2", "node-3"))
    tensorboard_through_the_forward(name, state_dir, "node-1")


def tensorboard_through_the_forward(name, state_dir, leader_host: str) -> None:
    """`pscluster tensorboard` on ``leader_host``, bound to that host's loopback (its own network
    namespace), answering on the local port forwarded over the SSH connection; SIGTERM stops it
    there and the forward goes with it."""
    port = port_base() + 15
    served = subprocess.Popen(cli_argv(["tensorboard", "--name", name, "--port", port]), cwd=REPO,
                              env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = served.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/", served.stderr.read() if not url else url
        with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=30) as response:
            assert "loss" in json.load(response)["distributed_mnist"]
        (record,) = [r for r in json.loads((state_dir / f"{name}.json").read_text())["processes"]
                     if r["kind"] == "tensorboard"]
        assert record["host"] == leader_host
        served.send_signal(signal.SIGTERM)
        assert served.wait(timeout=60) == 143, served.stderr.read()
    finally:
        if served.poll() is None:
            served.kill()
    (record,) = [r for r in json.loads((state_dir / f"{name}.json").read_text())["processes"]
                 if r["kind"] == "tensorboard"]
    assert record["stopped"]
    with pytest.raises(OSError):        # the forward went with the command
        urllib.request.urlopen(url, timeout=5)
