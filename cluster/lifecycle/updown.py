"""A cluster's life: ``bring_up`` (preflight, code, firewall, servers, standbys; rolled back on any
failure or interruption) and ``bring_down`` (every process it started, on every host, the
firewall tables, a detached supervisor)."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..hosts.codesync import sync_and_record
from ..liveness import live_daemon, remove_event_files, signal_supervisor, wait_gone
from ..errors import Aborted, Failure, MultiHostError, PsclusterError, StateError, Terminated, UsageError
from ..events import Reporter
from ..hosts.firewall import install_rules, remove_rules
from ..contracts import CLEANUP_GRACE, DEFAULT_GRACE, Phase, ProcessKind, TensorFlowNeed
from ..plan import ClusterPlan
from ..hosts.preflight import CheckReport, run_preflight
from ..hosts.probe import Prober
from ..secrets import Secrets
from ..state import ProcessRecord, RunState, StateStore, StateWriter
from ..transport import TransportPool
from ..transport.limits import ensure_open_files
from .tasks import (DEFAULT_READY_TIMEOUT, forget_pid_files, new_record, records_by_host,
                             report_standbys, start_standbys, start_tasks, stop_records, task_env, wait_ready)


DAEMON_EXIT_SECONDS = 5.0   # down: a detached supervisor's own clean-up, once everything is stopped


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
             limit: str | None = None, mode_from: str | None = None) -> UpResult:
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
        if existing is not None and not existing.phase.ended:
            raise UsageError(f"cluster {plan.name!r} is already {existing.phase} "
                             f"(state {store.path(plan.name)})",
                             hint=f"'pscluster down --name {plan.name}' first, or use another --name "
                                  "and pscluster_port_base")
        if existing is not None and existing.live_records():
            raise UsageError(f"cluster {plan.name!r} failed earlier and may still have processes",
                             hint=f"run 'pscluster down --name {plan.name}' first")
        state = RunState(name=plan.name, plan=plan, port_base=port_base, limit=limit, mode_from=mode_from)
        store.save(state)
    writer = StateWriter(store, state, expect_phase=Phase.STARTING)
    devices: dict[str, tuple[str, ...]] = {}
    try:
        report = run_preflight(plan, pool, reporter, allow_busy_gpus=allow_busy_gpus, tensorflow=tensorflow)
        if not report.ok:
            store.delete(plan.name)   # nothing started: leave nothing behind
            report.raise_for_failures()
        sync_and_record(writer, plan, pool, reporter, root)
        if plan.firewall:
            install_rules(plan, pool, writer, reporter)
        standing = plan.standing_tasks
        reporter.emit("phase", name="start", detail=f"{len(standing)} server(s)")
        records, failures = start_tasks(writer, pool, plan, [
            (task, new_record(task, kind=ProcessKind.SERVER, attempt=1), task.argv, task_env(plan, task, secrets, standing=True))
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
        writer.change(lambda s: setattr(s, "phase", Phase.UP))
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
    if stale is None or not stale.phase.ended or not stale.firewall or stale.live_records():
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
    stop_records(plan, live, pool, reporter, grace=CLEANUP_GRACE)
    if state.firewall:
        remove_rules(state, pool, reporter)


def _roll_back(plan: ClusterPlan, store: StateStore, state: RunState, pool: TransportPool, reporter: Reporter,
               cause: BaseException) -> None:
    message = str(cause) if isinstance(cause, Terminated) else \
        "interrupted" if isinstance(cause, KeyboardInterrupt) else str(cause)
    live = state.live_records()
    if live:
        reporter.emit("phase", name="rollback", detail=f"stopping {len(live)} task(s) started so far")
    stopped, errors = stop_records(plan, live, pool, reporter, grace=CLEANUP_GRACE)
    if state.firewall:
        errors.update(remove_rules(state, pool, reporter))
    with store.lock(plan.name):
        if not state.processes and not state.firewall and not errors:
            store.delete(plan.name)   # failed before any start (code sync): nothing to show or stop
            return
        for record in stopped:
            state.replace_record(record)
        state.phase = Phase.FAILED
        state.message = message
        if errors:
            state.message += "\nrollback could not reach: " + ", ".join(sorted(errors))
        store.save(state)


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
            # a connection per host to stop on (issue 46), refused before the phase changes
            held = set(records_by_host(state.live_records()))
            ensure_open_files(len(held))
            pool.spread([host for host in state.plan.hosts if host.name in held])    # many: helper processes
            state.phase = Phase.STOPPING
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
