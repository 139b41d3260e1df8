"""Static renderings: the plan, preflight checks, status, a job's line and summary, bench tables,
run reports, the run history, a detached supervisor's health.
"""
from __future__ import annotations

from typing import Any, Sequence

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from . import liveview
from ..urls import mask_url
from ..plan import ClusterPlan, HostSpec
from ..hosts.preflight import CheckReport
from ..jobrecord import JobProgress
from ..program.runspec import program_name
from .base import STATE_STYLES, _first_line, _mask, _plain, _texts, escape, print_json


def render_plan(console: Console, plan: ClusterPlan, *, secret_names: Sequence[str] = ()) -> None:
    """The plan as a table, the ClusterSpec and each task's details. Beyond
    INLINE_TF_CONFIG_TASKS tasks, plain text written at once (rich took ~6 s for 10,000 rows) with
    each task's TF_CONFIG naming the ClusterSpec instead of repeating it (N4)."""
    rows = [(task.name, task.host, task.target, _mask(task.cuda_visible_devices),
             "up (standing server)" if task.standing else "train") for task in plan.tasks]
    header = ("task", "host", "address:port", "CUDA_VISIBLE_DEVICES", "started by")
    inline = plan.inline_tf_config
    if inline:
        table = Table(title=Text(f"cluster {plan.name!r}: mode {plan.mode}"), box=box.SIMPLE_HEAVY)
        for column in header:
            table.add_column(column)
        for row in rows:
            table.add_row(*_texts(*row))
        console.print(table)
    else:
        widths = [max(len(_plain(row[i])) for row in [header, *rows]) for i in range(len(header))]
        lines = [_plain(f"cluster {plan.name!r}: mode {plan.mode}, {len(rows)} tasks")]
        lines += ["  ".join(_plain(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
                  for row in [header, *rows]]
        console.file.write("\n".join(lines) + "\n")
    for role, reason in plan.unused:
        console.print(Text(_plain(f"{role} tasks in the inventory are not used: {reason}"), "dim"))
    if plan.idle_ps:
        idle = [task.name for task in plan.tasks_of("ps")][-plan.idle_ps:]
        console.print(Text(_plain(f"{', '.join(idle)} kept idle by the chief (pscluster_idle_ps): a drained ps's "
                                  "variables move there in place")))
    if plan.notify:
        console.print(Text(_plain("notify (pscluster_notify): " + ", ".join(mask_url(url) for url in plan.notify))))
    console.print("[bold]hosts[/] (how each is reached; where the inventory set it)")
    for spec in plan.hosts:
        console.print(_plain("  " + host_line(spec)), soft_wrap=True, markup=False)
    console.print("[bold]ClusterSpec[/]")
    print_json(console, plan.cluster_spec)
    details = []
    for task in plan.tasks:
        host = plan.host(task.host)
        how = (f" as {host.become_user}" if host.become_user else "") + "".join(f" via {hop}" for hop in host.jump if hop.lower() != "none")
        title = (task.name, f" on {task.host}{how}  (cwd {task.workdir}, log {task.log_path})")
        env = dict(task.env)
        env.pop("TF_CONFIG", None)
        tf_config = plan.tf_config_text(task) if inline else \
            f'{{"cluster": <the ClusterSpec above>, "task": {{"type": "{task.role}", "index": {task.index}}}}}'
        shown = " ".join(f"{key}={'****' if key in secret_names else value}" for key, value in env.items())
        given = host.secret_env if not task.standing or task.role in host.secret_env_roles else ()
        shown += "".join(f" {key}=****" for key in given if key not in env)
        body = [_plain(f"  TF_CONFIG={tf_config}"), _plain(f"  env: {shown}"), _plain(f"  argv: {' '.join(task.argv)}")]
        if inline:
            console.print(f"\n[bold]{escape(title[0])}[/]{escape(title[1])}")
            for line in body:
                console.print(line, soft_wrap=True, markup=False)
        else:
            details += ["", _plain(title[0] + title[1]), *body]
    if details:
        console.file.write("\n".join(details) + "\n")
        console.file.flush()


def host_line(host: HostSpec) -> str:
    """One line: ``node-b: ssh pi@10.0.0.2:2200 key ~/.ssh/k via hop as root, python P, workdir W``,
    then where the inventory set each value (``ansible_port hosts:9``)."""
    if host.connection == "ssh":
        user = f"{host.user}@" if host.user else ""
        reach = f"ssh {user}{host.address}:{host.ssh_port or 22}"
        reach += f" key {host.key_file}" if host.key_file else ""
        reach += "".join(f" via {hop}" for hop in host.jump if hop.lower() != "none")
    else:
        reach = f"{host.connection} ({host.address})"
    reach += f" as {host.become_user}" if host.become_user else ""
    sources = ", ".join(f"{key} {where}" for key, where in host.origins)
    return f"{host.name}: {reach}, python {host.python}, workdir {host.workdir}" + (f"  [{sources}]" if sources else "")


COMPACT_CHECKS_ABOVE = 8     # hosts; beyond this a host whose checks all pass takes one row


def render_checks(console: Console, report: CheckReport) -> None:
    """One row per check; with many hosts, one row per host that passed everything (its
    details joined) and full rows only for the hosts with a failure."""
    by_host: dict[str, list] = {}
    for result in report.results:
        by_host.setdefault(result.host, []).append(result)
    compact = len(by_host) > COMPACT_CHECKS_ABOVE
    table = Table(title="preflight", box=box.SIMPLE_HEAVY)
    for column in ("host", "check", "result", "detail"):
        table.add_column(column)
    for host, results in by_host.items():
        if compact and all(result.ok and not result.warning for result in results):
            table.add_row(Text(_plain(host)), Text(f"all {len(results)}"), Text("ok", "green"),
                          Text(_plain(" · ".join(result.detail for result in results))))
            continue
        for result in results:
            shown = result.hint and (result.warning or not result.ok)
            detail = result.detail + (f"\nhint: {result.hint}" if shown else "")
            mark = Text("FAIL", "bold red") if not result.ok else \
                Text("warn", "yellow") if result.warning else Text("ok", "green")
            table.add_row(Text(_plain(result.host)), Text(_plain(result.check)), mark, Text(_plain(detail)))
    console.print(table)
    hosts = len({result.host for result in report.results})
    verdict = "[green]all checks passed[/]" if report.ok else f"[red]{len(report.failures)} check(s) failed[/]"
    console.print(f"{verdict} on {hosts} host(s) in {report.seconds:.2f} s")


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def render_status(console: Console, name: str, mode: str, phase: str, rows: Sequence[Any],
                  job: JobProgress | None = None, message: str | None = None) -> None:
    table = Table(title=Text(f"cluster {name!r} ({mode}): {phase}"), box=box.SIMPLE_HEAVY)
    for column in ("task", "host", "address:port", "pid", "state", "uptime", "restarts", "devices / detail"):
        table.add_column(column)
    for row in rows:
        style = STATE_STYLES.get(row.state, "")
        devices = ", ".join(device.rsplit("/", 1)[-1] for device in row.devices)
        table.add_row(*_texts(row.task, row.host, f"{row.address}:{row.port}", row.pid or "",
                              Text(row.state, style), _uptime(row.uptime), row.restarts or "",
                              devices or row.detail or ""))
    console.print(table)
    if message:
        console.print(Text(_plain(message), "yellow"))
    if job:
        console.print(Text(_plain(render_job_line(job))))
    if job and job.live and job.message:        # what the supervisor says now (a host lost, a ps moved)
        console.print(Text(_plain(job.message), "yellow"))


def render_job_line(job: JobProgress) -> str:
    parts = [f"{'job' if job.entry == 'train' else 'run'} {job.job} [{job.state}]"]
    if job.step is not None:
        total = f"/{job.steps_total}" if job.steps_total else ""
        parts.append(f"step {job.step}{total}")
    if job.epoch is not None:
        parts.append(f"epoch {liveview.fmt_epoch(job.epoch)}")
    if job.loss is not None:
        parts.append(f"loss {job.loss:.4f}")
    if job.examples_per_second:
        parts.append(f"{job.examples_per_second:.0f} examples/s")
    if job.val_accuracy is not None:
        parts.append(f"val_accuracy {job.val_accuracy:.4f}")
    if job.live and job.steps_since_checkpoint is not None:
        saved = (f"checkpoint at step {job.checkpoint_step}" if job.checkpoint_step is not None
                 else "no checkpoint yet")
        parts.append(f"{saved}, {job.steps_since_checkpoint} step(s) since")
    if job.stalled_for is not None:
        parts.append(f"stalled for {job.stalled_for:.0f} s" + (f" (waiting on {job.waiting_on})" if job.waiting_on else ""))
    if job.exit_code is not None:
        parts.append(f"exit code {job.exit_code}")
    if job.restarts:
        parts.append("restarts " + ", ".join(f"{task} x{count}" for task, count in sorted(job.restarts.items())))
    return "  ".join(parts)


def render_summary(console: Console, summary: dict) -> None:
    """The end-of-training report people expect when they run this by hand."""
    def number(key: str, fmt: str) -> str:
        value = summary.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "n/a"

    table = Table(title=Text(_plain(f"{summary.get('job')} ({summary.get('mode')}, {summary.get('workers')} worker(s))")),
                  box=box.SIMPLE_HEAVY, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("validation loss", number("val_loss", ".4f"))
    table.add_row("validation accuracy", number("val_accuracy", ".4f"))
    table.add_row("running time", f"{number('wall_seconds', '.1f')} s (training {number('train_seconds', '.1f')} s)")
    table.add_row("throughput", f"{number('examples_per_second', ',.0f')} examples/s")
    table.add_row("global step", str(summary.get("global_step")))
    if summary.get("restored_step"):
        table.add_row("resumed from step", str(summary["restored_step"]))
    if summary.get("restarts"):
        table.add_row("restarts", Text(_plain(", ".join(f"{task} x{count}" for task, count in summary["restarts"].items()))))
        table.add_row("steps redone", str(summary.get("steps_redone", 0)))
    table.add_row("checkpoint", Text(_plain(summary.get("checkpoint"))))
    console.print(table)


def _bench_outcome(result: Any) -> str:
    if result.status == "ok":
        parts = [f"[green]ok[/] {_num(result.examples_per_second, ',.0f')} examples/s",
                 f"{_num(result.steps_per_second, '.1f')} steps/s",
                 f"up {_num(result.bringup_seconds, '.1f')} s", f"train {_num(result.train_seconds, '.1f')} s",
                 f"val_accuracy {_num(result.val_accuracy, '.4f')}"]
        text = ", ".join(parts)
    elif result.status == "impossible":
        text = f"[dim]impossible: {escape(result.error or '')}[/]"
    else:
        text = f"[red]{result.status}[/]: {escape(_first_line(result.error))}"
    if result.down_error:
        text += f"\n  [red]down failed:[/] {escape(_first_line(result.down_error))}"
    return text


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "n/a"


def _spread(spread: Any, fmt: str) -> str:
    """``median`` or ``median (min–max)`` when repeats differ."""
    if spread is None:
        return "—"
    text = format(spread.median, fmt)
    if spread.count > 1 and spread.low != spread.high:
        text += f" ({format(spread.low, fmt)}–{format(spread.high, fmt)})"
    return text


def _hosts(uses: Sequence[Any]) -> str:
    return escape(" ".join(use.host + (f"×{use.workers}" if use.workers > 1 else "") for use in uses))


def render_bench(console: Console, summaries: Sequence[Any], results: Sequence[Any], *, title: str) -> None:
    """The study: medians over repeats with their min–max, then one line per configuration
    that failed or could not be built."""
    table = Table(title=escape(title), box=box.SIMPLE_HEAVY)
    columns: tuple[tuple[str, JustifyMethod], ...] = (("mode", "left"), ("placement", "left"), ("workers", "right"), ("hosts", "left"),
                            ("ok/runs", "right"), ("bring-up s", "right"), ("train s", "right"),
                            ("steps/s", "right"), ("examples/s", "right"), ("efficiency", "right"),
                            ("val_accuracy", "right"), ("to target s", "right"))
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for row in summaries:
        if row.impossible and row.ok == 0:
            continue
        table.add_row(row.mode, row.placement, str(row.workers), _hosts(row.hosts),
                      Text(f"{row.ok}/{row.runs}", "" if row.ok == row.runs else "red"),
                      _spread(row.bringup_seconds, ".1f"), _spread(row.train_seconds, ".1f"),
                      _spread(row.steps_per_second, ".1f"), _spread(row.examples_per_second, ",.0f"),
                      _spread(row.efficiency, ".2f"), _spread(row.val_accuracy, ".4f"),
                      _spread(row.time_to_target_seconds, ".1f"))
    console.print(table)
    for row in summaries:
        if row.impossible:
            console.print(f"[dim]– {row.mode}, {row.workers} worker(s), {row.placement}: impossible: "
                          f"{escape(row.impossible)}[/]", highlight=False)
    for result in results:
        if result.status in ("failed", "interrupted"):
            console.print(f"[red]✗[/] {result.mode}, {result.workers} worker(s), {result.placement}, repeat "
                          f"{result.repeat}: {result.status}: {escape(_first_line(result.error))}",
                          highlight=False)
        if result.down_error:
            console.print(f"[red]✗[/] {escape(result.name)}: down failed: {escape(_first_line(result.down_error))}",
                          highlight=False)


def render_run_report(console: Console, report: dict) -> None:
    """The end of ``run``: what became of each task."""
    table = Table(box=box.SIMPLE, title=Text(_plain(f"run {program_name(report['command'])} on {report['cluster']!r}")))
    for column in ("task", "host", "state", "exit", "restarts", "seconds"):
        table.add_column(column)
    for task in report["tasks"]:
        if task["signal"] is not None:
            how = f"signal {task['signal']}"
        elif task["exit_code"] is not None:
            how = str(task["exit_code"])
        else:
            how = ""
        ok = task["state"] == "stopped" or (task["exit_code"] == 0 and task["signal"] is None)
        table.add_row(Text(f"{task['role']}:{task['index']}"), Text(_plain(task["host"])),
                      Text(task["state"], "green" if ok else "red"), Text(how),
                      Text(str(task["restarts"] or "")),
                      Text(f"{task['seconds']:.1f}" if task.get("seconds") is not None else ""))
    console.print(table)
    verdict = "done (what it waited for exited 0)" if report["exit_code"] == 0 else "failed"
    console.print(Text(f"run {verdict} in {report['wall_seconds']:.1f} s",
                       "green" if report["exit_code"] == 0 else "red"))


def render_runs(console: Console, records: Sequence[Any]) -> None:
    """``pscluster runs``: one row per recorded run (cluster.history.RunRecord), oldest first."""
    import shlex
    import time as _time
    table = Table(box=box.SIMPLE)
    for column in ("name", "run", "entry", "started", "seconds", "outcome", "command"):
        table.add_column(column)
    for record in records:
        started = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(record.started))
        took = f"{record.ended - record.started:.1f}" if record.ended is not None else ""
        outcome = record.state + (f" (exit {record.exit_code})" if record.exit_code is not None else "")
        style = "green" if record.exit_code == 0 else ("yellow" if record.ended is None else "red")
        table.add_row(*_texts(record.name, str(record.id), record.entry + (" one-shot" if record.one_shot else ""),
                              started, took, Text(_plain(outcome), style), shlex.join(record.command)))
    console.print(table)


def render_supervisor(console: Console, health: Any, *, cluster: str) -> None:
    """``status``: the supervisor of the cluster's last job (a cluster.liveness.SupervisorHealth)."""
    how = "detached supervisor" if health.detached else "supervisor (a train/run in a terminal)"
    where = f"{how} pid {health.pid} on {health.host}"
    beat = f", last heartbeat {health.heartbeat_age:.1f} s ago" if health.heartbeat_age is not None else ""
    if health.state == "alive":
        console.print(Text(_plain(f"{where}: alive{beat}"), "green"))
    elif health.state == "dead":
        console.print(Text(_plain(f"{where}: GONE{beat}, while job {health.job_id} is recorded as running: its "
                                  "processes may run on unsupervised (nothing restarts them). 'pscluster stop-job "
                                  f"--name {cluster}' stops them; 'pscluster down --name {cluster}' stops everything"),
                           "bold red"))
    elif health.state == "elsewhere":
        console.print(Text(_plain(f"{where}: on another machine, not checked from here{beat}"), "yellow"))
    if health.log and health.state != "ended":
        console.print(Text(_plain(f"supervisor log: {health.log}"), "dim"))
