"""Stopping a job is a protocol, not a signal.

Every stop path -- ``down``, ``stop-job``, Ctrl-C / SIGTERM / SIGHUP to ``train``, Slurm's USR1
warning before the time limit -- goes through one step: ask the job's training processes that
checkpoint on stop (:func:`first_to_stop`: the async chief, sync-ps worker 0, or every sync
worker, which then agree on one step) to save, give them the job's ``--stop-grace``, then stop
the rest. Only ``down --now`` skips it.

Who carries it out depends on who supervises the job:

* its supervisor runs on this machine (an attached ``train`` in another terminal, or a detached
  one): it is sent SIGTERM, which is its own Ctrl-C path (:meth:`cluster.supervision.executor.JobExecutor.
  interrupt`, the leader first: ``TrainJob.before_interrupt``), and waited for;
* otherwise (the supervisor died, or runs on another machine): the recorded processes are
  stopped from here, the checkpointing ones first, and the leader's last ``checkpoint`` event is
  read from its events file into the job record.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Iterable

from ..contracts import JobState, Mode, Phase, ProcessKind
from ..liveness import orchestrator_alive, stop_supervisor
from ..errors import Failure, MultiHostError, PsclusterError, StateError
from ..events import Reporter
from ..contracts import DEFAULT_GRACE, DEFAULT_STOP_GRACE
from ..lifecycle.tasks import stop_records
from ..plan import ClusterPlan
from ..jobrecord import JobProgress
from ..state import ProcessRecord, RunState, StateStore, StateWriter
from .train_spec import EventTail
from ..transport import TransportPool

# The supervisor stops the job within the leader's --stop-grace and then its own grace (10 s);
# this much more covers its host round trips.
SUPERVISOR_MARGIN = 30.0


def supervisor_margin() -> float:
    """:data:`SUPERVISOR_MARGIN`, or ``PSCLUSTER_TEST_SUPERVISOR_MARGIN`` (a test hook, as
    ``PSCLUSTER_TEST_PAUSE``: a race test holds a supervisor at a pause point on purpose, and
    what it proves is the stop from the records after the wait, not the wait's length)."""
    try:
        return max(0.0, float(os.environ.get("PSCLUSTER_TEST_SUPERVISOR_MARGIN", SUPERVISOR_MARGIN)))
    except ValueError:
        return SUPERVISOR_MARGIN


def first_to_stop(plan: ClusterPlan, records: Iterable[ProcessRecord]) -> list[ProcessRecord]:
    """The job's live training processes that checkpoint on stop: the leader (async chief,
    sync-ps worker 0), or in sync mode every worker (they agree on the step, and a collective
    needs them all until then)."""
    trainers = [r for r in records if r.kind == ProcessKind.TRAIN and not r.stopped]
    if plan.mode == Mode.SYNC:
        return [r for r in trainers if r.task.startswith("worker:")]
    if not trainers:
        return []
    leader = plan.leader.name
    return [r for r in trainers if r.task == leader]


def stop_running_job(name: str, *, store: StateStore, reporter: Reporter, pool: TransportPool,
                     grace: float = DEFAULT_GRACE) -> JobProgress | None:
    """Stop the cluster's live job, checkpoint first; returns the job as recorded after (None if
    no job was live). The standing servers stay up."""
    state = store.load(name)
    if state is None:
        raise StateError(f"no state for cluster {name!r}")
    job = state.job
    if job is None or not job.live:
        return None
    info = job.orchestrator
    stop_grace = job.stop_grace if job.stop_grace is not None else DEFAULT_STOP_GRACE
    if info is not None and orchestrator_alive(info):
        training = job.entry == "train"
        reporter.emit("message", text=f"asking job {job.id}'s supervisor (pid {info.pid}) to stop it"
                                      + (f"; the leader checkpoints first (up to {stop_grace:g} s)" if training else ""))
        if stop_supervisor(info, timeout=(stop_grace if training else 0) + grace + supervisor_margin()):
            fresh = store.load(name)
            return fresh.job if fresh is not None else None
        reporter.emit("message", level="warning",
                      text=f"job {job.id}'s supervisor (pid {info.pid}) is still stopping it; "
                           "stopping its processes from here")
    elif info is not None and info.host != socket.gethostname():
        reporter.emit("message", level="warning",
                      text=f"job {job.id} is supervised from {info.host}; stopping its processes from here")
    stop_orphaned_job(name, store=store, reporter=reporter, grace=grace, pool=pool, stop_grace=stop_grace)
    fresh = store.load(name)
    return fresh.job if fresh is not None else None


def stop_orphaned_job(name: str, *, store: StateStore, reporter: Reporter, grace: float = DEFAULT_GRACE,
                      pool: TransportPool | None = None, stop_grace: float | None = None) -> list[ProcessRecord]:
    """Stop a job whose supervisor is not here to do it: the processes that checkpoint on stop
    get SIGTERM and ``stop_grace`` seconds first (none with ``stop_grace`` 0 or a ``run`` job),
    then the rest ``grace``; the job is recorded ``stopped`` with its last checkpoint. The
    standing servers stay up. Returns the records stopped."""
    own_pool = pool is None
    pool = pool or TransportPool()
    try:
        state = store.load(name)
        if state is None:
            raise StateError(f"no state for cluster {name!r}")
        writer = StateWriter(store, state, expect_phase=Phase.UP)
        records = [r for r in state.live_records() if r.kind in (ProcessKind.TRAIN, ProcessKind.PROGRAM)]
        job = state.job
        if stop_grace is None:
            stop_grace = job.stop_grace if job is not None and job.stop_grace is not None else DEFAULT_STOP_GRACE
        first = first_to_stop(state.plan, records) if job is not None and job.entry == "train" and stop_grace > 0 else []
        stopped: list[ProcessRecord] = []
        errors: dict[str, PsclusterError] = {}
        if first:
            reporter.emit("message", text=f"asking {', '.join(r.task for r in first)} to checkpoint and stop "
                                          f"(up to {stop_grace:g} s)")
            done, errors = stop_records(state.plan, first, pool, reporter, grace=stop_grace)
            stopped += done
        rest = [r for r in records if r.key not in {f.key for f in first}]
        done, more = stop_records(state.plan, rest, pool, reporter, grace=grace)
        stopped += done
        errors.update(more)
        saved = _last_checkpoint(state, first, pool)

        def record(s: RunState) -> None:
            s.replace_records(stopped)
            if s.job is not None and s.job.live and not errors:
                fields = {"checkpoint": saved.get("path"), "checkpoint_step": saved.get("step")} if saved else {}
                s.job = s.job.updated(state=JobState.STOPPED, ended=time.time(),
                                      message="stopped without its supervisor (it was gone)", **fields)
        writer.change(record)
        if saved:
            reporter.emit("message", text=f"checkpoint saved at step {saved.get('step')}: {saved.get('path')}; "
                                          "continue with 'train --resume'")
        if errors:
            raise MultiHostError(f"stopping the job could not reach {len(errors)} host(s): {', '.join(sorted(errors))}",
                                 [Failure(host, err) for host, err in errors.items()],
                                 hint=f"when the host is back, 'pscluster down --name {name}' stops what is left")
        return stopped
    finally:
        if own_pool:
            pool.close()


def _last_checkpoint(state: RunState, records: list[ProcessRecord], pool: TransportPool) -> dict[str, Any] | None:
    """The newest ``checkpoint`` event the leader wrote (read from its events file), if newer
    than the job's recorded one."""
    if not records:
        return None
    leader = state.plan.leader.name
    recorded = state.job.checkpoint_step if state.job is not None else None
    for record in records:
        if record.task != leader or not record.events:
            continue
        tail = EventTail(record.events)
        try:
            transport = pool.get(state.plan.host(record.host))
            while tail.poll(transport):
                pass
        except PsclusterError:      # the stop happened; the record only misses its step
            return None
        event = tail.last("checkpoint")
        if event is not None and (recorded is None or (event.get("step") or 0) > recorded):
            return event
    return None


__all__ = ["first_to_stop", "stop_running_job", "stop_orphaned_job"]
