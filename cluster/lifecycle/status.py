"""The status view: each task's row (host, pid, state, uptime, devices, its standby's readiness)
from the state, the hosts' monitors and a gRPC probe."""
from __future__ import annotations

import functools
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..hosts import hostops
from ..contracts import ProcessKind
from ..fanout import fan_out
from ..layout import ready_file
from ..liveness import orchestrator_alive, supervisor_health
from ..hosts.probe import Prober
from ..plan import TaskSpec
from ..state import ProcessRecord, RunState
from ..transport import Transport, TransportPool
from ..transport.limits import ensure_open_files
from .tasks import records_by_host

# A host whose watch stream the supervisor heard this recently (and wrote so in the job record,
# with a heartbeat as recent) is shown from the record; any other host is asked (issue 46).
RECORD_FRESH = 5.0


@dataclass(frozen=True)
class StandbyView:
    """A training task's standby (roles/standby.py) as ``status`` sees it."""

    pid: int | None
    ready: bool | None          # TensorFlow imported (None: not asked, e.g. right after `up`)

    def describe(self) -> str:
        if self.ready is None:
            return "importing TensorFlow or waiting"
        return "TensorFlow imported, waiting" if self.ready else "importing TensorFlow"

    def to_json(self) -> dict:
        return {"pid": self.pid, "ready": self.ready}


@dataclass(frozen=True)
class TaskRow:
    """One line of ``status``."""

    role: str
    index: int
    host: str
    address: str
    port: int
    kind: ProcessKind
    pid: int | None
    state: str                # starting | ready | running | exited | lost | not started | stopped
    devices: tuple[str, ...] = ()
    uptime: float | None = None
    exit_code: int | None = None
    restarts: int = 0
    detail: str = ""
    standby: StandbyView | None = None     # a training task's live standby

    @property
    def task(self) -> str:
        return f"{self.role}:{self.index}"


@dataclass(frozen=True)
class Source:
    """Where ``status`` got its rows: hosts answered from the supervisor's record (with the
    oldest age of what it heard) and hosts asked (probed) now."""

    from_record: tuple[str, ...] = ()
    probed: tuple[str, ...] = ()
    record_age: float | None = None     # seconds: the oldest heartbeat among the hosts from the record

    def describe(self) -> str:
        if not self.from_record:
            return f"every host asked now ({len(self.probed)})"
        asked = f"; {len(self.probed)} asked now" if self.probed else ""
        return (f"{len(self.from_record)} host(s) from the supervisor's record "
                f"(heard {self.record_age or 0:.1f} s ago or less){asked}")

    def to_json(self) -> dict:
        return {"from_record": list(self.from_record), "probed": list(self.probed), "record_age": self.record_age}


def fresh_hosts(state: RunState, *, now: float, supervisor_alive: bool,
                fresh: float = RECORD_FRESH) -> dict[str, float]:
    """The hosts ``status`` may answer from the job record (host -> age of what was heard, s):
    a live job whose supervisor runs and wrote its heartbeat within ``fresh`` seconds, the host's
    stream heard within ``fresh`` seconds, and every live process of the state on it recorded
    as running then. Anything else (an exit, a frozen process, a standby the supervisor does
    not watch, a lost host) is asked on its host as before."""
    job = state.job
    if (job is None or not job.live or not supervisor_alive or job.heartbeat is None
            or now - job.heartbeat > fresh or not job.hosts_heard):
        return {}
    known = job.proc_states or {}
    live = [r for r in [*(state.latest(t.name) for t in state.plan.tasks),
                        *(state.standby(t.name) for t in state.plan.training_tasks)]
            if r is not None and not r.stopped]
    found = {}
    for host, records in records_by_host(live).items():
        heard = job.hosts_heard.get(host)
        if heard is None or now - heard > fresh:
            continue
        if all(known.get(record.key) == "running" for record in records):
            found[host] = max(0.0, now - heard)
    return found


