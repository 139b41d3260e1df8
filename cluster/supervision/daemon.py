"""Detached jobs: ``train --detach`` / ``run --detach``, ``attach``, ``stop-job``, and the
supervisor's health that ``status`` shows.

Where the supervisor of a detached job runs: **on the control machine, as a daemon.** The
``--detach`` command re-executes pscluster as ``supervise --name N`` in a new session
(``setsid``: no controlling terminal, so closing the terminal or killing its process group
cannot reach it), stdin the request (``{"command", "request": request.to_json()}``, then nothing), stdout and stderr appended to
``<state dir>/<name>.supervisor.log``. The daemon runs the very same command (the same
:class:`~cluster.supervision.executor.JobExecutor` loop: restarts, budget, recovery, the job
record) with its reporter writing plain lines to that log and every event, as one JSON object
a line, to ``<state dir>/<name>.supervisor-<pid>.events``, which ``attach`` replays into the
same live view ``train`` draws. It was chosen over the chief's host because the supervisor
already talks to every host from here (one watch stream per host, SSH keys, jump hosts, the
state file and its lock are all on this machine); a supervisor on the chief's host would need
SSH from that host to every other one, a second copy of the state and a way back to it for
``status`` and ``down``, and would die with the chief's host, which is what it must survive.
The price: the control machine must stay up for the job to be supervised (the job's processes
themselves do not depend on it: if the daemon dies, they keep running unsupervised, ``status``
says so, and ``stop-job`` / ``down`` still stop them from the records).

The daemon is recorded in the job record (``orchestrator``: pid, host, kernel start time,
``detached``, log and events paths) and writes a ``heartbeat`` there about once a second.
Whether it is alive, signalling it and what ``status`` says of it are cluster/liveness.py's
(beside the job record, where ``down``, ``scale`` and ``status`` find them).

Pure parts (tested in tests/unit/test_detach.py): :func:`job_conflict` (may a new job start?),
:func:`exit_status` (``attach``'s exit code), :func:`parse_events`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, cast

from ..contracts import JobState
from ..errors import PsclusterError
from ..events import Reporter
from ..history import RunRecord
from ..layout import DaemonLayout
from ..liveness import orchestrator_alive, process_starttime
from ..jobrecord import JobProgress, Orchestrator, job_exit_status
from ..state import StateStore, open_private, private_dir

POLL_SECONDS = 0.25


# ----------------------------------------------------------------------------- liveness

def run_gone(store: StateStore, *, here: str | None = None) -> Callable[[RunRecord], bool]:
    """Whether the processes of a run are gone, for pruning a run with no recorded end
    (:meth:`cluster.history.RunHistory.beyond`): its cluster is down (no state), or no supervisor
    of it runs on this machine and its cluster's state records none of its processes as running
    (a later job stops an orphaned job's processes before it starts). An unreadable state counts
    as not gone."""
    def gone(record: RunRecord) -> bool:
        try:
            state = store.load(record.name)
        except PsclusterError:
            return False
        if state is None:
            return True
        job = state.job
        if job is not None and job.id == record.id and orchestrator_alive(job.orchestrator, here=here):
            return False
        return not any(process.in_job(record.id) for process in state.live_records())
    return gone


# ----------------------------------------------------------------------------- pure decisions

@dataclass(frozen=True)
class JobConflict:
    """Why a new job may not start on a cluster (a live job is there)."""

    cluster: str
    job: JobProgress
    why: str                 # "supervised" (its supervisor runs) | "orphaned" (supervisor gone, processes run)
    processes: int = 0

    @property
    def message(self) -> str:
        info = self.job.orchestrator
        who = f"pid {info.pid} on {info.host}{', detached' if info.detached else ''}" if info else "unknown"
        if self.why == "supervised":
            return (f"job {self.job.id} ({self.job.job}) is still running on cluster {self.cluster!r} "
                    f"(supervisor {who})")
        return (f"job {self.job.id} ({self.job.job}) still has {self.processes} process(es) running on cluster "
                f"{self.cluster!r}, but its supervisor ({who}) is gone: nothing restarts them")

    @property
    def hint(self) -> str:
        name = f" --name {self.cluster}"
        if self.why == "supervised":
            return (f"follow it with 'pscluster attach{name}', end it with 'pscluster stop-job{name}', "
                    "or give --replace to stop it and start this one")
        return f"'pscluster stop-job{name}' stops them, or give --replace to stop them and start this one"


def job_conflict(cluster: str, job: JobProgress | None, *, supervisor_alive: bool,
                 running: int) -> JobConflict | None:
    """Whether a new ``train``/``run`` must be refused: the last job is live and its supervisor
    runs, or its supervisor is gone but ``running`` of its processes still run. An earlier
    job whose supervisor died and whose processes are gone is no obstacle (its records are
    cleaned up)."""
    if job is None:
        return None
    if supervisor_alive and job.live:
        return JobConflict(cluster, job, "supervised")
    if running:
        return JobConflict(cluster, job, "orphaned", running)
    return None


def exit_status(job: JobProgress) -> int:
    """The exit code of an ended job, as ``train``/``run`` would have exited (:func:`job_exit_status`)."""
    return job_exit_status(job.state, job.result)


# ----------------------------------------------------------------------------- the daemon's files

@dataclass(frozen=True)
class DaemonFiles:
    """Where a detached supervisor writes: its text log and its events (JSON lines)."""

    log: str
    events: str

    @classmethod
    def of(cls, root: Path, name: str, pid: int) -> "DaemonFiles":
        layout = DaemonLayout(root, name)
        return cls(str(layout.log), str(layout.events(pid)))

    def orchestrator(self, pid: int, host: str) -> Orchestrator:
        return Orchestrator(pid, host, starttime=process_starttime(pid), detached=True, log=self.log,
                            events=self.events)


class EventLog(Reporter):
    """Writes every event as one JSON line (``{"kind", "data"}``) for ``attach`` to replay.

    The file is created at the first event, which comes once the daemon's job owns the cluster
    (a refused daemon writes none); older daemons' event files of the cluster are removed then.
    """

    def __init__(self, path: str):
        self.path = path
        self._file: Any = None

    def handle(self, kind: str, **data: Any) -> None:
        if self._file is None:
            folder, _, own = self.path.rpartition("/")
            prefix = own.split(".supervisor-", 1)[0] + ".supervisor-"
            for old in Path(folder or ".").glob(f"{prefix}*.events"):
                if old.name != own:
                    old.unlink(missing_ok=True)
            self._file = os.fdopen(open_private(self.path), "a", encoding="utf-8")     # 0600 (N11)
        self._file.write(json.dumps({"kind": kind, "data": data}, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def parse_events(data: bytes) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """Complete lines of an events file: the events and the bytes consumed (a last line still
    being written is left for the next read)."""
    end = data.rfind(b"\n") + 1
    events: list[tuple[str, dict[str, Any]]] = []
    for line in data[:end].splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("kind"), str) and isinstance(item.get("data"), dict):
            events.append((item["kind"], item["data"]))
    return events, end


def read_from(path: str, offset: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read()
    except FileNotFoundError:
        return b""


# ----------------------------------------------------------------------------- starting a daemon

@dataclass
class Spawned:
    proc: subprocess.Popen[bytes]
    log: Path
    log_offset: int          # where this daemon's lines start in the (shared, appended) log

    @property
    def pid(self) -> int:
        return self.proc.pid


def spawn_supervisor(root: Path, name: str, request: dict[str, Any]) -> Spawned:
    """Start ``pscluster supervise --name NAME`` in its own session, the request on its stdin.

    The daemon imports the same code as this process (its package folder first on sys.path),
    and inherits this environment, which holds the inventory's secrets (never the command line).
    """
    private_dir(root)
    log = DaemonLayout(root, name).log
    package_parent = str(Path(__file__).resolve().parents[2])
    bootstrap = "import sys; sys.path.insert(0, sys.argv.pop(1)); from cluster.cli import main; main()"
    argv = [sys.executable, "-c", bootstrap, package_parent, "--state-dir", str(root), "--no-color",
            "supervise", "--name", name]
    with os.fdopen(open_private(log), "ab") as out:     # 0600: it holds tails of the tasks' 0600 logs (N11)
        offset = out.tell()
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pscluster {request['command']} --detach on "
                  f"{name!r}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    stdin = cast(IO[bytes], proc.stdin)      # asked for above
    try:
        stdin.write(json.dumps(request).encode())
        stdin.close()
    except BrokenPipeError:
        pass        # it died at once: its log says why
    return Spawned(proc, log, offset)


@dataclass(frozen=True)
class Started:
    """What ``--detach`` waited for: the daemon's job record once running (or ended), or the
    daemon's exit code when it ended without starting a job (refused, bad input)."""

    job: JobProgress | None
    exit_code: int | None


def wait_started(store: StateStore, name: str, spawned: Spawned, *, on_log: Callable[[str], None],
                 sleep: Callable[[float], None] = time.sleep) -> Started:
    """Until the daemon's job has started every process (job state ``running``), has ended, or
    the daemon exited; the daemon's log lines go to ``on_log`` meanwhile."""
    offset = spawned.log_offset

    def pump() -> None:
        nonlocal offset
        data = read_from(str(spawned.log), offset)
        end = data.rfind(b"\n") + 1
        for line in data[:end].decode("utf-8", "replace").splitlines():
            if not line.startswith("--- "):
                on_log(line)
        offset += end

    while True:
        pump()
        code = spawned.proc.poll()
        state = store.load(name)
        job = state.job if state is not None else None
        ours = job is not None and job.orchestrator is not None and job.orchestrator.pid == spawned.pid
        if ours and job is not None and (job.state in (JobState.RUNNING, JobState.RESTARTING) or not job.live):
            pump()
            return Started(job, None)
        if code is not None:
            sleep(0.1)      # its last lines
            pump()
            return Started(job if ours else None, code)
        sleep(POLL_SECONDS)


# ----------------------------------------------------------------------------- attach, stop

class SupervisorGone(PsclusterError):
    """The job is recorded as running but nobody supervises it any more."""


def follow(store: StateStore, name: str, job_id: int, handle: Callable[[str, dict[str, Any]], None], *,
           sleep: Callable[[float], None] = time.sleep,
           alive: Callable[[Orchestrator | None], bool] = orchestrator_alive) -> JobProgress:
    """Replay job ``job_id``'s events into ``handle`` and follow them until it ends; its final
    record. A job without an events file (a ``train`` in another terminal) is followed
    through its job record.

    Raises:
        PsclusterError: the cluster went down, or another job replaced this one.
        SupervisorGone: the job is live but its supervisor is dead.
    """
    offset = 0
    shown: dict[str, Any] | None = None
    while True:
        state = store.load(name)
        if state is None:
            raise PsclusterError(f"cluster {name!r} was taken down while attached",
                                 hint="the job ended with it ('pscluster down' stops every process)")
        job = state.job
        if job is None or job.id != job_id:
            raise PsclusterError(f"job {job_id} is no longer the last job of {name!r}",
                                 hint="'pscluster status' shows the cluster's job")
        info = job.orchestrator
        if info is not None and info.events:
            events, used = parse_events(read_from(info.events, offset))
            offset += used
            for kind, data in events:
                handle(kind, data)
        else:
            snapshot = {key: value for key, value in job.to_json().items()
                        if key not in ("orchestrator", "heartbeat", "result", "restarts")}
            if snapshot != shown:
                shown = snapshot
                handle("job", snapshot)
        if not job.live:
            return job
        if not alive(info):
            sleep(1.0)                          # it may have just written its end
            again = store.load(name)
            if again is not None and again.job is not None and again.job.id == job_id and again.job.live:
                who = f"pid {info.pid} on {info.host}" if info else "none recorded"
                raise SupervisorGone(f"the supervisor of job {job_id} ({who}) is gone while the job is recorded "
                                     "as running: its processes may run on, unsupervised",
                                     hint=f"'pscluster stop-job --name {name}' stops them; "
                                          f"'pscluster down --name {name}' stops everything")
            continue
        sleep(POLL_SECONDS)


