"""Sync-ps mode: the classic between-graph SyncReplicasOptimizer, one process per worker.

There is no TF2-native synchronous parameter-server training, so this mode speaks
``tf.compat.v1``: each worker runs an in-process ``tf.distribute.Server`` for its own
task, builds the same graph under ``replica_device_setter`` (variables on the ps
tasks, round-robin; compute on itself) and trains through a ``MonitoredTrainingSession``
with ``SyncReplicasOptimizer(replicas_to_aggregate=W, total_num_replicas=W)``: every
global step averages one gradient from each worker.

Keras 3 in a TF1 graph (checked on TF 2.21 / Keras 3.15): layers build fine and their
variables obey the device setter, but

* TF1 optimizers reject Keras variables (``no attribute '_in_graph_mode'``): the
  wrapped ``tf.Variable`` (``variable.value``) is what they get;
* state updates made inside a layer call (BatchNormalization statistics, the dropout
  seed) are ops nobody depends on in a plain graph, so they would never run: the
  forward pass is wrapped in ``tf.function``, whose automatic control dependencies
  run them;
* the job's Keras optimizer is translated to its TF1 twin (roles/v1_optimizers.py).

Other choices:

* the input pipelines run eagerly in a thread of their own and each step feeds its
  batch through placeholders: in the graph the job's arrays would be constants (47 MB
  for MNIST) that every graph build, prune and registration copies (27 s to the first
  step instead of 6 s, docs/benchmarks.md "sync-ps profile");
* a model without state that its call changes runs on values, read as one flat tensor
  per ps task, and sends its gradients the same way (roles/fused.py): a transfer is
  an RPC, and the RPCs, not the bytes, cost on shared cores. Other models (BatchNorm,
  dropout) read their variables where they live, which needs
  ``share_cluster_devices_in_session`` for the tf.function that updates them;

* each run's state lives in a fresh resource container agreed through
  roles/syncps_rendezvous.py, because the standing ps tasks keep every variable and
  queue of earlier runs;
* sessions carry ``device_filters`` (ps + this worker), or a worker's session would
  wait for every other worker in the cluster to be up;
* no initial sync tokens (``num_tokens=0``): a worker's step returns when that
  global step has been applied, so all workers see the same step and stop together,
  and no gradient is computed just to be dropped as stale;
* the step returns the new global step (the SyncReplicasOptimizer train op yields
  the dequeued token), so no extra read is needed per step;
* checkpoints: only the chief saves, with a non-sharded ``Saver`` placed on its own
  CPU, so the chief writes every file (the default sharded saver would have each ps
  write its own part on its own host). ``--resume`` passes ``--checkpoint-dir`` to the
  chief's session, which restores the newest checkpoint; without it the chief starts
  fresh even if the directory holds checkpoints (as in the other modes);
* every step runs with a deadline (``--collective-timeout``) once training has
  started, so a vanished peer ends the run with an error instead of a hang.
"""

from __future__ import annotations

import logging
import os
import queue
import time
import threading
from typing import Any, Callable

import tensorflow as tf

from roles import fused
from roles.checkpoint import CHECKPOINT_NAME, MAX_TO_KEEP
from roles.datasets import eval_dataset, train_dataset
from roles.evaluation import EVAL_BATCH_SIZE, batch_sums, means
from roles.gradients import mean_loss
from roles.jobs import Job, Shard
from roles.guardian import TrainerLink
from roles.settings import StepSchedule, TrainPlan
from roles.reporting import FirstStep, ProgressMeter, TaskReporter, TrainResult, placements_of
from roles.steptrace import StepTracer
from roles.syncps_rendezvous import ControlChannel, container_name
from roles.tfconfig import ConfigError, TaskInfo, threads_from_env
from roles.tfruntime import session_config
from roles.v1_optimizers import V1OptimizerSpec, v1_spec

log = logging.getLogger("pscluster.syncps")

STOP_GRACE_SECONDS = 2
# PSCLUSTER_SYNCPS_FUSED=0 turns roles/fused.py off (for A/B measurements).
FUSED = os.environ.get("PSCLUSTER_SYNCPS_FUSED", "1") != "0"


