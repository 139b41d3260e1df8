"""The ``pscluster`` command line. Definitions only: behaviour lives in the launcher, training
and supervisor modules; this module turns their results into output and their errors into
exit codes (0 ok, 1 failure, 2 bad input or usage, 4 ``train --deadline`` reached (checkpoint saved),
130 interrupted, 143/129 terminated by SIGTERM/SIGHUP, after the same clean-up as Ctrl-C).
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import console as ui
from .codesync import local_workdir, project_root
from .contracts import DEFAULT_GRACE, DEFAULT_STOP_GRACE, ExitStatus, Until, resolve_mode
from .history import DEFAULT_KEEP
from .progfiles import DEFAULT_SYNC_LIMIT_MIB
from .errors import PsclusterError, Terminated, UsageError
from .inventory import KERAS_CHOICES, MODE_NAMES, Inventory, canonical_mode, load_inventory
from .names import check_cluster_name
from .notify import Notifier
from . import secrets as secrets_rule
from .plan import ClusterPlan, PlanOptions, plan_cluster
from .state import RunState, StateStore
from .transport import TransportPool
from .slurm import Layout

if TYPE_CHECKING:
    from rich.console import Console      # rich itself is console.py's (docs/architecture.md)


@dataclass
class Env:
    """What commands read and write instead of globals (tests pass their own)."""

    out: Console
    err: Console
    store: StateStore
    traceback: bool = False
    pool_factory: type = TransportPool
    extra: dict = field(default_factory=dict)
    detached: Any = None        # cluster.detach.DaemonFiles when this process is a --detach supervisor


def _plan(inventory: str, *, name: str | None, mode: str | None, port_base: int | None,
          env: Env | None = None, limit: str | None = None, pool: TransportPool | None = None) -> ClusterPlan:
    """The plan of INVENTORY; with ``pool``, `<role>_gpus: auto` is resolved on the hosts."""
    options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=name,
                          mode=mode, port_base=port_base)
    return _planned(_inventory(env, inventory, limit, mode), options, pool)


def _planned(inventory: Inventory, options: PlanOptions, pool: TransportPool | None) -> ClusterPlan:
    plan = plan_cluster(inventory, options)
    if pool is not None and plan.auto_gpu_hosts:
        from .preflight import resolve_auto_gpus
        plan = plan_cluster(resolve_auto_gpus(inventory, plan, pool), options)
    return plan


detach_opt = click.option("--detach", is_flag=True,
                          help="Return once the job's processes have started; a supervisor daemon on this machine keeps "
                               "supervising it (pscluster attach / status / stop-job).")
replace_opt = click.option("--replace", is_flag=True,
                           help="If a job is still running on the cluster, stop it first (instead of refusing).")
allow_busy_opt = click.option("--allow-busy-gpus", is_flag=True,
                              help="Start on GPUs that other processes already use (lab GPUs are shared).")


def _inventory(env: Env | None, path: str, limit: str | None, mode: str | None,
               roles: tuple[str, ...] | None = None):
    """Load INVENTORY, print its warnings once (stderr), apply --limit."""
    from .patterns import apply_limit, required_roles
    inventory = load_inventory(path)
    if env is not None:
        ui.render_warnings(env.err, inventory.warnings)
    warn = None if env is None else (lambda warning: ui.render_warnings(env.err, [warning]))
    return apply_limit(inventory, limit, required_roles(mode, inventory, roles), warn=warn)


def _secrets(*plans: ClusterPlan) -> secrets_rule.Secrets:
    """Values of the inventory's secret variables, from this machine's environment. They are then
    removed from this process's environment: tasks on local hosts inherit it, and would otherwise
    all get every secret whatever cluster/secrets.py says (measured: a standing server did)."""
    found = secrets_rule.merge_all([secrets_rule.collect(plan, os.environ) for plan in plans])
    for name in found.values:
        os.environ.pop(name, None)
    return found


inventory_arg = click.argument("inventory", type=click.Path())
limit_opt = click.option("--limit", metavar="PATTERN",
                         help="Only these hosts (Ansible pattern: a,b  all:!node-c  worker:&gpu  node-*).")
name_opt = click.option("--name", help="Cluster name (default: the inventory's file name without .yaml).",
                        callback=lambda ctx, param, value: value if value is None else check_cluster_name(value))
mode_opt = click.option("--mode", type=click.Choice(MODE_NAMES),
                        callback=lambda ctx, param, value: value if value is None else canonical_mode(value),
                        help="Training mode (default: pscluster_mode, else async); between-graph is another name for "
                             "sync-ps (ps and workers, TF1 style; sync or async as the program decides).")
port_opt = click.option("--port-base", type=click.IntRange(1024, 65000), help="First port (overrides pscluster_port_base).")


class FiniteFloat(click.FloatRange):
    """A number option within [min, max] that must be finite: click's float and FloatRange take
    ``nan`` (which passes every bound check, so ``up --timeout nan`` never timed out) and ``inf``."""

    name = "finite number"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


SECONDS = FiniteFloat(1, 86400)      # timeouts: a second to a day


def _check_notify_urls(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    from .notify import url_problem
    for value in values:
        problem = url_problem(value)
        if problem:
            raise click.BadParameter(problem, ctx, param)
    return values


def _check_notify_cmds(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    from .notify import parse_targets
    try:
        parse_targets([], values)
    except UsageError as exc:
        raise click.BadParameter(exc.message.split(": ", 1)[-1], ctx, param) from None
    return values


def notify_opts(command):
    """``--notify URL`` and ``--notify-cmd CMD`` (train, run): job state changes, see cluster/notify.py."""
    command = click.option("--notify-cmd", "notify_cmds", multiple=True, metavar="CMD", callback=_check_notify_cmds,
                           help="Run CMD with the event JSON on stdin on each job state change; repeatable.")(command)
    return click.option("--notify", "notify_urls", multiple=True, metavar="URL", callback=_check_notify_urls,
                        help="POST a JSON event to URL when the job starts, restarts a task, fails, finishes or "
                             "reaches --deadline; repeatable, adds to pscluster_notify.")(command)


def _notifier(env: Env, plan: ClusterPlan, urls: tuple[str, ...], commands: tuple[str, ...],
              display) -> Notifier | None:
    """The notifier of the inventory's pscluster_notify and the command line's targets (None: no target).
    Its warnings go to ``display`` as messages."""
    from .notify import parse_targets
    targets = parse_targets([*plan.notify, *urls], commands)
    if not targets:
        return None
    return Notifier(targets, warn=lambda text: display.emit("message", level="warning", text=text))


def _with_notifier(display, notifier):
    from .events import TeeReporter
    return display if notifier is None else TeeReporter(display, notifier)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", type=click.Path(file_okay=False), envvar="PSCLUSTER_STATE_DIR",
              help="Where cluster state files live (default ~/.local/state/pscluster).")
@click.option("--traceback", is_flag=True, help="Show the full Python traceback on errors.")
@click.option("--no-color", is_flag=True, envvar="NO_COLOR", help="Plain output.")
@click.version_option(package_name="pscluster")
@click.pass_context
def cli(ctx: click.Context, state_dir: str | None, traceback: bool, no_color: bool) -> None:
    """Plan, launch and tear down TensorFlow parameter-server clusters over SSH."""
    if ctx.obj is None:
        out, err = ui.make_consoles(no_color=no_color)
        ctx.obj = Env(out=out, err=err, store=StateStore(Path(state_dir) if state_dir else None))
    ctx.obj.traceback = ctx.obj.traceback or traceback


@cli.command()
@inventory_arg
@name_opt
@mode_opt
@port_opt
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--firewall", is_flag=True, help="Also show the firewall rules up --firewall would install.")
@limit_opt
@click.pass_obj
def plan(env: Env, inventory: str, name: str | None, mode: str | None, port_base: int | None, as_json: bool,
         firewall: bool, limit: str | None) -> None:
    """Show the cluster an inventory describes, touching no host."""
    selected = _inventory(env, inventory, limit, mode)
    cluster = _planned(selected, PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=name,
                                             mode=mode, port_base=port_base), None)
    secret_names = sorted({n for host in cluster.hosts for n in host.secret_env})
    chosen = [host.name for host in selected.hosts]       # what --limit selected (some may get no task)
    if as_json:
        document = cluster.to_json()
        if limit is not None:
            document["limit"] = {"pattern": limit, "selected": chosen}
        for task in document["tasks"]:
            task["env"] = {key: ("****" if key in secret_names else value) for key, value in task["env"].items()}
        if firewall or cluster.firewall:
            from .firewall import ruleset_for
            document["firewall"] = {host.name: ruleset_for(cluster, host.name) for host in cluster.hosts}
        ui.print_json(env.out, document)
        return
    ui.render_plan(env.out, cluster, secret_names=secret_names)
    if limit is not None:
        idle = [name for name in chosen if name not in {host.name for host in cluster.hosts}]
        env.out.print(f"--limit {limit} selected {len(chosen)} host(s): {', '.join(chosen)}"
                      + (f" ({', '.join(idle)}: no task)" if idle else ""), markup=False, highlight=False)
    if firewall or cluster.firewall:
        from .firewall import ruleset_for
        env.out.print("\n[bold]firewall[/]: each host's TF ports accept loopback, every address of every "
                      "member host and this machine's source address toward that host (the probe's); "
                      "the comments say which is which. At up, members are also resolved on each host.")
        for host in cluster.hosts:
            env.out.print(f"\n[bold]nftables ruleset for {ui.escape(host.name)}[/]")
            env.out.print(ruleset_for(cluster, host.name), markup=False, highlight=False)


@cli.command()
@inventory_arg
@name_opt
@mode_opt
@port_opt
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@limit_opt
@allow_busy_opt
@click.pass_obj
def check(env: Env, inventory: str, name: str | None, mode: str | None, port_base: int | None, as_json: bool,
          limit: str | None, allow_busy_gpus: bool) -> None:
    """Preflight only: reachability, interpreter, TensorFlow, ports, GPUs, per host."""
    from .events import Reporter
    from .preflight import run_preflight
    with env.pool_factory() as pool:
        cluster = _plan(inventory, name=name, mode=mode, port_base=port_base, env=env, limit=limit, pool=pool)
        report = run_preflight(cluster, pool, Reporter(), allow_busy_gpus=allow_busy_gpus)
    if as_json:
        env.out.print_json(json.dumps({"ok": report.ok, "seconds": report.seconds,
                                       "checks": [asdict(result) for result in report.results]}))
    else:
        ui.render_checks(env.out, report)
    if not report.ok:
        raise SystemExit(ExitStatus.FAILURE)


@cli.command()
@inventory_arg
@name_opt
@mode_opt
@port_opt
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True, help="Seconds to wait for every server to answer.")
@click.option("--firewall", is_flag=True, help="Install nftables rules so only cluster members reach the ports.")
@click.option("--json", "as_json", is_flag=True, help="Print the resulting status as JSON.")
@limit_opt
@allow_busy_opt
@click.option("--slurm", is_flag=True, help="Lay out the cluster on this Slurm allocation and WRITE it to INVENTORY; "
              "tasks run as job steps (see README 'On a Slurm cluster').")
@click.option("--ps", "slurm_ps", type=click.IntRange(0), help="With --slurm: ps tasks (default: one per node).")
@click.option("--chief/--no-chief", "slurm_chief", default=True, help="With --slurm: a chief on the first node.")
@click.option("--workers-per-node", type=click.IntRange(1), help="With --slurm: workers per node (default: the job's tasks per node).")
@click.option("--evaluator", is_flag=True, help="With --slurm: an evaluator on the last node.")
@click.option("--gpus-per-worker", type=click.IntRange(0), default=0, help="With --slurm: GPUs per worker, of those Slurm granted.")
@click.pass_obj
def up(env: Env, inventory: str, name: str | None, mode: str | None, port_base: int | None, timeout: float,
       firewall: bool, as_json: bool, limit: str | None, allow_busy_gpus: bool, slurm: bool, slurm_ps: int | None,
       slurm_chief: bool, workers_per_node: int | None, evaluator: bool, gpus_per_worker: int) -> None:
    """Preflight, sync code, start the standing servers and wait until they answer."""
    from dataclasses import replace as _replace
    from .launcher import bring_up, rows_after_up
    if slurm:
        _write_slurm_inventory(inventory, mode, _slurm_layout(slurm_ps, slurm_chief, workers_per_node, evaluator,
                                                              gpus_per_worker))
    reporter = ui.RichReporter(env.err)
    try:
        with env.pool_factory() as pool:
            cluster = _plan(inventory, name=name, mode=mode, port_base=port_base, env=env, limit=limit, pool=pool)
            if firewall:
                cluster = _replace(cluster, firewall=True)
            secrets = _secrets(cluster)
            result = bring_up(cluster, store=env.store, reporter=reporter, timeout=timeout, pool=pool,
                              secrets=secrets, allow_busy_gpus=allow_busy_gpus, standby=True, port_base=port_base,
                              limit=limit)
            reporter.close()
        _show_status(env, result.state, rows_after_up(result.state, result.devices), as_json=as_json)
    finally:
        reporter.close()
    if not as_json:
        env.err.print(f"[green]cluster {cluster.name!r} is up[/] in {result.seconds:.1f} s "
                      f"({len(result.devices)} server(s) ready). Next: pscluster train distributed_mnist"
                      + (f" --name {cluster.name}" if len(env.store.names()) > 1 else ""))


def _existing(env: Env, name: str) -> RunState:
    """The state of cluster ``name``, which must exist (it may vanish between resolve and load)."""
    state = env.store.load(name)
    if state is None:
        raise UsageError(f"no cluster named {name!r}", hint="'pscluster status' lists the clusters that are up")
    return state


def _slurm_layout(ps: int | None, chief: bool, workers_per_node: int | None, evaluator: bool,
                  gpus_per_worker: int) -> Layout:
    return Layout(ps=ps, chief=chief, workers_per_node=workers_per_node, evaluator=evaluator,
                  gpus_per_worker=gpus_per_worker)


def _write_slurm_inventory(path: str, mode: str | None, layout: Layout) -> None:
    """Write the inventory of this allocation (``up --slurm``); the later commands read it like any other."""
    import yaml
    from .slurm import layout_inventory
    from .transport.slurm import read_allocation
    alloc = read_allocation(dict(os.environ))
    document = layout_inventory(alloc, layout, python=sys.executable, workdir=local_workdir(),
                                mode=mode)
    with open(path, "w") as handle:
        handle.write(f"# written by `pscluster up --slurm` for Slurm job {alloc.job_id}\n")
        yaml.safe_dump(document, handle, sort_keys=False)


def _print_status(env: Env, name: str, *, as_json: bool, pool: TransportPool) -> None:
    from .launcher import cluster_status
    from .probe import Prober
    state = _existing(env, name)
    with Prober() as prober:
        rows = cluster_status(state, pool=pool, prober=prober)
    _show_status(env, state, rows, as_json=as_json)


def _show_status(env: Env, state, rows, *, as_json: bool) -> None:
    import socket
    import time
    from . import detach
    job = state.job
    health = detach.supervisor_health(job, alive=detach.orchestrator_alive(job.orchestrator if job else None),
                                      here=socket.gethostname(), now=time.time())
    if as_json:
        env.out.print_json(json.dumps({
            "name": state.name, "mode": state.mode, "phase": state.phase, "message": state.message,
            "job": ({**state.job.to_json(), "steps_since_checkpoint": state.job.steps_since_checkpoint}
                    if state.job is not None else None),
            "supervisor": health.to_json() if health is not None else None,
            "tasks": [{"role": r.role, "index": r.index, "host": r.host, "address": r.address, "port": r.port,
                       "kind": r.kind, "pid": r.pid, "state": r.state, "devices": list(r.devices),
                       "uptime": r.uptime, "exit_code": r.exit_code, "restarts": r.restarts, "detail": r.detail,
                       "standby": r.standby.to_json() if r.standby else None}
                      for r in rows]}))
    else:
        ui.render_status(env.out, state.name, state.mode, state.phase, rows, job=state.job, message=state.message)
        if health is not None:
            ui.render_supervisor(env.out, health, cluster=state.name)


@cli.command()
@name_opt
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_obj
def status(env: Env, name: str | None, as_json: bool) -> None:
    """Each task's host, pid, state, uptime and devices; the running job's progress."""
    resolved = env.store.resolve_name(name)
    with env.pool_factory() as pool:
        _print_status(env, resolved, as_json=as_json, pool=pool)


@cli.command()
@click.argument("task", required=False)
@name_opt
@click.option("--run", "run_id", type=click.IntRange(1), default=None, metavar="N",
              help="The logs of run N of this cluster name (pscluster runs lists them), also once it is down.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("-n", "--lines", type=click.IntRange(0), default=None, help="Only the last N lines of each log.")
@click.pass_obj
def logs(env: Env, task: str | None, name: str | None, run_id: int | None, follow: bool, lines: int | None) -> None:
    """One task's log (TASK like worker:1), or all of them with a [task@host] prefix.

    Of the cluster that is up, or, with --run N (or after a one-shot run, whose cluster is gone),
    of an earlier run of that name."""
    from .logs import select_tasks, stream_logs, stream_run_logs

    def write(text: str) -> None:      # remote bytes: control characters shown as \x1b (N13), never raw
        env.out.file.write(ui.visible(text))
        env.out.file.flush()

    record = _run_record(env, name, run_id)
    with env.pool_factory() as pool:
        try:
            if record is not None:
                stream_run_logs(record, task, pool, write, lines=lines, follow=follow, prefix=task is None)
                return
            state = _existing(env, env.store.resolve_name(name))
            stream_logs(state, select_tasks(state, task), pool, write, lines=lines, follow=follow,
                        prefix=task is None)
        except KeyboardInterrupt:
            pass


def _run_record(env: Env, name: str | None, run_id: int | None):
    """The run ``logs`` reads from the history: run ``run_id`` of ``name``, or, when ``name`` has
    no cluster up, its newest run. None: read the cluster that is up."""
    from .history import RunHistory
    history = RunHistory(env.store.root)
    if name is None:
        names = env.store.names()
        if names:
            if run_id is None or len(names) > 1:
                return None       # the cluster that is up (resolve_name refuses several)
            name = names[0]
        else:
            recorded = history.names()
            if not recorded:
                return None       # resolve_name: no cluster is up
            if len(recorded) > 1:
                raise UsageError("no cluster is up, and runs of several names are recorded",
                                 hint=f"pick one with --name: {', '.join(recorded)} ('pscluster runs' lists them)")
            name = recorded[0]
    if run_id is None and env.store.load(name) is not None:
        return None
    runs = history.load(name)
    if not runs:
        known = ", ".join(sorted(set(env.store.names()) | set(history.names()))) or "none"
        raise UsageError(f"no cluster or run named {name!r} (known: {known})",
                         hint="'pscluster runs' lists the recent runs")
    record = runs[-1] if run_id is None else next((run for run in runs if run.id == run_id), None)
    if record is None:
        raise UsageError(f"{name!r} has no run {run_id}",
                         hint=f"its runs: {', '.join(str(run.id) for run in runs)} ('pscluster runs --name {name}')")
    return record


@cli.command("runs")
@name_opt
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.pass_obj
def runs(env: Env, name: str | None, as_json: bool) -> None:
    """Recent runs (run and train jobs) of every cluster name, or of --name: command, when, outcome.

    Their logs stay readable with 'pscluster logs --name NAME --run N' until run --keep or
    'pscluster clean' removes them."""
    from .history import RunHistory
    history = RunHistory(env.store.root)
    names = [name] if name else history.names()
    records = sorted((record for item in names for record in history.load(item)), key=lambda r: r.started)
    if name and not records:
        raise UsageError(f"no run of {name!r} is recorded", hint="'pscluster runs' lists every name's runs")
    if as_json:
        ui.print_json(env.out, [{"name": r.name, "run": r.id, "entry": r.entry, "command": list(r.command),
                                 "started": r.started, "ended": r.ended, "state": r.state, "exit_code": r.exit_code,
                                 "one_shot": r.one_shot, "tasks": sorted({log.task for log in r.logs})}
                                for r in records])
        return
    if not records:
        env.err.print("no run is recorded", markup=False, highlight=False)
        return
    ui.render_runs(env.out, records)


@cli.command()
@name_opt
@click.option("--keep", type=click.IntRange(0), default=0, show_default=True,
              help="Keep the newest N runs of each name.")
@click.pass_obj
def clean(env: Env, name: str | None, keep: int) -> None:
    """Remove the logs of finished runs from the hosts (all names, or --name), and their records."""
    from .history import RunHistory, remove_runs
    history = RunHistory(env.store.root)
    if name and not history.load(name):
        raise UsageError(f"no run of {name!r} is recorded", hint="'pscluster runs' lists every name's runs")
    stale = [record for item in ([name] if name else history.names()) for record in history.beyond(item, keep)]
    with env.pool_factory() as pool:
        removed, problems = remove_runs(history, stale, pool)
    for problem in problems:
        env.err.print(f"warning: {problem}", markup=False, highlight=False)
    env.err.print(f"removed the logs of {removed} run(s)"
                  + (f"; {len(stale) - removed} could not be removed (see above)" if problems else ""),
                  markup=False, highlight=False)
    if problems:
        raise SystemExit(ExitStatus.FAILURE)


@cli.command()
@name_opt
@click.option("--grace", type=FiniteFloat(0, 3600), default=DEFAULT_GRACE, show_default=True,
              help="Seconds between SIGTERM and SIGKILL.")
@click.option("--now", is_flag=True,
              help="Stop at once: a running job gets no time to checkpoint first (its steps since the "
                   "last checkpoint are lost).")
@click.pass_obj
def down(env: Env, name: str | None, grace: float, now: bool) -> None:
    """Stop every process this cluster started, on every host, and remove its state.

    A running job is stopped first as 'stop-job' stops it: its leader (every worker in sync mode)
    checkpoints within the job's --stop-grace; then the servers stop. --now skips that."""
    from .jobstop import stop_running_job
    from .launcher import bring_down
    resolved = env.store.resolve_name(name)
    reporter = ui.RichReporter(env.err)
    try:
        if not now:
            _stop_job_before_down(env, resolved, reporter, grace, stop_running_job)
        result = bring_down(resolved, store=env.store, reporter=reporter, grace=grace)
    finally:
        reporter.close()
    hosts = len({record.host for record in result.stopped})
    env.err.print(f"[green]cluster {resolved!r} is down[/]: {len(result.stopped)} process(es) stopped on "
                  f"{hosts} host(s) in {result.seconds:.1f} s; nothing left running")


