"""The train job's spec: what to run where (pure parts), its argv, and reading what training processes report.

A job is ``distributed_mnist`` (a folder under ``examples/``, synced by ``up``) or a path to a
user's ``job.py`` / job folder, which is copied to each host that does not share this
machine's checkout. Training processes are ``python -m roles.train --mode MODE --job PATH
--events PATH ...``; they write JSON-lines events (see ``roles/events.py``) that
:class:`EventTail` reads back over the host's transport.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from roles.settings import TrainerSettings

from ..hosts import hostops
from ..contracts import DEFAULT_GRACE, Mode, Role
from ..hosts.codesync import LocalFile, collect, needs_sync
from ..errors import UsageError
from ..history import DEFAULT_KEEP
from ..layout import job_code_dir
from ..names import is_cluster_name
from ..plan import ClusterPlan, HostSpec, TaskSpec
from ..program.request import JsonRequest
from ..jobrecord import JobProgress
from ..transport import Transport

RESTART_POLICIES = ("never", "on-failure", "always")


@dataclass(frozen=True)
class JobRef:
    """A job as the user named it, resolved on this machine."""

    spec: str
    name: str
    local_path: Path
    example: bool

    @property
    def is_dir(self) -> bool:
        return self.local_path.is_dir()


def resolve_job(spec: str, root: Path) -> JobRef:
    """``distributed_mnist`` -> ``examples/distributed_mnist``; a path -> that file or folder.

    Raises:
        UsageError: nothing by that name, or a folder without ``job.py``.
    """
    path = Path(spec).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_dir() and not (path / "job.py").is_file():
            raise UsageError(f"job folder {spec} has no job.py", hint="a job folder holds job.py (see examples/)")
        if path.is_file() and path.suffix != ".py":
            raise UsageError(f"job file {spec} is not a .py file")
        name = path.stem if path.is_file() else path.name
        example = _is_within(path, root / "examples")
        return JobRef(spec, name, path, example)
    shipped = root / "examples" / spec
    # a shipped job's name becomes a folder under .pscluster/<cluster>/jobs/ on the hosts: no "../"
    if is_cluster_name(spec) and (shipped / "job.py").is_file():
        return JobRef(spec, spec, shipped, True)
    known = sorted(p.name for p in (root / "examples").iterdir() if (p / "job.py").is_file()) \
        if (root / "examples").is_dir() else []
    raise UsageError(f"no job named {spec!r}", hint=f"shipped jobs: {', '.join(known) or 'none'}; "
                                                   "or give the path of a job.py or a job folder")


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def job_files(job: JobRef, plan: ClusterPlan) -> list[LocalFile]:
    """Files to copy for a user job, relative to the host workdir."""
    return collect(job.local_path.parent, (job.local_path.name,), prefix=job_code_dir(plan.name, job.name) + "/")


def job_path_on(host: HostSpec, job: JobRef, plan: ClusterPlan, root: Path) -> str:
    """Where the training process on ``host`` finds the job."""
    if not needs_sync(host, root):
        return str(job.local_path)
    if job.example:
        return str(job.local_path.relative_to(root))
    return f"{job_code_dir(plan.name, job.name)}/{job.local_path.name}"


@dataclass(frozen=True, kw_only=True)
class JobOptions(TrainerSettings):
    """``pscluster train`` options: what every training process is told (the fields of
    :class:`roles.settings.TrainerSettings`, one definition for both sides) and how the job is
    supervised."""

    restart_policy: str = "on-failure"
    max_restarts: int = 3
    backoff: float = 1.0
    host_timeout: float = 60.0
    grace: float = DEFAULT_GRACE
    # Seconds without progress from the leader before the job counts as stalled (None: derived
    # from the job, see cluster/supervision/core.py stall_limit; 0: never).
    stall_timeout: float | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainRequest(JsonRequest):
    """``pscluster train JOB [OPTIONS]`` as one value: what the command line asked for, and what a
    ``--detach`` supervisor receives (:meth:`JsonRequest.to_json`) to run the same job."""

    job: str
    name: str                   # the cluster's, resolved
    options: JobOptions
    min_workers: int | None = None
    hosts_from: str | None = None
    hosts_every: float = 10.0
    notices_from: str | None = None
    notices_every: float = 5.0
    notice_deadline: float = 30.0
    notify_urls: tuple[str, ...] = ()
    notify_cmds: tuple[str, ...] = ()
    replace: bool = False
    keep: int = DEFAULT_KEEP
    as_json: bool = False


# Trainer settings given on every command line, and those given only when set. The seed is
# left to the trainer's default (tests/unit/test_train_contract.py checks the whole mapping).
_ALWAYS = ("start_timeout", "stop_grace", "summary_every")
_IF_SET = ("epochs", "steps", "batch_size", "learning_rate", "checkpoint_every", "data",
           "steps_per_execution", "warmup_steps", "eval_every", "deadline", "snapshot_every")


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _value(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# Async and sync jobs save this often unless --snapshot-every says otherwise (0: off), so that a
# lost ps or sync worker costs at most this much training. benchmarks/snapshot_cost.py measured no
# step-rate cost: async (MLP) every 10 s 1.04 and 1.01, with against without, on two alternating
# pairs; sync (CNN) every 15 s 1.027 and 0.986. sync-ps (not measured) keeps --checkpoint-every only.
DEFAULT_SNAPSHOT_EVERY = 15.0
SNAPSHOT_MODES = (Mode.ASYNC, Mode.SYNC)


def with_defaults(options: JobOptions, plan: ClusterPlan) -> JobOptions:
    """``options`` with what depends on the cluster filled in: the snapshot interval."""
    if options.snapshot_every is None and plan.mode in SNAPSHOT_MODES:
        return replace(options, snapshot_every=DEFAULT_SNAPSHOT_EVERY)
    return options


def check_job_options(options: JobOptions, plan: ClusterPlan | None = None, *, min_workers: int | None = None) -> None:
    """The options of a `train` that cannot run (on this cluster, given its ``plan``), refused
    before anything starts."""
    if options.epochs is not None and options.steps is not None:
        raise UsageError("give --epochs or --steps, not both")
    if options.snapshot_every is not None and 0 < options.snapshot_every < 1:
        raise UsageError(f"--snapshot-every must be at least 1 second, got {options.snapshot_every:g}",
                         hint="0 turns snapshots off")
    if plan is None:
        return
    if options.warmup_steps and plan.mode != Mode.ASYNC:
        raise UsageError(f"--warmup-steps applies to async mode only; cluster {plan.name!r} runs {plan.mode}")
    workers = len(plan.tasks_of(Role.WORKER))
    if min_workers is not None and min_workers > workers:
        raise UsageError(f"--min-workers {min_workers} is larger than cluster {plan.name!r}, which has {workers} worker(s)",
                         hint=f"give at most --min-workers {workers}")


def with_evaluator(options: JobOptions) -> JobOptions:
    """The trainers' options when a side-car evaluator evaluates each checkpoint: they never
    evaluate periodically (the workers never pause for it), and ``--eval-every N`` asks for a
    checkpoint every N steps instead, unless ``--checkpoint-every`` is given. The trainers' final
    evaluation stays (the report's ``val_accuracy``, whatever becomes of the evaluator)."""
    return replace(options, eval_every=None, checkpoint_every=options.checkpoint_every or options.eval_every)


def path_on(host: HostSpec, path: str) -> str:
    """``path`` as a job process on ``host`` reads it: relative paths start at the host's workdir
    (the processes' working directory); ``~`` is the host's home."""
    if path.startswith(("/", "~")):
        return path
    return f"{host.workdir.rstrip('/')}/{path}"


def train_argv(task: TaskSpec, *, mode: str, job_path: str, events_path: str, checkpoint_dir: str,
               options: JobOptions, resume: bool, summaries: str | None = None, restarts: int = 0,
               gate: str | None = None) -> list[str]:
    """The command line of one training process (``summaries``: the summary folder, written
    only by the leader; ``restarts``: the job's restarts so far, a TensorBoard scalar; ``gate``:
    a file a sync worker writes before it waits, ahead of its restore, for a resize's previous
    workers to stop: roles/handover.py)."""
    argv = list(task.argv) + ["--job", job_path, "--events", events_path, "--checkpoint-dir", checkpoint_dir]
    if summaries:
        argv += ["--summary-dir", summaries]
    if restarts:
        argv += ["--restarts", str(restarts)]
    for name in _ALWAYS:
        argv += [_flag(name), _value(getattr(options, name))]
    if task.role == Role.WORKER and mode == Mode.SYNC:      # a member of the collective
        argv += ["--collective-timeout", _value(options.collective_timeout)]
    for name in _IF_SET:
        value = getattr(options, name)
        if value is not None:
            argv += [_flag(name), _value(value)]
    if options.scale_lr:
        argv.append("--scale-lr")
    if resume:
        argv.append("--resume")
    if gate:
        argv += ["--gate", gate]
    argv += list(options.extra_args)
    return argv


@dataclass
class EventTail:
    """Reads new events from one training process's events file, over its host's transport."""

    path: str
    offset: int = 0
    partial: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)

    def poll(self, transport: Transport) -> list[dict[str, Any]]:
        return self.feed(hostops.read(transport, self.path, offset=self.offset, limit=1 << 20))

    def feed(self, chunk: hostops.FileChunk) -> list[dict[str, Any]]:
        """Parse the new bytes of a read that started at ``self.offset``."""
        if not chunk.data or chunk.offset != self.offset:
            return []
        self.offset = chunk.end
        text = self.partial + chunk.data
        lines = text.split("\n")
        self.partial = lines.pop()
        fresh: list[dict[str, Any]] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                fresh.append(json.loads(line))
            except ValueError:
                continue     # a torn line from a process killed mid-write
        self.events.extend(fresh)
        return fresh

    def last(self, kind: str) -> dict[str, Any] | None:
        return next((event for event in reversed(self.events) if event.get("event") == kind), None)


def summarize(result: dict[str, Any], *, wall_seconds: float, restarts: dict[str, int], steps_redone: int,
              job: JobRef, evals: list[dict[str, Any]] | None = None, progress: JobProgress | None = None) -> dict[str, Any]:
    """The final report (``train --json``)."""
    return {
        "job": job.name, "mode": result.get("mode"), "workers": result.get("workers"),
        "global_step": result.get("global_step"), "val_loss": result.get("val_loss"),
        "val_accuracy": result.get("val_accuracy"), "wall_seconds": round(wall_seconds, 2),
        "train_seconds": result.get("wall_seconds"),
        "examples_per_second": result.get("examples_per_second"), "checkpoint": result.get("checkpoint"),
        "restored_step": result.get("restored_step"), "restarts": dict(restarts), "steps_redone": steps_redone,
        "evals": list(evals or []),
        "global_batch_size": progress.global_batch_size if progress else None,
        "per_worker_examples_per_second": result.get("per_worker") or
        (dict(progress.per_worker) if progress and progress.per_worker else None),
    }
