"""Commands on a cluster's job: train, run, attach, stop-job, and the hidden supervise (a --detach daemon)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable
import click

from .. import console as ui
from ..hosts.codesync import local_workdir, project_root
from ..contracts import DEFAULT_GRACE, DEFAULT_STOP_GRACE, ExitStatus, Until
from ..program.progfiles import DEFAULT_SYNC_LIMIT_MIB
from ..errors import PsclusterError, UsageError
from ..inventory import KERAS_CHOICES
from ..names import check_cluster_name
from ..plan import ClusterPlan, PlanOptions
from ..state import RunState

from ..secrets import take_from_environment as take_secrets
if TYPE_CHECKING:
    from ..program.request import RunRequest
    from ..program.runspec import Workspace
    from ..supervision.train_spec import TrainRequest
from .base import Env, _existing, _limited, _loaded, _notifier, _planned, _with_notifier, cli
from .options import (restart_opts, check_hosts_from, check_notices_from, DeadlineParam, DurationParam, FiniteFloat, SECONDS, StallTimeout, allow_busy_opt,
                      detach_opt, keep_opt, limit_opt, mode_opt, name_opt, notify_opts, port_opt, replace_opt)


@cli.command()
@click.argument("job")
@name_opt
@click.option("--epochs", type=FiniteFloat(0, 1e6, min_open=True), help="Epochs to train (default: the job's).")
@click.option("--steps", type=click.IntRange(1), help="Global steps to train (instead of epochs).")
@click.option("--batch-size", type=click.IntRange(1), help="Global batch size (default: the job's).")
@click.option("--learning-rate", type=FiniteFloat(0, 1e6, min_open=True), help="Learning rate (default: the job's).")
@click.option("--scale-lr", is_flag=True, help="Multiply the learning rate by the number of workers.")
@click.option("--checkpoint-dir", help="Checkpoint folder on the chief's host "
                                       "(default: <workdir>/.pscluster/<name>/checkpoints/<job>).")
@click.option("--checkpoint-every", type=click.IntRange(1), metavar="STEPS", help="Checkpoint interval in steps.")
@click.option("--resume", is_flag=True, help="Continue from the latest checkpoint.")
@click.option("--snapshot-every", type=FiniteFloat(0, 86400), metavar="SECONDS",
              help="Also save every SECONDS, so that a lost ps or sync worker costs at most that much training "
                   "(async: the chief, while training goes on; sync: every worker after the same step; default 15 in "
                   "async and sync, off in sync-ps; 0: off; at least 1).")
@click.option("--data", help="Data file for the job, as a path on the hosts.")
@click.option("--steps-per-execution", type=click.IntRange(1), metavar="K",
              help="Steps per scheduled function / traced call.")
@click.option("--eval-every", type=click.IntRange(1), metavar="STEPS", help="Also evaluate on the test set every STEPS steps.")
@click.option("--warmup-steps", type=click.IntRange(0), metavar="STEPS",
              help="async: the first STEPS steps run on one worker at a time, then all workers train "
                   "(default: 256, at most a quarter of the budget; 0: none).")
@click.option("--summary-every", type=click.IntRange(0), default=100, show_default=True,
              metavar="STEPS", help="TensorBoard scalars every STEPS steps (0: none); see 'pscluster tensorboard'.")
@restart_opts(policy="on-failure", policy_help="What to do when a task fails.", lost_host="job")
@click.option("--start-timeout", type=SECONDS, default=180.0, show_default=True,
              help="Seconds a training process may take to start training.")
@click.option("--collective-timeout", type=SECONDS, default=30.0, show_default=True,
              help="Sync mode: seconds a collective may wait for a peer.")
@click.option("--stop-grace", type=FiniteFloat(0, 3600), default=DEFAULT_STOP_GRACE, show_default=True, metavar="SECONDS",
              help="On Ctrl-C/SIGTERM/down the leader (sync: every worker, at one step) checkpoints and stops "
                   "within SECONDS (0: kill at once).")
@click.option("--stall-timeout", type=StallTimeout(), metavar="SECONDS",
              help="A job whose leader reports no progress this long is restarted from its last checkpoint, "
                   "naming the task it waited on (default: the larger of 60 s and 20 times its slowest unit of "
                   "work, sync modes also twice --collective-timeout + 30 s; 0: off).")
@click.option("--deadline", type=DurationParam(), metavar="DURATION",
              help="Checkpoint and stop this long after the start (90s, 45m, 2h); exit 4.")
@click.option("--min-workers", type=click.IntRange(1), metavar="N",
              help="Elastic: a worker host lost beyond --host-timeout, or whose worker failed for good (restarts used "
                   "up, or --restart-policy never), drops out and training goes on while N workers remain; a lost "
                   "host rejoins when it answers again.")
@click.option("--hosts-from", metavar="COMMAND", callback=check_hosts_from,
              help="Elastic: a discovery command (run here, split like a shell line, no shell) printing 'host' or 'host:workers' lines; the job "
                   "grows or shrinks to match (hosts of the inventory's worker group).")
@click.option("--hosts-every", type=FiniteFloat(1, 3600), default=10.0, show_default=True, metavar="SECONDS",
              help="How often --hosts-from runs.")
@click.option("--notices-from", metavar="COMMAND", callback=check_notices_from,
              help="A notice command (run here like --hosts-from) printing 'HOST [DEADLINE]' lines (DEADLINE: 30s, "
                   "2m, or an ISO-8601 time): each host it names is drained once, as 'pscluster drain HOST' "
                   "does (examples/notices/: AWS spot, GCE, Slurm).")
@click.option("--notices-every", type=FiniteFloat(1, 3600), default=5.0, show_default=True, metavar="SECONDS",
              help="How often --notices-from runs.")
@click.option("--notice-deadline", type=DeadlineParam(), default="30s", show_default=True, metavar="DURATION",
              help="The deadline of a notice that names none, and of a host whose watch gets SIGTERM or SIGUSR1 "
                   "(its shutdown, Slurm's --signal).")
@notify_opts
@click.option("--json", "as_json", is_flag=True, help="Print only the final report, as JSON.")
@detach_opt
@replace_opt
@keep_opt
@click.pass_obj
def train(env: Env, job: str, name: str | None, epochs, steps, batch_size, learning_rate, scale_lr, checkpoint_dir,
          checkpoint_every, resume, snapshot_every, data, steps_per_execution, eval_every, warmup_steps, summary_every, restart_policy,
          max_restarts, start_timeout, collective_timeout, host_timeout, stop_grace, stall_timeout, deadline, min_workers,
          hosts_from, hosts_every, notices_from, notices_every, notice_deadline, notify_urls, notify_cmds, as_json: bool,
          detach: bool, replace: bool, keep: int) -> None:
    """Train JOB (distributed_mnist, or a path to a job.py) on a cluster that is up."""
    from ..supervision.train_spec import JobOptions, TrainRequest, check_job_options
    options = JobOptions(epochs=epochs, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                         scale_lr=scale_lr, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                         resume=resume, snapshot_every=snapshot_every, data=data,
                         steps_per_execution=steps_per_execution,
                         eval_every=eval_every, warmup_steps=warmup_steps, summary_every=summary_every,
                         restart_policy=restart_policy,
                         max_restarts=max_restarts, start_timeout=start_timeout,
                         collective_timeout=collective_timeout, host_timeout=host_timeout,
                         stop_grace=stop_grace, stall_timeout=stall_timeout, deadline=deadline)
    check_job_options(options)          # before the cluster is looked up, as a usage error
    request = TrainRequest(job=job, name=env.store.resolve_name(name), options=options, min_workers=min_workers,
                           hosts_from=hosts_from, hosts_every=hosts_every, notices_from=notices_from,
                           notices_every=notices_every, notice_deadline=notice_deadline, notify_urls=notify_urls,
                           notify_cmds=notify_cmds, replace=replace, keep=keep, as_json=as_json)
    _train(env, request, detach=detach)


def _train(env: Env, request: TrainRequest, *, detach: bool) -> None:
    """``train``'s body, of its request (also what a --detach supervisor runs)."""
    from ..supervision.elastic import Elastic
    from ..supervision.train_job import train_executor
    from ..supervision.train_spec import check_job_options, resolve_job, with_defaults
    resolved = request.name
    job_ref = resolve_job(request.job, project_root())
    state = _existing(env, resolved)
    check_job_options(request.options, state.plan, min_workers=request.min_workers)
    options = with_defaults(request.options, state.plan)
    elastic = Elastic(request.min_workers, request.hosts_from, request.hosts_every, request.notices_from,
                      request.notices_every, request.notice_deadline)
    if detach:
        _detach(env, "train", request, state)
        return
    display = _job_display(env, ui.EventLineReporter(env.err) if request.as_json or env.detached
                           else ui.TrainDisplay(env.err))
    notifier = _notifier(env, state.plan, request.notify_urls, request.notify_cmds, display)
    try:
        with env.pool_factory() as pool:
            summary = train_executor(store=env.store, name=resolved, job=job_ref, options=options,
                                     reporter=_with_notifier(display, notifier), pool=pool, root=project_root(),
                                     secrets=take_secrets(state.plan), detached=env.detached, replace=request.replace,
                                     keep=request.keep, elastic=elastic).run()
    finally:
        if notifier is not None:
            notifier.close()
        display.close()
    if request.as_json:
        env.out.print_json(json.dumps(summary))
    else:
        ui.render_summary(env.out, summary)
    if summary.get("deadline_reached"):
        _deadline_report(env, summary, request.job)
        raise SystemExit(ExitStatus.DEADLINE)


