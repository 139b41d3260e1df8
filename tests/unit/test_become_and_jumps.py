"""The command line `ansible_become` produces and where ProxyJump hops come from (issue 12 item 2)."""
from __future__ import annotations

import json
import socket

import paramiko
import pytest

from cluster.errors import HostError, UnreachableHostError
from cluster.hosts import hostops
from cluster.plan import HostSpec
from cluster.transport.base import CommandResult, Transport
from cluster.transport.ssh import SSHTransport, config_jumps, lost_reason, parse_hop


def host(**changes) -> HostSpec:
    values = dict(name="gpu-1", address="198.51.100.20", connection="ssh", ssh_port=None, user="bob",
                  key_file=None, python="/opt/py/bin/python3", workdir="~/pscluster", host_key_policy="reject",
                  known_hosts=None, connect_timeout=10.0)
    values.update(changes)
    return HostSpec(**values)


class Recorder(Transport):
    """Records the argv of each call and answers like hostctl would."""

    def __init__(self, spec: HostSpec):
        super().__init__(spec)
        self.calls: list[tuple[tuple[str, ...], bytes]] = []

    def run(self, argv, *, stdin=None, timeout=60.0) -> CommandResult:
        self.calls.append((tuple(argv), stdin or b""))
        return CommandResult(self.host.name, tuple(argv), 0, json.dumps({"ok": True}), "")

    def stream(self, argv, *, stdin=None):
        self.calls.append((tuple(argv), stdin or b""))
        return None

    def _put_files(self, files, *, mode=None):
        raise AssertionError("no files here")


def test_become_runs_every_host_operation_through_sudo_without_a_password():
    transport = Recorder(host(become_user="alice"))
    hostops.call(transport, "status", {"records": []})
    (argv, stdin), = transport.calls
    program = hostops.packed_source()
    assert argv == ("sudo", "-n", "-H", "-u", "alice", "/opt/py/bin/python3", "-I", "-S", "-c",
                    hostops.BOOTSTRAP, str(len(program)), "status")
    assert stdin == program + b'{"records": []}'      # the request (and any secret) on stdin, never argv


def test_the_watch_stream_runs_as_the_become_user_too():
    """N14 (issue 25): the watch stream lacked the sudo prefix every other host call has, so it
    could not read the become user's 0700 run folders: become clusters could not be supervised."""
    transport = Recorder(host(become_user="alice"))
    hostops.watch(transport, [], [])
    (argv, _), = transport.calls
    assert argv[:5] == ("sudo", "-n", "-H", "-u", "alice") and argv[-1] == "watch"


def test_without_become_the_interpreter_is_the_command():
    transport = Recorder(host())
    hostops.call(transport, "status", {})
    assert transport.calls[0][0][:2] == ("/opt/py/bin/python3", "-I")
    assert "sudo" not in transport.calls[0][0]


SSH_CONFIG = """\
Host gpu-*.lab 198.51.100.*
    ProxyJump alice@login.example.org:2202,hop2
Host direct.lab
    ProxyJump none
Host *
    User someone
"""


