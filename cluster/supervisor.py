"""Running a training job on a cluster that is up, and keeping it alive.

The supervisor starts the job's training processes, then watches every process of the job
(its training processes and, in async and sync-ps mode, the standing servers) through one
``watch`` stream per host (task states and new event-file bytes, heartbeat every second). It
reacts to:

* a process that exited, vanished or froze (SIGSTOP) -> restart policy;
* a training process that did not report ``start`` within ``start_timeout``;
* in sync modes, a leader that stopped reporting progress (a peer blocks the collective);
* a host whose stream went silent (lost) -> wait up to ``host_timeout`` for it, else fail.

Restart policy (``never`` | ``on-failure`` | ``always``; ``max_restarts`` per task, backoff
doubling from ``backoff`` seconds). Recovery by mode, as TensorFlow allows (TF-NOTES):

========  ==================================================================================
async     worker server died: restart it on its host and port; the coordinator takes it back.
          ps died: restart it; the chief then fails and is restarted from the last checkpoint.
          chief died: restart it (after every server answers); it restores and continues.
sync      any worker died or froze: stop the whole group, relaunch every worker, resume.
sync-ps   any worker or ps died or froze: stop workers and ps, restart the ps, relaunch the
          workers, resume (the ps keep queues and accumulators of the old graph otherwise).
========  ==================================================================================

Job states (``state.job["state"]``): starting, running, restarting, done, failed, stopped.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import hostops
from .codesync import needs_sync, sync_code, sync_files
from .errors import HostError, PsclusterError, TaskError, UsageError
from .events import Reporter
from .launcher import StateWriter, start_task, stop_records, task_env, wait_ready
from .plan import ClusterPlan, HostSpec, TaskSpec
from .probe import Prober
from .state import ProcessRecord, RunState, StateStore
from .training import (EventTail, JobRef, TrainOptions, default_checkpoint_dir, job_files, job_path_on,
                       job_paths, leader_task, server_log, summarize, train_argv)
from .transport import TransportPool

FROZEN_AFTER = 5.0          # a task stopped (SIGSTOP) this long counts as failed
LOST_AFTER = 4.0            # a watch stream silent this long: the host is lost
MAX_BACKOFF = 30.0


class JobFailed(PsclusterError):
    """The job failed for good (policy or budget); ``cause`` is the root cause."""

    def __init__(self, cause: PsclusterError, *, prefix: str = "training failed"):
        self.cause = cause
        super().__init__(f"{prefix}: {cause.message}", hint=cause.hint)


class JobInterrupted(PsclusterError):
    exit_code = 130


@dataclass
class Watched:
    """A live process of the job."""

    task: TaskSpec
    record: ProcessRecord
    tail: EventTail | None            # training processes only
    launched: float
    state: str = "running"
    exit_code: int | None = None
    signal: int | None = None
    started: bool = False
    last_event: float = 0.0
    frozen_since: float | None = None
    finished: bool = False            # a non-leader training process that ended cleanly
    error: str | None = None          # its "error" event, if any


class HostLink:
    """The ``watch`` stream of one host; reopened in the background when it breaks or changes."""

    def __init__(self, host: HostSpec, pool: TransportPool):
        self.host = host
        self.pool = pool
        self.stream = None
        self.targets: tuple[list[ProcessRecord], list[tuple[str, int]]] = ([], [])
        self.last_seen = time.monotonic()
        self.lost_since: float | None = None
        self.error: str | None = None
        self._opening = False
        self._lock = threading.Lock()

    def set_targets(self, records: list[ProcessRecord], files: list[tuple[str, int]]) -> None:
        with self._lock:
            self.targets = (records, files)
            old, self.stream = self.stream, None
            self.last_seen = time.monotonic()     # a new stream gets a full grace period
        if old is not None:
            old.close()
        self._open_soon()

    def _open_soon(self) -> None:
        with self._lock:
            if self._opening:
                return
            self._opening = True
        threading.Thread(target=self._open, daemon=True).start()

    def _open(self) -> None:
        try:
            while True:
                targets = self.targets
                records, files = targets
                try:
                    stream = hostops.watch(self.pool.get(self.host), records, files)
                except PsclusterError as exc:
                    self.error = exc.message
                    time.sleep(2.0)
                    continue
                with self._lock:
                    if targets is self.targets:
                        self.stream = stream
                        return
                stream.close()         # targets changed while connecting: open again
        finally:
            with self._lock:
                self._opening = False

    def poll(self, now: float) -> list[hostops.WatchUpdate]:
        stream = self.stream
        updates = []
        if stream is not None:
            for line in stream.lines():
                update = hostops.parse_watch_line(line)
                if update is not None:
                    updates.append(update)
        if updates:
            self.last_seen = now
            self.lost_since = None
            self.error = None
        elif now - self.last_seen > LOST_AFTER or (stream is not None and stream.closed):
            if self.lost_since is None:
                self.lost_since = self.last_seen
                self.error = self.error or (stream.error if stream is not None and stream.error else
                                            f"no heartbeat for {now - self.last_seen:.0f} s")
            if stream is not None:
                stream.close()
                with self._lock:
                    if self.stream is stream:
                        self.stream = None
            self._open_soon()
        return updates

    def close(self) -> None:
        with self._lock:
            stream, self.stream = self.stream, None
            self.targets = ([], [])
        if stream is not None:
            stream.close()


class Supervisor:
    """Runs one job to its end: done, failed for good, or interrupted."""

    def __init__(self, *, store: StateStore, name: str, job: JobRef, options: TrainOptions, reporter: Reporter,
                 pool: TransportPool, root: Path, secrets: dict[str, str] | None = None):
        self.store = store
        self.name = name
        self.job = job
        self.options = options
        self.reporter = reporter
        self.pool = pool
        self.root = root
        self.secrets = secrets or {}
        self.watched: dict[str, Watched] = {}
        self.links: dict[str, HostLink] = {}
        self.result: dict | None = None
        self.last_step = 0
        self.steps_redone = 0
        self.placement_shown = False
        self.evals: list[dict] = []       # {"step", "val_loss", "val_accuracy", "seconds"} from "eval" events
        self.began = time.monotonic()
        self._published = 0.0
        self._leader_exit: float | None = None

    # ------------------------------------------------------------------ setup
    def _load(self) -> RunState:
        with self.store.lock(self.name):
            state = self.store.load(self.name)
            if state is None:
                raise UsageError(f"no cluster named {self.name!r}")
            if state.phase != "up":
                raise UsageError(f"cluster {self.name!r} is {state.phase}, not up",
                                 hint="bring it up with 'pscluster up INVENTORY'")
            job = state.job or {}
            if job.get("state") in ("starting", "running", "restarting") and _orchestrator_alive(job):
                raise UsageError(f"job {job.get('id')} ({job.get('job')}) is still running on {self.name!r}",
                                 hint="wait for it, or stop it with Ctrl-C in its terminal")
        return state

    def run(self) -> dict:
        began = self.began = time.monotonic()
        state = self._load()
        self.state = state
        self.plan: ClusterPlan = state.plan
        self.writer = StateWriter(self.store, state, expect_phase="up")
        stale = [r for r in state.live_records() if r.kind == "train"]
        if stale:     # an earlier train whose orchestrator was killed
            self.reporter.emit("message", text=f"stopping {len(stale)} process(es) of an earlier, orphaned job")
            self._stop(stale, grace=3.0)
        self.job_id = (state.job or {}).get("id", 0) + 1
        self.leader = leader_task(self.plan)
        self.checkpoint_dir = self.options.checkpoint_dir or default_checkpoint_dir(self.plan, self.job)
        self.writer.change(lambda s: setattr(s, "job", {
            "id": self.job_id, "job": self.job.name, "mode": self.plan.mode, "state": "starting",
            "started": time.time(), "orchestrator": {"pid": os.getpid(), "host": socket.gethostname()},
            "checkpoint_dir": self.checkpoint_dir, "restarts": {}, "workers": len(self.plan.tasks_of("worker")),
        }))
        try:
            self._prepare()
            self._launch_group(resume=self.options.resume)
            self._loop()
            summary = summarize(self.result or {}, wall_seconds=time.monotonic() - began,
                                restarts=self._job_restarts(), steps_redone=self.steps_redone, job=self.job,
                                evals=self.evals, progress=self.state.job)
            self._finish("done", result=summary)
            return summary
        except KeyboardInterrupt:
            self._interrupt()
            raise JobInterrupted(f"job {self.job_id} stopped: its processes were stopped; the standing servers "
                                 f"are still up", hint="'pscluster down' stops them") from None
        except JobFailed as exc:
            self._finish("failed", message=str(exc.cause))
            raise
        except PsclusterError as exc:
            self._stop_job_processes(grace=3.0)
            self._finish("failed", message=str(exc))
            raise
        finally:
            for link in self.links.values():
                link.close()

    def _prepare(self) -> None:
        """Sync code and the job where needed; check the training ports are free."""
        sync_code(self.plan, self.pool, self.reporter, self.root)
        if not self.job.example and any(needs_sync(h, self.root) for h in self.plan.hosts):
            self.reporter.emit("phase", name="sync", detail=f"job {self.job.name}")
            sync_files(self.plan, self.pool, self.reporter, job_files(self.job, self.plan), self.root)
        training = self.plan.training_tasks
        by_host: dict[str, list[TaskSpec]] = {}
        for task in training:
            by_host.setdefault(task.host, []).append(task)
        for host, tasks in by_host.items():
            facts = hostops.facts(self.pool.get(self.plan.host(host)), ports=[t.port for t in tasks], gpus=False,
                                  workdir=None)
            busy = dict(facts.busy_ports)
            clashes = [f"{t.port} ({t.name})" for t in tasks if t.port in busy]
            if clashes:
                raise HostError(host, f"training port(s) in use: {', '.join(clashes)}",
                                hint="another job or program holds them; stop it or change the ports")

    # ------------------------------------------------------------------ launching
    def _attempt(self, task: TaskSpec, kind: str) -> int:
        return 1 + sum(1 for r in self.state.processes if r.task == task.name and r.kind == kind
                       and (kind == "server" or r.key.startswith(f"{task.name}#j{self.job_id}.")))

    def _launch_train(self, task: TaskSpec, *, resume: bool) -> Watched:
        attempt = self._attempt(task, "train")
        log, events = job_paths(task, self.plan, self.job_id, attempt)
        record = ProcessRecord(key=f"{task.name}#j{self.job_id}.{attempt}", task=task.name, host=task.host,
                               kind="train", attempt=attempt, log=log, exit_file=log + ".exit", events=events)
        argv = train_argv(task, job_path=job_path_on(self.plan.host(task.host), self.job, self.plan, self.root),
                          events_path=events, checkpoint_dir=self.checkpoint_dir, options=self.options,
                          resume=resume)
        started = start_task(self.writer, self.pool, self.plan, task, record, argv=argv,
                             env=task_env(task, self.secrets), reporter=self.reporter)
        now = time.monotonic()
        watched = Watched(task, started, EventTail(events), launched=now, last_event=now)
        self.watched[started.key] = watched
        return watched

    def _launch_server(self, task: TaskSpec) -> Watched:
        attempt = self._attempt(task, "server")
        record = ProcessRecord(key=f"{task.name}#{attempt}", task=task.name, host=task.host, kind="server",
                               attempt=attempt, log=server_log(task, attempt), exit_file=server_log(task, attempt) + ".exit")
        started = start_task(self.writer, self.pool, self.plan, task, record, argv=task.argv,
                             env=task_env(task, self.secrets), reporter=self.reporter)
        with Prober() as prober:
            wait_ready(self.plan, {task.name: started}, self.pool, prober, self.reporter, timeout=120.0)
        watched = Watched(task, started, None, launched=time.monotonic())
        self.watched[started.key] = watched
        return watched

    def _watch_servers(self) -> None:
        """Add the standing servers (started by ``up`` or by an earlier restart) to the watch."""
        for task in self.plan.standing_tasks:
            record = self.state.latest(task.name)
            if record is not None and not record.stopped and record.key not in self.watched:
                self.watched[record.key] = Watched(task, record, None, launched=time.monotonic())

    def _launch_group(self, *, resume: bool) -> None:
        self._watch_servers()
        self.reporter.emit("phase", name="train", detail=f"{self.job.name} on {self.name!r} ({self.plan.mode}, "
                                                          f"{len(self.plan.tasks_of('worker'))} worker(s))")
        training = self.plan.training_tasks
        with ThreadPoolExecutor(max_workers=max(1, len(training))) as executor:
            list(executor.map(lambda task: self._launch_train(task, resume=resume), training))
        self._retarget()
        self._set_job(state="running")

    def _retarget(self) -> None:
        """Point each host's watch stream at the job's current processes and event files."""
        by_host: dict[str, list[Watched]] = {}
        for watched in self.watched.values():
            by_host.setdefault(watched.task.host, []).append(watched)
        for host, items in by_host.items():
            link = self.links.get(host)
            if link is None:
                link = self.links[host] = HostLink(self.plan.host(host), self.pool)
                link.last_seen = time.monotonic()
            link.set_targets([w.record for w in items],
                             [(w.tail.path, w.tail.offset) for w in items if w.tail is not None])
        for host in set(self.links) - set(by_host):
            self.links.pop(host).close()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            for host, link in list(self.links.items()):
                for update in link.poll(now):
                    self._absorb(host, update, now)
            if self._decide(now):
                return
            self._publish(now)
            time.sleep(0.1)      # cheap when idle; bounds how late an exit or event is acted on

    def _absorb(self, host: str, update: hostops.WatchUpdate, now: float) -> None:
        for key, status in update.states.items():
            watched = self.watched.get(key)
            if watched is None:
                continue
            watched.state, watched.exit_code, watched.signal = status.state, status.exit_code, status.signal
            if status.state == "frozen":
                watched.frozen_since = watched.frozen_since or now
            else:
                watched.frozen_since = None
        for chunk in update.reads:
            for watched in self.watched.values():
                if watched.tail is not None and watched.tail.path == chunk.path:
                    for event in watched.tail.feed(chunk):
                        self._on_event(watched, event, now)

    def _on_event(self, watched: Watched, event: dict, now: float) -> None:
        watched.last_event = now
        kind = event.get("event")
        is_leader = watched.task.name == self.leader.name
        if kind == "start":
            watched.started = True
            restored = event.get("restored_step") or 0
            if is_leader:
                if self.last_step > restored:
                    self.steps_redone += self.last_step - restored
                self._set_job(steps_total=event.get("steps_total"), restored_step=restored,
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
                self._set_job(state="running", step=step, steps_total=event.get("steps_total"),
                              epoch=event.get("epoch"), loss=event.get("loss"),
                              examples_per_second=event.get("examples_per_second"),
                              per_worker=event.get("per_worker") or None)
                self.reporter.emit("job", **{k: v for k, v in self.state.job.items() if k != "orchestrator"})
            if self.plan.mode != "async":
                self.reporter.emit("job", worker_progress=(watched.task.name, info))
        elif kind == "eval" and is_leader:
            # Seconds since `train` started, on this machine's clock: what time-to-accuracy means.
            self.evals.append({"step": event.get("step"), "val_loss": event.get("val_loss"),
                               "val_accuracy": event.get("val_accuracy"), "seconds": round(now - self.began, 2)})
            self._set_job(val_accuracy=event.get("val_accuracy"), val_step=event.get("step"))
        elif kind == "checkpoint" and is_leader:
            self._set_job(checkpoint=event.get("path"), checkpoint_step=event.get("step"))
        elif kind == "done" and is_leader:
            self.result = event
        elif kind == "error":
            watched.error = event.get("message")

    def _decide(self, now: float) -> bool:
        """Act on what the streams said. True when the job is done."""
        for host, link in self.links.items():
            if link.lost_since is not None:
                self._on_host_lost(host, link, now)
        for key, watched in list(self.watched.items()):
            if key not in self.watched or watched.finished:
                continue
            done = watched.tail is not None and watched.state == "exited" and watched.exit_code == 0 \
                and watched.tail.last("done") is not None
            if done and watched.task.name == self.leader.name:
                self._leader_exit = self._leader_exit or now
                continue
            if done:      # a worker that finished its share (it may end before the leader reports)
                watched.finished = True
                continue
            if watched.state in ("exited", "gone"):
                reason = "exited" if watched.state == "exited" else "vanished (no exit status)"
                if watched.state == "exited":
                    reason = (f"exited with code {watched.exit_code}" if watched.signal is None
                              else f"was killed by signal {watched.signal}")
                self._incident(watched, reason)
                return False
            if watched.frozen_since is not None and now - watched.frozen_since > FROZEN_AFTER:
                self._incident(watched, f"is frozen (stopped by a signal for {now - watched.frozen_since:.0f} s)")
                return False
            if watched.tail is not None and not watched.started and \
                    now - watched.launched > self.options.start_timeout + 15:
                self._incident(watched, f"did not start training within {self.options.start_timeout:.0f} s")
                return False
        if self.plan.mode != "async":
            stall = self.options.collective_timeout * 2 + 30
            leader = self._current(self.leader.name)
            if leader is not None and leader.started and self.result is None and now - leader.last_event > stall:
                train = [w for w in self.watched.values() if w.tail is not None]
                culprit = min(train, key=lambda w: w.last_event)
                self._incident(culprit, f"stopped making progress ({now - culprit.last_event:.0f} s without an event)")
                return False
        if self._leader_exit is not None:
            others = [w for w in self.watched.values() if w.tail is not None and w.task.name != self.leader.name
                      and not w.finished and w.state != "exited"]
            if not others or now - self._leader_exit > 30:
                if others:
                    self._stop([w.record for w in others], grace=self.options.grace)
                self._stop_job_processes(grace=1.0)
                return True
        return False

    def _current(self, task_name: str) -> Watched | None:
        found = [w for w in self.watched.values() if w.task.name == task_name]
        return found[-1] if found else None

    # ------------------------------------------------------------------ failures and recovery
    def _incident(self, watched: Watched, reason: str) -> None:
        if self.plan.mode != "async" and watched.frozen_since is None:
            # A sync peer that fails because another one froze is a victim: blame the frozen one.
            frozen = [w for w in self.watched.values() if w.frozen_since is not None]
            if frozen:
                culprit = frozen[0]
                reason = f"is frozen (stopped by a signal; {watched.task.name} {reason} waiting for it)"
                watched = culprit
        task = watched.task
        tail = hostops.log_tail(self.pool.get(self.plan.host(task.host)), watched.record.log)
        error: PsclusterError = TaskError(task.name, task.host, reason, exit_code=watched.exit_code,
                                          log_tail=tail, log_path=watched.record.log)
        self.reporter.emit("task-failed", task=task.name, host=task.host, error=reason)
        policy = self.options.restart_policy
        clean_exit = watched.state == "exited" and watched.exit_code == 0
        if policy == "never" or (policy == "on-failure" and clean_exit and watched.tail is None):
            raise self._fail(error, "restart policy 'never'" if policy == "never" else None)
        while True:
            count = self.state.restarts.get(task.name, 0)
            if count >= self.options.max_restarts:
                raise self._fail(_exhausted(error, task, self.options.max_restarts))
            delay = min(MAX_BACKOFF, self.options.backoff * (2 ** count))
            self.writer.change(lambda s: s.restarts.__setitem__(task.name, count + 1))
            self._set_job(state="restarting", restarts=self._job_restarts(),
                          message=f"{task.name}@{task.host} {reason}; restart {count + 1}/"
                                  f"{self.options.max_restarts} in {delay:.0f} s")
            self.reporter.emit("task-restarting", task=task.name, host=task.host, detail=reason,
                               attempt=count + 1, delay=delay)
            time.sleep(delay)
            try:
                self._recover(watched)
            except (TaskError, HostError) as exc:      # the restart itself failed: try again, on budget
                if isinstance(exc, HostError) and self.links.get(exc.host) is not None \
                        and self.links[exc.host].lost_since is not None:
                    raise
                error, reason = exc, exc.message.split("\n")[0]
                self.reporter.emit("task-failed", task=task.name, host=task.host, error=reason)
                continue
            break
        self.reporter.emit("task-restarted", task=task.name, host=task.host, detail=f"restart {count + 1}")

    def _recover(self, watched: Watched) -> None:
        task = watched.task
        mode = self.plan.mode
        if mode == "async" and task.standing:
            self._wait_hosts([task.host])
            self._forget_and_stop([watched])
            self._launch_server(task)
        elif mode == "async":
            self._wait_hosts([t.host for t in self.plan.tasks])
            self._forget_and_stop([watched])
            self._ensure_servers()
            self._launch_train(task, resume=True)
        else:
            self._wait_hosts([t.host for t in self.plan.tasks])
            group = [w for w in self.watched.values() if w.tail is not None]
            if mode == "sync-ps":
                group += [w for w in self.watched.values() if w.tail is None]
            self._forget_and_stop(group)
            if mode == "sync-ps":
                for server in self.plan.standing_tasks:
                    self._launch_server(server)
            for train in self.plan.training_tasks:
                self._launch_train(train, resume=True)
        self._retarget()
        self._set_job(state="running", message=None)

    def _ensure_servers(self) -> None:
        """Before a new coordinator starts: every standing server must answer. A dead one is
        restarted here, charged to its own restart budget (its failure may not have been seen
        yet when the coordinator's was)."""
        with Prober() as prober:
            for task in self.plan.standing_tasks:
                if prober.probe(task.target, timeout=2.0).ok:
                    continue
                count = self.state.restarts.get(task.name, 0)
                if count >= self.options.max_restarts:
                    raise self._fail(TaskError(task.name, task.host, "does not answer; restart budget exhausted "
                                                                     f"({self.options.max_restarts} restart(s) used)"))
                self.writer.change(lambda s: s.restarts.__setitem__(task.name, count + 1))
                self.reporter.emit("task-failed", task=task.name, host=task.host, error="does not answer")
                self.reporter.emit("task-restarting", task=task.name, host=task.host, detail="does not answer",
                                   attempt=count + 1, delay=0)
                current = self._current(task.name)
                if current is not None:
                    self._forget_and_stop([current])
                self._launch_server(task)
                self.reporter.emit("task-restarted", task=task.name, host=task.host, detail=f"restart {count + 1}")

    def _forget_and_stop(self, items: list[Watched]) -> None:
        for item in items:
            self.watched.pop(item.record.key, None)
        records = [item.record for item in items]
        self._stop(records, grace=3.0)

    def _stop(self, records: list[ProcessRecord], *, grace: float, first_signal: str = "TERM") -> None:
        if not records:
            return
        stopped, errors = stop_records(self.plan, records, self.pool, self.reporter, grace=grace,
                                       first_signal=first_signal)
        if stopped:
            self.writer.change(lambda s: [s.replace_record(record) for record in stopped])
        for host, error in errors.items():
            self.reporter.emit("message", level="warning",
                               text=f"could not stop processes on {host}: {error.message.splitlines()[0]}; "
                                    "'pscluster down' will retry")

    def _stop_job_processes(self, *, grace: float, first_signal: str = "TERM") -> None:
        records = [r for r in self.state.live_records() if r.kind == "train"]
        self._stop(records, grace=grace, first_signal=first_signal)

    def _wait_hosts(self, hosts: list[str]) -> None:
        """Block until every host in ``hosts`` answers, or fail after ``host_timeout``."""
        deadline = time.monotonic() + self.options.host_timeout
        for host in dict.fromkeys(hosts):
            link = self.links.get(host)
            while link is not None and link.lost_since is not None:
                if time.monotonic() > deadline:
                    raise self._fail(HostError(host, f"unreachable for {self.options.host_timeout:.0f} s "
                                                     f"({link.error})", hint="check the host and its network"))
                time.sleep(0.5)
                link.poll(time.monotonic())

    def _on_host_lost(self, host: str, link: HostLink, now: float) -> None:
        tasks = sorted({w.task.name for w in self.watched.values() if w.task.host == host})
        if not getattr(link, "reported", False):
            link.reported = True
            self.reporter.emit("task-lost", task=", ".join(tasks), host=host,
                               detail=f"host unreachable ({link.error})")
            self._set_job(message=f"host {host} unreachable: tasks {', '.join(tasks)} lost")
        if self.options.restart_policy == "never" or now - link.lost_since > self.options.host_timeout:
            waited = now - link.lost_since
            raise self._fail(HostError(host, f"unreachable for {waited:.0f} s; its tasks {', '.join(tasks)} are lost "
                                             f"({link.error})",
                                       hint="when the host is back, 'pscluster down' stops what is left there"))

    def _fail(self, cause: PsclusterError, why: str | None = None) -> JobFailed:
        self._stop_job_processes(grace=3.0)
        return JobFailed(cause, prefix="training failed" + (f" ({why})" if why else ""))

    def _interrupt(self) -> None:
        self.reporter.emit("message", level="warning",
                           text="stopping the job's processes (Ctrl-C again to kill them at once)")
        try:
            self._stop_job_processes(grace=self.options.grace)
        except KeyboardInterrupt:
            self._stop_job_processes(grace=0.5, first_signal="KILL")
        self._finish("stopped", message="interrupted by the user")

    # ------------------------------------------------------------------ state
    def _job_restarts(self) -> dict[str, int]:
        return {task: count for task, count in self.state.restarts.items() if count}

    def _set_job(self, **fields) -> None:
        self.state.job = dict(self.state.job or {}, **fields)

    def _publish(self, now: float, force: bool = False) -> None:
        if force or now - self._published > 1.0:
            self._published = now
            self.writer.change(lambda s: None)

    def _finish(self, final: str, **fields) -> None:
        self._set_job(state=final, ended=time.time(), **fields)
        try:
            self.writer.change(lambda s: None)
        except PsclusterError:
            pass     # the cluster was taken down meanwhile: nothing to record


def _exhausted(error: PsclusterError, task: TaskSpec, budget: int) -> PsclusterError:
    """The final error once a task used its restarts: the last failure, with its log lines."""
    if isinstance(error, TaskError):
        return TaskError(error.task, error.host, f"{error.message.split(': ', 1)[-1].splitlines()[0]}; "
                                                 f"restart budget exhausted ({budget} restart(s) used)",
                         exit_code=error.task_exit_code, log_tail=error.log_tail, log_path=error.log_path,
                         hint="the log lines above are from its last attempt; "
                              f"'pscluster logs {task.name}' shows all")
    return TaskError(task.name, task.host, f"{error.message}; restart budget exhausted ({budget} restart(s) used)")


def _orchestrator_alive(job: dict) -> bool:
    info = job.get("orchestrator") or {}
    if info.get("host") != socket.gethostname() or not info.get("pid"):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
