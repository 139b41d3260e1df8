"""Locked-down clusters on the SSH lab: the nftables firewall and secret environment values."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli, run_json

pytestmark = [pytest.mark.lab, pytest.mark.tf]

GROUPS = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}
CONNECT = ("import json,socket,sys\n"
           "out={}\n"
           "for target in sys.argv[1:]:\n"
           "    host,port=target.rsplit(':',1); s=socket.socket(); s.settimeout(1.5)\n"
           "    out[target]=s.connect_ex((host,int(port)))==0; s.close()\n"
           "print(json.dumps(out))\n")


def _connect_from(lab, host: str, targets: list[str]) -> dict[str, bool]:
    proc = lab.exec_in_netns(host, [sys.executable, "-c", CONNECT, *targets], timeout=60)
    return json.loads(proc.stdout)


def _tables(lab, host: str) -> str:
    return lab.exec_in_netns(host, ["nft", "list", "tables"]).stdout


def test_firewall_admits_members_and_drops_outsiders(tmp_path, make_lab, write_lab_inventory):
    lab = make_lab(4)            # node-4 is not in the inventory: the outsider
    name = "lab-firewall"
    state_dir = tmp_path / "state"
    inventory = write_lab_inventory(lab, tmp_path / "fw.yaml", GROUPS, {
        "pscluster_port_base": port_base(), "pscluster_workdir": str(REPO), "pscluster_firewall": True})
    try:
        # The operator's own SSH session (a laptop, a bastion) must not be what gets in.
        laptop = {"SSH_CONNECTION": "203.0.113.9 50000 10.0.0.5 22"}
        plan = run_json(["plan", inventory, "--name", name], state_dir=state_dir, env=laptop)
        assert "drop" in plan["firewall"]["node-2"]
        assert f"#   {lab.bridge_address}: control machine (its source address toward node-2)" in \
            plan["firewall"]["node-2"]
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, env=laptop)
        assert up.returncode == 0, up.stderr
        ruleset = lab.exec_in_netns("node-2", ["nft", "list", "ruleset"]).stdout
        assert lab.bridge_address in ruleset and "203.0.113.9" not in ruleset
        status = run_json(["status", "--name", name], state_dir=state_dir)
        servers = [t for t in status["tasks"] if t["kind"] == "server"]
        assert len(servers) == 4 and all(t["state"] == "ready" for t in servers)   # the control machine gets in
        targets = [f"{t['address']}:{t['port']}" for t in servers]
        for member in ("node-1", "node-2", "node-3"):
            assert _connect_from(lab, member, targets) == {target: True for target in targets}, member
        assert _connect_from(lab, "node-4", targets) == {target: False for target in targets}
        # The rules touch only the cluster's ports: the outsider still reaches sshd.
        assert _connect_from(lab, "node-4", [f"{lab.host('node-2').address}:22"]) == \
            {f"{lab.host('node-2').address}:22": True}
        for host in ("node-1", "node-2", "node-3"):
            assert f"pscluster_{name.replace('-', '_')}" in _tables(lab, host)
        assert "pscluster" not in _tables(lab, "node-4")

        down = run_cli(["down", "--name", name], state_dir=state_dir)
        assert down.returncode == 0, down.stderr
        for host in ("node-1", "node-2", "node-3", "node-4"):
            assert "pscluster" not in _tables(lab, host), host
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)


def test_secret_values_reach_tasks_but_never_argv_logs_or_output(tmp_path, lab3, write_lab_inventory):
    name = "lab-secrets"
    secret = "s3cr3t-" + os.urandom(8).hex()
    state_dir = tmp_path / "state"
    inventory = write_lab_inventory(lab3, tmp_path / "secret.yaml", GROUPS, {
        "pscluster_port_base": port_base(), "pscluster_workdir": str(REPO),
        "pscluster_secret_env": ["LAB_TEST_TOKEN"],
        # standing servers get secrets only when asked (tests/local/test_secret_scope.py: not by default)
        "pscluster_secret_env_roles": ["ps", "worker"]})
    env = {"LAB_TEST_TOKEN": secret}
    outputs = []
    try:
        plan = run_cli(["plan", inventory, "--name", name], state_dir=state_dir, env=env, check=True)
        outputs.append(plan.stdout + plan.stderr)
        assert "LAB_TEST_TOKEN=****" in plan.stdout
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, env=env)
        assert up.returncode == 0, up.stderr
        outputs.append(up.stdout + up.stderr)
        status = run_json(["status", "--name", name], state_dir=state_dir, env=env)
        outputs.append(json.dumps(status))
        pids = [t["pid"] for t in status["tasks"] if t["pid"]]
        for pid in pids:      # the value does reach the task ...
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            assert f"LAB_TEST_TOKEN={secret}".encode() in environ
        # ... but no command line of any process on any host shows it (hosts share this PID space).
        ps = subprocess.run(["ps", "-eo", "pid,args", "--width", "100000"], capture_output=True, text=True)
        assert secret not in ps.stdout
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    assert secret.encode() not in open(f"/proc/{entry}/cmdline", "rb").read()
                except OSError:
                    pass
        logs = run_cli(["logs", "--name", name], state_dir=state_dir, env=env, check=True)
        outputs.append(logs.stdout)
        state_text = (state_dir / f"{name}.json").read_text()
        outputs.append(state_text)
        for record in json.loads(state_text)["processes"]:
            outputs.append(open(record["log"]).read())        # the log files on the hosts themselves
        down = run_cli(["down", "--name", name], state_dir=state_dir, env=env)
        outputs.append(down.stdout + down.stderr)
        assert down.returncode == 0
        for text in outputs:
            assert secret not in text
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)


def test_missing_secret_is_refused_before_anything_starts(tmp_path, lab3, write_lab_inventory):
    name = "lab-nosecret"
    state_dir = tmp_path / "state"
    inventory = write_lab_inventory(lab3, tmp_path / "secret.yaml", GROUPS, {
        "pscluster_port_base": port_base(), "pscluster_secret_env": ["LAB_TEST_ABSENT"]})
    up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert up.returncode == 2
    assert "LAB_TEST_ABSENT" in up.stderr and "not set here" in up.stderr
    assert not (state_dir / f"{name}.json").exists()


def test_members_are_resolved_on_the_host_with_every_address(tmp_path, lab3, write_lab_inventory):
    """The host's own resolver answers (over SSH, hostctl ``resolve``): every address of a name,
    and an error text, not silence, for a name it cannot resolve."""
    from cluster.hosts import hostops
    from cluster.inventory import load_inventory
    from cluster.plan import PlanOptions, plan_cluster
    from cluster.transport import TransportPool
    inventory = write_lab_inventory(lab3, tmp_path / "resolve.yaml", GROUPS, {"pscluster_port_base": port_base()})
    plan = plan_cluster(load_inventory(str(inventory)), PlanOptions(local_python=sys.executable, local_workdir=str(REPO)))
    with TransportPool() as pool:
        answer = hostops.resolve(pool.get(plan.host("node-2")), ["localhost", "no-such-member.invalid"])
    assert isinstance(answer["no-such-member.invalid"], str) and answer["no-such-member.invalid"]
    assert "127.0.0.1" in answer["localhost"]
    assert all(ipaddress.ip_address(address) for address in answer["localhost"])
