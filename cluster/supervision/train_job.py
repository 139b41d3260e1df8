"""``pscluster train``: running a training job on a cluster that is up, and keeping it alive.

The job's training processes run ``python -m roles.train`` (the chief in async mode, every
worker in sync and sync-ps) and report through their events files, which each host's watch
stream pushes here. :class:`TrainJob` is the training job kind of the shared executor
(:mod:`cluster.supervision.executor`; :func:`train_executor` makes one that runs it), its resizes
are :mod:`cluster.supervision.train_resize`'s; the decisions -- what counts as failed, whether to
restart, what a restart means in each mode -- are the pure functions of
:mod:`cluster.supervision.core`. Recovery by mode, as TensorFlow allows (docs/platform-notes.md TF5, TF6):

========  ==================================================================================
async     worker server died: restart it on its host and port; the coordinator takes it back.
          ps died: restart it; the chief then fails and is restarted from the last checkpoint.
          chief died: restart it (after every server answers); it restores and continues.
sync      any worker died or froze: stop the whole group, relaunch every worker, resume.
sync-ps   any worker or ps died or froze: stop workers and ps, restart the ps, relaunch the
          workers, resume (the ps keep queues and accumulators of the old graph otherwise).
========  ==================================================================================

An ``evaluator`` task, when the inventory has one, runs ``python -m roles.evaluate`` beside the
trainers in every mode (side-car evaluation: the trainers then never evaluate periodically); it is
restarted alone, given up rather than fail the job, and stopped once it evaluated the final
checkpoint (docs/supervision.md).

Job states (``state.job.state``): starting, running, restarting, done, failed, stopped.
"""
from __future__ import annotations

import re
import signal
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

from ..hosts import hostops
from ..hosts.codesync import needs_sync, sync_and_record, sync_files
from ..contracts import Mode, ProcessKind
from ..errors import Failure, PsclusterError, UsageError
from ..events import Reporter
from .jobstop import first_to_stop
from ..lifecycle.tasks import check_ports_free, report_standbys, start_standbys, task_env
from .elastic import Elastic
from ..secrets import Secrets
from ..jobrecord import JobProgress
from ..plan import ClusterPlan, TaskSpec
from ..state import ProcessRecord, StateStore
from . import core
from .executor import JobExecutor, restart_rules
from .jobkind import JobKind, Watched
from ..layout import gate_file, host_layout, leader_layout
from .train_resize import Resizer
from .train_spec import (EventTail, JobRef, JobOptions, job_files, job_path_on,
                       path_on, summarize, train_argv, with_evaluator)
from ..transport import TransportPool

__all__ = ["TrainJob", "train_executor"]


_PS_DEVICE = re.compile(r"/job:ps/(?:replica:\d+/)?task:(\d+)(?:/|$)")


def ps_index(device: str) -> int | None:
    """The ps task of a variable's device (``/job:ps/replica:0/task:1/device:CPU:0`` -> 1)."""
    found = _PS_DEVICE.search(device)
    return int(found.group(1)) if found else None


