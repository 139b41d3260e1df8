"""``pscluster drain HOST``: the pure part (issue 44, items 1 and 3).

A drain is a planned change of membership with a deadline. :func:`parse_deadline` reads the
deadline; :func:`plan_drain` says, before anything moves, what becomes of each task of HOST:

* an async worker with a job running **leaves in place** (:data:`IN_PLACE`): its task stays in the
  plan under its index (no worker is renumbered, so the chief restarts nothing), the chief lets its
  closure in flight end and gives it no other (roles/workerloss.py ``WorkerLoss.hold``), then its
  server stops: no step is lost or done twice. The job's supervisor does it
  (cluster/supervision/train_resize.py ``Resizer.drain_in_place``);
* a sync or sync-ps worker, or any worker with no job running, leaves through the **resize** of
  ``scale`` (:data:`RESIZE`): the cluster is re-planned with HOST's worker count at 0; a job
  checkpoints at one step and restarts at the smaller size;
* an async job's ps **moves** (:data:`PS_MOVE`). In place when the cluster has another ps on a
  host that stays (``Resizer.move_ps_in_place``): the host's workers end their closures, the
  chief moves the ps's variables to that ps (roles/psmove.py: TensorFlow moves a ps's variables
  in place only to a ps the chief had from its start, docs/platform-notes.md TF13) and traces
  its functions again; nothing is restored or restarted, and the ps stays in the plan with no
  server until the next chief's start re-plans it (``Resizer.settle_drained_ps`` /
  ``settle_moved_ps``). Otherwise (one ps, or the chief refused) the supervisor puts it where a
  lost ps goes (``ps_spare``, else the surviving ps host with the fewest tasks, else the chief's
  host: cluster/supervision/core.py ``place_lost_ps``), through the fault path's resize with a
  checkpoint at one step first (the ps still answers), so the chief restarts from it and no step
  is lost; the host's workers leave the plan with it (``Resizer.drain_ps``);
* the chief, a sync job's leader (worker:0), or a ps with no job running cannot move
  (:data:`CHECKPOINT`): the job is checkpointed (and stopped) before the deadline and the command
  says what is left (exit 1).

The drained hosts are recorded in the cluster's state (``RunState.drained``); ``undrain`` or a
``scale`` that gives the host tasks again clears them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..contracts import Mode
from ..errors import UsageError
from ..plan import ClusterPlan

IN_PLACE = "in place"
RESIZE = "resize"
PS_MOVE = "ps move"
CHECKPOINT = "checkpoint"

DRAINING = "draining"
DRAINED = "drained"

MAX_DEADLINE = 24 * 3600.0
_DEADLINE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT = {None: 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_deadline(text: str) -> float:
    """Seconds from ``30``, ``30s``, ``1.5m``, ``500ms``, ``1h``.

    Raises:
        UsageError: not a number with a unit, 0, negative, NaN, infinite, or over a day.
    """
    hint = "give a positive number of seconds, e.g. --deadline 30s (units: ms, s, m, h)"
    found = _DEADLINE.match(str(text))
    if found is None:
        raise UsageError(f"--deadline {text!r}: not a duration", hint=hint)
    seconds = float(found.group(1)) * _UNIT[found.group(2)]
    if not math.isfinite(seconds):
        raise UsageError(f"--deadline {text!r}: not a finite duration", hint=hint)
    if seconds <= 0:
        raise UsageError(f"--deadline {text!r}: the deadline must be more than 0", hint=hint)
    if seconds > MAX_DEADLINE:
        raise UsageError(f"--deadline {text!r}: more than a day", hint=hint)
    return seconds


@dataclass(frozen=True)
class TaskMove:
    """What a drain does with one task of the host."""

    task: str           # "worker:1"
    role: str
    action: str         # IN_PLACE | RESIZE | PS_MOVE | CHECKPOINT
    why: str


@dataclass(frozen=True)
class DrainPlan:
    """What ``drain HOST`` will do, decided before anything moves."""

    host: str
    moves: tuple[TaskMove, ...]

    def of(self, action: str) -> tuple[TaskMove, ...]:
        return tuple(move for move in self.moves if move.action == action)

    @property
    def action(self) -> str:
        """The drain as a whole: CHECKPOINT if any task cannot move, else PS_MOVE if a ps moves
        (the host's workers leave with it), else RESIZE if any task needs it, else IN_PLACE (a
        host of async workers only). A host with no task: RESIZE (nothing to move; the standing
        servers are already gone)."""
        actions = {move.action for move in self.moves}
        for action in (CHECKPOINT, PS_MOVE, RESIZE):
            if action in actions:
                return action
        return IN_PLACE if actions else RESIZE

    def describe(self) -> str:
        return "; ".join(f"{move.task}: {move.action} ({move.why})" for move in self.moves) or "no task"


def ps_move(plan: ClusterPlan, task: str, *, job_live: bool) -> TaskMove:
    """A ps of the host: an async job's moves through a checkpoint at one step (module
    docstring); with no job, or in sync-ps (whose ps hold the graph's queues), it stays and the
    job, if any, is checkpointed instead."""
    if job_live and plan.mode == Mode.ASYNC:
        others = [t for t in plan.tasks_of("ps") if t.host != plan.task(task).host]
        how = ("its variables move to another ps in place (the chief's; no restart, no step lost)" if others else
               "the job checkpoints at one step and its chief restarts from there with the ps elsewhere (no step lost)")
        return TaskMove(task, "ps", PS_MOVE, f"moves off the host: {how}")
    why = (f"a {plan.mode} job's ps cannot move: the job is checkpointed instead" if job_live
           else "a ps moves only under a running async job: it stays")
    return TaskMove(task, "ps", CHECKPOINT, why)


def ps_target(candidates: list[int], held: dict[int, int], moving: int) -> int:
    """Which ps (an index of ``candidates``) takes the variables of a ps that moves in place: the
    one that holds the fewest (``held``: variables per ps task, from the chief's newest
    ``placement`` event; an idle ps of ``pscluster_idle_ps`` holds none), the lowest index among
    equals. ``moving``: how many the moving ps holds (added to the winner's count in ``held``,
    so that the next ps of the same host goes elsewhere when that is emptier)."""
    if not candidates:
        raise ValueError("no ps to move to")
    chosen = min(candidates, key=lambda index: (held.get(index, 0), index))
    held[chosen] = held.get(chosen, 0) + moving
    return chosen


def plan_drain(plan: ClusterPlan, host: str, *, job_live: bool, drained: tuple[str, ...] = ()) -> DrainPlan:
    """What ``drain host`` does with each of its tasks (module docstring).

    ``drained``: hosts drained already (their workers no longer count).

    Raises:
        UsageError: ``host`` is not a host of the cluster, or draining it would leave no worker.
    """
    names = [h.name for h in plan.hosts if any(t.host == h.name for t in plan.tasks)]
    if host not in {h.name for h in plan.hosts}:
        raise UsageError(f"{host!r} is not a host of cluster {plan.name!r}",
                         hint=f"its hosts: {', '.join(names) or 'none'} ('pscluster status' lists its tasks)")
    tasks = [t for t in plan.tasks if t.host == host]
    workers_left = [t for t in plan.tasks_of("worker") if t.host != host and t.host not in drained]
    if any(t.role == "worker" for t in tasks) and not workers_left:
        raise UsageError(f"draining {host} would leave cluster {plan.name!r} with no worker",
                         hint="add a worker host first ('pscluster scale' with it in the inventory), or "
                              "'pscluster stop-job' to checkpoint the job")
    moves = []
    for task in tasks:
        if task.role == "worker" and job_live and plan.mode != Mode.ASYNC and task.name == plan.leader.name:
            # The collective's leader keeps the job's checkpoints: the resize would refuse it
            # (resize.check_resize), so say before anything moves that the job checkpoints instead.
            moves.append(TaskMove(task.name, task.role, CHECKPOINT, f"{task.name} leads the {plan.mode} job and keeps "
                                  "its checkpoints: the job is checkpointed instead"))
        elif task.role == "worker":
            if job_live and plan.mode == Mode.ASYNC:
                moves.append(TaskMove(task.name, task.role, IN_PLACE, "the chief trains on without it"))
            else:
                how = "the job saves at one step and restarts smaller" if job_live else "its server stops"
                moves.append(TaskMove(task.name, task.role, RESIZE, how))
        elif task.role == "ps":
            moves.append(ps_move(plan, task.name, job_live=job_live))
        else:       # chief, evaluator: they keep the job's checkpoints or follow the chief
            moves.append(TaskMove(task.name, task.role, CHECKPOINT,
                                  f"the {task.role}'s host cannot be drained: the job is checkpointed instead"
                                  if job_live else f"the {task.role}'s host cannot be drained"))
    return DrainPlan(host, tuple(moves))


def worker_counts_without(counts: dict[str, int], host: str) -> dict[str, int]:
    """The worker counts of a re-plan that leaves ``host`` out."""
    return {**counts, host: 0}


def mark_drained(drained: dict[str, str], host: str, value: str | None) -> None:
    """Record ``host`` as ``value`` (DRAINING, DRAINED) in a state's ``drained``; None: clear it."""
    if value is None:
        drained.pop(host, None)
    else:
        drained[host] = value
