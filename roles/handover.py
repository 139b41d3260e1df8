"""Sync mode: the next incarnation of a job starts while the current one still trains.

A sync resize restarts every worker with the new world size (MultiWorkerMirroredStrategy fixes
its collective group at start). Started after the old workers stop, the new ones' start (the
strategy, the model, the input pipeline, the trace: ~2.3 s of CPU per worker here) is all pause.
So the orchestrator (cluster/supervision/train_resize.py) overlaps it with the old workers' last
steps, on the same ports, which the new plan names:

1. **release**: each old worker closes its gRPC server's listening socket (``shutdown`` of the
   listener only: the connections its peers already hold stay up, and a sync worker makes no new
   one after its first collectives). TensorFlow 2.21's server cannot stop, but gRPC takes a
   listener that fails ``accept`` as closed ("Closing acceptor. Failed accept4: Invalid argument",
   one line in the log) and the port can be bound again: gRPC listens with ``SO_REUSEADDR``, and a
   shut listener is no longer in ``LISTEN`` state. Checked here with two generations of two
   workers on the same two ports, all-reducing at once.
2. **gate**: the new workers start on those ports with the new TF_CONFIG, build, trace, and then
   wait (:func:`wait_at_gate`) before they restore: the checkpoint they need is written when the
   old workers stop.
3. **go**: once the old workers have checkpointed and ended, the orchestrator lets the new ones
   through; the pause is the old workers' stop, the restore and the first step.

Both requests come through the trainer's control file (roles/membership.py: ``hostctl tell``),
and the answers are events (``membership`` with ``released``) or, at the gate, the file
``--gate`` names (cluster/layout.py ``gate_file``), which the orchestrator reads like a standby's
ready file.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable, Iterable

log = logging.getLogger("pscluster.handover")

_LISTEN = "0A"          # TCP_LISTEN in /proc/net/tcp's "st" column
POLL_SECONDS = 0.02


def listening_inodes(table_lines: Iterable[str], port: int) -> set[str]:
    """Socket inodes of ``/proc/net/tcp``-format lines (header included) that listen on ``port``."""
    found = set()
    for line in table_lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN or ":" not in fields[1]:
            continue
        try:
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
        except ValueError:
            continue
        if local_port == port:
            found.add(fields[9])
    return found


def own_listeners(port: int, proc: str = "/proc") -> list[int]:
    """This process's file descriptors that listen on TCP ``port`` (IPv4 or IPv6)."""
    return own_sockets(lambda lines: listening_inodes(lines, port), proc)


def own_sockets(select: Callable[[Iterable[str]], set[str]], proc: str = "/proc") -> list[int]:
    """This process's file descriptors of the TCP sockets that ``select`` picks (it gets the
    lines of ``/proc/self/net/tcp`` and of ``tcp6`` in turn and returns their inodes)."""
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(os.path.join(proc, "self", table)) as handle:
                inodes |= select(handle)
        except OSError:
            continue
    if not inodes:
        return []
    fds = []
    folder = os.path.join(proc, "self", "fd")
    for name in os.listdir(folder):
        try:
            target = os.readlink(os.path.join(folder, name))
        except OSError:
            continue        # closed meanwhile
        if target.startswith("socket:[") and target[8:-1] in inodes:
            fds.append(int(name))
    return sorted(fds)


def shut(fds: Iterable[int], what: str) -> int:
    """``shutdown`` each socket (through a duplicate: the descriptors stay open, their owner, gRPC,
    closes them); the number shut."""
    done = 0
    for fd in fds:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue        # closed meanwhile
        try:
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError as exc:
            log.warning("could not shut %s (fd %d): %s", what, fd, exc)
        finally:
            sock.close()        # the duplicate only
    return done


def release_port(port: int) -> int:
    """Stop accepting connections on ``port`` in this process (see the module docstring); the
    number of listening sockets shut. The descriptors stay open (gRPC owns them)."""
    return shut(own_listeners(port), f"the listener on port {port}")


def wait_at_gate(path: str, poll: Callable[[], dict | None], stopping: Callable[[], bool],
                 sleep: Callable[[float], None] = time.sleep) -> bool:
    """Announce that this worker waits (writes ``path``, the orchestrator's ``--gate``), then wait
    until the orchestrator's ``go`` request comes (True) or this worker is asked to stop (False)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(temporary, path)
    log.info("waiting for the previous workers to checkpoint")
    while not stopping():
        request = poll()
        if request is not None and request.get("go"):
            return True
        sleep(POLL_SECONDS)
    return False
