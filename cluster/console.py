"""Everything the user sees: the only module of pscluster that imports rich.

:class:`RichReporter` turns launcher events into live progress; the ``render_*`` functions
draw plans, preflight reports, status tables and errors.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Sequence

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.status import Status
from rich.markup import escape as _markup_escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from . import liveview
from .errors import PsclusterError
from .events import Reporter
from .urls import mask_url
from .plan import ClusterPlan, HostSpec
from .hosts.preflight import CheckReport
from .jobrecord import JobProgress
from .program.runspec import program_name

STATE_STYLES = {"ready": "green", "running": "green", "starting": "yellow", "exited": "red", "lost": "red",
                "not started": "dim", "stopped": "dim", "failed": "red", "up": "green", "done": "green"}


class OutputStream:
    """``sys.stdout`` or ``sys.stderr`` (looked up at each write, as rich does) for a console,
    where an output error never reaches the caller.

    A closed terminal (SIGHUP, then EIO on every write) or a reader that went away (EPIPE)
    must not stop a clean-up halfway: the rollback prints before it stops anything. On the
    first such error the stream's file descriptor is pointed at ``/dev/null``, so later
    writes, from rich, click, a traceback or the interpreter's flush at exit, succeed too.
    """

    def __init__(self, name: str):
        self.name = name

    @property
    def stream(self):
        return getattr(sys, self.name)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self._gone()

    def _gone(self) -> None:
        try:
            fd = self.stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
        except (OSError, ValueError, AttributeError):    # no descriptor (a test's StringIO): nothing to redirect
            return
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        try:
            self.stream.flush()      # what the failed write left in the buffer goes to /dev/null
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:      # isatty, fileno, encoding...: the stream's own
        return getattr(self.stream, name)


def make_consoles(*, no_color: bool = False) -> tuple[Console, Console]:
    """(stdout console, stderr console). Output to a pipe or file is 200 columns wide rather
    than rich's 80 (the bench table needs ~180), so tables stay readable in CI logs and
    benchmark files; $COLUMNS still wins. Output errors are swallowed (:class:`OutputStream`)."""
    consoles = []
    for name in ("stdout", "stderr"):
        # emoji=False: ":fire:" in a path or host output stays text
        file: Any = OutputStream(name)
        console = Console(file=file, no_color=no_color, highlight=False, emoji=False)
        if not console.is_terminal and not os.environ.get("COLUMNS"):
            console = Console(file=file, no_color=no_color, highlight=False, emoji=False, width=200)
        consoles.append(console)
    return consoles[0], consoles[1]


# C0 controls but newline and tab, DEL and C1 controls: a remote string with ESC could recolour,
# move the cursor or retitle the operator's terminal; they are shown as \x1b instead.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _plain(value: Any) -> str:
    """``value`` as text with its control characters made visible."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value))


def visible(value: Any) -> str:
    """Text (remote output) for a plain stream, with its control characters but newline and tab
    made visible, so a log cannot recolour, move the cursor of or retitle the terminal."""
    return _plain(value)


def escape(value: Any) -> str:
    """Data (a name, path or remote text) for a string read as rich markup: shown as it is."""
    return _markup_escape(_plain(value))


def render_warnings(console: Console, warnings: Sequence[str]) -> None:
    """Inventory warnings (ansible_* keys pscluster ignores), in yellow."""
    for warning in warnings:
        console.print(Text("warning: " + _plain(warning), style="yellow"))


def _mask(value: str | None) -> str:
    return "(none)" if value is None else (f'"{value}"' if value == "" else value)


def _texts(*values: Any) -> list[Text]:
    """Table cells from data (names, paths, remote output): never read as markup."""
    return [value if isinstance(value, Text) else Text(_plain(value)) for value in values]


PLAIN_JSON_ABOVE = 64 * 1024     # characters: rich's JSON highlighting took 24 s for a 7 MB plan


