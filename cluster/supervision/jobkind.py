"""What a job kind is to the executor: the :class:`JobKind` protocol, the :class:`Watched`
process the executor shows it, and the job's two unhappy endings (:class:`JobFailed`,
:class:`JobInterrupted`).

:class:`~cluster.supervision.executor.JobExecutor` runs every job the same way (record it,
launch, watch, decide, restart, stop); it holds one job kind and calls the kind's hooks for
what differs: ``train`` (:class:`cluster.supervision.train_job.TrainJob`) and ``run``
(:class:`cluster.supervision.program_job.ProgramJob`). Each hook is given the executor, which
holds the job's plan, state, streams and processes; a kind keeps only its own bookkeeping.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..contracts import ExitStatus, ProcessKind, ProcState, Role
from ..errors import PsclusterError
from ..hosts import hostops
from ..jobrecord import JobProgress
from ..plan import TaskSpec
from ..state import ProcessRecord
from . import core

if TYPE_CHECKING:
    from .executor import JobExecutor


class JobFailed(PsclusterError):
    """The job failed for good (policy or budget); ``cause`` is the root cause."""

    def __init__(self, cause: PsclusterError, *, prefix: str = "training failed"):
        self.cause = cause
        self.report: dict[str, Any] | None = None      # a failed run's report (program_job.reported)
        super().__init__(f"{prefix}: {cause.message}", hint=cause.hint)


class JobInterrupted(PsclusterError):
    exit_code = ExitStatus.INTERRUPTED


@dataclass
class Watched:
    """A live process of the job, as the executor tracks it (mutable; :meth:`view` snapshots)."""

    task: TaskSpec
    record: ProcessRecord
    kind: ProcessKind
    launched: float
    files: tuple[str, ...] = ()       # files whose new bytes the host streams (events, logs)
    state: ProcState = ProcState.RUNNING
    exit_code: int | None = None
    signal: int | None = None
    started: bool = False
    last_event: float = 0.0
    frozen_since: float | None = None
    done: bool = False
    finished: bool = False
    ended_at: float | None = None
    error: str | None = None          # its own "error" event, if any

    def view(self) -> core.Proc:
        return core.Proc(key=self.record.key, task=self.task.name, role=Role(self.task.role), host=self.task.host,
                         kind=self.kind, state=self.state, exit_code=self.exit_code, signal=self.signal,
                         launched=self.launched, frozen_since=self.frozen_since, started=self.started,
                         last_event=self.last_event, done=self.done, finished=self.finished)


class JobKind(Protocol):
    """What one kind of job supplies to the executor: how to launch a task, what the watched
    files say, the watchdog, the recovery table and when the job is complete.

    A kind subclasses this class (as torch elastic's agents subclass ``SimpleElasticAgent``):
    the hooks with ``...`` bodies are the ones every kind must have (mypy refuses a kind that
    lacks one); the others are optional, and their defaults here do nothing. Each hook is
    given the executor; what a kind changes of it goes through the executor's methods
    (:meth:`~cluster.supervision.executor.JobExecutor.replace_plan`, ``adopt``, ``forget``, ...),
    never by assigning its fields."""

    entry: str              # the job's kind as the job record and the run history name it: "train", "run"
    failure_prefix: str     # the start of a failure's message: "training failed", "run failed"
    one_shot: bool          # the cluster was brought up for this job alone (and goes down after it)

    # ------------------------------------------------------------------ what every kind has
    def job_name(self) -> str:
        """The job's name in its record (the training job; the program)."""
        ...

    def command(self) -> tuple[str, ...]:
        """What the run history shows as the job's command."""
        ...

    def watchdog(self, ex: JobExecutor[Any]) -> core.Watchdog:
        """What counts as a process that does not start, froze or stalls."""
        ...

    def prepare(self, ex: JobExecutor[Any]) -> None:
        """Before the first launch (sync code, check ports, ...)."""
        ...

    def launch_group(self, ex: JobExecutor[Any]) -> None:
        """Start the job's processes."""
        ...

    def relaunch(self, ex: JobExecutor[Any], task: TaskSpec) -> Watched:
        """Start a job process of ``task`` again (after a failure)."""
        ...

    def recovery(self, ex: JobExecutor[Any], incident: core.Incident) -> core.Recovery:
        """What a restart after ``incident`` stops and starts."""
        ...

    def on_chunk(self, ex: JobExecutor[Any], watched: Watched, chunk: hostops.FileChunk, now: float) -> None:
        """New bytes of one of ``watched.files``."""
        ...

    def complete(self, ex: JobExecutor[Any], now: float) -> bool:
        """True when the job is done (after stopping what must be stopped)."""
        ...

    def summary(self, ex: JobExecutor[Any]) -> dict[str, Any]:
        """The report of a job that is done."""
        ...

    def interrupted(self, ex: JobExecutor[Any]) -> tuple[str, str | None]:
        """The message and hint of :class:`JobInterrupted` once the job's processes were stopped."""
        ...

    # ------------------------------------------------------------------ optional: the defaults do nothing
    # (an explicit ``return``: a body of a docstring alone would make the hook required)
    def running(self, ex: JobExecutor[Any]) -> AbstractContextManager[None]:
        """Around the whole of :meth:`JobExecutor.run` (``train``: SIGUSR2 asks for a resize)."""
        return nullcontext()

    def new_job(self, ex: JobExecutor[Any], progress: JobProgress) -> JobProgress:
        """The job record at the start (``progress``, as the executor makes it, completed)."""
        return progress

    def between_turns(self, ex: JobExecutor[Any]) -> None:
        """Once per turn of the loop, before the streams are read (a resize, for ``train``)."""
        return None

    def on_exit(self, ex: JobExecutor[Any], watched: Watched, now: float) -> None:
        """``watched`` was just seen ended (exited or gone)."""
        return None

    def on_stopped(self, ex: JobExecutor[Any], records: list[ProcessRecord]) -> None:
        """``records`` were just stopped by the executor."""
        return None

    def drop_out(self, ex: JobExecutor[Any], host: str, why: str, task: str | None = None) -> bool:
        """Go on without ``host`` (or its ``task``): True if the job did; False (the default): it
        fails as before."""
        return False

    def out_in_place(self, ex: JobExecutor[Any]) -> set[str]:
        """Hosts of the plan whose standing servers are out of the job for now and must not be
        started by a recovery (``train``: an async worker host lost or drained in place); none
        by default."""
        return set()

    def before_interrupt(self, ex: JobExecutor[Any]) -> None:
        """On Ctrl-C, before the executor stops the job's processes (``train``: the leader checkpoints)."""
        return None

    def failure_hint(self, ex: JobExecutor[Any]) -> str | None:
        """More of the hint of :class:`JobFailed` (where a one-shot run's logs stay), or None."""
        return None