def _stop_job_before_down(env: Env, name: str, reporter, grace: float, stop_running_job) -> None:
    """``down``'s first step: the running job checkpoints and stops (cluster/jobstop.py). A host
    that cannot be reached here is reported; ``down`` then goes on and says what is left."""
    state = env.store.load(name)
    if state is None or state.job is None or not state.job.live:
        return
    try:
        with env.pool_factory() as pool:
            job = stop_running_job(name, store=env.store, reporter=reporter, pool=pool, grace=grace)
    except PsclusterError as exc:
        reporter.emit("message", level="warning", text=f"stopping the job first: {exc.message.splitlines()[0]}")
        return
    if job is not None and job.checkpoint_step is not None:
        env.err.print(f"job {job.id} stopped; checkpoint at step {job.checkpoint_step}: {job.checkpoint}",
                      markup=False, highlight=False)


@cli.command()
@inventory_arg
@name_opt
@port_opt
@limit_opt
@allow_busy_opt
@click.option("--keep-global-batch", is_flag=True,
              help="sync, sync-ps: keep the global batch (default: each worker keeps its batch, so the global "
                   "batch follows the number of workers).")
@click.option("--timeout", type=SECONDS, default=600.0, show_default=True,
              help="Seconds to wait for a running job's supervisor to carry the resize out.")
