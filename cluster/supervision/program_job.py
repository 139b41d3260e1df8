"""``pscluster run``: the user's own program on every task that should run it, supervised.

Two ways in (see :mod:`cluster.program.runspec` for the pure parts):

* on a cluster that is up (``run [--name N] -- PROGRAM ...``): the program runs on every task
  that has no standing server (or the roles of ``--on``), beside the servers ``up`` started;
* one shot (``run INVENTORY -- PROGRAM ...``): :func:`run_one_shot` brings the cluster up with
  every task of the chosen roles planned as a program process (no standing server: preflight,
  code sync and firewall only), runs the program on all of them, and always takes the cluster
  down again, so nothing is left behind.

:class:`ProgramJob` is the ``run`` job kind of the shared executor: the program's output
streams live from each host's watch stream (the task's log file) to the reporter as ``output``
events; the run ends as ``--until`` says (:func:`cluster.supervision.core.program_end`: by
default when the chief exits, as TFJob's success policy has it, else when every worker has);
the tasks still running then (a ps in ``server.join()``, an evaluator loop, the workers of a
ParameterServerStrategy program) are stopped. A failure follows the restart policy (default
``never``: an arbitrary program may not be safe to restart).
"""
from __future__ import annotations

import functools
import posixpath
import shlex
from dataclasses import replace
from typing import Any, Callable, Sequence

from ..hosts import hostops
from ..hosts.codesync import LocalFile, needs_sync, sync_and_record, sync_files
from ..contracts import ExitStatus, Mode, ProcessKind, RestartPolicy, Role, TensorFlowNeed, Until
from ..errors import Failure, HostError, MultiHostError, PsclusterError, UsageError
from ..events import Reporter
from ..fanout import fan_out
from ..program.importscan import ImportedModule, scan_program
from ..lifecycle.tasks import check_ports_free
from ..lifecycle.updown import bring_down, bring_up
from ..secrets import Secrets, take_from_environment as take_secrets
from ..lifecycle.resize import pin_inventory
from ..jobrecord import JobProgress
from ..plan import ClusterPlan, HostSpec, TaskSpec
from ..hosts.preflight import keras_check
from ..program.request import RunRequest
from ..program.runspec import (Workspace, effective_keras, expand, host_argv, launch_spec, local_files,
                               placeholder_values, program_name, required_paths, same_command_lines, script_of, select_tasks)
from ..state import ProcessRecord, StateStore
from . import core
from .daemon import DaemonFiles
from .executor import JobExecutor, restart_rules
from .jobkind import JobFailed, JobKind, Watched
from ..layout import host_layout
from ..transport import TransportPool

MONITOR_PREFIX = "pscluster: "     # lines the host's monitor writes into the log (start, end)


class ProgramMissing(MultiHostError):
    """The command names a script or program that is not on some host (bad input)."""

    exit_code = ExitStatus.BAD_INPUT


