"""Carrying out ``pscluster drain HOST`` / ``undrain HOST`` (what each task does:
cluster/lifecycle/drain.py).

An async job's worker host leaves in place through its supervisor (a drain request, SIGUSR2:
``Resizer.drain_in_place``), and so does an async job's ps host, whose ps moves
(``Resizer.drain_ps``); a sync or sync-ps worker host, or any worker host with no job, leaves
through ``scale``'s resize of a plan that gives it no worker; a host that runs the chief (or a
ps that cannot move) checkpoints the job (which stops) before the deadline instead, and the
drain fails (exit 1) saying what is left.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..errors import PsclusterError, UsageError
from ..events import Reporter
from ..lifecycle import resize
from ..lifecycle.resize_request import ResizeRequest, ask_job, resize_lock
from ..lifecycle.drain import (CHECKPOINT, DRAINED, DRAINING, IN_PLACE, PS_MOVE, DrainPlan, mark_drained,
                               plan_drain)
from ..plan import ClusterPlan
from ..secrets import Secrets
from ..state import RunState, StateStore
from ..transport import TransportPool


@dataclass(frozen=True)
class DrainResult:
    """What a drain did: ``ok`` when the host holds nothing of the cluster any more."""

    host: str
    ok: bool
    message: str
    seconds: float
    left: tuple[str, ...] = ()        # the tasks still on the host (ok False)


CHECKPOINT_RESERVE = 10.0      # seconds of a drain's deadline kept for checkpointing the job instead


def checkpoint_reserve(deadline: float) -> float:
    """What a drain with a job keeps of its deadline to checkpoint the job if the move does not
    come in time: 10 s, or a third of a shorter deadline."""
    return min(CHECKPOINT_RESERVE, deadline / 3)


def _cluster(store: StateStore, name: str) -> RunState:
    return resize.cluster_that_is_up(store, name, "drained")


def _mark(store: StateStore, name: str, host: str, value: str | None) -> None:
    from ..state import StateWriter
    state = store.load(name)
    if state is None:
        return
    writer = StateWriter(store, state)
    writer.change(lambda s: mark_drained(s.drained, host, value))


def drain_host(store: StateStore, name: str, host: str, *, deadline: float, pool: TransportPool,
               reporter: Reporter, secrets: Callable[[ClusterPlan], Secrets | None],
               clock: Callable[[], float] = time.monotonic) -> DrainResult:
    """Move every task of cluster ``name`` off ``host`` within ``deadline`` seconds (module docstring).

    Raises:
        UsageError: unknown cluster or host, a host that would leave no worker (nothing moved).
    """
    began = clock()
    state = _cluster(store, name)
    if state.drained.get(host) == DRAINED:
        return DrainResult(host, True, f"{host} is drained already", 0.0)
    job_live = state.job is not None and state.job.live
    others = tuple(h for h, how in state.drained.items() if h != host and how == DRAINED)
    drain = plan_drain(state.plan, host, job_live=job_live, drained=others)
    reporter.emit("message", text=f"drain {host} (within {deadline:g} s): {drain.describe()}")
    reason = f"drain {host}"
    if drain.action == CHECKPOINT:
        return _checkpoint_instead(store, name, drain, pool=pool, reporter=reporter, deadline=deadline,
                                   began=began, clock=clock, job_live=job_live)
    if not job_live:        # while a job runs, its supervisor records it (its writes carry the whole state)
        _mark(store, name, host, DRAINING)
    # With a job, the move gets the deadline less what a checkpoint instead needs: a sync resize
    # that had not come after the whole deadline left no time to checkpoint (benchmarks.drain).
    budget = deadline - checkpoint_reserve(deadline) if job_live else deadline
    try:
        if drain.action in (IN_PLACE, PS_MOVE):     # the supervisor's: the plan it gets is today's
            what = f"{host}'s workers leave in place" if drain.action == IN_PLACE else f"{host}'s ps move"
            with resize_lock(store, name):       # not during a scale, nor two drains at once
                text = ask_job(store, name, ResizeRequest(state.plan, reason=reason, drain=host, within=budget),
                               reporter=reporter, timeout=budget, what=what)
        else:
            new = resize.replan(state.plan, port_base=state.port_base, limit=state.limit,
                                counts={**resize.worker_counts(state.plan), host: 0}, pool=pool)
            text = resize.scale_cluster(store, name, new, pool=pool, reporter=reporter, secrets=secrets(new),
                                        timeout=budget, reason=reason, drain=host).message
    except UsageError:
        if not job_live:
            _mark(store, name, host, None)
        raise
    except PsclusterError as exc:
        if not job_live:
            _mark(store, name, host, None)
        if not job_live or clock() - began >= deadline:
            raise
        reporter.emit("message", level="warning", text=f"drain {host}: {exc.message.splitlines()[0]}")
        return _checkpoint_instead(store, name, drain, pool=pool, reporter=reporter, deadline=deadline,
                                   began=began, clock=clock, job_live=True)
    if not job_live:
        _mark(store, name, host, DRAINED)
    seconds = clock() - began
    return DrainResult(host, True, f"{host} drained in {seconds:.1f} s: {text}", seconds)


def _checkpoint_instead(store: StateStore, name: str, drain: DrainPlan, *, pool: TransportPool, reporter: Reporter,
                        deadline: float, began: float, clock: Callable[[], float], job_live: bool) -> DrainResult:
    """A task that cannot move: the job checkpoints (and stops) within what is left of the deadline."""
    from .jobstop import stop_running_job
    left = tuple(move.task for move in drain.moves)
    why = "; ".join(f"{m.task}: {m.why}" for m in drain.moves if m.action == CHECKPOINT) or "the move failed"
    if not job_live:
        return DrainResult(drain.host, False, f"{drain.host} still runs {', '.join(left)} ({why}); no job to "
                           "checkpoint", clock() - began, left)
    grace = max(1.0, deadline - (clock() - began))
    job = stop_running_job(name, store=store, reporter=reporter, pool=pool, grace=grace)
    step = job.checkpoint_step if job is not None else None
    saved = (f"the job was checkpointed at step {step} and stopped ('train --resume' goes on from there)"
             if step is not None else "the job was stopped; it saved no checkpoint")
    return DrainResult(drain.host, False, f"{drain.host} still runs {', '.join(left)} ({why}): {saved}",
                       clock() - began, left)


def undrain_host(store: StateStore, name: str, host: str, *, pool: TransportPool, reporter: Reporter,
                 secrets: Callable[[ClusterPlan], Secrets | None], timeout: float = 600.0) -> str:
    """Let a drained ``host`` take tasks again.

    Raises:
        UsageError: unknown cluster, or a host that is not drained.
    """
    state = _cluster(store, name)
    if host not in state.drained:
        drained = ", ".join(sorted(state.drained)) or "none"
        raise UsageError(f"{host!r} is not drained in cluster {name!r}", hint=f"drained hosts: {drained}")
    job_live = state.job is not None and state.job.live
    in_plan = any(t.host == host for t in state.plan.tasks)
    if job_live and in_plan:        # an async worker host that left in place: its workers come back
        with resize_lock(store, name):
            text = ask_job(store, name, ResizeRequest(state.plan, reason=f"undrain {host}",
                                                                    undrain=host),
                                  reporter=reporter, timeout=timeout, what=f"{host}'s workers come back")
    else:
        counts = {h: c for h, c in resize.worker_counts(state.plan).items() if h != host}
        new = resize.replan(state.plan, port_base=state.port_base, limit=state.limit, counts=counts, pool=pool)
        text = resize.scale_cluster(store, name, new, pool=pool, reporter=reporter, secrets=secrets(new),
                                    timeout=timeout, reason=f"undrain {host}", undrain=host).message
    if not job_live:
        _mark(store, name, host, None)
    return text


def clear_drained(store: StateStore, name: str) -> None:
    """After a ``scale``: a drained host the new plan gives tasks is drained no more."""
    state = store.load(name)
    if state is None:
        return
    busy = {t.host for t in state.plan.tasks}
    for host in [h for h in state.drained if h in busy and state.drained[h] == DRAINED]:
        if not any(r.host == host for r in state.live_records()):
            continue        # an async worker host that left in place is still in the plan, with nothing running
        _mark(store, name, host, None)
