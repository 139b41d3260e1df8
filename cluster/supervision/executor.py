"""The acting half of supervision: launch, watch, stop, restart -- decisions come from
:mod:`cluster.supervision.core`.

:class:`JobExecutor` runs one job on a cluster that is up, to its end: done, failed for good,
or interrupted. It records the job (:class:`~cluster.jobrecord.JobProgress`) and every process
in the cluster state before waiting on it, watches every process of the job through one
:class:`~cluster.supervision.links.HostLink` per host, and on each turn of its loop asks the
core for an incident, a verdict and a recovery plan, then carries it out. It holds one job kind
(:class:`~cluster.supervision.jobkind.JobKind`): ``train``
(:class:`cluster.supervision.train_job.TrainJob`) or ``run``
(:class:`cluster.supervision.program_job.ProgramJob`); the kind supplies how to launch a task, what
the watched files say, the watchdog, the recovery table and when the job is complete.

Clock and sleep are passed in (``clock``, ``sleep``, ``wall``) so tests can replace them.
"""
from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from ..hosts import hostops
from ..contracts import CLEANUP_GRACE, DEFAULT_GRACE, JobState, Phase, ProcessKind, ProcState, RestartPolicy
from ..errors import HostEndedError, HostError, PsclusterError, TaskError, UsageError
from .daemon import DaemonFiles, job_conflict, run_gone
from ..liveness import orchestrator_alive, process_starttime, stop_supervisor
from ..events import Reporter
from ..fanout import fan_out
from ..history import DEFAULT_KEEP, LogFile, RunHistory, RunRecord, remove_runs
from ..lifecycle.tasks import start_task, stop_records, task_env, wait_ready
from ..plan import ClusterPlan, TaskSpec
from ..hosts.probe import Prober
from ..secrets import Secrets
from ..jobrecord import JobProgress, Orchestrator, job_exit_status
from ..state import ProcessRecord, RunState, StateStore, StateWriter
from ..transport import TransportPool
from ..transport.limits import ensure_open_files
from . import core
from .jobkind import JobFailed, JobInterrupted, JobKind, Watched
from .links import HostLink

LOOP_SECONDS = 0.1          # bounds how late an exit or event is acted on; cheap when idle
DEAF_SLACK = 1.0            # a turn longer than LOOP_SECONDS by more than this did not listen meanwhile
DECIDE_SECONDS = 0.5        # a turn that heard nothing decides again at most this often
PUBLISH_SECONDS = 1.0       # how often the job record is written while nothing else changes
SERVER_READY_TIMEOUT = 120.0
REPLACE_TIMEOUT = 300.0     # --replace: the old job's leader may take --stop-grace to checkpoint, then its grace


K = TypeVar("K", bound=JobKind)


OUT_OF_ALLOCATION = "is out of the Slurm job's allocation (a failed node)"     # why a host left for good