class ProgramJob(JobKind):
    """The ``run`` job kind (:class:`~cluster.supervision.jobkind.JobKind`): the user's program on
    ``on``'s tasks (None: every task without a standing server) of a cluster that is up, run by
    the executor to its end."""

    entry = "run"
    failure_prefix = "run failed"

    def __init__(self, request: RunRequest, *, files: Sequence[LocalFile] | Callable[[], Sequence[LocalFile]],
                 space: Workspace):
        self.request = request
        self.argv = request.program
        self.on = request.on
        self.files = files            # or a function that finds them, called only if some host needs them
        self.space = space
        self.one_shot = request.one_shot
        self.until = Until(request.until) if request.until else None     # None: core.default_until of its tasks
        self.idle_since: float | None = None
        self.keras = request.keras            # run --keras (None: each host's pscluster_keras)
        self.min_workers = request.min_workers          # run --min-workers: workers may drop out down to this
        self.dropped: set[str] = set()          # worker tasks left out of the run
        self.partial: dict[str, str] = {}          # log path -> its unfinished last line
        self.outcomes: dict[str, dict[str, Any]] = {}         # task -> what became of it (for the report)
        self.first_launch: dict[str, float] = {}
        self.tasks: tuple[TaskSpec, ...] = ()     # the tasks that run it, once the job begins (new_job)

    # ------------------------------------------------------------------ the job
    def job_name(self) -> str:
        return program_name(self.argv)

    def command(self) -> tuple[str, ...]:
        return self.argv

    def new_job(self, ex: JobExecutor[Any], progress: JobProgress) -> JobProgress:
        self.tasks = select_tasks(ex.plan, self.on)
        roles = [task.role for task in self.tasks]
        self.until = self.until or core.default_until(roles)
        problem = core.until_problem(self.until, roles)
        if problem is not None:
            raise UsageError(problem, hint=f"the program runs on {', '.join(dict.fromkeys(roles))}")
        return progress.updated(command=self.argv)

    def watchdog(self, ex: JobExecutor[Any]) -> core.Watchdog:
        return core.Watchdog(restart_clean_exits=ex.rules.policy is RestartPolicy.ALWAYS)

    def prepare(self, ex: JobExecutor[Any]) -> None:
        """Code and the program's files to hosts that need them; the program must exist on
        every host; the tasks' ports must be free."""
        if not self.one_shot:            # a one-shot run's bring-up has just synced the code
            sync_and_record(ex.writer, ex.plan, ex.pool, ex.reporter, ex.root)
        hosts = [ex.plan.host(name) for name in dict.fromkeys(task.host for task in self.tasks)]
        if any(needs_sync(host, ex.root) for host in hosts):
            files = list(self.files() if callable(self.files) else self.files)
            if files:
                ex.reporter.emit("phase", name="sync", detail=f"{len(files)} file(s) of the program")
                sync_files(ex.plan, ex.pool, ex.reporter, files, ex.root)
        for warning in same_command_lines(ex.plan, self.tasks, self.argv):
            ex.reporter.emit("message", level="warning", text=warning)
        self.check_program(ex, hosts)
        check_ports_free(self.tasks, ex.pool, ex.plan)

    def check_program(self, ex: JobExecutor[Any], hosts: Sequence[HostSpec]) -> None:
        """Before anything starts, per host in one call each: the script (or program path)
        exists, a bare program name is on the PATH, the modules the script imports resolve
        there (a static scan, cluster.program.importscan), and legacy Keras has its tf-keras. Every
        problem is named per host; a module imported only in a function or a ``try`` that is
        missing is a warning."""
        values = placeholder_values(ex.plan, self.tasks[0])
        argv = expand(self.argv, values)
        paths = required_paths(argv)
        script = script_of(argv)
        modules = scan_program(self.space.cwd / script) if script and (self.space.cwd / script).is_file() else ()
        script_dir = posixpath.dirname(script) if script else ""

        def one(host: HostSpec) -> tuple[list[HostError], list[str]]:
            env = next(dict(task.env) for task in self.tasks if task.host == host.name)
            facts = hostops.program(
                ex.pool.get(host), cwd=self.space.host_cwd(host), paths=paths,
                tools=() if paths or "/" in host_argv(argv, host)[0] else (host_argv(argv, host)[0],),
                modules=[module.name for module in modules], script_dir=script_dir or ".",
                pythonpath=env.get("PYTHONPATH"), tf_keras=effective_keras(host, self.keras) == "legacy")
            return program_problems(host, self.space.host_cwd(host), host_argv(argv, host), paths, modules, facts,
                                    keras=effective_keras(host, self.keras))

        checked = fan_out(hosts, one, name="program check", catch=PsclusterError)
        failures = list(checked.failures)           # hosts that could not be asked
        for host, (errors, warnings) in checked.succeeded:
            failures.extend(Failure(host.name, error) for error in errors)
            for warning in warnings:
                ex.reporter.emit("message", level="warning", text=f"{host.name}: {warning}")
        if failures:
            hosts_failed = len({failure.where for failure in failures})
            raise ProgramMissing(f"the program cannot start on {hosts_failed} host(s); nothing was started", failures)

    def launch_group(self, ex: JobExecutor[Any]) -> None:
        ex.watch_servers()
        where = ", ".join(sorted({t.role for t in self.tasks}, key=["chief", "ps", "worker", "evaluator"].index))
        ex.reporter.emit("phase", name="run", detail=f"{shlex.join(self.argv)} on {len(self.tasks)} task(s) "
                                                      f"({where}) of {ex.name!r}")
        ex.launch_many(self.tasks, lambda task: self.launch_program(ex, task))

    def relaunch(self, ex: JobExecutor[Any], task: TaskSpec) -> Watched:
        return self.launch_program(ex, task)

    def launch_program(self, ex: JobExecutor[Any], task: TaskSpec) -> Watched:
        attempt = ex.attempt(task, ProcessKind.PROGRAM)
        log, _ = host_layout(task, ex.plan).job_paths(ex.job_id, task.role, task.index, attempt)
        record = ProcessRecord.for_task(task.name, task.host, ProcessKind.PROGRAM, attempt, log, job=ex.job_id)
        spec = launch_spec(ex.plan, task, self.request, self.space,
                           ex.secrets.env_for(task, standing=False) if ex.secrets else {})
        watched = ex.launch(_in_dir(task, spec.cwd), record, argv=list(spec.argv), env=dict(spec.env),
                            kind=ProcessKind.PROGRAM, files=(log,))
        watched.task = task
        self.first_launch.setdefault(task.name, watched.launched)
        self.outcomes[task.name] = {"state": "running"}
        return watched

    def drop_out(self, ex: JobExecutor[Any], host: str, why: str, task: str | None = None) -> bool:
        """``run --min-workers N``: a worker program that used up its restarts (``task``), or a
        lost host that runs only worker programs, is left out and the run goes on, as long as N
        worker programs remain. The program's own coordinator must go on without it, as a
        ParameterServerStrategy chief or a TF1 async program does (MultiWorkerMirroredStrategy's
        collectives cannot). A dropped worker does not come back in this run."""
        if self.min_workers is None:
            return False
        on_host = [w for w in ex.watched.values() if w.task.host == host]
        going = [w for w in on_host if task is None or w.task.name == task]
        kept_out = [w.task.name for w in going if w.kind is not ProcessKind.PROGRAM or w.task.role != "worker"]
        if not going or kept_out:
            if kept_out:
                ex.reporter.emit("message", level="warning",
                                 text=f"cannot go on without {host}: it runs {', '.join(sorted(kept_out))}")
            return False
        leaving = {w.task.name for w in going}
        workers = [t.name for t in self.tasks if t.role == "worker" and t.name not in self.dropped]
        left = [name for name in workers if name not in leaving]
        if len(left) < self.min_workers:
            ex.reporter.emit("message", level="warning",
                             text=f"cannot go on without {', '.join(sorted(leaving))}: {len(left)} worker(s) would "
                                  f"remain, --min-workers is {self.min_workers}")
            return False
        ex.forget_and_stop(going)
        ex.retarget()          # a lost host's stream closes: it is no longer the run's
        self.dropped |= leaving
        for name in leaving:
            self.outcomes[name] = {"state": "dropped", "why": why}
        text = (f"resized ({task or host} {why}): {', '.join(sorted(leaving))} dropped out; "
                f"{len(workers)} -> {len(left)} worker(s) go on")
        ex.reporter.emit("message", level="warning", text=text)
        ex.set_job(workers=len(left), message=text)
        ex.announce("resized", {"old": workers, "new": left, "reason": f"{task or host} {why}", "workers": len(left)})
        return True

    def recovery(self, ex: JobExecutor[Any], incident: core.Incident) -> core.Recovery:
        proc = incident.proc
        if proc.kind is ProcessKind.SERVER:      # a standing server of `up` died during the run
            return core.Recovery(wait_hosts=(proc.host,), stop=(proc.key,), restart_servers=(proc.task,))
        return core.program_recovery(proc)

    def on_chunk(self, ex: JobExecutor[Any], watched: Watched, chunk: hostops.FileChunk, now: float) -> None:
        path = chunk.path
        text = self.partial.pop(path, "") + chunk.data
        lines = text.split("\n")
        rest = lines.pop()
        if rest:
            self.partial[path] = rest
        for line in lines:
            if not line.startswith(MONITOR_PREFIX):
                ex.reporter.emit("output", task=watched.task.name, host=watched.task.host, line=line)

    def on_exit(self, ex: JobExecutor[Any], watched: Watched, now: float) -> None:
        if watched.kind is not ProcessKind.PROGRAM:
            return
        for path in watched.files:                   # a last line without a newline
            rest = self.partial.pop(path, "")
            if rest and not rest.startswith(MONITOR_PREFIX):
                ex.reporter.emit("output", task=watched.task.name, host=watched.task.host, line=rest)
        view = watched.view()
        self.outcomes[watched.task.name] = {"state": "exited" if view.state.value == "exited" else "lost",
                                            "exit_code": view.exit_code, "signal": view.signal,
                                            "seconds": round(now - self.first_launch.get(watched.task.name, now), 2)}
        ex.reporter.emit("task-exited", task=watched.task.name, host=watched.task.host, exit_code=view.exit_code,
                         signal=view.signal, detail=view.exit_reason())
        if view.clean_exit and ex.rules.policy is not RestartPolicy.ALWAYS:
            watched.finished = True

    def complete(self, ex: JobExecutor[Any], now: float) -> bool:
        # A ParameterServerStrategy program (async: the chief coordinates) has workers that serve.
        end = core.program_end(ex.views(), until=self.until or Until.WORKERS,
                               serving_workers=ex.plan.mode == Mode.ASYNC, idle_since=self.idle_since, now=now)
        order = {task.name: i for i, task in enumerate(self.tasks)}
        if end.idle and self.idle_since is None:
            self.idle_since = now
            idle = sorted(end.idle, key=lambda name: order.get(name, len(order)))
            ex.reporter.emit("message", text=f"only {', '.join(idle)} still run, and they never exit by "
                                             f"themselves (servers in server.join(), an evaluator loop); "
                                             f"stopping them in {core.IDLE_LINGER:.0f} s")
        elif not end.idle:
            self.idle_since = None
        if not end.done:
            return False
        left = sorted((w for w in ex.watched.values() if w.record.key in end.stop),
                      key=lambda w: order.get(w.task.name, len(order)))
        if left:
            ex.reporter.emit("message", text=f"{end.why}: the run is over; stopping "
                                             f"{', '.join(w.task.name for w in left)}")
            ex.stop([w.record for w in left], grace=ex.grace)
        ex.stop_job_processes(grace=1.0)      # records of what ended are closed too
        return True

    def on_stopped(self, ex: JobExecutor[Any], records: list[ProcessRecord]) -> None:
        now = ex.clock()
        for record in records:
            if self.outcomes.get(record.task, {}).get("state") == "running":
                self.outcomes[record.task] = {"state": "stopped", "exit_code": None, "signal": None,
                                              "seconds": round(now - self.first_launch.get(record.task, now), 2)}

    def failure_hint(self, ex: JobExecutor[Any]) -> str | None:
        if self.one_shot:          # its cluster is gone when the error is shown: say where the logs stay
            return f"'pscluster logs --name {ex.name} --run {ex.job_id}' shows every task's log of this run"
        return None

    def interrupted(self, ex: JobExecutor[Any]) -> tuple[str, str | None]:
        if self.one_shot:
            return "run interrupted: its processes were stopped", None
        return "run interrupted: its processes were stopped; the standing servers are still up", "'pscluster down' stops them"

    def summary(self, ex: JobExecutor[Any]) -> dict[str, Any]:
        return self.report(ex, exit_code=0)

    def report(self, ex: JobExecutor[Any], *, exit_code: int) -> dict[str, Any]:
        """The ``run --json`` document (of a job that began: :meth:`JobExecutor.begin`)."""
        restarts = ex.job_restarts()
        tasks = []
        for task in self.tasks:
            outcome = self.outcomes.get(task.name, {"state": "not started"})
            tasks.append({"role": task.role, "index": task.index, "host": task.host, "state": outcome["state"],
                          "exit_code": outcome.get("exit_code"), "signal": outcome.get("signal"),
                          "restarts": restarts.get(task.name, 0), "seconds": outcome.get("seconds")})
        return {"command": list(self.argv), "cluster": ex.name, "tasks": tasks, "exit_code": exit_code,
                "wall_seconds": round(ex.clock() - ex.began, 2)}


