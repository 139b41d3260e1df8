"""Reading task logs from their hosts: one task, or all with a ``[task@host]`` prefix per line;
of the cluster that is up (its state), or of an earlier run (its record in cluster/history.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .hosts import hostops
from .errors import PsclusterError, UsageError
from .history import RunRecord
from .plan import HostSpec, TaskSpec
from .state import RunState
from .transport import TransportPool


@dataclass
class _Cursor:
    task: str
    host: HostSpec
    path: str
    offset: int = 0
    partial: str = ""


def log_path(state: RunState, task: TaskSpec) -> str:
    """The newest log of a task (a restarted task writes ``worker-0.2.log`` and so on)."""
    record = state.latest(task.name)
    return record.log if record is not None else task.log_path


def select_tasks(state: RunState, name: str | None) -> list[TaskSpec]:
    if name is None:
        return list(state.plan.tasks)
    try:
        return [state.plan.task(name)]
    except StopIteration:
        known = ", ".join(task.name for task in state.plan.tasks)
        raise UsageError(f"no task {name!r} in cluster {state.name!r}", hint=f"tasks: {known}") from None


def stream_logs(state: RunState, tasks: Sequence[TaskSpec], pool: TransportPool, write: Callable[[str], None], *,
                lines: int | None = None, follow: bool = False, prefix: bool = True, poll: float = 0.5,
                should_stop: Callable[[], bool] = lambda: False) -> None:
    """Write log lines of ``tasks``; with ``follow``, keep writing new lines until stopped."""
    cursors = [_Cursor(task.name, state.plan.host(task.host), log_path(state, task)) for task in tasks]
    _stream(cursors, pool, write, lines=lines, follow=follow, prefix=prefix, poll=poll, should_stop=should_stop)


def select_run_logs(record: RunRecord, task: str | None) -> list[tuple[str, str, str]]:
    """(task, host, log) of each task of an earlier run (its newest attempt), or of ``task``.

    Raises:
        UsageError: the run has no such task.
    """
    logs = record.latest_logs()
    chosen = [log for log in logs if task is None or log.task == task]
    if task is not None and not chosen:
        known = ", ".join(log.task for log in logs) or "none"
        raise UsageError(f"run {record.id} of {record.name!r} has no task {task!r}", hint=f"its tasks: {known}")
    return [(log.task, log.host, log.path) for log in chosen]


def stream_run_logs(record: RunRecord, task: str | None, pool: TransportPool, write: Callable[[str], None], *,
                    lines: int | None = None, follow: bool = False, prefix: bool = True) -> None:
    """``logs --run N``: an earlier run's logs, read from the hosts its record names; ``follow``
    only while it still runs."""
    cursors = [_Cursor(name, record.host(host), path) for name, host, path in select_run_logs(record, task)]
    _stream(cursors, pool, write, lines=lines, follow=follow and record.ended is None, prefix=prefix)


def _stream(cursors: list[_Cursor], pool: TransportPool, write: Callable[[str], None], *, lines: int | None,
            follow: bool, prefix: bool, poll: float = 0.5, should_stop: Callable[[], bool] = lambda: False) -> None:
    for cursor in cursors:
        transport = pool.get(cursor.host)
        try:
            if lines is not None:
                tail = hostops.read(transport, cursor.path, offset=-(200 * lines + 4096), limit=1 << 22)
                kept = tail.data.splitlines(keepends=True)[-lines:] if lines else []
                _emit(cursor, "".join(kept), write, prefix)
                cursor.offset = tail.end
            else:
                _drain(cursor, transport, write, prefix)
        except PsclusterError as exc:
            write(f"[{cursor.task}@{cursor.host.name}] (log unavailable: {exc.message.splitlines()[0]})\n")
    while follow and not should_stop():
        time.sleep(poll)
        for cursor in cursors:
            try:
                _drain(cursor, pool.get(cursor.host), write, prefix)
            except PsclusterError:
                continue


def _drain(cursor: _Cursor, transport, write, prefix: bool) -> None:
    while True:
        chunk = hostops.read(transport, cursor.path, offset=cursor.offset, limit=1 << 20)
        if not chunk.data:
            return
        cursor.offset = chunk.end
        _emit(cursor, chunk.data, write, prefix)
        if chunk.end >= chunk.size:
            return


def _emit(cursor: _Cursor, data: str, write, prefix: bool) -> None:
    text = cursor.partial + data
    lines = text.split("\n")
    cursor.partial = lines.pop()
    label = f"[{cursor.task}@{cursor.host.name}] " if prefix else ""
    for line in lines:
        write(f"{label}{line}\n")