@click.pass_obj
def scale(env: Env, inventory: str, name: str | None, port_base: int | None, limit: str | None,
          allow_busy_gpus: bool, keep_global_batch: bool, timeout: float) -> None:
    """Resize a cluster that is up to the edited INVENTORY: tasks of new hosts start, tasks of
    removed hosts stop, the rest stays. A running 'train' job checkpoints, and its training
    processes start again from there at the new size (see README 'A cluster that changes')."""
    from .resize import scale_cluster
    resolved = env.store.resolve_name(name)
    state = _existing(env, resolved)
    if port_base is None:       # what `up --port-base` gave, if it did (else the inventory's)
        port_base = state.port_base
    if limit is None:
        limit = state.limit
    reporter = ui.RichReporter(env.err)
    try:
        with env.pool_factory() as pool:
            new = _planned(_inventory(env, inventory, limit, state.mode), PlanOptions(
                local_python=sys.executable, local_workdir=local_workdir(), name=resolved, mode=state.mode,
                port_base=port_base), pool)
            result = scale_cluster(env.store, resolved, new, pool=pool, reporter=reporter, secrets=_secrets(new),
                                   keep_global_batch=keep_global_batch, allow_busy_gpus=allow_busy_gpus,
                                   timeout=timeout)
    finally:
        reporter.close()
    env.err.print(result.message, markup=False, highlight=False)