def test_proxyjump_from_the_ssh_config_when_the_inventory_names_none(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(SSH_CONFIG)
    assert config_jumps("gpu-7.lab", str(config)) == ("alice@login.example.org:2202", "hop2")
    assert config_jumps("direct.lab", str(config)) == ()
    assert config_jumps("other.lab", str(config)) == ()
    assert SSHTransport(host(), ssh_config=str(config)).jumps() == ("alice@login.example.org:2202", "hop2")


def test_the_inventory_jump_wins_over_the_ssh_config(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(SSH_CONFIG)
    assert SSHTransport(host(jump=("root@bastion",)), ssh_config=str(config)).jumps() == ("root@bastion",)


def test_hops_give_address_port_and_user():
    assert parse_hop("alice@login.example.org:2202", "bob") == ("login.example.org", 2202, "alice")
    assert parse_hop("login", "bob") == ("login", None, "bob")
    assert parse_hop("[2001:db8::1]:2222", None) == ("2001:db8::1", 2222, None)
    assert parse_hop("carol@[2001:db8::1]", "bob") == ("2001:db8::1", None, "carol")
    assert parse_hop("2001:db8::1", None) == ("2001:db8::1", None, None)


def test_a_known_hosts_file_that_is_not_one_is_refused_before_connecting(tmp_path):
    """Issue 25, "Also": `pscluster_known_hosts: /etc/passwd` with accept-new was accepted, and
    as root that file would have been appended to."""
    import pytest
    from cluster.errors import UnreachableHostError
    from cluster.transport.ssh import known_hosts_problem
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    before = passwd.read_bytes()
    transport = SSHTransport(host(known_hosts=str(passwd), host_key_policy="accept-new", address="127.77.250.1"))
    with pytest.raises(UnreachableHostError, match="is not a known-hosts file: line 1 is not a known-hosts entry"):
        transport.connect()
    assert passwd.read_bytes() == before
    assert known_hosts_problem("/dev/null") == "not a regular file"
    good = tmp_path / "known_hosts"
    good.write_text("# comment\n\n[127.77.0.2]:22,node-a ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH+x/y=\n"
                    "@cert-authority *.lab ecdsa-sha2-nistp256 AAAAE2VjZHNh comment here\n|1|abc=|def= ssh-rsa AAAAB3==\n")
    assert known_hosts_problem(str(good)) is None
    assert known_hosts_problem(str(tmp_path / "absent")) is None       # accept-new creates it


HOP_CONFIG = """\
Host bastion
    ProxyJump outer
Host target.lab
    ProxyJump bastion
"""


def test_a_hops_own_proxyjump_is_built_here_with_host_key_checks(tmp_path, monkeypatch):
    """N10 (issue 25): the first hop got gateway=None, so Fabric built that hop's own ProxyJump
    from ~/.ssh/config with AutoAddPolicy (any host key trusted)."""
    import fabric
    from cluster.transport import ssh
    config = tmp_path / "ssh_config"
    config.write_text(HOP_CONFIG)
    monkeypatch.setattr(ssh, "_SSH_CONFIG", fabric.Config(runtime_ssh_path=str(config)).base_ssh_config)
    transport = SSHTransport(host(jump=("root@bastion",)), ssh_config=str(config))
    assert transport.jumps() == ("outer", "root@bastion")
    first = transport._connection("bastion", None, "root", None)
    assert first.gateway is False          # not a Connection of Fabric's own making
    assert isinstance(first.client._policy, ssh.paramiko.RejectPolicy)


def test_proxyjump_none_in_the_inventory_means_no_hop_at_all(tmp_path, monkeypatch):
    """N10: an inventory ProxyJump=none fell back to ~/.ssh/config's hops."""
    import fabric
    from cluster.transport import ssh
    config = tmp_path / "ssh_config"
    config.write_text(HOP_CONFIG)
    monkeypatch.setattr(ssh, "_SSH_CONFIG", fabric.Config(runtime_ssh_path=str(config)).base_ssh_config)
    transport = SSHTransport(host(address="target.lab", jump=("none",)), ssh_config=str(config))
    assert transport.jumps() == ()
    assert transport._connection("target.lab", None, "bob", None).gateway is False


class _Gone:
    """A fabric connection whose SSH session fails as paramiko's does when the peer goes away."""

    is_connected = True

    def __init__(self, exc: BaseException):
        self.exc = exc
        self.client = self

    def get_transport(self):
        return self

    def open_session(self, timeout=None):
        raise self.exc

    def sftp(self):
        raise self.exc

    def open(self):
        raise self.exc

    def close(self):
        pass


@pytest.mark.parametrize("exc, seen", [
    (EOFError(), "the connection closed"),
    (socket.timeout(), "no answer for 10 s"),
    (ConnectionResetError(), "connection reset"),
    (paramiko.SSHException(), "SSHException (no message)"),
    (paramiko.SSHException("SSH session not active"), "SSH session not active"),
])
def test_a_lost_connection_says_what_was_seen(exc, seen):
    transport = SSHTransport(host(address="127.77.0.4", user="root"))
    for operation in (lambda: transport.run(["true"], timeout=10.0), lambda: transport.stream(["true"])):
        transport._conn = _Gone(exc)     # type: ignore[assignment]
        with pytest.raises(UnreachableHostError) as caught:
            operation()
        assert caught.value.message == f"gpu-1: connection to root@127.77.0.4 lost: {seen}"
        assert transport._conn is None   # dropped: the next operation reconnects


@pytest.mark.parametrize("exc, seen", [(EOFError(), "the connection closed"), (socket.timeout(), "no answer for 30 s")])
def test_a_copy_that_fails_says_what_was_seen(exc, seen, tmp_path):
    transport = SSHTransport(host(address="127.77.0.4", user="root"))
    transport._conn = _Gone(exc)         # type: ignore[assignment]
    (tmp_path / "f").write_text("x")
    with pytest.raises(HostError) as caught:
        transport.put_files([(str(tmp_path / "f"), "~/pscluster/f")], root="~/pscluster")
    assert caught.value.message == f"gpu-1: copying files to root@127.77.0.4 failed: {seen}"   # the sftp limit: 30 s
    assert transport._conn is None


def test_an_ssh_failure_without_text_says_its_kind(tmp_path, monkeypatch):
    transport = SSHTransport(host(address="127.77.0.4", user="root", known_hosts=str(tmp_path / "known_hosts")))
    monkeypatch.setattr(transport, "_connection", lambda *hop: _Gone(paramiko.SSHException()))
    with pytest.raises(UnreachableHostError) as caught:
        transport.connect()
    assert caught.value.message == "gpu-1: SSH to root@127.77.0.4 failed: SSHException (no message)"


def test_lost_reason_keeps_the_exceptions_own_text():
    assert lost_reason(OSError(113, "No route to host"), timeout=5) == "[Errno 113] No route to host"
