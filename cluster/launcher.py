"""Bringing a cluster up and down, and reading its status.

``up``: preflight -> code sync -> start each standing server (recorded in the state before it is
started, its pid recorded as soon as it is known) -> wait until every server answers the gRPC
probe -> state ``up``. Any failure or Ctrl-C on the way stops everything started, marks the
state ``failed`` with the root cause, and re-raises.

``down``: per host, one call stops every recorded process group (TERM, grace, KILL, verify).
Unreachable hosts are reported and keep their records, so a later ``down`` finishes the job.
"""
from __future__ import annotations

import functools
import os
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Sequence

from . import hostops
from .codesync import sync_code
from .detach import live_daemon, remove_event_files, signal_supervisor, wait_gone
from .errors import Aborted, Failure, HostError, MultiHostError, PsclusterError, StateError, TaskError, Terminated, UsageError
from .events import Reporter
from .fanout import fan_out
from .firewall import install_rules, remove_rules
from .contracts import DEFAULT_GRACE, ProcessKind, TensorFlowNeed
from .layout import HostLayout, attempt_log, exit_file, fifo_file, pid_file, ready_file
from .plan import ClusterPlan, TaskSpec
from .preflight import CheckReport, run_preflight
from .probe import Prober
from .secrets import Secrets
from .state import ProcessRecord, RunState, StateStore, StateWriter
from .transport import TransportPool

DEFAULT_READY_TIMEOUT = 120.0
DAEMON_EXIT_SECONDS = 5.0   # down: a detached supervisor's own clean-up, once everything is stopped


def test_pause(point: str) -> None:
    """Test hook: with ``PSCLUSTER_TEST_PAUSE=POINT:FILE``, wait at ``point`` until FILE exists.

    Announces the wait by creating ``FILE.waiting``, so a race test can force another command
    (``down``, a signal) into exactly this moment. Points: ``before-start`` (records saved, the
    host not yet asked to start), ``after-start`` (started on the host, pids not yet saved).
    """
    wanted, _, path = os.environ.get("PSCLUSTER_TEST_PAUSE", "").partition(":")
    if wanted != point or not path:
        return
    with open(path + ".waiting", "w"):
        pass
    deadline = time.monotonic() + 600
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def records_by_host(records: Sequence[ProcessRecord]) -> dict[str, list[ProcessRecord]]:
    grouped: dict[str, list[ProcessRecord]] = {}
    for record in records:
        grouped.setdefault(record.host, []).append(record)
    return grouped


def new_record(task: TaskSpec, *, kind: str, attempt: int, log: str | None = None,
               events: str | None = None) -> ProcessRecord:
    """The record of attempt ``attempt`` of ``task``; a standing server's log is numbered from the
    plan's ``log_path`` (layout.attempt_log) unless ``log`` is given."""
    log = log or attempt_log(task.log_path, attempt)
    return ProcessRecord(key=f"{task.name}#{attempt}", task=task.name, host=task.host, kind=kind,
                         attempt=attempt, log=log, exit_file=exit_file(log), events=events)


def start_task(writer: StateWriter, pool: TransportPool, plan: ClusterPlan, task: TaskSpec,
               record: ProcessRecord, *, argv: Sequence[str], env: dict[str, str],
               reporter: Reporter, standby: ProcessRecord | None = None) -> ProcessRecord:
    """Record, then start one task; the pid reaches the state as soon as it is known.

    With ``standby`` (a live standby of ``task``: roles/standby.py), the start is handed to it
    first; the standby's record is retired in the same state change that records the process
    (which is the standby's), and a standby that declines is retired with a warning and the task
    starts afresh.
    """
    writer.change(lambda state: state.processes.append(record))
    reporter.emit("task-starting", task=task.name, host=task.host)
    test_pause("before-start")
    transport = pool.get(plan.host(task.host))
    started: ProcessRecord | None = None
    retired: list[ProcessRecord] = []
    if standby is not None:
        outcome = hostops.adopt(transport, standby, task, record, argv=argv, env=env)
        retired.append(replace(standby, stopped=True))
        if isinstance(outcome, ProcessRecord):
            started = outcome
        else:
            writer.change(lambda state: state.replace_records(retired))
            reporter.emit("message", level="warning",
                          text=f"{task.name}: its standby was not used ({outcome}); starting it afresh")
    if started is None:
        started = hostops.start(transport, task, record, argv=argv, env=env)
    test_pause("after-start")
    done = started
    writer.change(lambda state: state.replace_records([done, *retired]))
    reporter.emit("task-started", task=task.name, host=task.host, pid=started.pid)
    return started