def _deadline_report(env: Env, result: dict, job: str) -> None:
    """The one line after a job that reached ``--deadline`` (train's, and attach's for it)."""
    env.err.print(f"--deadline reached at step {result.get('global_step')}: checkpoint "
                  f"{result.get('checkpoint')}; continue with 'pscluster train {job} --resume'",
                  style="yellow", markup=False, highlight=False)


class _ProgramCommand(click.Command):
    """``run [OPTIONS] [INVENTORY] -- PROGRAM [ARG...]``: everything after the first ``--`` is the
    user's program, passed on untouched (click would otherwise mix it with INVENTORY)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            index = args.index("--")
            ctx.meta["pscluster.program"] = tuple(args[index + 1:])
            args = args[:index]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return super().collect_usage_pieces(ctx) + ["-- PROGRAM [ARG]..."]


@cli.command("run", cls=_ProgramCommand)
@click.argument("inventory", required=False, type=click.Path())
@name_opt
@mode_opt
@port_opt
@click.option("--on", "on_text", metavar="ROLES",
              help="Roles whose tasks run PROGRAM, e.g. worker or ps,worker (default: one shot, every role the "
                   "inventory defines, or with --mode the roles of that mode; on a cluster that is up, every task "
                   "without a standing server).")
@click.option("--sync", "sync_paths", multiple=True, metavar="PATH",
              help="Also copy this file or folder (under the current directory) to hosts that need it; repeatable.")
@click.option("--keras", type=click.Choice(KERAS_CHOICES),
              help="legacy: tasks get TF_USE_LEGACY_KERAS=1, so tf.keras is tf-keras, whose model.fit runs under "
                   "the multi-worker strategies (Keras 3's fails in TF 2.21); needs tf-keras of the hosts' TensorFlow "
                   "version (pscluster[legacy-keras]). Default: each host's pscluster_keras, else keras3.")
@click.option("--sync-limit", type=click.IntRange(0, 1 << 20), default=DEFAULT_SYNC_LIMIT_MIB, show_default=True,
              metavar="MIB", help="Most MiB the program's files (its folder, --sync paths) may total; 0: no limit.")
@restart_opts(policy="never", policy_help="What to do when a task fails (an arbitrary program may not be safe to restart).",
              lost_host="run")
@click.option("--grace", type=FiniteFloat(0, 3600), default=DEFAULT_GRACE, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping tasks.")
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True,
              help="One shot: seconds the bring-up may take.")
@click.option("--firewall", is_flag=True, help="One shot: install nftables rules so only cluster members reach the ports.")
@click.option("--json", "as_json", is_flag=True, help="Print only the final report, as JSON (output goes to stderr).")
@limit_opt
@allow_busy_opt
@notify_opts
@detach_opt
@replace_opt
@keep_opt
@click.option("--until", type=click.Choice([str(u) for u in Until]), default=None,
              help="When the run is over: when the chief exits (default with a chief, as TFJob's success policy), "
                   "when every chief and worker has exited (default without a chief), or when every task has. "
                   "Tasks still running then are stopped.")
@click.option("--min-workers", type=click.IntRange(1), metavar="N",
              help="Elastic: a worker whose program used up its restarts, or a lost host running only workers, "
                   "drops out and the run goes on while N workers remain (for programs whose own coordinator goes "
                   "on without a worker: ParameterServerStrategy, TF1 async; not MultiWorkerMirroredStrategy).")
@click.option("--dry-run", is_flag=True,
              help="Print each task's filled command line, folder, GPU mask, TF_CONFIG and environment (secrets "
                   "masked), touching no host; start nothing.")
@click.pass_context
def run_program(ctx: click.Context, inventory: str | None, name: str | None, mode: str | None, port_base: int | None,
                on_text: str | None, sync_paths: tuple[str, ...], restart_policy: str, max_restarts: int,
                host_timeout: float, grace: float, timeout: float, firewall: bool, as_json: bool,
                limit: str | None, allow_busy_gpus: bool, notify_urls: tuple[str, ...],
                notify_cmds: tuple[str, ...], detach: bool, replace: bool, keep: int, until: str | None,
                dry_run: bool, keras: str | None, sync_limit: int, min_workers: int | None) -> None:
    """Run your own program on every task: pscluster run [INVENTORY] [OPTIONS] -- PROGRAM [ARG...]

    With INVENTORY: one shot (preflight, sync, start every task, wait, stop everything). Without:
    on the cluster that is up (--name), beside its standing servers. Placeholders in ARGs are
    filled per task: {ps_hosts} {worker_hosts} {chief_hosts} {job_name} {task_type} {task_index}
    {num_workers} {num_ps} {port} {host}; each process also gets TF_CONFIG, CUDA_VISIBLE_DEVICES
    and PSCLUSTER_TASK_TYPE, PSCLUSTER_TASK_INDEX, PSCLUSTER_NUM_WORKERS, ... (see the README).
    `python` means each host's pscluster_python. The run is over when its chief exits (without a
    chief: every worker; see --until); exit code 0 when what it waited for exited 0.
    """
    from ..program.request import RunRequest
    from ..program.runspec import parse_roles
    env: Env = ctx.obj
    request = RunRequest(program=tuple(ctx.meta.get("pscluster.program") or ()), cwd=str(Path.cwd()), keep=keep,
                         inventory=inventory, name=name, mode=mode, port_base=port_base,
                         on=parse_roles(on_text) if on_text else None, sync_paths=sync_paths, sync_limit=sync_limit,
                         keras=keras, restart_policy=restart_policy, max_restarts=max_restarts,
                         host_timeout=host_timeout, grace=grace, timeout=timeout, firewall=firewall, limit=limit,
                         allow_busy_gpus=allow_busy_gpus, notify_urls=notify_urls, notify_cmds=notify_cmds,
                         replace=replace, until=until, min_workers=min_workers, as_json=as_json)
    request.check(detach=detach)
    _run(env, request, detach=detach, dry_run=dry_run)


def _run(env: Env, request: RunRequest, *, detach: bool = False, dry_run: bool = False) -> None:
    """``run``'s body, of its request (also what a --detach supervisor runs): build, call, render."""
    from ..program.runspec import check_sync_paths
    from ..supervision.jobkind import JobFailed
    from ..supervision.program_job import run_program as run_on
    space = _workspace(env, request)
    check_sync_paths(request.sync_paths, space)     # bad --sync: a usage error before anything happens
    if dry_run:
        _dry_run(env, request, space)
        return
    output = _job_display(env, ui.ProgramOutput(env.err if request.as_json else env.out, env.err))
    try:
        with env.pool_factory() as pool:
            request, plan = _run_plan(env, request, pool)
            if detach:
                _detach_run(env, request, plan)
                return
            notifier = _notifier(env, plan, request.notify_urls, request.notify_cmds, output)
            try:
                report = run_on(request, plan, store=env.store, pool=pool, space=space,
                                reporter=_with_notifier(output, notifier), bringup_reporter=ui.RichReporter(env.err),
                                detached=env.detached)
            finally:
                if notifier is not None:
                    notifier.close()
    except JobFailed as exc:
        if exc.report is not None:
            _show_run_report(env, exc.report, as_json=request.as_json)
        raise
    finally:
        output.close()
    _show_run_report(env, report, as_json=request.as_json)


