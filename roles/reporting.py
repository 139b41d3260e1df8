"""What the drivers report, and when: typed helpers over :class:`EventWriter`.

Drivers call :class:`TaskReporter` methods instead of writing event dicts, so the field
sets stay the contract in ``roles/events.py``. :class:`ProgressMeter` turns "this
worker finished n steps" notifications into one ``progress`` event every
``interval`` seconds, with throughput measured over that window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from roles.events import EventWriter
from roles.settings import TrainPlan

if TYPE_CHECKING:
    from roles.summaries import Summaries

PROGRESS_INTERVAL_SECONDS = 1.5


@dataclass(frozen=True)
class VariablePlacement:
    name: str
    device: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TrainResult:
    """What a driver hands back to ``roles.train`` for the ``done`` event."""

    global_step: int
    val_loss: float | None
    val_accuracy: float | None
    examples_per_second: float | None
    checkpoint: str | None
    restored_step: int | None
    per_worker: dict[str, float] | None = None   # examples/s per worker over the whole loop
    workers: int | None = None     # at the end, when workers joined or left in place (roles/membership.py)


class TaskReporter:
    """Writes this task's events; ``is_chief`` gates the job-level ones. The chief's
    TensorBoard ``summaries`` (roles/summaries.py), if any, hear of every finished unit of
    work (:meth:`trained`) and every evaluation."""

    def __init__(self, writer: EventWriter, plan: TrainPlan, is_chief: bool,
                 summaries: Summaries | None = None) -> None:
        self.writer = writer
        self.plan = plan
        self.is_chief = is_chief
        self.summaries = summaries if is_chief else None

    def start(self, restored_step: int | None) -> None:
        self.writer.emit("start", **self.plan.start_fields(restored_step))
        if self.summaries is not None:
            self.summaries.start(restored_step or 0)

    def trained(self, step: int, steps: int, examples: int, loss: float | None, *, timed: bool = True) -> None:
        """A unit of ``steps`` steps (``examples`` examples in all) finished and brought the
        job to ``step``; ``timed`` is False for the first unit (start-up is not throughput)."""
        if self.summaries is not None:
            self.summaries.trained(step, steps, examples, loss, timed=timed)

    def close_summaries(self, step: int | None) -> None:
        """End of the run (``step`` reached) or a failure (None): the last point, then close."""
        if self.summaries is not None:
            self.summaries.close(step)

    def placement(self, variables: Iterable[VariablePlacement]) -> None:
        if not self.is_chief:
            return
        self.writer.emit("placement", variables=[
            {"name": v.name, "device": v.device, "shape": list(v.shape)} for v in variables])

    def checkpoint(self, step: int, path: str) -> None:
        if self.is_chief:
            self.writer.emit("checkpoint", step=step, path=path)

    def eval(self, step: int, val_loss: float | None, val_accuracy: float | None) -> None:
        if self.is_chief:
            self.writer.emit("eval", step=step, val_loss=val_loss, val_accuracy=val_accuracy,
                             epoch=_round(self.plan.epoch_at(step), 4))
        if self.summaries is not None:
            self.summaries.eval(step, val_loss, val_accuracy)

    def progress(self, step: int, loss: float | None, examples_per_second: float | None,
                 per_worker: dict[str, float], work: "WorkSpan | None" = None) -> None:
        extra = {} if work is None else {"work_from": round(work.first, 3), "work_to": round(work.last, 3),
                                         "gap": round(work.gap, 3)}
        self.writer.emit("progress", step=step, steps_total=self.plan.steps_total,
                         epoch=_round(self.plan.epoch_at(step), 4), loss=_round(loss, 5),
                         examples_per_second=_round(examples_per_second, 1),
                         per_worker={k: round(v, 1) for k, v in per_worker.items()}, **extra)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


@dataclass(frozen=True)
class WorkSpan:
    """When the work of one progress window came in (wall clock): the first and the last unit
    collected in it, and the longest time between two units collected one after the other, the
    one before the window's first included (issue 44: a pause finer than the reporting interval;
    across a restart, the next process's ``first`` against this one's ``last``)."""

    first: float
    last: float
    gap: float


class ProgressMeter:
    """Accumulates finished work and emits ``progress`` at most every ``interval`` s.

    ``examples_per_second`` is the job's rate over the last window (all workers);
    ``per_worker`` splits it by the worker that did the work, as far as the mode can
    tell (async knows which worker ran each closure; a sync worker knows only itself).
    A forced emit (end of training, before a checkpoint) can close a window of a few
    milliseconds holding a whole closure's examples: its rates would be absurd (807,658
    examples/s for one worker on the local inventory), so a window shorter than half the
    interval is measured together with the window before it.
    """

    def __init__(self, reporter: TaskReporter, interval: float = PROGRESS_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._reporter = reporter
        self._interval = interval
        self._clock = clock
        self._wall = wall
        self._unit_last: float | None = None      # wall time of the last unit added
        self._span: WorkSpan | None = None        # this window's (None: no unit yet)
        self._started = clock()
        self._window_start = self._started
        self._window_examples = 0
        self._window_by_worker: dict[str, int] = {}
        self._window_loss_sum = 0.0
        self._window_loss_steps = 0
        # The last emitted window (seconds, examples, by worker): rates of a short forced window
        # are measured over it and the short one together.
        self._last_window: tuple[float, int, dict[str, int]] = (0.0, 0, {})
        self.total_examples = 0
        self.total_steps = 0
        self.total_by_worker: dict[str, int] = {}

    def first_unit(self, step: int, loss: float | None) -> None:
        """The first unit of work reached ``step``: reported without rates (none are known)."""
        now = self._wall()
        self._unit_last = now
        self._reporter.progress(step=step, loss=loss, examples_per_second=None, per_worker={},
                                work=WorkSpan(now, now, 0.0))

    def restart_clock(self) -> None:
        """Starts measuring now (after compilation / first step, say)."""
        self._started = self._window_start = self._clock()

    def add(self, steps: int, examples: int, loss: float | None,
            workers: Sequence[tuple[str, int]] = ()) -> None:
        """Records ``steps`` finished steps worth ``examples`` examples in total.

        ``workers`` optionally attributes examples to workers (name, examples).
        """
        self.total_steps += steps
        self.total_examples += examples
        self._window_examples += examples
        now = self._wall()
        gap = 0.0 if self._unit_last is None else max(0.0, now - self._unit_last)
        self._unit_last = now
        self._span = (WorkSpan(now, now, gap) if self._span is None else
                      WorkSpan(self._span.first, now, max(self._span.gap, gap)))
        for name, n in workers:
            self._window_by_worker[name] = self._window_by_worker.get(name, 0) + n
            self.total_by_worker[name] = self.total_by_worker.get(name, 0) + n
        if loss is not None and loss == loss:  # skip NaN in the mean, report it below
            self._window_loss_sum += float(loss) * steps
            self._window_loss_steps += steps
        elif loss is not None:
            self._window_loss_sum = float("nan")
            self._window_loss_steps = max(self._window_loss_steps, 1)

    def due(self) -> bool:
        return self._clock() - self._window_start >= self._interval

    def maybe_emit(self, step: int, force: bool = False) -> bool:
        """Emits a progress event if the interval has passed (or ``force``)."""
        now = self._clock()
        elapsed = now - self._window_start
        if not force and elapsed < self._interval:
            return False
        if self._window_examples == 0:
            return False  # nothing new since the last event (forced or not)
        loss = (self._window_loss_sum / self._window_loss_steps
                if self._window_loss_steps else None)
        seconds, examples, by_worker = elapsed, self._window_examples, dict(self._window_by_worker)
        if elapsed < self._interval / 2 and self._last_window[0] > 0:
            last_seconds, last_examples, last_by_worker = self._last_window
            seconds, examples = seconds + last_seconds, examples + last_examples
            for name, n in last_by_worker.items():
                by_worker[name] = by_worker.get(name, 0) + n
        seconds = max(seconds, 1e-6)
        self._reporter.progress(
            step=step, loss=loss,
            examples_per_second=examples / seconds,
            per_worker={k: v / seconds for k, v in sorted(by_worker.items())}, work=self._span)
        self._span = None
        self._last_window = (seconds, examples, by_worker)
        self._window_start = now
        self._window_examples = 0
        self._window_by_worker = {}
        self._window_loss_sum = 0.0
        self._window_loss_steps = 0
        return True

    def overall_rate(self) -> float | None:
        """Examples per second since the clock started (for the ``done`` event)."""
        elapsed = self._clock() - self._started
        if elapsed <= 0 or self.total_examples == 0:
            return None
        return self.total_examples / elapsed

    def overall_per_worker(self) -> dict[str, float] | None:
        """Examples per second of each worker since the clock started: the per-worker split
        of :meth:`overall_rate` (the last progress window can be a few milliseconds long)."""
        elapsed = self._clock() - self._started
        if elapsed <= 0 or not self.total_by_worker:
            return None
        return {name: n / elapsed for name, n in sorted(self.total_by_worker.items())}


class FirstStep:
    """The first unit of work proves the cluster works: when it finishes, the start deadline
    is disarmed and the meter's clock restarts (tracing and start-up stay out of the rates);
    that unit itself is not counted.

    Call :meth:`counts` once per finished unit: False for the first (after the bookkeeping),
    True afterwards. Given the step that first unit reached, it reports it at once, without
    rates: the job is seen training again (after a start, a restart or a resize) one unit
    after it did, not a progress interval later.
    """

    def __init__(self, link: Any, meter: ProgressMeter) -> None:
        self._link = link
        self._meter = meter
        self.done = False

    def counts(self, step: int | None = None, loss: float | None = None) -> bool:
        if self.done:
            return True
        self.done = True
        self._link.disarm()
        self._meter.restart_clock()
        if step is not None:
            self._meter.first_unit(step, loss)
        return False


def placements_of(variables: Iterable[Any]) -> list[VariablePlacement]:
    """Name, device and shape of TensorFlow/Keras variables.

    Keras 3 variables report ``device=None`` under ParameterServerStrategy; the
    TensorFlow variable they wrap (``.value``) knows where it lives.
    """
    out = []
    for v in variables:
        inner = getattr(v, "value", v)
        device = getattr(inner, "device", None) or getattr(v, "device", None) or ""
        name = getattr(v, "path", None) or getattr(v, "name", "?")
        shape = tuple(int(d) if d is not None else -1 for d in v.shape)
        out.append(VariablePlacement(name=str(name), device=str(device), shape=shape))
    return out