def print_json(console: Console, document: Any) -> None:
    """``document`` as indented JSON; a big one as plain text (rich's highlighting is quadratic-ish
    in practice: a 10,000-task plan took 24 s and 1 GB through it)."""
    text = json.dumps(document, indent=2)
    if len(text) <= PLAIN_JSON_ABOVE:
        console.print_json(text)
        return
    console.file.write(text + "\n")
    console.file.flush()


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
    if job.exit_code is not None:
        parts.append(f"exit code {job.exit_code}")
    if job.restarts:
        parts.append("restarts " + ", ".join(f"{task} x{count}" for task, count in sorted(job.restarts.items())))
    return "  ".join(parts)


def render_error(console: Console, error: PsclusterError) -> None:
    text = str(error)
    first, _, rest = text.partition("\n")
    console.print(Text("error: ", "bold red") + Text(_plain(first)))
    if rest:
        console.print(Text(_plain(rest)))


class RichReporter(Reporter):
    """Live progress for ``up``, ``down``, ``check`` and ``train``."""

    def __init__(self, console: Console, *, verbose: bool = False):
        self.console = console
        self.verbose = verbose
        self._progress: Progress | None = None
        self._rows: dict[str, TaskID] = {}
        self._checks: list[dict] = []

    # -- task progress rows
    def _ensure_progress(self) -> Progress:
        if self._progress is None:
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      TimeElapsedColumn(), console=self.console, transient=False)
            self._progress.start()
        return self._progress

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
            self._rows.clear()

    def _say(self, text: str) -> None:
        (self._progress.console if self._progress else self.console).print(text)

    def handle(self, kind: str, **data: Any) -> None:
        handler = getattr(self, "_on_" + kind.replace("-", "_"), None)
        if handler is not None:
            handler(**data)

    def _on_phase(self, name: str, detail: str = "") -> None:
        if name not in ("ready",):
            self._stop_progress()
        if self._checks and name != "preflight":
            self._flush_checks()
        self._say(f"[bold cyan]▸ {escape(name)}[/] {escape(detail)}")

    def _flush_checks(self) -> None:
        failed = [check for check in self._checks if not check["ok"]]
        hosts = len({check["host"] for check in self._checks})
        for check in self._checks:
            if check["ok"] and check.get("warning"):
                hint = f"\n      hint: {check['hint']}" if check.get("hint") else ""
                self._say(f"  [yellow]![/] {escape(check['host'])}: {escape(check['check'])}: "
                          f"{escape(check['detail'])}{escape(hint)}")
        if failed:
            for check in failed:
                hint = f"\n      hint: {check['hint']}" if check.get("hint") else ""
                self._say(f"  [red]✗[/] {escape(check['host'])}: {escape(check['check'])}: "
                          f"{escape(check['detail'])}{escape(hint)}")
        else:
            self._say(f"  [green]✓[/] {len(self._checks)} checks passed on {hosts} host(s)")
        self._checks = []

    def _on_check(self, **check: Any) -> None:
        self._checks.append(check)

    def _on_sync(self, host: str, files: int, bytes: int, unchanged: int, skipped: bool,
                 shared_with: str | None = None) -> None:
        if shared_with:
            self._say(f"  {escape(host)}: shares {escape(shared_with)}'s copy (same filesystem)")
        elif skipped:
            self._say(f"  {escape(host)}: uses this machine's checkout (nothing to copy)")
        else:
            self._say(f"  {escape(host)}: {files} file(s) sent ({bytes / 1e6:.1f} MB), {unchanged} unchanged")

    def _row(self, task: str, host: str) -> TaskID:
        progress = self._ensure_progress()
        key = f"{task}@{host}"
        if key not in self._rows:
            self._rows[key] = progress.add_task(f"{escape(key):<24} starting", total=1)
        return self._rows[key]

    def _on_task_starting(self, task: str, host: str) -> None:
        self._row(task, host)

    def _on_task_started(self, task: str, host: str, pid: int) -> None:
        self._ensure_progress().update(self._row(task, host),
                                       description=f"{escape(task + '@' + host):<24} pid {pid}, waiting")

    def _on_task_ready(self, task: str, host: str, devices: Sequence[str], seconds: float) -> None:
        shown = ", ".join(device.rsplit("/", 1)[-1] for device in devices)
        self._ensure_progress().update(self._row(task, host), completed=1,
                                       description=f"{escape(task + '@' + host):<24} [green]ready[/] ({escape(shown)})")

    def _on_task_failed(self, task: str, host: str, error: str) -> None:
        self._say(f"  [red]✗ {escape(task)}@{escape(host)}[/]: {escape(error)}")

    def _on_task_stopped(self, task: str, host: str, signals: Sequence[str], found: bool) -> None:
        how = "was already gone" if not found else escape(f"stopped ({' then '.join(signals)})")
        self._say(f"  {escape(task)}@{escape(host)} {how}")

    def _on_host_failed(self, host: str, error: str) -> None:
        self._say(f"  [red]✗ {escape(host)}[/]: {escape(error.splitlines()[0])}")

    def _on_message(self, text: str, level: str = "info") -> None:
        style = {"warning": "yellow", "error": "red"}.get(level, "")
        self._say(f"[{style}]{escape(text)}[/]" if style else escape(text))

    def close(self) -> None:
        self._stop_progress()
        if self._checks:
            self._flush_checks()