@cli.command()
@name_opt
@click.option("--port", type=click.IntRange(1024, 65535), default=6006, show_default=True,
              help="Port of the URL on this machine (TensorBoard's own on a local host).")
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True,
              help="Seconds TensorBoard may take to answer.")
@click.pass_obj
def tensorboard(env: Env, name: str | None, port: int, timeout: float) -> None:
    """Serve the jobs' TensorBoard summaries until Ctrl-C.

    TensorBoard runs on the host of the job's leader (async: the chief; sync, sync-ps: worker 0),
    bound to its loopback, on <workdir>/.pscluster/<name>/tensorboard/ (one run per job); an SSH
    host is reached through a port forwarded over its connection. Prints the URL on stdout.
    Ctrl-C or SIGTERM stops TensorBoard on the host (exit 130 / 143); so does 'down'.
    """
    import time
    from .tensorboard import TensorBoardRun
    resolved = env.store.resolve_name(name)
    _existing(env, resolved)
    with env.pool_factory() as pool:
        board = TensorBoardRun(store=env.store, name=resolved, pool=pool, port=port, timeout=timeout)
        env.err.print(f"starting TensorBoard for cluster {resolved!r} ...", markup=False, highlight=False)
        try:
            url = board.start()
            env.out.file.write(url + "\n")
            env.out.file.flush()
            env.err.print(f"TensorBoard on {board.host} serves {board.spec.logdir} at {url} (Ctrl-C stops it)",
                          markup=False, highlight=False)
            while True:          # a host call per check: every few seconds, not more
                time.sleep(5.0)
                board.check()
        finally:
            board.stop()


class DurationParam(click.ParamType):
    """A duration as seconds: 90, 90s, 45m, 2h, 1d; finite and at most a year (``nan``, ``inf`` and
    ``1e400s`` parsed as floats and meant "no deadline")."""

    name = "duration"
    units = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
    longest = 366 * 86400

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        text = str(value).strip().lower()
        number, unit = text.rstrip("smhd"), text[len(text.rstrip("smhd")):]
        try:
            seconds = float(number) * self.units[unit]
        except (ValueError, KeyError):
            self.fail(f"{value!r} is not a duration; write e.g. 90s, 45m, 2h", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0 or seconds > self.longest:
            self.fail(f"{value!r}: a duration must be > 0 and at most 366d", param, ctx)
        return seconds


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
@click.option("--data", help="Data file for the job, as a path on the hosts.")
@click.option("--steps-per-execution", type=click.IntRange(1), metavar="K",
              help="Steps per scheduled function / traced call.")
@click.option("--eval-every", type=click.IntRange(1), metavar="STEPS", help="Also evaluate on the test set every STEPS steps.")
@click.option("--warmup-steps", type=click.IntRange(0), metavar="STEPS",
              help="async: the first STEPS steps run on one worker at a time, then all workers train "
                   "(default: 256, at most a quarter of the budget; 0: none).")
@click.option("--summary-every", type=click.IntRange(0), default=100, show_default=True,
              metavar="STEPS", help="TensorBoard scalars every STEPS steps (0: none); see 'pscluster tensorboard'.")
@click.option("--restart-policy", type=click.Choice(["never", "on-failure", "always"]), default="on-failure",
              show_default=True, help="What to do when a task fails.")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=3, show_default=True,
              help="Restarts allowed per task (exponential backoff from 1 s).")
@click.option("--start-timeout", type=SECONDS, default=180.0, show_default=True,
              help="Seconds a training process may take to start training.")
@click.option("--collective-timeout", type=SECONDS, default=30.0, show_default=True,
              help="Sync mode: seconds a collective may wait for a peer.")
@click.option("--host-timeout", type=SECONDS, default=60.0, show_default=True,
              help="Seconds to wait for an unreachable host before failing the job.")
@click.option("--stop-grace", type=FiniteFloat(0, 3600), default=DEFAULT_STOP_GRACE, show_default=True, metavar="SECONDS",
              help="On Ctrl-C/SIGTERM/down the leader (sync: every worker, at one step) checkpoints and stops "
                   "within SECONDS (0: kill at once).")
