"""The seam between pscluster and hosts.

A :class:`Transport` runs argv lists on one host (with optional stdin) and copies files there.
Lifecycle, preflight, code sync and supervision speak only to this interface; the local
implementation uses subprocess, the SSH one Fabric/paramiko. Higher-level host operations
(start a task, stop groups, read logs) are in :mod:`cluster.hosts.hostops`, built on ``run``.
"""
from __future__ import annotations

import abc
import os
import posixpath
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import HostEndedError, HostError
from ..plan import HostSpec


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one command on one host."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, what: str) -> "CommandResult":
        """Raise :class:`HostError` (with stderr) unless the command succeeded."""
        if not self.ok:
            raise HostError(self.host, f"{what} failed", argv=self.argv, exit_code=self.exit_code,
                            stderr=self.stderr or self.stdout)
        return self


class Stream:
    """Lines from a long-running command.

    ``lines()`` never blocks; ``closed`` turns true when the command's output ended or the
    connection broke (``error`` then says why). Pushed (no ``ready``): a reader thread collects
    the lines as they come. Pulled (``ready`` says whether ``read_chunk`` would return at once):
    ``lines()`` reads what has come, in the caller's thread, and ``closed`` is current as of the
    last ``lines()``: an SSH watch stream is read so, since a thread per host cost a thread
    switch per line and 1 of the 2.2 threads a host (issue 46, docs/benchmarks.md "Scale").
    """

    def __init__(self, read_chunk: Callable[[], bytes], close: Callable[[], None], *,
                 ready: Callable[[], bool] | None = None, wait: Callable[[float], None] | None = None):
        self._read_chunk = read_chunk
        self._close = close
        self._ready = ready
        self._wait = wait
        self._queue: queue.Queue[str] = queue.Queue()
        self._buffer = b""
        self._pulling = threading.Lock()     # (the supervisor's thread alone pulls; a lock costs nothing)
        self.closed = False
        self.closed_here = False        # closed by :meth:`close` (not by its command's end)
        self.error: str | None = None
        if ready is None:
            self._thread: threading.Thread | None = threading.Thread(target=self._pump, daemon=True)
            self._thread.start()
        else:
            self._thread = None

    def _feed(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes (a line's start waits in the buffer for its end)."""
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]

    def _pump(self) -> None:
        try:
            while True:
                chunk = self._read_chunk()
                if not chunk:
                    break
                for line in self._feed(chunk):
                    self._queue.put(line)
        except Exception as exc:   # a broken connection ends the stream, whatever the exception
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.closed = True

    def _pull(self, ready: Callable[[], bool]) -> list[str]:
        """What has come, read in the caller's thread (no queue: the caller takes it now)."""
        found: list[str] = []
        try:
            while not self.closed and ready():
                chunk = self._read_chunk()
                if not chunk:
                    self.closed = True
                    break
                found += self._feed(chunk)
        except Exception as exc:   # as in _pump
            self.error = f"{type(exc).__name__}: {exc}"
            self.closed = True
        return found

    def lines(self) -> list[str]:
        if self._ready is not None:
            with self._pulling:
                return self._pull(self._ready)
        found = []
        while True:
            try:
                found.append(self._queue.get_nowait())
            except queue.Empty:
                return found

    def wait(self, timeout: float, *, poll: float) -> None:
        """Until output may have come or the stream ended, at most ``timeout`` seconds; a stream
        that cannot say so (an SSH channel's) sleeps ``poll`` seconds instead: a relayed stream
        (transport/spread.py) is waited on, not polled, by the many threads of a code sync."""
        if self._wait is not None:
            self._wait(timeout)
        else:
            time.sleep(max(0.0, min(timeout, poll)))

    def wait_lines(self) -> list[str]:
        """The next lines, waiting until at least one has come or the stream ended (then ``[]``
        and ``closed``): for one thread that relays a stream whole (transport/spread.py)."""
        if self._ready is None:
            while True:
                try:
                    found = [self._queue.get(timeout=0.2)]
                except queue.Empty:
                    if self.closed and self._queue.empty():
                        return []
                    continue
                return found + self.lines()
        with self._pulling:
            while not self.closed:
                try:
                    chunk = self._read_chunk()
                except Exception as exc:   # as in _pump
                    self.error = f"{type(exc).__name__}: {exc}"
                    self.closed = True
                    break
                if not chunk:
                    self.closed = True
                    break
                found = self._feed(chunk)
                if found:
                    return found
            return []

    def close(self) -> None:
        self.closed_here = True     # first: what the command says as it ends (a watch's notice) is ours
        try:
            self._close()
        except Exception:   # closing a broken stream may raise anything; it is closed either way
            pass
        self.closed = True


class Transport(abc.ABC):
    """Runs commands and copies files on one host."""

    def __init__(self, host: HostSpec):
        self.host = host

    @abc.abstractmethod
    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        """Run ``argv`` on the host (no shell semantics beyond one shlex-quoted command line).

        Raises:
            UnreachableHostError: the host cannot be reached.
            HostError: the command did not finish within ``timeout``.
        """

    @abc.abstractmethod
    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Stream:
        """Start ``argv`` and return its output as a :class:`Stream` (stdin is sent, then closed)."""

    def put_files(self, files: Sequence[tuple[str, str]], *, root: str, mode: int | None = None) -> None:
        """Copy local files to remote paths below ``root`` atomically (write a temporary, then rename).

        Temporary names are unique per writer (hosts sharing a filesystem may write the same
        file at once); without ``mode`` a file gets 0755 if executable here, else 0644, not
        this machine's other permission bits (a private umask must not hide code from a task user).
        A local symlink is followed: its content travels, in every transport.

        Raises:
            HostError: a remote path that is not below ``root`` once normalized (``root/../x``),
                naming it; nothing is copied then.
        """
        for _, remote in files:
            inside(self.host.name, root, remote)
        self._put_files(files, mode=mode)

    @abc.abstractmethod
    def _put_files(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> None:
        """:meth:`put_files` once its destinations are checked."""

    def tunnel(self, address: str, port: int) -> str | None:
        """A local ``host:port`` that reaches ``address:port`` as this host sees it, when the
        control machine cannot reach it directly (a host behind a bastion); None: go direct."""
        return None

    def forward(self, address: str, port: int, *, local_port: int = 0) -> str | None:
        """A local ``127.0.0.1:PORT`` (``local_port``, or any free one with 0) whose connections
        reach ``address:port`` as this host sees it, like ``ssh -L``: for a service bound to the
        host's loopback (TensorBoard). None when the host is this machine: nothing to forward.

        Raises:
            UsageError: ``local_port`` is taken on this machine.
            HostError: this transport cannot carry connections to its host.
        """
        raise HostError(self.host.name, f"cannot forward a port over a {type(self).__name__}",
                        hint="forward it yourself (e.g. ssh -L) to the port named above")

    def connect(self) -> None:
        """Open the connection now (so preflight can time and report it)."""

    def describe(self) -> str | None:
        """What runs the host's commands, when the host name alone does not say it (a container
        and its image); preflight adds it to a missing Python or TensorFlow."""
        return None

    def close(self) -> None:
        """Release the connection; the transport may be used again (it reconnects)."""

    def ended(self) -> HostEndedError | None:
        """Why the host is gone for good with what ran there (:class:`~cluster.errors.HostEndedError`),
        when this transport can tell (a Slurm job that ended); None: it may answer again."""
        return None

    def reset(self) -> None:
        """Drop the connection (not the tunnels), so that the next call opens a new one: after a
        host was lost, a fresh connection answers as soon as the host does, where the old one
        may wait out TCP's retransmission backoff. No-op where there is no connection to keep."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.host.name})"


def inside(host: str, root: str, remote: str) -> str:
    """``remote`` normalized, if it lies below ``root`` (both as the host spells them, ``~`` too).

    Raises:
        HostError: naming the file, when it would be written elsewhere.
    """
    base, path = posixpath.normpath(root), posixpath.normpath(remote)
    if not root or base in ("/", ".") or not path.startswith(base.rstrip("/") + "/") or "\0" in remote:
        raise HostError(host, f"refusing to copy to {remote!r}: not below the workdir {root!r}",
                        hint="a file name that leads out of the workdir (../, an absolute path) is never written")
    return path


def file_mode(local: str) -> int:
    """0755 for an executable local file, else 0644 (see :meth:`Transport.put_files`)."""
    return 0o755 if os.stat(local).st_mode & 0o111 else 0o644


def temp_name(path: str) -> str:
    """A temporary name beside ``path`` that no other writer (process, thread, host) uses."""
    return f"{path}.pscluster-tmp-{uuid.uuid4().hex}"
