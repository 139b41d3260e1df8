"""Code sync through peers (cluster/hosts/relay.py, hostctl ``relay``; issue 46): real hostctl
processes serving and fetching over 127.0.0.1, a peer that lies, a client without the token,
the scheduler of serving hosts, and a whole relayed sync over local transports."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from cluster.errors import HostError
from cluster.hosts import relay
from cluster.hosts.codesync import LocalFile, SyncResult, collect
from cluster.plan import HostSpec
from cluster.transport import TransportPool
from cluster.transport.local import LocalTransport

from .conftest import REPO

HOSTCTL = str(REPO / "roles" / "hostctl.py")
TOKEN = "ab" * 32


def _tree(root, files):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return [[rel, hashlib.sha256(data).hexdigest(), len(data), 0o644] for rel, data in files.items()]


def _relay(root, manifest, *, peers=(), token=TOKEN, serve=True):
    """hostctl relay as a process of its own; (the process, its first line)."""
    proc = subprocess.Popen([sys.executable, HOSTCTL, "relay"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(json.dumps({"root": str(root), "files": manifest, "token": token, "serve": serve,
                                 "bind": "127.0.0.1", "peers": [list(p) for p in peers]}).encode())
    proc.stdin.close()
    return proc, json.loads(proc.stdout.readline())


def _ends(proc, timeout=15.0):
    """Close our end of its output, as the orchestrator closes the channel: it ends within a beat."""
    proc.stdout.close()
    return proc.wait(timeout=timeout)


FILES = {"roles/a.py": b"print('a')\n", "examples/data/big.bin": os.urandom(300_000), "examples/x/y/z.txt": b"z"}


def test_a_host_fetches_what_differs_from_a_seed_skipping_a_dead_peer_and_both_end_with_the_reader(tmp_path):
    manifest = _tree(tmp_path / "seed", FILES)
    seed, said = _relay(tmp_path / "seed", manifest)
    assert said["unchanged"] == 3 and said["fetched"] == 0 and isinstance(said["port"], int)
    (tmp_path / "host" / "roles").mkdir(parents=True)
    (tmp_path / "host" / "roles" / "a.py").write_bytes(FILES["roles/a.py"])      # already there: not fetched
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead_port = dead.getsockname()[1]          # nothing listens there once closed
    fetcher, got = _relay(tmp_path / "host", manifest, peers=[("127.0.0.1", dead_port), ("127.0.0.1", said["port"])])
    assert got["fetched"] == 2 and got["unchanged"] == 1 and got["bytes"] == 300_001, got
    assert got["peer"] == f"127.0.0.1:{said['port']}" and len(got["skipped_peers"]) == 1
    for rel, data in FILES.items():
        assert (tmp_path / "host" / rel).read_bytes() == data
        assert (tmp_path / "host" / rel).stat().st_mode & 0o777 == 0o644
    assert not [p for p in (tmp_path / "host").rglob("*") if "pscluster-tmp" in p.name]
    # the fetcher serves in turn: a third host gets everything from it
    third, last = _relay(tmp_path / "third", manifest, peers=[("127.0.0.1", got["port"])])
    assert last["fetched"] == 3 and (tmp_path / "third" / "examples/data/big.bin").read_bytes() == FILES[
        "examples/data/big.bin"]
    assert [_ends(p) for p in (third, fetcher, seed)] == [0, 0, 0]


def test_a_client_without_the_token_gets_nothing(tmp_path):
    manifest = _tree(tmp_path / "seed", FILES)
    seed, said = _relay(tmp_path / "seed", manifest)
    try:
        thief, got = _relay(tmp_path / "thief", manifest, peers=[("127.0.0.1", said["port"])], token="cd" * 32,
                            serve=False)
        assert "no relay peer could send" in got["error"]
        assert thief.wait(timeout=15) == 0
        assert not [p for p in (tmp_path / "thief").rglob("*") if p.is_file()]
    finally:
        _ends(seed)


def _liar(token: bytes, payload: bytes):
    """A peer that passes the handshake and then sends ``payload`` for whatever is asked."""
    import hmac
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve():
        conn, _ = listener.accept()
        with conn:
            nonce = os.urandom(16)
            conn.sendall(nonce)
            assert conn.recv(32) == hmac.new(token, nonce, hashlib.sha256).digest()
            conn.recv(64)
            conn.sendall(struct.pack(">Q", len(payload)) + payload)

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_bytes_that_do_not_match_the_manifest_are_dropped_and_the_next_peer_asked(tmp_path):
    files = {"examples/m.bin": b"m" * 1000}
    manifest = _tree(tmp_path / "seed", files)
    seed, said = _relay(tmp_path / "seed", manifest)
    liar = _liar(bytes.fromhex(TOKEN), b"x" * 1000)          # the right size, the wrong bytes
    try:
        fetcher, got = _relay(tmp_path / "host", manifest, serve=False,
                              peers=[liar.getsockname(), ("127.0.0.1", said["port"])])
        assert got["fetched"] == 1 and "sha256" in got["skipped_peers"][0], got
        assert (tmp_path / "host" / "examples/m.bin").read_bytes() == b"m" * 1000
        assert fetcher.wait(timeout=15) == 0
    finally:
        liar.close()
        _ends(seed)


@pytest.mark.parametrize("rel", ["../escape.py", "/etc/passwd", "a/../../x"])
def test_a_name_outside_the_workdir_is_refused_and_nothing_is_written(tmp_path, rel):
    proc, said = _relay(tmp_path / "w", [[rel, "0" * 64, 1, 0o644]], peers=[("127.0.0.1", 1)], serve=False)
    assert "refusing" in said["error"] and proc.wait(timeout=15) == 0
    assert not (tmp_path / "escape.py").exists()


def test_peers_hand_out_the_least_busy_host_and_say_when_none_can_come():
    peers = relay.Peers(pending=1, per_peer=2)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(peers.take(timeout=30)))
    waiter.start()                  # a seed is still syncing: take() waits for it, not []
    first = relay.Peer("node-1", "127.0.0.1", 1)
    peers.add(first, seed=True)
    waiter.join(timeout=30)
    assert got == [[first]] and first.busy == 1
    second = relay.Peer("node-2", "127.0.0.1", 2)
    peers.add(second)
    assert peers.take()[0] is second                 # the least busy
    assert peers.take()[0] is first and first.busy == 2
    assert peers.take()[0] is second and peers.take(timeout=0.2) == []    # all slots taken, none coming
    peers.give_back(first)
    assert peers.take(timeout=5)[0] is first
    peers.close()
    assert peers.take() == []
    assert relay.Peers(pending=0).take() == []       # no seed served: the caller syncs directly


HOST = HostSpec(name="node-1", address="127.0.0.1", connection="local", ssh_port=None, user=None, key_file=None,
                python=sys.executable, workdir="~", host_key_policy="reject", known_hosts=None, connect_timeout=10.0)


def _relayed_sync(tmp_path, monkeypatch, count, direct_copies=True):
    monkeypatch.setattr(relay, "relayable", lambda host: host.sync_relay)     # local hosts here, SSH in use
    source = tmp_path / "src"
    _tree(source, FILES)
    files: list[LocalFile] = collect(source, ("roles", "examples"))
    hosts = [dataclasses.replace(HOST, name=f"node-{i}", workdir=str(tmp_path / f"w{i}")) for i in range(1, count + 1)]
    pool = TransportPool(LocalTransport)
    direct: list[str] = []

    def one(host):
        direct.append(host.name)
        if direct_copies:
            try:
                pool.get(host).put_files([(f.path, f"{host.workdir}/{f.rel}") for f in files], root=host.workdir)
            except OSError as exc:          # what an SSH transport's copy raises: HostError
                raise HostError(host.name, f"copying failed: {exc}") from None
        return SyncResult(host.name, len(files), sum(f.size for f in files), 0, False)

    plan = SimpleNamespace(tasks=(), tasks_on=lambda host: ())
    destination = {host.name: host.workdir for host in hosts}
    try:
        result = relay.RelaySync(plan, pool, files, destination, one).run(hosts)
    finally:
        pool.close()
    return hosts, result, direct


def test_a_relayed_sync_copies_to_two_seeds_and_every_other_host_fetches_from_a_peer(tmp_path, monkeypatch):
    hosts, result, direct = _relayed_sync(tmp_path, monkeypatch, 9)
    assert sorted(direct) == ["node-1", "node-2"] and not result.failed
    relayed = {name: r.relayed_from for name, r in result.ok.items() if r.relayed_from}
    assert sorted(relayed) == [f"node-{i}" for i in range(3, 10)]
    assert all(r.sent == 3 and r.bytes == sum(map(len, FILES.values())) for name, r in result.ok.items() if name in relayed)
    for host in hosts:
        for rel, data in FILES.items():
            assert (tmp_path / host.workdir / rel).read_bytes() == data
    deadline = time.monotonic() + 15                  # every serving hostctl ends once its channel is closed
    while _relays_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _relays_running() == []


def _relays_running() -> list[int]:
    """hostctl relay processes still alive among this test process's descendants."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    words = handle.read().split(b"\0")
            except OSError:
                continue
            if b"relay" in words and int(entry) in _children():
                found.append(int(entry))
    return found