def _workspace(env: Env, request: RunRequest) -> Workspace:
    from ..program.runspec import Workspace
    return Workspace(cwd=Path(request.cwd), root=project_root(), home=Path.home(), state_dir=env.store.root)


def _run_plan(env: Env, request: RunRequest, pool) -> tuple[RunRequest, ClusterPlan]:
    """The request with its cluster's name resolved, and the plan the program runs on: one shot,
    INVENTORY's (read once) planned with the program's roles (``pool``: `<role>_gpus: auto`
    resolved on the hosts; None, as ``plan`` makes it, for the dry run); else the state's."""
    from dataclasses import replace
    from ..program.runspec import one_shot_roles
    if request.inventory is None:
        resolved = env.store.resolve_name(request.name)
        return replace(request, name=resolved), _existing(env, resolved).plan
    inventory = _loaded(env, request.inventory)
    roles = request.on or one_shot_roles(inventory, request.mode)
    limited = _limited(env, inventory, request.limit, request.mode, roles)
    options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=request.name,
                          mode=request.mode, port_base=request.port_base, roles=roles)
    return request, _planned(limited, options, pool)


def _detach_run(env: Env, request: RunRequest, plan: ClusterPlan) -> None:
    from ..program.runspec import select_tasks
    from ..supervision.program_job import check_program_tasks
    check_program_tasks(select_tasks(plan, request.on), until=request.until, min_workers=request.min_workers)
    _detach(env, "run", request, _existing(env, env.store.resolve_name(request.name)))


