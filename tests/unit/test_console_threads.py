"""Events emitted from several threads at once (the fan-out starts a task on each host in its own
thread): the console handles one at a time. Two handlers at once each made a progress display
and the second lost the first one's rows: `up` died with "KeyError: 1" in rich's Progress.update
(twice in the SSH lab's CI run)."""

from __future__ import annotations

import io
import threading
import time

from rich.console import Console

from cluster import console as ui
from cluster.console import live


class SlowStart(live.Progress):
    """A progress display that takes a while to start, as on a loaded machine."""

    made = 0

    def __init__(self, *args, **kwargs) -> None:
        SlowStart.made += 1
        super().__init__(*args, **kwargs)

    def start(self) -> None:
        time.sleep(0.05)
        super().start()


def test_task_started_from_many_threads_at_once_keeps_every_row(monkeypatch):
    monkeypatch.setattr(live, "Progress", SlowStart)
    SlowStart.made = 0
    out = io.StringIO()
    reporter = ui.RichReporter(Console(file=out, force_terminal=False, width=120))
    errors: list[BaseException] = []
    gate = threading.Barrier(8)

    def start(index: int) -> None:
        gate.wait()
        try:
            reporter.emit("task-started", task=f"worker:{index}", host=f"node-{index}", pid=1000 + index)
        except BaseException as exc:        # the failure this test is about: KeyError from rich
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert SlowStart.made == 1, "each thread made a progress display of its own"
    # One display, holding the row of every task.
    assert len(reporter._rows) == 8
    assert sorted(reporter._rows.values()) == sorted(task.id for task in reporter._progress.tasks)
    reporter.close()


def test_past_32_tasks_one_row_counts_them_instead_of_a_row_each():
    """Issue 46: rich renders every row at each change, so a row per task cost N² in `up` of
    many hosts; past ``ROWS_SHOWN`` tasks the rows give way to one that counts them."""
    out = io.StringIO()
    reporter = ui.RichReporter(Console(file=out, force_terminal=False, width=120))
    for i in range(live.ROWS_SHOWN):
        reporter.emit("task-starting", task=f"ps:{i}", host=f"node-{i}")
    assert len(reporter._progress.tasks) == live.ROWS_SHOWN         # few: a row each, as before
    many = 1000
    for i in range(live.ROWS_SHOWN, many):
        reporter.emit("task-starting", task=f"ps:{i}", host=f"node-{i}")
    for i in range(many):
        reporter.emit("task-started", task=f"ps:{i}", host=f"node-{i}", pid=1000 + i)
    for i in range(600):
        reporter.emit("task-ready", task=f"ps:{i}", host=f"node-{i}", devices=("/device:CPU:0",), seconds=1.0)
    (row,) = reporter._progress.tasks
    assert row.description == "1000 task(s): 600 ready, 400 started and waiting, 0 starting"
    assert (row.completed, row.total) == (600, 1000)
    reporter.close()
