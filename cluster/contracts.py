"""Names that cross module boundaries, as ``str``-valued enums.

Each member *is* its string (``JobState.DONE == "done"``, ``json.dumps`` writes ``"done"``), so
state files and ``--json`` output are unchanged, while a misspelt name fails where it is
written instead of being silently ignored where it is read.
"""
from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A ``str`` enum whose ``str()`` and f-string form is its value (Python 3.10+)."""

    def __str__(self) -> str:
        return str(self.value)


class Mode(StrEnum):
    ASYNC = "async"
    SYNC = "sync"
    SYNC_PS = "sync-ps"


class Until(StrEnum):
    """When a ``pscluster run`` is over (``run --until``): once its chief exited (TFJob's success
    policy), once every chief and worker exited, or once every task exited."""

    CHIEF = "chief"
    WORKERS = "workers"
    ALL = "all"


class Role(StrEnum):
    CHIEF = "chief"
    PS = "ps"
    WORKER = "worker"
    EVALUATOR = "evaluator"


class ProcessKind(StrEnum):
    """Who started a process: ``up`` (a standing server, and a standby that a ``train`` takes
    over as one of its processes: roles/standby.py), ``train``, ``run`` or ``tensorboard``."""

    SERVER = "server"
    STANDBY = "standby"
    TRAIN = "train"
    PROGRAM = "run"
    TENSORBOARD = "tensorboard"


class ProcState(StrEnum):
    """A process as its host's monitor reports it."""

    RUNNING = "running"
    FROZEN = "frozen"        # stopped by a signal (SIGSTOP, a debugger)
    EXITED = "exited"        # with an exit code or a signal
    GONE = "gone"            # vanished without an exit record


class JobState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        return self in (JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)


class RestartPolicy(StrEnum):
    NEVER = "never"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


class TensorFlowNeed(StrEnum):
    """What preflight makes of a host without a usable TensorFlow (missing, too old, or another
    version than the other hosts')."""
    REQUIRED = "required"   # up, bench (and so train): standing servers, standbys and roles/ import it
    OPTIONAL = "optional"   # one-shot run: the user's program may not use TensorFlow; a warning


class ExitStatus(int, Enum):
    """Exit codes of every command."""

    OK = 0
    FAILURE = 1
    BAD_INPUT = 2
    DEADLINE = 4            # train --deadline reached (checkpoint saved)
    INTERRUPTED = 130
