"""The structured event stream a training process writes for the orchestrator.

The orchestrator never parses log text: it reads one JSON object per line from the
file named by ``roles.train --events PATH``. Every object carries ``event`` (the kind),
``ts`` (unix seconds) and ``task`` (``"chief:0"``, ``"worker:1"``); the remaining keys
depend on the kind and are listed in :data:`EVENT_FIELDS`, which is the contract the
orchestrator's reader is written against.

Each line is written with a single ``write`` and flushed at once, so a reader that
tails the file while training runs never sees half an object unless the process dies
mid-write; it should skip a trailing line that does not parse.

Who writes what: the chief (``chief:0`` in async mode, ``worker:0`` in the sync modes)
writes every kind (``placement`` only in async and sync-ps); the other sync workers
write ``start``, ``progress``, ``done`` (their ``val_*`` are null in sync-ps, where
only the chief evaluates) and ``error``.

Field meanings:

* ``start.restored_step`` / ``done.restored_step``: the global step the run resumed
  from, null when nothing was restored (no ``--resume``, or no checkpoint yet).
* ``start.global_batch_size``: examples behind one optimizer update; ``epochs``: the
  budget in epochs (derived from ``steps_total`` when the budget was given in steps).
* ``placement.variables``: ``[{"name", "device", "shape"}]`` for every variable
  (async: model, optimizer and step counter; sync-ps: all global variables).
* ``progress``: ``step`` is the global step; ``loss`` the mean training loss since
  the previous progress event (sync workers: over their own batches);
  ``examples_per_second`` the job's rate over that window; ``per_worker`` the rate
  per worker task as far as this process can tell (async: every worker, from which
  worker ran each closure; sync: this worker only). Optional ``work_from``/``work_to``: the
  wall times of the first and the last unit of work collected in the window, and ``gap`` the
  longest time between two units collected one after the other (the one before the window's
  first included): a pause finer than the reporting interval (benchmarks/drain.py).
* ``eval``: the chief's test-set evaluation at ``step``: every ``--eval-every`` steps
  and once at the end (the same numbers as ``done``); the trainer adds ``epoch``. In async mode training goes on
  while the chief evaluates, so ``step`` is the step when evaluation began. The side-car
  evaluator (``evaluator:0``, roles/evaluate.py) writes ``start``, one ``eval`` per
  checkpoint it evaluated (``step`` = the checkpoint's step), ``done`` (its last
  evaluation; ``examples_per_second`` null) and ``error``.
* ``checkpoint.path``: the checkpoint prefix as the chief sees it (relative paths
  stay relative to the chief's working directory).
* ``done``: ``wall_seconds`` from process start (including TensorFlow's import) to
  the end; ``examples_per_second`` over the training loop after its first call
  (tracing and start-up excluded), ``per_worker`` (optional) its split by worker as in
  ``progress``; ``checkpoint`` the last checkpoint or null.
* ``error``: ``message`` is the gist (TensorFlow's op-definition stack is left to
  the log), ``exception`` the exception type, or ``Terminated`` / ``StartTimeout`` /
  ``Crashed`` when the guardian process reports for a trainer that could not; ``Stopped``
  when the trainer checkpointed and ended on SIGTERM (checkpoint on stop, roles/guardian.py).
* ``membership`` (async chief): its answer to the orchestrator's request ``seq`` to change
  the workers in place (roles/membership.py): ``workers`` (the new count), ``step`` (the
  global step then), ``added``, ``removed``, ``seconds`` (the chief's pause), or only
  ``refused`` (the reason; nothing changed). A sync worker answers a request to release its
  port before a resize's next incarnation starts (roles/handover.py) with ``released`` (the
  listening sockets it shut) and ``step``. The async chief answers a request to cut a lost
  host's workers loose (``{"seq", "cut": [addresses]}``) with ``cut`` (the connections it shut).
* ``waiting`` (async chief): no closure has finished for a while and the oldest running one is
  ``worker``'s, running for ``seconds``; ``step`` is the global step the chief has collected
  (roles/closures.py). Repeated every few seconds while it lasts; not progress.
* ``worker`` (async chief): ``worker`` failed or was cut off and is out of the coordinator
  (``state`` "lost", ``reason`` the error), or answers again and trains again (``state``
  "back", ``reason`` how long it was out); ``step`` is the global step then
  (roles/workerloss.py). No checkpoint is restored either way.

This module imports no TensorFlow, so the orchestrator's tests may use it to write or
validate fixtures.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import IO, Any, Callable, Mapping

# Keys each kind of event carries besides "event", "ts" and "task".
EVENT_FIELDS: Mapping[str, tuple[str, ...]] = {
    "start": (
        "mode", "workers", "global_batch_size", "steps_total", "epochs",
        "learning_rate", "steps_per_execution", "restored_step",
    ),
    "placement": ("variables",),
    "progress": (
        "step", "steps_total", "epoch", "loss", "examples_per_second", "per_worker",
    ),
    "checkpoint": ("step", "path"),
    "eval": ("step", "val_loss", "val_accuracy"),
    "done": (
        "mode", "workers", "global_step", "val_loss", "val_accuracy", "wall_seconds",
        "examples_per_second", "checkpoint", "restored_step",
    ),
    "error": ("message", "exception"),
    "membership": ("seq",),
    "waiting": ("worker", "seconds", "step"),
    "worker": ("worker", "state", "reason", "step"),
}


def _plain(value: Any) -> Any:
    """Turns numpy/TensorFlow scalars into JSON values; NaN and inf become null.

    Why: json.dumps writes NaN as a bare ``NaN`` token, which strict JSON readers
    reject, and a diverging loss must not make the event file unreadable.
    """
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):  # numpy scalar or 0-d array
        return _plain(value.item())
    if hasattr(value, "numpy"):  # eager tensor
        return _plain(value.numpy())
    return str(value)


class EventWriter:
    """Appends events as JSON lines to one file, flushed per line.

    Thread-safe: the signal watcher may write an ``error`` event while the training
    loop is writing progress.
    """

    def __init__(self, path: str | os.PathLike[str], task: str,
                 clock: Callable[[], float] = time.time) -> None:
        self._path = os.fspath(path)
        self._task = task
        self._clock = clock
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(self._path))
        os.makedirs(parent, exist_ok=True)
        # Line-buffered append: each event is one write + flush.
        self._file: IO[str] | None = open(self._path, "a", encoding="utf-8", buffering=1)

    @property
    def path(self) -> str:
        return self._path

    @property
    def task(self) -> str:
        return self._task

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Writes one event; unknown kinds are refused so typos fail in tests."""
        if event not in EVENT_FIELDS:
            raise ValueError(f"unknown event kind {event!r}; known: {sorted(EVENT_FIELDS)}")
        missing = [k for k in EVENT_FIELDS[event] if k not in fields]
        if missing:
            raise ValueError(f"event {event!r} lacks fields {missing}")
        record = {"event": event, "ts": round(self._clock(), 3), "task": self._task}
        record.update(_plain(fields))
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            if self._file is None:
                return record
            self._file.write(line)
            self._file.flush()
        return record

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Reads an events file, skipping a torn last line (the writer died mid-line)."""
    events: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # only the final line may be torn
                break
            raise
    return events