def run(job: Job, plan: TrainPlan, task: TaskInfo, reporter: TaskReporter,
        link: TrainerLink) -> TrainResult:
    if task.task_type != "worker":
        raise ConfigError(f"sync-ps mode runs one process per worker task; this is {task.name}")
    if task.num_ps < 1:
        raise ConfigError("sync-ps mode needs at least one 'ps' task in TF_CONFIG")
    index, workers = task.task_index, plan.workers
    is_chief = index == 0
    cluster = tf.train.ClusterSpec({"ps": list(task.cluster["ps"]),
                                    "worker": list(task.cluster["worker"])})
    threads = threads_from_env()
    config = session_config(tf, threads, device_filters=[
        "/job:ps", f"/job:worker/task:{index}"], allow_soft_placement=False)
    # A tf.function whose ops touch variables on the ps (a BatchNormalization update, say)
    # runs only if the session shares the cluster's devices with the function runtime.
    config.experimental.share_cluster_devices_in_session = True
    server = tf.distribute.Server(cluster, job_name="worker", task_index=index,
                                  protocol="grpc", config=config, start=True)
    # Read eagerly, outside any graph, and before connecting: fails fast if unsupported.
    optimizer_spec = v1_spec(job.optimizer(plan.learning_rate), job.path)

    # Like the training session, the control session is left for os._exit to end.
    channel = ControlChannel(server.target, workers, config)
    run_id = channel.chief_agree(workers) if is_chief else channel.worker_agree(index)
    log.info("%s: run container %s", task.name, container_name(run_id))
    return _train(job, plan, task, reporter, link, server, config, cluster,
                  channel, run_id, optimizer_spec)


