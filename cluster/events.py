"""Progress reporting without a console: lifecycle, preflight and supervision emit events;
the CLI renders them with rich (:mod:`cluster.console`), tests record them.

Every event kind is a frozen dataclass below (the contract between emitters and renderers,
as ``roles/events.py`` is on the host side). ``Reporter.emit(kind, **fields)`` builds that
dataclass first, so an unknown kind or a misspelt, missing or extra field fails loudly at
the emitter (:class:`UnknownEvent`) instead of being dropped by a renderer; reporters then
receive the validated fields in :meth:`Reporter.handle`.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .jobrecord import JobProgress


class UnknownEvent(ValueError):
    """An event kind nobody declared, or fields its dataclass does not have: a bug in the emitter."""


@dataclass(frozen=True)
class Phase:
    name: str
    detail: str = ""


@dataclass(frozen=True)
class Check:
    """One preflight check on one host; ``warning``: it passed, but the user should read it
    (a one-shot run's host without TensorFlow)."""
    host: str
    check: str
    ok: bool
    detail: str
    hint: str | None = None
    warning: bool = False


@dataclass(frozen=True)
class Sync:
    host: str
    files: int
    bytes: int
    unchanged: int
    skipped: bool
    shared_with: str | None = None    # another host of the same filesystem copied for this one
    relayed_from: str | None = None   # the host it fetched the files from (the relay, issue 46)
    relay_error: str | None = None    # its relay failed: synced directly, this is why


@dataclass(frozen=True)
class TaskStarting:
    task: str
    host: str


@dataclass(frozen=True)
class TaskStarted:
    task: str
    host: str
    pid: int | None


@dataclass(frozen=True)
class TaskReady:
    task: str
    host: str
    devices: Sequence[str]
    seconds: float


@dataclass(frozen=True)
class TaskFailed:
    task: str
    host: str
    error: str


@dataclass(frozen=True)
class TaskStopped:
    task: str
    host: str
    signals: Sequence[str]
    found: bool


@dataclass(frozen=True)
class TaskLost:
    """Tasks (comma-separated) lost with their host."""
    task: str
    host: str
    detail: str


@dataclass(frozen=True)
class TaskRestarting:
    task: str
    host: str
    detail: str
    attempt: int
    delay: float


@dataclass(frozen=True)
class TaskRestarted:
    task: str
    host: str
    detail: str


@dataclass(frozen=True)
class TaskExited:
    """A `run` program's process ended."""
    task: str
    host: str
    exit_code: int | None
    signal: str | int | None
    detail: str


@dataclass(frozen=True)
class Output:
    """One line a `run` program printed."""
    task: str
    host: str
    line: str


@dataclass(frozen=True)
class JobStateChange:
    """The job started, restarted a task, failed, finished, reached ``--deadline`` or was
    stopped (``event``, one of :data:`cluster.notify.notifier.EVENTS`); ``time`` is wall-clock seconds.
    ``report`` says more: the job record when it starts, the task restarted, the failure, the
    final report. Notifications (:mod:`cluster.notify.notifier`) are built from it."""
    cluster: str
    job: str
    job_id: int
    entry: str                   # "train" or "run"
    event: str
    time: float
    report: Mapping[str, Any]


@dataclass(frozen=True)
class EvalResult:
    """A test-set evaluation at ``step``: the side-car evaluator's (one per checkpoint) or the
    leader's own (``--eval-every``, and the final one); ``seconds`` since train started."""
    step: int | None
    val_loss: float | None
    val_accuracy: float | None
    seconds: float | None = None
    epoch: float | None = None
    task: str | None = None


@dataclass(frozen=True)
class HostFailed:
    host: str
    error: str


@dataclass(frozen=True)
class Message:
    text: str
    level: str = "info"          # "info" | "warning" | "error"


@dataclass(frozen=True)
class BenchConfig:
    index: int
    total: int
    mode: str
    workers: int
    placement: str
    repeat: int
    name: str


@dataclass(frozen=True)
class BenchResult:
    result: Any                  # cluster.bench.study.ConfigResult (bench imports this module)


# `job` carries any fields of the job record (JobProgress), and a sync worker's own progress.
_JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(JobProgress)) | {"worker_progress"}

EVENT_TYPES: Mapping[str, type] = {
    "phase": Phase, "check": Check, "sync": Sync, "task-starting": TaskStarting, "task-started": TaskStarted,
    "task-ready": TaskReady, "task-failed": TaskFailed, "task-stopped": TaskStopped, "task-lost": TaskLost,
    "task-restarting": TaskRestarting, "task-restarted": TaskRestarted, "task-exited": TaskExited,
    "output": Output, "host-failed": HostFailed, "message": Message, "bench-config": BenchConfig,
    "bench-result": BenchResult, "job-state": JobStateChange, "eval": EvalResult,
}


def validated(kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The event's fields, defaults filled in, after checking them against its dataclass.

    Raises:
        UnknownEvent: an undeclared kind, or fields that kind does not take or lacks.
    """
    if kind == "job":
        unknown = set(data) - _JOB_FIELDS
        if unknown:
            raise UnknownEvent(f"event 'job' has no field(s) {', '.join(sorted(unknown))}")
        return dict(data)
    event_type = EVENT_TYPES.get(kind)
    if event_type is None:
        raise UnknownEvent(f"unknown event kind {kind!r}; declare it in cluster/events.py")
    try:
        event = event_type(**data)
    except TypeError as exc:
        raise UnknownEvent(f"event {kind!r}: {exc}") from None
    names = _FIELD_NAMES.get(event_type)
    if names is None:       # kept per type: ~10 events a host in `up` (issue 46)
        names = _FIELD_NAMES[event_type] = tuple(f.name for f in dataclasses.fields(event))
    return {name: getattr(event, name) for name in names}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


# Events come from the fan-out's threads too (a task started on each host at once); the consoles
# keep state (rich's progress rows) that two handlers at once corrupted ("KeyError: 1" from
# rich's Progress.update in `up`, with a traceback). One event is handled at a time.
_HANDLING = threading.RLock()


class Reporter:
    """Receives events: :meth:`emit` validates one, :meth:`handle` (overridden) acts on it;
    the base class ignores them. Events are handled one at a time, from any thread."""

    def emit(self, kind: str, **data: Any) -> None:
        event = validated(kind, data)
        with _HANDLING:
            self.handle(kind, **event)

    def handle(self, kind: str, **data: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RecordingReporter(Reporter):
    """Keeps every event (for tests and for summaries)."""

    def __init__(self):
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def handle(self, kind: str, **data: Any) -> None:
        with self._lock:
            self.events.append(Event(kind, data))

    def of(self, kind: str) -> list[Event]:
        return [event for event in self.events if event.kind == kind]


class TeeReporter(Reporter):
    """Sends each event to several reporters."""

    def __init__(self, *reporters: Reporter):
        self.reporters = reporters

    def handle(self, kind: str, **data: Any) -> None:
        for reporter in self.reporters:
            reporter.handle(kind, **data)

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()