class TrainDisplay(Reporter):
    """The live view of ``train`` (and of ``attach``): driven by events only.

    On a terminal, a bar with step, epoch, loss, rate, elapsed time and ETA above a table of
    the workers, redrawn four times a second; not on a terminal, plain lines: one progress line
    at most every :data:`cluster.liveview.PLAIN_SECONDS` and a last one at the end. Both print
    one line per evaluation, and phases, messages, failures and restarts as they come. The
    numbers come from :class:`cluster.liveview.TrainView` (formats, rate windows, ETA)."""

    def __init__(self, console: Console, *, plain: bool | None = None, clock=time.monotonic, wall=time.time):
        self.console = console
        self.plain = not console.is_terminal if plain is None else plain
        self.clock = clock
        self.wall = wall
        self.view = liveview.TrainView()
        self._live: Live | None = None
        self._throttle = liveview.Throttle()
        self._printed: str | None = None      # the last plain progress line

    def handle(self, kind: str, **data: Any) -> None:
        self.view.update(kind, data, now=self.clock(), wall=self.wall())
        if kind == "job":
            if self.plain:
                if self.view.job.get("step") is not None and self._throttle.ready(self.clock()):
                    self._progress_line()
            elif self.view.progressed:
                self._start_live()
        elif kind == "eval":
            self._print(escape(liveview.eval_line(data)))
        elif kind == "message":
            self._print(escape(data["text"]), data.get("level", "info"))
        elif kind == "phase":
            self._print(f"[bold cyan]▸ {escape(data['name'])}[/] {escape(data.get('detail', ''))}")
        elif kind in ("task-failed", "task-restarting", "task-restarted", "task-lost"):
            detail = data.get("error", data.get("detail", ""))
            self._print(f"{kind} {escape(str(data.get('task')))}@{escape(str(data.get('host')))}: {escape(str(detail))}",
                        "warning")

    def _progress_line(self) -> None:
        frame = self.view.frame(wall=self.wall())
        workers = liveview.workers_line(frame)
        line = liveview.progress_line(frame) + (f"  |  {workers}" if workers else "")
        if line != self._printed:
            self._printed = line
            self.console.print(Text(_plain(line)), soft_wrap=True, highlight=False)

    def _print(self, text: str, level: str = "info") -> None:
        style = {"warning": "yellow", "error": "red"}.get(level)
        (self._live.console if self._live else self.console).print(f"[{style}]{text}[/]" if style else text,
                                                                    soft_wrap=self.plain, highlight=False)

    def _start_live(self) -> None:
        if self._live is None:
            self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4,
                              transient=False)
            self._live.start()

    def _render(self) -> RenderableType:
        frame = self.view.frame(wall=self.wall())
        bar = ProgressBar(total=100.0 if frame.fraction is not None else None,
                          completed=100.0 * (frame.fraction or 0.0), width=30)
        head = Table.grid(padding=(0, 1))
        head.add_row(bar, Text(_plain(liveview.progress_line(frame))))
        table = Table(box=box.SIMPLE, title=Text(_plain(f"training {frame.title}")), title_justify="left")
        cells = {"epoch": lambda w: liveview.fmt_epoch(w.epoch), "step": lambda w: "" if w.step is None else str(w.step),
                 "loss": lambda w: liveview.fmt_loss(w.loss), "examples/s": lambda w: liveview.fmt_rate(w.rate)}
        # only what some worker reports (async workers report a rate only)
        shown = [name for name, cell in cells.items() if any(cell(worker) for worker in frame.workers)]
        table.add_column("")
        for name in shown:
            table.add_column(name, justify="right")
        for worker in frame.workers:
            table.add_row(Text(_plain(worker.name)), *(cells[name](worker) for name in shown))
        return Group(table, head)

    def close(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        elif self.plain and self.view.progressed:
            self._progress_line()         # where it ended (or what the workers said, if no step came)


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


class EventLineReporter(Reporter):
    """Plain lines on stderr for what matters during ``train --json``: phases, failures,
    restarts, lost hosts and messages (stdout stays one JSON document)."""

    def __init__(self, console: Console):
        self.console = console

    def handle(self, kind: str, **data: Any) -> None:
        if kind == "phase":
            text = f"▸ {data['name']} {data.get('detail', '')}"
        elif kind == "message":
            text = data["text"]
        elif kind in ("task-failed", "task-restarting", "task-restarted", "task-lost", "host-failed"):
            detail = data.get("error") or data.get("detail") or ""
            where = f"{data.get('task')}@{data.get('host')}" if data.get("task") else data.get("host")
            text = f"{kind}: {where}: {detail}"
        elif kind == "eval":
            text = liveview.eval_line(data)
        else:
            return
        self.console.print(_plain(text), markup=False, highlight=False, soft_wrap=True)


# ----------------------------------------------------------------------------- pscluster bench

class BenchProgress(Reporter):
    """``bench``: a line per configuration and its outcome; a transient status line shows
    where the current one is (phase, training step)."""

    def __init__(self, console: Console):
        self.console = console
        self._status: Status | None = None
        self._label = ""

    def handle(self, kind: str, **data: Any) -> None:
        if kind == "bench-config":
            self._label = (f"[{data['index']}/{data['total']}] {data['mode']}, {data['workers']} worker(s), "
                           f"{data['placement']}, repeat {data['repeat']}")
            self._show("planning")
        elif kind == "bench-result":
            self._stop()
            self.console.print(f"{escape(self._label)}: {_bench_outcome(data['result'])}", highlight=False)
        elif kind == "phase":
            self._show(f"{data['name']} {data.get('detail', '')}".strip())
        elif kind == "job" and data.get("step") is not None:
            total = f"/{data['steps_total']}" if data.get("steps_total") else ""
            eps = f", {data['examples_per_second']:,.0f} examples/s" if data.get("examples_per_second") else ""
            self._show(f"train: step {data['step']}{total}{eps}")
        elif kind == "message" and data.get("level") in ("warning", "error"):
            self._print(f"[yellow]  {escape(data['text'])}[/]")
        elif kind in ("task-failed", "host-failed"):
            where = f"{data['task']}@{data['host']}" if data.get("task") else data.get("host")
            self._print(f"[yellow]  {kind} {escape(str(where))}: {escape(_first_line(data.get('error')))}[/]")

    def _show(self, detail: str) -> None:
        text = f"{escape(self._label)}: {escape(detail)}"
        if self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def _stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop()


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


def _first_line(text: Any) -> str:
    return str(text or "").strip().split("\n", 1)[0]


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


# ----------------------------------------------------------------------------- pscluster run

TASK_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "bright_magenta", "bright_cyan", "bright_green",
               "bright_blue", "bright_yellow")


