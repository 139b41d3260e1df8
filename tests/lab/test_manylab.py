"""The many-hosts lab (testbed/manylab.py) at its smallest: eight SSH hosts on its /16, whose
standing servers are stand-ins (testbed/standin.py) reached through ``pscluster_python``, brought
up (the code through the relay: two seeds copied to, the others fetching from peers, issue 46),
probed, grown by one host and brought down by the real CLI, leaving nothing behind; ``up`` and
``down`` with their SSH connections in two helper processes (cluster/transport/spread.py). The figures
at scale are benchmarks/scale.py's, not this test's."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from cluster.hosts import relay
from cluster.hosts.codesync import code_files
from tests.helpers import assert_no_survivors, port_base, run_cli, run_json
from testbed import manylab

pytestmark = pytest.mark.lab


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode()


def _relays() -> list[int]:
    """hostctl relay processes alive on this machine (every lab host is a namespace of it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                words = _cmdline(int(entry)).split()
            except OSError:
                continue
            if words[-1:] == ["relay"] and "-S" in words:
                found.append(int(entry))
    return found


def _helpers() -> list[int]:
    """pscluster's helper processes (cluster/transport/spread.py) alive on this machine."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if "cluster.transport.spread" in _cmdline(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_eight_hosts_come_up_through_the_relay_grow_by_one_and_go_down(lab_base, tmp_path):
    hosts = relay.RELAY_MIN_HOSTS
    assert hosts == 8, "the test's lab is the relay's smallest"
    lab = manylab.ManyLab(hosts + 1, lab_base / f"many-{tmp_path.name}"[:60], subnet=manylab.free_subnet(80))
    with lab:
        base = port_base()
        # Workdirs of this run's own: the lab's folder outlives a run (LAB_BASE), and hosts that
        # have the code already are sent nothing, relay or not.
        workdirs = f"work-{os.getpid()}"
        inventory = manylab.write_inventory(lab, tmp_path / "many.yaml", hosts=hosts, port_base=base,
                                            workdirs=workdirs)
        grown = manylab.write_inventory(lab, tmp_path / "many9.yaml", hosts=hosts + 1, port_base=base,
                                        workdirs=workdirs)
        state = tmp_path / "state"
        # the SSH connections in two helper processes (cluster/transport/spread.py; by default
        # from 128 hosts): the code sync, the starts and the probes go through them
        helpers = {"PSCLUSTER_CONTROL_PROCESSES": "2"}
        try:
            up = run_cli(["up", str(inventory), "--name", "many", "--json"], state_dir=state, timeout=240,
                         env=helpers)
            assert up.returncode == 0, up.stderr
            assert "held by 2 helper process(es)" in up.stderr, up.stderr
            assert _helpers() == [], "a helper process outlived up"
            sent = {line.split(":")[0].strip(): line for line in up.stderr.splitlines() if "file(s) sent" in line}
            assert sorted(sent) == [f"node-{i}" for i in range(1, hosts + 1)], up.stderr
            seeds = [name for name, line in sent.items() if " from " not in line.split(":", 1)[1]]
            assert seeds == ["node-1", "node-2"], up.stderr      # copied from here; the others from a peer
            assert "relay failed" not in up.stderr
            expected = {f.rel: f.sha256 for f in code_files()}
            for i in range(1, hosts + 1):
                copied = {f.rel: f.sha256 for f in code_files(lab.root_dir / workdirs / f"node-{i}")}
                assert copied == expected, f"node-{i}"
            deadline = time.monotonic() + 15      # they end once up closes their channels
            while _relays() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _relays() == [], "a serving relay outlived up"
            status = run_json(["status", "--name", "many"], state_dir=state)
            servers = [t for t in status["tasks"] if t["role"] == "ps"]
            assert [t["index"] for t in servers] == list(range(hosts))
            for task in servers:      # ready: the stand-in answered pscluster's gRPC GetStatus probe
                assert task["state"] == "ready", task
                assert str(manylab.STANDIN) in _cmdline(task["pid"])      # the stand-in, not TensorFlow
            scaled = run_cli(["scale", str(grown), "--name", "many"], state_dir=state, timeout=240)
            assert scaled.returncode == 0, scaled.stderr
            # the code went to the new host only, directly: the others have this tree since `up` (issue 46)
            synced = [line.split(":")[0].strip() for line in scaled.stderr.splitlines() if "file(s) sent" in line]
            assert synced == ["node-9"], scaled.stderr
            status = run_json(["status", "--name", "many"], state_dir=state)
            ready = {t["index"]: t["host"] for t in status["tasks"] if t["role"] == "ps" and t["state"] == "ready"}
            assert ready == {i: f"node-{i + 1}" for i in range(hosts + 1)}
        finally:
            down = run_cli(["down", "--name", "many", "--grace", "2"], state_dir=state, timeout=240, env=helpers)
            shutil.rmtree(lab.root_dir / workdirs, ignore_errors=True)
        assert down.returncode == 0, down.stderr
        assert _helpers() == [], "a helper process outlived down"
        assert_no_survivors("many")
    assert lab.leftovers() == []
