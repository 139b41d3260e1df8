"""The SSH connections of many hosts held by helper processes, so that one interpreter's core
does not bound ``up`` (issue 46).

At 1,000 hosts the control process spent about 29 CPU-ms per host in ``up``, most of it in
paramiko: the key exchange, and the packets of every command, stream and copy, each framed,
encrypted and read in Python under one GIL (docs/benchmarks.md, "Scale"). A
:class:`~cluster.transport.TransportPool` that was asked to :meth:`~TransportPool.spread` over
many SSH hosts gives each of them a :class:`SpreadTransport` instead: the real transport lives in
one of a few helper processes (``python -m cluster.transport.spread``, this module's
:func:`main`), and every call travels to it as one pickled frame over the helper's stdin and
comes back as one over its stdout. The pscluster code above the pool (preflight, the relay, the
start, the readiness probes, the state) stays in this process and is unchanged: it still sees a
:class:`~cluster.transport.base.Transport`.

What a call costs this process is a frame each way, where it was a connection's key exchange and
the SSH packets of each command; the helpers' work runs on other cores. Errors come back whole
(:class:`~cluster.errors.PsclusterError` pickles its attributes); a stream's lines come back as
they arrive (a thread per open stream in the helper, none here); a tunnel or forward listens in
the helper, on this machine, so its address works here as it is.

A helper ignores Ctrl-C, SIGTERM and SIGHUP (this process decides what to stop, and needs the
connections for it: a signal to the process group reaches both) and ends when this process
closes its stdin, or dies: then every transport it held is closed.
If a helper dies first, every call to its hosts fails at once with a
:class:`~cluster.errors.HostError` that says so and quotes the helper's last words.

How many: ``PSCLUSTER_CONTROL_PROCESSES`` (0: none, every connection in this process), else
none below ``SPREAD_MIN_HOSTS`` SSH hosts, and above, one per ``HOSTS_PER_HELPER`` up to the
cores less one (at least one).
"""
from __future__ import annotations

import itertools
import math
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO, Any, Sequence

from ..errors import HostError, PsclusterError, UsageError
from ..plan import HostSpec
from .base import CommandResult, Stream, Transport

SPREAD_MIN_HOSTS = 128       # below this, the connections' CPU fits in this process (measured)
HOSTS_PER_HELPER = 125       # 1,000 hosts: 8 helpers, on a control machine with 9 cores or more
ENV = "PSCLUSTER_CONTROL_PROCESSES"

_HEADER = struct.Struct(">I")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def helpers_for(hosts: int, *, setting: str | None = None, cores: int | None = None) -> int:
    """How many helper processes for ``hosts`` SSH hosts (``setting``: the environment's
    ``PSCLUSTER_CONTROL_PROCESSES``; ``cores``: this machine's).

    Raises:
        UsageError: a setting that is not a whole number from 0 to 64.
    """
    setting = os.environ.get(ENV) if setting is None else setting
    if setting not in (None, ""):
        try:
            wanted = int(setting)
        except ValueError:
            wanted = -1
        if not 0 <= wanted <= 64:
            raise UsageError(f"{ENV}={setting!r}: expected a whole number of helper processes from 0 to 64",
                             hint=f"0 keeps every connection in pscluster's own process; unset {ENV} for the default")
        return min(wanted, hosts)
    if hosts < SPREAD_MIN_HOSTS:
        return 0
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, min(cores - 1, math.ceil(hosts / HOSTS_PER_HELPER)))