def _dry_run(env: Env, request: RunRequest, space: Workspace) -> None:
    """``run --dry-run``: the one-shot plan of INVENTORY (as ``plan`` makes it: no host is asked,
    so `<role>_gpus: auto` stays unresolved), or the plan of the cluster that is up, and the
    files ``run`` would copy to hosts that do not share this checkout, with their total size:
    each task's :func:`~cluster.program.runspec.launch_spec`, what the run starts."""
    import shlex
    from ..program.runspec import dry_run, program_file_set, same_command_lines, select_tasks
    request, cluster = _run_plan(env, request, None)
    tasks = cluster.tasks if request.one_shot and request.on is None else select_tasks(cluster, request.on)
    rows = dry_run(cluster, tasks, request, space)
    program = request.program
    as_json = request.as_json
    warnings = same_command_lines(cluster, tasks, program)
    files = program_file_set(program, request.sync_paths, space, limit_mib=request.sync_limit)
    if as_json:
        ui.print_json(env.out, {"cluster": cluster.name, "tasks": rows, "warnings": warnings,
                                "files": [{"path": f.rel, "size": f.size} for f in files.entries],
                                "files_size": files.size})
        return
    for row in rows:
        env.out.print(f"{row['task']}@{row['host']} in {row['cwd']}: {shlex.join(row['argv'])}",
                      markup=False, highlight=False)
        mask = row["cuda_visible_devices"]
        env.out.print(f"  CUDA_VISIBLE_DEVICES: {'(not set)' if mask is None else repr(mask)}",
                      markup=False, highlight=False)
        env.out.print("  env: " + " ".join(f"{key}={shlex.quote(value)}" for key, value in row["env"].items()),
                      markup=False, highlight=False)
    env.out.print(f"files copied to hosts that do not share this checkout: {len(files.entries)}, "
                  f"{files.size:,} bytes", markup=False, highlight=False)
    for entry in files.entries:
        env.out.print(f"  {entry.rel} ({entry.size:,} bytes)", markup=False, highlight=False)
    for warning in warnings:
        env.err.print(f"warning: {warning}", markup=False, highlight=False)
    env.err.print(f"dry run: {len(rows)} task(s) of cluster {cluster.name!r}; nothing was started",
                  markup=False, highlight=False)