def start_tasks(writer: StateWriter, pool: TransportPool, plan: ClusterPlan,
                items: Sequence[tuple[TaskSpec, ProcessRecord, Sequence[str], dict[str, str]]],
                reporter: Reporter) -> tuple[dict[str, ProcessRecord], list[Failure]]:
    """Start tasks, one call per host, hosts in parallel; every record is saved before its start."""
    by_host: dict[str, list] = {}
    for item in items:
        by_host.setdefault(item[0].host, []).append(item)

    def one(host: str) -> list[tuple[TaskSpec, ProcessRecord | PsclusterError]]:
        host_items = by_host[host]
        writer.change(lambda state: state.processes.extend(record for _, record, _, _ in host_items))
        for task, _, _, _ in host_items:
            reporter.emit("task-starting", task=task.name, host=host)
        test_pause("before-start")
        try:
            results = hostops.start_many(pool.get(plan.host(host)), host_items)
        except PsclusterError as exc:
            return [(task, exc) for task, _, _, _ in host_items]
        test_pause("after-start")
        started = [r for r in results if isinstance(r, ProcessRecord)]
        writer.change(lambda state: state.replace_records(started))
        for (task, _, _, _), result in zip(host_items, results):
            if isinstance(result, ProcessRecord):
                reporter.emit("task-started", task=task.name, host=host, pid=result.pid)
        return list(zip((item[0] for item in host_items), results))

    records: dict[str, ProcessRecord] = {}
    failures: list[Failure] = []
    # catch=(): a failed start is in `one`'s answer; what escapes it (Aborted: `down` took over) is raised
    for outcome in fan_out(list(by_host), one, name="start", catch=()).ok.values():
        for task, result in outcome:
            if isinstance(result, ProcessRecord):
                records[task.name] = result
            else:
                failures.append(Failure(task.name, result))
    return records, failures


def standby_starts(plan: ClusterPlan, state: RunState, secrets: Secrets | None, tasks: Collection[str] | None = None
                   ) -> list[tuple[TaskSpec, ProcessRecord, list[str], dict[str, str]]]:
    """A standby (roles/standby.py) for each training task (of ``tasks``, default all) that has
    none, on hosts that allow one (``pscluster_standby``); it gets the task's environment
    without secrets, which come with the job that takes it over."""
    items = []
    for task in plan.training_tasks:
        if tasks is not None and task.name not in tasks:
            continue
        if not plan.host(task.host).standby or state.standby(task.name) is not None:
            continue
        attempt = 1 + sum(1 for r in state.processes if r.task == task.name and r.kind == ProcessKind.STANDBY)
        log = HostLayout(task.workdir, plan.name).standby_log(task.role, task.index, attempt)
        record = ProcessRecord(key=f"{task.name}#s{attempt}", task=task.name, host=task.host,
                               kind=ProcessKind.STANDBY, attempt=attempt, log=log, exit_file=exit_file(log))
        argv = [task.argv[0], "-m", "roles.standby", "--fifo", fifo_file(log), "--ready", ready_file(log)]
        items.append((task, record, argv, task_env(plan, task, secrets, standing=True)))
    return items


def start_standbys(writer: StateWriter, pool: TransportPool, plan: ClusterPlan, secrets: Secrets | None,
                   tasks: Collection[str] | None = None) -> tuple[dict[str, ProcessRecord], list[Failure]]:
    """Start the missing standbys (of ``tasks``, default all), quietly; a failure is the caller's
    to report as a warning (the next ``train`` then starts that process afresh), never a failure
    of the command."""
    items = standby_starts(plan, writer.state, secrets, tasks)
    return start_tasks(writer, pool, plan, items, Reporter()) if items else ({}, [])


def report_standbys(reporter: Reporter, records: dict[str, ProcessRecord], failures: Sequence[Failure]) -> None:
    for name, record in records.items():
        reporter.emit("message", text=f"standby for {name}@{record.host} (pid {record.pid}): TensorFlow is "
                                      "imported ahead of the next 'train' (pscluster_standby: false turns it off)")
    for failure in failures:
        reporter.emit("message", level="warning",
                      text=f"no standby for {failure.where}: {failure.error.message.splitlines()[0]}")


