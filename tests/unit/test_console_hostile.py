"""Data is never markup (issue 16 item 14): hostile names, paths, remote output and errors
through every console function.

Inventory validation will refuse ``[`` in host names, but paths, remote error texts, log and
program lines are not validated, and the console must not depend on it: these tests build the
data objects directly. Each hostile string must appear exactly (control characters shown as
``\\x1b``) and nothing may crash (``h[/x]`` used to raise MarkupError in ``plan`` and ``status``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
from rich.console import Console
from rich.text import Text

from cluster import console as ui
from cluster.errors import UsageError
from cluster.events import Check
from cluster.inventory import load_inventory
from cluster.lifecycle.status import TaskRow
from cluster.plan import PlanOptions, plan_cluster
from cluster.hosts.preflight import CheckReport
from cluster.jobrecord import JobProgress

from .conftest import INVENTORIES

HOSTILE = ["h[/x]", "[link=http://e]x[/link]", "[bold]", "x[/]", "[/bold red]", "end\\", "a\x1b[31mred",
           "bell\x07", "\x1b]0;title\x07"]


def shown(text: str) -> str:
    """How a hostile string must appear: as it is, control characters made visible."""
    return "".join(f"\\x{ord(c):02x}" if ord(c) < 32 and c not in "\n\t" else c for c in text)


def console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=2000, color_system=None, highlight=False, emoji=False), buffer


def assert_shown(output: str, text: str) -> None:
    assert shown(text) in output, (text, output)
    assert "\x1b" not in output and "\x07" not in output


@pytest.mark.parametrize("bad", HOSTILE)
def test_plan(bad):
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="/py", local_workdir="/wd"))
    tasks = tuple(dataclasses.replace(task, host=bad, role=bad, workdir=f"/w/{bad}", log_path=f"/l/{bad}",
                                      argv=(bad,), env=task.env + (("X", bad),)) for task in plan.tasks)
    hosts = tuple(dataclasses.replace(host, name=bad) for host in plan.hosts)
    plan = dataclasses.replace(plan, tasks=tasks, hosts=hosts, unused=(("evaluator", bad),))
    out, buffer = console()
    ui.render_plan(out, plan)
    text = buffer.getvalue()
    for piece in (f"{bad}:0", f"/w/{bad}", f"/l/{bad}", f"argv: {bad}", f"X={bad}", f"not used: {bad}"):
        assert_shown(text, piece)


@pytest.mark.parametrize("bad", HOSTILE)
def test_status(bad):
    rows = [TaskRow(role="ps", index=0, host=bad, address=bad, port=2222, kind="server", pid=1, state="lost",
                    detail=bad)]
    job = JobProgress(id=1, job=bad, mode="async")
    out, buffer = console()
    ui.render_status(out, "c", "async", "up", rows, job=job, message=bad)
    text = buffer.getvalue()
    for piece in (f"{bad}:2222", f"job {bad} [starting]", bad):
        assert_shown(text, piece)
    assert text.count(shown(bad)) >= 5      # host, address, detail, message, job


@pytest.mark.parametrize("bad", HOSTILE)
def test_checks_and_errors(bad):
    report = CheckReport(results=(Check(host=bad, check=bad, ok=False, detail=f"d {bad}", hint=f"h {bad}"),),
                         facts=(), seconds=0.1)
    out, buffer = console()
    ui.render_checks(out, report)
    ui.render_error(out, UsageError(f"e {bad}", hint=f"hint {bad}"))
    text = buffer.getvalue()
    for piece in (f"d {bad}", f"hint: h {bad}", f"error: e {bad}", f"hint: hint {bad}"):
        assert_shown(text, piece)


@pytest.mark.parametrize("bad", HOSTILE)
def test_progress_reporters(bad):
    out, buffer = console()
    reporter = ui.RichReporter(out)
    reporter.handle("phase", name=bad, detail=f"p {bad}")
    reporter.handle("check", host=bad, check="c", ok=False, detail=f"c {bad}", hint=None)
    reporter.handle("task-starting", task="ps:0", host=bad)
    reporter.handle("task-ready", task="ps:0", host=bad, devices=(f"/dev/{bad}",), seconds=1.0)
    reporter.handle("phase", name="ready", detail="")
    reporter.handle("task-failed", task="ps:1", host=bad, error=f"f {bad}")
    reporter.handle("host-failed", host=bad, error=f"hf {bad}\nmore")
    reporter.handle("message", text=f"m {bad}", level="warning")
    reporter.close()
    text = buffer.getvalue()
    for piece in (f"p {bad}", f"c {bad}", f"ps:0@{bad}", f"f {bad}", f"hf {bad}", f"m {bad}"):
        assert_shown(text, piece)


@pytest.mark.parametrize("bad", HOSTILE)
def test_training_display_and_summary(bad):
    out, buffer = console()
    display = ui.TrainDisplay(out)
    display.handle("job", job=bad, mode="async", workers=1, worker_progress=(f"w {bad}", {"step": 3}))
    display.handle("message", text=f"m {bad}")
    display.handle("task-failed", task="worker:0", host=bad, error=f"e {bad}")
    display.close()
    ui.render_summary(out, {"job": f"j {bad}", "checkpoint": f"/c/{bad}", "restarts": {f"t {bad}": 1}})
    ui.EventLineReporter(out).handle("task-lost", task="worker:0", host=bad, detail=f"l {bad}")
    text = buffer.getvalue()
    for piece in (f"w {bad}", f"m {bad}", f"e {bad}", f"j {bad}", f"/c/{bad}", f"t {bad} x1", f"l {bad}"):
        assert_shown(text, piece)


@pytest.mark.parametrize("bad", [bad for bad in HOSTILE if bad.isprintable()])
def test_program_output_and_run_report(bad):
    out, buffer = console()
    program = ui.ProgramOutput(out, out)
    program.handle("output", task="worker:0", host=bad, line=f"o {bad}")
    program.handle("task-failed", task="worker:0", host=bad, error=f"e {bad}")
    ui.render_run_report(out, {"command": ["prog"], "cluster": "c", "exit_code": 1, "wall_seconds": 1.0,
                               "tasks": [{"role": "worker", "index": 0, "host": f"h {bad}", "state": "exited",
                                          "exit_code": 1, "signal": None, "restarts": 0, "seconds": 1.0}]})
    text = buffer.getvalue()
    for piece in (f"[worker:0@{bad}] o {bad}", f"e {bad}", f"h {bad}"):
        assert_shown(text, piece)


def test_program_output_keeps_its_colours_but_no_other_escape():
    """A program's own SGR colours are decoded (shown as styles), not passed through raw."""
    out, buffer = console()
    ui.ProgramOutput(out, out).handle("output", task="worker:0", host="h", line="a\x1b[31mred\x1b[0m [bold]\x1b]0;title\x07\x1b[2J")
    assert "[worker:0@h] ared [bold]" in buffer.getvalue()
    assert "\x1b" not in buffer.getvalue()


