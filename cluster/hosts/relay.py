"""Code sync through peers (issue 46): at many hosts the bytes stop coming from this machine.

A direct sync sends every file to every host over that host's SSH connection, and paramiko's
cost per byte is this machine's: 0.16 control CPU-s a host for 11.5 MB of ``roles/`` and
``examples/`` (docs/benchmarks.md, "Scale"), most of ``up`` at 1,000 hosts, and this machine's
link carries 1,000 copies. With the relay, the first :data:`SEEDS` hosts are synced directly;
each then serves its verified copies (hostctl ``relay``: an ephemeral port, a token's HMAC
asked of every client), and every other host fetches what differs from a host that has it,
then serves too, so the hosts that can give grow with every round. This machine only starts
one hostctl call per host and reads its one line.

A peer is trusted with nothing: a fetcher keeps only bytes of the manifest's size and sha256.
A host whose relay fails (no peer reachable: a firewall between hosts, a peer gone) is synced
directly, with its reason in the ``sync`` event; after :data:`GIVE_UP_AFTER` failures before any
success the relay is given up for the rest. Each serving hostctl ends within a second of this
machine closing its channel (its heartbeat line meets a closed pipe), after the sync, on any
failure, and when this process dies; ``seconds`` bounds it besides.

Hosts with ``pscluster_sync_relay: false`` or ``ansible_become``, local hosts, containers and
Slurm steps are synced directly; fewer than :data:`RELAY_MIN_HOSTS` such writers, every host is.
"""
from __future__ import annotations

import heapq
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from . import hostops
from ..errors import HostError
from ..fanout import FanOutResult, fan_out
from ..plan import ClusterPlan, HostSpec
from ..transport import TransportPool
from ..transport.base import Stream, file_mode

if TYPE_CHECKING:
    from .codesync import LocalFile, SyncResult

RELAY_MIN_HOSTS = 8       # writers from which the relay is used (at 16 hosts it cost 0.35 CPU-s against 1.87)
SEEDS = 2                 # hosts synced directly, the first to serve
PER_PEER = 4              # fetches one serving host answers at once
GIVE_UP_AFTER = 4         # relays failed before any succeeded: the rest are synced directly
LINE_TIMEOUT = 120.0      # seconds for a host's relay to fetch and answer
SERVE_SECONDS = 1800.0    # a serving hostctl's own bound, should its channel never close


@dataclass
class Peer:
    host: str
    address: str
    port: int
    busy: int = 0         # fetches it answers now
    given: int = 0        # fetches it answered


class Peers:
    """The hosts that serve and how busy each is. :meth:`take` waits for one with a free slot
    while one may still come (a seed syncing, or a fetch under way that will serve after); it
    returns nothing when none can: the caller syncs directly."""

    def __init__(self, pending: int, per_peer: int = PER_PEER):
        self._cond = threading.Condition()
        self._peers: list[Peer] = []
        self._pending = pending          # seeds not finished yet
        self._per_peer = per_peer
        self._closed = False

    def add(self, peer: Peer | None, *, seed: bool = False) -> None:
        with self._cond:
            if peer is not None:
                self._peers.append(peer)
            if seed:
                self._pending -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """No more relays: every waiting and later :meth:`take` returns nothing."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, timeout: float = LINE_TIMEOUT) -> list[Peer]:
        """The least busy peer with a free slot (marked busy), then up to two others to try
        after it; [] when none can come, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                # the three least busy in one pass (a sort of every peer per take grew as N² log N)
                best = heapq.nsmallest(3, self._peers, key=lambda p: (p.busy, p.given))
                if best and best[0].busy < self._per_peer:
                    best[0].busy += 1
                    return best
                waiting = self._pending > 0 or any(p.busy for p in self._peers)
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    return []
                self._cond.wait(left)
            return []

    def give_back(self, peer: Peer) -> None:
        with self._cond:
            peer.busy -= 1
            peer.given += 1
            self._cond.notify_all()


def relayable(host: HostSpec) -> bool:
    """SSH hosts that allow it; not a host whose tasks run as another user (``ansible_become``):
    its direct copy writes as the login user, a relay would write as the task user."""
    return host.sync_relay and host.connection == "ssh" and not host.become_user


def manifest(files: "list[LocalFile]") -> list[list]:
    """[rel, sha256, size, mode] per file, with the mode the copy must have."""
    return [[f.rel, f.sha256, f.size, f.mode if f.mode is not None else file_mode(f.path)] for f in files]


