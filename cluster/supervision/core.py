"""Supervision decisions as pure functions of what was observed.

The executor (:mod:`cluster.supervision.executor`) watches processes and hosts, and acts; this
module decides. Nothing here reads a clock, a file or a host: every input, ``now`` included, is
passed in, so every row of the recovery table in ``docs/supervision.md`` is a unit test that
runs in milliseconds (``tests/unit/test_supervision_core.py``).

Vocabulary:

* :class:`Proc` -- one live process of the job as last observed (a snapshot).
* :class:`Incident` -- the first thing that went wrong, with the process to blame.
* :class:`RestartRules` + :func:`verdict` -- restart policy, per-job budget, backoff.
* :class:`Recovery` -- what to stop, restart and relaunch: :func:`train_recovery` (by mode, as
  TensorFlow allows) and :func:`program_recovery` (``pscluster run``: the one task).
* :func:`train_outcome` / :func:`program_end` -- when a job is done.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Collection, Iterable, Mapping, Sequence

from ..contracts import PS_SPARE_GROUP, Mode, ProcessKind, ProcState, RestartPolicy, Role, Until

FROZEN_AFTER = 5.0          # a process stopped (SIGSTOP) this long counts as failed
LEADER_LINGER = 30.0        # after the leader finished, others get this long to end by themselves
# After the leader finished, the side-car evaluator gets this long to evaluate the final
# checkpoint (it may be busy with an older one; a CNN pass over MNIST's test split takes seconds).
EVALUATOR_LINGER = 120.0
MAX_BACKOFF = 30.0
# `pscluster run`: once every task still running is one that never exits by itself (a ps in
# server.join(), a ParameterServerStrategy worker after its chief is gone), it gets this long to
# exit all the same (a TF1 ps that dequeues a "done" token exits within a second), then is stopped.
IDLE_LINGER = 10.0


@dataclass(frozen=True)
class Proc:
    """One live process of the job, as last observed."""

    key: str                          # the process record's key ("worker:1#j2.1")
    task: str                         # "worker:1"
    role: Role
    host: str
    kind: ProcessKind
    state: ProcState = ProcState.RUNNING
    exit_code: int | None = None
    signal: int | None = None
    launched: float = 0.0             # when it was started (the executor's clock)
    frozen_since: float | None = None
    started: bool = False             # training processes: reported their "start" event
    last_event: float = 0.0           # training processes: when they last reported anything
    done: bool = False                # training processes: wrote their "done" event
    finished: bool = False            # ended as it should: its part of the job is complete

    @property
    def ended(self) -> bool:
        return self.state in (ProcState.EXITED, ProcState.GONE)

    @property
    def is_evaluator(self) -> bool:
        """``train``'s side-car evaluator: a job process outside the training group."""
        return self.role is Role.EVALUATOR and self.kind is ProcessKind.TRAIN

    @property
    def clean_exit(self) -> bool:
        return self.state is ProcState.EXITED and self.exit_code == 0 and self.signal is None

    def exit_reason(self) -> str:
        if self.state is ProcState.GONE:
            return "vanished (no exit status)"
        if self.signal is not None:
            return f"was killed by signal {self.signal}"
        return f"exited with code {self.exit_code}"


@dataclass(frozen=True)
class HostView:
    """One host's watch stream: lost since when (None = answering), and why."""

    host: str
    lost_since: float | None = None
    error: str | None = None


class IncidentKind(str, Enum):
    EXITED = "exited"
    FROZEN = "frozen"
    START_TIMEOUT = "start-timeout"
    STALLED = "stalled"


@dataclass(frozen=True)
class Incident:
    """A failed process of the job and why (the process to blame, not the one that noticed)."""

    kind: IncidentKind
    proc: Proc
    reason: str

    @property
    def clean_exit(self) -> bool:
        return self.kind is IncidentKind.EXITED and self.proc.clean_exit


