"""One watchdog for every SSH connection of this process: dead hosts are found without a thread
per host.

paramiko's own keepalive sends requests that want no reply, so it never notices silence. Every
``KEEPALIVE_SECONDS`` each watched connection is sent ``keepalive@openssh.com`` wanting a reply,
and a connection that has not answered ``DEAD_AFTER_SECONDS`` after its request went out is
closed; whatever waits on it (a command, SFTP, a stream) then fails at once with "connection
lost" naming the host.

Until issue 46 each connection had a watchdog thread of its own, which started a third thread
for every request (paramiko's ``global_request`` blocks until the answer): three threads per host
with paramiko's reader, and 500 thread starts a second at 1,000 hosts. Here one thread decides,
on a clock, which requests are due and which connections are dead (:meth:`Keepalives.check`),
and a fixed pool of ``WORKERS`` threads waits for the answers, each for milliseconds on a live
host. A dead host holds a worker until its connection is closed; a request waiting for a free
worker is not counted as unanswered (its time starts when it is sent), so a burst of dead hosts
delays the next requests to live ones, never declares them dead. Measured in docs/benchmarks.md,
"Scale".

No paramiko import: a connection is anything with ``is_active``, ``global_request`` and
``close`` (a ``paramiko.Transport``; a fake in tests/unit/test_keepalive.py). A connection that
brought data lately (:func:`heard`: a watch stream's chunk) is sent no request: it answered.
"""
from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol

HEARD_AT = "pscluster_heard_at"     # set on a connection by what reads it (:func:`heard`)
KEEPALIVE_SECONDS = 2.0
DEAD_AFTER_SECONDS = 10.0   # OpenSSH answers in ms; 10 s of silence on a loaded 2-core box is a dead host
WORKERS = 8                 # requests waiting for their answers at once, for every host together
TICK_SECONDS = 0.5          # how often the watchdog looks


class Connection(Protocol):
    def is_active(self) -> bool: ...

    def global_request(self, kind: str, data: Any = None, wait: bool = True) -> Any: ...

    def close(self) -> None: ...


@dataclass
class Watched:
    """A connection as the watchdog tracks it: ``sent_at`` is set while a request is out."""
    conn: Connection
    answered_at: float
    queued: bool = False
    sent_at: float | None = None
    dead: bool = False


class Keepalives:
    """The watchdog of a set of connections; :meth:`watch` adds one, closed ones leave by themselves.

    Args:
        clock: monotonic seconds; ``submit`` runs a request (default: the pool of ``workers``).
    """

    def __init__(self, *, every: float = KEEPALIVE_SECONDS, dead_after: float = DEAD_AFTER_SECONDS,
                 workers: int = WORKERS, clock: Callable[[], float] = time.monotonic,
                 submit: Callable[[Callable[[], None]], object] | None = None):
        self.every = every
        self.dead_after = dead_after
        self.clock = clock
        self._workers = workers
        self._submit = submit
        self._watched: list[Watched] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, conn: Connection, *, start: bool = True) -> Watched:
        """Watch ``conn`` from now on (its first request goes out ``every`` seconds from now);
        ``start``: make sure the watchdog thread runs (False: the caller calls :meth:`check`)."""
        watched = Watched(conn, answered_at=self.clock())
        with self._lock:
            self._watched.append(watched)
            if start and self._thread is None:
                if self._submit is None:
                    self._submit = ThreadPoolExecutor(max_workers=self._workers,
                                                      thread_name_prefix="ssh-keepalive").submit
                self._thread = threading.Thread(target=self._run, name="ssh-watchdog", daemon=True)
                self._thread.start()
        return watched

    def watched(self) -> int:
        with self._lock:
            return len(self._watched)

    def check(self, now: float) -> list[Watched]:
        """One look at every connection: forget the closed ones, close those whose request has
        gone unanswered for ``dead_after`` seconds, send a request to those due. Returns the
        connections found dead."""
        with self._lock:
            items = list(self._watched)
        gone, dead = [], []
        for watched in items:
            if not watched.conn.is_active():
                gone.append(watched)
            elif watched.queued:
                if watched.sent_at is not None and now - watched.sent_at > self.dead_after:
                    watched.dead = True
                    dead.append(watched)
                    gone.append(watched)
            elif now - max(watched.answered_at, getattr(watched.conn, HEARD_AT, 0.0)) >= self.every:
                watched.queued = True
                if self._submit is None:
                    raise RuntimeError("Keepalives.check before anything can send: watch(start=True) or pass submit")
                self._submit(functools.partial(self._ask, watched))
        for watched in dead:
            watched.conn.close()
        if gone:
            with self._lock:
                self._watched = [w for w in self._watched if not any(w is g for g in gone)]
        return dead

    def _ask(self, watched: Watched) -> None:
        watched.sent_at = self.clock()
        try:
            watched.conn.global_request("keepalive@openssh.com", wait=True)
        except Exception:     # the connection went away: the next check sees it closed
            pass
        watched.answered_at = self.clock()
        watched.sent_at = None
        watched.queued = False

    def _run(self) -> None:
        while True:
            self.check(self.clock())
            time.sleep(TICK_SECONDS)


def heard(conn: object, now: float) -> None:
    """Data came in on ``conn`` at ``now`` (the watchdog's clock): it answers, so its next request
    waits ``every`` seconds from then. A host's watch stream speaks every second, so its connection
    needs no request of its own while it does (issue 46: one round trip per host every 2 s fewer;
    at 64 hosts the steady CPU it saves was within this machine's noise, docs/benchmarks.md)."""
    setattr(conn, HEARD_AT, now)


KEEPALIVES = Keepalives()   # this process's watchdog, shared by every SSHTransport
