"""Progress reporting without a console: the launcher, preflight and supervisor emit events;
the CLI renders them with rich (:mod:`cluster.console`), tests record them.

Event kinds and their fields:

``phase``          name, detail
``check``          host, check, ok, detail                  (preflight, one per host and check)
``sync``           host, files, bytes, skipped
``task-starting``  task, host
``task-started``   task, host, pid
``task-ready``     task, host, devices, seconds
``task-failed``    task, host, error
``task-stopped``   task, host, signals, found
``host-failed``    host, error
``message``        text, level ("info" | "warning" | "error")
``job``            state, and training fields (step, loss, examples_per_second, ...)
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


class Reporter:
    """Receives events; the base class ignores them."""

    def emit(self, kind: str, **data: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RecordingReporter(Reporter):
    """Keeps every event (for tests and for summaries)."""

    def __init__(self):
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, **data: Any) -> None:
        with self._lock:
            self.events.append(Event(kind, data))

    def of(self, kind: str) -> list[Event]:
        return [event for event in self.events if event.kind == kind]


class TeeReporter(Reporter):
    """Sends each event to several reporters."""

    def __init__(self, *reporters: Reporter):
        self.reporters = reporters

    def emit(self, kind: str, **data: Any) -> None:
        for reporter in self.reporters:
            reporter.emit(kind, **data)

    def close(self) -> None:
        for reporter in self.reporters:
            reporter.close()
