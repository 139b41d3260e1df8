"""Three lab hosts sharing one workdir (as lab machines with an NFS home share ``~/pscluster``):
code is synced once per filesystem and per-task files do not collide."""
from __future__ import annotations

import json
import os
import stat

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli, run_json

pytestmark = [pytest.mark.lab, pytest.mark.tf]


@pytest.mark.extended
def test_up_train_down_on_one_shared_workdir(tmp_path, lab3, write_lab_inventory):
    name = "lab-shared-home"
    state_dir = tmp_path / "state"
    shared = tmp_path / "home" / "pscluster"          # empty, as on a first `up`
    groups = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}
    inventory = write_lab_inventory(lab3, tmp_path / "shared.yaml", groups, {
        "pscluster_workdir": str(shared), "pscluster_port_base": port_base(), "pscluster_mode": "async",
        "pscluster_env": {"OMP_NUM_THREADS": 1}, "pscluster_intra_op_threads": 1})
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        text = up.stdout + up.stderr
        assert text.count("file(s) sent") == 1, text                     # one copy for the filesystem
        assert text.count("'s copy (same filesystem)") == 2, text
        hostctl = shared / "roles" / "hostctl.py"
        assert stat.S_IMODE(hostctl.stat().st_mode) in (0o644, 0o755)
        assert not [p for p in shared.rglob("*pscluster-tmp*")]         # no temporary left behind
        assert (shared / ".pscluster" / "fsid").read_text().strip()

        report = run_json(["train", "distributed_mnist", "--name", name, "--steps", 100], state_dir=state_dir,
                          timeout=900)
        assert report["workers"] == 2 and report["global_step"] == 100
        state = json.loads((state_dir / f"{name}.json").read_text())
        logs = [r["log"] for r in state["processes"] if r.get("log")]
        assert len(logs) == len(set(logs)) >= 5                          # one log per task
        assert all(os.path.exists(log) for log in logs)
    finally:
        if (state_dir / f"{name}.json").exists():
            down = run_cli(["down", "--name", name], state_dir=state_dir)
            assert down.returncode == 0, down.stderr
    assert_no_survivors(name)