def program_problems(host: HostSpec, cwd: str, argv: Sequence[str], paths: Sequence[str],
                     modules: Sequence[ImportedModule], facts: hostops.ProgramFacts, *,
                     keras: str) -> tuple[list[HostError], list[str]]:
    """What stops a program from starting on ``host`` (errors) and what may stop it later
    (warnings), from what the host reported (pure)."""
    errors: list[HostError] = []
    warnings: list[str] = []
    if facts.missing:
        missing = facts.missing[0]
        where = "" if missing.startswith("/") else f" in {cwd}"
        errors.append(HostError(host.name, f"{missing} does not exist{where}",
                                hint="run pscluster from the folder that holds it (files named relative to your "
                                     "current directory are copied to hosts that need them), or --sync it"))
        return errors, warnings
    for tool, found in facts.tools:
        if not found:
            errors.append(HostError(host.name, f"program {tool!r} is not on the PATH",
                                    hint="give its full path, or install it on that host"))
    resolved = dict(facts.modules)
    lacking = [module for module in modules if module.name in resolved and not resolved[module.name]]
    for module in lacking:
        text = f"module {module.name!r} (imported at {module.where}) is not installed for {host.python}"
        if module.required:
            errors.append(HostError(host.name, text,
                                    hint=f"install it on {host.name} (pip install {module.name}; the package may "
                                         "have another name), or keep it in the script's folder, which is copied "
                                         "with the script"))
        else:
            warnings.append(f"{text}; the program may fail when it gets there")
    if facts.modules_error:
        warnings.append(f"could not check the modules the program imports: {facts.modules_error.strip()[-300:]}")
    if keras == "legacy":
        check = keras_check(host.name, facts.tf_version, facts.tf_keras_version, facts.tf_keras_importable,
                            facts.tf_dist)
        if not check.ok:
            errors.append(HostError(host.name, check.detail, hint=check.hint))
    return errors, warnings


