"""Task primitives shared by up, train, run and resize: a task's record and environment, starting
it (handed to a standby when one waits), starting standbys, waiting until servers answer,
stopping recorded processes on every host in parallel."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Callable, Collection, Iterable, Sequence

from ..hosts import hostops
from ..errors import Failure, HostEndedError, HostError, PsclusterError, TaskError
from ..events import Reporter
from ..fanout import fan_out
from ..contracts import ProcessKind
from ..layout import attempt_log, host_layout, fifo_file, pid_file, ready_file
from ..plan import ClusterPlan, TaskSpec
from ..hosts.probe import Prober
from ..secrets import Secrets
from ..state import ProcessRecord, RunState, StateWriter
from ..transport import TransportPool
from ..transport.base import Stream


DEFAULT_READY_TIMEOUT = 120.0


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


def new_record(task: TaskSpec, *, kind: ProcessKind, attempt: int) -> ProcessRecord:
    """The record of attempt ``attempt`` of ``task``, its log numbered from the plan's
    ``log_path`` (layout.attempt_log): a standing server's."""
    return ProcessRecord.for_task(task.name, task.host, kind, attempt, attempt_log(task.log_path, attempt))


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
        attempt = state.next_attempt(task.name, ProcessKind.STANDBY)
        log = host_layout(task, plan).standby_log(task.role, task.index, attempt)
        record = ProcessRecord.for_task(task.name, task.host, ProcessKind.STANDBY, attempt, log)
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


def check_ports_free(tasks: Iterable[TaskSpec], pool: TransportPool, plan: ClusterPlan) -> None:
    """Before a job starts its processes: their ports must be free on their hosts."""
    by_host: dict[str, list[TaskSpec]] = {}
    for task in tasks:
        by_host.setdefault(task.host, []).append(task)
    for host, host_tasks in by_host.items():
        facts = hostops.facts(pool.get(plan.host(host)), ports=[t.port for t in host_tasks], gpus=False, workdir=None)
        busy = dict(facts.busy_ports)
        clashes = [f"{t.port} ({t.name})" for t in host_tasks if t.port in busy]
        if clashes:
            raise HostError(host, f"port(s) of the job's tasks in use: {', '.join(clashes)}",
                            hint="another job or program holds them; stop it or change the ports")


PROBE_EVERY_ROUND = 16     # pending servers up to which each is probed every round, as it ever was
PROBE_UNHEARD = 2.0        # above that, seconds between probes of a server whose port its host has not seen listen
PROBE_BACKOFF = (0.1, 1.0)  # a listening server that does not answer yet: again after 0.1 s, doubling to 1 s
# Seconds between two rounds: 0.1, and from ROUND_HOSTS hosts a thousandth of a second per host,
# up to ROUND_MAX. A round reads every host's watch stream, so at 0.1 s the rounds alone grew with
# hosts × seconds waited (issue 46); 1,000 hosts then say they are ready within half a second.
ROUND_PAUSE, ROUND_HOSTS, ROUND_MAX = 0.1, 100, 0.5


def round_pause(hosts: int) -> float:
    """Seconds between two rounds of :func:`wait_ready` over ``hosts`` hosts' watch streams."""
    return min(ROUND_MAX, max(ROUND_PAUSE, hosts / ROUND_HOSTS * ROUND_PAUSE))


class _ProbeSchedule:
    """When each pending server of :func:`wait_ready` is probed next."""

    def __init__(self, names: Collection[str]):
        self.due = {name: 0.0 for name in names}
        self.listening: set[str] = set()
        self.backoff: dict[str, float] = {}

    def now(self, name: str, pending: int) -> bool:
        return pending <= PROBE_EVERY_ROUND or time.monotonic() >= self.due[name]

    def failed(self, name: str) -> None:
        if name in self.listening:
            step = self.backoff.get(name, PROBE_BACKOFF[0])
            self.backoff[name] = min(step * 2, PROBE_BACKOFF[1])
        else:
            step = PROBE_UNHEARD
        self.due[name] = time.monotonic() + step

    def heard(self, name: str) -> None:
        """Its port listens on its host: probed in the next round."""
        if name not in self.listening:
            self.listening.add(name)
            self.due[name] = 0.0