class TrainJob(JobKind):
    """The ``train`` job kind (:class:`~cluster.supervision.jobkind.JobKind`): one training job,
    which the executor runs to its end: done, failed for good, or interrupted."""

    entry = "train"
    failure_prefix = "training failed"
    one_shot = False

    def __init__(self, job: JobRef, options: JobOptions, elastic: Elastic | None = None):
        self.job = job
        self.options = options
        self.tails: dict[str, EventTail] = {}     # process key -> its events file
        self.result: dict[str, Any] | None = None
        self.last_step = 0
        self.steps_redone = 0
        self.placement_shown = False
        # Variables per ps task index, from the chief's newest "placement" event (an in-place ps
        # move sends one): where a drained ps's variables go (drain.ps_target).
        self.ps_variables: dict[int, int] = {}
        self.evals: list[dict[str, Any]] = []       # {"step", "val_loss", "val_accuracy", "seconds", "task"} from "eval" events
        self.leader_done_at: float | None = None
        self.trainer_options = options    # what the trainers are told (with_evaluator when there is one)
        self.evaluated_step: int | None = None    # the evaluator's newest evaluated checkpoint step
        self.standby_tasks: set[str] = set()      # tasks whose standby a launch took (or passed over)
        # Whether the leader reported a step since the last launch that took a standby: an
        # elastic job refills its standbys only then, so that their TensorFlow import does not
        # take the CPU a relaunch's start needs (the pause of a resize).
        self.trained_since_launch = False
        self.trained_from: float | None = None    # when the leader first reported a step after that launch
        self.trained_from_step: int | None = None  # and that step
        self.resizer = Resizer(self, elastic)     # `pscluster scale`, --min-workers, --hosts-from
        self.told_lost: set[str] = set()          # hosts whose loss the async chief was told of
        # The stall watch (core.stall_limit): the longest gap between two of the leader's events
        # once it trained, and the task the async chief last said it waits on.
        self.slowest_unit = 0.0
        self.waiting_on: str | None = None
        self.stall_shown = False

    @contextmanager
    def running(self, ex: JobExecutor[Any]) -> Iterator[None]:
        """Around the job (:meth:`JobExecutor.run`): SIGUSR2 (from ``pscluster scale``) asks for a
        resize between two turns of the loop; after a finished job, new standbys for the next."""
        previous = None
        try:
            previous = signal.signal(signal.SIGUSR2, lambda _s, _f: self.resizer.ask())
        except ValueError:      # not the main thread: a resize is then seen by polling the request file
            pass
        try:
            yield
        finally:
            self.resizer.close()
            if previous is not None:
                signal.signal(signal.SIGUSR2, previous)
        self.refill_standbys(ex)     # only after a job that ended well (an exception skips this)

    def before_interrupt(self, ex: JobExecutor[Any]) -> None:
        """Checkpoint on stop (:func:`cluster.supervision.jobstop.first_to_stop`): the leader (async chief,
        sync-ps worker 0) -- in sync mode every worker, which then agree on one step -- gets
        SIGTERM first and up to ``--stop-grace`` seconds to save and exit; then the executor stops
        the rest as usual."""
        first = first_to_stop(ex.plan, ex.state.live_records())
        if first:
            leader = ", ".join(r.task for r in first)
            try:
                if self.options.stop_grace > 0:
                    ex.reporter.emit("message", level="warning",
                                     text=f"asking {leader} to checkpoint and stop (up to {self.options.stop_grace:g} s; "
                                          "Ctrl-C again to kill at once)")
                    ex.stop(first, grace=self.options.stop_grace)
                    self.read_final_events(ex, first)
                else:
                    # --stop-grace 0: no checkpoint on stop. A SIGTERM would still reach the
                    # trainer's stop handler (it saves within a few hundred ms, before the
                    # general grace runs out), so the leader is killed at once.
                    ex.stop(first, grace=0.5, first_signal="KILL")
            except KeyboardInterrupt:
                pass

    def interrupted(self, ex: JobExecutor[Any]) -> tuple[str, str | None]:
        return (f"job {ex.job_id} stopped: its processes were stopped; the standing servers are still up",
                "'pscluster down' stops them")

    def read_final_events(self, ex: JobExecutor[Any], records: list[ProcessRecord]) -> None:
        """The events a stopped leader wrote last (its checkpoint), into the job record."""
        before = ex.state.job.checkpoint_step if ex.state.job else None
        for record in records:
            tail, watched = self.tails.get(record.key), ex.watched.get(record.key)
            if tail is not None and watched is not None:
                for event in tail.poll(ex.pool.get(ex.plan.host(record.host))):
                    self.on_event(ex, watched, event, ex.clock())
        job = ex.state.job
        if job is not None and job.checkpoint_step != before:
            ex.reporter.emit("message", text=f"checkpoint saved at step {job.checkpoint_step}: {job.checkpoint}; "
                                             "continue with 'train --resume'")


    def job_name(self) -> str:
        return self.job.name

    def command(self) -> tuple[str, ...]:
        return (self.job.name,)

    def new_job(self, ex: JobExecutor[Any], progress: JobProgress) -> JobProgress:
        self.resizer.number_from(ex.wall())
        self.leader = ex.plan.leader
        self.checkpoint_dir = self.options.checkpoint_dir or leader_layout(ex.plan).checkpoint_dir(self.job.name)
        if ex.plan.evaluator_tasks:
            self.trainer_options = with_evaluator(self.options)
        return progress.updated(checkpoint_dir=self.checkpoint_dir, stop_grace=self.options.stop_grace)

    def watchdog(self, ex: JobExecutor[Any]) -> core.Watchdog:
        sync = ex.plan.mode != Mode.ASYNC
        return core.Watchdog(start_timeout=self.options.start_timeout + 15,
                             stall_after=core.stall_limit(self.options.stall_timeout, slowest_unit=self.slowest_unit,
                                                          sync=sync, collective_timeout=self.options.collective_timeout),
                             leader=self.leader.name, blame_frozen=sync, waiting_on=self.waiting_on)

    def prepare(self, ex: JobExecutor[Any]) -> None:
        """Sync code and the job where needed; a ps still planned on a drained host moves
        (:meth:`Resizer.settle_drained_ps`); check the training ports are free."""
        sync_and_record(ex.writer, ex.plan, ex.pool, ex.reporter, ex.root)
        self.resizer.settle_drained_ps(ex)
        self.sync_job_files(ex, ex.plan, announce=True)
        check_ports_free(ex.plan.training_tasks, ex.pool, ex.plan)
        check_checkpoints_shared(ex.plan, ex.pool, self.checkpoint_dir, self.leader, ex.plan.evaluator_tasks)

    def launch_group(self, ex: JobExecutor[Any]) -> None:
        ex.watch_servers()
        ex.reporter.emit("phase", name="train", detail=f"{self.job.name} on {ex.name!r} ({ex.plan.mode}, "
                                                        f"{len(ex.plan.tasks_of('worker'))} worker(s))")
        tasks = ex.plan.training_tasks + ex.plan.evaluator_tasks
        ex.launch_many(tasks, lambda task: self.launch_train(ex, task, resume=self.options.resume))
        for evaluator in ex.plan.evaluator_tasks:
            cadence = self.trainer_options.checkpoint_every
            ex.reporter.emit("message", text=f"{evaluator.name} evaluates each checkpoint in {self.checkpoint_dir} "
                                             + (f"(every {cadence} steps)" if cadence else
                                                "(only the final one: give --checkpoint-every or --eval-every)"))

    # ------------------------------------------------------------------ what its resizes ask of it (train_resize.TrainSide)
    @property
    def leader_name(self) -> str:
        return self.leader.name

    @property
    def stop_grace(self) -> float:
        return self.options.stop_grace

    def follow_plan(self, plan: ClusterPlan) -> None:
        """The job goes on at ``plan``, led by its leader task."""
        self.leader = plan.leader

    def set_batch_size(self, batch_size: int) -> None:
        """The trainers' ``--batch-size`` from the next launch on (a sync resize keeps each worker's batch)."""
        self.trainer_options = replace(self.trainer_options, batch_size=batch_size)

    def sync_job_files(self, ex: JobExecutor[Any], plan: ClusterPlan, *, announce: bool = False) -> None:
        """The job's own files on the hosts of ``plan`` that do not share this checkout (an example
        job comes with the code); ``announce``: as the ``sync`` phase."""
        if self.job.example or not any(needs_sync(h, ex.root) for h in plan.hosts):
            return
        if announce:
            ex.reporter.emit("phase", name="sync", detail=f"job {self.job.name}")
        sync_files(plan, ex.pool, ex.reporter, job_files(self.job, plan), ex.root)

    def refill_once_trained(self, ex: JobExecutor[Any], after: float = 0.0, *, worth: float = 0.0,
                            latest: float = 0.0) -> None:
        """Once the leader trains again after a launch that took standbys (not inside a
        relaunch's pause, where their import would slow the new processes' start), and has for
        ``after`` seconds: a standby for each such task's next relaunch, which then skips
        TensorFlow's import. ``worth``: before ``latest`` seconds of training, only if the job
        has that many seconds left at its rate since then (a job about to end would not use
        them, and their import would only slow it)."""
        if after and (self.trained_from is None or ex.clock() - self.trained_from < after):
            return
        if worth and ex.clock() - (self.trained_from or 0.0) < latest and self.seconds_left(ex) < worth:
            return
        if self.standby_tasks and self.trained_since_launch:
            self.refill_standbys(ex)
            self.standby_tasks.clear()

    def seconds_left(self, ex: JobExecutor[Any]) -> float:
        """The job's seconds to its last step at the leader's rate since it trained again
        (infinite when unknown: no total, no step yet)."""
        total = ex.state.job.steps_total if ex.state.job else None
        if not total or self.trained_from is None or self.trained_from_step is None:
            return float("inf")
        done, took = self.last_step - self.trained_from_step, ex.clock() - self.trained_from
        if done <= 0 or took <= 0:
            return float("inf")
        return max(0, total - self.last_step) * took / done

    def relaunch(self, ex: JobExecutor[Any], task: TaskSpec) -> Watched:
        return self.launch_train(ex, task, resume=True)

    def train_process(self, ex: JobExecutor[Any], task: TaskSpec, plan: ClusterPlan, *, resume: bool,
                      gate: bool = False) -> tuple[ProcessRecord, list[str], dict[str, str], str]:
        """One training process of ``plan`` (the record, its argv, environment and events file), not
        started."""
        leader = plan.leader
        attempt = ex.attempt(task, ProcessKind.TRAIN)
        log, events = host_layout(task, plan).job_paths(ex.job_id, task.role, task.index, attempt)
        record = ProcessRecord.for_task(task.name, task.host, ProcessKind.TRAIN, attempt, log, job=ex.job_id, events=events)
        # The leader writes TensorBoard summaries; the restarts before this launch are one of them.
        # A side-car evaluator that shares the leader's workdir path writes its scalars beside them
        # (`<job>/eval`, one more run in `pscluster tensorboard`); elsewhere in <checkpoint dir>/eval.
        shares = task.role == "evaluator" and task.workdir == leader.workdir
        summaries = leader_layout(plan).summary_dir(self.job.name) if task.name == leader.name or shares else None
        argv = train_argv(task, mode=plan.mode, job_path=job_path_on(plan.host(task.host), self.job, plan, ex.root),
                          events_path=events, checkpoint_dir=self.checkpoint_dir, options=self.trainer_options,
                          resume=resume, summaries=summaries, restarts=sum(ex.job_restarts().values()),
                          gate=gate_file(events) if gate else None)
        return record, argv, task_env(plan, task, ex.secrets, standing=False), events

    def launch_train(self, ex: JobExecutor[Any], task: TaskSpec, *, resume: bool) -> Watched:
        record, argv, env, events = self.train_process(ex, task, ex.plan, resume=resume)
        self.tails[record.key] = EventTail(events)
        standby = ex.state.standby(task.name) if task.role != "evaluator" else None
        if standby is not None:
            self.standby_tasks.add(task.name)
            self.trained_since_launch = False
        return ex.launch(task, record, argv=argv, env=env, kind=ProcessKind.TRAIN,
                         files=(events,), standby=standby)

    def adopt_started(self, ex: JobExecutor[Any], task: TaskSpec, record: ProcessRecord, events: str) -> Watched:
        """Watch a training process started before the job reached it (a sync resize's next
        incarnation, roles/handover.py), as :meth:`launch_train` watches the ones it starts."""
        self.tails[record.key] = EventTail(events)
        self.standby_tasks.add(task.name)
        self.trained_since_launch = False
        return ex.adopt(task, record, ProcessKind.TRAIN, files=(events,))

    def recovery(self, ex: JobExecutor[Any], incident: core.Incident) -> core.Recovery:
        failed = incident.proc
        if self.resizer.ps_in_place and ex.plan.mode == Mode.ASYNC and failed.kind is ProcessKind.TRAIN \
                and not failed.is_evaluator:
            # A new chief could not reach the ps tasks moved in place (their servers are gone):
            # the plan moves them first, which restarts the chief (the recovery is done).
            if self.resizer.settle_moved_ps(ex, f"drained earlier ({failed.task} restarts)"):
                return core.Recovery(wait_hosts=(), stop=())
        out = self.out_in_place(ex)
        return core.train_recovery(Mode(ex.plan.mode), incident.proc, ex.views(),
                                   hosts=[t.host for t in ex.plan.tasks if t.host not in out],
                                   servers=[t.name for t in ex.plan.standing_tasks],
                                   trainers=[t.name for t in ex.plan.training_tasks])

    def complete(self, ex: JobExecutor[Any], now: float) -> bool:
        final_step = self.result.get("global_step") if self.result else None
        for watched in ex.watched.values():
            if (watched.task.role == "evaluator" and final_step is not None and self.evaluated_step is not None
                    and self.evaluated_step >= final_step):
                watched.finished = True   # it evaluated the final checkpoint: stopped below if still up
            if watched.kind is ProcessKind.TRAIN and watched.done and watched.view().clean_exit:
                if watched.task.name == self.leader.name:
                    self.leader_done_at = self.leader_done_at or now
                else:
                    watched.finished = True   # a worker that finished its share (may end before the leader)
        outcome = core.train_outcome(ex.views(), leader=self.leader.name, leader_done_at=self.leader_done_at,
                                     now=now)
        if not outcome.complete:
            return False
        if outcome.stop:
            ex.stop([ex.watched[key].record for key in outcome.stop], grace=self.options.grace)
        ex.stop_job_processes(grace=1.0)
        return True

    def summary(self, ex: JobExecutor[Any]) -> dict[str, Any]:
        report = summarize(self.result or {}, wall_seconds=ex.clock() - ex.began, restarts=ex.job_restarts(),
                           steps_redone=self.steps_redone, job=self.job, evals=self.evals, progress=ex.state.job)
        # --deadline: the trainers checkpointed and ended short of the budget (train exits 4).
        total = ex.state.job.steps_total if ex.state.job else None
        report["deadline_reached"] = bool(self.options.deadline is not None and total is not None
                                          and (report.get("global_step") or 0) < total)
        return report

    # ------------------------------------------------------------------ resizes (cluster/supervision/train_resize.py)
    def between_turns(self, ex: JobExecutor[Any]) -> None:
        self.resizer.between_turns(ex)
        self.tell_lost(ex)
        self.watch_stall(ex, ex.clock())

    def tell_lost(self, ex: JobExecutor[Any]) -> None:
        """Async: the moment a worker host stops answering (its heartbeat), tell the chief to shut
        its connections to that host's workers, so that a closure hung on one fails now rather
        than after the chief's own 20 s or more (roles/closures.py; the chief answers with a
        ``membership`` event, ``cut``). Once per loss."""
        if ex.plan.mode != Mode.ASYNC:
            return
        for host, link in ex.links.items():
            if link.lost_since is None:
                self.told_lost.discard(host)
                continue
            if host in self.told_lost:
                continue
            self.told_lost.add(host)
            if self.leader.host != host and any(t.host == host and t.role == "ps" for t in ex.plan.tasks):
                self.chief_standby_ahead(ex, f"{host} runs a ps and does not answer")
            workers = [t.target for t in ex.plan.tasks if t.host == host and t.role == "worker"]
            chief = ex.current(self.leader.name)
            if not workers or chief is None or chief.ended_at is not None or not chief.record.events \
                    or chief.task.host == host:
                continue
            try:
                hostops.tell(ex.pool.get(ex.plan.host(chief.task.host)), chief.record.events,
                             {"seq": self.resizer.next_seq(), "cut": workers})
            except PsclusterError as exc:
                ex.reporter.emit("message", level="warning",
                                 text=f"could not tell the chief that {host} is lost: {exc.message.splitlines()[0]}")

    def drop_out(self, ex: JobExecutor[Any], host: str, why: str, task: str | None = None) -> bool:
        return self.resizer.drop_out(ex, host, why, task)

    def on_exit(self, ex: JobExecutor[Any], watched: Watched, now: float) -> None:
        if watched.kind is ProcessKind.SERVER and watched.task.role == "ps":
            self.chief_standby_ahead(ex, f"{watched.task.name} ended")

    def chief_standby_ahead(self, ex: JobExecutor[Any], why: str) -> None:
        """Async: a ps ended, or its host stopped answering. The chief restarts next (it fails with
        its ps; a ps host lost past --host-timeout moves its ps and restarts the chief), so a
        standby for it now, if it has none, imports TensorFlow while the job waits (up to
        --host-timeout for a lost host) rather than in the restart's pause. Best effort; where
        the hosts allow standbys (``pscluster_standby``)."""
        if ex.plan.mode != Mode.ASYNC or ex.state.standby(self.leader.name) is not None:
            return
        try:
            records, failures = start_standbys(ex.writer, ex.pool, ex.plan, ex.secrets, [self.leader.name])
        except PsclusterError as exc:
            records, failures = {}, [Failure(f"{self.leader.name}'s restart", exc)]
        if records:
            ex.reporter.emit("message", text=f"{why}: a standby for {self.leader.name} imports TensorFlow ahead "
                                             "of its restart")
        report_standbys(Reporter(), {}, failures)

    def out_in_place(self, ex: JobExecutor[Any]) -> set[str]:
        # A host away in place, or drained in place (still in the plan): the chief trains without
        # its workers, and bring_back / undrain starts them again, not a chief's recovery.
        return set(self.resizer.away) | {t.host for t in ex.plan.tasks if t.host in ex.state.drained}

    def refill_standbys(self, ex: JobExecutor[Any]) -> None:
        """A standby (roles/standby.py) for each training task whose own this job took (a
        cluster without standbys, e.g. `pscluster bench`'s, gets none), so that the next
        ``train`` finds TensorFlow imported too. A failure here is a warning: the job is done."""
        if not self.standby_tasks:
            return
        try:
            _, failures = start_standbys(ex.writer, ex.pool, ex.plan, ex.secrets, self.standby_tasks)
        except PsclusterError as exc:       # e.g. `down` took the cluster over meanwhile
            failures = [Failure("the next job", exc)]
        report_standbys(ex.reporter, {}, failures)

    # ------------------------------------------------------------------ events
    def on_chunk(self, ex: JobExecutor[Any], watched: Watched, chunk: hostops.FileChunk, now: float) -> None:
        tail = self.tails.get(watched.record.key)
        if tail is None:
            return
        for event in tail.feed(chunk):
            self.on_event(ex, watched, event, now)

    def on_event(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float) -> None:
        """One event of a trainer's events file: ``waiting`` and ``worker`` (the async chief's, not
        progress) first, then any other event counts as a sign of life and goes to its handler
        (``EVENT_HANDLERS``); an event of no known kind only counts as a sign of life."""
        kind = event.get("event")
        is_leader = watched.task.name == self.leader.name
        if kind == "waiting":       # the async chief waits on a closure (roles/closures.py): not progress
            if is_leader:
                self.on_waiting(ex, event, now)
            return
        if kind == "worker":        # the async chief counted a worker out or back in (roles/workerloss.py)
            if is_leader:
                self.on_worker(ex, event)
            return
        if is_leader and self.trained_since_launch and watched.started:
            self.slowest_unit = max(self.slowest_unit, now - watched.last_event)
        watched.last_event = now
        if is_leader and (self.stall_shown or self.waiting_on):
            self.waiting_on, self.stall_shown = None, False
            ex.set_job(stalled_since=None, waiting_on=None)
            ex.reporter.emit("message", text=f"{self.leader.name} reports progress again")
        handler = self.EVENT_HANDLERS.get(str(kind))
        if handler is not None:
            handler(self, ex, watched, event, now, is_leader)

    def _on_start(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                  is_leader: bool) -> None:
        watched.started = True
        restored = event.get("restored_step") or 0
        if is_leader:
            if self.last_step > restored:
                self.steps_redone += self.last_step - restored
            ex.set_job(steps_total=event.get("steps_total"), restored_step=restored,
                       global_batch_size=event.get("global_batch_size"))
            if restored:
                ex.reporter.emit("message", text=f"{watched.task.name} resumed from step {restored}")

    def _on_placement(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                      is_leader: bool) -> None:
        held: dict[int, int] = {}
        for variable in event.get("variables", []):
            index = ps_index(str(variable.get("device") or ""))
            if index is not None:
                held[index] = held.get(index, 0) + 1
        self.ps_variables = held
        if self.placement_shown:
            return
        self.placement_shown = True
        devices: dict[str, int] = {}
        for variable in event.get("variables", []):
            devices[variable.get("device") or "?"] = devices.get(variable.get("device") or "?", 0) + 1
        shown = ", ".join(f"{count} on {device}" for device, count in sorted(devices.items()))
        ex.reporter.emit("message", text=f"variables: {shown}")

    def _on_progress(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                     is_leader: bool) -> None:
        step = event.get("step") or 0
        info = {"step": step, "epoch": event.get("epoch"), "loss": event.get("loss"),
                "examples_per_second": event.get("examples_per_second"),
                "rate": (event.get("per_worker") or {}).get(watched.task.name)}     # its own examples/s
        if is_leader:
            self.last_step = max(self.last_step, step)
            if not self.trained_since_launch:
                self.trained_from, self.trained_from_step = now, step
            self.trained_since_launch = True
            ex.set_job(state="running", step=step, steps_total=event.get("steps_total"),
                       epoch=event.get("epoch"), loss=event.get("loss"),
                       examples_per_second=event.get("examples_per_second"),
                       per_worker=event.get("per_worker") or None)
            ex.reporter.emit("job", **ex.job_record())
        if ex.plan.mode != Mode.ASYNC:
            ex.reporter.emit("job", worker_progress=(watched.task.name, info))

    def _on_eval(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                 is_leader: bool) -> None:
        if is_leader or watched.task.role == "evaluator":
            self.on_eval(ex, watched.task.name, event, now)

    def _on_checkpoint(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                       is_leader: bool) -> None:
        if is_leader:
            ex.set_job(checkpoint=event.get("path"), checkpoint_step=event.get("step"))

    def _on_done(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                 is_leader: bool) -> None:
        watched.done = True
        if is_leader:
            self.result = event

    def _on_error(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                  is_leader: bool) -> None:
        watched.error = event.get("message")

    def _on_membership(self, ex: JobExecutor[Any], watched: Watched, event: dict[str, Any], now: float,
                       is_leader: bool) -> None:
        if isinstance(event.get("seq"), int):     # the async chief's, a sync worker's
            self.resizer.answered(event)

    # The trainer's event kinds (roles/events.py) and what each does to the job (issue 43: a table,
    # where one dispatch of complexity 22 was).
    EVENT_HANDLERS: ClassVar[dict[str, Callable[..., None]]] = {
        "start": _on_start, "placement": _on_placement, "progress": _on_progress, "eval": _on_eval,
        "checkpoint": _on_checkpoint, "done": _on_done, "error": _on_error, "membership": _on_membership}

    def on_worker(self, ex: JobExecutor[Any], event: dict[str, Any]) -> None:
        """Say that the chief trains on without a worker, or took it back (no restart either way)."""
        worker = str(event.get("worker"))[:64]
        try:
            where = f"{worker}@{ex.plan.task(worker).host}"
        except KeyError:
            where = worker
        reason = str(event.get("reason") or "")[:200]
        if event.get("state") == "lost":
            text = (f"{where} is out of training ({reason}); its closure runs on another worker, "
                    f"the others train on (step {event.get('step')})")
        elif event.get("state") == "drained":
            text = f"{where} takes no new closure ({reason}; step {event.get('step')}); the others train on"
        else:
            text = f"{where} trains again ({reason}; step {event.get('step')})"
        if event.get("state") == "lost":
            ex.reporter.emit("message", level="warning", text=text)
        else:
            ex.reporter.emit("message", text=text)

    def on_waiting(self, ex: JobExecutor[Any], event: dict[str, Any], now: float) -> None:
        """The chief has collected no closure for ``seconds`` and waits on ``worker``'s."""
        worker = event.get("worker")
        try:
            self.waiting_on = f"{worker}@{ex.plan.task(worker).host}" if isinstance(worker, str) else None
        except KeyError:        # a worker that left meanwhile (or an event of an older plan)
            self.waiting_on = str(worker)[:64]
        self.show_stall(ex, now, silent_for=event.get("seconds"))

    def show_stall(self, ex: JobExecutor[Any], now: float, silent_for: Any = None) -> None:
        """Say once (status, attach, the live view) that the leader makes no progress, and on
        whom it waits; the stall watch acts later (:meth:`watchdog`)."""
        seconds = float(silent_for) if isinstance(silent_for, (int, float)) and silent_for >= 0 else 0.0
        if not self.stall_shown:
            self.stall_shown = True
            ex.set_job(stalled_since=ex.wall() - seconds, waiting_on=self.waiting_on)
            limit = core.stall_limit(self.options.stall_timeout, slowest_unit=self.slowest_unit,
                                     sync=ex.plan.mode != Mode.ASYNC, collective_timeout=self.options.collective_timeout)
            then = f"; restarted from its last checkpoint after {limit:.0f} s" if limit is not None else ""
            ex.reporter.emit("message", level="warning",
                             text=f"no progress for {seconds:.0f} s" + (f": waiting on {self.waiting_on}" if self.waiting_on
                                                                         else "") + then)
            ex.reporter.emit("job", **ex.job_record())
        elif self.waiting_on and ex.progress.waiting_on != self.waiting_on:
            ex.set_job(waiting_on=self.waiting_on)

    def watch_stall(self, ex: JobExecutor[Any], now: float) -> None:
        """Each turn: a leader silent for a few units of work is shown as stalled; sync modes
        name the worker heard from least recently (the one the collective waits for)."""
        if self.stall_shown or not self.trained_since_launch:
            return
        trainers = [w for w in ex.watched.values() if w.kind is ProcessKind.TRAIN and w.task.role != "evaluator"
                    and w.ended_at is None and not w.done]
        leader = next((w for w in trainers if w.task.name == self.leader.name and w.started), None)
        if leader is None or now - leader.last_event <= core.stall_shown_after(self.slowest_unit):
            return
        if ex.plan.mode != Mode.ASYNC and not self.waiting_on:
            quiet = min(trainers, key=lambda w: w.last_event)
            self.waiting_on = f"{quiet.task.name}@{quiet.task.host}"
        self.show_stall(ex, now, silent_for=now - leader.last_event)

    def on_eval(self, ex: JobExecutor[Any], task: str, event: dict[str, Any], now: float) -> None:
        step = event.get("step")
        if task != self.leader.name:
            if any(e["task"] == task and e["step"] == step for e in self.evals):
                return        # a restarted evaluator evaluates the latest checkpoint again
            self.evaluated_step = max(self.evaluated_step or 0, step or 0)
        # Seconds since `train` started, on this machine's clock: what time-to-accuracy means.
        self.evals.append({"step": step, "val_loss": event.get("val_loss"), "val_accuracy": event.get("val_accuracy"),
                           "seconds": round(now - ex.began, 2), "task": task})
        shown = ex.progress.val_step
        if shown is None or (step is not None and step >= shown):     # an older checkpoint's result comes late
            ex.set_job(val_accuracy=event.get("val_accuracy"), val_step=step)
        job = ex.progress
        # The trainer's eval carries its epoch; the side-car evaluator's does not. Epochs are
        # linear in steps (roles.settings.TrainPlan.epoch_at): scale the last progress's.
        epoch = event.get("epoch")
        if epoch is None and job.epoch and job.step and step is not None:
            epoch = round(job.epoch * step / job.step, 4)
        ex.reporter.emit("eval", task=task, step=step, val_loss=event.get("val_loss"),
                         val_accuracy=event.get("val_accuracy"), seconds=self.evals[-1]["seconds"], epoch=epoch)


