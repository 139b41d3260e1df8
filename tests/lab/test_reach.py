"""Reaching hosts over real SSH: a host that vanishes is reported within a bounded time."""
from __future__ import annotations

import io
import json
import threading
import time

import pytest

from dataclasses import replace

from cluster.errors import UnreachableHostError
from cluster.plan import HostSpec
from cluster.transport.ssh import SSHTransport
from tests.helpers import assert_no_survivors, port_base, run_cli, run_json
from testbed.netlab import venv_python
from testbed.procs import socket_inodes

pytestmark = [pytest.mark.lab]


def _spec(lab, name: str) -> HostSpec:
    return HostSpec(name=name, address=lab.host(name).address, connection="ssh", ssh_port=None, user="root",
                    key_file=str(lab.key_path), python=venv_python(), workdir="/tmp", host_key_policy="strict",
                    known_hosts=str(lab.known_hosts), connect_timeout=10.0)


def test_a_host_that_vanishes_mid_command_is_named_within_seconds(lab3):
    transport = SSHTransport(_spec(lab3, "node-3"))
    try:
        assert transport.run(["true"]).exit_code == 0
        threading.Timer(1.0, lab3.cut, ["node-3"]).start()
        began = time.monotonic()
        with pytest.raises(UnreachableHostError) as caught:
            transport.run(["sleep", "300"], timeout=600)       # only the keepalive watchdog can end this
        elapsed = time.monotonic() - began
    finally:
        transport.close()
    assert elapsed < 30, elapsed
    assert caught.value.host == "node-3" and "lost" in str(caught.value)


def test_a_hidden_host_is_reached_through_its_bastion_with_host_keys_checked(lab3, tmp_path):
    lab3.hide_behind("node-3", "node-1")
    try:
        hidden = _spec(lab3, "node-3")
        direct = SSHTransport(replace(hidden, connect_timeout=3.0))
        with pytest.raises(UnreachableHostError):
            direct.run(["true"])                                     # the control machine cannot reach it
        via = SSHTransport(replace(hidden, jump=(f"root@{lab3.host('node-1').address}",)))
        try:
            result = via.run(["hostname"])
            assert result.exit_code == 0 and result.stdout.strip() == "node-3"
        finally:
            via.close()
        # The hop's key is checked like the target's: an empty known_hosts refuses the bastion.
        strict = SSHTransport(replace(hidden, jump=(lab3.host("node-1").address,),
                                      known_hosts=str(lab3.empty_known_hosts())))
        with pytest.raises(UnreachableHostError):
            strict.run(["true"])
    finally:
        lab3.unhide("node-3")


@pytest.mark.tf
def test_up_train_status_down_with_a_worker_behind_a_bastion(lab3, tmp_path, write_lab_inventory):
    name = "lab-bastion"
    state_dir = tmp_path / "state"
    bastion = lab3.host("node-1").address
    hidden = {"ansible_ssh_common_args": f"-o ProxyJump=root@{bastion}",
              "pscluster_workdir": str(tmp_path / "work-3")}
    groups = {"chief": {"node-1": {"pscluster_workdir": str(tmp_path / "work-1")}},
              "ps": {"node-2": {"pscluster_workdir": str(tmp_path / "work-2")}},
              "worker": {"node-3": hidden}}
    inventory = write_lab_inventory(lab3, tmp_path / "bastion.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_mode": "async",
        "pscluster_env": {"OMP_NUM_THREADS": 1}, "pscluster_intra_op_threads": 1})
    lab3.hide_behind("node-3", "node-1")
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        report = run_json(["train", "distributed_mnist", "--name", name, "--steps", 50], state_dir=state_dir,
                          timeout=900)
        assert report["global_step"] == 50
        status = run_json(["status", "--name", name], state_dir=state_dir)
        assert "worker:0" in json.dumps(status) and "ready" in json.dumps(status)
    finally:
        if (state_dir / f"{name}.json").exists():
            down = run_cli(["down", "--name", name], state_dir=state_dir)
            assert down.returncode == 0, down.stdout + down.stderr
        lab3.unhide("node-3")
    assert_no_survivors(name)


