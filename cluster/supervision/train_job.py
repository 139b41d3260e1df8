"""``pscluster train``: running a training job on a cluster that is up, and keeping it alive.

The job's training processes run ``python -m roles.train`` (the chief in async mode, every
worker in sync and sync-ps) and report through their events files, which each host's watch
stream pushes here. :class:`Supervisor` is the training job on the shared executor
(:mod:`cluster.supervision.executor`); the decisions -- what counts as failed, whether to
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

import signal
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from ..hosts import hostops
from ..lifecycle import resize
from ..hosts.codesync import needs_sync, sync_code, sync_files
from ..contracts import JobState, Mode, ProcessKind
from ..errors import Failure, HostError, PsclusterError, UsageError
from ..events import Reporter
from .jobstop import first_to_stop
from ..lifecycle.tasks import report_standbys, start_standbys, stop_records, task_env
from ..lifecycle.resize import PlanDiff, ResizeRequest
from ..secrets import Secrets
from ..jobrecord import JobProgress
from ..plan import ClusterPlan, TaskSpec
from ..state import ProcessRecord, StateStore
from . import core
from .executor import LOOP_SECONDS, JobExecutor, JobFailed, JobInterrupted, Watched, restart_rules
from .links import HostLink
from ..layout import exit_file, ready_file
from .training import (EventTail, JobRef, JobOptions, host_layout, job_files, job_path_on, leader_layout, leader_task,
                       path_on, summarize, train_argv, with_evaluator)
from ..transport import TransportPool

__all__ = ["Supervisor", "JobFailed", "JobInterrupted"]

REJOIN_RETRY = 5.0      # seconds between two tries to take a host back (each runs preflight there)
LOST_HOST_GRACE = 5.0   # the leader's time to save when a resize leaves a lost host out
IN_PLACE_TIMEOUT = 60.0  # for the async chief to take a change in place (it looks between closures)
STANDBY_WAIT = 60.0      # for the standbys of a resize's relaunch to import TensorFlow (then: started afresh)


class Supervisor(JobExecutor):
    """Runs one training job to its end: done, failed for good, or interrupted."""

    job_kind = "train"

    def __init__(self, *, store: StateStore, name: str, job: JobRef, options: JobOptions, reporter: Reporter,
                 pool: TransportPool, root: Path, secrets: Secrets | None = None,
                 elastic: "resize.Elastic | None" = None, **clocks: Any):
        super().__init__(store=store, name=name, reporter=reporter, pool=pool, root=root,
                         rules=restart_rules(options.restart_policy, options.max_restarts, options.backoff),
                         host_timeout=options.host_timeout, grace=options.grace, secrets=secrets, **clocks)
        self.job = job
        self.options = options
        self.tails: dict[str, EventTail] = {}     # process key -> its events file
        self.result: dict[str, Any] | None = None
        self.last_step = 0
        self.steps_redone = 0
        self.placement_shown = False
        self.evals: list[dict[str, Any]] = []       # {"step", "val_loss", "val_accuracy", "seconds", "task"} from "eval" events
        self.leader_done_at: float | None = None
        self.trainer_options = options    # what the trainers are told (with_evaluator when there is one)
        self.evaluated_step: int | None = None    # the evaluator's newest evaluated checkpoint step
        self.standby_tasks: set[str] = set()      # tasks whose standby a launch took (or passed over)
        self.resize_asked = False                 # SIGUSR2: `pscluster scale` posted a request
        self.elastic = elastic                    # --min-workers / --hosts-from
        self.dropped: dict[str, HostLink] = {}    # worker hosts left out while lost: watched until they answer
        self.next_discovery = 0.0
        self.next_rejoin = 0.0
        # Requests to the chief to change in place, numbered from the clock: an answer left in a
        # reused events file by an earlier job of a cluster of the same name never matches.
        self.membership_seq = int(self.wall() * 1000)
        self.membership_answers: dict[int, dict[str, Any]] = {}

    def interrupt(self) -> None:
        """Checkpoint on stop (:func:`cluster.supervision.jobstop.first_to_stop`): the leader (async chief,
        sync-ps worker 0) -- in sync mode every worker, which then agree on one step -- gets
        SIGTERM first and up to ``--stop-grace`` seconds to save and exit; then the rest stop as
        usual."""
        first = first_to_stop(self.plan, self.state.live_records())
        if first:
            leader = ", ".join(r.task for r in first)
            try:
                if self.options.stop_grace > 0:
                    self.reporter.emit("message", level="warning",
                                       text=f"asking {leader} to checkpoint and stop (up to {self.options.stop_grace:g} s; "
                                            "Ctrl-C again to kill at once)")
                    self.stop(first, grace=self.options.stop_grace)
                    self.read_final_events(first)
                else:
                    # --stop-grace 0: no checkpoint on stop. A SIGTERM would still reach the
                    # trainer's stop handler (it saves within a few hundred ms, before the
                    # general grace runs out), so the leader is killed at once.
                    self.stop(first, grace=0.5, first_signal="KILL")
            except KeyboardInterrupt:
                pass
        super().interrupt()

    def read_final_events(self, records: list[ProcessRecord]) -> None:
        """The events a stopped leader wrote last (its checkpoint), into the job record."""
        before = self.state.job.checkpoint_step if self.state.job else None
        for record in records:
            tail, watched = self.tails.get(record.key), self.watched.get(record.key)
            if tail is not None and watched is not None:
                for event in tail.poll(self.pool.get(self.plan.host(record.host))):
                    self.on_event(watched, event, self.clock())
        job = self.state.job
        if job is not None and job.checkpoint_step != before:
            self.reporter.emit("message", text=f"checkpoint saved at step {job.checkpoint_step}: {job.checkpoint}; "
                                               "continue with 'train --resume'")

    def run(self) -> dict[str, Any]:
        """The job (:meth:`JobExecutor.run`); after a finished one, new standbys for the next.
        SIGUSR2 (from ``pscluster scale``) asks for a resize between two turns of the loop."""
        previous = None
        try:
            previous = signal.signal(signal.SIGUSR2, lambda _s, _f: setattr(self, "resize_asked", True))
        except ValueError:      # not the main thread: a resize is then seen by polling the request file
            pass
        try:
            report = super().run()
        finally:
            if previous is not None:
                signal.signal(signal.SIGUSR2, previous)
        self.refill_standbys()
        return report

    # ------------------------------------------------------------------ resize (cluster/lifecycle/resize.py)
    def between_turns(self) -> None:
        if self.elastic is not None:
            if self.standby_tasks and self.last_step > 0:
                # Once it trains: a standby for its next relaunch (the resize after a host's loss
                # restarts the chief), which then skips TensorFlow's import.
                self.refill_standbys()
                self.standby_tasks.clear()
            self.elastic_turn()
        if not self.resize_asked:
            return
        self.resize_asked = False
        request = resize.take_request(self.store, self.name)
        if request is None:
            return
        try:
            text = self.resize(request)
        except PsclusterError as exc:
            resize.post_result(self.store, self.name, ok=False, message=exc.message)
            raise self.fail(exc, "the resize failed") from None
        resize.post_result(self.store, self.name, ok=True, message=text)

    def resize(self, request: "resize.ResizeRequest", unreachable: frozenset[str] | set[str] = frozenset()) -> str:
        # With a host lost, the leader usually cannot save: TensorFlow holds the async chief's
        # writes behind its closure on the lost worker, so after 2 s without a closure returning
        # it ends without saving (roles/async_driver.py). The grace is short for any mode, and
        # the job goes back to its last periodic checkpoint.
        """Checkpoint, stop the job's processes, bring the servers in line with the new plan, and
        start the training processes again from the checkpoint at the new size."""
        old, new = self.plan, request.plan
        diff = resize.diff_plans(old, new)
        resize.check_resize(old, new, diff, job_live=True)
        early = resize.early_servers(old, new, diff, unreachable)
        if early:      # while the job still trains: their import stays out of the pause
            resize.start_early(self.writer, self.pool, self.reporter, new, early, self.secrets, root=self.root,
                               idle=self.pump)
        if not unreachable and resize.in_place(old, new, diff, early):
            text = self.resize_in_place(request, diff)
            if text is not None:
                return text
        # While the job still trains: standbys for the relaunch, so that it skips TensorFlow's import
        # (not for a lost host: the job is stuck until the restart, which a wait would only delay).
        ready = self.standbys_for(new) if not unreachable else []
        self.reporter.emit("message", text=f"resizing: {resize.describe(diff, new)}; "
                                           f"the job checkpoints first (up to {self.options.stop_grace:g} s)")
        began = self.clock()        # the pause: from here to the relaunch
        self.set_job(state=JobState.RESTARTING, message="resizing")
        first = [r for r in first_to_stop(old, self.state.live_records()) if r.host not in unreachable]
        grace = min(self.options.stop_grace, LOST_HOST_GRACE) if unreachable else self.options.stop_grace
        if first and grace > 0:
            self.stop(first, grace=grace)
            self.read_final_events(first)
        stopped_at = self.clock()
        leaving = [w for w in self.watched.values() if w.kind is not ProcessKind.SERVER or w.task.name in diff.stop]
        # A lost host's processes are not stopped now (an SSH connection to it would wait out its
        # timeout inside the pause): they stay recorded, and its rejoin or `down` stops them.
        self.forget_and_stop([w for w in leaving if w.record.host not in unreachable])
        for item in leaving:
            self.watched.pop(item.record.key, None)
        resize.apply_plan(self.writer, self.pool, self.reporter, old, new, diff, self.secrets, root=self.root,
                          standbys=False, unreachable=unreachable,
                          known_hosts=[link.host for link in self.dropped.values()],
                          started=[task.name for task in early], running=ready)
        self.plan = new
        self.leader = leader_task(new)
        workers_before, workers_after = len(old.tasks_of("worker")), len(new.tasks_of("worker"))
        if new.mode != Mode.ASYNC and not request.keep_global_batch and workers_after != workers_before:
            # Each worker keeps its batch (torchrun's model): the global batch follows the size.
            global_batch = self.progress.global_batch_size or 0
            if global_batch:
                per_worker = max(1, global_batch // workers_before)
                self.trainer_options = replace(self.trainer_options, batch_size=per_worker * workers_after)
        self.prepare_new_hosts()
        self.watch_servers()
        self.set_job(workers=workers_after, message=None)
        launched_at = self.clock()
        self.launch_many(new.training_tasks + new.evaluator_tasks, lambda task: self.launch_train(task, resume=True))
        self.retarget()
        self.set_job(state=JobState.RUNNING)
        text = (f"resized ({request.reason}): {resize.describe(diff, new)}; {workers_before} -> {workers_after} "
                f"worker(s), resuming from "
                f"{'step %d' % self.progress.checkpoint_step if self.progress.checkpoint_step else 'the start'} "
                f"({self.clock() - began:.2f} s to restart: {stopped_at - began:.2f} to checkpoint and stop, "
                f"{launched_at - stopped_at:.2f} to apply the plan, {self.clock() - launched_at:.2f} to launch)")
        self.reporter.emit("message", text=text)
        self.announce("resized", {"old": resize.membership(old), "new": resize.membership(new),
                                  "reason": request.reason, "workers": workers_after,
                                  "checkpoint_step": self.progress.checkpoint_step})
        return text

    def standbys_for(self, new: ClusterPlan) -> list[str]:
        """Before a relaunch at ``new``: a standby for each of its training tasks that has none,
        and wait (reading the job's streams) until they imported TensorFlow, up to
        :data:`STANDBY_WAIT`. Best effort (a standby that is late or failed is passed over and its
        task starts afresh); the keys of the standbys started, which the resize keeps."""
        names = [task.name for task in new.training_tasks if self.state.standby(task.name) is None]
        if not names:
            return []
        try:
            sync_code(new, self.pool, self.reporter, self.root)     # a host new to the cluster needs the code
            records, failures = start_standbys(self.writer, self.pool, new, self.secrets, names)
        except PsclusterError as exc:
            records, failures = {}, [Failure("the relaunch", exc)]
        report_standbys(Reporter(), {}, failures)
        if not records:
            return []
        self.reporter.emit("message", text=f"starting {len(records)} standby(s) for the relaunch while the job trains")
        pending, deadline = dict(records), self.clock() + STANDBY_WAIT
        while pending and self.clock() < deadline:
            for name, record in list(pending.items()):
                try:
                    if hostops.read(self.pool.get(new.host(record.host)), ready_file(record.log), limit=16).exists:
                        del pending[name]
                except PsclusterError:
                    del pending[name]           # its host does not answer: the relaunch will say more
            self.pump()
            self.sleep(0.3)
        return [record.key for record in records.values()]

    def resize_in_place(self, request: ResizeRequest, diff: PlanDiff) -> str | None:
        """Async, workers added after the last one or the last ones removed: the running chief takes
        the new cluster between two closures (roles/membership.py), with no checkpoint and no
        restart. None if it did not (it refused, ended, or did not answer): then the caller
        restarts the job from a checkpoint."""
        old, new = self.plan, request.plan
        chief = self.current(self.leader.name)
        if chief is None or not chief.started or chief.done or chief.ended_at is not None or not chief.record.events:
            return None
        self.membership_seq += 1
        seq = self.membership_seq
        began = self.clock()
        self.reporter.emit("message", text=f"resizing in place: {resize.describe(diff, new)}; "
                                           "the chief takes the new cluster between two steps")
        try:
            hostops.tell(self.pool.get(self.plan.host(chief.task.host)), chief.record.events,
                         {"seq": seq, "cluster": new.cluster_spec})
        except PsclusterError as exc:
            answer: dict[str, Any] | None = {"refused": exc.message.splitlines()[0]}
        else:
            answer = self.pump_until(lambda: self.membership_answers.get(seq), chief, timeout=IN_PLACE_TIMEOUT)
        if answer is None or answer.get("refused"):
            why = answer.get("refused") if answer else "it did not answer"
            self.reporter.emit("message", level="warning",
                               text=f"the chief did not take the change in place ({why}); restarting from a checkpoint")
            return None
        self.forget_and_stop([w for w in self.watched.values()
                              if w.kind is ProcessKind.SERVER and w.task.name in diff.stop])
        running = [w.record.key for w in self.watched.values() if w.kind is ProcessKind.TRAIN]
        resize.apply_plan(self.writer, self.pool, self.reporter, old, new, diff, self.secrets, root=self.root,
                          standbys=False, started=diff.start, running=running)
        self.plan = new
        self.watch_servers()
        workers_before, workers_after = len(old.tasks_of("worker")), len(new.tasks_of("worker"))
        self.set_job(workers=workers_after, message=None)
        self.retarget()
        text = (f"resized ({request.reason}) in place: {resize.describe(diff, new)}; {workers_before} -> "
                f"{workers_after} worker(s) at step {answer.get('step')}, no restart "
                f"({self.clock() - began:.1f} s; the chief paused {answer.get('seconds', 0):.1f} s)")
        self.reporter.emit("message", text=text)
        self.announce("resized", {"old": resize.membership(old), "new": resize.membership(new),
                                  "reason": request.reason, "workers": workers_after, "in_place": True,
                                  "step": answer.get("step")})
        return text

    def pump(self) -> None:
        """What the loop does besides deciding: read the hosts' watch streams (the job's events)
        and keep its record current, e.g. while a resize waits for new servers or for the chief."""
        now = self.clock()
        self.read_streams(now)
        self.publish(now)

    def pump_until(self, found: Callable[[], dict[str, Any] | None], chief: Watched, *, timeout: float) -> dict[str, Any] | None:
        """:meth:`pump` until ``found()`` gives an answer, the chief ends, or ``timeout`` passes (None)."""
        deadline = self.clock() + timeout
        while True:
            now = self.clock()
            self.pump()
            answer = found()
            if answer is not None:
                return answer
            if chief.ended_at is not None or now > deadline:
                return None
            self.sleep(LOOP_SECONDS)

    # ------------------------------------------------------------------ elastic (train --min-workers, --hosts-from)
    def drop_out(self, host: str, why: str, task: str | None = None) -> bool:
        """A worker host lost beyond --host-timeout (``task`` None: all its tasks go, and it is
        watched until it answers again), or a worker that used up its restarts (``task``: its
        host runs one worker fewer): go on without it if at least --min-workers remain (True),
        else let the job fail as before (False)."""
        if self.elastic is None or self.elastic.min_workers is None:
            return False
        counts = resize.worker_counts(self.plan)
        others = sorted({t.role for t in self.plan.tasks if t.host == host} - {"worker"})
        verdict = core.drop_out(counts, host=host, other_roles=others, task=task, min_workers=self.elastic.min_workers)
        if not verdict.drop:
            self.reporter.emit("message", level="warning", text=f"cannot go on without {task or host}: {verdict.why}")
            return False
        fewer = counts.get(host, 0) if task is None else 1
        dropped_left = {h: 0 for h in self.dropped}
        new = resize.replan(self.plan, port_base=self.state.port_base, limit=self.state.limit,
                            counts={**counts, **dropped_left, host: counts.get(host, 0) - fewer}, pool=None)
        if task is None:
            self.dropped[host] = HostLink(self.plan.host(host), self.pool, clock=self.clock)
            self.dropped[host].set_targets([], [])
        self.resize(resize.ResizeRequest(new, reason=f"{task or host} {why}"),
                    unreachable={host} if task is None else set())
        return True

    def elastic_turn(self) -> None:
        """Take back a dropped host that answers again; follow the discovery command."""
        elastic = self.elastic
        assert elastic is not None
        now = self.clock()
        for host, link in list(self.dropped.items()):
            if link.poll(now) and now >= self.next_rejoin:        # its watch stream answers: the host is back
                self.next_rejoin = now + REJOIN_RETRY
                self.stop_leftovers(host)
                self.rejoin({host: None}, f"{host} is back")
                return
        if elastic.hosts_from and now >= self.next_discovery:
            self.next_discovery = now + elastic.hosts_every
            wanted = resize.discover(elastic.hosts_from, self.reporter)
            if wanted is not None:
                self.follow_discovery(wanted)

    def stop_leftovers(self, host: str) -> None:
        """What a lost host still runs of this cluster (its processes lived on behind the cut: a
        server would hold its port): stopped before the host rejoins."""
        left = [r for r in self.state.live_records() if r.host == host and r.key not in self.watched]
        if left:
            self.reporter.emit("message", text=f"{host} answers again: stopping {len(left)} process(es) it still "
                                               "runs from before it was lost")
            plan = resize.knowing_hosts(self.plan, self.dropped[host].host) if host in self.dropped else self.plan
            stopped, errors = stop_records(plan, left, self.pool, self.reporter, grace=3.0)
            self.writer.change(lambda s: s.replace_records(stopped))
            for where, error in errors.items():
                self.reporter.emit("message", level="warning",
                                   text=f"could not stop what {where} still runs: {error.message.splitlines()[0]}")

    def follow_discovery(self, wanted: dict[str, int | None]) -> None:
        """Grow or shrink to the discovery command's host list (hosts of the inventory's worker group)."""
        from ..inventory import load_inventory
        inventory_workers = load_inventory(self.plan.inventory_path).hosts_of("worker")
        unknown = sorted(set(wanted) - set(inventory_workers))
        if unknown:
            self.reporter.emit("message", level="warning",
                               text=f"--hosts-from names {', '.join(unknown)}, not in the inventory's worker group: "
                                    "left out")
        counts = resize.worker_counts(self.plan)
        target = {host: (0 if host not in wanted else wanted[host]) for host in inventory_workers}
        changed = {h: c for h, c in target.items() if (c if c is not None else -1) != counts.get(h, 0)
                   and not (c is None and h in counts)}
        if not changed or not any(c != 0 for c in target.values()):
            return
        self.rejoin(changed, "--hosts-from")

    def rejoin(self, changes: dict[str, int | None], reason: str) -> None:
        """Resize to the current plan with ``changes`` (None: the inventory's count), after a
        preflight of the hosts that get tasks; a failed preflight waits for the next try."""
        counts: dict[str, int] = dict(resize.worker_counts(self.plan))
        for host in changes:
            counts.pop(host, None)
        fixed = {h: c for h, c in changes.items() if c is not None}
        dropped_left = {h: 0 for h in self.dropped if h not in changes}
        try:
            new = resize.replan(self.plan, port_base=self.state.port_base, limit=self.state.limit,
                                counts={**counts, **dropped_left, **fixed}, pool=self.pool)
            diff = resize.diff_plans(self.plan, new)
            if diff.empty:
                return
            resize.check_resize(self.plan, new, diff, job_live=True)
            to_check = resize.plan_changes_for(new, diff, self.plan)
            if to_check.tasks:
                from ..hosts.preflight import run_preflight
                report = run_preflight(to_check, self.pool, Reporter())
                if not report.ok:
                    failed = next(r for r in report.results if not r.ok)
                    self.reporter.emit("message", level="warning",
                                       text=f"{reason}: not yet ({failed.host}: {failed.check}: {failed.detail}); trying again later")
                    return
        except PsclusterError as exc:
            self.reporter.emit("message", level="warning", text=f"{reason}: {exc.message.splitlines()[0]}")
            return
        for host in changes:
            link = self.dropped.pop(host, None)
            if link is not None:
                link.close()
        self.resize(resize.ResizeRequest(new, reason=reason))

    def prepare_new_hosts(self) -> None:
        """The job's files on hosts that just joined (the code itself came with apply_plan)."""
        if not self.job.example and any(needs_sync(h, self.root) for h in self.plan.hosts):
            sync_files(self.plan, self.pool, self.reporter, job_files(self.job, self.plan), self.root)

    def refill_standbys(self) -> None:
        """A standby (roles/standby.py) for each training task whose own this job took (a
        cluster without standbys, e.g. `pscluster bench`'s, gets none), so that the next
        ``train`` finds TensorFlow imported too. A failure here is a warning: the job is done."""
        if not self.standby_tasks:
            return
        try:
            _, failures = start_standbys(self.writer, self.pool, self.plan, self.secrets, self.standby_tasks)
        except PsclusterError as exc:       # e.g. `down` took the cluster over meanwhile
            failures = [Failure("the next job", exc)]
        report_standbys(self.reporter, {}, failures)

    # ------------------------------------------------------------------ the job
    def job_name(self) -> str:
        return self.job.name

    def new_job(self) -> JobProgress:
        self.leader = leader_task(self.plan)
        self.checkpoint_dir = self.options.checkpoint_dir or leader_layout(self.plan).checkpoint_dir(self.job.name)
        if self.plan.evaluator_tasks:
            self.trainer_options = with_evaluator(self.options)
        return super().new_job().updated(checkpoint_dir=self.checkpoint_dir, stop_grace=self.options.stop_grace)

    def watchdog(self) -> core.Watchdog:
        sync = self.plan.mode != Mode.ASYNC
        return core.Watchdog(start_timeout=self.options.start_timeout + 15,
                             stall_after=self.options.collective_timeout * 2 + 30 if sync else None,
                             leader=self.leader.name, blame_frozen=sync)

    def prepare(self) -> None:
        """Sync code and the job where needed; check the training ports are free."""
        sync_code(self.plan, self.pool, self.reporter, self.root)
        if not self.job.example and any(needs_sync(h, self.root) for h in self.plan.hosts):
            self.reporter.emit("phase", name="sync", detail=f"job {self.job.name}")
            sync_files(self.plan, self.pool, self.reporter, job_files(self.job, self.plan), self.root)
        check_ports_free(self.plan.training_tasks, self.pool, self.plan)
        check_checkpoints_shared(self.plan, self.pool, self.checkpoint_dir, self.leader, self.plan.evaluator_tasks)

    def launch_group(self) -> None:
        self.watch_servers()
        self.reporter.emit("phase", name="train", detail=f"{self.job.name} on {self.name!r} ({self.plan.mode}, "
                                                          f"{len(self.plan.tasks_of('worker'))} worker(s))")
        tasks = self.plan.training_tasks + self.plan.evaluator_tasks
        self.launch_many(tasks, lambda task: self.launch_train(task, resume=self.options.resume))
        for evaluator in self.plan.evaluator_tasks:
            cadence = self.trainer_options.checkpoint_every
            self.reporter.emit("message", text=f"{evaluator.name} evaluates each checkpoint in {self.checkpoint_dir} "
                                               + (f"(every {cadence} steps)" if cadence else
                                                  "(only the final one: give --checkpoint-every or --eval-every)"))

    def relaunch(self, task: TaskSpec) -> Watched:
        return self.launch_train(task, resume=True)

    def launch_train(self, task: TaskSpec, *, resume: bool) -> Watched:
        attempt = self.attempt(task, ProcessKind.TRAIN)
        log, events = host_layout(task, self.plan).job_paths(self.job_id, task.role, task.index, attempt)
        record = ProcessRecord(key=f"{task.name}#j{self.job_id}.{attempt}", task=task.name, host=task.host,
                               kind="train", attempt=attempt, log=log, exit_file=exit_file(log), events=events)
        # The leader writes TensorBoard summaries; the restarts before this launch are one of them.
        # A side-car evaluator that shares the leader's workdir path writes its scalars beside them
        # (`<job>/eval`, one more run in `pscluster tensorboard`); elsewhere in <checkpoint dir>/eval.
        shares = task.role == "evaluator" and task.workdir == self.leader.workdir
        summaries = leader_layout(self.plan).summary_dir(self.job.name) if task.name == self.leader.name or shares else None
        argv = train_argv(task, mode=self.plan.mode, job_path=job_path_on(self.plan.host(task.host), self.job, self.plan, self.root),
                          events_path=events, checkpoint_dir=self.checkpoint_dir, options=self.trainer_options,
                          resume=resume, summaries=summaries, restarts=sum(self.job_restarts().values()))
        self.tails[record.key] = EventTail(events)
        standby = self.state.standby(task.name) if task.role != "evaluator" else None
        if standby is not None:
            self.standby_tasks.add(task.name)
        return self.launch(task, record, argv=argv, env=task_env(self.plan, task, self.secrets, standing=False), kind=ProcessKind.TRAIN,
                           files=(events,), standby=standby)

    def recovery(self, incident: core.Incident) -> core.Recovery:
        return core.train_recovery(Mode(self.plan.mode), incident.proc, self.views(),
                                   hosts=[t.host for t in self.plan.tasks],
                                   servers=[t.name for t in self.plan.standing_tasks],
                                   trainers=[t.name for t in self.plan.training_tasks])

    def complete(self, now: float) -> bool:
        final_step = self.result.get("global_step") if self.result else None
        for watched in self.watched.values():
            if (watched.task.role == "evaluator" and final_step is not None and self.evaluated_step is not None
                    and self.evaluated_step >= final_step):
                watched.finished = True   # it evaluated the final checkpoint: stopped below if still up
            if watched.kind is ProcessKind.TRAIN and watched.done and watched.view().clean_exit:
                if watched.task.name == self.leader.name:
                    self.leader_done_at = self.leader_done_at or now
                else:
                    watched.finished = True   # a worker that finished its share (may end before the leader)
        outcome = core.train_outcome(self.views(), leader=self.leader.name, leader_done_at=self.leader_done_at,
                                     now=now)
        if not outcome.complete:
            return False
        if outcome.stop:
            self.stop([self.watched[key].record for key in outcome.stop], grace=self.options.grace)
        self.stop_job_processes(grace=1.0)
        return True

    def summary(self) -> dict[str, Any]:
        report = summarize(self.result or {}, wall_seconds=self.clock() - self.began, restarts=self.job_restarts(),
                           steps_redone=self.steps_redone, job=self.job, evals=self.evals, progress=self.state.job)
        # --deadline: the trainers checkpointed and ended short of the budget (train exits 4).
        total = self.state.job.steps_total if self.state.job else None
        report["deadline_reached"] = bool(self.options.deadline is not None and total is not None
                                          and (report.get("global_step") or 0) < total)
        return report

    # ------------------------------------------------------------------ events
    def on_chunk(self, watched: Watched, chunk: hostops.FileChunk, now: float) -> None:
        tail = self.tails.get(watched.record.key)
        if tail is None:
            return
        for event in tail.feed(chunk):
            self.on_event(watched, event, now)

    def on_event(self, watched: Watched, event: dict[str, Any], now: float) -> None:
        watched.last_event = now
        kind = event.get("event")
        is_leader = watched.task.name == self.leader.name
        if kind == "start":
            watched.started = True
            restored = event.get("restored_step") or 0
            if is_leader:
                if self.last_step > restored:
                    self.steps_redone += self.last_step - restored
                self.set_job(steps_total=event.get("steps_total"), restored_step=restored,
                             global_batch_size=event.get("global_batch_size"))
                if restored:
                    self.reporter.emit("message", text=f"{watched.task.name} resumed from step {restored}")
        elif kind == "placement" and not self.placement_shown:
            self.placement_shown = True
            devices: dict[str, int] = {}
            for variable in event.get("variables", []):
                devices[variable.get("device") or "?"] = devices.get(variable.get("device") or "?", 0) + 1
            shown = ", ".join(f"{count} on {device}" for device, count in sorted(devices.items()))
            self.reporter.emit("message", text=f"variables: {shown}")
        elif kind == "progress":
            step = event.get("step") or 0
            info = {"step": step, "epoch": event.get("epoch"), "loss": event.get("loss"),
                    "examples_per_second": event.get("examples_per_second"),
                    "rate": (event.get("per_worker") or {}).get(watched.task.name)}     # its own examples/s
            if is_leader:
                self.last_step = max(self.last_step, step)
                self.set_job(state="running", step=step, steps_total=event.get("steps_total"),
                             epoch=event.get("epoch"), loss=event.get("loss"),
                             examples_per_second=event.get("examples_per_second"),
                             per_worker=event.get("per_worker") or None)
                self.reporter.emit("job", **self.job_record())
            if self.plan.mode != Mode.ASYNC:
                self.reporter.emit("job", worker_progress=(watched.task.name, info))
        elif kind == "eval" and (is_leader or watched.task.role == "evaluator"):
            self.on_eval(watched.task.name, event, now)
        elif kind == "checkpoint" and is_leader:
            self.set_job(checkpoint=event.get("path"), checkpoint_step=event.get("step"))
        elif kind == "done":
            watched.done = True
            if is_leader:
                self.result = event
        elif kind == "error":
            watched.error = event.get("message")
        elif kind == "membership" and is_leader and isinstance(event.get("seq"), int):
            self.membership_answers[event["seq"]] = event


    def on_eval(self, task: str, event: dict[str, Any], now: float) -> None:
        step = event.get("step")
        if task != self.leader.name:
            if any(e["task"] == task and e["step"] == step for e in self.evals):
                return        # a restarted evaluator evaluates the latest checkpoint again
            self.evaluated_step = max(self.evaluated_step or 0, step or 0)
        # Seconds since `train` started, on this machine's clock: what time-to-accuracy means.
        self.evals.append({"step": step, "val_loss": event.get("val_loss"), "val_accuracy": event.get("val_accuracy"),
                           "seconds": round(now - self.began, 2), "task": task})
        shown = self.progress.val_step
        if shown is None or (step is not None and step >= shown):     # an older checkpoint's result comes late
            self.set_job(val_accuracy=event.get("val_accuracy"), val_step=step)
        job = self.progress
        # The trainer's eval carries its epoch; the side-car evaluator's does not. Epochs are
        # linear in steps (roles.settings.TrainPlan.epoch_at): scale the last progress's.
        epoch = event.get("epoch")
        if epoch is None and job.epoch and job.step and step is not None:
            epoch = round(job.epoch * step / job.step, 4)
        self.reporter.emit("eval", task=task, step=step, val_loss=event.get("val_loss"),
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
