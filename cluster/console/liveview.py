"""The live view of a training job, the pure part: rates, ETA and number formats.

:class:`TrainView` folds the cluster's events (``job``, ``eval``, ``job-state``) into a
:class:`Frame`, what the console draws (a bar on a terminal, plain lines in a pipe: see
:class:`cluster.console.TrainDisplay`). Clocks are passed in, so every number here is checked
by hand in ``tests/unit/test_liveview.py``.

* **Epochs** are shown to one decimal everywhere (:func:`fmt_epoch`).
* **Per-worker rates** are each worker's reported rates averaged over the last
  :data:`RATE_WINDOW` seconds, each weighted by the time since the one before
  (:class:`RateWindow`): two reports that arrive 1 ms apart (one chunk of the watch stream)
  move the average by a thousandth of a second's worth, never to the rate of a 1 ms window.
* **ETA** is the steps left divided by the step rate over the last :data:`ETA_WINDOW` seconds,
  once the samples span at least :data:`ETA_MIN_SPAN` seconds (before that: unknown). Steps
  that go back (a restart resumed from a checkpoint) start the measurement again.
* **Resizes** (a ``resized`` job state) set who is in the job: rows of workers that left go
  (with their rates), a worker that joined gets a row at once, and a late report of one that
  left does not bring its row back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

RATE_WINDOW = 10.0          # seconds of reports a per-worker rate averages
FIRST_WEIGHT = 1.0          # weight of a worker's first report (no report before it to measure from)
ETA_WINDOW = 60.0           # seconds of steps the ETA's rate is measured over
ETA_MIN_SPAN = 5.0          # no ETA from steps that span less than this
PLAIN_SECONDS = 10.0        # not on a terminal: a progress line at most this often


def fmt_epoch(epoch: float | None) -> str:
    return "" if epoch is None else f"{epoch:.1f}"


def fmt_duration(seconds: float | None) -> str:
    """``0:07``, ``12:05``, ``1:02:03``; ``--:--`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    whole = int(seconds + 0.5)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def fmt_rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate:,.0f}"


def fmt_loss(loss: float | None) -> str:
    return "" if loss is None else f"{loss:.4f}"


class RateWindow:
    """A time-weighted mean of reported rates over the last ``span`` seconds (module docstring)."""

    def __init__(self, span: float = RATE_WINDOW):
        self.span = span
        self._samples: list[tuple[float, float, float]] = []      # (arrival, rate, weight)

    def add(self, now: float, rate: float) -> None:
        weight = now - self._samples[-1][0] if self._samples else FIRST_WEIGHT
        self._samples.append((now, float(rate), max(weight, 0.0)))
        self._samples = [s for s in self._samples if s[0] > now - self.span] or self._samples[-1:]

    def value(self) -> float | None:
        if not self._samples:
            return None
        total = sum(weight for _, _, weight in self._samples)
        if total <= 0:
            return self._samples[-1][1]
        return sum(rate * weight for _, rate, weight in self._samples) / total


class StepRate:
    """Steps per second over the last ``span`` seconds, for the ETA (module docstring)."""

    def __init__(self, span: float = ETA_WINDOW, min_span: float = ETA_MIN_SPAN):
        self.span = span
        self.min_span = min_span
        self._samples: list[tuple[float, int]] = []

    def add(self, now: float, step: int) -> None:
        if self._samples and step < self._samples[-1][1]:
            self._samples = []           # resumed from an earlier checkpoint: measure again
        self._samples.append((now, step))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.span:
            self._samples.pop(0)

    def value(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        if t1 - t0 < self.min_span:
            return None
        return (s1 - s0) / (t1 - t0)

    def eta(self, step: int | None, total: int | None) -> float | None:
        rate = self.value()
        if step is None or not total or not rate or rate <= 0:
            return None
        return max(total - step, 0) / rate


@dataclass(frozen=True)
class WorkerLine:
    name: str
    step: int | None = None
    epoch: float | None = None
    loss: float | None = None
    rate: float | None = None


@dataclass(frozen=True)
class Frame:
    """What the live view shows at one moment."""

    title: str
    state: str
    step: int | None
    total: int | None
    epoch: float | None
    loss: float | None
    rate: float | None
    elapsed: float | None
    eta: float | None
    workers: tuple[WorkerLine, ...] = ()

    @property
    def fraction(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return min(self.step / self.total, 1.0)


@dataclass
class TrainView:
    """Folds events into frames; ``now`` is a monotonic clock, ``wall`` the wall clock."""

    job: dict = field(default_factory=dict)
    workers: dict[str, dict] = field(default_factory=dict)
    rates: dict[str, RateWindow] = field(default_factory=dict)
    job_rate: RateWindow = field(default_factory=RateWindow)
    steps: StepRate = field(default_factory=StepRate)
    self_reported: set[str] = field(default_factory=set)
    members: set[str] | None = None     # the workers since the last resize (None: no resize yet)
    began: float | None = None          # wall time the job started (its record's ``started``)
    ended: float | None = None
    progressed: bool = False

    def update(self, kind: str, data: Mapping[str, Any], *, now: float, wall: float) -> None:
        if kind == "job-state" and data.get("event") == "started":
            # the job record's start (before code sync and launch), as the final report counts
            started = (data.get("report") or {}).get("started") or data.get("time") or wall
            self.began = self.began or float(started)
        elif kind == "job-state" and data.get("event") in ("finished", "deadline", "failed", "stopped"):
            self.ended = float(data.get("time") or wall)       # elapsed stops with the job
        elif kind == "job-state" and data.get("event") == "resized":
            self._resized((data.get("report") or {}).get("new"))
        if kind != "job":
            return
        worker_progress = data.get("worker_progress")
        fields = {key: value for key, value in data.items() if key != "worker_progress"}
        self.job.update(fields)
        if fields.get("started") and self.began is None:
            self.began = float(fields["started"])
        if fields.get("step") is not None:
            self.progressed = True
            self.steps.add(now, int(fields["step"]))
            if fields.get("examples_per_second") is not None:
                self.job_rate.add(now, fields["examples_per_second"])
        for worker, rate in (fields.get("per_worker") or {}).items():
            if worker not in self.self_reported and self._member(worker):   # sync workers report their own rate (below)
                self._rate(worker, now, rate)
        if worker_progress and self._member(worker_progress[0]):    # sync, sync-ps: each worker's own progress
            worker, info = worker_progress
            self.progressed = True
            self.self_reported.add(worker)
            self.workers.setdefault(worker, {}).update(
                {key: info.get(key) for key in ("step", "epoch", "loss") if key in info})
            self._rate(worker, now, info.get("rate"))

    def _member(self, worker: str) -> bool:
        return self.members is None or worker in self.members

    def _resized(self, new: Any) -> None:
        """Keep the rows of the workers in ``new`` (``{"worker": ["worker:0@h1", ...], ...}``, or
        a list of task names when a one-shot run dropped some) and add a row for each that joined."""
        names = [name for role, tasks in new.items() if role == "worker" for name in tasks] \
            if isinstance(new, dict) else list(new) if isinstance(new, list) else None
        if names is None:
            return
        self.members = {str(name).partition("@")[0] for name in names}
        for gone in set(self.workers) - self.members:
            self.workers.pop(gone, None)
            self.rates.pop(gone, None)
            self.self_reported.discard(gone)
        for joined in self.members:
            self.workers.setdefault(joined, {})

    def _rate(self, worker: str, now: float, rate: float | None) -> None:
        self.workers.setdefault(worker, {})
        if rate is not None:
            self.rates.setdefault(worker, RateWindow()).add(now, rate)

    def frame(self, *, wall: float) -> Frame:
        job = self.job
        step, total = job.get("step"), job.get("steps_total")
        workers = tuple(WorkerLine(name, info.get("step"), info.get("epoch"), info.get("loss"),
                                   self.rates[name].value() if name in self.rates else None)
                        for name, info in sorted(self.workers.items()))
        title = f"{job.get('job', '')} ({job.get('mode', '')}, {job.get('workers', '?')} worker(s))"
        return Frame(title=title, state=str(job.get("state", "")), step=step, total=total, epoch=job.get("epoch"),
                     loss=job.get("loss"), rate=self.job_rate.value(),
                     elapsed=None if self.began is None else max((self.ended or wall) - self.began, 0.0),
                     eta=self.steps.eta(step, total), workers=workers)


def progress_line(frame: Frame) -> str:
    """One plain line: ``step 1200/5000 (24%)  epoch 0.4  loss 0.3121  9,800 examples/s  elapsed 1:02  ETA 3:15``."""
    parts = []
    if frame.step is not None:
        total = f"/{frame.total}" if frame.total else ""
        share = f" ({frame.fraction:.0%})" if frame.fraction is not None else ""
        parts.append(f"step {frame.step}{total}{share}")
    if frame.epoch is not None:
        parts.append(f"epoch {fmt_epoch(frame.epoch)}")
    if frame.loss is not None:
        parts.append(f"loss {fmt_loss(frame.loss)}")
    if frame.rate is not None:
        parts.append(f"{fmt_rate(frame.rate)} examples/s")
    parts.append(f"elapsed {fmt_duration(frame.elapsed)}")
    if frame.total:
        parts.append(f"ETA {fmt_duration(frame.eta)}")
    return "  ".join(parts)


def workers_line(frame: Frame) -> str:
    """``workers: worker:0 4,900/s, worker:1 4,850/s`` (rates over the last RATE_WINDOW seconds)."""
    shown = []
    for worker in frame.workers:
        detail = [f"{fmt_rate(worker.rate)}/s"] if worker.rate is not None else []
        if worker.step is not None and worker.step != frame.step:
            detail.append(f"step {worker.step}")
        shown.append(" ".join([worker.name, *detail]))
    return "workers: " + ", ".join(shown) if shown else ""


def eval_line(data: Mapping[str, Any]) -> str:
    """``eval at step 1200 (epoch 0.4): val_loss 0.2711  val_accuracy 0.9213  after 1:02``."""
    epoch = f" (epoch {fmt_epoch(data['epoch'])})" if data.get("epoch") is not None else ""
    parts = [f"eval at step {data.get('step')}{epoch}:"]
    if data.get("val_loss") is not None:
        parts.append(f"val_loss {data['val_loss']:.4f}")
    if data.get("val_accuracy") is not None:
        parts.append(f"val_accuracy {data['val_accuracy']:.4f}")
    if data.get("seconds") is not None:
        parts.append(f"after {fmt_duration(data['seconds'])}")
    task = data.get("task")
    if task and str(task).startswith("evaluator"):
        parts.append(f"({task})")       # the side-car evaluator's, not the leader's own
    return "  ".join(parts)


@dataclass
class Throttle:
    """True at most once per ``seconds`` (the first call included)."""

    seconds: float = PLAIN_SECONDS
    last: float | None = None

    def ready(self, now: float) -> bool:
        if self.last is not None and now - self.last < self.seconds:
            return False
        self.last = now
        return True