def task_env(plan: ClusterPlan, task: TaskSpec, secrets: Secrets | None, *, standing: bool) -> dict[str, str]:
    """The environment of ``task``: its planned variables and TF_CONFIG, plus the secrets it may
    have (see cluster/secrets.py: ``standing`` servers get none unless pscluster_secret_env_roles asks)."""
    env = plan.task_env(task)
    env.update(secrets.env_for(task, standing=standing) if secrets else {})
    return env


def wait_ready(plan: ClusterPlan, records: dict[str, ProcessRecord], pool: TransportPool, prober: Prober,
               reporter: Reporter, *, timeout: float, idle: Callable[[], None] | None = None) -> dict[str, tuple[str, ...]]:
    """Wait until every task in ``records`` answers the gRPC probe; ``idle`` runs between two
    rounds of probes (a running job's supervisor reads its streams there).

    Returns:
        the devices each task reported, by task name.

    Raises:
        TaskError: a task exited, or was not ready by the deadline (with its log tail).
    """
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    pending = dict(records)
    devices: dict[str, tuple[str, ...]] = {}
    # One watch stream per host reports exits as they happen, at almost no cost on the hosts
    # (polling would start an interpreter per host per second while TensorFlow starts there).
    streams = {host: hostops.watch(pool.get(plan.host(host)), host_records, [], interval=0.25)
               for host, host_records in records_by_host(list(records.values())).items()}
    try:
        while pending:
            for name in list(pending):
                task = plan.task(name)
                result = prober.probe(task.target, timeout=1.0, via=pool.get(plan.host(task.host)))
                if result.ok:
                    devices[name] = tuple(device.name for device in result.devices)
                    reporter.emit("task-ready", task=name, host=task.host, devices=devices[name],
                                  seconds=time.monotonic() - started)
                    del pending[name]
            if not pending:
                break
            for host, stream in streams.items():
                for line in stream.lines():
                    update = hostops.parse_watch_line(line)
                    for key, status in (update.states.items() if update else ()):
                        record = next((r for r in pending.values() if r.key == key), None)
                        if record is not None and status.state not in ("running", "frozen"):
                            transport = pool.get(plan.host(host))
                            raise TaskError(record.task, host, f"exited before it was ready ({status.describe()})",
                                            exit_code=status.exit_code,
                                            log_tail=hostops.log_tail(transport, record.log), log_path=record.log,
                                            hint="the log above says why; 'pscluster logs " + record.task +
                                                 "' shows all")
            if time.monotonic() > deadline:
                name, record = next(iter(pending.items()))
                transport = pool.get(plan.host(record.host))
                others = f" (also not ready: {', '.join(list(pending)[1:])})" if len(pending) > 1 else ""
                raise TaskError(name, record.host, f"not ready after {timeout:.0f} s{others}",
                                log_tail=hostops.log_tail(transport, record.log), log_path=record.log,
                                hint="a slow host may need a longer --timeout; otherwise the log says why")
            if idle is not None:
                idle()
            time.sleep(0.1)
    finally:
        for stream in streams.values():
            stream.close()
    return devices


def stop_records(plan: ClusterPlan, records: Sequence[ProcessRecord], pool: TransportPool, reporter: Reporter,
                 *, grace: float, first_signal: str = "TERM") -> tuple[list[ProcessRecord], dict[str, PsclusterError]]:
    """Stop recorded processes, all hosts in parallel.

    Returns:
        the records now known stopped, and the error of each host that could not be reached
        or still had survivors.
    """
    grouped = records_by_host(records)
    stopped: list[ProcessRecord] = []
    errors: dict[str, PsclusterError] = {}

    def one(host: str) -> dict[str, hostops.StopResult]:
        return hostops.stop(pool.get(plan.host(host)), grouped[host], grace=grace, first_signal=first_signal)

    for outcome in fan_out(grouped, one, name="stop"):
        host = outcome.key
        if outcome.error is not None:
            errors[host] = outcome.error
            reporter.emit("host-failed", host=host, error=str(outcome.error))
            continue
        results = outcome.result()
        survivors = {key: r.survivors for key, r in results.items() if r.survivors}
        for record in grouped[host]:
            result = results[record.key]
            if record.key in survivors:
                continue
            stopped.append(replace(record, stopped=True))
            reporter.emit("task-stopped", task=record.task, host=host, signals=result.signals,
                          found=result.found)
        if survivors:
            errors[host] = HostError(host, f"processes survived SIGKILL: {survivors}")
    return stopped, errors