@click.option("--deadline", type=DurationParam(), metavar="DURATION",
              help="Checkpoint and stop this long after the start (90s, 45m, 2h); exit 4.")
@click.option("--min-workers", type=click.IntRange(1), metavar="N",
              help="Elastic: a worker host lost beyond --host-timeout, or whose worker failed for good (restarts used "
                   "up, or --restart-policy never), drops out and training goes on while N workers remain; a lost "
                   "host rejoins when it answers again.")
@click.option("--hosts-from", metavar="COMMAND",
              help="Elastic: a discovery command (run here, split like a shell line, no shell) printing 'host' or 'host:workers' lines; the job "
                   "grows or shrinks to match (hosts of the inventory's worker group).")
@click.option("--hosts-every", type=FiniteFloat(1, 3600), default=10.0, show_default=True, metavar="SECONDS",
              help="How often --hosts-from runs.")
@notify_opts
@click.option("--json", "as_json", is_flag=True, help="Print only the final report, as JSON.")
@detach_opt
@replace_opt
@click.pass_obj
def train(env: Env, job: str, name: str | None, epochs, steps, batch_size, learning_rate, scale_lr, checkpoint_dir,
          checkpoint_every, resume, data, steps_per_execution, eval_every, warmup_steps, summary_every, restart_policy,
          max_restarts, start_timeout, collective_timeout, host_timeout, stop_grace, deadline, min_workers, hosts_from,
          hosts_every, notify_urls, notify_cmds, as_json: bool, detach: bool, replace: bool) -> None:
    """Train JOB (distributed_mnist, or a path to a job.py) on a cluster that is up."""
    from .resize import Elastic
    from .supervisor import Supervisor
    from .training import TrainOptions, resolve_job
    if epochs is not None and steps is not None:
        raise UsageError("give --epochs or --steps, not both")
    resolved = env.store.resolve_name(name)
    job_ref = resolve_job(job, project_root())
    options = TrainOptions(epochs=epochs, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                           scale_lr=scale_lr, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                           resume=resume, data=data, steps_per_execution=steps_per_execution,
                           eval_every=eval_every, warmup_steps=warmup_steps, summary_every=summary_every,
                           restart_policy=restart_policy,
                           max_restarts=max_restarts, start_timeout=start_timeout,
                           collective_timeout=collective_timeout, host_timeout=host_timeout,
                           stop_grace=stop_grace, deadline=deadline)
    state = _existing(env, resolved)
    if warmup_steps and state.plan.mode != "async":
        raise UsageError(f"--warmup-steps applies to async mode only; cluster {resolved!r} runs {state.plan.mode}")
    workers = len(state.plan.tasks_of("worker"))
    if min_workers is not None and min_workers > workers:
        raise UsageError(f"--min-workers {min_workers} is larger than cluster {resolved!r}, which has {workers} worker(s)",
                         hint=f"give at most --min-workers {workers}")
    elastic = (Elastic(min_workers, hosts_from, hosts_every) if min_workers is not None or hosts_from else None)
    if detach:
        _detach(env, resolved, state, replace=replace, as_json=as_json)
        return
    display = _job_display(env, ui.EventLineReporter(env.err) if as_json or env.detached else ui.TrainDisplay(env.err))
    notifier = _notifier(env, state.plan, notify_urls, notify_cmds, display)
    try:
        with env.pool_factory() as pool:
            summary = Supervisor(store=env.store, name=resolved, job=job_ref, options=options,
                                 reporter=_with_notifier(display, notifier), pool=pool, root=project_root(),
                                 secrets=_secrets(state.plan), detached=env.detached, replace=replace,
                                 elastic=elastic).run()
    finally:
        if notifier is not None:
            notifier.close()
        display.close()
    if as_json:
        env.out.print_json(json.dumps(summary))
    else:
        ui.render_summary(env.out, summary)
    if summary.get("deadline_reached"):
        _deadline_report(env, summary, job)
        raise SystemExit(ExitStatus.DEADLINE)


def _deadline_report(env: Env, result: dict, job: str) -> None:
    """The one line after a job that reached ``--deadline`` (train's, and attach's for it)."""
    env.err.print(f"--deadline reached at step {result.get('global_step')}: checkpoint "
                  f"{result.get('checkpoint')}; continue with 'pscluster train {job} --resume'",
                  style="yellow", markup=False, highlight=False)


@cli.command()
@inventory_arg
@click.option("--format", "fmt", type=click.Choice(["tfjob", "sbatch"]), default="tfjob", show_default=True,
              help="Manifest format: a Kubeflow TFJob (kubeflow.org/v1), or a Slurm batch script.")
@click.option("--time", "time_limit", help="sbatch: the job's time limit (e.g. 1:00:00).")
@click.option("--partition", help="sbatch: the partition.")
@click.option("--gres", help="sbatch: generic resources per node (e.g. gpu:2).")
@click.option("--steps", type=click.IntRange(1), help="sbatch: training steps (default: the job's own).")
@click.option("--run", "run_program_text", metavar="COMMAND",
              help="sbatch: run this program with `pscluster run` instead of training, e.g. "
                   "\"python prog.py --task_index={task_index}\" (split like a shell line).")
@click.option("--checkpoint-dir", "batch_checkpoint_dir",
              help="sbatch: checkpoint folder on shared storage; every run resumes from it "
                   "(default: $SLURM_SUBMIT_DIR/pscluster-checkpoints/<name>/<job>).")
@click.option("--checkpoint-every", "batch_checkpoint_every", type=click.IntRange(1), default=500, show_default=True,
              metavar="STEPS", help="sbatch: checkpoint interval in steps (besides the checkpoint on stop).")
@click.option("--warn-before", type=click.IntRange(1, 65535), default=120, show_default=True, metavar="SECONDS",
              help="sbatch: Slurm signals the script this long before the time limit (--signal=B:USR1@SECONDS); "
                   "it checkpoints, takes the cluster down and requeues the job.")
@click.option("--requeue/--no-requeue", "batch_requeue", default=True, show_default=True,
              help="sbatch: requeue the job itself after the time-limit warning.")
@click.option("--max-nodes", type=click.IntRange(1, 100000), metavar="N",
              help="sbatch: ask for the inventory's nodes up to N (--nodes=MIN-N); each run, a requeued one too, "
                   "lays the cluster out on the nodes it got and resumes from the checkpoint at that size.")
@click.option("--image", help="Container image of every replica (docker/Dockerfile builds one).  [default: "
                              "pscluster-node:tf2.21.0-cpu]")
@click.option("--job", default="distributed_mnist", show_default=True,
              help="A job of examples/, or a job's path inside the image.")
@mode_opt
@name_opt
@click.option("--restart-policy", type=click.Choice(["OnFailure", "Never", "Always", "ExitCode"]),
              default="OnFailure", show_default=True, help="The replicas' restart policy.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the manifest to FILE, not stdout.")
