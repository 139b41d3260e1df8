"""Async mode: ParameterServerStrategy driven by the chief's own training loop.

Runs on the ``chief`` task only; ps and workers are standing ``roles.server``
processes. Keras 3 ``model.fit`` does not work under ParameterServerStrategy (docs/platform-notes.md TF4),
so the loop is ours:

* variables (model and optimizer state) are created eagerly in ``strategy.scope()``
  and land round-robin on the ps tasks; the optimizer's ``iterations`` is the global
  step;
* each worker reads its own shard through ``create_per_worker_dataset`` (the dataset
  function is traced once; ``experimental_get_current_worker_index`` tells each worker
  which shard is its own);
* one scheduled closure runs ``steps_per_execution`` steps in a ``tf.range`` loop,
  because the coordinator->worker round trip costs as much as many small steps;
* the optimizer's update is one fused kernel per variable where TensorFlow has an exact
  one (roles/raw_updates.py), else Keras' ``apply_gradients``;
* warm start: the first ``warmup_steps`` run one closure at a time (on one worker while
  the others load the step function), then every worker trains;
* at most a few closures per worker are in flight: enough to keep every worker busy,
  few enough that the loop wakes often to report progress and that a checkpoint
  boundary is reached soon after it is scheduled;
* checkpoints are written by the chief alone (``experimental_io_device``), after
  ``coordinator.join()`` so they hold a consistent step; on a stop, the closures in flight
  get :data:`STOP_DRAIN_SECONDS` to finish; if one does not (a lost worker's), the chief
  cannot save (TensorFlow holds its writes behind that closure) and ends at once; a checkpoint
  due while a closure runs late (a lost worker's, not yet cut loose) waits for it, the others
  training meanwhile;
* closures are collected in any order (the oldest that has its result, copied to the chief):
  a slow or lost worker's closure never holds the others';
* a worker that fails is counted out and its closure runs on another worker; it is taken back
  when it answers again (roles/workerloss.py); a closure that hangs is made to fail
  (roles/closures.py). No checkpoint is restored for either;
* evaluation runs on the chief itself, reading the variables from the ps tasks;
* workers join and leave without a restart when the orchestrator asks, between two
  closures (roles/membership.py): the chief waits for what is in flight, points its
  context and the coordinator at the new cluster and creates the per-worker datasets
  again, sharded by the new count.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import tensorflow as tf

from roles import closures, workerloss
from roles.checkpoint import (CheckpointKeeper, chief_io_device, make_checkpoint,
                              make_step_counter)
from roles.datasets import eval_dataset, sample_batch, train_dataset
from roles.evaluation import EVAL_BATCH_SIZE, make_evaluator, means
from roles.jobs import Job, Shard
from roles.lifecycle import TrainerLink
from roles.membership import MembershipRefused, Requests, apply_change, control_path, plan_change
from roles.settings import StepSchedule, TrainPlan
from roles.raw_updates import fused_apply, unsupported
from roles.reporting import FirstStep, ProgressMeter, Reporter, TrainResult, placements_of
from roles.tfconfig import ConfigError, TaskInfo

log = logging.getLogger("pscluster.async")

# The run's TensorFlow functions and per-worker datasets, kept until the process ends
# (roles.train ends async trainers with os._exit after the final event). Freeing them
# when ``run`` returns removes each function from every worker's context
# (Context.remove_function), which stalled for ~20 s in 3 runs out of 9 here, before
# the ``done`` event (or before a failure was reported).
_KEEP_UNTIL_EXIT: list[Any] = []

# Closures in flight per worker: 2 keeps a worker's queue non-empty while the chief
# handles the previous result; more only delays progress reports and checkpoints.
IN_FLIGHT_PER_WORKER = 2
SNAPSHOT_AFTER_LOSS = 30.0      # seconds after a worker went out before the chief snapshots again

# After a stop request, the closures in flight get this long to finish (or twice the slowest
# closure seen, from schedule to result, if that is longer: a big model's closures take longer),
# counted from the request or from the last closure that finished. A closure whose worker was lost or froze may
# never do (its coordinator thread waits on the worker, and fetch() would block for good); then
# the chief cannot save either (see the end of ``run``) and ends at once, instead of waiting
# out the stop's grace.
STOP_DRAIN_SECONDS = 2.0
WAIT_SLICE = 0.2


def drain_limit(slowest: float) -> float:
    """How long, after a stop, the chief waits for a closure to return before it ends without
    saving: :data:`STOP_DRAIN_SECONDS`, or twice the slowest closure seen if that is longer."""
    return max(STOP_DRAIN_SECONDS, 2.0 * slowest)


def _finished_within(remote: Any, timeout: float) -> bool:
    """Whether the closure behind ``remote`` has its result here (or its error), waiting up to
    ``timeout``. TensorFlow's RemoteValue has no public wait with a timeout: its event is read
    where it exists, else the caller's fetch() blocks as before.

    The event says that the closure ran, not that its result was copied to the chief: the
    coordinator's worker thread copies it next (``RemoteValue.get``, under a lock), and a copy
    from a worker whose link was cut at that moment hangs, holding the lock. A fetch() then
    blocked the chief's loop with no watch running (issue 41's silent hang, seen with py-spy:
    the main thread in ``RemoteValueImpl.get``, worker 1's thread in ``_copy_to_local``). So a
    result counts only once it is copied; until then the watch sees the worker busy and cuts it
    loose, and TensorFlow runs the closure again elsewhere."""
    event = getattr(remote, "_status_available_event", None)
    if event is None:
        return True
    if not event.wait(timeout):
        return False
    return (getattr(remote, "_has_fetched_to_local", True) or getattr(remote, "_error", None) is not None
            or getattr(remote, "_values", None) is None)


# complexity 66 (C901 allows 15): the async chief's whole loop with its closures (collect, worker
# loss, warm start, snapshots, finish); issue 43 item 5 makes it an AsyncTrainer with one method
# each, to be done before the ps move of issue 44 is wired in (roles/psmove.py).
def run(job: Job, plan: TrainPlan, task: TaskInfo, reporter: Reporter,  # noqa: C901
        deadline: TrainerLink) -> TrainResult:
    if task.task_type != "chief":
        raise ConfigError(f"async mode runs on the chief task only; this is {task.name} "
                          f"(ps and workers run roles.server)")
    if task.num_ps < 1:
        raise ConfigError("async mode needs at least one 'ps' task in TF_CONFIG")

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    x0, _ = sample_batch(job, plan.seed)
    with strategy.scope():
        model = job.build_model()
        model(x0, training=False)  # create the variables now, on the ps tasks
        optimizer = job.optimizer(plan.learning_rate)
        optimizer.build(model.trainable_variables)
        # Not optimizer.iterations: Keras 3 increments it with assign(v + 1), a
        # read-modify-write that loses counts when workers update concurrently (300
        # scheduled steps showed as 292). tf.Variable.assign_add is one atomic op.
        step_var = make_step_counter()

    keeper = None
    restored_step = None
    if plan.checkpoint_dir:
        keeper = CheckpointKeeper(make_checkpoint(model, optimizer, step_var),
                                  plan.checkpoint_dir,
                                  io_device=chief_io_device(task.task_type, task.task_index))
        if plan.resume:
            path = keeper.restore_latest()
            if path is not None:
                restored_step = int(step_var.numpy())
                log.info("restored %s at step %d", path, restored_step)
            else:
                log.info("--resume: no checkpoint in %s yet; starting at step 0",
                         plan.checkpoint_dir)

    requests = Requests(control_path(reporter.writer.path))    # before "start": the orchestrator asks after it
    reporter.start(restored_step)
    reporter.placement(placements_of(
        list(model.weights) + list(optimizer.variables) + [step_var]))

    def per_worker_datasets(count: int) -> Any:
        def dataset_fn() -> tf.data.Dataset:
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            shard = Shard(index=index, count=count, split="train", seed=plan.seed)
            return train_dataset(job, shard, plan.worker_batch_size)

        began = time.perf_counter()
        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        _KEEP_UNTIL_EXIT.append(iterator)
        log.info("per-worker datasets for %d worker(s) created in %.2f s", count, time.perf_counter() - began)
        return iterator

    workers = plan.workers
    per_worker_iterator = per_worker_datasets(workers)
    apply = fused_apply(optimizer, model.trainable_variables)
    if apply is None:
        log.info("optimizer update: Keras' apply_gradients (no fused kernel: %s)",
                 unsupported(optimizer, model.trainable_variables))
    train_steps = _make_train_steps(job, plan, strategy, model, optimizer, step_var, apply)

    evaluator = make_evaluator(job, model, read_once=True)
    _KEEP_UNTIL_EXIT.extend([coordinator, train_steps, evaluator])
    test_data = eval_dataset(job, Shard(0, 1, "test", plan.seed), EVAL_BATCH_SIZE)

    def evaluate() -> tuple[float | None, float | None]:
        # On the chief, reading the variables from the ps tasks; queued closures keep
        # the workers busy meanwhile.
        step = int(step_var.numpy())
        began = time.perf_counter()
        val_loss, val_accuracy = means(evaluator(test_data).numpy())
        log.info("evaluated at step %d in %.2f s", step, time.perf_counter() - began)
        reporter.eval(step, val_loss, val_accuracy)
        return val_loss, val_accuracy

    meter = ProgressMeter(reporter)
    start_step = int(step_var.numpy())
    scheduled = start_step
    schedule = StepSchedule(plan, start_step)
    in_flight: collections.deque[tuple[Any, int, float]] = collections.deque()   # (value, steps, scheduled at)
    max_in_flight = IN_FLIGHT_PER_WORKER * workers
    cluster = resolver.cluster_spec().as_dict()
    last_checkpoint = keeper.latest() if keeper else None
    last_saved_step = -1
    first = FirstStep(deadline, meter)
    # Steps of the closures collected so far: closures are collected in the order they were
    # scheduled, so this is the step each one brought the job to (for TensorBoard's points).
    finished = start_step

    stop_seen: float | None = None      # when the loop first saw the stop request
    last_done = time.monotonic()        # when the last closure was collected
    abandoned = False                   # a stop left closures in flight (see STOP_DRAIN_SECONDS)
    slowest = 0.0                       # the longest a collected closure took from schedule to result
    # A worker that fails is counted out and its closure runs elsewhere; it comes back when it
    # answers again (roles/workerloss.py). A closure whose worker vanished without a word never
    # returns by itself: the watch says which worker the chief waits on, and makes a hung closure
    # fail so that the worker is counted out (roles/closures.py).
    workerloss.install()
    # Training input repeats forever (roles/datasets.py): its end is a worker's broken iterator.
    loss = workerloss.WorkerLoss(coordinator, cluster.get("worker", []), endless_input=True)
    watch = (closures.ClosureWatch(cluster.get("worker", []), reporter.writer.emit,
                                   busy=lambda: {i: t for i, t in closures.running().items() if i not in loss.out()})
             if closures.install() else None)

    def ready() -> int | None:
        """The position in ``in_flight`` of a closure that has its result, oldest first."""
        for position, (remote, _, _) in enumerate(in_flight):
            if _finished_within(remote, 0):
                return position
        return None

    def wait_target(now: float) -> Any:
        """The closure to wait on for one slice: the oldest one not yet late (a late one may be a
        lost worker's, while the others keep finishing), else the oldest."""
        late = closures.waiting_after(slowest)
        return next((remote for remote, _, sent in in_flight if now - sent <= late), in_flight[0][0])

    pending: collections.deque[dict] = collections.deque()    # the orchestrator's requests, for the loop

    def take_requests() -> None:
        """Read the orchestrator's requests; a lost host's workers are cut loose at once (whatever
        the loop waits on), anything else waits for the loop, between two closures."""
        request = requests.poll()
        if request is None:
            return
        if isinstance(request.get("cut"), list):
            addresses = [str(address) for address in request["cut"][:64]]
            shut = sum(closures.cut_connections(address) for address in addresses)
            log.warning("the orchestrator lost %s: %d connection(s) shut", ", ".join(addresses), shut)
            reporter.writer.emit("membership", seq=request["seq"], cut=shut)
        else:
            pending.append(request)

    def look_out() -> None:
        """Beside the loop (closures.Lookout), once the workers run and until a stop: the
        orchestrator's requests, and the watch of the closures in flight."""
        if not first.done or deadline.stop_requested:
            return
        take_requests()
        if watch is not None:
            now = time.monotonic()
            watch.check(now, now - last_done, slowest, finished)

    def collect_one(until_late: float | None = None) -> bool:
        """Collect one closure in flight, the oldest that has its result: closures finish out of
        order when a worker is slow or lost, and the others' must not wait behind it. False,
        leaving them in flight, once a stop was requested and no closure finished for
        :func:`drain_limit` (a lost worker's: ``abandoned``), or, with ``until_late``, as soon
        as a closure in flight has run that long (a checkpoint's drain gives way)."""
        nonlocal finished, stop_seen, last_done, abandoned, slowest
        position = ready()
        while not abandoned and position is None:
            now = time.monotonic()
            if deadline.stop_requested:
                stop_seen = now if stop_seen is None else stop_seen
                abandoned = now - max(stop_seen, last_done) > drain_limit(slowest)
            elif first.done and until_late is not None and any(now - sent > until_late for _, _, sent in in_flight):
                return False
            _finished_within(wait_target(now), WAIT_SLICE)
            position = ready()
        if abandoned or position is None:
            return False
        remote, n, sent = in_flight[position]
        del in_flight[position]
        last_done = time.monotonic()
        if first.done:      # the first closures wait on the workers' warm-up
            slowest = max(slowest, last_done - sent)
        try:
            loss, worker = remote.fetch()
        except tf.errors.UnavailableError:
            # fetch() copies the result from the worker that ran the closure. A closure that
            # failed raised above with its own error; one that ran to its end (no _error) and
            # whose worker died before the copy has its steps on the ps already: only its
            # loss and worker index are lost. (A ps failure still ends the trainer.)
            if getattr(remote, "_error", True) is not None:
                raise
            log.warning("a closure of %d steps finished on a worker that died before its "
                        "result was copied; its steps count, its loss is lost", n)
            finished += n
            return True
        if n == 0:  # a warm start's closure that only loaded the step function
            return True
        finished += n
        counted = first.counts(finished, float(loss))
        if not counted:
            log.info("first closure returned: the workers run")
        examples = n * plan.worker_batch_size
        reporter.trained(finished, n, examples, float(loss), timed=counted)
        if not counted:
            return True
        meter.add(n, examples, float(loss), [(f"worker:{int(worker)}", examples)])
        if meter.due():
            meter.maybe_emit(int(step_var.numpy()))
        return True

    def drain(until_late: float | None = None) -> bool:
        """Collect every closure in flight; False if a stop left some behind (``abandoned``), or
        with ``until_late``, once one has run that long (:func:`collect_one`)."""
        while in_flight:
            if not collect_one(until_late):
                return False
        return True

    # deadline.stop_requested (SIGTERM or --deadline): stop scheduling, let what is in
    # flight finish, save below and skip the final evaluation.
    def any_late(now: float) -> bool:
        """Whether a closure in flight has run past :func:`closures.waiting_after` (a slow or lost
        worker's)."""
        late = closures.waiting_after(slowest)
        return first.done and any(now - sent > late for _, _, sent in in_flight)

    checkpoint_due = False
    snapshot_every = plan.snapshot_every or 0.0
    next_snapshot = time.monotonic() + snapshot_every

    def report_news() -> None:
        for what, index, why in loss.news():
            reporter.writer.emit("worker", worker=f"worker:{index}", state=what, reason=why,
                                 step=int(step_var.numpy()))
            log.warning("worker:%d %s%s", index, "is out" if what == "lost" else "is back",
                        f" ({why})" if why else "")

    # Stopped after the last drain; a failure ends the process (roles.train), the thread with it.
    lookout = closures.Lookout(look_out, WAIT_SLICE).start()
    while scheduled < plan.steps_total and not deadline.stop_requested:
        report_news()
        max_in_flight = IN_FLIGHT_PER_WORKER * loss.live(workers)
        back = loss.rejoin_ready()
        if back:
            began = time.perf_counter()
            if loss.rejoin(back):
                log.info("worker(s) %s taken back in %.2f s", back, time.perf_counter() - began)
            continue        # its news next turn
        request = pending.popleft() if pending else None
        if request is not None:
            try:
                added, removed = plan_change(cluster, request.get("cluster"))
            except MembershipRefused as exc:
                log.warning("membership change %d refused: %s", request["seq"], exc)
                reporter.writer.emit("membership", seq=request["seq"], refused=str(exc))
            else:
                began = time.perf_counter()
                if not drain():         # a leaving worker finishes its closure first
                    break
                coordinator.join()
                loss.forget(range(len(request["cluster"]["worker"]), workers))
                apply_change(strategy, coordinator, request["cluster"], added, removed)
                cluster, workers = dict(request["cluster"]), len(request["cluster"]["worker"])
                loss.follow(coordinator, cluster["worker"])
                if watch is not None:
                    watch.workers = list(cluster["worker"])
                per_worker_iterator = per_worker_datasets(workers)
                max_in_flight = IN_FLIGHT_PER_WORKER * workers
                reporter.writer.emit("membership", seq=request["seq"], workers=workers,
                                     step=int(step_var.numpy()), added=len(added), removed=removed,
                                     seconds=round(time.perf_counter() - began, 3))
        n = schedule.chunk(scheduled)
        if scheduled <= plan.warmup_steps:
            # Warm start: the previous closure (the last one before the boundary too) ends
            # before this one is scheduled, so no two run at once. Waiting here rather than
            # after scheduling lets an evaluation run while the worker trains.
            if not drain():
                break
            if start_step < scheduled == plan.warmup_steps:   # StepSchedule cuts a chunk there
                log.info("warm start over at step %d: all %d workers train", scheduled, workers)
        began = time.perf_counter()
        if scheduled == start_step and start_step < plan.warmup_steps:
            # Warm start: one worker trains; each other worker runs the function for zero
            # steps, which loads it there, so that all are ready when all train.
            for _ in range(workers - 1):
                in_flight.append((coordinator.schedule(
                    train_steps, args=(per_worker_iterator, tf.constant(0))), 0, time.monotonic()))
            log.info("warm start: steps %d-%d run one closure at a time", start_step, plan.warmup_steps)
        remote = coordinator.schedule(train_steps, args=(per_worker_iterator, tf.constant(n)))
        if scheduled == start_step:
            log.info("train function traced, first closure scheduled in %.2f s",
                     time.perf_counter() - began)
        in_flight.append((remote, n, time.monotonic()))
        scheduled += n
        # One closure per worker, then wait for the first: every worker warms up (its
        # function and input pipeline) at the same time, and the start deadline
        # measures the cluster, not a queue of work. Only the first closure stays out
        # of the rates (the others' warm-ups overlap it).
        if not first.done and len(in_flight) == workers:
            # The workers are busy with their first closures and the chief would only
            # wait: trace the evaluation now rather than in the first evaluation.
            evaluator.get_concrete_function(test_data)
        while in_flight and (len(in_flight) >= max_in_flight
                             or (not first.done and len(in_flight) >= workers)):
            if not collect_one():
                break
        reached = schedule.reached(scheduled)
        checkpoint_due = checkpoint_due or reached.checkpoint
        if checkpoint_due and not deadline.stop_requested and not any_late(time.monotonic()):
            # A checkpoint needs every closure in flight collected (a consistent step). One
            # running late may be a lost worker's, which returns only once it is cut loose (the
            # orchestrator's word, or the watch's 20 s or more): the drain gives way once a closure
            # runs late (closures.waiting_after), the others train on, and the checkpoint waits.
            if drain(until_late=closures.waiting_after(slowest)):
                checkpoint_due = False
                coordinator.join()  # a consistent step on disk
                if keeper:
                    last_saved_step = int(step_var.numpy())
                    last_checkpoint = keeper.save_and_report(last_saved_step, reporter) or last_checkpoint
            elif abandoned:
                break
        now = time.monotonic()
        # Not in the first SNAPSHOT_AFTER_LOSS s after a worker went out: the chief's first save
        # then waits until TensorFlow's pending ops to the lost worker fail (16-19 s measured,
        # the chief holding every closure meanwhile); later saves do not.
        if (keeper and snapshot_every and now >= next_snapshot and first.done and not checkpoint_due
                and not deadline.stop_requested and not any_late(now)
                and not 0.0 < loss.out_for() < SNAPSHOT_AFTER_LOSS):
            # A snapshot: saved while the closures in flight keep running (no drain, no join), so it
            # costs the chief the save alone; its step is read first, and the variables it holds
            # may have a few later updates (async training has no one consistent step anyway).
            step_now = int(step_var.numpy())
            if step_now > last_saved_step:
                began = time.perf_counter()
                last_saved_step = step_now
                last_checkpoint = keeper.save_and_report(step_now, reporter) or last_checkpoint
                log.info("snapshot at step %d in %.2f s, training went on", step_now, time.perf_counter() - began)
            next_snapshot = time.monotonic() + snapshot_every
        if reached.evaluate:
            while in_flight and not first.done:  # no evaluation of the untrained model
                if not collect_one():
                    break
            meter.maybe_emit(int(step_var.numpy()), force=True)  # the evaluation's line comes with the loss up to it
            evaluate()
    drained = drain()
    lookout.stop()
    if drained:
        coordinator.join()
    else:
        # TensorFlow holds every later write of the chief (a variable's assign, a checkpoint's
        # SaveV2) behind a closure that waits on an unresponsive worker; reads still pass.
        # Measured with a frozen worker: the save hung until the stop's grace ran out. So the
        # chief ends at once, and the job resumes from its last checkpoint.
        log.warning("%d closure(s) did not finish within %.1f s of the stop (a worker lost or "
                    "frozen): ending without a checkpoint (TensorFlow would hold the save behind "
                    "them); the last one is %s", len(in_flight), drain_limit(slowest),
                    last_checkpoint or "none")
    report_news()
    deadline.disarm()  # nothing to train (resumed at the budget): still a clean start
    final_step = int(step_var.numpy())
    meter.maybe_emit(final_step, force=True)
    rate = meter.overall_rate()

    if keeper and last_saved_step != final_step and not abandoned:
        last_checkpoint = keeper.save_and_report(final_step, reporter) or last_checkpoint

    val_loss, val_accuracy = (None, None) if deadline.stop_requested else evaluate()
    return TrainResult(global_step=final_step, val_loss=val_loss, val_accuracy=val_accuracy,
                       examples_per_second=rate, checkpoint=last_checkpoint,
                       restored_step=restored_step, per_worker=meter.overall_per_worker(), workers=workers)


def _make_train_steps(job: Job, plan: TrainPlan, strategy: Any, model: Any,
                      optimizer: Any, step_var: tf.Variable, apply: Any) -> Any:
    """The scheduled function: ``n`` steps on one worker's iterator.

    Returns the mean loss over the ``n`` steps and the index of the worker that ran
    them (for the per-worker throughput in progress events); ``n`` = 0 only loads the
    function on a worker. ``apply``: the fused update (roles/raw_updates.py), or None
    for Keras' ``apply_gradients``.
    """

    def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            outputs = model(x, training=True)
            per_example = tf.cast(job.loss(y, outputs), tf.float32)
            loss = tf.nn.compute_average_loss(per_example,
                                              global_batch_size=plan.worker_batch_size)
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        if apply is None:
            optimizer.apply_gradients(zip(grads, variables))
        else:
            apply(grads)
        return loss

    @tf.function
    def train_steps(iterator: Any, n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        total = tf.constant(0.0)
        for _ in tf.range(n):
            x, y = next(iterator)
            per_replica = strategy.run(step_fn, args=(x, y))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        step_var.assign_add(tf.cast(n, tf.int64))
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return total / tf.cast(tf.maximum(n, 1), tf.float32), worker

    return train_steps

