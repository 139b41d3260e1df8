"""Commands on a cluster: plan, check, up, status, down, scale, drain, undrain, tensorboard."""
from __future__ import annotations

import json
import os
import sys
from typing import Any
from dataclasses import asdict
import click

from .. import console as ui
from ..hosts.codesync import local_workdir
from ..contracts import DEFAULT_GRACE, ExitStatus, describe_default_mode
from ..errors import PsclusterError
from ..plan import PlanOptions
from ..transport import TransportPool
from ..slurm_layout import SlurmLayout
from ..state import RunState

from ..secrets import take_from_environment as take_secrets
from .base import Env, _existing, _inventory, _plan, _planned, cli
from .options import FiniteFloat, SECONDS, allow_busy_opt, inventory_arg, limit_opt, mode_opt, name_opt, port_opt


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
    mode_from = "option" if mode else "inventory" if selected.mode else "default"
    if as_json:
        document = cluster.to_json()
        document["mode_from"] = mode_from
        if limit is not None:
            document["limit"] = {"pattern": limit, "selected": chosen}
        for task in document["tasks"]:
            task["env"] = {key: ("****" if key in secret_names else value) for key, value in task["env"].items()}
        if firewall or cluster.firewall:
            from ..hosts.firewall import ruleset_for
            document["firewall"] = {host.name: ruleset_for(cluster, host.name) for host in cluster.hosts}
        ui.print_json(env.out, document)
        return
    ui.render_plan(env.out, cluster, secret_names=secret_names)
    if mode_from == "default":
        env.out.print(describe_default_mode(selected.mode_roles()), markup=False, highlight=False)
    if limit is not None:
        idle = [name for name in chosen if name not in {host.name for host in cluster.hosts}]
        env.out.print(f"--limit {limit} selected {len(chosen)} host(s): {', '.join(chosen)}"
                      + (f" ({', '.join(idle)}: no task)" if idle else ""), markup=False, highlight=False)
    if firewall or cluster.firewall:
        from ..hosts.firewall import ruleset_for
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
    from ..events import Reporter
    from ..hosts.preflight import run_preflight
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
    from ..lifecycle.status import rows_after_up
    from ..lifecycle.resize import pin_inventory
    from ..lifecycle.updown import bring_up
    if slurm:
        _write_slurm_inventory(inventory, mode, _slurm_layout(slurm_ps, slurm_chief, workers_per_node, evaluator,
                                                              gpus_per_worker))
    reporter = ui.RichReporter(env.err)
    try:
        with env.pool_factory() as pool:
            cluster = pin_inventory(_plan(inventory, name=name, mode=mode, port_base=port_base, env=env, limit=limit,
                                          pool=pool))
            if firewall:
                cluster = _replace(cluster, firewall=True)
            secrets = take_secrets(cluster)
            result = bring_up(cluster, store=env.store, reporter=reporter, timeout=timeout, pool=pool,
                              secrets=secrets, allow_busy_gpus=allow_busy_gpus, standby=True, port_base=port_base,
                              limit=limit, mode_from="option" if mode else "inventory")
            reporter.close()
        _show_status(env, result.state, rows_after_up(result.state, result.devices), as_json=as_json)
    finally:
        reporter.close()
    if not as_json:
        env.err.print(f"[green]cluster {cluster.name!r} is up[/] in {result.seconds:.1f} s "
                      f"({len(result.devices)} server(s) ready). Next: pscluster train distributed_mnist"
                      + (f" --name {cluster.name}" if len(env.store.names()) > 1 else ""))


def _slurm_layout(ps: int | None, chief: bool, workers_per_node: int | None, evaluator: bool,
                  gpus_per_worker: int) -> SlurmLayout:
    return SlurmLayout(ps=ps, chief=chief, workers_per_node=workers_per_node, evaluator=evaluator,
                  gpus_per_worker=gpus_per_worker)


def _write_slurm_inventory(path: str, mode: str | None, layout: SlurmLayout) -> None:
    """Write the inventory of this allocation (``up --slurm``); the later commands read it like any other."""
    import yaml
    from ..slurm_layout import layout_inventory
    from ..transport.slurm import read_allocation
    alloc = read_allocation(dict(os.environ))
    document = layout_inventory(alloc, layout, python=sys.executable, workdir=local_workdir(),
                                mode=mode)
    with open(path, "w") as handle:
        handle.write(f"# written by `pscluster up --slurm` for Slurm job {alloc.job_id}\n")
        yaml.safe_dump(document, handle, sort_keys=False)


def _print_status(env: Env, name: str, *, as_json: bool, pool: TransportPool, probe: bool = False) -> None:
    import time
    from ..lifecycle.status import Source, cluster_status, fresh_hosts, supervisor_alive
    from ..lifecycle.tasks import records_by_host
    from ..hosts.probe import Prober
    state = _existing(env, name)
    fresh = {} if probe else fresh_hosts(state, now=time.time(), supervisor_alive=supervisor_alive(state))
    with Prober() as prober:
        rows = cluster_status(state, pool=pool, prober=prober, fresh=fresh)
    asked = sorted(set(records_by_host(state.live_records())) - set(fresh))
    source = Source(tuple(sorted(fresh)), tuple(asked), max(fresh.values()) if fresh else None)
    _show_status(env, state, rows, as_json=as_json, source=source)