@dataclass(frozen=True)
class Watchdog:
    """What counts as failed, besides an exit.

    ``start_timeout``: a training process that has not reported ``start`` this long after its
    launch failed (None: no deadline). ``stall_after``: a leader that reported no progress this
    long is stalled (:func:`stall_limit`; None: not checked): in sync modes a peer blocks the
    collective, in async mode a closure never returned; ``waiting_on`` names the task it waits on. ``blame_frozen``: when a process
    fails while a peer is frozen, blame the frozen one (sync peers fail *because* it froze).
    ``restart_clean_exits``: ``run --restart-policy always`` also restarts a program that
    exited 0.
    """

    frozen_after: float = FROZEN_AFTER
    start_timeout: float | None = None
    stall_after: float | None = None
    leader: str | None = None
    waiting_on: str | None = None       # the task the leader said it waits on (``worker:2@h3``)
    blame_frozen: bool = False
    restart_clean_exits: bool = False


def find_incident(procs: Sequence[Proc], *, now: float, watch: Watchdog) -> Incident | None:
    """The first failure among ``procs`` (in their order), or None while all is well."""
    for proc in procs:
        if proc.finished:
            continue
        if proc.ended:
            if proc.clean_exit and (proc.done or (proc.kind is ProcessKind.PROGRAM and not watch.restart_clean_exits)):
                continue       # a completed part of the job, not a failure
            return _blame(Incident(IncidentKind.EXITED, proc, proc.exit_reason()), procs, watch)
        if proc.frozen_since is not None and now - proc.frozen_since > watch.frozen_after:
            return Incident(IncidentKind.FROZEN, proc,
                            f"is frozen (stopped by a signal for {now - proc.frozen_since:.0f} s)")
        if (watch.start_timeout is not None and proc.kind is ProcessKind.TRAIN and not proc.started
                and now - proc.launched > watch.start_timeout):
            return Incident(IncidentKind.START_TIMEOUT, proc,
                            f"did not start training within {watch.start_timeout:.0f} s")
    return _stall(procs, now=now, watch=watch)


def _blame(incident: Incident, procs: Sequence[Proc], watch: Watchdog) -> Incident:
    if not watch.blame_frozen or incident.proc.frozen_since is not None:
        return incident
    frozen = [proc for proc in procs if proc.frozen_since is not None and not proc.ended]
    if not frozen:
        return incident
    return Incident(IncidentKind.FROZEN, frozen[0],
                    f"is frozen (stopped by a signal; {incident.proc.task} {incident.reason} waiting for it)")


def _stall(procs: Sequence[Proc], *, now: float, watch: Watchdog) -> Incident | None:
    if watch.stall_after is None or watch.leader is None:
        return None
    leader = next((p for p in reversed(procs) if p.task == watch.leader and p.kind is ProcessKind.TRAIN), None)
    if leader is None or not leader.started or leader.done or now - leader.last_event <= watch.stall_after:
        return None
    # The evaluator is silent between checkpoints by design, and blocks no collective.
    training = [p for p in procs if p.kind is ProcessKind.TRAIN and not p.is_evaluator]
    culprit = min(training, key=lambda p: p.last_event)
    waiting = f"; waiting on {watch.waiting_on}" if watch.waiting_on else ""
    return Incident(IncidentKind.STALLED, culprit,
                    f"stopped making progress ({now - culprit.last_event:.0f} s without an event{waiting})")


# A job counts as stalled once its leader reported no progress for the larger of STALL_MIN and
# STALL_FACTOR times its slowest unit of work (the longest gap between two of the leader's
# events once it trained: a closure, a collective step, an evaluation, a checkpoint); the stall
# is shown (status, attach, the live view) after the larger of STALL_SHOWN_MIN and
# STALL_SHOWN_FACTOR times that unit, well before it is acted on.
STALL_MIN = 60.0
STALL_FACTOR = 20.0
STALL_SHOWN_MIN = 10.0
STALL_SHOWN_FACTOR = 4.0


def stall_limit(option: float | None, *, slowest_unit: float, sync: bool, collective_timeout: float) -> float | None:
    """Seconds without progress after which the job is stalled (None: never).

    ``option``: ``train --stall-timeout`` (None: derived; 0: off). A given limit shorter than
    twice the slowest unit of work seen is raised to that: a legitimately slow unit (a first
    evaluation, a big checkpoint) is progress, not a stall. Sync modes wait at least as long
    as a collective may (twice ``--collective-timeout`` and 30 s), so that TensorFlow's own
    timeout names the peer first."""
    if option == 0:
        return None
    if option is not None:
        return max(option, 2.0 * slowest_unit)
    limit = max(STALL_MIN, STALL_FACTOR * slowest_unit)
    return max(limit, collective_timeout * 2 + 30) if sync else limit


