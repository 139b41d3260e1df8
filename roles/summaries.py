"""TensorBoard summaries of a training job, written by the process that owns its results
(async: the chief; sync and sync-ps: worker 0) under ``--summary-dir``
(``<workdir>/.pscluster/<cluster>/tensorboard/<job>/`` when ``pscluster train`` starts it).

Scalars, one point every ``--summary-every`` global steps (the step schedule cuts chunks
there, so points land on multiples): ``loss`` (mean over the interval), ``steps_per_second``
and ``examples_per_second`` (over the interval; the first unit of work, which holds tracing
and start-up, is left out of the rates: an interval it fills has none), ``learning_rate`` (the run's, after --scale-lr) and
``restarts`` (of the job before this process, from the orchestrator); at each evaluation
``val_loss`` and ``val_accuracy`` (no tag has a ``/``, so TensorBoard groups none of them). A
last point closes a partial interval at the end or on stop.

Why not ``tf.summary``: sync-ps trains inside a TF1 graph, where a summary op is a graph node
that needs a session run, and tensorflow-cpu 2.21 does not pull in the tensorboard package,
without which ``tf.summary.scalar`` raises ``TBNotInstalledError`` (checked). So the file is
written with TensorFlow's own record writer and protos: the same event-file format (a TFRecord
of ``Event`` protos, scalars as ``simple_value``), the same in every mode, and TensorBoard is
needed only on the host where ``pscluster tensorboard`` runs it. A point costs ~12 us
(measured) and is flushed at once, so a trainer killed without warning loses nothing written.

Each process writes its own file; the first event after the version marks a session start at
the step the process starts from, so TensorBoard's event reader drops the points an earlier
attempt wrote past it (a restart resumes from the last checkpoint and redoes those steps; the
TensorBoard server's fast loader instead keeps, per step, the latest point).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

log = logging.getLogger("pscluster.summaries")


@dataclass(frozen=True)
class SummaryPoint:
    """What one interval of training looked like."""

    step: int
    loss: float | None
    steps_per_second: float | None
    examples_per_second: float | None


class SummaryWindow:
    """Accumulates finished units of work and closes a point at each multiple of ``every``.

    Steps reached or passed count (sync-ps steps can jump); a point's rates cover the steps
    since the previous point that were ``timed``. Pure: the clock is passed in.
    """

    def __init__(self, every: int, start_step: int, clock: Callable[[], float] = time.monotonic) -> None:
        if every < 1:
            raise ValueError(f"a summary interval must be >= 1 step, got {every}")
        self.every = every
        self.next = (start_step // every + 1) * every
        self._clock = clock
        self._reset(clock())

    def _reset(self, now: float) -> None:
        self._since = now
        self._loss_sum = 0.0
        self._loss_steps = 0
        self._timed_steps = 0
        self._timed_examples = 0

    def add(self, step: int, steps: int, examples: int, loss: float | None, *,
            timed: bool = True) -> SummaryPoint | None:
        """Records a unit of ``steps`` steps that brought the job to ``step``; returns the
        point when that reached a boundary. An untimed unit (the first) restarts the clock."""
        now = self._clock()
        if loss is not None:
            self._loss_sum += float(loss) * steps     # a NaN loss stays NaN in the mean: TensorBoard shows it
            self._loss_steps += steps
        if timed:
            self._timed_steps += steps
            self._timed_examples += examples
        else:
            self._since = now
        if step < self.next:
            return None
        point = self._close(step, now)
        self.next = (step // self.every + 1) * self.every
        return point

    def flush(self, step: int) -> SummaryPoint | None:
        """The partial interval up to ``step`` (end of training, stop), if it holds any step."""
        if not self._loss_steps and not self._timed_steps:
            return None
        return self._close(step, self._clock())

    def _close(self, step: int, now: float) -> SummaryPoint:
        elapsed = now - self._since
        timed = self._timed_steps > 0 and elapsed > 0
        point = SummaryPoint(
            step=step,
            loss=self._loss_sum / self._loss_steps if self._loss_steps else None,
            steps_per_second=self._timed_steps / elapsed if timed else None,
            examples_per_second=self._timed_examples / elapsed if timed else None)
        self._reset(now)
        return point


def event_file_name(hostname: str, pid: int, now: float) -> str:
    """TensorBoard finds event files by ``tfevents`` in the name and reads a folder's files in
    name order, so the time comes first after the fixed prefix."""
    return f"events.out.tfevents.{now:.6f}.{hostname}.{pid}.pscluster"


class EventFile:
    """One TensorFlow event file, written with TensorFlow's record writer and protos."""

    def __init__(self, directory: str) -> None:
        import tensorflow as tf

        os.makedirs(directory, exist_ok=True)
        self._tf = tf
        self.path = os.path.join(directory, event_file_name(socket.gethostname(), os.getpid(), time.time()))
        self._writer = tf.io.TFRecordWriter(self.path)
        self._write(file_version="brain.Event:2")

    def _write(self, **fields: Any) -> None:
        event = self._tf.compat.v1.Event(wall_time=time.time(), **fields)
        self._writer.write(event.SerializeToString())

    def session_start(self, step: int) -> None:
        """TensorBoard drops points at or after ``step`` that earlier files hold."""
        self._write(step=step, session_log=self._tf.compat.v1.SessionLog(
            status=self._tf.compat.v1.SessionLog.START))
        self._writer.flush()

    def scalars(self, step: int, values: Mapping[str, float | None]) -> None:
        summary = self._tf.compat.v1.Summary(value=[
            self._tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in values.items() if value is not None])
        if summary.value:
            self._write(step=step, summary=summary)
            self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Summaries:
    """The leader's TensorBoard summaries for one run; never fails the run (a write error
    is logged once and turns summaries off)."""

    def __init__(self, directory: str, every: int, learning_rate: float, restarts: int,
                 clock: Callable[[], float] = time.monotonic,
                 open_file: Callable[[str], Any] = EventFile) -> None:
        self.directory = directory
        self.every = every
        self.learning_rate = learning_rate
        self.restarts = restarts
        self._clock = clock
        self._open_file = open_file
        self._file: Any = None
        self._window: SummaryWindow | None = None

    def start(self, start_step: int) -> None:
        """Opens the file once the step the run starts from is known."""
        if self._file is not None:
            return
        self._window = SummaryWindow(self.every, start_step, self._clock)
        self._guard(self._open, start_step)

    def _open(self, start_step: int) -> None:
        self._file = self._open_file(self.directory)
        self._file.session_start(start_step)
        log.info("TensorBoard summaries every %d steps in %s", self.every, self._file.path)

    def trained(self, step: int, steps: int, examples: int, loss: float | None, *, timed: bool = True) -> None:
        if self._window is None or self._file is None:
            return
        point = self._window.add(step, steps, examples, loss, timed=timed)
        if point is not None:
            self._guard(self._file.scalars, point.step, self._values(point))

    def eval(self, step: int, val_loss: float | None, val_accuracy: float | None) -> None:
        if self._file is not None:
            self._guard(self._file.scalars, step, {"val_loss": val_loss, "val_accuracy": val_accuracy})

    def close(self, step: int | None) -> None:
        """Writes the last partial interval (when ``step`` is known) and closes the file."""
        if self._file is None:
            return
        if step is not None and self._window is not None:
            point = self._window.flush(step)
            if point is not None:
                self._guard(self._file.scalars, point.step, self._values(point))
        if self._file is not None:
            self._guard(self._file.close)
        self._file = None

    def _values(self, point: SummaryPoint) -> dict[str, float | None]:
        return {"loss": point.loss, "steps_per_second": point.steps_per_second,
                "examples_per_second": point.examples_per_second,
                "learning_rate": self.learning_rate, "restarts": float(self.restarts)}

    def _guard(self, action: Callable[..., Any], *args: Any) -> None:
        try:
            action(*args)
        except Exception as e:  # noqa: BLE001 - summaries are an aid: training goes on without them
            log.warning("TensorBoard summaries turned off: %s: %s", type(e).__name__, e)
            self._file = None
