"""Commands on what ran: logs, runs, clean."""
from __future__ import annotations

import click

from .. import console as ui
from ..contracts import ExitStatus
from ..errors import UsageError

from .base import Env, _existing, cli
from .options import name_opt


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
    from ..logs import select_tasks, stream_logs, stream_run_logs

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
    from ..history import RunHistory
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
    from ..history import RunHistory
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
    """Remove the logs of finished runs from the hosts (all names, or --name), and their records;
    also of runs that never recorded an end, once their processes are gone and they started over
    an hour ago."""
    from ..history import RunHistory, remove_runs
    from ..supervision.daemon import run_gone
    history = RunHistory(env.store.root)
    if name and not history.load(name):
        raise UsageError(f"no run of {name!r} is recorded", hint="'pscluster runs' lists every name's runs")
    gone = run_gone(env.store)
    stale = [record for item in ([name] if name else history.names())
             for record in history.beyond(item, keep, gone=gone)]
    with env.pool_factory() as pool:
        removed, problems = remove_runs(history, stale, pool)
    for problem in problems:
        env.err.print(f"warning: {problem}", markup=False, highlight=False)
    env.err.print(f"removed the logs of {removed} run(s)"
                  + (f"; {len(stale) - removed} could not be removed (see above)" if problems else ""),
                  markup=False, highlight=False)
    if problems:
        raise SystemExit(ExitStatus.FAILURE)
