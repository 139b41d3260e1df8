"""Live views, each a Reporter driven by events only: up's progress (RichReporter), train's
(TrainDisplay, or plain lines: EventLineReporter), bench's, and run's program output
(ProgramOutput).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Sequence

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.status import Status
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from . import liveview
from ..events import Reporter
from .base import _first_line, _plain, escape
from .tables import _bench_outcome


ROWS_SHOWN = 32      # tasks shown a row each; beyond, one row counts them


class RichReporter(Reporter):
    """Live progress for ``up``, ``down``, ``check`` and ``train``."""

    def __init__(self, console: Console, *, verbose: bool = False):
        self.console = console
        self.verbose = verbose
        self._progress: Progress | None = None
        self._rows: dict[str, TaskID] = {}
        self._checks: list[dict] = []
        self._states: dict[str, str] = {}       # task@host -> starting | waiting | ready, this display's
        self._counts: Counter[str] = Counter()   # tasks in each state
        self._summary: TaskID | None = None      # the one row that counts them, past ROWS_SHOWN

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
            self._states.clear()
            self._counts.clear()
            self._summary = None

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
                 shared_with: str | None = None, relayed_from: str | None = None,
                 relay_error: str | None = None) -> None:
        if shared_with:
            self._say(f"  {escape(host)}: shares {escape(shared_with)}'s copy (same filesystem)")
        elif skipped:
            self._say(f"  {escape(host)}: uses this machine's checkout (nothing to copy)")
        else:
            via = f" from {escape(relayed_from)}" if relayed_from else ""
            self._say(f"  {escape(host)}: {files} file(s) sent{via} ({bytes / 1e6:.1f} MB), {unchanged} unchanged")
        if relay_error:
            self._say(f"  [yellow]{escape(host)}: the relay failed, sent directly: {escape(relay_error)}[/]")

    def _row(self, task: str, host: str, state: str, description: str, *, done: bool = False) -> None:
        """Show ``task@host`` in ``state``: its own row, or past ROWS_SHOWN tasks one row of
        counts (rich renders every row at each change: N rows cost N² in `up`, issue 46)."""
        progress = self._ensure_progress()
        key = f"{task}@{host}"
        before = self._states.get(key)
        if before is not None:
            self._counts[before] -= 1
        self._states[key] = state
        self._counts[state] += 1
        if self._summary is None and len(self._states) > ROWS_SHOWN:
            for row in self._rows.values():
                progress.remove_task(row)
            self._rows.clear()
            self._summary = progress.add_task("", total=None)
        if self._summary is not None:
            counts = self._counts
            progress.update(self._summary, total=len(self._states), completed=counts["ready"],
                            description=f"{len(self._states)} task(s): {counts['ready']} ready, "
                                        f"{counts['waiting']} started and waiting, {counts['starting']} starting")
            return
        if key not in self._rows:
            self._rows[key] = progress.add_task(f"{escape(key):<24} starting", total=1)
        progress.update(self._rows[key], description=f"{escape(key):<24} {description}", completed=1 if done else None)

    def _on_task_starting(self, task: str, host: str) -> None:
        self._row(task, host, "starting", "starting")

    def _on_task_started(self, task: str, host: str, pid: int) -> None:
        self._row(task, host, "waiting", f"pid {pid}, waiting")

    def _on_task_ready(self, task: str, host: str, devices: Sequence[str], seconds: float) -> None:
        shown = ", ".join(device.rsplit("/", 1)[-1] for device in devices)
        self._row(task, host, "ready", f"[green]ready[/] ({escape(shown)})", done=True)

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
    at most every :data:`cluster.console.liveview.PLAIN_SECONDS` and a last one at the end. Both print
    one line per evaluation, and phases, messages, failures and restarts as they come. The
    numbers come from :class:`cluster.console.liveview.TrainView` (formats, rate windows, ETA)."""

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
            line, prefix_text = str(data["line"]), _plain(f"[{data['task']}@{data['host']}] ")
            if self._live is None and not self.out.is_terminal and line.isprintable():
                # Piped, and nothing to decode (no escape, no tab): the line as rich would print
                # it, without its rendering (a line a second from each of 64 hosts' programs
                # was the most of the supervisor's main thread, issue 46).
                self.out.file.write(f"{prefix_text}{line}\n")
                self.out.file.flush()
                return
            self._line(Text(prefix_text, style=self._style(data["task"])) + Text.from_ansi(line), self.out)
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
            via = f" from {data['relayed_from']}" if data.get("relayed_from") else ""
            self._line(Text(_plain(f"  {data['host']}: {data['files']} file(s) sent{via}, {data['unchanged']} unchanged")))
            if data.get("relay_error"):
                self._line(Text(_plain(f"  {data['host']}: the relay failed, sent directly: {data['relay_error']}"),
                                "yellow"))