@click.pass_obj
def export(env: Env, inventory: str, fmt: str, time_limit: str | None, partition: str | None, gres: str | None,
           steps: int | None, run_program_text: str | None, batch_checkpoint_dir: str | None,
           batch_checkpoint_every: int, warn_before: int, batch_requeue: bool, max_nodes: int | None,
           image: str | None, job: str,
           mode: str | None, name: str | None, restart_policy: str, output: str | None) -> None:
    """Write the cluster as a manifest for another launcher (Kubernetes TFJob, Slurm sbatch), touching no host."""
    import yaml
    from .export import DEFAULT_IMAGE, secret_refs, tfjob_manifest, train_command
    if fmt == "sbatch":
        _export_sbatch(env, inventory, mode=mode, name=name, job=job, steps=steps, time_limit=time_limit,
                       partition=partition, gres=gres, output=output, program_text=run_program_text,
                       checkpoint_dir=batch_checkpoint_dir, checkpoint_every=batch_checkpoint_every,
                       warn_seconds=warn_before, requeue=batch_requeue, max_nodes=max_nodes)
        return
    if max_nodes is not None:
        raise UsageError("--max-nodes applies to --format sbatch")
    if run_program_text is not None:
        raise UsageError("--run applies to --format sbatch", hint="a TFJob trains the job given by --job")
    shipped = project_root() / "examples"      # the image is built from this checkout
    if shipped.is_dir() and "/" not in job and not job.endswith(".py") and not (shipped / job / "job.py").is_file():
        known = sorted(p.name for p in shipped.iterdir() if (p / "job.py").is_file())
        raise UsageError(f"no job named {job!r} in examples/",
                         hint=f"shipped jobs: {', '.join(known) or 'none'}; or give the job's path inside the image")
    cluster = _plan(inventory, name=name, mode=mode, port_base=None)
    if cluster.auto_gpu_hosts:
        raise UsageError(f"<role>_gpus: auto on {', '.join(cluster.auto_gpu_hosts)}: a manifest cannot count "
                         "a host's GPUs", hint="list the masks in the inventory for export")
    manifest = tfjob_manifest(cluster, image=image or DEFAULT_IMAGE, job_command=train_command(cluster.mode, job),
                              restart_policy=restart_policy, name=name)
    _write_output(env, yaml.safe_dump(manifest, sort_keys=False), output,
                  f"wrote TFJob {manifest['metadata']['name']!r} to {output}")
    for secret, keys in secret_refs(manifest).items():
        env.err.print(f"the manifest reads {', '.join(keys)} from the Secret {secret!r}; create it first from a "
                      f"file of KEY=value lines (not on a command line): kubectl create secret generic {secret} "
                      "--from-env-file=FILE", markup=False, highlight=False)


def _export_sbatch(env: Env, inventory: str, *, mode: str | None, name: str | None, job: str, steps: int | None,
                   time_limit: str | None, partition: str | None, gres: str | None, output: str | None,
                   program_text: str | None, checkpoint_dir: str | None, checkpoint_every: int, warn_seconds: int,
                   requeue: bool, max_nodes: int | None = None) -> None:
    """The inventory's layout as a batch script that runs `up --slurm` inside (cluster.slurm.BatchJob)."""
    import shlex
    from .runspec import check_placeholders
    from .slurm import BatchJob, batch_shape, sbatch_script
    program: tuple[str, ...] = ()
    if program_text is not None:
        try:
            program = tuple(shlex.split(program_text))
        except ValueError as exc:
            raise UsageError(f"--run {program_text!r}: {exc}", hint='quote it like a shell line: --run "python p.py"')
        if not program:
            raise UsageError("--run needs a program", hint='e.g. --run "python prog.py --task_index={task_index}"')
        check_placeholders(program)
    cluster = _plan(inventory, name=name, mode=mode, port_base=None)
    text = sbatch_script(BatchJob(
        **batch_shape(cluster), mode=cluster.mode, job=job, program=program, python=sys.executable,
        checkout=str(project_root()), steps=steps, time_limit=time_limit, partition=partition, gres=gres,
        name=cluster.name, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
        warn_seconds=warn_seconds, requeue=requeue, max_nodes=max_nodes))
    _write_output(env, text, output, f"wrote a batch script to {output}; submit it with: sbatch {output}")


def _write_output(env: Env, text: str, output: str | None, done: str) -> None:
    """Write an exported document to ``output`` (saying ``done``), or to stdout."""
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
        env.err.print(done, markup=False, highlight=False)
    else:
        env.out.file.write(text)
        env.out.file.flush()


def _csv(text: str, what: str, choices: tuple[str, ...] | None = None) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    if not items:
        raise UsageError(f"{what}: give at least one value")
    wrong = [item for item in items if choices is not None and item not in choices]
    if wrong and choices is not None:
        raise UsageError(f"{what}: {', '.join(wrong)} is not one of {', '.join(choices)}",
                         hint=f"e.g. {what} {','.join(choices)}")
    return items


@cli.command()
@click.argument("job")
@inventory_arg
@click.option("--workers", "workers_text", required=True, metavar="N,N,...",
              help="Worker counts to compare, e.g. 1,2,4.")
@click.option("--mode", "modes_text", metavar="MODE,...",
              help="Modes to compare: async, sync, sync-ps (default: pscluster_mode, else async).")
@click.option("--placement", "placements_text", default="pack", show_default=True, metavar="spread|pack",
              help="spread: one worker per host; pack: fill each host's GPU/CPU slots first; or both: spread,pack.")
@click.option("--steps", type=click.IntRange(1), default=300, show_default=True, help="Global steps per run.")
@click.option("--repeat", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Runs per configuration (the table shows medians and the min-max spread).")
@click.option("--target-accuracy", type=FiniteFloat(0, 1), help="Also time how long until val_accuracy "
                                                                     "reaches this (evaluates during training).")
@click.option("--eval-every", type=click.IntRange(1), metavar="STEPS",
              help="Evaluation interval with --target-accuracy (default: steps/10).")
@click.option("--batch-size", type=click.IntRange(1), help="Global batch size (default: the job's).")
@click.option("--steps-per-execution", type=click.IntRange(1), metavar="K", help="Steps per traced call.")
@port_opt
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True,
              help="Seconds to wait for the servers of each run.")