def check_checkpoints_shared(plan: ClusterPlan, pool: TransportPool, checkpoint_dir: str, leader: TaskSpec,
                             evaluators: tuple[TaskSpec, ...]) -> None:
    """Before the job starts: an evaluator on another host than the leader must see the very folder
    the leader writes its checkpoints to (a shared filesystem: an NFS home, a cluster filesystem).
    Each host marks or reads the folder's id (hostctl ``fsid``, as code sync does for workdirs).

    Raises:
        UsageError: the evaluator's host sees another folder, or none (exit 2, naming both).
    """
    for evaluator in evaluators:
        if evaluator.host == leader.host:
            continue      # one host, one filesystem
        seen: dict[str, tuple[str, str]] = {}
        for task in (leader, evaluator):
            host = plan.host(task.host)
            seen[task.host] = hostops.fsid(pool.get(host), path_on(host, checkpoint_dir))
        if seen[leader.host] != seen[evaluator.host]:
            raise UsageError(f"{evaluator.name} on {evaluator.host} cannot read the checkpoints {leader.name} writes "
                             f"on {leader.host}: {checkpoint_dir} is not one shared folder ({leader.host}: "
                             f"{seen[leader.host][0]}, {evaluator.host}: {seen[evaluator.host][0]})",
                             hint=f"give --checkpoint-dir a folder on a filesystem both hosts share (an NFS home), "
                                  f"or put the evaluator on {leader.host}")


def train_executor(*, store: StateStore, name: str, job: JobRef, options: JobOptions, reporter: Reporter,
                   pool: TransportPool, root: Path, secrets: Secrets | None = None, elastic: Elastic | None = None,
                   **settings: Any) -> JobExecutor[TrainJob]:
    """The executor of a training job (``.run()`` runs it): ``options`` give its restart rules,
    host timeout and grace; ``settings`` go to :class:`JobExecutor` (clocks, ``detached``,
    ``replace``, ``keep``)."""
    return JobExecutor(TrainJob(job, options, elastic), store=store, name=name, reporter=reporter, pool=pool, root=root,
                       rules=restart_rules(options.restart_policy, options.max_restarts, options.backoff),
                       host_timeout=options.host_timeout, grace=options.grace, secrets=secrets, **settings)