def cluster_status(state: RunState, *, pool: TransportPool, prober: Prober | None = None,
                   fresh: dict[str, float] | None = None) -> list[TaskRow]:
    """Each task's process state on its host, plus the devices its server reports.

    ``fresh``: hosts answered from the job record (:func:`fresh_hosts`): their running
    processes are shown as the supervisor last heard them (a standing server it watches as
    ready, without its devices), without a round trip; the other hosts are asked."""
    fresh = fresh or {}
    now = time.time()
    plan = state.plan
    latest = {task.name: state.latest(task.name) for task in plan.tasks}
    standbys = {task.name: state.standby(task.name) for task in plan.training_tasks}
    live = [record for record in [*latest.values(), *standbys.values()] if record is not None and not record.stopped]
    statuses: dict[str, hostops.TaskStatus] = {}
    unreachable: dict[str, str] = {}

    grouped = records_by_host(live)
    for host in list(grouped):
        if host in fresh:
            statuses.update((r.key, hostops.TaskStatus(r.key, "running", uptime=max(0.0, now - (r.started or now))))
                            for r in grouped.pop(host))
    ensure_open_files(len(grouped))      # the hosts asked, each a connection (issue 46)
    # A standby says it has imported TensorFlow in <log>.ready: read in the same round trip.
    ready_files = {ready_file(r.log) for r in standbys.values() if r is not None and not r.stopped}

    def ask(host: str) -> tuple[dict[str, hostops.TaskStatus], list[hostops.FileChunk]]:
        reads = [(ready_file(r.log), 0) for r in grouped[host] if ready_file(r.log) in ready_files]
        return hostops.status_and_read(pool.get(plan.host(host)), grouped[host], reads)

    asked = fan_out(grouped, ask, name="status")
    ready: set[str] = set()
    for found, chunks in asked.ok.values():
        statuses.update(found)
        ready.update(chunk.path for chunk in chunks if chunk.exists)
    unreachable.update((host, exc.message) for host, exc in asked.failed.items())
    rows: list[TaskRow | None] = []
    # The standing servers to ask, probed together below (each up to 2 s, 5 s more for one long up:
    # one after another, a few silent servers made status wait that long for each).
    asks: dict[str, tuple[int, Callable[[], TaskRow]]] = {}
    for task in plan.tasks:
        record = latest[task.name]
        restarts = state.restarts.get(task.name, 0)
        standby = standbys.get(task.name)
        waiting = None
        if standby is not None and getattr(statuses.get(standby.key), "state", None) == "running":
            waiting = StandbyView(standby.pid, ready_file(standby.log) in ready)
        row = functools.partial(TaskRow, role=task.role, index=task.index, host=task.host, address=task.address,
                                port=task.port, kind=ProcessKind.SERVER if task.standing else ProcessKind.TRAIN, restarts=restarts,
                                standby=waiting)
        if record is None:
            rows.append(row(pid=None, state="not started", detail="" if task.standing else _not_started(waiting)))
            continue
        if record.stopped:
            rows.append(row(pid=record.pid, state="stopped"))
            continue
        if task.host in unreachable:
            rows.append(row(pid=record.pid, state="lost", detail=unreachable[task.host]))
            continue
        status = statuses.get(record.key)
        if status is None or status.state == "gone":
            rows.append(row(pid=record.pid, state="lost",
                                detail="process gone without an exit record"))
        elif status.state == "exited":
            rows.append(row(pid=record.pid, state="exited", exit_code=status.exit_code,
                                detail=status.describe()))
        elif task.standing and task.host in fresh:
            rows.append(row(pid=record.pid, state="ready", uptime=status.uptime))
        elif task.standing and prober is not None:
            asks[task.name] = (len(rows), functools.partial(_probed, row, task, record, status, prober,
                                                            pool.get(plan.host(task.host))))
            rows.append(None)
        else:
            rows.append(row(pid=record.pid, state="running", uptime=status.uptime))
    for outcome in fan_out(asks.items(), lambda item: item[1][1](), key=lambda item: item[0], name="probe"):
        rows[asks[outcome.key][0]] = outcome.result()
    return [row for row in rows if row is not None]


STARTED_FOR = 60.0      # a server up this long that does not answer is no longer starting


