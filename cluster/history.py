"""The runs a cluster name has had, kept on the control machine after the cluster is gone.

Every job (``pscluster run``, and ``train``) gets a number that counts up per cluster name across
``up``/``down`` and one-shot runs, so its folder on each host (``.pscluster/<name>/job-<N>/``)
is its own: a later run never overwrites the log an earlier error quoted. One JSON file per
name, ``<state dir>/history/<name>.json``, holds a :class:`RunRecord` per run (command, times,
outcome, and each task's log with the host it is on, connection settings included), so
``pscluster logs --name NAME --run N`` reads a one-shot run's logs after its cluster was taken
down, and ``pscluster runs`` lists them. A name keeps its newest :data:`DEFAULT_KEEP` runs
(``run --keep N``, ``train --keep N``); older ones lose their record and their folders on the
hosts. A run that never recorded an end (its supervisor was killed, the machine went down) counts
too, once it started over :data:`STALE_AFTER` ago and its processes are gone (the caller says
which: see :func:`cluster.supervision.daemon.run_gone`). ``pscluster clean`` removes them sooner.

Writes are atomic (temporary file + rename) under the file's own lock, as the state's are.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .errors import StateError
from .inventory import ROLES
from .names import check_cluster_name
from .plan import HostSpec

DEFAULT_KEEP = 20          # runs per cluster name whose logs are kept (run --keep, train --keep)
# A run with no recorded end is pruned only when it started this long ago: a run that is only
# starting has recorded its start before its cluster's state names its processes.
STALE_AFTER = 3600.0
HISTORY_DIR = "history"


@dataclass(frozen=True)
class LogFile:
    """One process's log of a run: which task, on which host, where."""

    task: str
    host: str
    path: str
    attempt: int = 1


@dataclass(frozen=True)
class RunRecord:
    """One job of a cluster name: ``run`` (the user's program) or ``train``."""

    name: str
    id: int
    entry: str                          # "run" | "train"
    command: tuple[str, ...]            # run: the program's argv; train: the job's name
    started: float                      # wall time
    ended: float | None = None
    state: str = "running"              # contracts.JobState once ended
    exit_code: int | None = None        # what pscluster exited with (0 done, 1 failed, 130 stopped)
    one_shot: bool = False
    logs: tuple[LogFile, ...] = ()
    hosts: tuple[HostSpec, ...] = ()    # those holding the logs, as the plan reached them

    def host(self, name: str) -> HostSpec:
        return next(host for host in self.hosts if host.name == name)

    def job_dirs(self) -> dict[str, list[str]]:
        """Host -> the run's job folders there (the folder of each log)."""
        folders: dict[str, list[str]] = {}
        for log in self.logs:
            folder = log.path.rsplit("/", 1)[0]
            if folder not in folders.setdefault(log.host, []):
                folders[log.host].append(folder)
        return folders

    def latest_logs(self) -> list[LogFile]:
        """Each task's newest attempt, in plan order (chief, ps, worker, evaluator; by index)."""
        newest: dict[str, LogFile] = {}
        for log in self.logs:
            if log.task not in newest or log.attempt >= newest[log.task].attempt:
                newest[log.task] = log
        return sorted(newest.values(), key=lambda log: _task_order(log.task))

    def to_json(self) -> dict:
        from .state import host_json_defaults
        data = dataclasses.asdict(self)
        data["hosts"] = [host_json_defaults(host) for host in data["hosts"]]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RunRecord":
        from .state import host_from_json
        return cls(**dict(data, command=tuple(data["command"]), logs=tuple(LogFile(**log) for log in data["logs"]),
                          hosts=tuple(host_from_json(host) for host in data["hosts"])))


def _task_order(task: str) -> tuple[int, int, str]:
    role, _, index = task.partition(":")
    rank = ROLES.index(role) if role in ROLES else len(ROLES)
    return rank, int(index) if index.isdigit() else 0, task


class RunHistory:
    """The run records of every cluster name, under ``root`` (the state directory)."""

    def __init__(self, root: Path):
        self.folder = Path(root) / HISTORY_DIR

    def path(self, name: str) -> Path:
        return self.folder / f"{check_cluster_name(name)}.json"

    def names(self) -> list[str]:
        return sorted(path.stem for path in self.folder.glob("*.json")) if self.folder.is_dir() else []

    def load(self, name: str) -> list[RunRecord]:
        """``name``'s runs, oldest first."""
        from .state import check_trusted_dir, read_owned
        try:
            check_trusted_dir(self.folder)
            text = read_owned(self.path(name))
        except FileNotFoundError:
            return []
        try:
            return [RunRecord.from_json(item) for item in json.loads(text)]
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"run history {self.path(name)} is unreadable: {exc}",
                             hint="move it away; the runs it lists lose their 'pscluster logs --run'") from None

    def find(self, name: str, run: int | None = None) -> RunRecord | None:
        """Run ``run`` of ``name`` (None: its newest), or None."""
        records = self.load(name)
        if run is None:
            return records[-1] if records else None
        return next((record for record in records if record.id == run), None)

    def last_id(self, name: str) -> int:
        return max((record.id for record in self.load(name)), default=0)

    def save(self, record: RunRecord) -> None:
        """Add ``record``, or replace the one with its id."""
        with self._locked(record.name):
            records = [item for item in self.load(record.name) if item.id != record.id]
            self._write(record.name, sorted(records + [record], key=lambda item: item.id))

    def forget(self, name: str, ids: Sequence[int]) -> None:
        with self._locked(name):
            self._write(name, [item for item in self.load(name) if item.id not in set(ids)])

    def beyond(self, name: str, keep: int, *, gone: Callable[[RunRecord], bool] | None = None,
               now: float | None = None) -> list[RunRecord]:
        """The runs of ``name`` older than its newest ``keep`` (the ones to remove): those that
        ended, and those with no recorded end that started over :data:`STALE_AFTER` before ``now``
        and whose processes are ``gone`` (without ``gone``, none of those)."""
        records = self.load(name)
        old = records[:max(0, len(records) - keep)]
        before = (time.time() if now is None else now) - STALE_AFTER
        return [record for record in old if record.ended is not None
                or (gone is not None and record.started < before and gone(record))]

    def _write(self, name: str, records: list[RunRecord]) -> None:
        path = self.path(name)
        if not records:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        from .state import write_private_json
        write_private_json(path, [record.to_json() for record in records], indent=1)

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        from .state import file_lock, private_dir
        private_dir(self.folder)
        with file_lock(self.folder / f"{check_cluster_name(name)}.lock"):
            yield




def remove_runs(history: RunHistory, records: Sequence[RunRecord], pool) -> tuple[int, list[str]]:
    """Remove ``records``' job folders on their hosts, then the records of those fully removed.

    Returns: how many runs were removed, and a line per host that could not be cleaned (its
    runs stay recorded, to retry).
    """
    from .hosts import hostops
    from .errors import PsclusterError
    problems: list[str] = []
    done: set[tuple[str, int]] = set()
    for record in records:
        failed = False
        for host, folders in record.job_dirs().items():
            try:
                hostops.remove_job_dirs(pool.get(record.host(host)), folders)
            except PsclusterError as exc:
                failed = True
                problems.append(f"could not remove run {record.id} of {record.name!r} on {host}: "
                                f"{exc.message.splitlines()[0]}")
        if not failed:
            done.add((record.name, record.id))
    for name in sorted({name for name, _ in done}):
        history.forget(name, [run for owner, run in done if owner == name])
    return len(done), problems
