"""The live view (cluster/console/liveview.py, cluster/console/live.py TrainDisplay and ProgramOutput's bar):
formats, rate windows and ETA on hand-checked numbers, plain lines when not on a terminal."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from cluster import console as ui
from cluster.console.liveview import (Frame, RateWindow, StepRate, Throttle, TrainView, WorkerLine, eval_line, fmt_duration,
                              fmt_epoch, progress_line, workers_line)


@pytest.mark.parametrize("epoch, shown", [(None, ""), (0, "0.0"), (0.04, "0.0"), (0.45, "0.5"), (1.2345, "1.2"),
                                          (12.96, "13.0")])
def test_epoch_has_one_decimal(epoch, shown):
    assert fmt_epoch(epoch) == shown


@pytest.mark.parametrize("seconds, shown", [(None, "--:--"), (-1, "--:--"), (float("nan"), "--:--"), (0, "0:00"),
                                            (7.4, "0:07"), (59.6, "1:00"), (725, "12:05"), (3723, "1:02:03"),
                                            (90000, "25:00:00")])
def test_durations(seconds, shown):
    assert fmt_duration(seconds) == shown


def test_rate_window_weights_each_report_by_the_time_since_the_one_before():
    window = RateWindow(span=10.0)
    window.add(100.0, 1000.0)                # first: weight 1 s
    assert window.value() == 1000.0
    window.add(101.5, 2000.0)                # weight 1.5 s: (1000*1 + 2000*1.5) / 2.5 = 1600
    assert window.value() == pytest.approx(1600.0)
    window.add(101.501, 807_658.0)           # arrives 1 ms later (a short forced window): barely moves it
    assert window.value() == pytest.approx((1000 + 3000 + 807.658) / 2.501)        # 1922.3, not 807,658
    window.add(115.0, 500.0)                 # 13.5 s later: the earlier reports left the 10 s window
    assert window.value() == 500.0


def test_two_reports_in_the_same_instant_never_give_an_absurd_rate():
    window = RateWindow()
    window.add(5.0, 3000.0)
    window.add(5.0, 900_000.0)               # same arrival: weight 0
    assert window.value() == 3000.0


def test_step_rate_needs_a_span_and_restarts_when_steps_go_back():
    rate = StepRate(span=60.0, min_span=5.0)
    rate.add(0.0, 0)
    rate.add(0.001, 320)                     # 1 ms: no rate, no ETA
    assert rate.value() is None and rate.eta(320, 1000) is None
    rate.add(10.0, 1000)                     # 1000 steps in 10 s
    assert rate.value() == pytest.approx(100.0)
    assert rate.eta(1000, 5000) == pytest.approx(40.0)
    rate.add(70.0, 7000)                     # samples before 70-60 = 10 s left the window: (7000-1000)/(70-10)
    assert rate.value() == pytest.approx(100.0)
    rate.add(71.0, 6400)                     # resumed from a checkpoint at 6400: measure again
    assert rate.value() is None
    assert rate.eta(6400, 5000) is None


def test_train_view_frame_and_plain_lines():
    view = TrainView()
    view.update("job-state", {"event": "started", "time": 1000.0}, now=0.0, wall=1000.0)
    view.update("job", {"job": "distributed_mnist", "mode": "async", "workers": 2, "state": "running", "step": 0,
                        "steps_total": 5000, "epoch": 0.0, "loss": 2.3, "examples_per_second": 9000.0,
                        "per_worker": {"worker:0": 4500.0, "worker:1": 4400.0}}, now=0.0, wall=1000.0)
    view.update("job", {"step": 1200, "epoch": 0.4096, "loss": 0.31214, "examples_per_second": 10000.0,
                        "per_worker": {"worker:0": 5000.0, "worker:1": 5000.0}}, now=8.0, wall=1062.0)
    frame = view.frame(wall=1062.0)
    assert frame.elapsed == 62.0 and frame.eta == pytest.approx(3800 / 150.0)      # 1200 steps in 8 s
    assert frame.workers[1] == WorkerLine("worker:1", rate=pytest.approx((4400 * 1 + 5000 * 8) / 9))     # 4933.3
    assert progress_line(frame) == ("step 1200/5000 (24%)  epoch 0.4  loss 0.3121  9,889 examples/s  "
                                    "elapsed 1:02  ETA 0:25")
    assert workers_line(frame) == "workers: worker:0 4,944/s, worker:1 4,933/s"


def test_sync_workers_report_their_own_progress():
    view = TrainView()
    view.update("job", {"step": 10, "per_worker": {"worker:0": 100.0}}, now=0.0, wall=0.0)
    view.update("job", {"worker_progress": ("worker:0", {"step": 10, "epoch": 0.01, "loss": 1.0, "rate": 120.0})},
                now=0.0, wall=0.0)
    view.update("job", {"worker_progress": ("worker:1", {"step": 9, "epoch": 0.01, "loss": 1.1, "rate": 110.0})},
                now=0.0, wall=0.0)
    view.update("job", {"step": 20, "per_worker": {"worker:0": 999.0}}, now=2.0, wall=2.0)   # its own counts
    frame = view.frame(wall=2.0)
    assert [(w.name, w.step, w.rate) for w in frame.workers] == [("worker:0", 10, 100.0), ("worker:1", 9, 110.0)]
    assert workers_line(frame) == "workers: worker:0 100/s step 10, worker:1 110/s step 9"


def test_a_resize_takes_the_rows_of_workers_that_left_and_adds_those_that_joined():
    """Issue 45 item 2: after `scale` from 3 to 2 sync workers, worker:2's row stayed, frozen."""
    view = TrainView()
    for worker, rate in (("worker:0", 1000.0), ("worker:1", 990.0), ("worker:2", 995.0)):
        view.update("job", {"worker_progress": (worker, {"step": 932, "rate": rate})}, now=0.0, wall=0.0)
    view.update("job-state", {"event": "resized", "report": {
        "old": {"worker": ["worker:0@h1", "worker:1@h2", "worker:2@h3"]},
        "new": {"worker": ["worker:0@h1", "worker:1@h2"]}, "workers": 2}}, now=1.0, wall=1.0)
    view.update("job", {"worker_progress": ("worker:2", {"step": 933, "rate": 995.0})}, now=1.1, wall=1.1)  # a late report
    view.update("job", {"worker_progress": ("worker:0", {"step": 940, "rate": 1010.0})}, now=2.0, wall=2.0)
    assert [w.name for w in view.frame(wall=2.0).workers] == ["worker:0", "worker:1"]
    assert "worker:2" not in workers_line(view.frame(wall=2.0))
    view.update("job-state", {"event": "resized", "report": {   # async grows in place: the chief's rates
        "new": {"chief": ["chief:0@h1"], "ps": ["ps:0@h1"], "worker": ["worker:0@h1", "worker:1@h2", "worker:3@h4"]},
        "in_place": True}}, now=3.0, wall=3.0)
    assert [w.name for w in view.frame(wall=3.0).workers] == ["worker:0", "worker:1", "worker:3"]
    view.update("job", {"step": 950, "per_worker": {"worker:3": 500.0}}, now=4.0, wall=4.0)
    assert workers_line(view.frame(wall=4.0)).endswith("worker:3 500/s")