def _in_dir(task: TaskSpec, cwd: str) -> TaskSpec:
    """The task as started: the program runs in ``cwd`` rather than the task's workdir."""
    from dataclasses import replace
    return replace(task, workdir=cwd)


def run_program(request: RunRequest, plan: ClusterPlan, *, store: StateStore, pool: TransportPool, space: Workspace,
                reporter: Reporter, bringup_reporter: Reporter, detached: DaemonFiles | None = None) -> dict[str, Any]:
    """Run ``request``'s program and return its report (the ``run --json`` document): one shot
    (``plan`` is INVENTORY's, planned with the program's roles: bring up, run, take down), or on
    the cluster that is up (``plan`` is its state's).

    Raises:
        JobFailed: the run failed; its ``report`` is the run's document (exit code 1).
    """
    if request.one_shot:
        cluster = one_shot_plan(pin_inventory(plan), store=store, on=request.on, firewall=request.firewall,
                                keras=request.keras, until=request.until, min_workers=request.min_workers)
        secrets = take_secrets(cluster)
        return run_one_shot(cluster, lambda: reported(program_executor(
            request, cluster, name=cluster.name, store=store, pool=pool, space=space, reporter=reporter,
            secrets=secrets, detached=detached)), store=store, pool=pool, bringup_reporter=bringup_reporter, secrets=secrets,
            timeout=request.timeout, grace=request.grace, allow_busy_gpus=request.allow_busy_gpus)
    check_program_tasks(select_tasks(plan, request.on), until=request.until, min_workers=request.min_workers)
    return reported(program_executor(request, plan, name=request.name or plan.name, store=store, pool=pool,
                                     space=space, reporter=reporter, secrets=take_secrets(plan), detached=detached))