@dataclass
class UpResult:
    state: RunState
    report: CheckReport
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    seconds: float = 0.0


def bring_up(plan: ClusterPlan, *, store: StateStore, reporter: Reporter, timeout: float = DEFAULT_READY_TIMEOUT,
             root: Path | None = None, pool: TransportPool | None = None,
             secrets: Secrets | None = None, allow_busy_gpus: bool = False, standby: bool = False,
             tensorflow: TensorFlowNeed = TensorFlowNeed.REQUIRED, port_base: int | None = None,
             limit: str | None = None) -> UpResult:
    """Preflight, sync, install the firewall if asked, start the standing servers (and, with
    ``standby``, a standby for each training task: roles/standby.py) and wait until the servers
    answer. ``tensorflow``: whether preflight fails on a host without a usable TensorFlow
    (``up``) or only warns (a one-shot ``run``, which starts no server).

    Raises:
        UsageError: a cluster of that name is already up.
        MultiHostError: preflight failed (nothing was started).
        PsclusterError: a start failed; everything started was stopped again.
    """
    began = time.monotonic()
    own_pool = pool is None
    pool = pool or TransportPool()
    _remove_stale_tables(plan.name, store, pool, reporter)
    with store.lock(plan.name):
        existing = store.load(plan.name)
        if existing is not None and existing.phase not in ("failed", "down"):
            raise UsageError(f"cluster {plan.name!r} is already {existing.phase} "
                             f"(state {store.path(plan.name)})",
                             hint=f"'pscluster down --name {plan.name}' first, or use another --name "
                                  "and pscluster_port_base")
        if existing is not None and existing.live_records():
            raise UsageError(f"cluster {plan.name!r} failed earlier and may still have processes",
                             hint=f"run 'pscluster down --name {plan.name}' first")
        state = RunState(name=plan.name, plan=plan, port_base=port_base, limit=limit)
        store.save(state)
    writer = StateWriter(store, state, expect_phase="starting")
    devices: dict[str, tuple[str, ...]] = {}
    try:
        report = run_preflight(plan, pool, reporter, allow_busy_gpus=allow_busy_gpus, tensorflow=tensorflow)
        if not report.ok:
            store.delete(plan.name)   # nothing started: leave nothing behind
            report.raise_for_failures()
        sync_results = sync_code(plan, pool, reporter, root)
        writer.change(lambda s: s.synced.update({r.host: "synced" if not r.skipped else "shared"
                                                 for r in sync_results}))
        if plan.firewall:
            install_rules(plan, pool, writer, reporter)
        standing = plan.standing_tasks
        reporter.emit("phase", name="start", detail=f"{len(standing)} server(s)")
        records, failures = start_tasks(writer, pool, plan, [
            (task, new_record(task, kind="server", attempt=1), task.argv, task_env(plan, task, secrets, standing=True))
            for task in standing], reporter)
        if failures:
            raise failures[0].error if len(failures) == 1 else \
                MultiHostError(f"{len(failures)} task(s) could not be started", failures)
        if records:
            reporter.emit("phase", name="ready", detail=f"waiting for {len(records)} server(s) to answer")
            with Prober() as prober:
                devices = wait_ready(plan, records, pool, prober, reporter, timeout=timeout)
        if standby:
            # Once the servers answer, not beside their own imports: on a host with few cores the
            # standby's import would slow `up`; it is ready a few seconds after `up` returns.
            report_standbys(reporter, *start_standbys(writer, pool, plan, secrets))
        writer.change(lambda s: setattr(s, "phase", "up"))
        return UpResult(state, report, devices, time.monotonic() - began)
    except (PsclusterError, KeyboardInterrupt) as exc:
        if isinstance(exc, Aborted):
            _stop_after_abort(plan, state, pool, reporter)
        elif store.path(plan.name).exists():
            _roll_back(plan, store, state, pool, reporter, exc)
        raise
    finally:
        if own_pool:
            pool.close()