def test_a_worker_dropped_from_a_run_loses_its_row():
    view = TrainView()
    view.update("job", {"step": 5, "per_worker": {"worker:0": 10.0, "worker:1": 11.0}}, now=0.0, wall=0.0)
    view.update("job-state", {"event": "resized", "report": {"old": ["worker:0", "worker:1"], "new": ["worker:0"],
                                                             "workers": 1}}, now=1.0, wall=1.0)
    assert [w.name for w in view.frame(wall=1.0).workers] == ["worker:0"]


def test_lines_before_anything_is_known():
    frame = Frame(title="j", state="starting", step=None, total=None, epoch=None, loss=None, rate=None,
                  elapsed=None, eta=None)
    assert progress_line(frame) == "elapsed --:--"
    assert workers_line(frame) == ""


def test_eval_line():
    assert eval_line({"step": 1200, "epoch": 0.4096, "val_loss": 0.27114, "val_accuracy": 0.92131,
                      "seconds": 62.0}) == "eval at step 1200 (epoch 0.4):  val_loss 0.2711  val_accuracy 0.9213  after 1:02"
    assert eval_line({"step": 5, "val_loss": None, "val_accuracy": None, "seconds": None}) == "eval at step 5:"


def test_throttle():
    throttle = Throttle(10.0)
    assert [throttle.ready(t) for t in (0.0, 1.5, 9.9, 10.0, 12.0, 20.5)] == [True, False, False, True, False, True]