def _send(pipe: IO[bytes], lock: threading.Lock, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        pipe.write(_HEADER.pack(len(data)) + data)
        pipe.flush()


def _receive(pipe: IO[bytes]) -> Any:
    """The next message, or None at the pipe's end."""
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    size, = _HEADER.unpack(header)
    data = pipe.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class _Waiting:
    """One call's answer, once it came."""

    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


class _Relayed:
    """This side of a stream the helper reads: its lines, queued as they come."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.ended = False
        self.error: str | None = None
        self.arrived = threading.Condition()

    def add(self, chunk: bytes) -> None:
        with self.arrived:
            self.chunks.append(chunk)
            self.arrived.notify_all()

    def end(self, error: str | None) -> None:
        with self.arrived:
            self.ended, self.error = True, error
            self.arrived.notify_all()

    def ready(self) -> bool:
        return bool(self.chunks) or self.ended

    def wait(self, timeout: float) -> None:
        with self.arrived:
            if not self.chunks and not self.ended:
                self.arrived.wait(timeout)

    def read(self) -> bytes:
        with self.arrived:
            while not self.chunks and not self.ended:
                self.arrived.wait()
            if self.chunks:
                return self.chunks.popleft()
            if self.error:
                raise OSError(self.error)
            return b""


class Helper:
    """One helper process and the calls under way in it."""

    def __init__(self, index: int) -> None:
        self.index = index
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen([sys.executable, "-m", "cluster.transport.spread"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=env)
        self._stdin: IO[bytes] = self.process.stdin      # type: ignore[assignment]
        self._writing = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        self._streams: dict[int, _Relayed] = {}
        self._hosts: set[str] = set()
        self._last_words: deque[str] = deque(maxlen=12)
        self.gone: str | None = None
        threading.Thread(target=self._read, name=f"spread-{index}", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"spread-{index}-err", daemon=True).start()

    def _read(self) -> None:
        stdout: IO[bytes] = self.process.stdout       # type: ignore[assignment]
        while True:
            reason: str | None = None
            try:
                message = _receive(stdout)
            except Exception as exc:     # a torn frame: the helper is of no further use
                message, reason = None, f"unreadable answer ({type(exc).__name__}: {exc})"
            if message is None:
                self._lost(reason)
                return
            kind, ident, value = message
            if kind == "lines":
                relayed = self._streams.get(ident)
                if relayed is not None:
                    relayed.add(value)
            elif kind == "end":
                with self._lock:
                    relayed = self._streams.pop(ident, None)
                if relayed is not None:
                    relayed.end(value)
            else:
                with self._lock:
                    waiting = self._waiting.pop(ident, None)
                if waiting is not None:
                    waiting.ok, waiting.value = kind == "ok", value
                    waiting.done.set()

    def _read_stderr(self) -> None:
        for line in self.process.stderr:       # type: ignore[union-attr]
            self._last_words.append(line.decode("utf-8", "replace").rstrip())

    def _lost(self, reason: str | None) -> None:
        code = self.process.poll()
        if code is None:
            try:
                code = self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
        words = "; ".join(line for line in self._last_words if line.strip())[-600:]
        with self._lock:
            self.gone = reason or f"it ended{f' with exit code {code}' if code is not None else ''}" + \
                (f": {words}" if words else "")
            waiting, self._waiting = list(self._waiting.values()), {}
            streams, self._streams = list(self._streams.values()), {}
        for one in waiting:
            one.ok, one.value = False, None
            one.done.set()
        for relayed in streams:
            relayed.end(f"pscluster's helper process ended ({self.gone})")

    def _error(self, host: str) -> HostError:
        return HostError(host, f"pscluster's helper process {self.index} holding this host's connection is gone: "
                               f"{self.gone}", hint="a bug of pscluster's; run the command again, "
                                                    f"or set {ENV}=0 to keep the connections in one process")

    def call(self, host: HostSpec, op: str, *args: Any, stream: _Relayed | None = None) -> Any:
        waiting = _Waiting()
        with self._lock:
            if self.gone is not None:
                raise self._error(host.name)
            ident = next(self._ids)
            self._waiting[ident] = waiting
            if stream is not None:
                self._streams[ident] = stream
            first = host.name not in self._hosts
            self._hosts.add(host.name)
        try:
            _send(self._stdin, self._writing, (ident, op, host if first else host.name, args))
        except (OSError, ValueError):      # its stdin broke: it died; the reader says why
            waiting.done.wait(5)
            raise self._error(host.name) from None
        waiting.done.wait()
        if waiting.ok:
            return waiting.value
        if stream is not None:
            with self._lock:
                self._streams.pop(ident, None)
        if waiting.value is None:
            raise self._error(host.name)
        raise waiting.value

    def end(self) -> None:
        """Ask the helper to end (without waiting): it closes every connection it holds first."""
        try:
            self._stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        """End the helper and wait for it."""
        self.end()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class SpreadTransport(Transport):
    """A host's transport that lives in a :class:`Helper`; every method is a call to it."""

    def __init__(self, host: HostSpec, helper: Helper):
        super().__init__(host)
        self.helper = helper
        self._direct = False

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float = 60.0) -> CommandResult:
        return self.helper.call(self.host, "run", tuple(argv), stdin, timeout)

    def stream(self, argv: Sequence[str], *, stdin: bytes | None = None) -> Stream:
        relayed = _Relayed()
        ident = self.helper.call(self.host, "stream", tuple(argv), stdin, stream=relayed)
        return Stream(relayed.read, lambda: self.helper.call(self.host, "close_stream", ident), ready=relayed.ready,
                      wait=relayed.wait)

    def put_files(self, files: Sequence[tuple[str, str]], *, root: str, mode: int | None = None) -> None:
        self.helper.call(self.host, "put_files", tuple(files), root, mode)

    def _put_files(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> None:
        raise NotImplementedError("put_files is the helper's")      # never reached: put_files above

    def tunnel(self, address: str, port: int) -> str | None:
        # None (no jump host: go direct) stays None for the process's life; asked once, not at
        # every readiness probe. A tunnel's address is asked each time: the helper revives it.
        if self._direct:
            return None
        found = self.helper.call(self.host, "tunnel", address, port)
        self._direct = found is None
        return found

    def forward(self, address: str, port: int, *, local_port: int = 0) -> str | None:
        return self.helper.call(self.host, "forward", address, port, local_port)

    def connect(self) -> None:
        self.helper.call(self.host, "connect")

    def describe(self) -> str | None:
        return self.helper.call(self.host, "describe")

    def ended(self):
        return self.helper.call(self.host, "ended")

    def reset(self) -> None:
        self.helper.call(self.host, "reset")

    def close(self) -> None:
        if self.helper.gone is None:
            self.helper.call(self.host, "close")


# --- the helper process -------------------------------------------------------------------


class _Server:
    """What :func:`main` serves: the transports of its hosts and their open streams."""

    def __init__(self, out: IO[bytes]) -> None:
        from . import open_transport
        self._open = open_transport
        self._out = out
        self._writing = threading.Lock()
        self._lock = threading.Lock()
        self.transports: dict[str, Transport] = {}
        self.streams: dict[int, Stream] = {}

    def answer(self, kind: str, ident: int, value: Any) -> None:
        try:
            _send(self._out, self._writing, (kind, ident, value))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:     # an error that will not pickle
            _send(self._out, self._writing, ("err", ident, PsclusterError(f"{type(value).__name__}: {value} "
                                                                          f"(unpicklable: {exc})")))
        except (OSError, ValueError):       # the caller is gone: nothing to tell
            pass

    def handle(self, ident: int, op: str, name: str, args: tuple) -> None:
        try:            # every request is answered, whatever goes wrong: the caller waits for it
            transport = self.transports.get(name)
            if transport is None:
                raise PsclusterError(f"helper: no host {name!r} here (its description never came)")
            if op == "stream":
                stream = transport.stream(args[0], stdin=args[1])
                with self._lock:
                    self.streams[ident] = stream
                self.answer("ok", ident, ident)
                self._relay(ident, stream)
                return
            if op == "close_stream":
                with self._lock:
                    ending = self.streams.pop(args[0], None)
                if ending is not None:
                    ending.close()
                value: Any = None
            elif op == "run":
                value = transport.run(args[0], stdin=args[1], timeout=args[2])
            elif op == "put_files":
                transport.put_files(args[0], root=args[1], mode=args[2])
                value = None
            elif op == "forward":
                value = transport.forward(args[0], args[1], local_port=args[2])
            elif op in ("tunnel",):
                value = transport.tunnel(*args)
            elif op in ("connect", "describe", "ended", "reset", "close"):
                value = getattr(transport, op)()
            else:
                raise PsclusterError(f"helper: no operation {op!r}")
        except BaseException as exc:        # every error goes back to the caller, which raises it
            self.answer("err", ident, exc)
        else:
            self.answer("ok", ident, value)

    def _relay(self, ident: int, stream: Stream) -> None:
        try:
            while True:
                lines = stream.wait_lines()
                if not lines:
                    break
                self.answer("lines", ident, "".join(line + "\n" for line in lines).encode())
        finally:
            with self._lock:
                self.streams.pop(ident, None)
            self.answer("end", ident, stream.error if not stream.closed_here else None)

    def close(self) -> None:
        with self._lock:
            streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            stream.close()
        for transport in list(self.transports.values()):
            try:
                transport.close()
            except Exception:   # closing a broken connection may raise anything
                pass


def main() -> int:
    """Serve calls from stdin until it ends (``python -m cluster.transport.spread``)."""
    # Ctrl-C, and SIGTERM/SIGHUP sent to the process group, are for the control process to act on:
    # it stops what it started through the connections held here (cli/base.py), and then closes
    # this helper's stdin; its death closes the stdin too.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # (its open-files limit is the control process's, raised for every host before it spread)
    source: IO[bytes] = sys.stdin.buffer
    out: IO[bytes] = sys.stdout.buffer
    sys.stdout = sys.stderr           # nothing else may write into the frames
    server = _Server(out)
    try:
        while True:
            message = _receive(source)
            if message is None:
                return 0
            ident, op, host, args = message
            if isinstance(host, HostSpec):
                try:
                    server.transports[host.name] = server._open(host)
                except Exception as exc:    # answered as the call's error (handle finds no transport)
                    print(f"helper: cannot open a transport to {host.name}: {exc}", file=sys.stderr)
                host = host.name
            threading.Thread(target=server.handle, args=(ident, op, host, args), daemon=True).start()
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main())