def _probed(row: Callable[..., TaskRow], task: TaskSpec, record: ProcessRecord, status: hostops.TaskStatus,
            prober: Prober, via: Transport) -> TaskRow:
    """A standing server's row from its gRPC probe (2 s). One up for over :data:`STARTED_FOR`
    that misses it is asked once more for 5 s (a loaded machine: a missed 2 s made a server up
    for minutes read ``starting``) and, silent again, is ``not answering``."""
    probe = prober.probe(task.target, timeout=2.0, via=via)
    long_up = status.uptime is not None and status.uptime > STARTED_FOR
    if not probe.ok and long_up:
        probe = prober.probe(task.target, timeout=5.0, via=via)
    if probe.ok:
        return row(pid=record.pid, state="ready", devices=tuple(d.name for d in probe.devices), uptime=status.uptime)
    if long_up:
        return row(pid=record.pid, state="not answering", uptime=status.uptime,
                   detail=f"its gRPC server did not answer within 5 s ({probe.error or 'no answer'})")
    return row(pid=record.pid, state="starting", uptime=status.uptime, detail=probe.error or "")


def _not_started(standby: StandbyView | None) -> str:
    """The detail of a training task's row before ``train``: who will start it."""
    if standby is None:
        return "started by 'pscluster train'"
    return f"started by 'pscluster train' (standby pid {standby.pid}: {standby.describe()})"


def rows_after_up(state: RunState, devices: dict[str, tuple[str, ...]]) -> list[TaskRow]:
    """Status rows from what ``up`` just established (no second round trip to every host)."""
    rows = []
    for task in state.plan.tasks:
        record = state.latest(task.name)
        row = functools.partial(TaskRow, role=task.role, index=task.index, host=task.host, address=task.address,
                                port=task.port, kind=ProcessKind.SERVER if task.standing else ProcessKind.TRAIN)
        standby = state.standby(task.name)
        if record is None:
            rows.append(row(pid=None, state="not started",
                            detail=_not_started(StandbyView(standby.pid, None) if standby else None)))
        else:
            rows.append(row(pid=record.pid, state="ready", devices=devices.get(task.name, ()),
                                uptime=max(0.0, time.time() - (record.started or time.time()))))
    return rows


@dataclass(frozen=True)
class StatusView:
    """What ``status`` shows: the cluster, each task's row, and the health of the supervisor of
    its last job (None: no job, or no supervisor to judge)."""

    state: RunState
    rows: list[TaskRow]
    supervisor: Any = None          # liveness.SupervisorHealth
    source: Source | None = None    # where the rows came from (None: what `up` just established)

    def to_json(self) -> dict[str, Any]:
        state = self.state
        return {
            "name": state.name, "mode": state.mode, "phase": state.phase, "message": state.message,
            "job": ({**state.job.to_json(), "steps_since_checkpoint": state.job.steps_since_checkpoint,
                     "stalled_for": state.job.stalled_for}
                    if state.job is not None else None),
            "supervisor": self.supervisor.to_json() if self.supervisor is not None else None,
            "source": self.source.to_json() if self.source is not None else None,
            "drained": dict(state.drained),
            "tasks": [{"role": r.role, "index": r.index, "host": r.host, "address": r.address, "port": r.port,
                       "kind": r.kind, "pid": r.pid, "state": r.state, "devices": list(r.devices),
                       "uptime": r.uptime, "exit_code": r.exit_code, "restarts": r.restarts, "detail": r.detail,
                       "standby": r.standby.to_json() if r.standby else None}
                      for r in self.rows]}


def supervisor_alive(state: RunState) -> bool:
    """Whether the recorded supervisor of the cluster's job runs (judged from here)."""
    return state.job is not None and orchestrator_alive(state.job.orchestrator)


def status_view(state: RunState, rows: list[TaskRow], source: Source | None = None) -> StatusView:
    """``rows`` (:func:`cluster_status`'s, or :func:`rows_after_up`'s) with the health of the
    job's supervisor (the daemon of a --detach job, or the `train` that runs it), judged from here."""
    job = state.job
    health = supervisor_health(job, alive=supervisor_alive(state), here=socket.gethostname(), now=time.time())
    return StatusView(state, rows, health, source)
