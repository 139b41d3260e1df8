"""Sync mode: MultiWorkerMirroredStrategy, one process per worker, our own loop.

Keras 3 ``model.fit`` fails under MultiWorkerMirroredStrategy with more than one
worker (keras-team/keras#20585), so each worker runs this loop:

* the strategy sees only the ``worker`` job of TF_CONFIG (a ``ps`` or ``chief`` entry
  the orchestrator may list would otherwise join the collective group and hang it);
* collectives carry ``--collective-timeout``, so a frozen peer turns into a
  ``DeadlineExceededError`` instead of a hang (a dead peer fails at once anyway);
* each worker reads its own shard through ``distribute_datasets_from_function``;
  ``steps_per_execution`` steps run inside one traced ``tf.while_loop``; the Keras
  optimizer all-reduces the gradients; the per-example loss is averaged over the
  *global* batch so the summed gradients are the global mean;
* worker 0 is the chief: it keeps checkpoints; the others save into a temporary
  directory and delete it (TensorFlow's multi-worker checkpoint protocol). On
  ``--resume`` only the chief needs the files: it restores, then every worker takes
  the chief's values through one all-reduce, so no shared filesystem is needed;
* evaluation is distributed: each worker evaluates its shard of the test set and one
  all-reduce sums the totals, so all workers finish together and agree on the result;
* stopping: a stop request (SIGTERM, ``down``, a preemption) or ``--deadline`` on any worker is
  shared by one all-reduce of the flags after each unit of work (:func:`agree_on_stop`), so every
  worker saves a checkpoint after the same step and ends;
* leaving: destroying the distributed dataset iterator takes TensorFlow 2-20 s at
  random (measured), so ``run`` keeps it alive and ``leave`` ends the process without
  tearing TensorFlow down: every other worker posts "left" in the coordination
  service's key-value store once its last collective is done, and worker 0, which
  hosts that service, waits for all of them before it goes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from typing import Any, Iterator, Sequence

import tensorflow as tf
from tensorflow.python.distribute import mirrored_strategy

from roles.checkpoint import CheckpointKeeper, make_checkpoint, make_step_counter
from roles.datasets import eval_dataset, sample_batch, train_dataset
from roles.evaluation import EVAL_BATCH_SIZE, make_evaluator, means
from roles.gradients import loss_and_gradients
from roles.handover import release_port, wait_at_gate
from roles.jobs import Job, Shard
from roles.guardian import TrainerLink
from roles.membership import Requests, control_path
from roles.settings import StepSchedule, TrainPlan
from roles.reporting import FirstStep, ProgressMeter, TaskReporter, TrainResult
from roles.tfconfig import ConfigError, TaskInfo, wait_for_leader

log = logging.getLogger("pscluster.sync")

# Objects whose destruction stalls (the distributed dataset iterator): kept until the
# process ends by os._exit (see ``leave``).
_KEPT: list[Any] = []
_LEFT_KEY = "pscluster/sync/left/{}"


class _Phases:
    """Seconds each phase of a sync worker's start took, for one log line at its first unit
    (what a restart or a resize costs, and where)."""

    def __init__(self) -> None:
        self.began = self.last = time.monotonic()
        self.spent: list[tuple[str, float]] = []
        self.open = True

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.spent.append((phase, now - self.last))
        self.last = now
        if phase == "first agreement":
            self.open = False

    def summary(self) -> str:
        return f"{self.last - self.began:.2f} s (" + ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.spent) + ")"


@contextlib.contextmanager
def _initial_values_local(strategy: Any, local: bool) -> Iterator[None]:
    """With ``local``, the variables made inside take their own initial value on every worker.

    MultiWorkerMirroredStrategy otherwise makes worker 0 broadcast each variable's initial value
    as it is created: one collective per variable (the MLP and its Adam slots: ~30), ~15 ms each
    on a busy 2-core host, 0.4-0.6 s of every restart and resize. A resumed job overwrites all of
    them with the chief's values at once (:func:`_copy_from_chief`, one all-reduce), so it skips
    them. Every worker takes the same path (``--resume`` is the job's), so the collective
    instance keys stay in step. TensorFlow 2.21's private hook (preflight pins the version);
    where it is missing the broadcasts simply stay."""
    extended = strategy.extended
    hook = getattr(mirrored_strategy.MirroredExtended, "_get_variable_creator_initial_value", None)
    if not local or hook is None or not hasattr(extended, "_get_variable_creator_initial_value"):
        yield
        return
    extended._get_variable_creator_initial_value = functools.partial(hook, extended)
    try:
        yield
    finally:
        del extended._get_variable_creator_initial_value


def make_strategy(task: TaskInfo, collective_timeout: float) -> Any:
    wait_for_leader(task)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": list(task.cluster["worker"])}),
        task_type="worker", task_id=task.task_index, rpc_layer="grpc")
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=collective_timeout,
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)


def _restore_on_the_chief(keeper: CheckpointKeeper, is_chief: bool, checkpoint_dir: str | None) -> None:
    """``--resume``: the chief restores the latest checkpoint (the others get its state next)."""
    if not is_chief:
        return
    path = keeper.restore_latest()
    if path:
        log.info("restored %s", path)
    else:
        log.info("--resume: no checkpoint in %s yet; starting at step 0", checkpoint_dir)


def _pass_gate(gate: str, requests: Requests, link: TrainerLink) -> None:
    """The next incarnation of a resized job waits here: the checkpoint to restore is written
    when the previous workers, still training on their established connections, stop."""
    if not wait_at_gate(gate, requests.poll, lambda: link.stop_requested):
        raise RuntimeError("stopped while waiting for the previous workers to checkpoint")


def _save(keeper: CheckpointKeeper, step: int, reporter: TaskReporter, snapshot: bool) -> str | None:
    """A checkpoint at ``step`` (``snapshot``: one --snapshot-every asked for, off the schedule)."""
    began = time.perf_counter()
    path = keeper.save_and_report(step, reporter)
    if snapshot:
        log.info("snapshot at step %d in %.2f s", step, time.perf_counter() - began)
    return path


def _save_last(keeper: CheckpointKeeper, step: int, last_saved: int, reporter: TaskReporter) -> str | None:
    """The final checkpoint, unless ``step`` was saved already; then the keeper is closed."""
    path = keeper.save_and_report(step, reporter) if last_saved != step else None
    keeper.close()
    return path


def _release_if_asked(requests: Requests, task: TaskInfo, reporter: TaskReporter, step: int) -> None:
    """The orchestrator's "release" (roles/handover.py): the next incarnation takes this
    worker's port; this one trains on."""
    request = requests.poll()
    if request is None or not request.get("release"):
        return
    released = release_port(int(task.address.rsplit(":", 1)[1]))
    log.info("released port %s (%d listener(s)) at step %d", task.address, released, step)
    reporter.writer.emit("membership", seq=request["seq"], released=released, step=step)


def run(job: Job, plan: TrainPlan, task: TaskInfo, reporter: TaskReporter,
        link: TrainerLink) -> TrainResult:
    if task.task_type != "worker":
        raise ConfigError(f"sync mode runs one process per worker task; this is {task.name}")
    is_chief = task.task_index == 0
    phases = _Phases()
    # The orchestrator's requests (roles/handover.py): "release" your port while you train, or,
    # started with --gate, "go" once the previous workers have checkpointed.
    requests = Requests(control_path(reporter.writer.path))
    strategy = make_strategy(task, plan.collective_timeout)
    phases.mark("strategy")
    local_replicas = len(strategy.extended.worker_devices)  # >1 only with several GPUs

    x0, _ = sample_batch(job, plan.seed)
    # A resumed job sets every worker's variables to the chief's right after they are made
    # (_copy_from_chief): the broadcast of each one's initial value is then redundant.
    resumes = bool(plan.checkpoint_dir and plan.resume)
    with strategy.scope(), _initial_values_local(strategy, resumes):
        model = job.build_model()
        model(x0, training=False)
        optimizer = job.optimizer(plan.learning_rate)
        optimizer.build(model.trainable_variables)
        step_var = make_step_counter()  # same role as in async mode
    state = list(model.variables) + list(optimizer.variables) + [step_var]
    phases.mark("model")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        shard = Shard(index=context.input_pipeline_id, count=context.num_input_pipelines,
                      split="train", seed=plan.seed)
        return train_dataset(job, shard,
                             context.get_per_replica_batch_size(plan.global_batch_size))

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    _KEPT.append(iterator)
    train_steps = _make_train_steps(job, plan, strategy, model, optimizer, step_var)

    evaluator = make_evaluator(job, model)
    test_shards: list[Any] = []     # made at the first evaluation: not on a restart's path

    def evaluate(step: int) -> tuple[float | None, float | None]:
        # Every worker evaluates its shard; one all-reduce sums the totals, so all
        # workers agree (and none waits at a collective for one that evaluates).
        if not test_shards:
            test_shards.append(eval_dataset(job, Shard(task.task_index, plan.workers, "test", plan.seed),
                                            EVAL_BATCH_SIZE))
        totals = _sum_over_workers(strategy, evaluator(test_shards[0]), local_replicas)
        val_loss, val_accuracy = means(totals.numpy())
        reporter.eval(step, val_loss, val_accuracy)
        return val_loss, val_accuracy

    phases.mark("input")
    # Traced before the state is shared: a worker that is ahead traces instead of waiting at
    # that all-reduce for the slowest one (often the chief, which also restores). Every worker
    # traces at the same point, so the collectives' instance keys stay in step.
    train_steps.get_concrete_function(iterator, tf.constant(1))
    phases.mark("trace")
    if plan.gate:
        _pass_gate(plan.gate, requests, link)
        phases.mark("gate")

    keeper = (CheckpointKeeper(make_checkpoint(model, optimizer, step_var), plan.checkpoint_dir, keep=is_chief)
              if plan.checkpoint_dir else None)
    restored_step = None
    if keeper and plan.resume:
        _restore_on_the_chief(keeper, is_chief, plan.checkpoint_dir)
        phases.mark("restore")
        _copy_from_chief(strategy, state, is_chief, local_replicas)
        step = int(step_var.numpy())
        restored_step = step if step > 0 else None
    phases.mark("state shared")
    reporter.start(restored_step)
    meter = ProgressMeter(reporter)
    step = int(step_var.numpy())
    last_saved = -1
    last_checkpoint = keeper.latest() if keeper else None
    first = FirstStep(link, meter)
    # Every worker cuts the budget at the same boundaries: the collectives of a
    # checkpoint or an evaluation must line up across workers.
    schedule = StepSchedule(plan, step)
    stopping = False
    # --snapshot-every: the chief's clock says when; the flag rides on the all-reduce after each
    # unit (agree_on_stop), so every worker saves after the same step at no extra collective.
    snapshot_every = plan.snapshot_every or 0.0
    next_snapshot = time.monotonic() + snapshot_every
    while step < plan.steps_total and not stopping:
        # The first unit is one step: the job's first step after a start, a restart or a resize
        # is reported without waiting for the rest of a unit (the function's first run is slow).
        n = min(1, schedule.chunk(step)) if phases.open else schedule.chunk(step)
        loss = float(train_steps(iterator, tf.constant(n)))
        step += n
        if phases.open:
            phases.mark("first unit")
        due = bool(is_chief and snapshot_every and time.monotonic() >= next_snapshot)
        stopping, snapshot_due = agree_on_stop(strategy, link, local_replicas, snapshot=due)
        counted = first.counts(step, loss)
        if phases.open:
            phases.mark("first agreement")
            log.info("training after %s", phases.summary())
        reporter.trained(step, n, n * plan.global_batch_size, loss, timed=counted)
        _release_if_asked(requests, task, reporter, step)
        if counted:
            meter.add(n, n * plan.global_batch_size, loss,
                      [(task.name, n * plan.worker_batch_size)])
            meter.maybe_emit(step)
        reached = schedule.reached(step)
        if stopping:
            break      # the checkpoint below, at the same step on every worker
        if keeper and (reached.checkpoint or snapshot_due):
            last_checkpoint = _save(keeper, step, reporter, snapshot=not reached.checkpoint) or last_checkpoint
            last_saved = step
            next_snapshot = time.monotonic() + snapshot_every
        if reached.evaluate:
            # The evaluation's line comes with the training loss up to it (a short run
            # would otherwise report one progress event at the end).
            meter.maybe_emit(step, force=True)
            evaluate(step)
    link.disarm()
    step = int(step_var.numpy())
    meter.maybe_emit(step, force=True)
    rate = meter.overall_rate()
    if keeper:
        last_checkpoint = _save_last(keeper, step, last_saved, reporter) or last_checkpoint

    val_loss, val_accuracy = (None, None) if stopping else evaluate(step)
    return TrainResult(global_step=step, val_loss=val_loss, val_accuracy=val_accuracy,
                       examples_per_second=rate,
                       checkpoint=last_checkpoint if is_chief else None,
                       restored_step=restored_step, per_worker=meter.overall_per_worker())


def leave(task: TaskInfo, timeout: float) -> bool:
    """Lets every worker end at once after a finished run (then the caller os._exits).

    A worker other than 0 posts that it has left: by then its last collective is done
    and it needs nothing more from anyone, so a post that fails (worker 0 may have
    read it and gone before answering) or hangs changes nothing. Worker 0 hosts the
    coordination service, so it goes last: it waits until every other worker has
    posted. Nobody waits more than ``timeout`` seconds. Returns False if the
    handshake did not complete (the run's outcome is already reported either way).
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    if task.task_index != 0:
        return _within(timeout, f"post that worker {task.task_index} left",
                       ctx.set_config_key_value, _LEFT_KEY.format(task.task_index), "1")
    deadline = time.monotonic() + timeout
    for index in range(1, task.num_workers):
        remaining = max(0.001, deadline - time.monotonic())
        if not _within(remaining + 5, f"wait for worker {index} to leave",
                       ctx.get_config_key_value, _LEFT_KEY.format(index),
                       int(remaining * 1000)):
            return False
    return True


def _within(seconds: float, what: str, call: Any, *args: Any) -> bool:
    """``call(*args)`` in a daemon thread; False if it raised or took over ``seconds``."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call(*args)
            outcome.append(None)
        except Exception as e:  # noqa: BLE001 - reported below, never fatal
            outcome.append(e)

    thread = threading.Thread(target=target, name="pscluster-leave", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        log.warning("leaving: could not %s within %.0f s; leaving anyway", what, seconds)
        return False
    if outcome[0] is not None:
        log.info("leaving: could not %s (%s); leaving anyway", what,
                 type(outcome[0]).__name__)
        return False
    return True


def agree_on_stop(strategy: Any, link: TrainerLink, local_replicas: int, *,
                  snapshot: bool = False) -> tuple[bool, bool]:
    """(stop, snapshot): whether any worker was asked to stop (SIGTERM, ``down``, a preemption
    notice) or reached its ``--deadline``, and whether any (the chief, by its clock) wants a
    snapshot saved. One all-reduce of the flags after each unit of work, so that every worker
    stops, or saves, after the same step. A worker that learns of a stop from a peer takes the
    peer's reason (a stop outranks a deadline), so all of them end alike. Costs one scalar
    all-reduce per ``steps_per_execution`` steps."""
    mine = [1.0 if link.stop_requested and link.stop_reason != "deadline" else 0.0,
            1.0 if link.stop_requested and link.stop_reason == "deadline" else 0.0,
            1.0 if snapshot else 0.0]
    stops, deadlines, snapshots = (float(v) for v in
                                   _sum_over_workers(strategy, tf.constant(mine), local_replicas).numpy())
    if stops > 0:
        if not link.stop_requested or link.stop_reason == "deadline":
            link.stop_requested, link.stop_reason = True, "a peer's stop request"
        return True, False
    if deadlines > 0:
        link.request_stop("deadline")
        return True, False
    return False, snapshots > 0


def _make_train_steps(job: Job, plan: TrainPlan, strategy: Any, model: Any,
                      optimizer: Any, step_var: tf.Variable) -> Any:
    def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        step = loss_and_gradients(job, model, x, y, plan.global_batch_size)
        optimizer.apply_gradients(zip(step.grads, step.variables))  # all-reduces the gradients
        # This worker's mean loss, for its progress events: reporting the global mean
        # would cost one more collective per step.
        return tf.reduce_mean(step.per_example)

    # The loop is a tf.while_loop traced without autograph: autograph's conversion of a
    # ``for ... in tf.range`` loop cost ~0.3 s of CPU per worker at every start, and a sync
    # resize starts every worker at once (benchmarks/sync_start.py, three workers: 1.54 s of
    # CPU each against 1.85, 0.48 s less to the first step, the same steady speed). The
    # per-replica step, the user's model and loss, is still converted, so Python control flow
    # on tensors there keeps working.
    replica_step = tf.autograph.to_graph(step_fn)

    def loop(iterator: Any, n: tf.Tensor) -> tf.Tensor:
        def one_step(i: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            local = strategy.experimental_local_results(strategy.run(replica_step, args=next(iterator)))
            return i + 1, total + tf.add_n(local) / len(local)

        _, total = tf.while_loop(lambda i, _: i < n, one_step, (tf.constant(0), tf.constant(0.0)))
        step_var.assign_add(tf.cast(n, tf.int64))
        return total / tf.cast(n, tf.float32)

    return tf.function(loop, autograph=False)


def _distribute_local(strategy: Any, value: tf.Tensor, local_replicas: int) -> Any:
    """``value`` spread over this worker's replicas so that their sum is ``value``."""
    share = value / local_replicas
    return strategy.experimental_distribute_values_from_function(lambda _: share)


def _sum_over_workers(strategy: Any, value: tf.Tensor, local_replicas: int) -> tf.Tensor:
    """Sum of each worker's ``value`` (one all-reduce)."""
    return strategy.reduce(tf.distribute.ReduceOp.SUM,
                           _distribute_local(strategy, value, local_replicas), axis=None)


def _copy_from_chief(strategy: Any, variables: Sequence[Any], is_chief: bool,
                     local_replicas: int) -> None:
    """Sets every worker's copy of ``variables`` to the chief's values.

    Why: after a restore only the chief holds the checkpoint's values (it alone has
    the files). One all-reduce of (chief's values, zeros elsewhere) broadcasts them;
    float64 carries the integer counters (step, seeds) exactly.
    """
    parts = [tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float64), [-1]) for v in variables]
    flat = tf.concat(parts, axis=0) if parts else tf.zeros([0], tf.float64)
    if not is_chief:
        flat = tf.zeros_like(flat)
    summed = _sum_over_workers(strategy, flat, local_replicas)
    offset = 0
    for v in variables:
        size = int(tf.size(tf.convert_to_tensor(v)))
        part = tf.reshape(summed[offset:offset + size], v.shape)
        v.assign(tf.cast(part, v.dtype))
        offset += size