def _show_status(env: Env, state: RunState, rows: list, *, as_json: bool, source: Any = None) -> None:
    from ..lifecycle.status import status_view
    view = status_view(state, rows, source)
    if as_json:
        env.out.print_json(json.dumps(view.to_json()))
    else:
        ui.render_status(env.out, state.name, state.mode, state.phase, view.rows, job=state.job, message=state.message)
        if source is not None and source.from_record:
            env.out.print(f"({source.describe()}; 'pscluster status --probe' asks every host)")
        for host, how in sorted(state.drained.items()):
            env.out.print(f"{host}: {how} (pscluster undrain {host} lets it take tasks again)",
                          markup=False, highlight=False)
        if view.supervisor is not None:
            ui.render_supervisor(env.out, view.supervisor, cluster=state.name)


@cli.command()
@name_opt
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--probe", is_flag=True,
              help="Ask every host now, even those a live supervisor heard from lately (its record is used otherwise).")
@click.pass_obj
def status(env: Env, name: str | None, as_json: bool, probe: bool) -> None:
    """Each task's host, pid, state, uptime and devices; the running job's progress."""
    resolved = env.store.resolve_name(name)
    with env.pool_factory() as pool:
        _print_status(env, resolved, as_json=as_json, pool=pool, probe=probe)


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
    from ..supervision.jobstop import stop_running_job
    from ..lifecycle.updown import bring_down
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
    """``down``'s first step: the running job checkpoints and stops (cluster/supervision/jobstop.py). A host
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
    removed hosts stop, the rest stays. A running async 'train' job changes in place when workers
    are added after the last or the last ones removed (its chief takes them between two closures:
    no step lost); any other change checkpoints the job, and its training processes start again
    from there at the new size (see README 'A cluster that changes')."""
    from ..lifecycle.resize import pin_inventory, scale_cluster
    resolved = env.store.resolve_name(name)
    state = _existing(env, resolved)
    if port_base is None:       # what `up --port-base` gave, if it did (else the inventory's)
        port_base = state.port_base
    if limit is None:
        limit = state.limit
    reporter = ui.RichReporter(env.err)
    try:
        with env.pool_factory() as pool:
            edited = _inventory(env, inventory, limit, state.mode)
            _check_scale_mode(edited, inventory, state)
            new = pin_inventory(_planned(edited, PlanOptions(
                local_python=sys.executable, local_workdir=local_workdir(), name=resolved, mode=state.mode,
                port_base=port_base), pool))
            result = scale_cluster(env.store, resolved, new, pool=pool, reporter=reporter, secrets=take_secrets(new),
                                   keep_global_batch=keep_global_batch, allow_busy_gpus=allow_busy_gpus,
                                   timeout=timeout)
    finally:
        reporter.close()
    from ..supervision.drain_job import clear_drained
    clear_drained(env.store, resolved)
    env.err.print(result.message, markup=False, highlight=False)


@cli.command()
@click.argument("host")
@name_opt
@click.option("--deadline", default="30s", show_default=True,
              help="Time the host has left (30, 30s, 2m, 500ms): the tasks move before it, or the job checkpoints.")
@click.pass_obj
def drain(env: Env, host: str, name: str | None, deadline: str) -> None:
    """Move every task off HOST before the deadline (a machine about to be taken: spot notice,
    maintenance). Async workers leave in place, sync workers through a resize; a ps or the chief
    cannot move yet: the job checkpoints instead (see README 'Before a machine is taken').
    Exit 0: HOST holds nothing of the cluster; 1: the deadline came first (what is left is said)."""
    from ..lifecycle.drain import parse_deadline
    from ..supervision.drain_job import drain_host
    seconds = parse_deadline(deadline)
    result = _on_cluster(env, name, lambda resolved, pool, reporter: drain_host(
        env.store, resolved, host, deadline=seconds, pool=pool, reporter=reporter, secrets=take_secrets))
    env.err.print(result.message, markup=False, highlight=False)
    if not result.ok:
        raise SystemExit(ExitStatus.FAILURE)


@cli.command()
@click.argument("host")
@name_opt
@click.option("--timeout", type=SECONDS, default=600.0, show_default=True,
              help="Seconds to wait for a running job's supervisor to take the host back.")
@click.pass_obj
def undrain(env: Env, host: str, name: str | None, timeout: float) -> None:
    """Let a drained HOST take tasks again (an async job takes its workers back in place)."""
    from ..supervision.drain_job import undrain_host
    text = _on_cluster(env, name, lambda resolved, pool, reporter: undrain_host(
        env.store, resolved, host, pool=pool, reporter=reporter, secrets=take_secrets, timeout=timeout))
    env.err.print(text, markup=False, highlight=False)


def _on_cluster(env: Env, name: str | None, body):
    """``body(name, pool, reporter)`` on an existing cluster, with the console reporter closed after."""
    resolved = env.store.resolve_name(name)
    _existing(env, resolved)
    reporter = ui.RichReporter(env.err)
    try:
        with env.pool_factory() as pool:
            return body(resolved, pool, reporter)
    finally:
        reporter.close()


def _check_scale_mode(edited, path: str, state: RunState) -> None:
    """``scale`` keeps the mode: an edited inventory that asks for another one (where `up` took
    the mode from the inventory) is refused, not quietly run in the old mode."""
    from ..contracts import resolve_mode
    from ..errors import UsageError
    wanted = resolve_mode(edited.mode, roles=edited.mode_roles())
    if state.mode_from != "inventory" or wanted == state.mode:
        return
    message = (f"the edited inventory runs {wanted}, but cluster {state.name!r} runs {state.mode}: "
               "'scale' keeps the mode")
    hint = (f"to change the mode: pscluster stop-job --name {state.name} (a job checkpoints), "
            f"pscluster down --name {state.name}, pscluster up {path}, then train ... --resume")
    if edited.mode_origin is not None:
        raise edited.mode_origin.error(message, hint=hint)
    raise UsageError(f"{path}: {message} (it sets no pscluster_mode: the default is {wanted})", hint=hint)


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
    from ..tensorboard import TensorBoardRun
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