def _job_display(env: Env, display):
    """The job's reporter; in a --detach supervisor, every event also goes to its events file
    (what ``attach`` replays)."""
    if env.detached is None:
        return display
    from ..supervision.daemon import EventLog
    from ..events import TeeReporter
    return TeeReporter(display, EventLog(env.detached.events))


def _detach(env: Env, command: str, request: RunRequest | TrainRequest, state: RunState) -> None:
    """``--detach``: start ``command`` (train, run) of ``request`` in a supervisor daemon, which
    receives ``request.to_json()``, and return once the job's processes run (job state
    ``running``); the daemon's log lines are shown meanwhile."""
    from ..liveness import orchestrator_alive
    from ..supervision import daemon as detach
    name, replace, as_json = request.name or state.name, request.replace, request.as_json
    job = state.job
    alive = job is not None and job.live and orchestrator_alive(job.orchestrator)
    conflict = detach.job_conflict(name, job, supervisor_alive=alive, running=0)
    if conflict is not None and not replace:
        raise UsageError(conflict.message, hint=conflict.hint)
    spawned = detach.spawn_supervisor(env.store.root, name, {"command": command, "request": request.to_json()})
    env.err.print(f"▸ detached: supervisor pid {spawned.pid}, log {spawned.log}", markup=False, highlight=False)
    try:
        started = detach.wait_started(env.store, name, spawned,
                                      on_log=lambda line: env.err.print(line, markup=False, highlight=False))
    except KeyboardInterrupt:
        env.err.print(f"stopped waiting: the job goes on under its supervisor (pid {spawned.pid}); "
                      f"'pscluster attach --name {name}' follows it, 'pscluster stop-job --name {name}' ends it",
                      markup=False, highlight=False)
        raise SystemExit(ExitStatus.INTERRUPTED) from None
    if started.job is None:        # refused or bad input: its log said why, above
        raise SystemExit(started.exit_code or ExitStatus.FAILURE)
    job = started.job
    if as_json:
        env.out.print_json(json.dumps(job.to_json()))
    if not job.live:
        env.err.print(f"job {job.id} ({job.job}) already {job.state}" + (f": {job.message}" if job.message else "")
                      + f"; 'pscluster attach --name {name}' shows its report", markup=False, highlight=False)
        code = detach.exit_status(job)
        if code:
            raise SystemExit(code)
        return
    env.err.print(f"[green]job {job.id} ({ui.escape(job.job)}) is running on {name!r}[/] under a detached supervisor "
                  f"(pid {spawned.pid}); this terminal can go.\n"
                  f"  follow it: pscluster attach --name {name}   progress: pscluster status --name {name}   "
                  f"end it: pscluster stop-job --name {name}\n  supervisor log: {ui.escape(str(spawned.log))}")


