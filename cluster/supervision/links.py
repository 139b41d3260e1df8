"""One ``watch`` stream per host: task states and new bytes of files, pushed by the host.

Each host runs ``roles/hostctl.py watch`` over one SSH channel (a subprocess for local hosts);
it sends a JSON line when a state changes or a watched file grows, and a heartbeat every
second. A stream silent for :data:`LOST_AFTER` seconds marks the host lost; the stream is
reopened in the background until the host answers again.

A watch told to go (SIGTERM, SIGUSR1: the host's own shutdown, Slurm's ``--signal``) says so in a
line with a ``notice``: the link keeps the first (:attr:`HostLink.notice`) for the supervisor,
which drains the host (cluster/supervision/notices.py), but never one from a stream it closed
itself (the local transport and Slurm close a stream with SIGTERM). A stream that ends just
after its notice is reopened without counting the host lost: the host is lost only if the new
one stays silent. A lost host whose transport says it is gone for good with its tasks (the
Slurm job ended: :meth:`Transport.ended`) is not reopened: :attr:`HostLink.ended` says why.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ..hosts import hostops
from ..errors import HostEndedError, PsclusterError
from ..plan import HostSpec
from ..state import ProcessRecord
from ..transport import TransportPool
from ..transport.base import Stream

LOST_AFTER = 4.0            # a watch stream silent this long: the host is lost
REOPEN_DELAY = 2.0


class HostLink:
    """The ``watch`` stream of one host; reopened in the background when it breaks or changes."""

    def __init__(self, host: HostSpec, pool: TransportPool, *, clock: Callable[[], float] = time.monotonic,
                 interval: float = 0.25, offset_of: Callable[[str], int] = lambda path: 0):
        self.host = host
        self.pool = pool
        self.clock = clock
        self.interval = interval
        # Where each watched file has been read up to: asked each time a stream (re)opens, so a
        # stream reopened after a lost host resumes where the last one stopped.
        self.offset_of = offset_of
        self.stream = None
        self.targets: tuple[list[ProcessRecord], list[str]] = ([], [])
        self.last_seen = clock()
        self.opened_at = self.last_seen  # when the current stream was installed: it gets LOST_AFTER to speak
        self.lost_since: float | None = None
        self.error: str | None = None
        self.reported = False           # its loss was reported (once per loss)
        self.ended: HostEndedError | None = None       # gone for good with its tasks (a Slurm job that ended)
        self.notice: dict[str, str] | None = None     # the first notice heard (the supervisor takes it)
        self.watch_pid: int | None = None              # the current stream's watch process, on its host
        self._noticed_on: object | None = None         # the stream that said it (it may end next)
        self._opening = False
        self._closed = False
        self._reset = False             # the next open starts on a new connection (after a loss)
        self._lock = threading.Lock()

    def set_targets(self, records: list[ProcessRecord], files: list[str]) -> None:
        """Watch these processes and files from now on."""
        with self._lock:
            self.targets = (records, files)
            old, self.stream = self.stream, None
            self.watch_pid = None             # the next stream's, once it speaks
            self.last_seen = self.clock()     # a new stream gets a full grace period
        if old is not None:
            old.close()
        self._open_soon()

    def _open_soon(self) -> None:
        with self._lock:
            if self._opening or self._closed:
                return
            self._opening = True
        threading.Thread(target=self._open, daemon=True).start()

    def _open(self) -> None:
        try:
            while not self._closed:
                targets = self.targets
                records, files = targets
                try:
                    transport = self.pool.get(self.host)
                    if self._reset:
                        # The old connection may wait out TCP's retransmission backoff long
                        # after the host answers again (measured after a 5 s link cut: the
                        # stream reopened 0.1, 25 and 52 s after the heal); a new one does not.
                        self._reset = False
                        transport.reset()
                    # Each try while lost: Slurm may take a silent node out (SlurmdTimeout) long after.
                    ended = transport.ended() if self.lost_since is not None else None
                    if ended is not None:           # nothing to reopen, ever
                        self.ended, self.error = ended, ended.message.splitlines()[0]
                        return
                    stream = hostops.watch(self.pool.get(self.host), records,
                                           [(path, self.offset_of(path)) for path in files], interval=self.interval)
                except Exception as exc:    # never end this thread: the link would stay lost for good
                    self.error = exc.message if isinstance(exc, PsclusterError) else f"{type(exc).__name__}: {exc}"
                    time.sleep(REOPEN_DELAY)
                    continue
                with self._lock:
                    if targets is self.targets and not self._closed:
                        self.stream = stream
                        self.opened_at = self.clock()
                        return
                stream.close()         # targets changed (or closed) while connecting
        finally:
            with self._lock:
                self._opening = False

    def poll(self, now: float) -> list[hostops.WatchUpdate]:
        """New updates; marks the host lost when its stream has been silent too long."""
        stream = self.stream
        updates: list[hostops.WatchUpdate] = []
        if stream is not None:
            for line in stream.lines():
                update = hostops.parse_watch_line(line)
                if update is not None:
                    updates.append(update)
                    self._heard(stream, update)
        if stream is not None and stream.closed and stream is self._noticed_on and \
                now - self.last_seen <= LOST_AFTER:
            # It ended after its notice (SIGTERM): a new stream, and the host is not lost for that.
            self._noticed_on = None
            stream.close()
            with self._lock:
                if self.stream is stream:
                    self.stream = None
            self._open_soon()
            stream = None
        if updates:
            self.last_seen = now
            self.lost_since = None
            self.error = None
            self.reported = False
        elif now - max(self.last_seen, self.opened_at) > LOST_AFTER or (stream is not None and stream.closed):
            # (A stream reopened after a loss is judged from its own start: judged from the last
            # line of the old one, it was closed before its first line, again and again; a 5 s
            # link cut then took 10-68 s to be seen healed.)
            if self.lost_since is None:
                self.lost_since = self.last_seen
                self._reset = True
                self.error = self.error or (stream.error if stream is not None and stream.error else
                                            f"no heartbeat for {now - self.last_seen:.0f} s")
            if stream is not None:
                stream.close()
                with self._lock:
                    if self.stream is stream:
                        self.stream = None
            self._open_soon()
        return updates

    def _heard(self, stream: Stream, update: hostops.WatchUpdate) -> None:
        if update.pid is not None:
            self.watch_pid = update.pid
        if update.notice is not None and not stream.closed_here:
            self._noticed_on = stream
            if self.notice is None:
                self.notice = dict(update.notice)

    def take_notice(self) -> dict[str, str] | None:
        """The notice heard since the last call, if any."""
        notice, self.notice = self.notice, None
        return notice

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self.stream = self.stream, None
            self.targets = ([], [])
        if stream is not None:
            stream.close()