def stall_shown_after(slowest_unit: float) -> float:
    """Seconds without progress after which status says the job is stalled."""
    return max(STALL_SHOWN_MIN, STALL_SHOWN_FACTOR * slowest_unit)


# ----------------------------------------------------------------------------- restarts

@dataclass(frozen=True)
class RestartRules:
    """``--restart-policy``, ``--max-restarts`` (per task, per job) and the backoff."""

    policy: RestartPolicy = RestartPolicy.ON_FAILURE
    max_restarts: int = 3
    backoff: float = 1.0
    max_backoff: float = MAX_BACKOFF

    def delay(self, used: int) -> float:
        """Seconds to wait before restart number ``used + 1``: 1, 2, 4, ... capped."""
        doubling: int = 2 ** used       # an int, as used >= 0 (mypy types int ** int as Any)
        return min(self.max_backoff, self.backoff * doubling)


class Action(str, Enum):
    RESTART = "restart"
    FAIL = "fail"          # the job fails with the incident as its root cause
    ACCEPT = "accept"      # a clean exit that may no longer be restarted stands (run --restart-policy always)
    GIVE_UP = "give-up"    # the evaluator is stopped and left out; training goes on without it


class FailReason(Enum):
    """For FAIL: what forbids the restart."""

    POLICY = "policy"           # restart policy 'never'
    CLEAN_EXIT = "clean-exit"   # on-failure, and the task exited 0 before the job ended
    BUDGET = "budget"           # its restarts are used up


@dataclass(frozen=True)
class Verdict:
    action: Action
    delay: float = 0.0
    why: str | None = None          # for FAIL: what forbids the restart, in words
    reason: FailReason | None = None
    # For FAIL: the task failed for good (its policy or its budget forbids a restart), so an
    # elastic job (--min-workers) may go on without it rather than fail.
    for_good: bool = False


def verdict(rules: RestartRules, incident: Incident, used: int) -> Verdict:
    """Restart, fail or accept, given the restarts this task already used in this job.

    ``never`` fails at the first incident; ``on-failure`` restarts anything but a clean exit
    (a standing server or a training process that exits 0 without finishing fails the job);
    ``always`` restarts clean exits too. A task whose budget is used fails the job, except that
    a program's clean exit then simply stands. The side-car evaluator never fails the job:
    where any other task would, it is given up (training does not depend on it).
    """
    decided = _verdict(rules, incident, used)
    if decided.action is Action.FAIL and incident.proc.is_evaluator:
        return Verdict(Action.GIVE_UP, why=decided.why or "it exited 0 before the job ended", reason=decided.reason)
    return decided


def _verdict(rules: RestartRules, incident: Incident, used: int) -> Verdict:
    if rules.policy is RestartPolicy.NEVER:
        return Verdict(Action.FAIL, why="restart policy 'never'", reason=FailReason.POLICY,
                       for_good=not incident.clean_exit)
    if rules.policy is RestartPolicy.ON_FAILURE and incident.clean_exit:
        return Verdict(Action.FAIL, reason=FailReason.CLEAN_EXIT)
    if used >= rules.max_restarts:
        if incident.clean_exit and incident.proc.kind is ProcessKind.PROGRAM:
            return Verdict(Action.ACCEPT)
        return Verdict(Action.FAIL, why=f"restart budget exhausted ({rules.max_restarts} restart(s) used)",
                       reason=FailReason.BUDGET, for_good=True)
    return Verdict(Action.RESTART, delay=rules.delay(used))


# ----------------------------------------------------------------------------- recovery

