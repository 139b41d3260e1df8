"""Training over real SSH: the 3-host lab, every host in its own workdir (code and jobs synced)."""
from __future__ import annotations

import json

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli, run_json
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
        report = run_json(["train", "distributed_mnist", "--name", name, "--steps", 200], state_dir=state_dir,
                          timeout=900)
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