def _first_line(stream: Stream, timeout: float) -> dict:
    """The relay's one result line (its heartbeats come after it)."""
    deadline, pause = time.monotonic() + timeout, 0.002
    while True:
        for line in stream.lines():
            if line.strip():
                return json.loads(line)
        if stream.closed:
            raise OSError(stream.error or "the relay ended without a word")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer in {timeout:.0f} s")
        stream.wait(left, poll=pause)
        pause = min(0.05, pause * 2)


class RelaySync:
    """One relayed sync of ``files`` to ``hosts`` (writers: one per folder), :meth:`run` it once."""

    def __init__(self, plan: ClusterPlan, pool: TransportPool, files: "list[LocalFile]",
                 destination: dict[str, str], direct: "Callable[[HostSpec], SyncResult]"):
        self.plan = plan
        self.pool = pool
        self.files = files
        self.destination = destination
        self.direct = direct
        self.token = secrets.token_hex(32)
        self.manifest = manifest(files)
        self._streams: list[Stream] = []
        self._lock = threading.Lock()
        self._failed = 0
        self._succeeded = 0
        self.peers: Peers | None = None

    def _address(self, host: HostSpec) -> str:
        """Where the other hosts reach it: its tasks' address (the one the cluster uses)."""
        return next((task.address for task in self.plan.tasks_on(host.name)), host.address)

    def _serve(self, host: HostSpec, peers: list[Peer]) -> dict:
        """hostctl ``relay`` on ``host``: fetch from ``peers`` (none: a seed), then serve."""
        address = self._address(host)
        request = {"root": self.destination[host.name], "files": self.manifest, "token": self.token,
                   "peers": [[p.address, p.port] for p in peers], "serve": True,
                   "bind": "::" if ":" in address else "", "seconds": SERVE_SECONDS}
        transport = self.pool.get(host)
        program = hostops.packed_source()
        stream = transport.stream(hostops.hostctl_argv(transport, "relay", program),
                                  stdin=program + json.dumps(request).encode())
        with self._lock:
            self._streams.append(stream)
        try:
            line = _first_line(stream, LINE_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as exc:
            stream.close()
            raise HostError(host.name, f"relay: {exc}") from None
        if line.get("error") or not isinstance(line.get("port"), int):
            stream.close()
            raise HostError(host.name, f"relay: {line.get('error') or 'no port'}")
        line["address"] = address
        return line

    def _seed(self, host: HostSpec) -> "SyncResult":
        assert self.peers is not None
        try:
            result = self.direct(host)
        except BaseException:
            self.peers.add(None, seed=True)
            raise
        try:
            line = self._serve(host, [])
            self.peers.add(Peer(host.name, line["address"], line["port"]), seed=True)
        except HostError:       # synced all the same; it just does not serve
            self.peers.add(None, seed=True)
        return result

    def _relayed(self, host: HostSpec) -> "SyncResult":
        from .codesync import SyncResult
        assert self.peers is not None
        chosen = self.peers.take()
        if not chosen:
            return self.direct(host)
        try:
            line = self._serve(host, chosen)
        except HostError as exc:
            with self._lock:
                self._failed += 1
                if self._failed >= GIVE_UP_AFTER and not self._succeeded:
                    self.peers.close()
            result = self.direct(host)
            return SyncResult(result.host, result.sent, result.bytes, result.unchanged, False,
                              relay_error=exc.message)
        finally:
            self.peers.give_back(chosen[0])
        with self._lock:
            self._succeeded += 1
        self.peers.add(Peer(host.name, line["address"], line["port"]))
        source = next((p.host for p in chosen if f"{p.address}:{p.port}" == line.get("peer")), None)
        return SyncResult(host.name, int(line["fetched"]), int(line["bytes"]), int(line["unchanged"]), False,
                          relayed_from=source or (chosen[0].host if line["fetched"] else None))

    def run(self, hosts: list[HostSpec]) -> FanOutResult:
        """Seeds first, then the hosts synced directly, then the relayed ones (they wait for
        peers); every serving relay is ended before this returns."""
        relay = [host for host in hosts if relayable(host)]
        seeds, fetchers = relay[:SEEDS], relay[SEEDS:]
        plain = [host for host in hosts if not relayable(host)]
        self.peers = Peers(pending=len(seeds))
        kind = {host.name: self._seed for host in seeds}
        kind.update({host.name: self._relayed for host in fetchers})
        try:
            return fan_out([*seeds, *plain, *fetchers], lambda host: kind.get(host.name, self.direct)(host),
                           name="sync copy", catch=HostError)
        finally:
            self.peers.close()
            with self._lock:
                streams, self._streams = self._streams, []
            for stream in streams:
                stream.close()


def use_relay(hosts: list[HostSpec]) -> bool:
    """Whether a sync to ``hosts`` (one per folder) goes through peers."""
    return sum(1 for host in hosts if relayable(host)) >= RELAY_MIN_HOSTS
