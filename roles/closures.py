"""Async mode: the chief never waits on one closure without bound.

A closure runs on a worker as one gRPC call from the chief. When the worker's host goes away
without a word (a link cut, a reboot, a power loss) the chief's connection to it is left
half-open: the chief sent its request, is owed an answer, and sends nothing more, so no TCP
reset ever comes back, and TensorFlow 2.21 sets no gRPC keepalive on these channels. The call
then never returns, even after the host is back with a new server on the same port, and the
chief, which collects closures in the order it scheduled them, waits for good (issue 41's hang:
``WorkerClosureProcessingLoop-2`` inside ``execute_with_cancellation``, the chief in
``AsyncTrainer.collect_one``).

What to do with a worker whose call *fails* is roles/workerloss.py's: the closure goes back to
the queue, another worker runs it, and the failed worker is taken back once it answers. So the
chief makes the hung call fail: :class:`ClosureWatch` knows when each worker's current closure
began (the coordinator's ``Worker._process_closure`` is wrapped, one timestamp per worker
thread); a closure running far longer than any seen (:func:`stuck_after`) names its worker, and
:func:`cut_connections` shuts this process's TCP connections to that worker's address
(``shutdown`` on a duplicate of gRPC's socket, found through ``/proc/self/net/tcp{,6}`` and
``/proc/self/fd`` as roles/handover.py finds listeners). gRPC sees the connection end and the
call fails with ``UnavailableError`` (at once, or ~20 s later when gRPC gives up reconnecting to
the cut address): no checkpoint is restored, and the job loses no step beyond the closure that
was in flight. The chief collects closures in any order, so the other workers train on
meanwhile; the cut is judged per closure, not by whether the others finish theirs.

Before that, a closure that takes a few times the slowest one seen makes the chief say so: a
``waiting`` event (``worker``, ``seconds``, ``step``) that the orchestrator shows as
``stalled for N s (waiting on worker:2@h3)``.

Both the watch and the orchestrator's word that a host was lost (a ``cut`` request) are acted on
by a :class:`Lookout` thread beside the chief's loop, not by the loop between two waits: the loop
itself can block on a cut worker where no wait of ours is (a save, a ``join``, a variable's write:
TensorFlow holds them behind the cut worker's pending ops, over 250 s with its packets dropped,
docs/platform-notes.md TF10). In CI the chief blocked so right after a cut, the orchestrator's
cut request unread; its stall watch restarted the chief after 60 s (the in-place drop-out lost
its point). Shut from beside, the pending ops fail and the loop goes on.

Imports no TensorFlow at module level: the orchestrator's unit tests use the /proc parsing.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from roles.handover import own_sockets, shut

log = logging.getLogger("pscluster.closures")

# A closure this much slower than the slowest one collected so far is reported as waited on...
WAITING_FACTOR = 4.0
WAITING_MIN_SECONDS = 5.0
# ... and this much slower is taken for hung: its worker's connections are cut.
STUCK_FACTOR = 10.0
STUCK_MIN_SECONDS = 20.0
# How often a ``waiting`` event is repeated while the same closure is waited on.
WAITING_EVERY = 5.0

_ESTABLISHED_OR_CLOSING = {"01", "02", "03", "04", "05", "06", "08", "09", "0B"}   # all but LISTEN/CLOSE/TIME_WAIT


def waiting_after(slowest: float) -> float:
    """Seconds a closure may run before the chief reports that it waits on its worker."""
    return max(WAITING_MIN_SECONDS, WAITING_FACTOR * slowest)


def stuck_after(slowest: float) -> float:
    """Seconds a closure may run before the chief takes it for hung and cuts its worker's
    connections (10 times the slowest closure collected, at least 20 s)."""
    return max(STUCK_MIN_SECONDS, STUCK_FACTOR * slowest)


# ----------------------------------------------------------------------------- /proc parsing

def _decode(hex_address: str) -> tuple[str, int] | None:
    """``/proc/net/tcp{,6}`` "ADDR:PORT" (ADDR in the kernel's 32-bit words, host byte order)
    as ``(ip text, port)``; an IPv4-mapped IPv6 address is given as its IPv4 text."""
    try:
        addr, port = hex_address.rsplit(":", 1)
        raw = bytes.fromhex(addr)
        words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if len(raw) in (4, 16) else None
        if words is None:
            return None
        ip = ipaddress.ip_address(words)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def connected_inodes(table_lines: Iterable[str], ips: set[str], port: int) -> set[str]:
    """Socket inodes of ``/proc/net/tcp``-format lines whose remote end is one of ``ips`` at
    ``port`` (connections only, listeners and closed sockets left out)."""
    found = set()
    for line in table_lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] not in _ESTABLISHED_OR_CLOSING:
            continue
        remote = _decode(fields[2])
        if remote is not None and remote[1] == port and remote[0] in ips:
            found.add(fields[9])
    return found


def resolve(host: str) -> set[str]:
    """The IP addresses ``host`` (a name or an address) stands for here; empty if it resolves
    to none."""
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    found = set()
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        found.add(str(ip))
    return found


def own_connections(address: str, proc: str = "/proc") -> list[int]:
    """This process's file descriptors of TCP connections to ``address`` ("host:port")."""
    host, _, port_text = address.rpartition(":")
    ips = resolve(host.strip("[]"))
    if not ips or not port_text.isdigit():
        return []
    return own_sockets(lambda lines: connected_inodes(lines, ips, int(port_text)), proc)


def cut_connections(address: str) -> int:
    """Shut every TCP connection of this process to ``address``; the number shut. The
    descriptors stay open (gRPC owns them and closes them once it has seen the end)."""
    return shut(own_connections(address), f"the connection to {address}")


# ----------------------------------------------------------------------------- the watch

_RUNNING: dict[int, float] = {}          # worker index -> when its current closure began
_RUNNING_LOCK = threading.Lock()
_INSTALLED = False


def install(clock: Callable[[], float] = time.monotonic) -> bool:
    """Time every closure a coordinator worker thread runs (once per process). False when this
    TensorFlow has no ``Worker._process_closure`` to wrap: the chief then only waits, as before."""
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        from tensorflow.python.distribute.coordinator import cluster_coordinator
    except ImportError:
        return False
    worker_class: Any = getattr(cluster_coordinator, "Worker", None)
    original = getattr(worker_class, "_process_closure", None)
    if worker_class is None or original is None:
        log.warning("this TensorFlow's coordinator has no Worker._process_closure: a closure whose "
                    "worker vanished is not cut loose (the orchestrator's stall watch still acts)")
        return False

    def timed(self: Any, closure: Any) -> Any:
        with _RUNNING_LOCK:
            _RUNNING[self.worker_index] = clock()
        try:
            return original(self, closure)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(self.worker_index, None)

    worker_class._process_closure = timed   # noqa: SLF001 - no public hook (module docstring)
    _INSTALLED = True
    return True


def running() -> dict[int, float]:
    """``{worker index: when its current closure began}`` for every busy worker thread."""
    with _RUNNING_LOCK:
        return dict(_RUNNING)


class Lookout:
    """Calls ``look()`` every ``every`` seconds on a daemon thread until :meth:`stop` (module
    docstring). An exception is logged and the thread goes on: a look that fails once must not
    leave the chief without its watch."""

    def __init__(self, look: Callable[[], None], every: float) -> None:
        self._look = look
        self._every = every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pscluster-lookout", daemon=True)

    def start(self) -> "Lookout":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            try:
                self._look()
            except Exception:   # noqa: BLE001 - logged, the watch goes on
                log.exception("the chief's lookout failed once; it goes on")

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


class ClosureWatch:
    """What the chief does while it waits for a closure: report the worker it waits on, and cut
    a hung one loose (module docstring).

    ``workers``: the cluster's worker addresses by index; ``emit(event, **fields)`` writes the
    chief's event; ``cut(address) -> int`` shuts the connections (:func:`cut_connections`);
    ``busy() -> {index: began}`` (:func:`running`)."""

    def __init__(self, workers: Sequence[str], emit: Callable[..., Any], *,
                 cut: Callable[[str], int] = cut_connections,
                 busy: Callable[[], Mapping[int, float]] = running) -> None:
        self.workers = list(workers)
        self._emit = emit
        self._cut = cut
        self._busy = busy
        self._reported: tuple[int, float] | None = None     # (worker, began) last reported
        self._reported_at = 0.0
        self._cut_began: dict[int, float] = {}               # worker -> the start of the closure cut
        self.cuts = 0

    def check(self, now: float, waited: float, slowest: float, step: int) -> None:
        """Called while the chief waits for a closure: ``waited`` is how long no closure has
        finished, ``slowest`` the slowest closure collected so far. Reports the worker whose
        closure runs longest once nothing finished for :func:`waiting_after`; cuts every worker
        whose closure has run past :func:`stuck_after`, whether or not the others finish theirs."""
        busy = self._busy()
        if not busy:
            return
        if waited > waiting_after(slowest):
            index, began = min(busy.items(), key=lambda item: item[1])
            if (index, began) != self._reported or now - self._reported_at >= WAITING_EVERY:
                self._reported, self._reported_at = (index, began), now
                self._emit("waiting", worker=f"worker:{index}", seconds=round(min(now - began, waited), 1), step=step)
        for index, began in sorted(busy.items()):
            age = now - began
            if age <= stuck_after(slowest) or self._cut_began.get(index) == began or index >= len(self.workers):
                continue
            self._cut_began[index] = began
            address = self.workers[index]
            shut = self._cut(address)
            self.cuts += 1
            log.warning("worker:%d's closure has run %.0f s (the slowest so far took %.1f s): its worker is taken "
                        "for lost; %d connection(s) to %s shut so that the closure fails and runs on "
                        "another worker", index, age, slowest, shut, address)