@dataclass(frozen=True)
class Recovery:
    """What the executor does after the backoff, in this order.

    Wait until ``wait_hosts`` answer; stop the processes ``stop`` (keys); relaunch the standing
    servers ``restart_servers`` (task names, each waited for until it answers); if
    ``ensure_servers``, probe every standing server and restart any that does not answer; then
    relaunch the training/program tasks ``relaunch`` (resuming from the last checkpoint).
    """

    wait_hosts: tuple[str, ...]
    stop: tuple[str, ...]
    restart_servers: tuple[str, ...] = ()
    ensure_servers: bool = False
    relaunch: tuple[str, ...] = ()


def train_recovery(mode: Mode, failed: Proc, procs: Iterable[Proc], *, hosts: Sequence[str],
                   servers: Sequence[str], trainers: Sequence[str]) -> Recovery:
    """The recovery table of ``pscluster train`` (docs/supervision.md), by mode.

    Args:
        failed: the process to blame.
        procs: every live process of the job (servers included).
        hosts: every host of the cluster.
        servers: the standing tasks (started by ``up``), in plan order.
        trainers: the training tasks, in plan order.
    """
    procs = list(procs)
    mode = Mode(mode)
    if failed.is_evaluator:
        # It only reads checkpoints: restarted alone, in every mode; training never waits for it.
        return Recovery(wait_hosts=(failed.host,), stop=(failed.key,), relaunch=(failed.task,))
    if mode is Mode.ASYNC and failed.kind is ProcessKind.SERVER:
        # A worker's server rejoins the coordinator by itself; a ps restarts empty and the
        # coordinator then fails on its own (its variables are gone) and is restarted below.
        return Recovery(wait_hosts=(failed.host,), stop=(failed.key,), restart_servers=(failed.task,))
    if mode is Mode.ASYNC:
        return Recovery(wait_hosts=tuple(hosts), stop=(failed.key,), ensure_servers=True,
                        relaunch=(failed.task,))
    group = [p.key for p in procs if p.kind is ProcessKind.TRAIN and not p.is_evaluator]
    if mode is Mode.SYNC:
        # MultiWorkerMirroredStrategy has no elasticity: the whole group restarts.
        return Recovery(wait_hosts=tuple(hosts), stop=tuple(group), relaunch=tuple(trainers))
    # sync-ps: the ps hold the old graph's queues and accumulators: restart them too.
    group += [p.key for p in procs if p.kind is ProcessKind.SERVER]
    return Recovery(wait_hosts=tuple(hosts), stop=tuple(group), restart_servers=tuple(servers),
                    relaunch=tuple(trainers))


def program_recovery(failed: Proc) -> Recovery:
    """``pscluster run``: the user's program is restarted on its own host and port, alone."""
    return Recovery(wait_hosts=(failed.host,), stop=(failed.key,), relaunch=(failed.task,))


# ----------------------------------------------------------------------------- hosts

def lost_host_failure(hosts: Sequence[HostView], *, now: float, host_timeout: float,
                      policy: RestartPolicy) -> HostView | None:
    """The lost host that fails the job: any lost host under ``never``, else one lost for
    longer than ``host_timeout``."""
    for host in hosts:
        if host.lost_since is None:
            continue
        if policy is RestartPolicy.NEVER or now - host.lost_since > host_timeout:
            return host
    return None


# ----------------------------------------------------------------------------- elastic

@dataclass(frozen=True)
class DropOut:
    """Whether a job goes on without a lost worker host, or without a worker that used up its
    restarts (``train --min-workers``), and how many workers it then has."""

    drop: bool
    workers_left: int
    why: str


def drop_out(workers: Mapping[str, int], *, host: str, other_roles: Sequence[str], task: str | None,
             min_workers: int | None) -> DropOut:
    """``workers``: worker tasks per host now. A lost host (``task`` None) takes all its tasks
    with it, so it may run only workers; a worker that used up its restarts (``task``) takes
    only itself. The job goes on while at least ``min_workers`` remain; without
    ``--min-workers`` it fails as before. Only a worker can go: a chief or ps that used up its
    restarts fails the job (CI once saw the chief's exhausted budget take a worker off its host
    and resize the job onto the host that was lost)."""
    fewer = 1 if task is not None else workers.get(host, 0)
    left = sum(workers.values()) - fewer
    if min_workers is None:
        return DropOut(False, left, "no --min-workers")
    if task is not None and task.partition(":")[0] != "worker":
        return DropOut(False, sum(workers.values()), f"{task} is not a worker: the job cannot go on without it")
    if task is None and other_roles:
        return DropOut(False, left, f"{host} also runs {', '.join(sorted(other_roles))}")
    if left < min_workers:
        return DropOut(False, left, f"{left} worker(s) would be left, fewer than --min-workers {min_workers}")
    return DropOut(True, left, f"{left} worker(s) go on")