def test_consoles_do_not_turn_text_into_emoji():
    out, _ = ui.make_consoles()
    buffer = io.StringIO()
    out.file = buffer
    out.print(ui.escape(":fire: /data/:thumbs_up:/x"))
    assert ":fire: /data/:thumbs_up:/x" in buffer.getvalue()


def test_logs_shows_control_characters_visibly(monkeypatch, tmp_path):
    """N13 (issue 25): `pscluster logs` wrote remote bytes raw, escape sequences included."""
    from cluster import cli, logs
    from cluster.cli import Env, history_cmds
    from cluster.state import StateStore

    def stream_logs(state, tasks, pool, write, **options):
        write("[worker:0@a] step 1\x1b]0;owned\x07\x1b[2J\r\tok\n")

    monkeypatch.setattr(history_cmds, "_existing", lambda env, name: None)
    monkeypatch.setattr(history_cmds, "_run_record", lambda env, name, run: None)      # the cluster that is up
    monkeypatch.setattr(StateStore, "resolve_name", lambda self, name: name)
    monkeypatch.setattr(logs, "select_tasks", lambda state, task: [])
    monkeypatch.setattr(logs, "stream_logs", stream_logs)
    out = io.StringIO()
    env = Env(out=Console(file=out, width=200, color_system=None), err=Console(file=io.StringIO()),
              store=StateStore(tmp_path), pool_factory=lambda: contextlib.nullcontext())
    assert cli.run(["logs", "--name", "c1"], env=env) == 0
    assert out.getvalue() == "[worker:0@a] step 1\\x1b]0;owned\\x07\\x1b[2J\\x0d\tok\n"


@pytest.mark.parametrize("line", ["plain", "unicode é ✓ 日本", "  spaces around  ", "[bold]markup[/bold] :fire:",
                                  "", "x" * 500])
def test_piped_program_output_is_written_as_rich_would_print_it(line):
    """Issue 46: a piped `run` writes a printable line directly (rich's rendering of a line a second
    from every host was the most of the supervisor's main thread); the text is the same."""
    def narrow() -> tuple[Console, io.StringIO]:     # a pipe's console is 80 columns: no wrapping either way
        buffer = io.StringIO()
        return Console(file=buffer, width=40, color_system=None, highlight=False, emoji=False), buffer
    out, buffer = narrow()
    out.print = lambda *args, **kwargs: pytest.fail("rendered by rich")     # type: ignore[method-assign]
    ui.ProgramOutput(out, out).handle("output", task="worker:3", host="node-7", line=line)
    reference, expected = narrow()
    reference.print(Text("[worker:3@node-7] ") + Text.from_ansi(line), soft_wrap=True, highlight=False)
    assert buffer.getvalue() == expected.getvalue()
