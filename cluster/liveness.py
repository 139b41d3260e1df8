"""A job's supervisor as the other commands see it: is it alive, signal it, wait for it to end,
what ``status`` says of it, and its event files once its cluster is down.

The supervisor (``train``/``run`` in a terminal, or the ``--detach`` daemon of
cluster/supervision/daemon.py) is recorded in the job record (:class:`~cluster.jobrecord.Orchestrator`:
pid, host, kernel start time, ``detached``, log and events paths) and writes a ``heartbeat``
there about once a second. Liveness = that PID exists on this host with the recorded start time
(a reused PID is not it).

It sits beside the job record, above the cluster's life (``down`` ends a detached supervisor,
``scale`` signals one, ``status`` judges one), so that cluster/lifecycle/ finds a supervisor
without importing supervision/. Pure: :func:`supervisor_health` (tests/unit/test_detach.py).
"""
from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .layout import DaemonLayout
from .jobrecord import JobProgress, Orchestrator


def process_starttime(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22);
    None where there is no /proc or no such process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields and fields[0] in ("Z", "X"):
        return None          # a zombie has finished: not alive
    return fields[19] if len(fields) > 19 else None


def orchestrator_alive(info: Orchestrator | None, *, here: str | None = None) -> bool:
    """Whether the pscluster process supervising a job still runs. Only a process on this host
    can be checked (a job supervised from another machine counts as not alive here)."""
    if info is None or not info.pid or info.host != (here or socket.gethostname()):
        return False
    try:
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if info.starttime is None:
        return True
    return process_starttime(info.pid) == info.starttime


def signal_supervisor(info: Orchestrator, signum: int) -> bool:
    """Send ``signum`` to the supervisor if it is still the recorded process (PID and start
    time: a reused PID is never hit). True if it was signalled."""
    if not orchestrator_alive(info):
        return False
    try:
        os.kill(info.pid, signum)
    except ProcessLookupError:
        return False
    return True


def wait_gone(info: Orchestrator, *, timeout: float, sleep: Callable[[float], None] = time.sleep,
              alive: Callable[[Orchestrator | None], bool] = orchestrator_alive) -> bool:
    """Wait up to ``timeout`` s for the supervisor to end. True if it did."""
    deadline = time.monotonic() + timeout
    while alive(info):
        if time.monotonic() > deadline:
            return False
        sleep(0.2)
    return True


def stop_supervisor(info: Orchestrator, *, timeout: float, sleep: Callable[[float], None] = time.sleep) -> bool:
    """SIGTERM the supervisor (its Ctrl-C path: the leader checkpoints, the job's processes stop,
    the job is recorded ``stopped``) and wait up to ``timeout`` s for it to end. True if it did."""
    signal_supervisor(info, signal.SIGTERM)
    return wait_gone(info, timeout=timeout, sleep=sleep)


def live_daemon(job: JobProgress | None) -> Orchestrator | None:
    """The detached supervisor of a live job, if it runs (what ``down`` must end too)."""
    info = job.orchestrator if job is not None and job.live else None
    return info if info is not None and info.detached and orchestrator_alive(info) else None


@dataclass(frozen=True)
class SupervisorHealth:
    """The supervisor of a cluster's last job, as ``status`` reports it."""

    job_id: int
    pid: int
    host: str
    detached: bool
    state: str                       # alive | dead | elsewhere (another host: cannot tell) | ended
    heartbeat_age: float | None      # seconds since its last heartbeat
    log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job_id, "pid": self.pid, "host": self.host, "detached": self.detached,
                "state": self.state, "heartbeat_age": self.heartbeat_age, "log": self.log}


def supervisor_health(job: JobProgress | None, *, alive: bool, here: str, now: float) -> SupervisorHealth | None:
    """What to say about the supervisor of ``job`` (None: no job, or no supervisor recorded)."""
    info = job.orchestrator if job is not None else None
    if job is None or info is None:
        return None
    if not job.live:
        state = "ended"
    elif info.host != here:
        state = "elsewhere"
    else:
        state = "alive" if alive else "dead"
    age = round(max(0.0, now - job.heartbeat), 1) if job.heartbeat is not None else None
    return SupervisorHealth(job.id, info.pid, info.host, info.detached, state, age, info.log)


def remove_event_files(root: Path, name: str) -> None:
    """Once the cluster is down (its state gone), nobody can attach: its events files go. The
    text log stays, for the post-mortem."""
    for path in root.glob(DaemonLayout(root, name).events_glob):
        path.unlink(missing_ok=True)
