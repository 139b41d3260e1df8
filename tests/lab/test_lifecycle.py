"""Cluster lifecycle over real SSH: three network-namespace hosts, each with its own sshd.

Every test names its own cluster and ends by asserting that no process carrying that cluster's
name survives anywhere (the fake hosts share this machine's PID space).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli, run_json
from testbed.procs import cluster_pids, netns_of

pytestmark = [pytest.mark.lab, pytest.mark.tf]

ROLES_3HOST = {
    "chief": ["node-1"],
    "ps": ["node-1", "node-2"],
    "worker": ["node-1", "node-2", "node-3"],
}


@pytest.fixture
def cluster(tmp_path, lab3, write_lab_inventory, request):
    """(name, inventory path, state dir); downs the cluster at the end if a test left it up."""
    name = "lab-" + request.node.name.replace("test_", "")[:20].replace("_", "-")
    state_dir = tmp_path / "state"
    made = {}

    def make(groups=ROLES_3HOST, **extra):
        extra.setdefault("pscluster_port_base", port_base())
        extra.setdefault("pscluster_workdir", str(REPO))
        extra.setdefault("pscluster_connect_timeout", 3)
        path = write_lab_inventory(lab3, tmp_path / f"{name}.yaml", groups, extra)
        made["path"] = path
        return path

    yield name, make, state_dir, lab3
    lab3.heal_all()
    if (state_dir / f"{name}.json").exists():
        run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir)
    assert_no_survivors(name)


def _state(state_dir, name) -> dict:
    return json.loads((state_dir / f"{name}.json").read_text())


def test_up_status_logs_down_across_three_hosts(cluster):
    name, make, state_dir, lab = cluster
    inventory = make()
    up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert up.returncode == 0, up.stderr

    status = run_json(["status", "--name", name], state_dir=state_dir)
    assert status["name"] == name and status["mode"] == "async"
    servers = {f"{t['role']}:{t['index']}": t for t in status["tasks"] if t["kind"] == "server"}
    assert sorted(servers) == ["ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]
    expected_hosts = {"ps:0": "node-1", "ps:1": "node-2", "worker:0": "node-1", "worker:1": "node-2",
                      "worker:2": "node-3"}
    for task, row in servers.items():
        assert row["state"] == "ready", row
        assert row["host"] == expected_hosts[task]
        assert row["address"] == lab.host(row["host"]).address
        role, index = task.split(":")
        # The server itself reports its devices over gRPC: proof it is the task we planned.
        assert f"/job:{role}/replica:0/task:{index}/device:CPU:0" in row["devices"]
        # ... and it really runs inside that host's network namespace.
        assert netns_of(row["pid"]) == lab.host(row["host"]).netns
    chief = next(t for t in status["tasks"] if t["role"] == "chief")
    assert chief["state"] == "not started"

    one = run_cli(["logs", "worker:2", "--name", name], state_dir=state_dir, check=True)
    assert "worker:2 serving" in one.stdout
    assert not any(line.startswith("[") for line in one.stdout.splitlines())
    every = run_cli(["logs", "--name", name], state_dir=state_dir, check=True)
    prefixes = {line.split("]")[0] + "]" for line in every.stdout.splitlines() if line.startswith("[")}
    assert prefixes == {f"[{task}@{host}]" for task, host in expected_hosts.items()}

    pids = [row["pid"] for row in servers.values()]
    down = run_cli(["down", "--name", name], state_dir=state_dir)
    assert down.returncode == 0, down.stderr
    assert not (state_dir / f"{name}.json").exists()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    for task, host in expected_hosts.items():
        port = servers[task]["port"]
        probe = lab.exec_in_netns(host, [sys.executable, "-c",
                                         f"import socket;s=socket.socket();s.settimeout(1);"
                                         f"print(s.connect_ex(('127.0.0.1',{port})))"])
        assert probe.stdout.strip() != "0", f"{task} port {port} still open on {host}"
    again = run_cli(["down", "--name", name], state_dir=state_dir)
    assert again.returncode == 2 and "no cluster named" in again.stderr   # idempotent: nothing to do


def test_code_sync_copies_only_what_changed(cluster, tmp_path):
    name, make, state_dir, lab = cluster
    workdirs = {host: tmp_path / f"work-{host}" for host in ("node-1", "node-2", "node-3")}
    groups = {"chief": {"node-1": {"pscluster_workdir": str(workdirs["node-1"])}},
              "ps": {"node-1": {"pscluster_workdir": str(workdirs["node-1"])}},
              "worker": {"node-2": {"pscluster_workdir": str(workdirs["node-2"])},
                         "node-3": {"pscluster_workdir": str(workdirs["node-3"])}}}
    inventory = make(groups, pscluster_workdir="/nonexistent-default")
    up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert up.returncode == 0, up.stderr
    for host, workdir in workdirs.items():
        assert (workdir / "roles" / "server.py").read_bytes() == (REPO / "roles" / "server.py").read_bytes()
        assert (workdir / "examples" / "distributed_mnist" / "job.py").exists()
        assert f"{host}: " in up.stderr and "file(s) sent" in up.stderr
    status = run_json(["status", "--name", name], state_dir=state_dir)
    servers = [t for t in status["tasks"] if t["kind"] == "server"]
    assert len(servers) == 3 and all(t["state"] == "ready" for t in servers)
    # The servers run from the synced copy, not from this checkout.
    for task in servers:
        assert os.readlink(f"/proc/{task['pid']}/cwd") == str(workdirs[task["host"]])
    run_cli(["down", "--name", name], state_dir=state_dir, check=True)

    (workdirs["node-2"] / "roles" / "server.py").unlink()
    second = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert second.returncode == 0, second.stderr
    lines = {line.split(":")[0].strip(): line for line in second.stderr.splitlines() if "file(s) sent" in line}
    assert "node-2: 1 file(s) sent" in lines["node-2"]
    assert "node-1: 0 file(s) sent" in lines["node-1"] and "node-3: 0 file(s) sent" in lines["node-3"]
    run_cli(["down", "--name", name], state_dir=state_dir, check=True)


def test_unknown_and_changed_host_keys_are_refused(cluster, tmp_path):
    name, make, state_dir, lab = cluster
    inventory = make(pscluster_known_hosts=str(lab.empty_known_hosts()))
    check = run_cli(["check", inventory, "--name", name], state_dir=state_dir)
    assert check.returncode == 1
    for host in ("node-1", "node-2", "node-3"):
        assert f"unknown host key for root@{lab.host(host).address}" in check.stdout
    up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert up.returncode == 1 and "nothing was started" in up.stderr
    assert "ssh-keyscan" in up.stderr            # the hint says how to fix it
    assert not (state_dir / f"{name}.json").exists()

    inventory = make(pscluster_known_hosts=str(lab.wrong_known_hosts()))
    changed = run_cli(["check", inventory, "--name", name], state_dir=state_dir)
    assert changed.returncode == 1 and "does not match" in changed.stdout

    fresh = tmp_path / "fresh_known_hosts"
    inventory = make(pscluster_known_hosts=str(fresh), pscluster_host_key_policy="accept-new")
    accepted = run_cli(["check", inventory, "--name", name], state_dir=state_dir)
    assert accepted.returncode == 0, accepted.stdout
    recorded = [line.split()[0] for line in fresh.read_text().splitlines()]
    assert sorted(recorded) == sorted(lab.host(h).address for h in ("node-1", "node-2", "node-3"))
    assert cluster_pids(name) == []


def test_unreachable_host_is_named_and_nothing_starts(cluster):
    name, make, state_dir, lab = cluster
    inventory = make()
    lab.cut("node-3")
    began = time.monotonic()
    up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    elapsed = time.monotonic() - began
    assert up.returncode == 1
    assert f"node-3: ssh: cannot reach root@{lab.host('node-3').address}" in up.stderr
    assert "nothing was started" in up.stderr
    # Connect timeout 3 s, plus interpreter start-ups and the preflight of the other hosts (2-3x
    # slower on a loaded machine): bounded by the connect timeout, not TCP's own ~2 min of SYNs.
    assert elapsed < 3 + 45, elapsed
    assert not (state_dir / f"{name}.json").exists()
    assert cluster_pids(name) == []


def test_busy_port_is_named_before_anything_starts(cluster):
    name, make, state_dir, lab = cluster
    inventory = make()
    plan = run_json(["plan", inventory, "--name", name], state_dir=state_dir)
    target = next(t for t in plan["tasks"] if t["role"] == "worker" and t["host"] == "node-2")
    holder = subprocess.Popen(["ip", "netns", "exec", lab.host("node-2").netns, sys.executable, "-c",
                               "import socket,sys,time;s=socket.socket();"
                               f"s.bind(('0.0.0.0',{target['port']}));s.listen();print('ok',flush=True);"
                               "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
        assert up.returncode == 1
        assert f"node-2: ports: in use: {target['port']} (worker:{target['index']}" in up.stderr
        assert "nothing was started" in up.stderr
        assert cluster_pids(name) == []
        assert not (state_dir / f"{name}.json").exists()
    finally:
        holder.kill()
        holder.wait()


def test_orchestrator_killed_during_up_then_down_cleans_everything(cluster):
    name, make, state_dir, lab = cluster
    inventory = make()
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1")
    orchestrator = subprocess.Popen([sys.executable, "-m", "cluster", "up", str(inventory), "--name", name],
                                    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file = state_dir / f"{name}.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state_file.exists():
            try:
                started = [p for p in _state(state_dir, name)["processes"] if p["pid"]]
            except ValueError:
                started = []
            if len(started) >= 2:
                break
        time.sleep(0.05)
    orchestrator.send_signal(signal.SIGKILL)
    orchestrator.wait()
    time.sleep(1.0)         # servers started just before the kill keep coming up
    assert cluster_pids(name), "the test meant to kill the orchestrator mid-way"
    assert _state(state_dir, name)["phase"] == "starting"
    down = run_cli(["down", "--name", name], state_dir=state_dir)
    assert down.returncode == 0, down.stderr
    assert not state_file.exists()
    assert_no_survivors(name, timeout=5)
