"""A training job's resizes, between two turns of the executor's loop: ``pscluster scale``'s
request (SIGUSR2), and elastic training (``train --min-workers``: a lost or failed worker host
drops out; ``--hosts-from``: the job follows a discovery command; a dropped host that answers
again rejoins).

A resize either happens in place (async: the running chief takes the new cluster between two
closures, roles/membership.py) or checkpoints, stops the job's processes, applies the new plan
(:mod:`cluster.lifecycle.resize`) and relaunches the trainers from the checkpoint, with standbys
started beforehand so that the relaunch skips TensorFlow's import. :class:`Resizer` is the part
of :class:`~cluster.supervision.train_job.TrainJob` that does it.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Protocol

from ..contracts import CLEANUP_GRACE, DEFAULT_GRACE, JobState, Mode, ProcessKind, RestartPolicy
from ..errors import Failure, PsclusterError
from ..events import Reporter
from ..hosts import hostops
from ..hosts.codesync import sync_new_hosts
from ..hosts.probe import Prober
from ..layout import gate_file, ready_file
from ..lifecycle import resize
from ..lifecycle.drain import ps_target
from ..lifecycle.resize import PlanDiff
from ..lifecycle.resize_request import ResizeRequest, post_result, take_request
from .elastic import DEFAULT_NOTICE_DEADLINE, Discovery, Elastic
from ..lifecycle.tasks import report_standbys, start_standbys, start_task, stop_records
from ..plan import ClusterPlan, TaskSpec
from ..state import ProcessRecord
from . import core
from .executor import LOOP_SECONDS, JobExecutor
from .jobkind import Watched
from .jobstop import first_to_stop
from .links import HostLink
from .notices import NoticeDrains, NoticeSource

REJOIN_RETRY = 5.0      # seconds between two tries to take a host back (each runs preflight there)
REJOIN_PROBES = (2.0, 5.0)     # seconds of each gRPC probe of a rejoining host's still-running server
LOST_HOST_GRACE = 3.0   # the leader's time to save when a resize leaves a lost host out (it usually cannot: see resize())
IN_PLACE_TIMEOUT = 60.0  # for the async chief to take a change in place (it looks between closures)
STANDBY_WAIT = 60.0      # for the standbys of a resize's relaunch to import TensorFlow (then: started afresh)
RETIRE_TIMEOUT = 10.0    # for the async chief to say a drained worker's last closure ended (one closure)
WARM_STANDBYS_AFTER = 3.0   # sync: seconds of training before the group's standbys are started again,
WARM_STANDBYS_WORTH = 15.0  # if the job has this many seconds left (a standby imports 10-15 s here),
WARM_STANDBYS_LATEST = 10.0  # else after this long (the next `train` finds them imported)
RESIZE_RESERVE = 6.0     # of a drain's budget, kept for the usual path (checkpoint, stop, apply, launch: 1-3 s)
OVERLAP_NEEDS = 1.5      # of a drain's budget, after the standbys are ready: the release (0.3-1 s; late gates go on)
GATE_RESERVE = 3.0       # of a drain's budget, once the new workers started: the old ones' checkpoint and stop (0.5-1.8 s)
HANDOVER_TIMEOUT = 30.0  # sync: for the old workers to release their ports (one unit of work each; roles/handover.py)


def drain_standby_wait(within: float | None, overlap: bool) -> float:
    """How long a resize waits for its relaunch's standbys (still importing TensorFlow): up to
    STANDBY_WAIT; for a drain (``within``: its budget), a third of it, and with the overlap
    (sync) until it would no longer fit before the usual path's reserve. A drain in a sync job's
    first seconds meets standbys that are still importing (10-15 s on a loaded machine): with a
    third of a 20-s budget they were ready too late for the overlap in 4 of 20 lab trials
    (benchmarks.drain). After the wait only the release must fit before the reserve: new
    workers late at their gates go on (:meth:`Resizer.wait_at_gates`), and a standby still
    importing then costs its import inside the pause (7.3 s in one of 20 local trials with 4 s
    kept here for the gates). Without the overlap (an async ps's drain) a restart follows,
    which needs more of the budget than the reserve."""
    if within is None:
        return STANDBY_WAIT
    return min(STANDBY_WAIT, max(within / 3, within - RESIZE_RESERVE - OVERLAP_NEEDS if overlap else 0.0))


def _until(deadline: float, by: float | None) -> float:
    """``deadline``, or the earlier ``by`` (a drain's budget) when there is one."""
    return deadline if by is None else min(deadline, by)


class TrainSide(Protocol):
    """What a resize needs of the training job (:class:`~cluster.supervision.train_job.TrainJob`),
    and all it touches of it."""

    @property
    def leader_name(self) -> str:
        """The task that leads the job now."""
        ...

    @property
    def stop_grace(self) -> float:
        """``--stop-grace``: the leader's time to checkpoint when asked to stop."""
        ...

    @property
    def ps_variables(self) -> dict[int, int]:
        """Variables per ps task index, from the chief's newest placement (empty before one)."""
        ...

    def follow_plan(self, plan: ClusterPlan) -> None:
        """The job goes on at ``plan`` (its leader may be another task)."""

    def set_batch_size(self, batch_size: int) -> None:
        """The trainers' ``--batch-size`` from the next launch on."""

    def sync_job_files(self, ex: JobExecutor[Any], plan: ClusterPlan) -> None:
        """The job's own files on the hosts of ``plan`` that need them."""

    def refill_once_trained(self, ex: JobExecutor[Any], after: float = 0.0, *, worth: float = 0.0,
                            latest: float = 0.0) -> None:
        """New standbys for the tasks a launch took theirs from, once the leader trains again
        (for ``after`` s; before ``latest`` s, only with ``worth`` s of the job left)."""

    def read_final_events(self, ex: JobExecutor[Any], records: list[ProcessRecord]) -> None:
        """The last events of stopped ``records`` (the leader's checkpoint), into the job record."""

    def train_process(self, ex: JobExecutor[Any], task: TaskSpec, plan: ClusterPlan, *, resume: bool,
                      gate: bool = False) -> tuple[ProcessRecord, list[str], dict[str, str], str]:
        """One training process of ``plan``, not started: its record, argv, environment and events file."""
        ...

    def launch_train(self, ex: JobExecutor[Any], task: TaskSpec, *, resume: bool) -> Watched:
        """Start and watch a training process of ``task``."""
        ...

    def adopt_started(self, ex: JobExecutor[Any], task: TaskSpec, record: ProcessRecord, events: str) -> Watched:
        """Watch a training process started before the job reached it."""
        ...


class Resizer:
    """Resizes ``train``'s job: what a resize needs of the job's processes is the executor's
    (given to each method), what it needs of the training job is ``train``'s (:class:`TrainSide`);
    the training job tells it what it hears through :meth:`ask`, :meth:`number_from`,
    :meth:`next_seq` and :meth:`answered`."""

    def __init__(self, train: TrainSide, elastic: Elastic | None):
        self.train = train
        # --min-workers / --hosts-from (None: the membership is not elastic; notices still drain)
        self.elastic = elastic if elastic is not None and elastic.follows_membership else None
        self.options = elastic or Elastic()       # --notices-from and the deadline of a notice
        self.notices: NoticeDrains | None = None  # built at the first turn (it needs the state dir)
        self.asked = False                        # SIGUSR2: `pscluster scale` posted a request
        self.dropped: dict[str, HostLink] = {}    # worker hosts left out while lost: watched until they answer
        # Async worker hosts lost but kept in the plan: the chief trains on without their workers
        # (roles/workerloss.py) and takes them back once their servers answer again.
        self.away: dict[str, HostLink] = {}
        # Async ps tasks moved off a host lost for good (task -> (host, port)): every later re-plan
        # keeps them there, although the inventory still places them on the lost host.
        self.moved: dict[str, tuple[str, int | None]] = {}
        # Async ps tasks whose variables the chief moved in place to another ps (``drain HOST``
        # of a ps host, :meth:`move_ps_in_place`): drained host -> its ps tasks. They stay in the
        # plan with no server; a new chief (a restart) could not reach them, so a chief's
        # recovery re-plans them first (:meth:`settle_moved_ps`).
        self.ps_in_place: dict[str, list[str]] = {}
        self.discovery = (Discovery(elastic.hosts_from, elastic.hosts_every)
                          if elastic is not None and elastic.hosts_from else None)
        self.next_rejoin = 0.0
        # Requests to the chief to change in place, numbered from the clock when the job starts
        # (TrainJob.new_job): an answer left in a reused events file by an earlier job of a
        # cluster of the same name never matches.
        self.membership_seq = 0
        self.membership_answers: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ what the training job tells it
    def ask(self) -> None:
        """``pscluster scale`` posted a request (SIGUSR2): carried out at the next turn."""
        self.asked = True

    def number_from(self, wall: float) -> None:
        """Requests to the chief are numbered from ``wall`` (the job's start, in ms) on."""
        self.membership_seq = int(wall * 1000)

    def next_seq(self) -> int:
        """The number of the next request to the chief or a worker (their answers carry it)."""
        self.membership_seq += 1
        return self.membership_seq

    def answered(self, event: dict[str, Any]) -> None:
        """A ``membership`` event (the async chief's, a sync worker's): the answer to request ``event["seq"]``."""
        self.membership_answers[event["seq"]] = event

    def between_turns(self, ex: JobExecutor[Any]) -> None:
        self.notice_turn(ex)
        if self.elastic is None and (self.away or self.dropped):    # an async worker host out in place, or
            if not self.take_back_away(ex):                          # one a ps moved off: back when it answers
                self.take_back_dropped(ex)
        if self.elastic is not None:
            # A standby for the next relaunch (the resize after a host's loss restarts the chief).
            self.train.refill_once_trained(ex)
            self.elastic_turn(ex)
        elif ex.plan.mode == Mode.SYNC:
            # Any sync resize restarts the whole group, and a drain (a notice may come to any job)
            # starts the new workers while the old ones train only in standbys that are ready:
            # without them the pause was 4.3-7.1 s, not 0.8-1.4 (benchmarks.drain). Not at once,
            # beside the job's own start; 3 s, not later: with 10 s a drain in a job's first ~20 s
            # found them importing (4 of 20 lab trials), with 30 s in its first ~45 s, and the
            # suite was no faster for 30 (ci1 16.2 min of local lane with 10 s, ci2 16.7 with 30 s,
            # docs/testing.md); a job that ends within 15 s at its rate gets them at 10 s, as
            # before (a short job does not pay for their import). sync-ps has no such overlap.
            self.train.refill_once_trained(ex, after=WARM_STANDBYS_AFTER, worth=WARM_STANDBYS_WORTH,
                                           latest=WARM_STANDBYS_LATEST)
        if not self.asked:
            return
        self.asked = False
        request = take_request(ex.store, ex.name)
        if request is None:
            return
        try:
            request.secrets_for(ex.secrets)     # a scope the job cannot serve: refused, the job goes on
        except PsclusterError as exc:
            post_result(ex.store, ex.name, ok=False, message=exc.message)
            return
        try:
            text = self.drain(ex, request) if request.drain or request.undrain else self.resize(ex, request)
        except PsclusterError as exc:
            post_result(ex.store, ex.name, ok=False, message=exc.message)
            raise ex.fail(exc, "the resize failed") from None
        post_result(ex.store, ex.name, ok=True, message=text)

    def resize(self, ex: JobExecutor[Any], request: ResizeRequest, unreachable: frozenset[str] | set[str] = frozenset(),
               event: dict[str, Any] | None = None, save: bool = True, restart: tuple[str, ...] = ()) -> str:
        # With a host lost, the leader usually cannot save: TensorFlow holds the async chief's
        # writes behind its closure on the lost worker, so after 2 s without a closure returning
        # it ends without saving (roles/async_driver.py). The grace is short for any mode, and
        # the job goes back to its last periodic checkpoint.
        """Checkpoint, stop the job's processes, bring the servers in line with the new plan, and
        start the training processes again from the checkpoint at the new size."""
        old, new = ex.plan, request.plan
        # A drain's budget: the overlap below gives way in time for the usual path to fit in it.
        by = None if request.within is None else ex.clock() + request.within - RESIZE_RESERVE
        gates_by = None if request.within is None else ex.clock() + request.within - GATE_RESERVE
        diff = resize.restarting(resize.diff_plans(old, new), restart)
        resize.check_resize(old, new, diff, job_live=True)
        ex.use_secrets(request.secrets_for(ex.secrets))     # the new plan's scope, keyed by its host names
        # Servers started again (a ps moved from a lost host) start with the new ones, in one wait:
        # the job is stuck meanwhile, and one after the other took 2.3 s + 2.4 s on the lab
        # (benchmarks.faults). A planned move (a drain: no host lost) trains on meanwhile, so the
        # moved ps starts now, and only the servers that keep their port start in the pause.
        early = resize.early_servers(old, new, diff, unreachable) if not restart or not unreachable else []
        if early:      # while the job still trains: their import stays out of the pause
            resize.start_early(ex.writer, ex.pool, ex.reporter, new, early, ex.secrets, root=ex.root,
                               idle=lambda: self.pump(ex))
        if not unreachable and resize.in_place(old, new, diff, early):
            text = self.resize_in_place(ex, request, diff)
            if text is not None:
                return text
        # While the job still trains: standbys for the relaunch, so that it skips TensorFlow's import
        # (not for a lost host: the job is stuck until the restart, which a wait would only delay).
        wait = drain_standby_wait(request.within, overlap=new.mode == Mode.SYNC)
        ready = self.standbys_for(ex, new, wait=wait) if not unreachable else []
        workers_before, workers_after = len(old.tasks_of("worker")), len(new.tasks_of("worker"))
        if new.mode != Mode.ASYNC and not request.keep_global_batch and workers_after != workers_before:
            # Each worker keeps its batch (torchrun's model): the global batch follows the size.
            global_batch = ex.progress.global_batch_size or 0
            if global_batch:
                per_worker = max(1, global_batch // workers_before)
                self.train.set_batch_size(per_worker * workers_after)
        # Sync: the new workers start in those standbys while the old ones train (roles/handover.py).
        following = self.start_next(ex, new, diff, by=by, gates_by=gates_by) if not unreachable else {}
        ex.reporter.emit("message", text=f"resizing: {resize.describe(diff, new)}; "
                                         f"the job checkpoints first (up to {self.train.stop_grace:g} s)")
        began = ex.clock()        # the pause: from here to the relaunch
        ex.set_job(state=JobState.RESTARTING, message="resizing")
        early_keys = {record.key for _, record, _ in following.values()}
        first = [r for r in first_to_stop(old, ex.state.live_records())
                 if r.host not in unreachable and r.key not in early_keys]
        grace = min(self.train.stop_grace, LOST_HOST_GRACE) if unreachable else self.train.stop_grace
        if first and not save:      # a ps is lost: the leader cannot save (half its variables are gone)
            ex.stop(first, grace=0.5, first_signal="KILL")
        elif first and grace > 0:
            ex.stop(first, grace=grace)
            self.train.read_final_events(ex, first)
        stopped_at = ex.clock()
        leaving = [w for w in ex.watched.values() if w.kind is not ProcessKind.SERVER or w.task.name in diff.stop]
        # A lost host's processes are not stopped now (an SSH connection to it would wait out its
        # timeout inside the pause): they stay recorded, and its rejoin or `down` stops them.
        ex.forget_and_stop([w for w in leaving if w.record.host not in unreachable])
        ex.forget(leaving)
        resize.apply_plan(ex.writer, ex.pool, ex.reporter, old, new, diff, ex.secrets, root=ex.root,
                          standbys=False, unreachable=unreachable,
                          known_hosts=[link.host for link in self.dropped.values()],
                          started=[task.name for task in early], running=[*ready, *early_keys])
        ex.replace_plan(new)
        self.train.follow_plan(new)
        self.train.sync_job_files(ex, new)      # on hosts that just joined (the code came with apply_plan)
        ex.watch_servers()
        ex.set_job(workers=workers_after, message=None)
        launched_at = ex.clock()
        go = {"seq": self.next_seq(), "go": True}

        def launch(task: TaskSpec) -> Watched:       # in parallel, a thread per task
            if task.name not in following:
                return self.train.launch_train(ex, task, resume=True)
            _, record, events = following[task.name]
            hostops.tell(ex.pool.get(new.host(task.host)), events, go)
            return self.train.adopt_started(ex, task, record, events)
        ex.launch_many(new.training_tasks + new.evaluator_tasks, launch)
        ex.retarget()
        ex.set_job(state=JobState.RUNNING)
        overlap = ", the new workers started while the old ones trained" if following else ""
        text = (f"resized ({request.reason}): {resize.describe(diff, new)}; {workers_before} -> {workers_after} "
                f"worker(s), resuming from "
                f"{'step %d' % ex.progress.checkpoint_step if ex.progress.checkpoint_step else 'the start'} "
                f"({ex.clock() - began:.2f} s to restart: {stopped_at - began:.2f} to checkpoint and stop, "
                f"{launched_at - stopped_at:.2f} to apply the plan, {ex.clock() - launched_at:.2f} to launch{overlap})")
        ex.reporter.emit("message", text=text)
        ex.announce("resized", {"old": resize.membership(old), "new": resize.membership(new),
                                "reason": request.reason, "workers": workers_after,
                                "checkpoint_step": ex.progress.checkpoint_step, **(event or {})})
        return text

    def drain(self, ex: JobExecutor[Any], request: ResizeRequest) -> str:
        """``pscluster drain HOST`` / ``undrain HOST`` (cluster/supervision/drain_job.py): in place
        when the request keeps HOST's tasks in the plan (an async worker host), else the resize of
        ``scale``; the drained state is the supervisor's to record while the job runs (its writes
        carry the whole state)."""
        from ..lifecycle.drain import DRAINED, mark_drained
        host = request.drain or request.undrain or ""
        same = {t.name: t.host for t in request.plan.tasks} == {t.name: t.host for t in ex.plan.tasks}
        if same and request.drain and ex.plan.mode == Mode.ASYNC and \
                any(t.host == host and t.role == "ps" for t in ex.plan.tasks):
            text = self.move_ps_in_place(ex, host, request)      # (it records the host drained)
            if not text:
                text = self.drain_ps(ex, host, request)
                self.ps_in_place.pop(host, None)     # (a ps of two moved in place: the restart re-planned both)
                ex.writer.change(lambda s: mark_drained(s.drained, host, DRAINED))
            return text
        if same and any(t.host == host for t in ex.plan.tasks):
            return self.drain_in_place(ex, request)
        text = self.resize(ex, request)
        ex.writer.change(lambda s: mark_drained(s.drained, host, None if request.undrain else DRAINED))
        return text

    def drain_in_place(self, ex: JobExecutor[Any], request: ResizeRequest) -> str:
        """``pscluster drain HOST`` of an async job's worker host (cluster/lifecycle/drain.py): a
        planned drop-out. HOST's workers keep their tasks and indices in the plan (nobody is
        renumbered, the chief restarts nothing); the chief first lets their closures in flight end
        and gives them no other (:meth:`retire_first`, roles/workerloss.py), then their servers
        stop, so no step is lost or done twice (if the chief does not answer in time, the
        worker-loss path runs a cut closure again on the other workers). ``undrain HOST``: the host is watched as one out in place (:attr:`away`), and
        :meth:`bring_back` starts its servers again; the chief takes them back."""
        from ..lifecycle.drain import mark_drained
        host = request.drain or request.undrain or ""
        if ex.plan.mode != Mode.ASYNC:
            raise PsclusterError(f"{host}: an in-place drain is for async jobs; this one runs {ex.plan.mode}")
        tasks = sorted(t.name for t in ex.plan.tasks if t.host == host)
        if request.undrain:
            self.away[host] = HostLink(ex.plan.host(host), ex.pool, clock=ex.clock)
            self.away[host].set_targets([], [])
            ex.writer.change(lambda s: mark_drained(s.drained, host, None))
            return f"undrain {host}: {', '.join(tasks)} start again; the chief takes them back in place"
        if any(ex.plan.task(name).role != "worker" for name in tasks):
            raise PsclusterError(f"{host} runs more than workers: it cannot leave in place")
        began = ex.clock()
        first = self.retire_first(ex, [ex.plan.task(name) for name in tasks], request.within)
        left = self.leave_in_place(ex, host)
        seconds = ex.clock() - began
        text = (f"resized ({request.reason}) in place: {', '.join(tasks)} left{first}, training goes on with "
                f"{left} worker(s), nothing restored ({seconds:.2f} s)")
        ex.reporter.emit("message", text=text)
        ex.set_job(workers=left, message=None)
        ex.announce("resized", {"reason": request.reason, "workers": left, "in_place": True, "drained": host,
                                "tasks": tasks, "step": ex.progress.step, "seconds": round(seconds, 3)})
        return text

    @staticmethod
    def leave_in_place(ex: JobExecutor[Any], host: str) -> int:
        """The end of an in-place drain, once the chief no longer needs ``host``: its processes
        (a relaunch's standbys too) stop, it is recorded drained, the streams follow; how many
        workers train on elsewhere."""
        from ..lifecycle.drain import DRAINED, mark_drained
        ex.forget_and_stop([w for w in ex.watched.values() if w.task.host == host])
        standbys = [r for r in ex.state.live_records() if r.host == host]
        if standbys:
            ex.stop(standbys, grace=CLEANUP_GRACE)
        ex.writer.change(lambda s: mark_drained(s.drained, host, DRAINED))
        ex.retarget()
        return sum(1 for t in ex.plan.tasks_of("worker") if t.host != host and t.host not in ex.state.drained)

    def move_ps_in_place(self, ex: JobExecutor[Any], host: str, request: ResizeRequest) -> str | None:
        """``pscluster drain HOST`` of an async job's ps host, in place: the host's workers end
        their closures (:meth:`retire_first`), then the chief moves each of its ps tasks'
        variables to another ps of the cluster (roles/psmove.py: a read, one cluster update, a
        write; TensorFlow 2.21 takes no new server in place, so the destination is a ps the
        chief had from its start, on a host that stays) and traces its functions again, and the
        host's servers stop: nothing restored, nothing restarted. The drain's message; None when
        it cannot be done in place (no other ps, no chief that trains, the chief refused or did
        not answer: said), and :meth:`drain_ps` moves the ps through a restart instead."""
        tasks = [t for t in ex.plan.tasks if t.host == host]
        chief = ex.current(self.train.leader_name)
        gone = ex.lost_hosts() | set(self.dropped) | \
            set(self.away) | set(ex.state.drained) | set(self.ps_in_place) | {host}
        targets = [t for t in ex.plan.tasks_of("ps") if t.host not in gone]
        if any(t.role not in ("ps", "worker") for t in tasks):
            return None
        if not targets or chief is None or not chief.started or chief.done or chief.ended_at is not None \
                or not chief.record.events:
            why = ("no other ps of the cluster on a host that stays (TensorFlow takes no new ps server in "
                   "place)" if not targets else "the chief does not train")
            ex.reporter.emit("message", text=f"{host}'s ps cannot move in place ({why}): it moves through a "
                                             "checkpoint and a restart")
            return None
        began = ex.clock()
        workers = [t for t in tasks if t.role == "worker"]
        first = self.retire_first(ex, workers, request.within) if workers else ""
        timeout = RETIRE_TIMEOUT * 3 if request.within is None else max(1.0, min(RETIRE_TIMEOUT * 3, request.within / 2))
        moved: dict[str, str] = {}
        held = dict(self.train.ps_variables)
        idle = {t.name for t in targets if held and not held.get(t.index)}
        by_index = {t.index: t for t in targets}
        for ps in (t for t in tasks if t.role == "ps"):
            to = by_index[ps_target(sorted(by_index), held, held.get(ps.index, 0))]
            seq = self.next_seq()
            try:
                hostops.tell(ex.pool.get(ex.plan.host(chief.task.host)), chief.record.events,
                             {"seq": seq, "move_ps": {"ps": ps.index, "to": to.index}})
            except PsclusterError as exc:
                answer: dict[str, Any] | None = {"refused": exc.message.splitlines()[0]}
            else:
                answer = self.pump_until(ex, lambda: self.membership_answers.get(seq), chief, timeout=timeout)
            if answer is None or answer.get("refused") or not answer.get("moved"):
                refusal = answer.get("refused") if answer else f"no answer in {timeout:.0f} s"
                ex.reporter.emit("message", level="warning",
                                 text=f"the chief did not move {ps.name} in place ({refusal}): it moves through a "
                                      "checkpoint and a restart")
                if moved:       # one of two moved: the restart that follows re-plans both
                    self.ps_in_place[host] = sorted(moved)
                return None
            moved[ps.name] = to.name
        self.ps_in_place[host] = sorted(moved)
        left = self.leave_in_place(ex, host)
        seconds = ex.clock() - began
        where = ", ".join(f"{name} moved to {to} ({ex.plan.task(to).host}{', idle until then' if to in idle else ''})"
                          for name, to in moved.items())
        text = (f"resized ({request.reason}) in place: {where}" +
                (f"; {', '.join(t.name for t in workers)} left{first}" if workers else "") +
                f"; training goes on with {left} worker(s), nothing restored ({seconds:.2f} s)")
        ex.reporter.emit("message", text=text)
        ex.set_job(workers=left, message=None)
        ex.announce("resized", {"reason": request.reason, "workers": left, "in_place": True, "drained": host,
                                "tasks": sorted(t.name for t in tasks), "step": ex.progress.step,
                                "moved": {name: {"from": host, "to": ex.plan.task(to).host, "target": to}
                                          for name, to in moved.items()},
                                "seconds": round(seconds, 3)})
        return text

    def settle_moved_ps(self, ex: JobExecutor[Any], why: str) -> bool:
        """A new chief must start while ps tasks moved in place (:attr:`ps_in_place`) are still in
        the plan with no server: re-plan them (each drained host's ps to where a lost ps goes,
        :meth:`_move_ps`), every standing server started again with that plan and the chief
        restarted from its newest checkpoint. True if it did (the recovery is done); False: no
        such ps is left in the plan, the usual recovery follows."""
        restarted = False
        for host in list(self.ps_in_place):
            if any(t.host == host for t in ex.plan.tasks_of("ps")):
                if self._move_ps(ex, host, why, 1, planned=True, save=False) is None:
                    return restarted
                restarted = True
            del self.ps_in_place[host]
        return restarted

    def retire_first(self, ex: JobExecutor[Any], workers: list[TaskSpec], within: float | None) -> str:
        """Ask the async chief to let ``workers`` end their closures in flight and take no other
        (roles/workerloss.py) before their servers stop, so that no closure is cut and run again
        elsewhere. What the drain's message says of it."""
        chief = ex.current(self.train.leader_name)
        if chief is None or not chief.started or chief.done or chief.ended_at is not None or not chief.record.events:
            return ""       # no chief that trains: nothing is in flight
        seq = self.next_seq()
        spec = ex.plan.cluster_spec.get("worker", [])
        addresses = [spec[task.index] for task in workers if task.index < len(spec)]
        timeout = RETIRE_TIMEOUT if within is None else max(1.0, min(RETIRE_TIMEOUT, within / 3))
        try:
            hostops.tell(ex.pool.get(ex.plan.host(chief.task.host)), chief.record.events,
                         {"seq": seq, "retire": addresses})
        except PsclusterError as exc:
            answer: dict[str, Any] | None = {"refused": exc.message.splitlines()[0]}
        else:
            answer = self.pump_until(ex, lambda: self.membership_answers.get(seq), chief, timeout=timeout)
        if answer is not None and not answer.get("refused"):
            return f" after their closures ended ({answer.get('seconds', 0):.2f} s)"
        why = answer.get("refused") if answer else f"no answer in {timeout:.0f} s"
        ex.reporter.emit("message", level="warning",
                         text=f"the chief did not hold {', '.join(t.name for t in workers)} back ({why}): a closure "
                              "in flight there runs again on another worker")
        return f" (a closure in flight there runs again: {why})"

    def start_next(self, ex: JobExecutor[Any], new: ClusterPlan, diff: PlanDiff, *, by: float | None = None,
                   gates_by: float | None = None) -> dict[str, tuple[TaskSpec, ProcessRecord, str]]:
        """Sync to sync with every new worker's standby ready: the old workers release their ports
        and the new ones start on them, in their standbys, up to the gate before their restore
        (roles/handover.py). {task name: (task, record, events file)} of the processes started,
        which wait there for :meth:`resize`'s go; empty when the resize takes the usual path
        (not sync, a standby missing, a release or a start that failed: said in a warning). With
        a drain's budget, the release is waited for until ``by`` (the usual path's reserve
        before its end), the gates until ``gates_by`` (once the new workers started, only the old
        ones' checkpoint and stop is left to fit), and new workers not at their gates by then go
        on their way (:meth:`wait_at_gates`)."""
        old = ex.plan
        standbys = resize.match_standbys(new.training_tasks, ex.state.processes)
        running = self.overlap_candidates(ex, new, diff, standbys)
        if not running:
            return {}
        why = self.ask_to_release(ex, old, running, by=by)
        if why:
            return self.not_overlapped(ex, why)
        following: dict[str, tuple[TaskSpec, ProcessRecord, str]] = {}
        try:
            self.train.sync_job_files(ex, new)      # the job's own files, on a host that joins
            for task in new.training_tasks:
                record, argv, env, events = self.train.train_process(ex, task, new, resume=True, gate=True)
                started = start_task(ex.writer, ex.pool, new, task, record, argv=argv, env=env,
                                     reporter=ex.reporter, standby=standbys[task.name])
                following[task.name] = (task, started, events)
            late = self.wait_at_gates(ex, new, following, by=gates_by)     # (None with by: not a drain)
            if late:
                ex.reporter.emit("message", text=f"{', '.join(late)} not at the gate by the drain's budget: "
                                                 "the old workers stop now, the new ones go once there")
        except PsclusterError as exc:
            records = [record for _, record, _ in following.values()]
            if records:
                stopped, _ = stop_records(resize.knowing_hosts(old, new), records, ex.pool, ex.reporter,
                                          grace=DEFAULT_GRACE)
                ex.writer.change(lambda s: s.replace_records(stopped))
            return self.not_overlapped(ex, exc.message.splitlines()[0])
        return following

    def overlap_candidates(self, ex: JobExecutor[Any], new: ClusterPlan, diff: PlanDiff,
                           standbys: dict[str, ProcessRecord | None]) -> list[Watched]:
        """The running workers to hand over from, or [] when the new group cannot start beside
        them (resize.can_overlap, a worker not running, GPUs that cannot be shared: said)."""
        if not resize.can_overlap(ex.plan, new, diff, {name: s.host if s else None for name, s in standbys.items()}):
            return []
        running = [w for w in ex.watched.values() if w.kind is ProcessKind.TRAIN and w.task.role == "worker"]
        if not running or any(not w.started or w.done or w.ended_at is not None or not w.record.events for w in running):
            return []
        for task in new.training_tasks:
            gpus = self.standby_gpus(ex, new, standbys[task.name])
            if not resize.gpus_allow_overlap(task, gpus):
                why = ("its standby has not said which GPUs it sees" if gpus is None else
                       f"it sees {gpus} GPU(s) without memory growth ({resize.GROWTH}=true)")
                ex.reporter.emit("message", text=f"the new workers start after the old ones stop: {task.name}: {why}")
                return []
        return running

    def ask_to_release(self, ex: JobExecutor[Any], old: ClusterPlan, running: list[Watched], *,
                       by: float | None = None) -> str | None:
        """Ask each running worker to release its port and wait for every answer; why not, if
        one could not be asked or did not answer in time."""
        asked: dict[int, Watched] = {}
        try:
            for item in running:
                seq = self.next_seq()
                asked[seq] = item
                hostops.tell(ex.pool.get(old.host(item.task.host)), item.record.events or "",
                             {"seq": seq, "release": True})
        except PsclusterError as exc:
            return f"could not ask the workers to release their ports: {exc.message.splitlines()[0]}"
        deadline = _until(ex.clock() + HANDOVER_TIMEOUT, by)
        while not all(seq in self.membership_answers for seq in asked):
            if ex.clock() > deadline or any(w.ended_at is not None or w.done for w in asked.values()):
                return "a worker did not release its port"
            self.pump(ex)
            ex.sleep(LOOP_SECONDS)
        return None

    def wait_at_gates(self, ex: JobExecutor[Any], new: ClusterPlan,
                      following: dict[str, tuple[TaskSpec, ProcessRecord, str]], *, by: float | None = None
                      ) -> list[str]:
        """Wait until every new worker waits at its gate; PsclusterError if one ended first or
        they were not all there within STANDBY_WAIT. A drain's budget (``by``) that ends first
        leaves the late ones running (their names): they are past TensorFlow's import and
        building, and their ``go`` waits for them in their control file, so the old workers
        stop in time and the new ones pass when there (started afresh instead, a drain in a
        sync job's first seconds paused 4.8 s here, benchmarks.drain --at 0.2)."""
        pending, ready_by = dict(following), _until(ex.clock() + STANDBY_WAIT, by)
        while pending:
            for name, (task, record, events) in list(pending.items()):
                transport = ex.pool.get(new.host(task.host))
                if hostops.read(transport, gate_file(events), limit=16).exists:
                    del pending[name]
                elif hostops.read(transport, record.exit_file, limit=16).exists:
                    raise PsclusterError(f"{name} ended before it was ready (see {record.log} on {task.host})")
            if pending and ex.clock() > ready_by:
                if by is not None and ready_by == by:
                    return sorted(pending)
                raise PsclusterError(f"{', '.join(sorted(pending))} not ready in time ({STANDBY_WAIT:g} s)")
            self.pump(ex)
            if pending:
                ex.sleep(LOOP_SECONDS)
        return []

    @staticmethod
    def standby_gpus(ex: JobExecutor[Any], plan: ClusterPlan, standby: ProcessRecord | None) -> int | None:
        """The GPUs a ready standby said it sees (roles/standby.py's ready file; None: unknown)."""
        if standby is None:
            return None
        try:
            chunk = hostops.read(ex.pool.get(plan.host(standby.host)), ready_file(standby.log), limit=4096)
            gpus = json.loads(chunk.data).get("gpus") if chunk.exists else None
        except (PsclusterError, ValueError, AttributeError):
            return None
        return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else None

    def not_overlapped(self, ex: JobExecutor[Any], why: str) -> dict[str, tuple[TaskSpec, ProcessRecord, str]]:
        ex.reporter.emit("message", level="warning",
                         text=f"the new workers start after the old ones stop ({why})")
        return {}

    def standbys_for(self, ex: JobExecutor[Any], new: ClusterPlan, wait: float = STANDBY_WAIT) -> list[str]:
        """Before a relaunch at ``new``: a standby for each of its training tasks that has none,
        and wait (reading the job's streams) until they imported TensorFlow, up to ``wait`` s.
        Best effort (a standby that is late or failed is passed over and its task starts
        afresh); the keys of the standbys started, which the resize keeps. Standbys that were
        started already (a sync job refills its own after a while) and are still importing are
        waited for too: a sync overlap needs every one ready."""
        self.stop_idle_standbys(ex, new)
        names = [task.name for task in new.training_tasks if ex.state.standby(task.name) is None]
        records: dict[str, ProcessRecord] = {}
        if names:
            try:
                sync_new_hosts(ex.writer, new, ex.pool, ex.reporter, ex.root)   # a host new to the cluster needs the code
                records, failures = start_standbys(ex.writer, ex.pool, new, ex.secrets, names)
            except PsclusterError as exc:
                records, failures = {}, [Failure("the relaunch", exc)]
            report_standbys(Reporter(), {}, failures)
            if records:
                ex.reporter.emit("message", text=f"starting {len(records)} standby(s) for the relaunch while the job trains")
        importing = {name: record for name, record in resize.match_standbys(new.training_tasks, ex.state.processes).items()
                     if record is not None and name not in records}
        pending, deadline = {**importing, **records}, ex.clock() + wait
        while pending and ex.clock() < deadline:
            for name, record in list(pending.items()):
                try:
                    if hostops.read(ex.pool.get(new.host(record.host)), ready_file(record.log), limit=16).exists:
                        del pending[name]
                except PsclusterError:
                    del pending[name]           # its host does not answer: the relaunch will say more
            self.pump(ex)
            ex.sleep(0.3)
        return [record.key for record in records.values()]

    @staticmethod
    def stop_idle_standbys(ex: JobExecutor[Any], new: ClusterPlan) -> None:
        """Stop now the live standbys on hosts where ``new`` runs no training task (a drained
        host's): no task can take them (a standby serves a task on its own host:
        resize.match_standbys), and until :func:`resize.apply_plan` stopped them in the pause they
        went on importing TensorFlow beside the ones the relaunch waits for (three imports and
        three trainers on this machine's 2 cores kept one standby 16 s from ready, benchmarks.drain).
        Best effort: what is not stopped here, apply_plan stops (a host that does not answer now
        is left to it, not waited on while the budget runs)."""
        hosts = {task.host for task in new.training_tasks}
        lost = ex.lost_hosts()
        idle = [r for r in ex.state.live_records()
                if r.kind == ProcessKind.STANDBY and r.host not in hosts and r.host not in lost]
        if idle:
            stopped, _ = stop_records(resize.knowing_hosts(ex.plan, new), idle, ex.pool, ex.reporter,
                                      grace=DEFAULT_GRACE)
            ex.writer.change(lambda s: s.replace_records(stopped))

    def resize_in_place(self, ex: JobExecutor[Any], request: ResizeRequest, diff: PlanDiff) -> str | None:
        """Async, workers added after the last one or the last ones removed: the running chief takes
        the new cluster between two closures (roles/membership.py), with no checkpoint and no
        restart. None if it did not (it refused, ended, or did not answer): then the caller
        restarts the job from a checkpoint."""
        old, new = ex.plan, request.plan
        chief = ex.current(self.train.leader_name)
        if chief is None or not chief.started or chief.done or chief.ended_at is not None or not chief.record.events:
            return None
        seq = self.next_seq()
        began = ex.clock()
        ex.reporter.emit("message", text=f"resizing in place: {resize.describe(diff, new)}; "
                                         "the chief takes the new cluster between two steps")
        try:
            hostops.tell(ex.pool.get(ex.plan.host(chief.task.host)), chief.record.events,
                         {"seq": seq, "cluster": new.cluster_spec})
        except PsclusterError as exc:
            answer: dict[str, Any] | None = {"refused": exc.message.splitlines()[0]}
        else:
            answer = self.pump_until(ex, lambda: self.membership_answers.get(seq), chief, timeout=IN_PLACE_TIMEOUT)
        if answer is None or answer.get("refused"):
            why = answer.get("refused") if answer else "it did not answer"
            ex.reporter.emit("message", level="warning",
                             text=f"the chief did not take the change in place ({why}); restarting from a checkpoint")
            return None
        ex.forget_and_stop([w for w in ex.watched.values()
                            if w.kind is ProcessKind.SERVER and w.task.name in diff.stop])
        running = [w.record.key for w in ex.watched.values() if w.kind is ProcessKind.TRAIN]
        resize.apply_plan(ex.writer, ex.pool, ex.reporter, old, new, diff, ex.secrets, root=ex.root,
                          standbys=False, started=diff.start, running=running)
        ex.replace_plan(new)
        ex.watch_servers()
        workers_before, workers_after = len(old.tasks_of("worker")), len(new.tasks_of("worker"))
        ex.set_job(workers=workers_after, message=None)
        ex.retarget()
        text = (f"resized ({request.reason}) in place: {resize.describe(diff, new)}; {workers_before} -> "
                f"{workers_after} worker(s) at step {answer.get('step')}, no restart "
                f"({ex.clock() - began:.1f} s; the chief paused {answer.get('seconds', 0):.1f} s)")
        ex.reporter.emit("message", text=text)
        ex.announce("resized", {"old": resize.membership(old), "new": resize.membership(new),
                                "reason": request.reason, "workers": workers_after, "in_place": True,
                                "step": answer.get("step")})
        return text

    def pump(self, ex: JobExecutor[Any]) -> None:
        """What the loop does besides deciding: read the hosts' watch streams (the job's events)
        and keep its record current, e.g. while a resize waits for new servers or for the chief."""
        now = ex.clock()
        ex.read_streams(now)
        ex.publish(now)

    def pump_until(self, ex: JobExecutor[Any], found: Callable[[], dict[str, Any] | None], chief: Watched, *,
                   timeout: float) -> dict[str, Any] | None:
        """:meth:`pump` until ``found()`` gives an answer, the chief ends, or ``timeout`` passes (None)."""
        deadline = ex.clock() + timeout
        while True:
            now = ex.clock()
            self.pump(ex)
            answer = found()
            if answer is not None:
                return answer
            if chief.ended_at is not None or now > deadline:
                return None
            ex.sleep(LOOP_SECONDS)

    # ------------------------------------------------------------------ elastic (train --min-workers, --hosts-from)
    def drop_out(self, ex: JobExecutor[Any], host: str, why: str, task: str | None = None) -> bool:
        """A worker host lost beyond --host-timeout (``task`` None: all its tasks go, and it is
        watched until it answers again), or a worker that used up its restarts (``task``: its
        host runs one worker fewer): go on without it if at least --min-workers remain (True),
        else let the job fail as before (False)."""
        min_workers = self.elastic.min_workers if self.elastic is not None else None
        if (min_workers is None and task is None and ex.plan.mode == Mode.ASYNC
                and ex.rules.policy is not RestartPolicy.NEVER):
            # Async goes on in place without a lost worker host, --min-workers or not: the chief
            # already trains on without it (issue 41) and takes it back when it answers. Under
            # --restart-policy never a lost host fails the job at once, as asked.
            min_workers = 1
        if min_workers is None:
            return False
        counts = resize.worker_counts(ex.plan)
        others = sorted({t.role for t in ex.plan.tasks if t.host == host} - {"worker"})
        if task is None and "ps" in others and ex.plan.mode == Mode.ASYNC:
            return self.move_ps(ex, host, why, min_workers)
        verdict = core.drop_out(counts, host=host, other_roles=others, task=task, min_workers=min_workers)
        if not verdict.drop:
            ex.reporter.emit("message", level="warning", text=f"cannot go on without {task or host}: {verdict.why}")
            return False
        if task is None and ex.plan.mode == Mode.ASYNC:
            return self.go_on_in_place(ex, host, why, verdict.workers_left)
        fewer = counts.get(host, 0) if task is None else 1
        dropped_left = {h: 0 for h in self.dropped}
        try:
            new = resize.replan(ex.plan, port_base=ex.state.port_base, limit=ex.state.limit,
                                counts={**counts, **dropped_left, host: counts.get(host, 0) - fewer}, pool=None,
                                moved=self.moved)
        except PsclusterError as exc:          # the inventory is gone or changed: no re-plan from it
            ex.reporter.emit("message", level="warning", text=f"cannot go on without {task or host}: {exc.message}")
            return False
        if task is None:
            self.dropped[host] = HostLink(ex.plan.host(host), ex.pool, clock=ex.clock)
            self.dropped[host].set_targets([], [])
        self.resize(ex, ResizeRequest(new, reason=f"{task or host} {why}"),
                        unreachable={host} if task is None else set())
        return True

    def move_ps(self, ex: JobExecutor[Any], host: str, why: str, min_workers: int) -> bool:
        """A lost ps host's ps moves (:meth:`_move_ps`); False: it could not, the reason said."""
        return self._move_ps(ex, host, why, min_workers, planned=False) is not None

    def drain_ps(self, ex: JobExecutor[Any], host: str, request: ResizeRequest) -> str:
        """``pscluster drain HOST`` of an async job's ps host: the ps moves, no step lost
        (:meth:`_move_ps`, ``planned``, within the drain's time); the resize's message."""
        return self._move_ps(ex, host, f"drained ({request.reason})", 1, planned=True, within=request.within) or ""

    def _move_ps(self, ex: JobExecutor[Any], host: str, why: str, min_workers: int, *,
                 planned: bool, within: float | None = None, save: bool | None = None) -> str | None:
        """Async: ``host``, which runs a ps (and maybe workers, not the chief), is lost for good. Its
        ps tasks move to the host :func:`core.place_lost_ps` picks, its workers leave the plan (the
        host is watched until it answers: its leftovers are stopped then, and it rejoins as a worker
        host), and the job restarts from its newest save (a snapshot, every ``--snapshot-every``
        s), as after a killed ps; the servers that stay start again too (they would route the ps's
        name to its old address: resize.restarting). The resize's message; None (the job fails as
        before, the reason said) when no host can take the ps, too few workers would be left, or the
        inventory cannot be re-planned.

        ``planned``: ``pscluster drain HOST`` (its ps still answers). The same move, but the job
        checkpoints at one step first, so the chief restarts from there and no step is lost, and
        the host's processes are stopped as any resize stops them; the resize's message is
        returned, and a move that cannot be made raises :class:`PsclusterError` (the drain then
        checkpoints the job instead). ``save`` False: the chief cannot save (it ended), the job
        restarts from its newest checkpoint (default: ``planned``)."""
        def refuse(reason: str) -> None:
            if planned:
                raise PsclusterError(f"{host}'s ps cannot move: {reason}")
            ex.reporter.emit("message", level="warning", text=f"cannot go on without {host}: {reason}")
        found = self._ps_replan(ex, host, min_workers, planned=planned, refuse=refuse)
        if found is None:
            return None
        move, new = found
        if not planned:
            self.dropped[host] = HostLink(ex.plan.host(host), ex.pool, clock=ex.clock)
            self.dropped[host].set_targets([], [])
        where = ", ".join(f"{name} moved from {host} to {move.to}" for name in move.tasks)
        ex.reporter.emit("message", level="info" if planned else "warning",
                         text=f"{host} {why}: {where} ({move.why}); its workers leave the job; " +
                              ("the job checkpoints at one step and restarts there" if planned and save is not False
                               else "restarting from the newest snapshot"))
        text = self.resize(ex, ResizeRequest(new, reason=f"{where} ({host} {why})", within=within),
                           unreachable=set() if planned else {host}, save=planned if save is None else save,
                           restart=tuple(t.name for t in new.standing_tasks if t.name not in move.tasks),
                           event={"moved": {name: {"from": host, "to": move.to, "target": new.task(name).target}
                                            for name in move.tasks}, ("drained" if planned else "lost"): host,
                                  "why": move.why})
        ex.set_job(message=None if planned else text)
        return text

    def _ps_replan(self, ex: JobExecutor[Any], host: str, min_workers: int, *, planned: bool,
                   refuse: Callable[[str], None]) -> tuple[core.PsMove, ClusterPlan] | None:
        """Where ``host``'s ps tasks go (:func:`core.place_lost_ps`) and the plan without ``host``'s
        workers, its ps there (kept there by every later re-plan: :attr:`moved`); None after
        ``refuse(reason)`` when no host can take them, too few workers would be left, or the
        inventory cannot be re-planned."""
        # (a drained host takes no ps either: it is about to go)
        lost = ex.lost_hosts() | set(self.dropped) | \
            set(self.away) | set(ex.state.drained) | set(self.ps_in_place)
        try:
            spares = resize.ps_spares(ex.plan)
        except PsclusterError as exc:
            refuse(exc.message)
            return None
        move = core.place_lost_ps([(t.name, t.host) for t in ex.plan.tasks], lost=host, mode=ex.plan.mode,
                                  # (a planned move is no failure's restart: --restart-policy never allows it)
                                  policy=RestartPolicy.ON_FAILURE if planned else ex.rules.policy, spares=spares,
                                  unreachable=lost - {host})
        if move.to is None:
            refuse(f"its {', '.join(move.tasks)} cannot move: {move.why}")
            return None
        counts = resize.worker_counts(ex.plan)
        verdict = core.drop_out(counts, host=host, other_roles=(), task=None, min_workers=min_workers)
        if not verdict.drop:
            refuse(verdict.why)
            return None
        moved = {**self.moved, **{name: (move.to, None) for name in move.tasks}}
        try:
            new = resize.replan(ex.plan, port_base=ex.state.port_base, limit=ex.state.limit, pool=None, moved=moved,
                                counts={**counts, **{h: 0 for h in self.dropped}, host: 0})
            resize.check_resize(ex.plan, new, resize.diff_plans(ex.plan, new), job_live=True)
        except PsclusterError as exc:          # the inventory is gone or changed, --firewall, no port
            refuse(exc.message.splitlines()[0])
            return None
        self.moved = {name: (new.task(name).host, new.task(name).port) for name in moved}
        return move, new

    def settle_drained_ps(self, ex: JobExecutor[Any]) -> None:
        """Before a job's processes start: a ps task still planned on a drained host (its variables
        moved in place under an earlier job, :meth:`move_ps_in_place`; its server is gone) goes
        where a lost ps goes, and every standing server starts again with that plan (TensorFlow
        routes a task name to the address it first knew: resize.restarting); else the new chief
        could not reach it.

        Raises:
            PsclusterError: no host can take it (said, with the drained host)."""
        from ..lifecycle.drain import DRAINED
        hosts = sorted({t.host for t in ex.plan.tasks_of("ps") if ex.state.drained.get(t.host) == DRAINED})
        for host in hosts:
            def refuse(reason: str, host: str = host) -> None:
                raise PsclusterError(f"{host} is drained but still holds a ps in the plan, which cannot move: {reason}",
                                     hint=f"'pscluster undrain {host}' to use it again, or 'pscluster down' and up "
                                          "with an inventory without it")
            found = self._ps_replan(ex, host, 1, planned=True, refuse=refuse)
            if found is None:       # (refuse raised)
                continue
            move, new = found
            old = ex.plan
            diff = resize.restarting(resize.diff_plans(old, new),
                                     [t.name for t in new.standing_tasks if t.name not in move.tasks])
            ex.reporter.emit("message", text=f"{host} is drained: {', '.join(move.tasks)} moved to {move.to} before "
                                             f"the job starts ({move.why}); the standing servers start again")
            resize.apply_plan(ex.writer, ex.pool, ex.reporter, old, new, diff, ex.secrets, root=ex.root)
            ex.replace_plan(new)
            self.train.follow_plan(new)

    def go_on_in_place(self, ex: JobExecutor[Any], host: str, why: str, left: int) -> bool:
        """Async: a lost worker host stays in the plan. The chief already trains on without its
        workers (their closures ran again elsewhere, roles/workerloss.py): nothing is restored or
        restarted. Its processes are no longer watched; once the host answers, they are started
        again on the same ports (:meth:`elastic_turn`) and the chief takes them back."""
        tasks = sorted(w.task.name for w in ex.watched.values() if w.task.host == host)
        ex.forget([w for w in ex.watched.values() if w.task.host == host])
        self.away[host] = HostLink(ex.plan.host(host), ex.pool, clock=ex.clock)
        self.away[host].set_targets([], [])
        ex.retarget()
        text = (f"{host} {why}: training goes on in place with {left} worker(s), nothing restored; "
                f"{', '.join(tasks)} train again when {host} answers")
        ex.reporter.emit("message", level="warning", text=text)
        ex.set_job(state=JobState.RUNNING, message=text)
        ex.announce("resized", {"reason": f"{host} {why}", "workers": left, "in_place": True, "away": host,
                                "tasks": tasks})
        return True

    def bring_back(self, ex: JobExecutor[Any], host: str) -> None:
        """An async worker host kept in the plan answers again. Its workers' servers that still
        run and answer (a link that healed) are watched again: the chief has already taken them
        back (roles/workerloss.py probes them). The others (a rebooted host) are stopped if they
        linger and start again on their ports; the chief takes them back once they answer."""
        tasks = [t for t in ex.plan.tasks if t.host == host and t.standing]
        kept = self.answering_servers(ex, host, tasks)
        for task_name, record in kept.items():
            ex.watch_server(ex.plan.task(task_name), record)
        restart = [t for t in tasks if t.name not in kept]
        if restart:
            self.stop_leftovers(ex, host)
        try:
            for task in restart:
                ex.launch_server(task)
        except PsclusterError as exc:
            ex.reporter.emit("message", level="warning",
                             text=f"{host} answers, but its workers did not start ({exc.message.splitlines()[0]}); "
                                  "trying again")
            return
        self.away.pop(host).close()
        ex.retarget()
        how = (f"{', '.join(sorted(kept))} still running" if kept else "") + \
              ("; " if kept and restart else "") + \
              (f"{', '.join(t.name for t in restart)} started again" if restart else "")
        text = f"{host} is back: {how}; the chief takes them back in place"
        ex.reporter.emit("message", text=text)
        # (an undrained host's workers count again: drain_in_place counted them out)
        ex.set_job(message=None, workers=sum(1 for t in ex.plan.tasks_of("worker")
                                             if t.host not in self.away and t.host not in ex.state.drained))
        ex.announce("resized", {"reason": f"{host} is back", "in_place": True, "back": host,
                                "tasks": [t.name for t in tasks], "workers": len(ex.plan.tasks_of("worker"))})

    def answering_servers(self, ex: JobExecutor[Any], host: str, tasks: list[TaskSpec]) -> dict[str, ProcessRecord]:
        """The newest live record of each of ``tasks`` whose server answers the gRPC probe now."""
        records: dict[str, ProcessRecord] = {}
        for record in ex.state.live_records():
            if record.host == host and record.kind == ProcessKind.SERVER and record.key not in ex.watched:
                records[record.task] = record
        wanted = {t.name for t in tasks}
        answering = {}
        with Prober() as prober:
            for name, record in records.items():
                if name not in wanted:
                    continue
                task = ex.plan.task(name)
                # A second, longer try before a running server is given up for restarted: right
                # after a heal the host's connection is new and a loaded machine answered the first
                # 2 s probe too late (the clean-clone run's elastic lab test: worker:2 restarted).
                for timeout in REJOIN_PROBES:
                    try:
                        result = prober.probe(task.target, timeout=timeout, via=ex.pool.get(ex.plan.host(host)))
                    except PsclusterError:
                        continue
                    if result.ok:
                        answering[name] = record
                        break
        return answering

    def elastic_turn(self, ex: JobExecutor[Any]) -> None:
        """Take back a dropped host that answers again; follow the discovery command."""
        assert self.elastic is not None
        if self.take_back_away(ex):
            return
        if self.take_back_dropped(ex):
            return
        if self.discovery is not None:
            wanted = self.discovery.poll(ex.clock(), ex.reporter)
            if wanted is not None:
                self.follow_discovery(ex, wanted)

    def take_back_dropped(self, ex: JobExecutor[Any]) -> bool:
        """A host left out of the plan while lost that answers again: what it still runs is
        stopped, and it rejoins with its workers (one per turn)."""
        now = ex.clock()
        for host, link in list(self.dropped.items()):
            if link.poll(now) and now >= self.next_rejoin:        # its watch stream answers: the host is back
                self.next_rejoin = now + REJOIN_RETRY
                self.stop_leftovers(ex, host)
                self.rejoin(ex, {host: None}, f"{host} is back")
                return True
        return False

    def take_back_away(self, ex: JobExecutor[Any]) -> bool:
        """An async worker host out in place that answers again is brought back (one per turn)."""
        now = ex.clock()
        for host, link in list(self.away.items()):
            if link.poll(now) and now >= self.next_rejoin:
                self.next_rejoin = now + REJOIN_RETRY
                self.bring_back(ex, host)
                return True
        return False

    def close(self) -> None:
        """When the job ends, however it ends: a discovery or notice command still running is
        stopped, and so is a drain started for a notice."""
        if self.discovery is not None:
            self.discovery.close()
        if self.notices is not None:
            self.notices.close()

    def notice_turn(self, ex: JobExecutor[Any]) -> None:
        """Notices (--notices-from, a host's watch told to go) become drains, one host once
        (cluster/supervision/notices.py)."""
        if self.notices is None:
            options = self.options
            source = NoticeSource(options.notices_from, options.notices_every) if options.notices_from else None
            self.notices = NoticeDrains(state_dir=ex.store.root, name=ex.name, source=source,
                                        default_deadline=options.notice_deadline or DEFAULT_NOTICE_DEADLINE)
        said = {host: notice for host, link in ex.links.items() if (notice := link.take_notice()) is not None}
        for host in [host for host, notice in said.items() if notice.get("signal") == "SIGTERM"]:
            # Slurm ending the whole job (NODE_FAIL, scancel, its time limit) signals every step:
            # the tasks there got the SIGTERM themselves and checkpoint on it; a drain of the
            # chief's host would only stop this supervisor (exit 143) before it could say why.
            ended = ex.pool.get(ex.plan.host(host)).ended()
            if ended is not None and ended.whole_job:
                said.pop(host)
                ex.reporter.emit("message", level="warning",
                                 text=f"{host}'s watch got SIGTERM: {ended.message.split(': ', 1)[-1].splitlines()[0]}; "
                                      "no drain (its tasks got the signal too)")
        self.notices.turn(now=ex.clock(), wall=ex.wall(), reporter=ex.reporter, watch_notices=said,
                          hosts={task.host for task in ex.plan.tasks}, drained=set(ex.state.drained))

    def stop_leftovers(self, ex: JobExecutor[Any], host: str) -> None:
        """What a lost host still runs of this cluster (its processes lived on behind the cut: a
        server would hold its port): stopped before the host rejoins."""
        left = [r for r in ex.state.live_records() if r.host == host and r.key not in ex.watched]
        if left:
            ex.reporter.emit("message", text=f"{host} answers again: stopping {len(left)} process(es) it still "
                                             "runs from before it was lost")
            plan = resize.knowing_hosts(ex.plan, self.dropped[host].host) if host in self.dropped else ex.plan
            stopped, errors = stop_records(plan, left, ex.pool, ex.reporter, grace=CLEANUP_GRACE)
            ex.writer.change(lambda s: s.replace_records(stopped))
            for where, error in errors.items():
                ex.reporter.emit("message", level="warning",
                                 text=f"could not stop what {where} still runs: {error.message.splitlines()[0]}")

    def follow_discovery(self, ex: JobExecutor[Any], wanted: dict[str, int | None]) -> None:
        """Grow or shrink to the discovery command's host list (hosts of the inventory's worker group)."""
        from ..inventory import load_inventory
        try:
            inventory_workers = load_inventory(resize.pinned_inventory(ex.plan)).hosts_of("worker")
        except PsclusterError as exc:
            ex.reporter.emit("message", level="warning", text=f"--hosts-from: {exc.message.splitlines()[0]}")
            return
        unknown = sorted(set(wanted) - set(inventory_workers))
        if unknown:
            ex.reporter.emit("message", level="warning",
                             text=f"--hosts-from names {', '.join(unknown)}, not in the inventory's worker group: "
                                  "left out")
        counts = resize.worker_counts(ex.plan)
        target = {host: (0 if host not in wanted else wanted[host]) for host in inventory_workers}
        changed = {h: c for h, c in target.items() if (c if c is not None else -1) != counts.get(h, 0)
                   and not (c is None and h in counts)}
        if not changed or not any(c != 0 for c in target.values()):
            return
        self.rejoin(ex, changed, "--hosts-from")

    def rejoin(self, ex: JobExecutor[Any], changes: dict[str, int | None], reason: str) -> None:
        """Resize to the current plan with ``changes`` (None: the inventory's count), after a
        preflight of the hosts that get tasks; a failed preflight waits for the next try."""
        counts: dict[str, int] = dict(resize.worker_counts(ex.plan))
        for host in changes:
            counts.pop(host, None)
        fixed = {h: c for h, c in changes.items() if c is not None}
        dropped_left = {h: 0 for h in self.dropped if h not in changes}
        try:
            new = resize.replan(ex.plan, port_base=ex.state.port_base, limit=ex.state.limit,
                                counts={**counts, **dropped_left, **fixed}, pool=ex.pool, moved=self.moved)
            diff = resize.diff_plans(ex.plan, new)
            if diff.empty:      # (a ps host back that runs no worker: nothing to take back)
                self.forget_dropped(changes)
                return
            resize.check_resize(ex.plan, new, diff, job_live=True)
            to_check = resize.plan_changes_for(new, diff, ex.plan)
            if to_check.tasks:
                from ..hosts.preflight import run_preflight
                report = run_preflight(to_check, ex.pool, Reporter())
                if not report.ok:
                    failed = next(r for r in report.results if not r.ok)
                    ex.reporter.emit("message", level="warning",
                                     text=f"{reason}: not yet ({failed.host}: {failed.check}: {failed.detail}); trying again later")
                    return
        except PsclusterError as exc:
            ex.reporter.emit("message", level="warning", text=f"{reason}: {exc.message.splitlines()[0]}")
            return
        self.forget_dropped(changes)
        self.resize(ex, ResizeRequest(new, reason=reason))

    def forget_dropped(self, hosts: Iterable[str]) -> None:
        for host in hosts:
            link = self.dropped.pop(host, None)
            if link is not None:
                link.close()
