"""The job record: what a ``train`` or ``run`` job is doing, kept in the cluster state.

``status``, the live display, ``bench``, ``--json`` and the fault tests read it, so it is one
typed value instead of a dict with implied keys. Its JSON form (``to_json``) is the
``"job"`` object of the state file and of ``status --json``: only fields that are set appear.

A record of the house (docs/architecture.md, "Records"), written by the supervision: it imports only
the contracts, so cluster/state.py and cluster/events.py read it without importing any supervisor.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .contracts import ExitStatus, JobState


def job_exit_status(state: JobState, result: Mapping[str, Any] | None = None) -> ExitStatus:
    """What ``train``/``run`` exit with for a job that ended in ``state`` with the final report
    ``result``: 0 done, 4 done at ``--deadline``, 1 failed, 130 stopped (Ctrl-C, ``stop-job``).
    The one mapping: the run history records it, ``attach`` exits with it."""
    if state is JobState.DONE:
        return ExitStatus.DEADLINE if (result or {}).get("deadline_reached") else ExitStatus.OK
    if state is JobState.STOPPED:
        return ExitStatus.INTERRUPTED
    return ExitStatus.FAILURE


@dataclass(frozen=True)
class Orchestrator:
    """The ``pscluster`` process supervising a job (to tell a live job from an orphan).

    ``starttime`` (the kernel's, from ``/proc/PID/stat``) guards against a reused PID;
    ``detached`` marks the daemon of ``train --detach`` / ``run --detach``, whose own ``log``
    (text) and ``events`` (one JSON event a line, what ``attach`` replays) live in the state
    directory (see :mod:`cluster.supervision.daemon`).
    """

    pid: int
    host: str
    starttime: str | None = None
    detached: bool = False
    log: str | None = None
    events: str | None = None


@dataclass(frozen=True)
class JobProgress:
    """One job on one cluster: identity, state, and the leader's latest progress."""

    id: int
    job: str                                  # the job's name (``distributed_mnist``) or the program
    mode: str
    state: JobState = JobState.STARTING
    entry: str = "train"                      # the door it came through: "train" (job API) or "run"
    started: float | None = None
    ended: float | None = None
    orchestrator: Orchestrator | None = None
    heartbeat: float | None = None            # wall time of the supervisor's last loop turn (about 1 s apart)
    # What the supervisor's watch streams said, written with the heartbeat: ``status`` answers
    # from these for the hosts heard lately instead of asking every host (issue 46).
    hosts_heard: Mapping[str, float] | None = None    # host -> wall time its watch stream was last heard
    proc_states: Mapping[str, str] | None = None      # process record key -> its state then ("running", ...)
    # host -> the pid of its watch process there (SIGTERM or SIGUSR1 to it drains the host: links.py)
    watch_pids: Mapping[str, int] | None = None
    checkpoint_dir: str | None = None
    stop_grace: float | None = None           # train: the leader's time to checkpoint on stop (down reads it)
    workers: int | None = None
    restarts: Mapping[str, int] = field(default_factory=dict)     # this job's restarts per task
    message: str | None = None
    # progress reported by the leader
    step: int | None = None
    steps_total: int | None = None
    epoch: float | None = None
    loss: float | None = None
    examples_per_second: float | None = None
    per_worker: Mapping[str, float] | None = None
    global_batch_size: int | None = None
    restored_step: int | None = None
    val_accuracy: float | None = None
    val_step: int | None = None
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    # a stall (cluster/supervision/core.py stall_limit): since when (wall time) the leader has
    # reported no progress, and the task it waits on (``worker:2@h3``) when known
    stalled_since: float | None = None
    waiting_on: str | None = None
    # `run` jobs
    command: tuple[str, ...] | None = None
    exit_code: int | None = None
    # the final report (train --json / run --json), once the job ended
    result: Mapping[str, Any] | None = None

    @property
    def live(self) -> bool:
        return self.state.live

    @property
    def steps_since_checkpoint(self) -> int | None:
        """What a hard stop of a live training job would lose now: the leader's steps since its
        last checkpoint (all of them without one; None when nothing is known yet)."""
        if self.entry != "train" or self.step is None:
            return None
        return max(0, self.step - (self.checkpoint_step or self.restored_step or 0))

    @property
    def stalled_for(self) -> float | None:
        """Seconds without progress as of the supervisor's last turn (None: not stalled)."""
        if self.stalled_since is None or not self.live:
            return None
        return max(0.0, (self.heartbeat or self.stalled_since) - self.stalled_since)

    def updated(self, **fields: Any) -> "JobProgress":
        """A copy with ``fields`` changed (``state`` may be given as its string)."""
        if "state" in fields:
            fields["state"] = JobState(fields["state"])
        return dataclasses.replace(self, **fields)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if isinstance(value, Orchestrator):
                value = dataclasses.asdict(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            data[item.name] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JobProgress":
        known = {item.name for item in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values.setdefault("id", 0)
        values.setdefault("job", "")
        values.setdefault("mode", "")
        if "state" in values:
            values["state"] = JobState(values["state"])
        if isinstance(values.get("orchestrator"), Mapping):
            values["orchestrator"] = Orchestrator(**values["orchestrator"])
        if isinstance(values.get("command"), list):
            values["command"] = tuple(values["command"])
        return cls(**values)