@dataclass(frozen=True)
class PsMove:
    """Where the ps tasks of a host lost for good go (``to`` None: nowhere, and ``why`` says why)."""

    to: str | None
    tasks: tuple[str, ...]
    why: str


def place_lost_ps(tasks: Sequence[tuple[str, str]], *, lost: str, mode: Mode | str, policy: RestartPolicy,
                  spares: Sequence[str] = (), unreachable: Collection[str] = ()) -> PsMove:
    """Where an async job moves the ps tasks of ``lost``, a host lost beyond ``--host-timeout``.

    ``tasks``: (task name, host) of the plan, in plan order. The first host of the inventory's
    ``ps_spare`` group (``spares``) that is not lost, else the surviving ps host with the fewest
    tasks (ties: the first in plan order), else the chief's host. ``unreachable``: other hosts
    that do not answer now. Refused: under ``--restart-policy never``; outside async mode (sync
    has no ps; sync-ps restarts its ps with the whole group and is not moved); a host that runs
    the chief (its checkpoints are the job's) or the evaluator; a host that runs no ps."""
    names = tuple(name for name, host in tasks if host == lost)
    moved = tuple(name for name in names if name.startswith("ps:"))
    if policy is RestartPolicy.NEVER:
        return PsMove(None, moved, "restart policy 'never'")
    if Mode(mode) is not Mode.ASYNC:
        return PsMove(None, moved, f"{Mode(mode)} mode: a lost ps is not moved (async only)")
    if not moved:
        return PsMove(None, (), f"{lost} runs no ps")
    others = sorted({name.split(":")[0] for name in names} - {"ps", "worker"})
    if others:
        return PsMove(None, moved, f"{lost} also runs {', '.join(others)}")
    gone = set(unreachable) | {lost}
    spare = next((host for host in spares if host not in gone), None)
    if spare is not None:
        return PsMove(spare, moved, f"{spare} is the first host of the inventory's {PS_SPARE_GROUP} group")
    load: dict[str, int] = {}
    for _, host in tasks:
        load[host] = load.get(host, 0) + 1
    ps_hosts = [host for host in dict.fromkeys(host for name, host in tasks if name.startswith("ps:"))
                if host not in gone]
    if ps_hosts:
        fewest = min(ps_hosts, key=lambda host: load[host])       # min keeps the first of equals
        return PsMove(fewest, moved, f"{fewest} is the surviving ps host with the fewest tasks ({load[fewest]})")
    chief = next((host for name, host in tasks if name == "chief:0"), None)
    if chief is not None and chief not in gone:
        return PsMove(chief, moved, f"{chief} runs the chief (no other ps host survives)")
    return PsMove(None, moved, "no host of the cluster answers to take it")


# ----------------------------------------------------------------------------- completion

@dataclass(frozen=True)
class TrainOutcome:
    """Whether a training job is complete, and which stragglers to stop then."""

    complete: bool
    stop: tuple[str, ...] = ()


def train_outcome(procs: Sequence[Proc], *, leader: str, leader_done_at: float | None, now: float,
                  linger: float = LEADER_LINGER, evaluator_linger: float = EVALUATOR_LINGER) -> TrainOutcome:
    """A training job is complete once its leader finished and every other training process
    ended too, or ``linger`` seconds after the leader finished (the stragglers are stopped).
    The evaluator is waited for until it finished (it evaluated the final checkpoint) or for
    ``evaluator_linger`` seconds, then stopped."""
    if leader_done_at is None:
        return TrainOutcome(False)
    others = [p for p in procs if p.kind is ProcessKind.TRAIN and p.task != leader and not p.finished and not p.ended]
    if not others:
        return TrainOutcome(True)
    waited = now - leader_done_at
    if all(waited > (evaluator_linger if p.is_evaluator else linger) for p in others):
        return TrainOutcome(True, stop=tuple(p.key for p in others))
    return TrainOutcome(False)