# ----------------------------------------------------------------------------- the console side

def plain_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=300, color_system=None, highlight=False, emoji=False), buffer


def test_train_display_prints_plain_lines_when_not_on_a_terminal():
    out, buffer = plain_console()
    now = [0.0]
    display = ui.TrainDisplay(out, clock=lambda: now[0], wall=lambda: 1000.0 + now[0])
    assert display.plain
    display.handle("job", worker_progress=("worker:0", {"step": 90, "rate": 40.0}))       # no job step yet: no line
    display.handle("job", job="m", mode="async", workers=1, state="running", started=1000.0, step=100,
                   steps_total=1000, epoch=0.1, loss=1.0, examples_per_second=50.0)
    now[0] = 1.5
    display.handle("job", step=200, epoch=0.2, loss=0.9, examples_per_second=50.0)     # 1.5 s later: throttled
    display.handle("eval", step=200, val_loss=0.5, val_accuracy=0.8, seconds=3.0, epoch=0.2)
    now[0] = 12.0
    display.handle("job", step=900, epoch=0.9, loss=0.5, examples_per_second=50.0)     # 12 s: a line
    display.close()
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("step 100/1000 (10%)  epoch 0.1  loss 1.0000  50 examples/s  elapsed 0:00")
    assert lines[1] == "eval at step 200 (epoch 0.2):  val_loss 0.5000  val_accuracy 0.8000  after 0:03"
    assert lines[2] == ("step 900/1000 (90%)  epoch 0.9  loss 0.5000  50 examples/s  elapsed 0:12  ETA 0:02  |  "
                        "workers: worker:0 40/s step 90")
    # (800 steps in 12 s: 100 left at 66.7 steps/s = 1.5 s, shown rounded)
    assert len(lines) == 3                           # close: nothing new since the last line
    assert "\x1b" not in buffer.getvalue()


def test_train_display_on_a_terminal_draws_a_bar_and_a_table():
    buffer = io.StringIO()
    out = Console(file=buffer, width=160, force_terminal=True, color_system=None, highlight=False, emoji=False)
    display = ui.TrainDisplay(out, clock=lambda: 0.0, wall=lambda: 1000.0)
    assert not display.plain
    display.handle("job", job="m", mode="sync", workers=1, state="running", started=990.0, step=100, steps_total=400,
                   epoch=0.1234, loss=1.0, examples_per_second=50.0, per_worker={"worker:0": 50.0})
    display.close()
    text = buffer.getvalue()
    assert "step 100/400 (25%)  epoch 0.1" in text and "elapsed 0:10" in text
    assert "worker:0" in text and "0.1234" not in text


def test_run_bar_counts_chief_and_worker_tasks_that_finished():
    out, _ = plain_console()
    output = ui.ProgramOutput(out, out, bar=False, wall=lambda: 1010.0)
    for task in ("chief:0", "ps:0", "worker:0", "worker:1"):
        output.handle("task-started", task=task, host="h", pid=1)
    output.handle("job-state", cluster="c", job="p", job_id=1, entry="run", event="started", time=1000.0, report={})
    output.handle("task-exited", task="worker:0", host="h", exit_code=0, signal=None, detail="exited 0")
    output.handle("task-exited", task="worker:1", host="h", exit_code=1, signal=None, detail="exited 1")
    output.handle("task-exited", task="ps:0", host="h", exit_code=0, signal=None, detail="exited 0")
    grid = output._render_bar()
    shown = Console(file=io.StringIO(), width=120, color_system=None)
    with shown.capture() as capture:
        shown.print(grid)
    assert "1/3 chief/worker task(s) finished  elapsed 0:10" in capture.get()


def test_elapsed_stops_when_the_job_ends():
    view = TrainView()
    view.update("job-state", {"event": "started", "time": 1003.0, "report": {"started": 1000.0}}, now=0.0, wall=1003.0)
    view.update("job-state", {"event": "finished", "time": 1075.0}, now=75.0, wall=1075.0)
    assert view.frame(wall=1090.0).elapsed == 75.0