def program_executor(request: RunRequest, plan: ClusterPlan, *, name: str, store: StateStore, pool: TransportPool,
                     space: Workspace, reporter: Reporter, secrets: Secrets | None,
                     detached: DaemonFiles | None) -> JobExecutor[ProgramJob]:
    """The executor of ``request``'s run on cluster ``name`` of ``plan`` (``.run()`` runs it)."""
    # Walked and hashed only when some host needs the files (a shared checkout does not).
    files = functools.partial(local_files, request.program, request.sync_paths, space, limit_mib=request.sync_limit)
    return JobExecutor(ProgramJob(request, files=files, space=space), store=store, name=name, reporter=reporter,
                       pool=pool, root=space.root, rules=restart_rules(request.restart_policy, request.max_restarts),
                       host_timeout=request.host_timeout, grace=request.grace, secrets=secrets, detached=detached,
                       replace=request.replace, keep=request.keep)


def reported(ex: JobExecutor[ProgramJob]) -> dict[str, Any]:
    """``ex.run()``; a failed run's :class:`JobFailed` carries the run's report."""
    try:
        return ex.run()
    except JobFailed as exc:
        exc.report = ex.kind.report(ex, exit_code=1)
        raise


def run_one_shot(plan: ClusterPlan, run: Callable[[], dict[str, Any]], *, store: StateStore, pool: TransportPool,
                 bringup_reporter: Reporter, secrets: Secrets, timeout: float, grace: float,
                 allow_busy_gpus: bool = False) -> dict[str, Any]:
    """Bring ``plan`` up (no standing server: every task runs the program), ``run()`` the program
    once the cluster is up, and always take it down again, even after a failure or Ctrl-C.

    Preflight only warns about a host without a usable TensorFlow: no TensorFlow server
    stands in a one-shot run, and whether the user's program imports TensorFlow is its own
    business (a program for PyTorch or JAX runs where TensorFlow was never installed).
    """
    need = TensorFlowNeed.REQUIRED if plan.standing_tasks else TensorFlowNeed.OPTIONAL
    bring_up(plan, store=store, reporter=bringup_reporter, timeout=timeout, pool=pool, secrets=secrets,
             allow_busy_gpus=allow_busy_gpus, tensorflow=need)
    bringup_reporter.close()
    try:
        return run()
    finally:
        take_down(plan.name, store=store, pool=pool, reporter=bringup_reporter, grace=grace)