def wait_ready(plan: ClusterPlan, records: dict[str, ProcessRecord], pool: TransportPool, prober: Prober,
               reporter: Reporter, *, timeout: float, idle: Callable[[], None] | None = None) -> dict[str, tuple[str, ...]]:
    """Wait until every task in ``records`` answers the gRPC probe; ``idle`` runs between two
    rounds of probes (a running job's supervisor reads its streams there).

    Each host's watch stream says when a task's port listens there. With more than
    :data:`PROBE_EVERY_ROUND` servers pending, a server is probed once its port listens (then
    with a backoff until it answers), and every :data:`PROBE_UNHEARD` seconds before: probing
    every pending server in turn each round cost the control process CPU for every second the
    servers took to start (issue 46: 256 hosts starting on a loaded machine).

    Returns:
        the devices each task reported, by task name.

    Raises:
        TaskError: a task exited, or was not ready by the deadline (with its log tail).
    """
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    pending = dict(records)
    devices: dict[str, tuple[str, ...]] = {}
    schedule = _ProbeSchedule(pending)
    # One watch stream per host reports exits as they happen, at almost no cost on the hosts
    # (polling would start an interpreter per host per second while TensorFlow starts there).
    streams = {host: hostops.watch(pool.get(plan.host(host)), host_records, [], interval=0.25,
                                   ports={record.key: plan.task(record.task).port for record in host_records})
               for host, host_records in records_by_host(list(records.values())).items()}
    pause = round_pause(len(streams))
    try:
        while pending:
            for name in list(pending):
                if not schedule.now(name, len(pending)):
                    continue
                task = plan.task(name)
                result = prober.probe(task.target, timeout=1.0, via=pool.get(plan.host(task.host)))
                if not result.ok:
                    schedule.failed(name)
                    continue
                devices[name] = tuple(device.name for device in result.devices)
                reporter.emit("task-ready", task=name, host=task.host, devices=devices[name],
                              seconds=time.monotonic() - started)
                del pending[name]
            if not pending:
                break
            _read_watches(plan, pool, streams, pending, schedule)
            if time.monotonic() > deadline:
                name, record = next(iter(pending.items()))
                transport = pool.get(plan.host(record.host))
                others = f" (also not ready: {', '.join(list(pending)[1:])})" if len(pending) > 1 else ""
                raise TaskError(name, record.host, f"not ready after {timeout:.0f} s{others}",
                                log_tail=hostops.log_tail(transport, record.log), log_path=record.log,
                                hint="a slow host may need a longer --timeout; otherwise the log says why")
            if idle is not None:
                idle()
            time.sleep(pause)
    finally:
        for stream in streams.values():
            stream.close()
    return devices


def _read_watches(plan: ClusterPlan, pool: TransportPool, streams: dict[str, Stream],
                  pending: dict[str, ProcessRecord], schedule: _ProbeSchedule) -> None:
    """What the hosts' watch streams said of the pending servers: a port that listens, or a
    server that exited (:class:`TaskError`, with its log's tail)."""
    by_key = {record.key: record for record in pending.values()}
    for host, stream in streams.items():
        for line in stream.lines():
            update = hostops.parse_watch_line(line)
            for key, status in (update.states.items() if update else ()):
                record = by_key.get(key)
                if record is None:
                    continue
                if status.state not in ("running", "frozen"):
                    transport = pool.get(plan.host(host))
                    raise TaskError(record.task, host, f"exited before it was ready ({status.describe()})",
                                    exit_code=status.exit_code,
                                    log_tail=hostops.log_tail(transport, record.log), log_path=record.log,
                                    hint="the log above says why; 'pscluster logs " + record.task +
                                         "' shows all")
                if status.listening:
                    schedule.heard(record.task)


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

    known = {spec.name for spec in plan.hosts}

    def one(host: str) -> dict[str, hostops.StopResult]:
        if host not in known:       # a record older than the plan's knowledge of its host
            raise HostError(host, "the cluster's plan no longer says how to reach this host",
                            hint=f"stop its processes there by hand: pids "
                                 f"{', '.join(str(r.pid) for r in grouped[host] if r.pid)}")
        return hostops.stop(pool.get(plan.host(host)), grouped[host], grace=grace, first_signal=first_signal)

    for outcome in fan_out(grouped, one, name="stop"):
        host = outcome.key
        if isinstance(outcome.error, HostEndedError):
            # Its Slurm job ended: Slurm killed the steps, our processes in them, already.
            reporter.emit("message", text=outcome.error.message.splitlines()[0])
            for record in grouped[host]:
                stopped.append(replace(record, stopped=True))
                reporter.emit("task-stopped", task=record.task, host=host, signals=[], found=False)
            continue
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
