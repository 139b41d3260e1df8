"""Hosts whose sshd limits sessions and new connections (issue 46, "Bad input and edges"), on
real sshds of the many-hosts lab configured that way, with stand-in servers (no TensorFlow).

- ``MaxSessions 1``: pscluster holds a watch stream, a command and an SFTP copy at once per host.
  Before, Fabric's cached SFTP client kept the one session after the code sync and ``up`` failed
  with "connection ... lost: ChannelException(2, 'Connect failed')"; now a refused session opens
  on a further connection, and ``MaxSessions 0`` fails naming the host and the setting.
- ``MaxStartups 1:100:1``: every connection past one unauthenticated one is dropped before the
  banner. Eight inventory names of one machine connect at once: before, seven failed "Error
  reading SSH protocol banner / is sshd running there?"; now they come back with backoff, and a
  host that keeps dropping them fails naming MaxStartups.
"""
from __future__ import annotations

import json
import pathlib
import socket
import time

import pytest

from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.transport.ssh import SSHTransport
from tests.helpers import assert_no_survivors, port_base, run_cli, run_json
from testbed import manylab

pytestmark = pytest.mark.lab


def _lab(lab_base: pathlib.Path, tmp_path: pathlib.Path, n: int, **options: str) -> manylab.ManyLab:
    return manylab.ManyLab(n, lab_base / f"sshd-{tmp_path.name}"[:60], subnet=manylab.free_subnet(81),
                           sshd_options=options)


def _aliases(lab: manylab.ManyLab, path: pathlib.Path, n: int, base: int) -> pathlib.Path:
    """``n`` inventory names (a0, a1, ...) for the lab's one machine, each with a workdir."""
    lines = ["all:", "  vars:", "    ansible_user: root", f"    ansible_ssh_private_key_file: {lab.key_path}",
             f"    pscluster_known_hosts: {lab.known_hosts}", f"    pscluster_python: {lab.python}",
             "    pscluster_mode: sync-ps", "    pscluster_standby: false", f"    pscluster_port_base: {base}",
             "  children:", "    ps:", "      hosts:", "        a0:", "    worker:", "      hosts:"]
    for i in range(n):
        lines += [f"        a{i}:", f"          ansible_host: {lab.hosts[0].address}",
                  f"          pscluster_workdir: {lab.root_dir / 'work' / f'a{i}'}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_max_sessions_1_up_status_and_down_work_and_a_held_stream_takes_a_second_connection(lab_base, tmp_path):
    with _lab(lab_base, tmp_path, 2, MaxSessions="1") as lab:
        inventory = manylab.write_inventory(lab, tmp_path / "inv.yaml", port_base=port_base())
        state = tmp_path / "state"
        try:
            up = run_json(["up", str(inventory), "--name", "ms1"], state_dir=state, timeout=240)
            assert [t["state"] for t in up["tasks"] if t["role"] == "ps"] == ["ready", "ready"]
            status = run_json(["status", "--name", "ms1"], state_dir=state)
            assert [t["state"] for t in status["tasks"] if t["role"] == "ps"] == ["ready", "ready"]
        finally:
            down = run_cli(["down", "--name", "ms1", "--grace", "2"], state_dir=state, timeout=240)
        assert down.returncode == 0, down.stderr
        assert_no_survivors("ms1")

        # A stream holds the connection's one session (as a job's watch does): a command still runs.
        host = plan_cluster(load_inventory(str(inventory)), PlanOptions(local_python="", local_workdir="")).host("node-1")
        transport = SSHTransport(host)
        try:
            stream = transport.stream(["sleep", "60"])
            result = transport.run(["echo", "second"], timeout=30)
            assert (result.exit_code, result.stdout) == (0, "second\n")
            assert len(transport._more) == 1        # the command went over a connection of its own
            assert transport.run(["true"], timeout=30).exit_code == 0
            assert len(transport._more) == 1        # and the next one reuses it
            stream.close()
            # A watch stream is pulled by the supervisor's turns, with no thread of its own (issue 46).
            pulled = transport.stream(["sh", "-c", "echo one; echo two; sleep 0.3; echo three"])
            assert pulled._thread is None
            got, deadline = [], time.monotonic() + 30
            while not pulled.closed and time.monotonic() < deadline:
                got += pulled.lines()
                time.sleep(0.05)
            assert pulled.closed and pulled.error is None and got + pulled.lines() == ["one", "two", "three"]
        finally:
            transport.close()
    assert lab.leftovers() == []


def test_max_sessions_0_fails_naming_the_host_and_the_setting(lab_base, tmp_path):
    with _lab(lab_base, tmp_path, 1, MaxSessions="0") as lab:
        inventory = manylab.write_inventory(lab, tmp_path / "inv.yaml", port_base=port_base())
        check = run_cli(["check", str(inventory), "--json"], state_dir=tmp_path / "state", timeout=120)
        assert check.returncode == 1, check.stderr
        failed = [c for c in json.loads(check.stdout)["checks"] if not c["ok"]]
        assert [(c["host"], c["check"]) for c in failed] == [("node-1", "ssh")], failed
        assert failed[0]["detail"].startswith("sshd refused a session (MaxSessions 0?)"), failed
        assert "raise MaxSessions in node-1's sshd_config" in failed[0]["hint"]
    assert lab.leftovers() == []


def test_max_startups_drops_are_retried_and_a_host_that_keeps_dropping_is_named(lab_base, tmp_path):
    with _lab(lab_base, tmp_path, 1, MaxStartups="1:100:1") as lab:
        inventory = _aliases(lab, tmp_path / "aliases.yaml", 8, port_base())
        check = run_cli(["check", str(inventory)], state_dir=tmp_path / "state", timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        # sshd dropped some of the eight at once (seven of eight failed before) and they came back
        assert "past MaxStartups" in (lab.root_dir / "hosts" / "node-1" / "sshd.log").read_text()

        # A client that connects and never authenticates holds the one startup sshd allows.
        with socket.create_connection((lab.hosts[0].address, 22), timeout=10) as holder:
            assert holder.recv(64).startswith(b"SSH-")
            check = run_cli(["check", str(inventory), "--json"], state_dir=tmp_path / "state", timeout=120)
        assert check.returncode == 1, check.stderr
        failed = [c for c in json.loads(check.stdout)["checks"] if not c["ok"]]
        assert sorted(c["host"] for c in failed) == [f"a{i}" for i in range(8)], failed
        for c in failed:
            assert c["check"] == "ssh" and "before its banner (MaxStartups?)" in c["detail"], c
            assert f"raise it in {c['host']}'s sshd_config" in c["hint"], c
    assert lab.leftovers() == []
