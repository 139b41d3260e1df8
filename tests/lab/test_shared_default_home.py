"""The defaults a lab user gets on hosts that share a home (issue 12 item 4): no
``pscluster_workdir`` in the inventory, so every host resolves ``~/pscluster`` itself, and
``~`` is one folder for all three hosts (their SSH sessions get the same HOME, as users of an
NFS home do). Starts from an empty home, as a first ``up`` on such a lab does."""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli, run_json

pytestmark = [pytest.mark.lab, pytest.mark.tf]


def test_default_workdir_on_a_shared_home_up_train_down(tmp_path, make_lab, write_lab_inventory):
    home = tmp_path / "nfs-home"
    home.mkdir()
    lab = make_lab(3, session_env={"HOME": str(home)})
    name = "lab-default-home"
    state_dir = tmp_path / "state"
    groups = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}
    inventory = write_lab_inventory(lab, tmp_path / "hosts.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_mode": "async",
        "pscluster_env": {"OMP_NUM_THREADS": 1, "MNIST_MODEL": "mlp"}, "pscluster_intra_op_threads": 1})
    assert "pscluster_workdir" not in inventory.read_text()
    workdir = home / "pscluster"
    plan = run_json(["plan", inventory, "--name", name], state_dir=state_dir)
    assert {task["workdir"] for task in plan["tasks"]} == {"~/pscluster"}      # resolved by each host
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        text = up.stdout + up.stderr
        assert text.count("file(s) sent") == 1, text                        # one copy for the shared home
        assert text.count("'s copy (same filesystem)") == 2, text
        assert (workdir / "roles" / "hostctl.py").is_file()
        assert not list(workdir.rglob("*pscluster-tmp*"))

        report = run_json(["train", "distributed_mnist", "--name", name, "--steps", 60], state_dir=state_dir,
                          timeout=900)
        assert report["workers"] == 2 and report["global_step"] == 60
        state = json.loads((state_dir / f"{name}.json").read_text())
        standby, trainer = (next(r for r in state["processes"] if r["task"] == "chief:0" and r["kind"] == kind)
                            for kind in ("standby", "train"))
        assert trainer["pid"] == standby["pid"]      # the shared home's code sync left the standby's sources alone
        logs = [record["log"] for record in state["processes"] if record.get("log")]
        assert len(logs) == len(set(logs)) >= 5                              # per-task files apart
        assert all(log.startswith(str(workdir) + "/") and os.path.exists(log) for log in logs), logs
        pid_files = [path for path in workdir.rglob("*.pid")]
        assert pid_files
    finally:
        if (state_dir / f"{name}.json").exists():
            down = run_cli(["down", "--name", name], state_dir=state_dir)
            assert down.returncode == 0, down.stdout + down.stderr
    assert_no_survivors(name)
    assert not (state_dir / f"{name}.json").exists()
    assert not list(workdir.rglob("*.pid"))                                  # down leaves no pid file
    assert not list(workdir.rglob("*.cancel"))