class JobExecutor(Generic[K]):
    """Runs one job's processes; its ``kind`` says what the job is (see the module docstring)."""

    def __init__(self, kind: K, *, store: StateStore, name: str, reporter: Reporter, pool: TransportPool, root: Path,
                 rules: core.RestartRules, host_timeout: float = 60.0, grace: float = DEFAULT_GRACE,
                 secrets: Secrets | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, wall: Callable[[], float] = time.time,
                 detached: DaemonFiles | None = None, replace: bool = False, keep: int = DEFAULT_KEEP):
        self.kind = kind
        self.store = store
        self.name = name
        self.reporter = reporter
        self.pool = pool
        self.root = root
        self.rules = rules
        self.host_timeout = host_timeout
        self.grace = grace
        self.secrets = secrets
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        self.detached = detached          # this process is the daemon of --detach (its files)
        self.replace = replace            # --replace: stop a live job first instead of refusing
        self.keep = keep                  # runs of this name whose logs are kept (history.py)
        self.watched: dict[str, Watched] = {}
        # file path -> the watched processes reading it, for each chunk a stream brings (one per
        # host a second): looking through every watched process per chunk grew as N² (issue 46)
        self._by_file: dict[str, list[Watched]] = {}
        self._made = itertools.count(1)
        self._added = 0           # a fresh number per Watched entry made (adopt, watch_server; launch threads too)
        self._indexed: tuple[int, int] = (-1, 0)     # (that number, how many were watched) at the index's build
        self.links: dict[str, HostLink] = {}
        self.offsets: dict[str, int] = {}       # watched file -> bytes consumed so far
        self.began = clock()
        self._published = 0.0
        self._decided = float("-inf")      # when decide() last ran

    # ------------------------------------------------------------------ the job record
    def _load(self) -> RunState:
        with self.store.lock(self.name):
            state = self.store.load(self.name)
            if state is None:
                raise UsageError(f"no cluster named {self.name!r}")
            if state.phase != Phase.UP:
                raise UsageError(f"cluster {self.name!r} is {state.phase}, not up",
                                 hint="bring it up with 'pscluster up INVENTORY'")
        return state

    def claim(self) -> RunState:
        """The cluster's state once no other job runs on it: a live job (its supervisor runs,
        or its processes still run without one) is refused, or stopped first with ``replace``.
        Processes of an earlier job that are recorded but gone are cleaned up by :meth:`run`."""
        while True:
            state = self._load()
            job = state.job
            alive = job is not None and job.live and orchestrator_alive(job.orchestrator)
            stale = [r for r in state.live_records() if r.kind in (ProcessKind.TRAIN, ProcessKind.PROGRAM)]
            running = 0 if alive or not stale else self.count_running(state, stale)
            conflict = job_conflict(self.name, job, supervisor_alive=alive, running=running)
            if conflict is None or (not alive and self.replace):
                return state
            if not self.replace:
                raise UsageError(conflict.message, hint=conflict.hint)
            info = job.orchestrator if job is not None else None
            if job is None or info is None:       # cannot be: a live supervisor is a recorded one
                raise UsageError(conflict.message, hint=conflict.hint)
            self.reporter.emit("message", level="warning",
                               text=f"--replace: stopping job {job.id} ({job.job}) first (its supervisor, "
                                    f"pid {info.pid}, checkpoints and stops it)")
            if not stop_supervisor(info, timeout=REPLACE_TIMEOUT, sleep=self.sleep):
                raise PsclusterError(f"job {job.id}'s supervisor (pid {info.pid}) did not stop within "
                                     f"{REPLACE_TIMEOUT:.0f} s", hint=f"'pscluster stop-job --name {self.name}' again")

    def count_running(self, state: RunState, records: list[ProcessRecord]) -> int:
        """How many of ``records`` still run on their hosts (a host that does not answer counts
        its records as running: better refuse than start beside them)."""
        by_host: dict[str, list[ProcessRecord]] = {}
        for record in records:
            by_host.setdefault(record.host, []).append(record)
        running = 0
        for host, items in by_host.items():
            try:
                found = hostops.status(self.pool.get(state.plan.host(host)), items)
            except PsclusterError:
                running += len(items)
                continue
            running += sum(1 for item in items if found.get(item.key) is not None
                           and found[item.key].state in (ProcState.RUNNING, ProcState.FROZEN))
        return running

    @property
    def progress(self) -> JobProgress:
        """The job record of the job this executor runs (set when the job starts)."""
        if self.state.job is None:
            raise RuntimeError("no job record: the job has not started")
        return self.state.job

    def set_job(self, **fields: Any) -> None:
        self.state.job = self.progress.updated(**fields)

    def publish(self, now: float, force: bool = False) -> None:
        if force or now - self._published > PUBLISH_SECONDS:
            self._published = now
            wall = self.wall()
            # `status` shows the heartbeat's age (the supervisor's pulse), and answers from what
            # the streams said for the hosts heard lately instead of asking each (issue 46).
            self.set_job(heartbeat=wall, **heard(self.links, self.watched, now=now, wall=wall))
            self.writer.change(lambda s: None)

    def finish(self, final: JobState, **fields: Any) -> None:
        self.set_job(state=final, ended=self.wall(), **fields)
        try:
            self.writer.change(lambda s: None)
        except PsclusterError:
            pass     # the cluster was taken down meanwhile: nothing to record
        self.record_run(final, exit_code=int(job_exit_status(final, fields.get("result"))))
        self.prune_runs()

    # ------------------------------------------------------------------ the run history (cluster/history.py)
    def record_run(self, final: JobState | None = None, exit_code: int | None = None) -> None:
        """This job in the run history: at its start, once its processes run (their logs), at its end."""
        # A host an elastic job dropped is no longer in its plan: its logs cannot be read later.
        known = {host.name: host for plan in (self.state.plan, self.plan) for host in plan.hosts}
        logs = tuple(LogFile(r.task, r.host, r.log, r.attempt) for r in self.state.processes
                     if r.kind in (ProcessKind.TRAIN, ProcessKind.PROGRAM) and r.in_job(self.job_id)
                     and r.host in known)
        hosts = tuple(known[name] for name in dict.fromkeys(log.host for log in logs))
        job = self.state.job
        record = RunRecord(name=self.name, id=self.job_id, entry=self.kind.entry, command=self.kind.command(),
                           started=(job.started if job and job.started else self.wall()),
                           ended=None if final is None else self.wall(),
                           state=str(final or JobState.RUNNING), exit_code=exit_code,
                           one_shot=self.kind.one_shot, logs=logs, hosts=hosts)
        try:
            self.history.save(record)
        except (OSError, PsclusterError) as exc:     # the history is for later reading; the job goes on
            self.reporter.emit("message", level="warning", text=f"could not record run {self.job_id}: {exc}")

    def prune_runs(self) -> None:
        """Older runs of this name beyond ``keep``: their folders on the hosts and their records."""
        try:
            stale = self.history.beyond(self.name, self.keep, gone=run_gone(self.store), now=self.wall())
            _, problems = remove_runs(self.history, stale, self.pool)
        except (OSError, PsclusterError) as exc:     # never hides the job's own outcome
            problems = [f"could not remove old runs of {self.name!r}: {exc}"]
        for problem in problems:
            self.reporter.emit("message", level="warning", text=problem)

    def job_restarts(self) -> dict[str, int]:
        return core.restarts_in_job(self.progress.restarts)

    # ------------------------------------------------------------------ running
    def run(self) -> dict[str, Any]:
        """Run the job to its end and return its report.

        Raises:
            JobFailed: the job failed for good (the root cause inside).
            JobInterrupted: Ctrl-C (or SIGTERM/SIGHUP); the job's processes were stopped.
        """
        with self.kind.running(self):
            self.begin()
            return self._run()

    def begin(self) -> None:
        """The job's start, before anything of it runs: the cluster claimed (:meth:`claim`), its
        plan and state taken, what an earlier, orphaned job left running stopped, the job numbered
        and recorded (its job record in the state, its run in the history). :meth:`run` calls it;
        tests of what the executor decides call it alone."""
        self.began = self.clock()
        self.state = self.claim()
        self.plan: ClusterPlan = self.state.plan
        ensure_open_files(len(self.plan.hosts))     # the supervisor holds a connection per host
        self.writer = StateWriter(self.store, self.state, expect_phase=Phase.UP)
        stale = [r for r in self.state.live_records() if r.kind in (ProcessKind.TRAIN, ProcessKind.PROGRAM)]
        if stale:     # an earlier job whose orchestrator was killed
            self.reporter.emit("message", text=f"stopping {len(stale)} process(es) of an earlier, orphaned job")
            self.stop(stale, grace=CLEANUP_GRACE)
        # Numbers count up per name across up/down and one-shot runs: each run's folder is its own.
        self.history = RunHistory(self.store.root)
        self.job_id = max(self.state.job.id if self.state.job else 0, self.history.last_id(self.name)) + 1
        self.writer.change(lambda s: setattr(s, "job", self.new_job()))
        self.record_run()

    def _run(self) -> dict[str, Any]:
        """The job once :meth:`begin` started it, to its end."""
        try:
            self.kind.prepare(self)
            self.kind.launch_group(self)
            self.retarget()
            self.record_run()
            self.set_job(state=JobState.RUNNING)
            self.announce("started", self.job_record())
            self.loop()
            report = self.kind.summary(self)
            self.finish(JobState.DONE, result=report)
            self.announce("deadline" if report.get("deadline_reached") else "finished", report)
            return report
        except KeyboardInterrupt:
            self.interrupt()
            message, hint = self.kind.interrupted(self)
            self.announce("stopped", {"message": message})
            raise JobInterrupted(message, hint=hint) from None
        except JobFailed as exc:
            self.finish(JobState.FAILED, message=str(exc.cause))
            self.announce("failed", {"message": exc.message})
            raise
        except Exception as exc:      # PsclusterError, or a bug: never leave the job running
            self.stop_job_processes(grace=CLEANUP_GRACE)
            self.finish(JobState.FAILED, message=str(exc) or type(exc).__name__)
            self.announce("failed", {"message": getattr(exc, "message", str(exc)) or type(exc).__name__})
            raise
        finally:
            for link in self.links.values():
                link.close()

    def new_job(self) -> JobProgress:
        progress = JobProgress(id=self.job_id, job=self.kind.job_name(), mode=self.plan.mode, entry=self.kind.entry,
                               state=JobState.STARTING, started=self.wall(), heartbeat=self.wall(),
                               orchestrator=self.orchestrator(), workers=len(self.plan.tasks_of("worker")))
        return self.kind.new_job(self, progress)

    def job_record(self) -> dict[str, Any]:
        """The job record as reports and notifications show it (no orchestrator pid)."""
        record = self.progress.to_json()
        record.pop("orchestrator", None)
        return record

    def announce(self, event: str, report: dict[str, Any]) -> None:
        """A change of the job's state (``job-state`` event; see :mod:`cluster.notify.notifier`)."""
        self.reporter.emit("job-state", cluster=self.name, job=self.kind.job_name(), job_id=self.job_id,
                           entry=self.kind.entry, event=event, time=self.wall(), report=report)

    def orchestrator(self) -> Orchestrator:
        """This process, as the job's supervisor (a detached daemon records its files too)."""
        pid, host = os.getpid(), socket.gethostname()
        if self.detached is not None:
            return self.detached.orchestrator(pid, host)
        return Orchestrator(pid, host, starttime=process_starttime(pid))

    def loop(self) -> None:
        turn = self.clock()
        while True:
            now = self.clock()
            self.forgive_deafness(now - turn)
            turn = now
            self.kind.between_turns(self)
            updates = self.read_streams(now)
            # Coalesced: a turn that heard nothing that matters (a heartbeat, a program's output)
            # and lost no host decides again only every DECIDE_SECONDS (the time-based checks:
            # frozen, start timeout, stall, linger, all of seconds); a changed state or a
            # trainer's event is acted on in the turn it arrives (issue 46: with a program's line
            # a second from every host, every turn decided over every process).
            quiet = not updates and now - self._decided < DECIDE_SECONDS and all(
                link.lost_since is None for link in self.links.values())
            if not quiet:
                self._decided = now
                if self.decide(now):
                    return
            self.publish(now)
            self.sleep(LOOP_SECONDS)

    def forgive_deafness(self, gap: float) -> None:
        """Silence counts only while this loop listens: a turn that blocked (a restart waiting for
        its server to answer, a resize) read no event meanwhile, so every process's last event
        moves on by the time it was not heard. Otherwise the next turn took the trainers' own
        progress, unread, for a stall (measured: a worker's restart held the loop 16 s and the
        job showed 'no progress for 16 s' while the chief had trained 700 steps), and the
        slowest unit of work, which the stall limit is derived from, grew by as much."""
        deaf = gap - LOOP_SECONDS - DEAF_SLACK
        if deaf > 0:
            for watched in self.watched.values():
                watched.last_event += deaf

    def read_streams(self, now: float) -> int:
        """What every host's watch stream said since the last turn (exits, events, output);
        how many of those updates matter to :meth:`decide` (:meth:`absorb`)."""
        count = 0
        for link in list(self.links.values()):
            for update in link.poll(now):
                count += self.absorb(update, now)
        return count

    def absorb(self, update: hostops.WatchUpdate, now: float) -> bool:
        """Take in one update; whether it matters to :meth:`decide` now: a process's state, exit
        or signal changed, or a process other than a program's got bytes (a trainer's events)."""
        matters = False
        for key, status in update.states.items():
            watched = self.watched.get(key)
            if watched is None:
                continue
            matters = matters or (watched.state.value, watched.exit_code, watched.signal) != \
                (status.state, status.exit_code, status.signal)
            watched.state = ProcState(status.state)
            watched.exit_code, watched.signal = status.exit_code, status.signal
            watched.frozen_since = (watched.frozen_since or now) if watched.state is ProcState.FROZEN else None
        for chunk in update.reads:
            if chunk.offset != self.offsets.get(chunk.path, 0) or not chunk.data:
                continue        # from a stream opened before the last chunk was consumed: already seen
            self.offsets[chunk.path] = chunk.end
            for watched in self.watchers_of(chunk.path):
                matters = matters or watched.kind is not ProcessKind.PROGRAM
                self.kind.on_chunk(self, watched, chunk, now)
        for key, status in update.states.items():      # after the chunks: a final event comes first
            watched = self.watched.get(key)
            if watched is not None and watched.ended_at is None and watched.state in (ProcState.EXITED, ProcState.GONE):
                watched.ended_at = now
                self.kind.on_exit(self, watched, now)
        return matters

    def watchers_of(self, path: str) -> list[Watched]:
        """The watched processes that read ``path`` (their ``files``), in the order they were watched."""
        # Built again after an entry was made (or put in directly: the count changed), for a path
        # it does not hold (a file nobody reads: the cost of a look through all, as before), and
        # when one it lists was forgotten since (its file may have a reader now that it missed).
        listed = self._by_file.get(path)
        if listed is not None and self._indexed == (self._added, len(self.watched)):
            found = [w for w in listed if self.watched.get(w.record.key) is w]
            if len(found) == len(listed):
                return found
        version = (self._added, len(self.watched))   # read first: an entry made after it changes it
        by_file: dict[str, list[Watched]] = {}
        for watched in list(self.watched.values()):
            for name in watched.files:
                by_file.setdefault(name, []).append(watched)
        self._by_file, self._indexed = by_file, version
        return list(by_file.get(path, ()))

    def views(self) -> list[core.Proc]:
        return [watched.view() for watched in self.watched.values()]

    def decide(self, now: float) -> bool:
        """Act on what the streams said. True when the job is done."""
        views = [core.HostView(host, link.lost_since, link.error) for host, link in self.links.items()]
        for view in views:
            if view.lost_since is not None:
                self.on_host_lost(self.links[view.host])
        if self.went_for_good():
            return False
        lost = core.lost_host_failure(views, now=now, host_timeout=self.host_timeout, policy=self.rules.policy)
        if lost is not None and self.kind.drop_out(self, lost.host, f"lost for over {self.host_timeout:.0f} s ({lost.error})"):
            return False
        if lost is not None:
            tasks = self.tasks_on(lost.host)
            raise self.fail(HostError(lost.host, f"unreachable for {now - (lost.lost_since or now):.0f} s; its tasks "
                                                 f"{', '.join(tasks)} are lost ({lost.error})",
                                      hint="when the host is back, 'pscluster down' stops what is left there"))
        incident = core.find_incident(self.views(), now=now, watch=self.kind.watchdog(self))
        if incident is not None:
            self.handle(incident)
            return False
        return self.kind.complete(self, now)

    def went_for_good(self) -> bool:
        """A host gone for good with its tasks (:attr:`HostLink.ended`: its Slurm job ended, or the
        node left the allocation): no host timeout to wait. The job fails with the reason when the
        whole job ended or the kind cannot go on without the host; True: it went on without it."""
        ended = [link.ended for link in self.links.values() if link.ended is not None]
        whole = next((error for error in ended if error.whole_job), None)
        if whole is not None:
            raise self.fail(whole)
        if not ended:
            return False
        first = ended[0]
        if self.kind.drop_out(self, first.host, OUT_OF_ALLOCATION):
            return True
        raise self.fail(first)

    def tasks_on(self, host: str) -> list[str]:
        return sorted({w.task.name for w in self.watched.values() if w.task.host == host})

    def on_host_lost(self, link: HostLink) -> None:
        if link.reported:
            return
        link.reported = True
        tasks = self.tasks_on(link.host.name)
        self.reporter.emit("task-lost", task=", ".join(tasks), host=link.host.name,
                           detail=f"host unreachable ({link.error})")
        self.set_job(message=f"host {link.host.name} unreachable: tasks {', '.join(tasks)} lost")

    # ------------------------------------------------------------------ failures
    def handle(self, incident: core.Incident) -> None:
        """Restart per policy and budget (retrying a restart that itself fails), or fail."""
        # Processes ended by `down` are not failures to restart: Aborted if the cluster is going.
        self.writer.change(lambda s: None)
        proc = incident.proc
        watched = self.watched[proc.key]
        reason = incident.reason
        error: PsclusterError = TaskError(proc.task, proc.host, reason, exit_code=proc.exit_code,
                                          log_tail=self.log_tail(watched.record), log_path=watched.record.log)
        self.reporter.emit("task-failed", task=proc.task, host=proc.host, error=reason)
        while True:
            used = self.progress.restarts.get(proc.task, 0)
            verdict = core.verdict(self.rules, incident, used)
            if verdict.action is core.Action.ACCEPT:
                watched.finished = True
                return
            if verdict.action is core.Action.GIVE_UP:
                self.give_up(watched, f"{reason}; {verdict.why}")
                return
            if verdict.action is core.Action.FAIL:
                used_up = verdict.reason is core.FailReason.BUDGET
                if verdict.for_good and self.kind.drop_out(
                        self, proc.host, f"used up its restarts ({reason})" if used_up else f"failed ({reason})", task=proc.task):
                    return
                if used_up:
                    raise self.fail(exhausted(error, watched.task, self.rules.max_restarts))
                raise self.fail(error, verdict.why)
            self.count_restart(proc.task, message=f"{proc.task}@{proc.host} {reason}; restart {used + 1}/"
                                                  f"{self.rules.max_restarts} in {verdict.delay:.0f} s")
            self.reporter.emit("task-restarting", task=proc.task, host=proc.host, detail=reason,
                               attempt=used + 1, delay=verdict.delay)
            self.sleep(verdict.delay)
            try:
                if not self.carry_out(self.kind.recovery(self, incident)):
                    return      # a host it waited for was lost for good: the job went on without it
            except (TaskError, HostError) as exc:      # the restart itself failed: try again, on budget
                if isinstance(exc, HostEndedError) and exc.whole_job:
                    raise self.fail(exc)               # its Slurm job ended: nothing can start again
                if isinstance(exc, HostError) and exc.host in self.links and self.links[exc.host].lost_since is not None:
                    if self.kind.drop_out(self, exc.host, f"lost while restarting {proc.task} ({exc.message.splitlines()[0]})"):
                        return
                    raise
                error, reason = exc, exc.message.split("\n")[0]
                self.reporter.emit("task-failed", task=proc.task, host=proc.host, error=reason)
                continue
            break
        self.reporter.emit("task-restarted", task=proc.task, host=proc.host, detail=f"restart {used + 1}")
        self.announce("restarted", {"task": proc.task, "host": proc.host, "reason": reason, "restart": used + 1,
                                    "max_restarts": self.rules.max_restarts})

    def give_up(self, watched: Watched, why: str) -> None:
        """Leave a task out of the rest of the job (the evaluator: training does not need it)."""
        self.forget_and_stop([watched])
        text = f"{watched.task.name} given up ({why}); training goes on without it"
        self.reporter.emit("message", level="warning", text=text)
        self.set_job(message=text)

    def count_restart(self, task: str, *, message: str | None = None) -> None:
        """One more restart of ``task``: in this job's budget and in the cluster's lifetime count."""
        restarts = dict(self.progress.restarts)
        restarts[task] = restarts.get(task, 0) + 1
        self.set_job(state=JobState.RESTARTING, restarts=restarts,
                     **({"message": message} if message else {}))
        self.writer.change(lambda s: s.restarts.__setitem__(task, s.restarts.get(task, 0) + 1))

    def carry_out(self, recovery: core.Recovery) -> bool:
        """Carry ``recovery`` out; False when a host it waits for was lost beyond --host-timeout and
        the job went on without it instead (:meth:`wait_hosts`): the recovery is moot then."""
        if not self.wait_hosts(recovery.wait_hosts):
            return False
        self.forget_and_stop([self.watched[key] for key in recovery.stop if key in self.watched])
        for name in recovery.restart_servers:
            self.launch_server(self.plan.task(name))
        if recovery.ensure_servers:
            self.ensure_servers()
        for name in recovery.relaunch:
            self.kind.relaunch(self, self.plan.task(name))
        self.retarget()
        self.set_job(state=JobState.RUNNING, message=None)
        return True

    def fail(self, cause: PsclusterError, why: str | None = None) -> JobFailed:
        self.stop_job_processes(grace=CLEANUP_GRACE)
        failed = JobFailed(cause, prefix=self.kind.failure_prefix + (f" ({why})" if why else ""))
        more = self.kind.failure_hint(self)
        if more:
            failed.hint = f"{failed.hint}; {more}" if failed.hint else more
        return failed

    def interrupt(self) -> None:
        self.kind.before_interrupt(self)
        self.reporter.emit("message", level="warning",
                           text="stopping the job's processes (Ctrl-C again to kill them at once)")
        try:
            self.stop_job_processes(grace=self.grace)
        except KeyboardInterrupt:
            self.stop_job_processes(grace=0.5, first_signal="KILL")
        self.finish(JobState.STOPPED, message="interrupted by the user")

    def log_tail(self, record: ProcessRecord) -> str:
        return hostops.log_tail(self.pool.get(self.plan.host(record.host)), record.log)

    # ------------------------------------------------------------------ launching and stopping
    def attempt(self, task: TaskSpec, kind: ProcessKind) -> int:
        return self.state.next_attempt(task.name, kind, None if kind is ProcessKind.SERVER else self.job_id)

    def launch(self, task: TaskSpec, record: ProcessRecord, *, argv: Sequence[str], env: dict[str, str],
               kind: ProcessKind, files: Sequence[str] = (), standby: ProcessRecord | None = None) -> Watched:
        started = start_task(self.writer, self.pool, self.plan, task, record, argv=argv, env=env,
                             reporter=self.reporter, standby=standby)
        return self.adopt(task, started, kind, files=files)

    def adopt(self, task: TaskSpec, record: ProcessRecord, kind: ProcessKind, *, files: Sequence[str] = ()) -> Watched:
        """Watch a job process that runs now, from now on: one :meth:`launch` started, or one a
        job kind started before the job reached it (a sync resize's next incarnation)."""
        now = self.clock()
        watched = Watched(task, record, kind, launched=now, last_event=now, files=tuple(files))
        self.watched[record.key] = watched
        self._added = next(self._made)
        return watched

    def watch_server(self, task: TaskSpec, record: ProcessRecord) -> Watched:
        """Watch a standing server that runs (started by ``up``, an earlier restart, or before
        its host was lost)."""
        watched = Watched(task, record, ProcessKind.SERVER, launched=self.clock())
        self.watched[record.key] = watched
        self._added = next(self._made)
        return watched

    def forget(self, items: Iterable[Watched]) -> None:
        """Watch ``items`` no more, and leave them as they are (stopped by the caller, or on a
        lost host, stopped when it answers again or by ``down``)."""
        for item in list(items):
            self.watched.pop(item.record.key, None)

    def replace_plan(self, plan: ClusterPlan) -> None:
        """The job goes on at ``plan``: a resize brought the servers and the state in line with it."""
        self.plan = plan

    def use_secrets(self, secrets: Secrets | None) -> None:
        """The secrets the launches from now on are given (a resize's request: the new plan's scope)."""
        self.secrets = secrets

    def launch_many(self, tasks: Sequence[TaskSpec], one: Callable[[TaskSpec], Watched]) -> None:
        """Launch one process per task, all hosts in parallel; the first error (in task order)
        is raised once every launch has ended. One thread per task, not capped: each launch
        mostly waits on its host. The job record's heartbeat goes on meanwhile (at 256 hosts the
        launch took over a minute, and `status` said the heartbeat was 71 s old)."""
        fan_out(tasks, one, name="launch", catch=(), max_workers=max(1, len(tasks)),
                tick=self.publish_quietly, tick_every=PUBLISH_SECONDS)

    def publish_quietly(self) -> None:
        """A heartbeat between two loop turns; a state that cannot be written now waits for the next."""
        if self.state.job is None:
            return
        try:
            self.publish(self.clock())
        except PsclusterError:
            pass

    def launch_server(self, task: TaskSpec) -> Watched:
        from ..lifecycle.tasks import new_record
        record = new_record(task, kind=ProcessKind.SERVER, attempt=self.attempt(task, ProcessKind.SERVER))
        watched = self.launch(task, record, argv=task.argv, env=task_env(self.plan, task, self.secrets, standing=True), kind=ProcessKind.SERVER)
        try:
            with Prober() as prober:
                wait_ready(self.plan, {task.name: watched.record}, self.pool, prober, self.reporter,
                           timeout=SERVER_READY_TIMEOUT)
        except BaseException:
            self.watched.pop(watched.record.key, None)     # a failed attempt is not part of the job
            raise
        watched.launched = self.clock()
        return watched

    def watch_servers(self) -> None:
        """Add the standing servers (started by ``up`` or by an earlier restart) to the watch."""
        for task in self.plan.standing_tasks:
            record = self.state.latest(task.name)
            if record is not None and not record.stopped and record.key not in self.watched:
                self.watch_server(task, record)

    def ensure_servers(self) -> None:
        """Before a new coordinator starts: every standing server must answer. A dead one is
        restarted here, charged to its own restart budget (its failure may not have been seen
        yet when the coordinator's was). A host out in place (:meth:`JobKind.out_in_place`) is
        left alone: its servers start again when it is taken back."""
        out = self.kind.out_in_place(self)
        with Prober() as prober:
            for task in self.plan.standing_tasks:
                if task.host in out or prober.probe(task.target, timeout=2.0,
                                                    via=self.pool.get(self.plan.host(task.host))).ok:
                    continue
                used = self.progress.restarts.get(task.name, 0)
                if used >= self.rules.max_restarts:
                    raise self.fail(TaskError(task.name, task.host, "does not answer; restart budget exhausted "
                                                                     f"({self.rules.max_restarts} restart(s) used)"))
                self.count_restart(task.name)
                self.reporter.emit("task-failed", task=task.name, host=task.host, error="does not answer")
                self.reporter.emit("task-restarting", task=task.name, host=task.host, detail="does not answer",
                                   attempt=used + 1, delay=0)
                current = self.current(task.name)
                if current is not None:
                    self.forget_and_stop([current])
                self.launch_server(task)
                self.reporter.emit("task-restarted", task=task.name, host=task.host, detail=f"restart {used + 1}")
                self.announce("restarted", {"task": task.name, "host": task.host, "reason": "does not answer",
                                            "restart": used + 1, "max_restarts": self.rules.max_restarts})

    def lost_hosts(self) -> set[str]:
        """The hosts whose link is lost now (silent past the host timeout's start: links.py)."""
        return {name for name, link in self.links.items() if link.lost_since is not None}

    def current(self, task_name: str) -> Watched | None:
        found = [w for w in self.watched.values() if w.task.name == task_name]
        return found[-1] if found else None

    def retarget(self) -> None:
        """Point each host's watch stream at the job's current processes and files."""
        by_host: dict[str, list[Watched]] = {}
        for watched in self.watched.values():
            by_host.setdefault(watched.task.host, []).append(watched)
        for host, items in by_host.items():
            link = self.links.get(host)
            if link is None:
                link = self.links[host] = HostLink(self.plan.host(host), self.pool, clock=self.clock,
                                                   offset_of=lambda path: self.offsets.get(path, 0))
            link.set_targets([w.record for w in items], [path for w in items for path in w.files])
        for host in set(self.links) - set(by_host):
            self.links.pop(host).close()

    def forget_and_stop(self, items: list[Watched]) -> None:
        self.forget(items)
        self.stop([item.record for item in items], grace=CLEANUP_GRACE)

    def stop(self, records: list[ProcessRecord], *, grace: float, first_signal: str = "TERM") -> None:
        if not records:
            return
        stopped, errors = stop_records(self.plan, records, self.pool, self.reporter, grace=grace,
                                       first_signal=first_signal)
        if stopped:
            self.writer.change(lambda s: s.replace_records(stopped))
        for host, error in errors.items():
            self.reporter.emit("message", level="warning",
                               text=f"could not stop processes on {host}: {error.message.splitlines()[0]}; "
                                    "'pscluster down' will retry")
        self.kind.on_stopped(self, records)

    def stop_job_processes(self, *, grace: float, first_signal: str = "TERM") -> None:
        records = [r for r in self.state.live_records() if r.kind in (ProcessKind.TRAIN, ProcessKind.PROGRAM)]
        self.stop(records, grace=grace, first_signal=first_signal)

    def wait_hosts(self, hosts: Sequence[str]) -> bool:
        """Block until every host in ``hosts`` answers (True). A host lost for longer than
        ``host_timeout`` (counted from its loss, as :meth:`decide` counts it: a task that failed
        with its host, e.g. the async chief with a lost ps, restarts within the same bound) is
        the job kind's to go on without (False: :meth:`JobKind.drop_out`, e.g. a ps moved
        elsewhere), else the job fails naming it."""
        started = self.clock()
        for host in dict.fromkeys(hosts):
            link = self.links.get(host)
            while link is not None and link.lost_since is not None:
                if link.ended is not None and link.ended.whole_job:
                    raise self.fail(link.ended)
                if link.ended is not None:          # out of the Slurm allocation: gone for good now
                    if self.kind.drop_out(self, host, OUT_OF_ALLOCATION):
                        return False
                    raise self.fail(link.ended)
                lost_for = self.clock() - min(link.lost_since, started)
                if lost_for > self.host_timeout:
                    if self.kind.drop_out(self, host, f"lost for over {self.host_timeout:.0f} s ({link.error})"):
                        return False
                    raise self.fail(HostError(host, f"unreachable for {lost_for:.0f} s ({link.error})",
                                              hint="check the host and its network"))
                self.sleep(0.5)
                link.poll(self.clock())
        return True