@cli.command("supervise", hidden=True)
@click.option("--name", required=True, callback=lambda ctx, param, value: check_cluster_name(value))
@click.pass_context
def supervise(ctx: click.Context, name: str) -> None:
    """Internal: the supervisor daemon of `train --detach` / `run --detach` (its request on stdin)."""
    from ..program.request import JsonRequest, RunRequest
    from ..supervision.daemon import DaemonFiles
    from ..supervision.train_spec import TrainRequest
    env: Env = ctx.obj
    kinds: dict[str, tuple[type[JsonRequest], Callable[..., None]]] = {"train": (TrainRequest, _train),
                                                                        "run": (RunRequest, _run)}
    try:
        sent = json.loads(sys.stdin.read())
        kind, body = kinds[sent["command"]]
        request = kind.from_json(sent["request"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"supervise: bad request on stdin ({exc})", hint="an internal command of --detach") from None
    devnull = os.open(os.devnull, os.O_RDONLY)       # nothing more to read: stdin is /dev/null from here on
    os.dup2(devnull, 0)
    os.close(devnull)
    env.detached = DaemonFiles.of(env.store.root, name, os.getpid())
    body(env, request, detach=False)


def _final_report(env: Env, job, *, as_json: bool) -> None:
    """An ended job's report, as its own ``train`` / ``run`` would have printed it."""
    result = dict(job.result or {})
    if job.state == "done" and result:
        if job.entry == "run":
            _show_run_report(env, result, as_json=as_json)
        elif as_json:
            env.out.print_json(json.dumps(result))
        else:
            ui.render_summary(env.out, result)
            if result.get("deadline_reached"):
                _deadline_report(env, result, job.job)
        return
    if as_json:
        env.out.print_json(json.dumps(job.to_json()))
    text = f"job {job.id} ({job.job}) {job.state}" + (f": {job.message}" if job.message else "")
    if job.checkpoint_step is not None:
        text += f"; last checkpoint at step {job.checkpoint_step}: {job.checkpoint}"
    env.err.print(text, style="red" if job.state == "failed" else "yellow", markup=False, highlight=False)


@cli.command()
@name_opt
@click.option("--json", "as_json", is_flag=True, help="Print only the final report, as JSON.")
@click.pass_obj
def attach(env: Env, name: str | None, as_json: bool) -> None:
    """Follow the cluster's job (started with --detach, or by a train in another terminal): the
    same live view as train, then its final report; exits with the job's exit code (0 done,
    1 failed, 4 --deadline, 130 stopped). Ctrl-C only detaches: the job goes on."""
    from ..supervision import daemon as detach
    from ..events import Reporter
    resolved = env.store.resolve_name(name)
    job = _existing(env, resolved).job
    if job is None:
        raise UsageError(f"cluster {resolved!r} has not run a job yet",
                         hint=f"'pscluster train JOB --name {resolved} --detach' starts one")
    display: Reporter
    if job.entry == "run":
        display = ui.ProgramOutput(env.err if as_json else env.out, env.err)
    else:
        display = ui.EventLineReporter(env.err) if as_json else ui.TrainDisplay(env.err)
    if job.live:
        env.err.print(f"attached to job {job.id} ({job.job}) on {resolved!r}: Ctrl-C detaches, the job goes on",
                      markup=False, highlight=False)
    try:
        final = detach.follow(env.store, resolved, job.id, lambda kind, data: display.handle(kind, **data))
    except KeyboardInterrupt:
        display.close()
        env.err.print(f"detached: job {job.id} goes on. 'pscluster attach --name {resolved}' follows it again, "
                      f"'pscluster stop-job --name {resolved}' ends it", markup=False, highlight=False)
        return
    finally:
        display.close()
    _final_report(env, final, as_json=as_json)
    code = detach.exit_status(final)
    if code:
        raise SystemExit(code)


@cli.command("stop-job")
@name_opt
@click.option("--timeout", type=SECONDS, default=300.0, show_default=True,
              help="Seconds to wait for the supervisor to stop the job.")
@click.option("--grace", type=FiniteFloat(0, 3600), default=DEFAULT_GRACE, show_default=True,
              help="Without a supervisor: seconds between SIGTERM and SIGKILL.")
@click.pass_obj
def stop_job(env: Env, name: str | None, timeout: float, grace: float) -> None:
    """Stop the cluster's running job, as Ctrl-C in its train would: the job checkpoints
    first (the async chief, sync-ps worker 0, or every sync worker at one agreed step), its processes stop, the standing servers stay up."""
    import socket
    from ..liveness import orchestrator_alive, stop_supervisor
    from ..supervision.jobstop import stop_orphaned_job
    resolved = env.store.resolve_name(name)
    job = _existing(env, resolved).job
    if job is None or not job.live:
        env.err.print(f"no job is running on {resolved!r}" + (f" (job {job.id} is {job.state})" if job else ""),
                      markup=False, highlight=False)
        return
    info = job.orchestrator
    if info is not None and info.host != socket.gethostname():
        raise UsageError(f"job {job.id} is supervised from {info.host}, not this machine",
                         hint=f"run 'pscluster stop-job' on {info.host}, or 'pscluster down' to stop everything")
    if info is not None and orchestrator_alive(info):
        env.err.print(f"asking job {job.id}'s supervisor (pid {info.pid}) to stop it; the leader checkpoints first "
                      "(up to the job's --stop-grace)", markup=False, highlight=False)
        if not stop_supervisor(info, timeout=timeout):
            raise PsclusterError(f"job {job.id}'s supervisor (pid {info.pid}) is still stopping it after {timeout:.0f} s",
                                 hint=f"'pscluster down --name {resolved}' stops everything at once")
    else:
        reporter = ui.RichReporter(env.err)
        try:
            # Its leader (every sync worker) still checkpoints first, within the job's --stop-grace.
            stop_orphaned_job(resolved, store=env.store, reporter=reporter, grace=grace)
        finally:
            reporter.close()
    final = _existing(env, resolved).job
    if final is not None:
        env.err.print(ui.render_job_line(final) + (f"; checkpoint at step {final.checkpoint_step}: {final.checkpoint}"
                                                   if final.checkpoint_step is not None else ""),
                      markup=False, highlight=False)


def _show_run_report(env: Env, report: dict, *, as_json: bool) -> None:
    if as_json:
        env.out.print_json(json.dumps(report))
    else:
        ui.render_run_report(env.err, report)