def _remove_stale_tables(name: str, store: StateStore, pool: TransportPool, reporter: Reporter) -> None:
    """Before a new ``up`` replaces a failed state: remove the firewall tables it records (on
    that state's hosts), so they are not forgotten when the state is overwritten.

    Raises:
        MultiHostError: a table could not be removed (the old state keeps it, for ``down``).
    """
    with store.lock(name):
        stale = store.load(name)
    if stale is None or stale.phase not in ("failed", "down") or not stale.firewall or stale.live_records():
        return      # (live records: the check below sends the user to `down`, which removes both)
    reporter.emit("phase", name="firewall", detail=f"removing {len(stale.firewall)} table(s) of the earlier, "
                                                   "failed cluster")
    errors = remove_rules(stale, pool, reporter)
    with store.lock(name):
        if store.load(name) is not None:
            store.save(stale)
    if errors:
        raise MultiHostError(f"the firewall tables of the earlier, failed cluster {name!r} could not be removed",
                             [Failure(host, err) for host, err in errors.items()],
                             hint=f"'pscluster down --name {name}' when the host is reachable again")


def _stop_after_abort(plan: ClusterPlan, state: RunState, pool: TransportPool, reporter: Reporter) -> None:
    """``down`` took the cluster over mid-``up``: stop (again) everything this ``up`` recorded or
    started and remove its firewall tables, without writing the state, which is ``down``'s now.

    ``down`` stops what it read from the state; this covers what it could not see: a start
    that was under way, or a table being applied, while it read. Records without a pid are
    found on the host by their pid file, or cancelled there before they start.
    """
    live = state.live_records()
    if live:
        reporter.emit("phase", name="rollback", detail=f"taken down meanwhile: stopping {len(live)} task(s) "
                                                       "this up started")
    stop_records(plan, live, pool, reporter, grace=3.0)
    if state.firewall:
        remove_rules(state, pool, reporter)


def _roll_back(plan: ClusterPlan, store: StateStore, state: RunState, pool: TransportPool, reporter: Reporter,
               cause: BaseException) -> None:
    message = str(cause) if isinstance(cause, Terminated) else \
        "interrupted" if isinstance(cause, KeyboardInterrupt) else str(cause)
    live = state.live_records()
    if live:
        reporter.emit("phase", name="rollback", detail=f"stopping {len(live)} task(s) started so far")
    stopped, errors = stop_records(plan, live, pool, reporter, grace=3.0)
    if state.firewall:
        errors.update(remove_rules(state, pool, reporter))
    with store.lock(plan.name):
        if not state.processes and not state.firewall and not errors:
            store.delete(plan.name)   # failed before any start (code sync): nothing to show or stop
            return
        for record in stopped:
            state.replace_record(record)
        state.phase = "failed"
        state.message = message
        if errors:
            state.message += "\nrollback could not reach: " + ", ".join(sorted(errors))
        store.save(state)


def forget_pid_files(plan: ClusterPlan, records: Sequence[ProcessRecord], pool: TransportPool) -> None:
    """Remove the pid files of stopped processes, as ``down`` leaves a host: nothing of the
    cluster running, no file naming its processes. Best effort: a pid file left behind (a
    host that failed just now) is harmless, every reader checks the process's start time and
    the next start of that task replaces it. ``.cancel`` markers stay: they must outlive a
    start that is still on its way. Records of hosts ``plan`` no longer has (a resize took them
    out, and forgot their files then) are skipped."""
    known = {host.name for host in plan.hosts}
    grouped = records_by_host([record for record in records if record.host in known])

    def one(host: str) -> None:
        hostops.remove(pool.get(plan.host(host)), sorted({pid_file(record.log) for record in grouped[host]}))

    fan_out(grouped, one, name="forget pid files")     # a host's PsclusterError stays in the result, unread


@dataclass
class DownResult:
    name: str
    stopped: list[ProcessRecord]
    errors: dict[str, PsclusterError]
    seconds: float