def test_preflight_names_a_blocked_path_between_two_hosts_and_starts_nothing(lab3, tmp_path, write_lab_inventory):
    name = "lab-reach"
    state_dir = tmp_path / "state"
    groups = {"chief": {"node-1": {"pscluster_workdir": str(tmp_path / "w1")}},
              "ps": {"node-2": {"pscluster_workdir": str(tmp_path / "w2")}},
              "worker": {"node-3": {"pscluster_workdir": str(tmp_path / "w3")}}}
    base = port_base()
    inventory = write_lab_inventory(lab3, tmp_path / "reach.yaml", groups, {"pscluster_port_base": base})
    lab3.block("node-2", "node-3")
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, timeout=120)
    finally:
        lab3.unhide("node-3")
    text = up.stdout + up.stderr
    assert up.returncode != 0, text
    assert "node-2 → node-3:" in text and "timed out" in text, text
    assert "node-1 → node-3" not in text                     # only the blocked path is named
    assert "nothing was started" in text
    assert_no_survivors(name)


def _own_tcp_listeners() -> list[str]:
    """The TCP sockets this process listens on (local address:port in hex, as /proc shows them)."""
    inodes = socket_inodes()
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    found.append(fields[1])
    return found


@pytest.mark.tf
def test_status_of_a_host_behind_a_bastion_opens_no_tcp_listener_here(lab3, tmp_path, write_lab_inventory,
                                                                         monkeypatch):
    """N1 (issue 25): probes of a host behind a jump host went through a listener on
    127.0.0.1:<ephemeral> with no authentication: any local user who found it reached the
    task's gRPC from a member address (past --firewall). Now a 0600 Unix socket."""
    from cluster import cli
    from cluster.cli import Env
    from cluster.hosts.probe import Prober
    from cluster.state import StateStore
    from rich.console import Console
    name, state_dir = "lab-n1", tmp_path / "state"
    bastion = lab3.host("node-1").address
    groups = {"chief": {"node-1": {"pscluster_workdir": str(tmp_path / "work-1")}},
              "ps": {"node-1": {"pscluster_workdir": str(tmp_path / "work-1")}},
              "worker": {"node-3": {"ansible_ssh_common_args": f"-o ProxyJump=root@{bastion}",
                                    "pscluster_workdir": str(tmp_path / "work-3")}}}
    inventory = write_lab_inventory(lab3, tmp_path / "n1.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_mode": "async", "pscluster_standby": False,
        "pscluster_env": {"OMP_NUM_THREADS": 1}})
    lab3.hide_behind("node-3", "node-1")
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
        assert up.returncode == 0, up.stdout + up.stderr
        seen: list[tuple[str, bool, list[str]]] = []
        real_probe = Prober.probe

        def probe(self, target, **options):
            result = real_probe(self, target, **options)
            seen.append((target, result.ok, _own_tcp_listeners()))     # while the tunnel is open
            return result

        monkeypatch.setattr(Prober, "probe", probe)
        out = io.StringIO()
        env = Env(out=Console(file=out, width=300, color_system=None), err=Console(file=io.StringIO()),
                  store=StateStore(state_dir))
        assert cli.run(["status", "--name", name, "--json"], env=env) == 0
        hidden = next(item for item in seen if item[0].startswith(lab3.host("node-3").address))
        assert hidden[1], seen                        # reached through the bastion...
        assert all(not listeners for _, _, listeners in seen), seen   # ...with no TCP listener here
    finally:
        if (state_dir / f"{name}.json").exists():
            down = run_cli(["down", "--name", name], state_dir=state_dir)
            assert down.returncode == 0, down.stdout + down.stderr
        lab3.unhide("node-3")
    assert_no_survivors(name)
