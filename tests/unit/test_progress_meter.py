"""ProgressMeter's per-worker rates and how the orchestrator picks them (pure logic, fake clock)."""
from __future__ import annotations

import pytest

from cluster.bench import study as bench
from roles.reporting import ProgressMeter


class _Reporter:
    def __init__(self):
        self.events = []

    def progress(self, **fields):
        self.events.append(fields)


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_overall_per_worker_is_not_skewed_by_a_short_last_window():
    clock, reporter = _Clock(), _Reporter()
    meter = ProgressMeter(reporter, interval=5.0, clock=clock)
    for _ in range(10):                      # 10 s: each worker 640 examples per second
        clock.now += 1.0
        meter.add(10, 1280, 0.5, [("worker:0", 640), ("worker:1", 640)])
        meter.maybe_emit(meter.total_steps)
    clock.now += 0.001                       # the last closures land together at the end
    meter.add(1, 128, 0.5, [("worker:0", 128)])
    meter.maybe_emit(meter.total_steps, force=True)
    # The 1 ms window alone would say 128,000 examples/s: it is measured with the 5 s window before it.
    assert reporter.events[-1]["per_worker"] == pytest.approx({"worker:0": (3200 + 128) / 5.001,
                                                               "worker:1": 3200 / 5.001})
    assert reporter.events[-1]["examples_per_second"] == pytest.approx((6400 + 128) / 5.001)
    assert reporter.events[-2]["per_worker"] == pytest.approx({"worker:0": 640.0, "worker:1": 640.0})
    overall = meter.overall_per_worker()
    assert overall == pytest.approx({"worker:0": (6400 + 128) / 10.001, "worker:1": 6400 / 10.001})
    assert sum(overall.values()) == pytest.approx(meter.overall_rate())


def test_overall_per_worker_is_none_without_attribution():
    meter = ProgressMeter(_Reporter(), clock=_Clock())
    assert meter.overall_per_worker() is None


def test_collector_prefers_the_leaders_overall_split():
    collector = bench._Collector()
    collector.emit("job", step=10, per_worker={"worker:0": 100.0})
    collector.emit("job", step=11, per_worker={"worker:0": 99_000.0})       # a 1 ms window
    assert collector.per_worker(["worker:0", "worker:1"], overall={"worker:0": 120.0}) == \
        {"worker:0": 120.0, "worker:1": 0.0}
    assert collector.per_worker(["worker:0"]) == {"worker:0": pytest.approx(49_550.0)}   # the fallback


def test_each_window_says_when_its_work_came_and_the_longest_gap_between_two_units():
    """Issue 44: the chief's pause is measured between collected units (a closure), not between
    progress lines (1.5 s apart): each line carries its first and last unit's wall time and the
    longest gap, the gap into the window included; the first unit after a (re)start carries its
    own time, so a restart's pause is the next process's first against this one's last."""
    clock, wall, reporter = _Clock(), _Clock(), _Reporter()
    meter = ProgressMeter(reporter, interval=5.0, clock=clock, wall=wall)
    meter.first_unit(10, 0.9)
    assert reporter.events[-1]["work"].first == reporter.events[-1]["work"].last == 100.0
    for delay in (0.2, 0.3, 2.5, 0.2):          # a 2.5 s pause inside the window
        clock.now += delay
        wall.now += delay
        meter.add(10, 1280, 0.5, [("worker:0", 1280)])
    meter.maybe_emit(50, force=True)
    work = reporter.events[-1]["work"]
    assert (work.first, work.last, work.gap) == pytest.approx((100.2, 103.2, 2.5))
    clock.now += 4.0                             # the pause falls between two windows
    wall.now += 4.0
    meter.add(10, 1280, 0.5, [("worker:0", 1280)])
    meter.maybe_emit(60, force=True)
    work = reporter.events[-1]["work"]
    assert (work.first, work.last, work.gap) == pytest.approx((107.2, 107.2, 4.0))
    assert not meter.maybe_emit(60, force=True)   # no new unit: no line, and no stale span