def _train(job: Job, plan: TrainPlan, task: TaskInfo, reporter: TaskReporter,
           link: TrainerLink, server: Any, config: Any, cluster: Any,
           channel: ControlChannel, run_id: int,
           optimizer_spec: V1OptimizerSpec) -> TrainResult:
    index, workers = task.task_index, plan.workers
    is_chief = index == 0
    worker_device = f"/job:worker/task:{index}"
    # The input pipelines run eagerly, outside the graph, and each step feeds its
    # batch: in the graph, the job's in-memory arrays would be constants (47 MB for
    # MNIST) copied by every graph build, prune and registration (docs/benchmarks.md,
    # "sync-ps profile").
    shard = Shard(index=index, count=workers, split="train", seed=plan.seed)
    batches = _Feeder(train_dataset(job, shard, plan.worker_batch_size))
    # Larger batches than the other modes: each is a session.run (and a read of the variables).
    test_data = eval_dataset(job, Shard(0, 1, "test", plan.seed), EVAL_BATCH_SIZE * 5) if is_chief else None
    tests = _batches(test_data) if test_data is not None else []
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.container(container_name(run_id)):
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                cluster=cluster, worker_device=worker_device)):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            x, y = batches.placeholders("batch")
            model = job.build_model()
            model(x, training=False)  # creates the variables, placed on the ps tasks

            sync = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer_spec.build(), replicas_to_aggregate=workers, total_num_replicas=workers)
            variables = [v.value for v in model.trainable_variables]
            values = None
            if FUSED and fused.usable(model):
                # One transfer per ps task and direction per step instead of one per
                # variable (reads twice: forward and backward): roles/fused.py.
                values = fused.read(variables)

                @tf.function
                def forward_on(values: list[tf.Tensor], x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
                    outputs, _ = model.stateless_call(values, [], x, training=True)
                    return mean_loss(job, y, outputs)

                loss = forward_on(values, x, y)
                grads = tf.gradients(loss, values)
                grads = fused.send(grads, variables)
                train_op = sync.apply_gradients(list(zip(grads, variables)), global_step=global_step)
            else:
                @tf.function
                def forward(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
                    return mean_loss(job, y, model(x, training=True))

                loss = forward(x, y)
                train_op = sync.minimize(loss, global_step=global_step, var_list=variables)
            sync_hook = sync.make_session_run_hook(is_chief, num_tokens=0)
            if test_data is not None:
                # Batch by batch: a whole-dataset tf.function (as the TF2 modes use)
                # fails here, because a dataset reduce cannot read variables that live
                # on another task.
                test_inputs = _placeholders(test_data, "test")
                call = None
                if values is not None:
                    call = fused.inference(model, values)
                eval_sums = tf.function(lambda a, b: batch_sums(job, model, a, b, call))(*test_inputs)
        saver = None
        if is_chief and plan.checkpoint_dir:
            # Placed on the chief, not sharded: the chief alone reads every variable
            # and writes every file.
            with tf.device(f"{worker_device}/device:CPU:0"):
                saver = tf.compat.v1.train.Saver(sharded=False, max_to_keep=MAX_TO_KEEP)
        scaffold = tf.compat.v1.train.Scaffold(saver=saver)
        variables = tf.compat.v1.global_variables()

        log.info("graph built; creating the session")
        restore_dir = plan.checkpoint_dir if (is_chief and plan.resume) else None
        restore_from = tf.train.latest_checkpoint(restore_dir) if restore_dir else None
        if restore_dir and restore_from is None:
            log.info("--resume: no checkpoint in %s yet; starting at step 0", restore_dir)
        if not is_chief:
            channel.wait_ready(run_id)
        session = tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=is_chief,
            checkpoint_dir=restore_dir if restore_from else None,
            scaffold=scaffold, hooks=[sync_hook], config=config,
            save_checkpoint_secs=None, save_checkpoint_steps=None,
            save_summaries_steps=None, save_summaries_secs=None,
            log_step_count_steps=None, stop_grace_period_secs=STOP_GRACE_SECONDS)
        # Never closed: roles.train ends the process with os._exit right after the
        # final event, and closing a chief's session stalls ~15 s cancelling the
        # SyncReplicasOptimizer queue runner that blocks on the ps.
        step = int(session.run(global_step))
        if is_chief:
            channel.announce_ready(run_id)
        restored_step = step if (restore_from or (not is_chief and step > 0)) else None
        reporter.start(restored_step)
        reporter.placement(placements_of(variables))

        def evaluate(at_step: int) -> tuple[float | None, float | None]:
            # The chief alone; the other workers wait for its next gradient meanwhile.
            val_loss, val_accuracy = _evaluate(_raw_session(session), tests, test_inputs, eval_sums)
            reporter.eval(at_step, val_loss, val_accuracy)
            return val_loss, val_accuracy

        step, rate, per_worker, checkpoint = _loop(plan, task, reporter, link, session, loss,
                                                   train_op, batches, step, saver,
                                                   evaluate if is_chief else None)
        stopped = link.stop_requested
        val_loss, val_accuracy = evaluate(step) if is_chief and not stopped else (None, None)
    return TrainResult(global_step=step, val_loss=val_loss, val_accuracy=val_accuracy,
                       examples_per_second=rate, checkpoint=checkpoint,
                       restored_step=restored_step, per_worker=per_worker)


def _loop(plan: TrainPlan, task: TaskInfo, reporter: TaskReporter, link: TrainerLink,
          session: Any, loss: Any, train_op: Any, batches: "_Feeder", step: int, saver: Any,
          evaluate: Callable[[int], Any] | None
          ) -> tuple[int, float | None, dict[str, float] | None, str | None]:
    """Steps until the global step reaches the budget; returns (step, rate, per-worker rates, checkpoint).

    ``train_op`` yields the new global step: SyncReplicasOptimizer's train op is the
    assignment of the token it dequeued, and the token is the global step.
    """
    prefix = os.path.join(plan.checkpoint_dir, CHECKPOINT_NAME) if saver and plan.checkpoint_dir else None
    timeout = tf.compat.v1.RunOptions(timeout_in_ms=int(plan.collective_timeout * 1000))
    traced = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    traced.MergeFrom(timeout)
    tracer = StepTracer.from_env(reporter.writer.path)  # PSCLUSTER_TRACE_STEPS (roles/steptrace.py)
    meter = ProgressMeter(reporter)
    checkpoint = None
    last_saved = -1
    schedule = StepSchedule(plan, step)
    first = FirstStep(link, meter)
    # --snapshot-every: only the chief saves (the variables live on the ps), so its clock alone
    # says when, between two of its steps.
    snapshot_every = plan.snapshot_every or 0.0
    next_snapshot = time.monotonic() + snapshot_every
    # stop_requested (SIGTERM or --deadline): end after this step; the chief saves below.
    while step < plan.steps_total and not (first.done and link.stop_requested):
        previous = step
        # The first step waits for every worker to arrive: bounded by the start
        # deadline, not by the per-step timeout.
        try:
            feed = batches.next_feed()
            if first.done and tracer.wants(step):
                metadata = tf.compat.v1.RunMetadata()
                began = time.perf_counter()
                loss_value, step = session.run([loss, train_op], feed_dict=feed, options=traced,
                                               run_metadata=metadata)
                tracer.add(time.perf_counter() - began, metadata.step_stats)
            else:
                loss_value, step = session.run([loss, train_op], feed_dict=feed,
                                               options=timeout if first.done else None)
        except tf.errors.DeadlineExceededError:
            if not link.stop_requested:
                raise
            # Another worker stopped first (each has its own --deadline timer): this step
            # never completes; the variables on the ps still hold step `previous`.
            step = previous
            break
        step = int(step)
        n = max(step - previous, 1)
        counted = first.counts(step, float(loss_value))
        reporter.trained(step, n, n * plan.global_batch_size, float(loss_value), timed=counted)
        if counted:
            meter.add(n, n * plan.global_batch_size, float(loss_value),
                      [(task.name, n * plan.worker_batch_size)])
            meter.maybe_emit(step)
        reached = schedule.reached(step)
        if prefix and (reached.checkpoint or (snapshot_every and time.monotonic() >= next_snapshot)):
            checkpoint = _save(saver, session, prefix, step, reporter)
            last_saved = step
            next_snapshot = time.monotonic() + snapshot_every
        if evaluate and reached.evaluate:
            meter.maybe_emit(step, force=True)  # the evaluation's line comes with the loss up to it
            evaluate(step)
    link.disarm()
    meter.maybe_emit(step, force=True)
    if prefix and step != last_saved:
        checkpoint = _save(saver, session, prefix, step, reporter)
    return step, meter.overall_rate(), meter.overall_per_worker(), checkpoint


class _Feeder:
    """Batches of an eager ``tf.data`` pipeline, as feeds for a graph's placeholders.

    A thread of its own walks the pipeline: a thread without a default graph runs
    eagerly, while the training loop runs with the graph as the default. It works
    ahead by ``depth`` batches, so the next feed is ready when a step returns.
    """

    def __init__(self, dataset: tf.data.Dataset, depth: int = 4) -> None:
        self._dataset = dataset
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._placeholders: tuple[Any, ...] = ()
        threading.Thread(target=self._produce, name="syncps-input", daemon=True).start()

    def placeholders(self, name: str) -> tuple[Any, ...]:
        """The placeholders its feeds fill, made in the graph being built."""
        self._placeholders = _placeholders(self._dataset, name)
        return self._placeholders

    def next_feed(self) -> dict[Any, Any]:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return dict(zip(self._placeholders, item))

    def _produce(self) -> None:
        try:
            for element in self._dataset:
                self._queue.put(_as_numpy(element))
            self._queue.put(RuntimeError("the training data ended although it repeats forever"))
        except Exception as e:  # noqa: BLE001 - handed to the training loop, which raises it
            self._queue.put(e)


def _placeholders(dataset: tf.data.Dataset, name: str) -> tuple[Any, ...]:
    """One placeholder per component of ``dataset``'s elements, in the graph being built."""
    return tuple(tf.compat.v1.placeholder(spec.dtype, spec.shape, name=f"{name}_{i}")
                 for i, spec in enumerate(tf.nest.flatten(dataset.element_spec)))


def _as_numpy(element: Any) -> tuple[Any, ...]:
    return tuple(t.numpy() for t in tf.nest.flatten(element))


def _batches(dataset: tf.data.Dataset) -> list[tuple[Any, ...]]:
    """Every batch of a finite dataset as numpy arrays (called eagerly, before the graph)."""
    return [_as_numpy(element) for element in dataset]


def _evaluate(session: Any, tests: list[tuple[Any, ...]], inputs: tuple[Any, ...], sums: Any
              ) -> tuple[float | None, float | None]:
    totals = [0.0, 0.0, 0.0]
    for batch in tests:
        totals = [t + float(b) for t, b in zip(totals, session.run(sums, feed_dict=dict(zip(inputs, batch))))]
    return means(totals)


def _save(saver: Any, session: Any, prefix: str, step: int, reporter: TaskReporter) -> str:
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    # No .meta file: the graph embeds the job's in-memory data (100 MB for MNIST).
    path = saver.save(_raw_session(session), prefix, global_step=step,
                      write_meta_graph=False)
    reporter.checkpoint(step, path)
    return path


def _raw_session(session: Any) -> Any:
    """The ``tf.compat.v1.Session`` inside a MonitoredSession.

    Why: ``Saver.save`` accepts only a real ``Session``, and MonitoredSession has no
    public accessor for the one it wraps.
    """
    return session._tf_sess()  # noqa: SLF001
