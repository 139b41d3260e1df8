"""Races on the SSH lab: ``down`` forced into the middle of ``up --firewall`` (PSCLUSTER_TEST_PAUSE).

Before the fix, ``down`` landed before the hosts wrote their pid files, marked the records
stopped and deleted the state; ``up`` then started the servers, without their firewall, and
left them running, recorded nowhere."""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli
from testbed.procs import cluster_pids
from tests.local.test_process_control import down_at

pytestmark = [pytest.mark.lab]

GROUPS = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}


@pytest.mark.parametrize("point", ["before-start", "after-start"])
def test_down_in_the_middle_of_up_with_firewall_leaves_nothing(tmp_path, lab3, write_lab_inventory, point):
    name = f"lab-race-{point}"
    state_dir = tmp_path / "state"
    inventory = write_lab_inventory(lab3, tmp_path / "race.yaml", GROUPS, {
        "pscluster_port_base": port_base(), "pscluster_workdir": str(REPO), "pscluster_firewall": True})
    seen = {}
    try:
        code, stderr = down_at(point, ["up", inventory, "--name", name], name=name, state_dir=state_dir,
                               flag=tmp_path / "go", seen=seen.update)
        assert code == 1 and "taken down by another command" in stderr, stderr
        assert not (state_dir / f"{name}.json").exists()          # down's outcome stands
        assert seen["firewall"] and seen["processes"]             # the pause was mid-up indeed
        for host in ("node-1", "node-2", "node-3"):
            tables = lab3.exec_in_netns(host, ["nft", "list", "tables"]).stdout
            assert "pscluster" not in tables, (host, tables)
        if point == "before-start":
            for record in seen["processes"]:                      # nothing was ever spawned
                pid_file = record["log"] + ".pid"
                written = json.loads(open(pid_file).read()) if os.path.exists(pid_file) else {}
                assert written.get("token") != record["token"], pid_file
        assert_no_survivors(name)
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
        for pid in cluster_pids(name):        # what a failure left behind (processes this test started)
            os.kill(pid, 9)