def take_down(name: str, *, store: StateStore, pool: TransportPool, reporter: Reporter, grace: float) -> None:
    """``down`` for a one-shot run; a Ctrl-C during it retries once, faster."""
    for attempt_grace in (grace, 0.5):
        if store.load(name) is None:
            return
        try:
            bring_down(name, store=store, reporter=reporter, grace=attempt_grace, pool=pool)
            return
        except KeyboardInterrupt:
            continue
        except PsclusterError as exc:       # never mask the run's own outcome; the state keeps the rest
            reporter.emit("message", level="error", text=f"taking the cluster down failed: {exc}")
            return


__all__ = ["ProgramJob", "run_one_shot", "run_program"]


def check_program_tasks(tasks: Sequence[TaskSpec], *, until: str | None, min_workers: int | None) -> None:
    """``--until`` must name tasks that run the program, and ``--min-workers`` cannot exceed the
    workers that run it: usage errors before anything starts."""
    check_until(tasks, until)
    check_min_workers(tasks, min_workers)


def check_until(tasks: Sequence[TaskSpec], until: str | None) -> None:
    roles = [task.role for task in tasks]
    problem = core.until_problem(Until(until), roles) if until else None
    if problem is not None:
        raise UsageError(problem, hint=f"the program runs on {', '.join(dict.fromkeys(roles))}; "
                                       "choose another --until")


def check_min_workers(tasks: Sequence[TaskSpec], min_workers: int | None) -> None:
    workers = sum(1 for task in tasks if task.role == Role.WORKER)
    if min_workers is not None and min_workers > workers:
        raise UsageError(f"--min-workers {min_workers} is larger than the {workers} worker(s) that run the program",
                         hint=f"give at most --min-workers {workers}" if workers else "the program runs on no worker")


def one_shot_plan(plan: ClusterPlan, *, store: StateStore, on: tuple[str, ...] | None, firewall: bool,
                  keras: str | None, until: str | None, min_workers: int | None) -> ClusterPlan:
    """A one-shot run's cluster: ``plan`` (its inventory planned with the program's roles) with
    ``--firewall`` and ``--keras`` applied, its options checked, and a name no cluster has yet."""
    if firewall:
        plan = replace(plan, firewall=True)
    check_until(plan.tasks, until)
    check_min_workers(select_tasks(plan, on), min_workers)
    if keras:            # preflight then checks tf-keras where legacy Keras is asked for
        plan = replace(plan, hosts=tuple(replace(host, keras=keras) for host in plan.hosts))
    if store.load(plan.name) is not None:
        raise UsageError(f"a cluster named {plan.name!r} exists already",
                         hint=f"run on it with 'pscluster run --name {plan.name} -- ...', or give this "
                              "one-shot run another --name")
    return plan