def bring_down(name: str, *, store: StateStore, reporter: Reporter, grace: float = DEFAULT_GRACE,
               pool: TransportPool | None = None) -> DownResult:
    """Stop every recorded process of a cluster and remove its state.

    Raises:
        MultiHostError: some hosts could not be reached (or had survivors); the rest was
            stopped and the state keeps only what is still unaccounted for.
    """
    began = time.monotonic()
    own_pool = pool is None
    pool = pool or TransportPool()
    try:
        with store.lock(name):
            state = store.load(name)
            if state is None:
                raise StateError(f"no state for cluster {name!r}")
            state.phase = "stopping"
            store.save(state)
        # A detached supervisor (train/run --detach) ends too: from now on it can record nothing
        # (the phase changed), and SIGTERM makes it stop acting; it is killed if still there after.
        daemon = live_daemon(state.job)
        if daemon is not None:
            reporter.emit("message", text=f"stopping the detached supervisor of job {state.job.id if state.job else '?'} "
                                          f"(pid {daemon.pid})")
            signal_supervisor(daemon, signal.SIGTERM)
        live = state.live_records()
        if live:         # a one-shot run has stopped its own: "stop 0 process(es)" said nothing
            reporter.emit("phase", name="stop", detail=f"{len(live)} process(es) on "
                                                       f"{len(records_by_host(live))} host(s)")
        stopped, errors = stop_records(state.plan, live, pool, reporter, grace=grace)
        if state.firewall:
            errors.update(remove_rules(state, pool, reporter))
        if daemon is not None and not wait_gone(daemon, timeout=DAEMON_EXIT_SECONDS):
            signal_supervisor(daemon, signal.SIGKILL)
        if not errors:
            forget_pid_files(state.plan, [record for record in state.processes if record.stopped or
                                           record.key in {done.key for done in stopped}], pool)
        with store.lock(name):
            for record in stopped:
                state.replace_record(record)
            if not errors and not state.live_records() and not state.firewall:
                store.delete(name)
                remove_event_files(store.root, name)
            else:
                state.message = "down incomplete: " + "; ".join(f"{host}: {err.message.splitlines()[0]}"
                                                                for host, err in sorted(errors.items()))
                store.save(state)
        if errors:
            raise MultiHostError(
                f"down could not finish on {len(errors)} host(s): {', '.join(sorted(errors))}; "
                f"everything else is stopped",
                [Failure(host, err) for host, err in errors.items()],
                hint=f"when the host is reachable again, run 'pscluster down --name {name}' to finish")
        return DownResult(name, stopped, errors, time.monotonic() - began)
    finally:
        if own_pool:
            pool.close()


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
    kind: str
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


def cluster_status(state: RunState, *, pool: TransportPool, prober: Prober | None = None) -> list[TaskRow]:
    """Each task's process state on its host, plus the devices its server reports."""
    plan = state.plan
    latest = {task.name: state.latest(task.name) for task in plan.tasks}
    standbys = {task.name: state.standby(task.name) for task in plan.training_tasks}
    live = [record for record in [*latest.values(), *standbys.values()] if record is not None and not record.stopped]
    statuses: dict[str, hostops.TaskStatus] = {}
    unreachable: dict[str, str] = {}

    grouped = records_by_host(live)
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
    rows = []
    for task in plan.tasks:
        record = latest[task.name]
        restarts = state.restarts.get(task.name, 0)
        standby = standbys.get(task.name)
        waiting = None
        if standby is not None and getattr(statuses.get(standby.key), "state", None) == "running":
            waiting = StandbyView(standby.pid, ready_file(standby.log) in ready)
        row = functools.partial(TaskRow, role=task.role, index=task.index, host=task.host, address=task.address,
                                port=task.port, kind="server" if task.standing else "train", restarts=restarts,
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
        elif task.standing and prober is not None:
            probe = prober.probe(task.target, timeout=2.0, via=pool.get(plan.host(task.host)))
            rows.append(row(pid=record.pid, state="ready" if probe.ok else "starting",
                                devices=tuple(d.name for d in probe.devices), uptime=status.uptime,
                                detail="" if probe.ok else (probe.error or "")))
        else:
            rows.append(row(pid=record.pid, state="running", uptime=status.uptime))
    return rows


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
                                port=task.port, kind="server" if task.standing else "train")
        standby = state.standby(task.name)
        if record is None:
            rows.append(row(pid=None, state="not started",
                            detail=_not_started(StandbyView(standby.pid, None) if standby else None)))
        else:
            rows.append(row(pid=record.pid, state="ready", devices=devices.get(task.name, ()),
                                uptime=max(0.0, time.time() - (record.started or time.time()))))
    return rows