@click.option("--json", "as_json", is_flag=True, help="Print {environment, results} as JSON.")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the JSON document to FILE.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of throughput and efficiency vs workers.")
@limit_opt
@click.pass_obj
def bench(env: Env, job: str, inventory: str, workers_text: str, modes_text: str | None, placements_text: str,
          steps: int, repeat: int, target_accuracy: float | None, eval_every: int | None, batch_size: int | None,
          steps_per_execution: int | None, port_base: int | None, timeout: float, as_json: bool, out: str | None,
          plot: str | None, limit: str | None) -> None:
    """Train JOB on 1, 2, 4 ... workers of INVENTORY: running time, throughput, accuracy, scaling efficiency.

    Each configuration (mode x workers x placement, each --repeat times) is brought up as its own
    cluster (bench-<mode>-<n>w-<placement>-r<k>), trained for --steps and always brought down.
    Exit code 1 when a configuration failed, 130 when interrupted (what was measured is still shown).
    """
    from . import bench as study
    from .training import resolve_job
    inv = _inventory(env, inventory, limit, None, roles=("worker",))
    auto = [host.name for host in inv.hosts if any(slot.auto_gpus for slot in host.slots)]
    if auto:
        raise UsageError(f"<role>_gpus: auto on {', '.join(auto)}: bench needs each host's GPU slots up front",
                         hint="list the masks (worker_gpus: [[0], [1]]) for bench")
    try:
        workers = tuple(sorted({int(item) for item in _csv(workers_text, "--workers")}))
    except ValueError:
        raise UsageError(f"--workers: expected whole numbers, got {workers_text!r}", hint="e.g. --workers 1,2,4") from None
    if workers[0] < 1:
        raise UsageError("--workers: a configuration needs at least 1 worker")
    spec = study.StudySpec(modes=tuple(dict.fromkeys(canonical_mode(mode) for mode in
                                                     _csv(modes_text or resolve_mode(inv.mode), "--mode", MODE_NAMES))),
                           workers=workers,
                           placements=_csv(placements_text, "--placement", study.PLACEMENTS), steps=steps,
                           repeat=repeat, target_accuracy=target_accuracy, eval_every=eval_every,
                           batch_size=batch_size, steps_per_execution=steps_per_execution, port_base=port_base,
                           ready_timeout=timeout)
    if plot:
        from .benchplot import require_matplotlib
        require_matplotlib()
    job_ref = resolve_job(job, project_root())
    options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir())
    display = ui.BenchProgress(env.err)
    try:
        with env.pool_factory() as pool:
            facts = study.gather_facts(study.study_hosts(inv, spec, options), pool)
            cpus = {host: item.cpus for host, item in facts.items() if not isinstance(item, str)}
            configs = study.plan_study(inv, spec, options, cpus)
            secrets = _secrets(*(config.plan for config in configs if config.plan))
            outcome = study.Study(spec, store=env.store, pool=pool, job=job_ref, reporter=display,
                                  root=project_root(), secrets=secrets).run(configs)
    finally:
        display.close()
    document = study.document(outcome.results, study.environment(facts, job=job, inventory=inventory, spec=spec))
    if out:
        try:
            Path(out).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    summaries = study.summarize(outcome.results)
    title = f"{job_ref.name} on {inventory}: {steps} steps" + (f", median of {repeat} runs" if repeat > 1 else "")
    if plot:
        from .benchplot import describe_environment, write_plot
        write_plot(summaries, plot, title=title, subtitle=describe_environment(document["environment"]))
    if as_json:
        env.out.print_json(json.dumps(document))
    else:
        ui.render_bench(env.out, summaries, outcome.results, title=title)
    if any(result.status == "ok" and result.examples_per_second is None for result in outcome.results):
        env.err.print("some runs were too short to measure a rate (the first step or scheduled function is not "
                      "timed; async runs 32 steps per function): raise --steps or lower --steps-per-execution",
                      markup=False, highlight=False)
    if out and not as_json:
        env.err.print(f"wrote {out}", markup=False, highlight=False)
    if plot and not as_json:
        env.err.print(f"wrote {plot}", markup=False, highlight=False)
    if outcome.interrupted:
        raise SystemExit(ExitStatus.INTERRUPTED)
    if any(result.status == "failed" for result in outcome.results):
        raise SystemExit(ExitStatus.FAILURE)

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
@click.option("--restart-policy", type=click.Choice(["never", "on-failure", "always"]), default="never",
              show_default=True, help="What to do when a task fails (an arbitrary program may not be safe to restart).")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=3, show_default=True,
              help="Restarts allowed per task (exponential backoff from 1 s).")
@click.option("--host-timeout", type=SECONDS, default=60.0, show_default=True,
              help="Seconds to wait for an unreachable host before failing the run.")
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
@click.option("--keep", type=click.IntRange(1, 100_000), default=DEFAULT_KEEP, show_default=True,
              help="Runs of this cluster name whose logs are kept (pscluster runs / logs --run); older ones are "
                   "removed from the hosts when this run ends.")
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
    from dataclasses import replace as _replace
    from .runprog import ProgramSupervisor, run_one_shot
    from .runspec import (Workspace, check_placeholders, check_sync_paths, local_files, one_shot_roles, parse_roles,
                          select_tasks)
    from .supervision.executor import JobFailed, restart_rules
    env: Env = ctx.obj
    program = ctx.meta.get("pscluster.program")
    if not program:
        raise UsageError("no program to run: put it after --",
                         hint="pscluster run inventories/local.yaml -- python train.py --task_index={task_index}")
    check_placeholders(program)
    on = parse_roles(on_text) if on_text else None
    space = Workspace(cwd=Path.cwd(), root=project_root())
    check_sync_paths(sync_paths, space)     # bad --sync: a usage error before anything happens
    # Walked and hashed only when some host needs the files (a shared checkout does not).
    files = functools.partial(local_files, program, sync_paths, space, limit_mib=sync_limit)
    rules = restart_rules(restart_policy, max_restarts)
    output = _job_display(env, ui.ProgramOutput(env.err if as_json else env.out, env.err))
    if inventory is None and (mode or port_base or firewall or limit):
        raise UsageError("--mode, --port-base, --firewall and --limit apply to a one-shot run (give INVENTORY)",
                         hint="a cluster that is up keeps the mode and ports of its 'up'")
    if inventory is not None and (detach or replace):
        raise UsageError("--detach and --replace apply to a run on a cluster that is up, not to a one-shot run",
                         hint=f"'pscluster up {inventory}', then 'pscluster run --detach -- PROGRAM ...'; "
                              "'pscluster down' when it is done")

    notifiers: list = []

    def supervisor(cluster_name: str, one_shot: bool, plan: ClusterPlan) -> ProgramSupervisor:
        notifier = _notifier(env, plan, notify_urls, notify_cmds, output)
        notifiers.append(notifier)
        return ProgramSupervisor(store=env.store, name=cluster_name, argv=program, on=on, files=files, space=space,
                                 reporter=_with_notifier(output, notifier), pool=pool, rules=rules,
                                 host_timeout=host_timeout, grace=grace, secrets=secrets, one_shot=one_shot,
                                 detached=env.detached, replace=replace, until=Until(until) if until else None,
                                 keep=keep, keras=keras, min_workers=min_workers)

    current: list[ProgramSupervisor] = []

    def remember(item: ProgramSupervisor) -> ProgramSupervisor:
        current.append(item)
        return item

    if dry_run:
        _dry_run(env, inventory, name=name, mode=mode, port_base=port_base, limit=limit, on=on, program=program,
                 space=space, as_json=as_json, keras=keras)
        return
    try:
        with env.pool_factory() as pool:
            if inventory is not None:
                inv = load_inventory(inventory)
                roles = on or one_shot_roles(inv, mode)
                inv = _inventory(env, inventory, limit, mode, roles=roles)
                options = PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=name,
                                      mode=mode, port_base=port_base, roles=roles)
                cluster = _planned(inv, options, pool)
                if firewall:
                    cluster = _replace(cluster, firewall=True)
                _check_until(until, cluster.tasks)
                _check_min_workers(min_workers, select_tasks(cluster, on))
                if keras:            # preflight then checks tf-keras where legacy Keras is asked for
                    cluster = _replace(cluster, hosts=tuple(_replace(host, keras=keras) for host in cluster.hosts))
                if env.store.load(cluster.name) is not None:
                    raise UsageError(f"a cluster named {cluster.name!r} exists already",
                                     hint=f"run on it with 'pscluster run --name {cluster.name} -- ...', or give this "
                                          "one-shot run another --name")
                secrets = _secrets(cluster)
                bringup = ui.RichReporter(env.err)
                report = run_one_shot(cluster, lambda: remember(supervisor(cluster.name, True, cluster)), store=env.store,
                                      pool=pool, bringup_reporter=bringup, secrets=secrets, timeout=timeout,
                                      grace=grace, allow_busy_gpus=allow_busy_gpus)
            else:
                resolved = env.store.resolve_name(name)
                state = env.store.load(resolved)
                if state is None:
                    raise UsageError(f"no cluster named {resolved!r}")
                _check_until(until, select_tasks(state.plan, on))    # bad --on, --until: before anything happens
                _check_min_workers(min_workers, select_tasks(state.plan, on))
                if detach:
                    _detach(env, resolved, state, replace=replace, as_json=as_json)
                    return
                secrets = _secrets(state.plan)
                report = remember(supervisor(resolved, False, state.plan)).run()
    except JobFailed:
        if current:
            _show_run_report(env, current[-1].report(exit_code=1), as_json=as_json)
        raise
    finally:
        for notifier in notifiers:
            if notifier is not None:
                notifier.close()
        output.close()
    _show_run_report(env, report, as_json=as_json)

