"""The many-hosts lab (testbed/manylab.py) at its smallest: four SSH hosts on its /16, whose
standing servers are stand-ins (testbed/standin.py) reached through ``pscluster_python``, brought
up, probed, grown by one host and brought down by the real CLI, leaving nothing behind. The
figures at scale are benchmarks/scale.py's, not this test's."""
from __future__ import annotations

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli, run_json
from testbed import manylab

pytestmark = pytest.mark.lab


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode()


def test_four_hosts_come_up_with_standins_grow_by_one_and_go_down(lab_base, tmp_path):
    lab = manylab.ManyLab(5, lab_base / f"many-{tmp_path.name}"[:60], subnet=manylab.free_subnet(80))
    with lab:
        base = port_base()
        inventory = manylab.write_inventory(lab, tmp_path / "many.yaml", hosts=4, port_base=base)
        grown = manylab.write_inventory(lab, tmp_path / "many5.yaml", hosts=5, port_base=base)
        state = tmp_path / "state"
        try:
            up = run_json(["up", str(inventory), "--name", "many"], state_dir=state, timeout=240)
            servers = [t for t in up["tasks"] if t["role"] == "ps"]
            assert [t["index"] for t in servers] == [0, 1, 2, 3]
            for task in servers:      # ready: the stand-in answered pscluster's gRPC GetStatus probe
                assert task["state"] == "ready" and any("CPU:0" in d for d in task["devices"]), task
                assert str(manylab.STANDIN) in _cmdline(task["pid"])      # the stand-in, not TensorFlow
            scaled = run_cli(["scale", str(grown), "--name", "many"], state_dir=state, timeout=240)
            assert scaled.returncode == 0, scaled.stderr
            # the code went to the new host only: the others have this tree since `up` (issue 46)
            synced = [line.split(":")[0].strip() for line in scaled.stderr.splitlines() if "file(s) sent" in line]
            assert synced == ["node-5"], scaled.stderr
            status = run_json(["status", "--name", "many"], state_dir=state)
            ready = {t["index"]: t["host"] for t in status["tasks"] if t["role"] == "ps" and t["state"] == "ready"}
            assert ready == {0: "node-1", 1: "node-2", 2: "node-3", 3: "node-4", 4: "node-5"}
        finally:
            down = run_cli(["down", "--name", "many", "--grace", "2"], state_dir=state, timeout=240)
        assert down.returncode == 0, down.stderr
        assert_no_survivors("many")
    assert lab.leftovers() == []