def _children() -> set[int]:
    """This test process's descendants (hostctl relays run as its children's children or below)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    mine, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in mine} - mine
        grew, mine = bool(more), mine | more
    return mine - {os.getpid()}


def test_seeds_that_cannot_serve_leave_every_host_to_a_direct_copy(tmp_path, monkeypatch):
    # the seeds' "direct" copy writes nothing: their relay finds the files missing and does not serve
    hosts, result, direct = _relayed_sync(tmp_path, monkeypatch, 9, direct_copies=False)
    assert sorted(direct) == sorted(host.name for host in hosts) and not result.failed
    assert not any(r.relayed_from for r in result.ok.values())


def test_a_host_whose_relay_fails_is_copied_directly_with_the_reason(tmp_path, monkeypatch):
    blocked = tmp_path / "w5"
    blocked.write_text("a file where the workdir should be")      # node-5 cannot write there
    hosts, result, direct = _relayed_sync(tmp_path, monkeypatch, 9)
    assert "node-5" in result.failed                    # its direct copy fails the same way: named
    assert "node-5" in direct and sorted(direct)[:2] == ["node-1", "node-2"]
    assert len([r for r in result.ok.values() if r.relayed_from]) == 6


def test_a_sync_uses_the_relay_only_from_enough_ssh_hosts():
    ssh = [dataclasses.replace(HOST, name=f"n{i}", connection="ssh") for i in range(relay.RELAY_MIN_HOSTS)]
    assert relay.use_relay(ssh)
    assert not relay.use_relay(ssh[:-1])
    assert not relay.use_relay([dataclasses.replace(h, connection="local") for h in ssh])
    assert not relay.use_relay([dataclasses.replace(h, sync_relay=False) for h in ssh])
    assert not relay.use_relay([dataclasses.replace(h, become_user="trainer") for h in ssh])
