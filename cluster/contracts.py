"""Names that cross module boundaries, as ``str``-valued enums.

Each member *is* its string (``JobState.DONE == "done"``, ``json.dumps`` writes ``"done"``), so
state files and ``--json`` output are unchanged, while a misspelt name fails where it is
written instead of being silently ignored where it is read.
"""
from __future__ import annotations

from collections.abc import Collection
from enum import Enum, IntEnum


class StrEnum(str, Enum):
    """A ``str`` enum whose ``str()`` and f-string form is its value (Python 3.10+)."""

    def __str__(self) -> str:
        return str(self.value)


class Mode(StrEnum):
    ASYNC = "async"
    SYNC = "sync"
    SYNC_PS = "sync-ps"


MODES: tuple[str, ...] = tuple(mode.value for mode in Mode)
# Which roles take part in each mode's cluster spec, and which of them stand (started by `up`).
MODE_ROLES: dict[str, tuple[tuple[str, bool], ...]] = {
    Mode.ASYNC.value: (("chief", False), ("ps", True), ("worker", True)),
    Mode.SYNC.value: (("worker", False),),
    Mode.SYNC_PS.value: (("ps", True), ("worker", False)),
}
# The inventory's optional group of hosts that may take a ps moved off a host lost for good
# (cluster/supervision/core.py place_lost_ps): they run nothing until then.
PS_SPARE_GROUP = "ps_spare"
DEFAULT_MODE = Mode.ASYNC       # without --mode and pscluster_mode, where the inventory has a chief
# Other names of a mode, accepted wherever a mode is (--mode, pscluster_mode) and stored as the
# mode itself. sync-ps is the shape of TF1's between-graph replication (ps + workers, worker 0 the
# chief); whether its updates are synchronous is the program's choice (SyncReplicasOptimizer or
# not), so a TF1 *async* program runs as "between-graph", not as a contradiction in terms.
MODE_ALIASES = {"between-graph": Mode.SYNC_PS.value}
MODE_NAMES = MODES + tuple(MODE_ALIASES)


def canonical_mode(name: str) -> str:
    """The mode ``name`` stands for (itself, or the mode an alias names)."""
    return MODE_ALIASES.get(name, name)


def default_mode(roles: Collection[str]) -> Mode:
    """The mode when neither ``--mode`` nor ``pscluster_mode`` names one, from the roles the
    inventory defines: :data:`DEFAULT_MODE` (async) where a chief can run the ClusterCoordinator,
    else sync-ps with parameter servers (TF1's between-graph shape), else sync (workers only).
    The one rule for ``plan``, ``up``, ``train`` and a one-shot ``run`` (which then starts every
    role the inventory defines), so that they never disagree on an inventory."""
    if "chief" in roles or not roles:
        return DEFAULT_MODE
    return Mode.SYNC_PS if "ps" in roles else Mode.SYNC


def describe_default_mode(roles: Collection[str]) -> str:
    """What ``plan`` says when :func:`default_mode` chose the mode."""
    mode = default_mode(roles)
    defined = ", ".join(roles) or "no role"
    return (f"mode {mode}: the default for an inventory with {defined} (no --mode, no pscluster_mode; "
            "async with a chief, else sync-ps with ps, else sync); 'pscluster run' without --mode "
            f"starts every role it defines ({defined})")


def resolve_mode(*given: str | None, roles: Collection[str] = ()) -> str:
    """The mode of a command: the first of ``given`` that is set (``--mode``, then the
    inventory's ``pscluster_mode``), else :func:`default_mode` of the inventory's ``roles``;
    aliases resolved."""
    return canonical_mode(next((name for name in given if name), default_mode(roles).value))


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


class Phase(StrEnum):
    """Where a cluster is in its life (``RunState.phase`` in its state file). Transitions:

    - ``STARTING`` -> ``UP``: ``up`` started the servers and they answer (and the standbys started);
    - ``STARTING`` -> ``FAILED``: ``up`` rolled back (the state says why and keeps what it could
      not stop, for ``down``);
    - any -> ``STOPPING``: ``down`` began; a command that expects the phase it saw (``StateWriter``)
      aborts from then on. ``down`` then deletes the state, or leaves it ``STOPPING`` with what it
      could not stop.

    ``DOWN`` is never written (``down`` deletes the state); a state in it, as in ``FAILED``, is
    :attr:`ended`. ``train``, ``run``, ``scale`` and ``tensorboard`` need ``UP``."""

    STARTING = "starting"
    UP = "up"
    FAILED = "failed"
    STOPPING = "stopping"
    DOWN = "down"

    @property
    def ended(self) -> bool:
        """Nothing of the cluster is meant to run any more: a new ``up`` may take its name."""
        return self in (Phase.FAILED, Phase.DOWN)


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


# Seconds between SIGTERM and SIGKILL when pscluster stops a process (down, stop-job, a restart).
DEFAULT_GRACE = 10.0
# The same, when pscluster cleans up after a failure (a failed job's processes, an orphaned job's, an
# `up` rolled back, what a lost host still runs when it answers again): short, since nothing there
# has a state to save, and the user waits on it.
CLEANUP_GRACE = 3.0
# train --stop-grace: seconds the job has to checkpoint on stop before its processes are killed.
DEFAULT_STOP_GRACE = 30.0


class ExitStatus(IntEnum):
    """Exit codes of every command (an int: printed, compared and stored as its number)."""

    OK = 0
    FAILURE = 1
    BAD_INPUT = 2
    DEADLINE = 4            # train --deadline reached (checkpoint saved)
    INTERRUPTED = 130
