"""The trainer's settings (``TrainerSettings``, the one definition of its options and defaults)
and how a job's defaults and the command line become one training plan (``make_plan``).

Pure: no TensorFlow, no clock, no files, so every mode computes batch sizes, step
budgets and learning rates the same way and the arithmetic is unit-tested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roles.jobs import Job
from roles.tfconfig import ConfigError

MODES = ("async", "sync", "sync-ps")

# Steps run inside one traced function call, per mode, unless --steps-per-execution
# says otherwise. Async: each scheduled closure costs RPCs and coordinator work, so
# steps are looped inside it. Measured with the MNIST CNN (chief + 2 ps + 2 workers
# on 2 cores, CPU time of all five processes per extra step, which other users' load
# does not distort as it does wall time): K=8 95.7 ms, K=32 83.3 ms, K=64 85.7 ms.
# 32 is on the plateau and keeps closures short (work redone after a worker dies,
# latency of progress and checkpoints). Sync: the all-reduce is paid per step
# anyway; looping in-graph only saves Python dispatch (8; not found to matter).
# Sync-ps runs one session.run per step (the SyncReplicasOptimizer token protocol
# is per step), so the value is always 1 there.
DEFAULT_STEPS_PER_EXECUTION = {"async": 32, "sync": 8, "sync-ps": 1}
# async: global steps run one worker at a time before all workers train (DistBelief's "warm
# start", Dean et al. 2012). Two workers from step 0 left MNIST at 90-93 % after 100 steps
# against 96 % with a warm start, and reached 98.5 % later (docs/benchmarks.md).
DEFAULT_WARMUP_STEPS = 256


@dataclass(frozen=True, kw_only=True)
class TrainerSettings:
    """What a training process is told beyond its mode, job and events file.

    The one definition of these settings and their defaults: ``python -m roles.train``'s
    parser takes its defaults from :data:`TRAINER_DEFAULTS`, and ``pscluster train``'s
    options (``cluster.supervision.train_spec.JobOptions``) extend this class, so both sides agree;
    tests/unit/test_train_contract.py checks that the argv the orchestrator builds parses
    back to the same settings. None means the job's own default.
    """

    epochs: float | None = None
    steps: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    scale_lr: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    data: str | None = None
    eval_every: int | None = None
    steps_per_execution: int | None = None
    # async: the first this many global steps run on one worker at a time, then every worker
    # trains (None: DEFAULT_WARMUP_STEPS, at most a quarter of the budget; 0: none).
    warmup_steps: int | None = None
    # The orchestrator starts every task itself, so 3 minutes from process start to the
    # first step covers TensorFlow's start-up on a loaded host; exported pods (TFJob) wait
    # for image pulls and pass longer values (cluster/export.py).
    start_timeout: float = 180.0
    collective_timeout: float = 30.0
    # Checkpoint on stop (every mode): seconds a SIGTERMed trainer has to save and
    # end before it is killed; 0 turns it off. deadline: seconds after the trainer
    # starts at which it checkpoints and stops by itself (None: no deadline).
    stop_grace: float = 30.0
    deadline: float | None = None
    # The job also saves every this many seconds (issue 41), so that a lost ps or sync worker
    # costs at most this much training. Async: the chief, while training goes on (no drain of
    # the closures in flight); sync: every worker after the same step (the chief's clock, on the
    # all-reduce each unit already has); sync-ps: the chief between two steps. None or 0: off.
    snapshot_every: float | None = None
    # TensorBoard: the job's leader writes one point of scalars every this many global steps
    # (0: none). Every trainer cuts its chunks there too, so points land on multiples. 100
    # costs one extra async closure per 100 steps at K=32 (4 instead of 3.125, under 2% of the
    # MLP's step time by the per-closure figures of docs/platform-notes.md TF4) and writing a point takes ~12 us.
    summary_every: int = 100
    seed: int = 1234


TRAINER_DEFAULTS = TrainerSettings()


@dataclass(frozen=True, kw_only=True)
class TrainOptions(TrainerSettings):
    """The ``roles.train`` command line, parsed and type-checked."""

    mode: str
    job: str
    events: str
    # Given by the orchestrator, not the user: where the leader writes TensorBoard summaries
    # (None: nowhere) and how many restarts the job had before this process (a scalar there).
    summary_dir: str | None = None
    restarts: int = 0
    # Sync: write this file after the trace, then wait, before the restore, until the orchestrator
    # says go (a resize's next incarnation started while the previous one trains: roles/handover.py).
    gate: str | None = None


@dataclass(frozen=True)
class TrainPlan:
    """Everything a driver needs to know about the budget and the batch.

    ``global_batch_size`` is the number of examples behind one optimizer update (one
    global step); ``worker_batch_size`` is what each worker's pipeline yields per step.
    """

    mode: str
    workers: int
    global_batch_size: int
    worker_batch_size: int
    steps_total: int
    epochs: float | None
    learning_rate: float
    steps_per_execution: int
    train_examples: int | None
    checkpoint_dir: str | None
    checkpoint_every: int | None
    eval_every: int | None
    resume: bool
    seed: int
    start_timeout: float
    collective_timeout: float
    summary_every: int | None = None
    warmup_steps: int = 0
    gate: str | None = None
    snapshot_every: float | None = None

    def next_boundary(self, step: int, every: int | None) -> int | None:
        """The first multiple of ``every`` after ``step`` (None when ``every`` is unset)."""
        if not every:
            return None
        return (step // every + 1) * every

    def epoch_at(self, step: int) -> float | None:
        """Epochs of data consumed after ``step`` global steps (None if unknown)."""
        if not self.train_examples:
            return None
        return step * self.global_batch_size / self.train_examples

    def start_fields(self, restored_step: int | None) -> dict[str, object]:
        """The fields of the ``start`` event."""
        return {
            "mode": self.mode,
            "workers": self.workers,
            "global_batch_size": self.global_batch_size,
            "steps_total": self.steps_total,
            "epochs": self.epochs,
            "learning_rate": self.learning_rate,
            "steps_per_execution": self.steps_per_execution,
            "restored_step": restored_step,
        }


@dataclass(frozen=True)
class Boundaries:
    """What a step reached: a checkpoint boundary, an evaluation boundary (never the last
    step: the final evaluation is separate)."""

    checkpoint: bool
    evaluate: bool


class StepSchedule:
    """Where a run cuts its steps, the same in every mode.

    ``chunk`` gives the next unit of work: at most ``steps_per_execution`` steps, never
    past the budget, a checkpoint boundary, an evaluation boundary or a summary boundary, so
    that every sync worker reaches the checkpoint/evaluation collectives at the same step,
    an async checkpoint holds a step on its boundary and TensorBoard points land on
    multiples of ``summary_every``; nor past the end of an async warm start, which runs
    its closures one at a time. ``reached`` says which boundaries a step has
    reached or passed (sync-ps steps can jump: the global step counts every worker's
    updates) and moves past them (summary points are written by roles/summaries.py, which
    counts finished steps: async schedules ahead of them). Pure: no TensorFlow, no clock.
    """

    def __init__(self, plan: TrainPlan, start_step: int):
        self.plan = plan
        self.next_checkpoint = plan.next_boundary(start_step, plan.checkpoint_every)
        self.next_eval = plan.next_boundary(start_step, plan.eval_every)
        self.next_summary = plan.next_boundary(start_step, plan.summary_every)

    def chunk(self, step: int) -> int:
        """Steps in the unit of work that starts at ``step`` (0 when the budget is spent)."""
        n = min(self.plan.steps_per_execution, self.plan.steps_total - step)
        for boundary in (self.next_checkpoint, self.next_eval, self.next_summary, self.plan.warmup_steps):
            if boundary is not None and boundary > step:
                n = min(n, boundary - step)
        return max(n, 0)

    def reached(self, step: int) -> Boundaries:
        checkpoint = self.next_checkpoint is not None and step >= self.next_checkpoint
        if checkpoint:
            self.next_checkpoint = self.plan.next_boundary(step, self.plan.checkpoint_every)
        evaluate = self.next_eval is not None and step >= self.next_eval
        if evaluate:
            self.next_eval = self.plan.next_boundary(step, self.plan.eval_every)
        if self.next_summary is not None and step >= self.next_summary:
            self.next_summary = self.plan.next_boundary(step, self.plan.summary_every)
        return Boundaries(checkpoint, evaluate and step < self.plan.steps_total)


def make_plan(job: Job, options: TrainOptions, workers: int) -> TrainPlan:
    """Resolves the plan; the command line wins over the job's defaults.

    Budget precedence: ``--steps``, then ``--epochs``, then the job's STEPS, then its
    EPOCHS. Epochs become steps as ``ceil(epochs * TRAIN_EXAMPLES / global batch)``.

    Raises:
        ConfigError: an impossible combination, with what to change.
    """
    if options.mode not in MODES:
        raise ConfigError(f"--mode {options.mode!r}: choose one of {', '.join(MODES)}")
    if workers < 1:
        raise ConfigError("the cluster in TF_CONFIG has no 'worker' tasks")
    global_batch, worker_batch = _batches(job, options, workers)
    steps, epochs = _budget(job, options, global_batch)
    learning_rate = _learning_rate(job, options, workers)
    k = _steps_per_execution(options)
    snapshot = _check_cadences(options)
    warmup = _warmup(options, workers, steps)
    if epochs is None and job.train_examples:
        epochs_reported: float | None = round(steps * global_batch / job.train_examples, 4)
    else:
        epochs_reported = epochs
    return TrainPlan(
        mode=options.mode,
        workers=workers,
        global_batch_size=global_batch,
        worker_batch_size=worker_batch,
        steps_total=steps,
        epochs=epochs_reported,
        learning_rate=learning_rate,
        steps_per_execution=k,
        train_examples=job.train_examples,
        checkpoint_dir=options.checkpoint_dir,
        checkpoint_every=options.checkpoint_every,
        eval_every=options.eval_every,
        resume=options.resume,
        seed=options.seed,
        start_timeout=options.start_timeout,
        collective_timeout=options.collective_timeout,
        summary_every=options.summary_every or None,
        warmup_steps=warmup,
        gate=options.gate,
        snapshot_every=snapshot,
    )


def _batches(job: Job, options: TrainOptions, workers: int) -> tuple[int, int]:
    """The global batch and each worker's: async workers each take the whole batch; sync
    workers share it (the global batch rounded down to what is really averaged per step)."""
    global_batch = options.batch_size or job.batch_size
    if global_batch < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {global_batch}")
    if options.mode == "async":
        return global_batch, global_batch
    worker_batch = global_batch // workers
    if worker_batch < 1:
        raise ConfigError(
            f"global batch {global_batch} is smaller than the {workers} workers that "
            f"share it; raise --batch-size to at least {workers}")
    return worker_batch * workers, worker_batch


def _budget(job: Job, options: TrainOptions, global_batch: int) -> tuple[int, float | None]:
    """Steps to train and the epochs asked for (None when the budget came as steps)."""
    if options.steps is not None:
        steps, epochs = options.steps, None
    elif options.epochs is not None:
        steps, epochs = None, options.epochs
    elif job.steps is not None:
        steps, epochs = job.steps, None
    else:
        steps, epochs = None, job.epochs
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {steps}")
        return steps, None
    if epochs is None:
        raise ConfigError(f"{job.path}: the job defines neither EPOCHS nor STEPS")
    if epochs <= 0:
        raise ConfigError(f"--epochs must be > 0, got {epochs}")
    if not job.train_examples:
        raise ConfigError(f"{job.path}: define TRAIN_EXAMPLES to train by epochs, "
                          f"or pass --steps")
    return math.ceil(epochs * job.train_examples / global_batch), epochs


def _learning_rate(job: Job, options: TrainOptions, workers: int) -> float:
    learning_rate = options.learning_rate or job.learning_rate
    if learning_rate <= 0:
        raise ConfigError(f"--learning-rate must be > 0, got {learning_rate}")
    return learning_rate * workers if options.scale_lr else learning_rate


def _steps_per_execution(options: TrainOptions) -> int:
    k = options.steps_per_execution or DEFAULT_STEPS_PER_EXECUTION[options.mode]
    if k < 1:
        raise ConfigError(f"--steps-per-execution must be >= 1, got {k}")
    return 1 if options.mode == "sync-ps" else k


def _check_cadences(options: TrainOptions) -> float | None:
    """Checks the checkpoint, snapshot, evaluation and summary cadences, ``--resume`` and the
    timeouts; returns the snapshot interval (None: off)."""
    if options.checkpoint_every is not None:
        if options.checkpoint_every < 1:
            raise ConfigError(f"--checkpoint-every must be >= 1, got {options.checkpoint_every}")
        if not options.checkpoint_dir:
            raise ConfigError("--checkpoint-every needs --checkpoint-dir")
    snapshot = options.snapshot_every or None
    if snapshot is not None:
        if not math.isfinite(snapshot) or snapshot < 1:
            raise ConfigError(f"--snapshot-every must be at least 1 second (0: off), got {options.snapshot_every}")
        if not options.checkpoint_dir:
            raise ConfigError("--snapshot-every needs --checkpoint-dir")
    if options.eval_every is not None and options.eval_every < 1:
        raise ConfigError(f"--eval-every must be >= 1, got {options.eval_every}")
    if options.summary_every < 0:
        raise ConfigError(f"--summary-every must be >= 0 (0: no summaries), got {options.summary_every}")
    if options.resume and not options.checkpoint_dir:
        raise ConfigError("--resume needs --checkpoint-dir (where to find the checkpoint)")
    if options.start_timeout <= 0 or options.collective_timeout <= 0:
        raise ConfigError("--start-timeout and --collective-timeout must be > 0 seconds")
    return snapshot


def _warmup(options: TrainOptions, workers: int, steps: int) -> int:
    """Async warm-up steps (closures one at a time at the start): only with 2 workers or more."""
    if options.warmup_steps is not None and options.warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be >= 0, got {options.warmup_steps}")
    if options.warmup_steps and options.mode != "async":
        raise ConfigError(f"--warmup-steps applies to async mode only, not {options.mode}")
    if options.mode != "async" or workers < 2:
        return 0
    if options.warmup_steps is None:
        return min(DEFAULT_WARMUP_STEPS, steps // 4)
    return options.warmup_steps