def _check_until(until: str | None, tasks) -> None:
    """``--until`` must name tasks that run the program (a usage error before anything starts)."""
    from .supervision.core import until_problem
    roles = [task.role for task in tasks]
    problem = until_problem(Until(until), roles) if until else None
    if problem is not None:
        raise UsageError(problem, hint=f"the program runs on {', '.join(dict.fromkeys(roles))}; "
                                       "choose another --until")


def _check_min_workers(min_workers: int | None, tasks) -> None:
    """``--min-workers`` cannot exceed the workers that run the program (a usage error up front)."""
    workers = sum(1 for task in tasks if task.role == "worker")
    if min_workers is not None and min_workers > workers:
        raise UsageError(f"--min-workers {min_workers} is larger than the {workers} worker(s) that run the program",
                         hint=f"give at most --min-workers {workers}" if workers else "the program runs on no worker")


def _dry_run(env: Env, inventory: str | None, *, name: str | None, mode: str | None, port_base: int | None,
             limit: str | None, on, program, space, as_json: bool, keras: str | None = None) -> None:
    """``run --dry-run``: the one-shot plan of INVENTORY (as ``plan`` makes it: no host is asked,
    so `<role>_gpus: auto` stays unresolved), or the plan of the cluster that is up."""
    import shlex
    from .runspec import dry_run, one_shot_roles, same_command_lines, select_tasks
    if inventory is not None:
        roles = on or one_shot_roles(load_inventory(inventory), mode)
        cluster = _planned(_inventory(env, inventory, limit, mode, roles=roles),
                           PlanOptions(local_python=sys.executable, local_workdir=local_workdir(), name=name,
                                       mode=mode, port_base=port_base, roles=roles), None)
        tasks = cluster.tasks if on is None else select_tasks(cluster, on)
    else:
        cluster = _existing(env, env.store.resolve_name(name)).plan
        tasks = select_tasks(cluster, on)
    rows = dry_run(cluster, tasks, program, space, keras)
    warnings = same_command_lines(cluster, tasks, program)
    if as_json:
        ui.print_json(env.out, {"cluster": cluster.name, "tasks": rows, "warnings": warnings})
        return
    for row in rows:
        env.out.print(f"{row['task']}@{row['host']} in {row['cwd']}: {shlex.join(row['argv'])}",
                      markup=False, highlight=False)
        mask = row["cuda_visible_devices"]
        env.out.print(f"  CUDA_VISIBLE_DEVICES: {'(not set)' if mask is None else repr(mask)}",
                      markup=False, highlight=False)
        env.out.print("  env: " + " ".join(f"{key}={shlex.quote(value)}" for key, value in row["env"].items()),
                      markup=False, highlight=False)
    for warning in warnings:
        env.err.print(f"warning: {warning}", markup=False, highlight=False)
    env.err.print(f"dry run: {len(rows)} task(s) of cluster {cluster.name!r}; nothing was started",
                  markup=False, highlight=False)


# ----------------------------------------------------------------------------- detached jobs (cluster/detach.py)

def _job_display(env: Env, display):
    """The job's reporter; in a --detach supervisor, every event also goes to its events file
    (what ``attach`` replays)."""
    if env.detached is None:
        return display
    from .detach import EventLog
    from .events import TeeReporter
    return TeeReporter(display, EventLog(env.detached.events))


def _detach(env: Env, name: str, state: RunState, *, replace: bool, as_json: bool) -> None:
    """``--detach``: start this very command in a supervisor daemon and return once the job's
    processes run (job state ``running``); the daemon's log lines are shown meanwhile."""
    from . import detach
    ctx = click.get_current_context()
    job = state.job
    alive = job is not None and job.live and detach.orchestrator_alive(job.orchestrator)
    conflict = detach.job_conflict(name, job, supervisor_alive=alive, running=0)
    if conflict is not None and not replace:
        raise UsageError(conflict.message, hint=conflict.hint)
    program = ctx.meta.get("pscluster.program")
    request = {"command": ctx.command.name, "params": dict(ctx.params, name=name, detach=False),
               "program": list(program) if program else None}
    spawned = detach.spawn_supervisor(env.store.root, name, request)
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
    from .detach import DaemonFiles
    env: Env = ctx.obj
    try:
        request = json.loads(sys.stdin.read())
        command = cli.commands[request["command"]]
        params = dict(request["params"], detach=False)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"supervise: bad request on stdin ({exc})", hint="an internal command of --detach") from None
    devnull = os.open(os.devnull, os.O_RDONLY)       # nothing more to read: stdin is /dev/null from here on
    os.dup2(devnull, 0)
    os.close(devnull)
    env.detached = DaemonFiles.of(env.store.root, name, os.getpid())
    if request.get("program"):
        ctx.meta["pscluster.program"] = tuple(request["program"])
    ctx.invoke(command, **params)


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
    from . import detach
    from .events import Reporter
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
    from . import detach
    from .jobstop import stop_orphaned_job
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
    if info is not None and detach.orchestrator_alive(info):
        env.err.print(f"asking job {job.id}'s supervisor (pid {info.pid}) to stop it; the leader checkpoints first "
                      "(up to the job's --stop-grace)", markup=False, highlight=False)
        if not detach.stop_supervisor(info, timeout=timeout):
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


def run(argv: list[str] | None = None, env: Env | None = None) -> int:
    """Run the CLI and return its exit code (what tests call).

    SIGTERM and SIGHUP raise :class:`~cluster.errors.Terminated` (a KeyboardInterrupt) in the
    main thread, so ``up``, ``train``, ``bench`` and ``run`` roll back and clean up as after
    Ctrl-C; the exit code is then 128 + the signal's number, whatever the command reported.
    """
    with _terminations_interrupt() as received:
        code = _run(argv, env)
    return 128 + received[0] if received else code


@contextlib.contextmanager
def _terminations_interrupt():
    """Handlers for SIGTERM/SIGHUP for the duration of one command; yields the signals seen."""
    received: list[int] = []

    def handler(signum, frame):
        if received:
            return      # already cleaning up after the first one: let the clean-up finish
        received.append(signum)
        raise Terminated(signum)

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:      # not the main thread (an embedding program): leave signals alone
        pass
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run(argv: list[str] | None, env: Env | None) -> int:
    try:
        cli.main(args=argv, prog_name="pscluster", standalone_mode=False, obj=env)
        return ExitStatus.OK
    except PsclusterError as exc:
        env = env or _fallback_env()
        if env.traceback:
            env.err.print(traceback.format_exc(), markup=False)
        ui.render_error(env.err, exc)
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else (ExitStatus.OK if exc.code is None else ExitStatus.FAILURE)


def _fallback_env() -> Env:
    out, err = ui.make_consoles()
    return Env(out=out, err=err, store=StateStore(), traceback="--traceback" in sys.argv)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