class ProgramOutput(Reporter):
    """``run``: every task's output line by line, prefixed ``[worker:1@node-b]`` (a colour per
    task on a terminal, plain when piped), and a line for each event that matters (exits,
    failures, restarts, lost hosts). Program output is data: it is never read as markup."""

    def __init__(self, out: Console, err: Console, *, bar: bool | None = None, wall=time.time):
        self.out = out          # the program's lines
        self.err = err          # pscluster's own lines
        self._styles: dict[str, str] = {}
        # A bar under the output (both streams on a terminal): chief and worker tasks that
        # exited 0, of those started, and the time since the run started. While it shows, the
        # program's lines go through its console (the same terminal) so it stays at the bottom.
        self.bar = out.is_terminal and err.is_terminal if bar is None else bar
        self.wall = wall
        self._live: Live | None = None
        self._began: float | None = None
        self._tasks: set[str] = set()
        self._finished: set[str] = set()

    def _style(self, task: str) -> str:
        if task not in self._styles:
            self._styles[task] = TASK_STYLES[len(self._styles) % len(TASK_STYLES)]
        return self._styles[task]

    def _line(self, text: Text, console: Console | None = None) -> None:
        (self._live.console if self._live else console or self.err).print(text, soft_wrap=True, highlight=False)

    def _render_bar(self) -> RenderableType:
        done, total = len(self._finished & self._tasks), len(self._tasks)
        elapsed = None if self._began is None else self.wall() - self._began
        grid = Table.grid(padding=(0, 1))
        grid.add_row(ProgressBar(total=float(total or 1), completed=float(done), width=30),
                     Text(f"{done}/{total} chief/worker task(s) finished  elapsed {liveview.fmt_duration(elapsed)}"))
        return grid

    def _follow(self, kind: str, data: dict) -> None:
        """The bar's bookkeeping: tasks started and finished, the run's start and end."""
        role = str(data.get("task", "")).split(":")[0]
        if kind == "task-started" and role in ("chief", "worker"):
            self._tasks.add(data["task"])
        elif kind == "task-exited" and data.get("exit_code") == 0 and data.get("signal") is None:
            self._finished.add(data["task"])
        elif kind == "job-state" and data["event"] == "started":
            self._began = data["time"]
            if self.bar and self._live is None:
                self._live = Live(get_renderable=self._render_bar, console=self.err, refresh_per_second=4,
                                  transient=True, redirect_stdout=False, redirect_stderr=False)
                self._live.start()
        elif kind == "job-state" and data["event"] in ("finished", "failed", "stopped"):
            self.close()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def handle(self, kind: str, **data: Any) -> None:
        self._follow(kind, data)
        if kind == "output":
            prefix = Text(_plain(f"[{data['task']}@{data['host']}] "), style=self._style(data["task"]))
            self._line(prefix + Text.from_ansi(data["line"]), self.out)
        elif kind == "phase":
            self._line(Text(f"▸ {data['name']} ", "bold cyan") + Text(_plain(data.get("detail", ""))))
        elif kind == "message":
            self._line(Text(_plain(data["text"]), {"warning": "yellow", "error": "red"}.get(str(data.get("level")), "")))
        elif kind == "task-exited":
            ok = data.get("exit_code") == 0 and data.get("signal") is None
            self._line(Text(_plain(f"[{data['task']}@{data['host']}] "), style=self._style(data["task"])) +
                       Text(_plain(data.get("detail")), "green" if ok else "red"))
        elif kind in ("task-failed", "task-restarting", "task-restarted", "task-lost", "host-failed"):
            detail = data.get("error") or data.get("detail") or ""
            where = f"{data.get('task')}@{data.get('host')}" if data.get("task") else str(data.get("host"))
            self._line(Text(_plain(f"{kind}: {where}: {detail}"), "yellow"))
        elif kind == "sync" and not data.get("skipped"):
            self._line(Text(_plain(f"  {data['host']}: {data['files']} file(s) sent, {data['unchanged']} unchanged")))


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


# ----------------------------------------------------------------------------- detached jobs

def render_supervisor(console: Console, health: Any, *, cluster: str) -> None:
    """``status``: the supervisor of the cluster's last job (a cluster.supervision.daemon.SupervisorHealth)."""
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