def heard(links: dict[str, HostLink], watched: dict[str, Watched], *, now: float, wall: float) -> dict[str, Any]:
    """The job record's ``hosts_heard`` (wall time each answering host's stream was last heard;
    ``now`` is the executor's clock, ``wall`` the wall clock at that moment) and ``proc_states``
    (each watched process's last state), ``watch_pids`` (each host's watch process)."""
    # Copies first: a launch's threads add to ``watched`` while a heartbeat is written (launch_many).
    links_now, watched_now = list(links.items()), list(watched.items())
    return {"hosts_heard": {host: round(wall - (now - link.last_seen), 2)
                            for host, link in links_now
                            if link.lost_since is None and link.stream is not None and link.last_seen >= link.opened_at},
            "proc_states": {key: item.state.value for key, item in watched_now},
            "watch_pids": {host: link.watch_pid for host, link in links_now if link.watch_pid is not None}}


def exhausted(error: PsclusterError, task: TaskSpec, budget: int) -> PsclusterError:
    """The final error once a task used its restarts: the last failure, with its log lines."""
    if isinstance(error, TaskError):
        return TaskError(error.task, error.host, f"{error.message.split(': ', 1)[-1].splitlines()[0]}; "
                                                 f"restart budget exhausted ({budget} restart(s) used)",
                         exit_code=error.task_exit_code, log_tail=error.log_tail, log_path=error.log_path,
                         hint=(error.hint + "; " if error.hint else "") + "the log lines above are from its last "
                              f"attempt; 'pscluster logs {task.name}' shows all")
    return TaskError(task.name, task.host, f"{error.message}; restart budget exhausted ({budget} restart(s) used)")


def restart_rules(policy: str, max_restarts: int, backoff: float = 1.0) -> core.RestartRules:
    return core.RestartRules(RestartPolicy(policy), max_restarts, backoff)
