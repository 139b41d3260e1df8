"""The step schedule every driver follows (chunks cut at checkpoint and evaluation
boundaries, boundaries reached when steps jump) and the first-step bookkeeping; pure."""
from __future__ import annotations

import dataclasses

from roles.settings import Boundaries, StepSchedule, TrainPlan
from roles.reporting import FirstStep, ProgressMeter

PLAN = TrainPlan(mode="sync", workers=2, global_batch_size=64, worker_batch_size=32, steps_total=100,
                 epochs=None, learning_rate=0.1, steps_per_execution=8, train_examples=None,
                 checkpoint_dir="/ckpt", checkpoint_every=30, eval_every=20, resume=False, seed=1,
                 start_timeout=10.0, collective_timeout=10.0)


def walk(plan: TrainPlan, start: int = 0) -> list[tuple[int, int, Boundaries]]:
    """(step before, chunk, boundaries reached after) for a whole run that takes every chunk."""
    schedule, step, out = StepSchedule(plan, start), start, []
    while step < plan.steps_total:
        n = schedule.chunk(step)
        step += n
        out.append((step - n, n, schedule.reached(step)))
    return out


def test_chunks_never_cross_a_boundary_or_the_budget():
    run = walk(PLAN)
    # Hand-checked: boundaries at 20 (eval), 30 (ckpt), 40 (eval), 60 (both), 80 (eval), 90 (ckpt).
    assert [n for _, n, _ in run] == [8, 8, 4, 8, 2, 8, 2, 8, 8, 4, 8, 8, 4, 8, 2, 8, 2]
    ends = [before + n for before, n, _ in run]
    assert [end for end, (_, _, b) in zip(ends, run) if b.checkpoint] == [30, 60, 90]
    # Evaluations at 20, 40, 60, 80 but not at the last step (the final evaluation is separate).
    assert [end for end, (_, _, b) in zip(ends, run) if b.evaluate] == [20, 40, 60, 80]
    assert ends[-1] == 100


def test_an_async_warm_start_ends_on_a_chunk_boundary():
    # The closures of a warm start run one at a time: the one that ends it must end on it.
    plan = dataclasses.replace(PLAN, mode="async", steps_per_execution=32, steps_total=200, checkpoint_every=None,
                               eval_every=None, warmup_steps=50)
    assert [n for _, n, _ in walk(plan)] == [32, 18, 32, 32, 32, 32, 22]
    assert [n for _, n, _ in walk(plan, start=60)] == [32, 32, 32, 32, 12]


def test_resume_starts_from_the_next_boundaries():
    run = walk(PLAN, start=45)
    assert run[0][:2] == (45, 8) and run[1][:2] == (53, 7)      # 60 is both boundaries
    assert run[1][2] == Boundaries(checkpoint=True, evaluate=True)


def test_jumping_steps_reach_each_boundary_once():
    schedule = StepSchedule(dataclasses.replace(PLAN, steps_per_execution=1), 0)
    reached = {step: schedule.reached(step) for step in (7, 19, 33, 34, 61, 100)}    # sync-ps: several workers' updates
    assert [step for step, b in reached.items() if b.checkpoint] == [33, 61, 100]     # 100 passed 90
    assert [step for step, b in reached.items() if b.evaluate] == [33, 61]       # 100 is the end: no periodic eval


def test_without_boundaries_only_the_budget_and_execution_size_cut():
    plan = dataclasses.replace(PLAN, checkpoint_every=None, eval_every=None, steps_total=20)
    assert [n for _, n, b in walk(plan)] == [8, 8, 4]
    assert not any(b.checkpoint or b.evaluate for _, _, b in walk(plan))
    assert StepSchedule(plan, 20).chunk(20) == 0


class _Deadline:
    def __init__(self):
        self.disarmed = 0

    def disarm(self):
        self.disarmed += 1


def test_the_first_unit_disarms_the_deadline_restarts_the_clock_and_is_not_counted():
    now = [10.0]
    meter = ProgressMeter(reporter=None, clock=lambda: now[0])
    deadline = _Deadline()
    first = FirstStep(deadline, meter)
    now[0] = 25.0                            # tracing and start-up took 15 s
    assert first.counts() is False and first.done and deadline.disarmed == 1
    meter.add(10, 640, 0.5)
    now[0] = 26.0
    assert first.counts() is True and deadline.disarmed == 1
    assert meter.overall_rate() == 640.0     # 640 examples in the 1 s since the first unit, not in 16 s



class _Progress:
    def __init__(self):
        self.events: list[tuple] = []

    def progress(self, step, loss, examples_per_second, per_worker, work=None):
        self.events.append((step, loss, examples_per_second, per_worker))


def test_the_first_unit_reports_its_step_at_once_without_rates():
    """After a (re)start the job is seen training one unit after it does, not a progress interval
    (1.5 s) later: a resize's pause was measured, and `status` showed the step, that much late."""
    now = [10.0]
    reporter = _Progress()
    meter = ProgressMeter(reporter=reporter, clock=lambda: now[0])
    first = FirstStep(_Deadline(), meter)
    assert first.counts(1256, 0.25) is False
    assert reporter.events == [(1256, 0.25, None, {})]
    meter.add(8, 512, 0.2)
    assert first.counts(1264, 0.2) is True and len(reporter.events) == 1     # later units: the meter's interval
