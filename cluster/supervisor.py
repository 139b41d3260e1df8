"""``pscluster train``: running a training job on a cluster that is up, and keeping it alive.

The job's training processes run ``python -m roles.train`` (the chief in async mode, every
worker in sync and sync-ps) and report through their events files, which each host's watch
stream pushes here. :class:`Supervisor` is the training job on the shared executor
(:mod:`cluster.supervision.executor`); the decisions -- what counts as failed, whether to
restart, what a restart means in each mode -- are the pure functions of
:mod:`cluster.supervision.core`. Recovery by mode, as TensorFlow allows (TF-NOTES):

========  ==================================================================================
async     worker server died: restart it on its host and port; the coordinator takes it back.
          ps died: restart it; the chief then fails and is restarted from the last checkpoint.
          chief died: restart it (after every server answers); it restores and continues.
sync      any worker died or froze: stop the whole group, relaunch every worker, resume.
sync-ps   any worker or ps died or froze: stop workers and ps, restart the ps, relaunch the
          workers, resume (the ps keep queues and accumulators of the old graph otherwise).
========  ==================================================================================

Job states (``state.job.state``): starting, running, restarting, done, failed, stopped.
"""
from __future__ import annotations

from pathlib import Path

from . import hostops
from .codesync import needs_sync, sync_code, sync_files
from .contracts import Mode, ProcessKind
from .errors import HostError
from .events import Reporter
from .launcher import task_env
from .secrets import Secrets
from .plan import TaskSpec
from .state import ProcessRecord, StateStore
from .supervision import core
from .supervision.executor import JobExecutor, JobFailed, JobInterrupted, Watched, restart_rules
from .training import (EventTail, JobRef, TrainOptions, default_checkpoint_dir, job_files, job_path_on, job_paths,
                       leader_task, summarize, summary_dir, train_argv)
from .transport import TransportPool

__all__ = ["Supervisor", "JobFailed", "JobInterrupted"]


class Supervisor(JobExecutor):
    """Runs one training job to its end: done, failed for good, or interrupted."""

    job_kind = "train"

    def __init__(self, *, store: StateStore, name: str, job: JobRef, options: TrainOptions, reporter: Reporter,
                 pool: TransportPool, root: Path, secrets: Secrets | None = None, **clocks):
        super().__init__(store=store, name=name, reporter=reporter, pool=pool, root=root,
                         rules=restart_rules(options.restart_policy, options.max_restarts, options.backoff),
                         host_timeout=options.host_timeout, grace=options.grace, secrets=secrets, **clocks)
        self.job = job
        self.options = options
        self.tails: dict[str, EventTail] = {}     # process key -> its events file
        self.result: dict | None = None
        self.last_step = 0
        self.steps_redone = 0
        self.placement_shown = False
        self.evals: list[dict] = []       # {"step", "val_loss", "val_accuracy", "seconds"} from "eval" events
        self.leader_done_at: float | None = None

    def interrupt(self) -> None:
        """Checkpoint on stop: the leader (async chief, sync-ps worker 0) gets SIGTERM first and
        up to ``--stop-grace`` seconds to save and exit while its peers still run; then the rest
        stop as usual. Sync mode's trainers do not checkpoint on SIGTERM (roles/train.py)."""
        leader = leader_task(self.plan).name
        first = [r for r in self.state.live_records() if r.kind == ProcessKind.TRAIN and r.task == leader]
        if self.options.stop_grace > 0 and self.plan.mode in ("async", "sync-ps") and first:
            self.reporter.emit("message", level="warning",
                               text=f"asking {leader} to checkpoint and stop (up to {self.options.stop_grace:g} s; "
                                    "Ctrl-C again to kill at once)")
            try:
                self.stop(first, grace=self.options.stop_grace)
                self.read_final_events(first)
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

    # ------------------------------------------------------------------ the job
    def job_name(self) -> str:
        return self.job.name

    def new_job(self):
        self.leader = leader_task(self.plan)
        self.checkpoint_dir = self.options.checkpoint_dir or default_checkpoint_dir(self.plan, self.job)
        return super().new_job().updated(checkpoint_dir=self.checkpoint_dir)

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

    def launch_group(self) -> None:
        self.watch_servers()
        self.reporter.emit("phase", name="train", detail=f"{self.job.name} on {self.name!r} ({self.plan.mode}, "
                                                          f"{len(self.plan.tasks_of('worker'))} worker(s))")
        self.launch_many(self.plan.training_tasks, lambda task: self.launch_train(task, resume=self.options.resume))

    def relaunch(self, task: TaskSpec) -> Watched:
        return self.launch_train(task, resume=True)

    def launch_train(self, task: TaskSpec, *, resume: bool) -> Watched:
        attempt = self.attempt(task, ProcessKind.TRAIN)
        log, events = job_paths(task, self.plan, self.job_id, attempt)
        record = ProcessRecord(key=f"{task.name}#j{self.job_id}.{attempt}", task=task.name, host=task.host,
                               kind="train", attempt=attempt, log=log, exit_file=log + ".exit", events=events)
        # The leader writes TensorBoard summaries; the restarts before this launch are one of them.
        summaries = summary_dir(self.plan, self.job) if task.name == self.leader.name else None
        argv = train_argv(task, job_path=job_path_on(self.plan.host(task.host), self.job, self.plan, self.root),
                          events_path=events, checkpoint_dir=self.checkpoint_dir, options=self.options,
                          resume=resume, summaries=summaries, restarts=sum(self.job_restarts().values()))
        self.tails[record.key] = EventTail(events)
        return self.launch(task, record, argv=argv, env=task_env(task, self.secrets, standing=False), kind=ProcessKind.TRAIN,
                           files=(events,))

    def recovery(self, incident: core.Incident) -> core.Recovery:
        return core.train_recovery(Mode(self.plan.mode), incident.proc, self.views(),
                                   hosts=[t.host for t in self.plan.tasks],
                                   servers=[t.name for t in self.plan.standing_tasks],
                                   trainers=[t.name for t in self.plan.training_tasks])

    def complete(self, now: float) -> bool:
        for watched in self.watched.values():
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

    def summary(self) -> dict:
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

    def on_event(self, watched: Watched, event: dict, now: float) -> None:
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
                    "examples_per_second": event.get("examples_per_second")}
            if is_leader:
                self.last_step = max(self.last_step, step)
                self.set_job(state="running", step=step, steps_total=event.get("steps_total"),
                             epoch=event.get("epoch"), loss=event.get("loss"),
                             examples_per_second=event.get("examples_per_second"),
                             per_worker=event.get("per_worker") or None)
                job = self.progress.to_json()
                job.pop("orchestrator", None)
                self.reporter.emit("job", **job)
            if self.plan.mode != Mode.ASYNC:
                self.reporter.emit("job", worker_progress=(watched.task.name, info))
        elif kind == "eval" and is_leader:
            # Seconds since `train` started, on this machine's clock: what time-to-accuracy means.
            self.evals.append({"step": event.get("step"), "val_loss": event.get("val_loss"),
                               "val_accuracy": event.get("val_accuracy"), "seconds": round(now - self.began, 2)})
            self.set_job(val_accuracy=event.get("val_accuracy"), val_step=event.get("step"))
        elif kind == "checkpoint" and is_leader:
            self.set_job(checkpoint=event.get("path"), checkpoint_step=event.get("step"))
        elif kind == "done":
            watched.done = True
            if is_leader:
                self.result = event
        elif kind == "error":
            watched.error = event.get("message")


def check_ports_free(tasks, pool: TransportPool, plan) -> None:
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