def default_until(roles: Sequence[Role | str]) -> Until:
    """``run``'s end without ``--until``: the chief's exit when the run has a chief (TFJob's
    success policy), else every worker's, else (``--on ps``) every task's."""
    present = {Role(role) for role in roles}
    if Role.CHIEF in present:
        return Until.CHIEF
    return Until.WORKERS if Role.WORKER in present else Until.ALL


def until_problem(until: Until, roles: Sequence[Role | str]) -> str | None:
    """Why ``--until`` cannot apply to a run on ``roles`` (None: it can)."""
    present = {Role(role) for role in roles}
    if until is Until.CHIEF and Role.CHIEF not in present:
        return "--until chief: no chief runs the program"
    if until is Until.WORKERS and not present & {Role.CHIEF, Role.WORKER}:
        return "--until workers: no chief or worker runs the program"
    return None


@dataclass(frozen=True)
class ProgramEnd:
    """Whether a ``pscluster run`` is over, what to stop, and what the rule waits on.

    ``idle``: the tasks still running when every one of them never exits by itself (they get
    ``linger`` seconds from ``idle_since``, then are stopped): the executor says so once.
    ``stop``: keys of programs still running, to stop now that the run is over.
    """

    done: bool
    stop: tuple[str, ...] = ()
    idle: tuple[str, ...] = ()
    why: str = ""


def never_exits(proc: Proc, procs: Sequence[Proc], *, serving_workers: bool) -> bool:
    """A program task that never exits by itself: a ps (``server.join()``), an evaluator loop,
    and, in a ParameterServerStrategy program (``serving_workers``: the async shape, where the
    chief coordinates), a worker once the chief is gone (its ``server.join()`` has no one left)."""
    if proc.role in (Role.PS, Role.EVALUATOR):
        return True
    if proc.role is Role.WORKER and serving_workers:
        chiefs = [p for p in procs if p.role is Role.CHIEF and p.kind is ProcessKind.PROGRAM]
        return bool(chiefs) and all(p.finished for p in chiefs)
    return False


def program_end(procs: Sequence[Proc], *, until: Until, serving_workers: bool = False,
                idle_since: float | None = None, now: float = 0.0, linger: float = IDLE_LINGER) -> ProgramEnd:
    """When ``pscluster run`` is over (called once no incident is open).

    ``until`` names the tasks waited for (:class:`~cluster.contracts.Until`): ``chief``, every
    chief and worker (``workers``; none: every task), or every task (``all``). Once they all
    finished the run is over and the programs still running are stopped. It never waits
    silently: when every task still running never exits by itself (:func:`never_exits`), they
    are named (``idle``) and stopped ``linger`` seconds after ``idle_since``. Standing servers
    of ``up`` are not the run's and are left alone.
    """
    programs = [p for p in procs if p.kind is ProcessKind.PROGRAM]
    if not programs:
        return ProgramEnd(False)
    if until is Until.CHIEF:
        waited = [p for p in programs if p.role is Role.CHIEF]
    elif until is Until.WORKERS:
        waited = [p for p in programs if p.role in (Role.CHIEF, Role.WORKER)]
    else:
        waited = []
    waited = waited or programs
    running = [p for p in programs if not p.finished and not p.ended]
    if all(p.finished for p in waited):
        names = ", ".join(p.task for p in waited) if len(waited) <= 3 else f"{len(waited)} tasks"
        return ProgramEnd(True, stop=tuple(p.key for p in running),
                          why=f"{names} finished (--until {until})")
    if running and all(never_exits(p, procs, serving_workers=serving_workers) for p in running):
        idle = tuple(p.task for p in running)
        if idle_since is not None and now - idle_since >= linger:
            return ProgramEnd(True, stop=tuple(p.key for p in running), idle=idle,
                              why=f"only tasks that never exit by themselves were left (for {linger:.0f} s)")
        return ProgramEnd(False, idle=idle)
    return ProgramEnd(False)


def restarts_in_job(counts: Mapping[str, int]) -> dict[str, int]:
    return {task: count for task, count in counts.items() if count}
