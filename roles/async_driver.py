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
  again, sharded by the new count; a drained worker (``{"retire": [...]}``) leaves anywhere
  in the list, nobody renumbered, once its closure in flight ended (roles/workerloss.py).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Any

import tensorflow as tf

from roles import closures, psmove, workerloss
from roles.checkpoint import (CheckpointKeeper, chief_io_device, make_checkpoint,
                              make_step_counter)
from roles.datasets import eval_dataset, sample_batch, train_dataset
from roles.evaluation import EVAL_BATCH_SIZE, make_evaluator, means
from roles.gradients import loss_and_gradients
from roles.jobs import Job, Shard
from roles.guardian import TrainerLink
from roles.membership import MembershipRefused, Requests, apply_change, control_path, plan_change
from roles.settings import StepSchedule, TrainPlan
from roles.raw_updates import fused_apply, unsupported
from roles.reporting import FirstStep, ProgressMeter, TaskReporter, TrainResult, placements_of
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


def keep_idle(strategy: Any, num_ps: int) -> None:
    """Before the variables exist: the last :func:`psmove.idle_count` ps tasks get none, so that a
    drain of another ps host moves its variables onto one of them in place (roles/psmove.py)."""
    idle = psmove.idle_count(num_ps, os.environ)
    if idle:
        psmove.keep_spares_idle(strategy, idle)
        log.info("ps task(s) %s kept idle: a drained ps's variables move there in place",
                 ", ".join(f"ps:{index}" for index in range(num_ps - idle, num_ps)))


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


def run(job: Job, plan: TrainPlan, task: TaskInfo, reporter: TaskReporter,
        link: TrainerLink) -> TrainResult:
    """Train ``job`` from the chief (roles.train's driver entry point): :class:`AsyncTrainer`."""
    return AsyncTrainer(job, plan, task, reporter, link).run()


InFlight = tuple[Any, int, float]       # a closure's RemoteValue, its steps, when it was scheduled


class AsyncTrainer:
    """The async chief: the model's variables on the ps tasks, then closures of
    ``steps_per_execution`` steps scheduled on the workers and collected until the budget is
    scheduled or a stop is asked for (``link.stop_requested``: SIGTERM or ``--deadline``).

    :meth:`run` is the loop; each turn takes worker news and rejoins (:meth:`take_back`), one
    membership change of the orchestrator (:meth:`change_membership`), schedules one closure
    (:meth:`schedule_one`, with the warm start) and collects what it must, then a checkpoint
    (:meth:`checkpoint_if_due`), a snapshot (:meth:`snapshot_if_due`) and an evaluation when
    they are due. :meth:`finish` drains, saves and evaluates at the end. Beside the loop, a
    lookout thread (:meth:`look_out`) reads the orchestrator's requests and watches the
    closures in flight."""

    def __init__(self, job: Job, plan: TrainPlan, task: TaskInfo, reporter: TaskReporter,
                 link: TrainerLink) -> None:
        if task.task_type != "chief":
            raise ConfigError(f"async mode runs on the chief task only; this is {task.name} "
                              f"(ps and workers run roles.server)")
        if task.num_ps < 1:
            raise ConfigError("async mode needs at least one 'ps' task in TF_CONFIG")
        self.job, self.plan, self.reporter, self.link = job, plan, reporter, link
        self.resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.strategy = tf.distribute.ParameterServerStrategy(self.resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        keep_idle(self.strategy, task.num_ps)
        self._build_model()
        self.keeper, self.restored_step = self._restore(task)

        self.requests = Requests(control_path(reporter.writer.path))    # before "start": the orchestrator asks after it
        reporter.start(self.restored_step)
        reporter.placement(placements_of(self._variables()))

        self.workers = plan.workers
        self.per_worker_iterator = self._per_worker_datasets(self.workers)
        _KEEP_UNTIL_EXIT.append(self.coordinator)
        self._trace()
        self.test_data = eval_dataset(job, Shard(0, 1, "test", plan.seed), EVAL_BATCH_SIZE)

        self.meter = ProgressMeter(reporter)
        self.start_step = int(self.step_var.numpy())
        self.scheduled = self.start_step
        self.schedule = StepSchedule(plan, self.start_step)
        self.in_flight: collections.deque[InFlight] = collections.deque()
        self.max_in_flight = IN_FLIGHT_PER_WORKER * self.workers
        self.cluster = self.resolver.cluster_spec().as_dict()
        # ps tasks whose variables moved to another ps in place (``pscluster drain`` of a ps
        # host, :meth:`move_ps`): task -> the ps that holds them now. ``cluster`` stays the
        # orchestrator's (every ps listed); the context holds psmove.effective_cluster of both.
        self.moved_ps: dict[int, int] = {}
        self.last_checkpoint = self.keeper.latest() if self.keeper else None
        self.last_saved_step = -1
        self.first = FirstStep(link, self.meter)
        # Steps of the closures collected so far: closures are collected in the order they were
        # scheduled, so this is the step each one brought the job to (for TensorBoard's points).
        self.finished = self.start_step

        self.stop_seen: float | None = None      # when the loop first saw the stop request
        self.last_done = time.monotonic()        # when the last closure was collected
        self.abandoned = False                   # a stop left closures in flight (see STOP_DRAIN_SECONDS)
        self.slowest = 0.0                       # the longest a collected closure took from schedule to result
        # A worker that fails is counted out and its closure runs elsewhere; it comes back when it
        # answers again (roles/workerloss.py). A closure whose worker vanished without a word never
        # returns by itself: the watch says which worker the chief waits on, and makes a hung closure
        # fail so that the worker is counted out (roles/closures.py).
        # Training input repeats forever (roles/datasets.py): its end is a worker's broken iterator.
        self.worker_loss = workerloss.WorkerLoss(self.coordinator, self.cluster.get("worker", []),
                                                 endless_input=True)
        self.watch = (closures.ClosureWatch(self.cluster.get("worker", []), reporter.writer.emit,
                                            busy=self._busy)
                      if closures.install() else None)
        workerloss.install()     # after closures': a drained worker's held thread is not one that runs
        self.pending: collections.deque[dict] = collections.deque()    # the orchestrator's requests, for the loop
        self.retiring: list[tuple[int, list[int], float]] = []   # drains asked: (seq, indices, since)
        self.checkpoint_due = False
        self.snapshot_every = plan.snapshot_every or 0.0
        self.next_snapshot = time.monotonic() + self.snapshot_every

    # --- set-up ------------------------------------------------------------------------

    def _build_model(self) -> None:
        x0, _ = sample_batch(self.job, self.plan.seed)
        with self.strategy.scope():
            self.model = self.job.build_model()
            self.model(x0, training=False)  # create the variables now, on the ps tasks
            self.optimizer = self.job.optimizer(self.plan.learning_rate)
            self.optimizer.build(self.model.trainable_variables)
            # Not optimizer.iterations: Keras 3 increments it with assign(v + 1), a
            # read-modify-write that loses counts when workers update concurrently (300
            # scheduled steps showed as 292). tf.Variable.assign_add is one atomic op.
            self.step_var = make_step_counter()

    def _restore(self, task: TaskInfo) -> tuple[CheckpointKeeper | None, int | None]:
        """The chief's checkpoint keeper (None without ``--checkpoint-dir``) and the step it
        restored (``--resume``), if any."""
        plan = self.plan
        if not plan.checkpoint_dir:
            return None, None
        keeper = CheckpointKeeper(make_checkpoint(self.model, self.optimizer, self.step_var),
                                  plan.checkpoint_dir,
                                  io_device=chief_io_device(task.task_type, task.task_index))
        if not plan.resume:
            return keeper, None
        path = keeper.restore_latest()
        if path is None:
            log.info("--resume: no checkpoint in %s yet; starting at step 0", plan.checkpoint_dir)
            return keeper, None
        restored = int(self.step_var.numpy())
        log.info("restored %s at step %d", path, restored)
        return keeper, restored

    def _trace(self) -> None:
        """The functions that capture the variables' handles: the scheduled steps, the
        evaluation, the checkpoint's save (again after a ps moved: :meth:`move_ps`)."""
        apply = fused_apply(self.optimizer, self.model.trainable_variables)
        if apply is None:
            log.info("optimizer update: Keras' apply_gradients (no fused kernel: %s)",
                     unsupported(self.optimizer, self.model.trainable_variables))
        self.train_steps = _make_train_steps(self.job, self.plan, self.strategy, self.model, self.optimizer,
                                             self.step_var, apply)
        self.evaluator = make_evaluator(self.job, self.model, read_once=True)
        _KEEP_UNTIL_EXIT.extend([self.train_steps, self.evaluator])

    def _variables(self) -> list[Any]:
        """Every variable the job keeps on the ps tasks."""
        return list(self.model.weights) + list(self.optimizer.variables) + [self.step_var]

    def _per_worker_datasets(self, count: int) -> Any:
        job, plan = self.job, self.plan

        def dataset_fn() -> tf.data.Dataset:
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            shard = Shard(index=index, count=count, split="train", seed=plan.seed)
            return train_dataset(job, shard, plan.worker_batch_size)

        began = time.perf_counter()
        iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))
        _KEEP_UNTIL_EXIT.append(iterator)
        log.info("per-worker datasets for %d worker(s) created in %.2f s", count, time.perf_counter() - began)
        return iterator

    def _busy(self) -> dict[int, float]:
        """The workers running a closure now, and since when, less those counted out."""
        return {i: t for i, t in closures.running().items() if i not in self.worker_loss.out()}

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Schedule and collect closures until the budget or a stop; then :meth:`finish`."""
        # Stopped after the last drain; a failure ends the process (roles.train), the thread with it.
        lookout = closures.Lookout(self.look_out, WAIT_SLICE).start()
        while self.scheduled < self.plan.steps_total and not self.link.stop_requested:
            self.report_news()
            self.answer_retired()
            self.max_in_flight = IN_FLIGHT_PER_WORKER * self.worker_loss.live(self.workers)
            if self.take_back():
                continue        # its news next turn
            if not self.change_membership() or not self.schedule_one():
                break
            reached = self.schedule.reached(self.scheduled)
            self.checkpoint_due = self.checkpoint_due or reached.checkpoint
            if not self.checkpoint_if_due():
                break
            self.snapshot_if_due()
            if reached.evaluate:
                while self.in_flight and not self.first.done:  # no evaluation of the untrained model
                    if not self.collect_one():
                        break
                self.meter.maybe_emit(int(self.step_var.numpy()), force=True)  # the evaluation's line comes with the loss up to it
                self.evaluate()
        return self.finish(lookout)

    def take_back(self) -> bool:
        """Take back the workers counted out that answer again; True if any was."""
        back = self.worker_loss.rejoin_ready()
        if not back:
            return False
        began = time.perf_counter()
        if self.worker_loss.rejoin(back):
            log.info("worker(s) %s taken back in %.2f s", back, time.perf_counter() - began)
        return True

    def change_membership(self) -> bool:
        """Apply the orchestrator's next membership change, if one waits, between two closures
        (roles/membership.py); False if a stop left closures in flight while draining for it."""
        request = self.pending.popleft() if self.pending else None
        if request is None:
            return True
        if "retire" in request:
            self.retire(request)
            return True
        if "move_ps" in request:
            return self.move_ps(request)
        try:
            added, removed = plan_change(self.cluster, request.get("cluster"))
        except MembershipRefused as exc:
            log.warning("membership change %d refused: %s", request["seq"], exc)
            self.reporter.writer.emit("membership", seq=request["seq"], refused=str(exc))
            return True
        began = time.perf_counter()
        if not self.drain():         # a leaving worker finishes its closure first
            return False
        self.coordinator.join()
        self.worker_loss.forget(range(len(request["cluster"]["worker"]), self.workers))
        apply_change(self.strategy, self.coordinator, psmove.effective_cluster(request["cluster"], self.moved_ps),
                     added, removed)
        self.cluster, self.workers = dict(request["cluster"]), len(request["cluster"]["worker"])
        self.worker_loss.follow(self.coordinator, self.cluster["worker"])
        if self.watch is not None:
            self.watch.workers = list(self.cluster["worker"])
        self.per_worker_iterator = self._per_worker_datasets(self.workers)
        self.max_in_flight = IN_FLIGHT_PER_WORKER * self.workers
        self.reporter.writer.emit("membership", seq=request["seq"], workers=self.workers,
                                  step=int(self.step_var.numpy()), added=len(added), removed=removed,
                                  seconds=round(time.perf_counter() - began, 3))
        return True

    def move_ps(self, request: dict) -> bool:
        """``{"seq", "move_ps": {"ps": K, "to": J}}`` (``pscluster drain HOST`` of a ps host): with
        nothing in flight, ps:K's variables move to ps:J, a ps of the cluster since the chief's
        start (roles/psmove.py; TensorFlow 2.21 takes no new server in place), and the functions
        that hold their handles are traced again; training goes on, nothing restored. False if a
        stop left closures in flight while draining for it."""
        try:
            move = psmove.plan_request(psmove.effective_cluster(self.cluster, self.moved_ps), request["move_ps"])
        except psmove.MoveRefused as exc:
            log.warning("ps move %d refused: %s", request["seq"], exc)
            self.reporter.writer.emit("membership", seq=request["seq"], refused=str(exc))
            return True
        began = time.perf_counter()
        if not self.drain():
            return False
        self.coordinator.join()
        variables = self._variables()
        report = psmove.move_variables(self.strategy, self.coordinator, variables, move)
        self.moved_ps = {**{k: move.destination.get(v, v) for k, v in self.moved_ps.items()}, **move.destination}
        self._trace()
        if self.keeper:
            self.keeper.retrace()
        self.reporter.placement(placements_of(variables))
        moved = {f"ps:{k}": f"ps:{v}" for k, v in move.destination.items()}
        log.info("ps moved in place: %s (%d variable(s), %d bytes, %.2f s)", moved, report.variables,
                 report.bytes, time.perf_counter() - began)
        self.reporter.writer.emit("membership", seq=request["seq"], moved=moved, step=int(self.step_var.numpy()),
                                  variables=report.variables, bytes=report.bytes,
                                  seconds=round(time.perf_counter() - began, 3))
        return True

    def retire(self, request: dict) -> None:
        """``{"seq", "retire": [worker addresses]}`` (``pscluster drain HOST``): those workers take
        no new closure (roles/workerloss.py); :meth:`answer_retired` says when their last ended."""
        addresses = request["retire"] if isinstance(request["retire"], list) else []
        workers = list(self.cluster.get("worker", []))
        indices = sorted({workers.index(a) for a in addresses if isinstance(a, str) and a in workers})
        if not indices or len(indices) != len(addresses):
            refused = f"not workers of this cluster: {[a for a in addresses if a not in workers][:4]}"
        elif not set(range(self.workers)) - self.worker_loss.out() - set(indices):
            refused = "it leaves no worker that trains"
        else:
            self.worker_loss.retire(indices)
            self.retiring.append((request["seq"], indices, time.perf_counter()))
            return
        log.warning("drain %d refused: %s", request["seq"], refused)
        self.reporter.writer.emit("membership", seq=request["seq"], refused=refused)

    def answer_retired(self) -> None:
        """A ``membership`` event for each drain whose workers have no closure left running."""
        for entry in list(self.retiring):
            seq, indices, since = entry
            if self.worker_loss.idle(indices):
                self.retiring.remove(entry)
                self.reporter.writer.emit("membership", seq=seq, retired=[f"worker:{i}" for i in indices],
                                          step=int(self.step_var.numpy()),
                                          seconds=round(time.perf_counter() - since, 3))

    def schedule_one(self) -> bool:
        """Schedule the next closure (in the warm start, after the one before it ended), then
        collect until fewer than the limit are in flight; False if a stop left closures behind
        during the warm start's drain."""
        plan = self.plan
        n = self.schedule.chunk(self.scheduled)
        if self.scheduled <= plan.warmup_steps:
            # Warm start: the previous closure (the last one before the boundary too) ends
            # before this one is scheduled, so no two run at once. Waiting here rather than
            # after scheduling lets an evaluation run while the worker trains.
            if not self.drain():
                return False
            if self.start_step < self.scheduled == plan.warmup_steps:   # StepSchedule cuts a chunk there
                log.info("warm start over at step %d: all %d workers train", self.scheduled, self.workers)
        began = time.perf_counter()
        if self.scheduled == self.start_step and self.start_step < plan.warmup_steps:
            # Warm start: one worker trains; each other worker runs the function for zero
            # steps, which loads it there, so that all are ready when all train.
            for _ in range(self.workers - 1):
                self._send(0)
            log.info("warm start: steps %d-%d run one closure at a time", self.start_step, plan.warmup_steps)
        self._send(n)
        if self.scheduled == self.start_step:
            log.info("train function traced, first closure scheduled in %.2f s",
                     time.perf_counter() - began)
        self.scheduled += n
        # One closure per worker, then wait for the first: every worker warms up (its
        # function and input pipeline) at the same time, and the start deadline
        # measures the cluster, not a queue of work. Only the first closure stays out
        # of the rates (the others' warm-ups overlap it).
        if not self.first.done and len(self.in_flight) == self.workers:
            # The workers are busy with their first closures and the chief would only
            # wait: trace the evaluation now rather than in the first evaluation.
            self.evaluator.get_concrete_function(self.test_data)
        while self.in_flight and (len(self.in_flight) >= self.max_in_flight
                                  or (not self.first.done and len(self.in_flight) >= self.workers)):
            if not self.collect_one():
                break
        return True

    def _send(self, steps: int) -> None:
        """Schedule one closure of ``steps`` steps (0: it only loads the function on a worker)."""
        remote = self.coordinator.schedule(self.train_steps, args=(self.per_worker_iterator, tf.constant(steps)))
        self.in_flight.append((remote, steps, time.monotonic()))

    def checkpoint_if_due(self) -> bool:
        """A checkpoint at a consistent step, if one is due and no closure runs late; False if a
        stop left closures in flight while draining for it."""
        if not self.checkpoint_due or self.link.stop_requested or self.any_late(time.monotonic()):
            return True
        # A checkpoint needs every closure in flight collected (a consistent step). One
        # running late may be a lost worker's, which returns only once it is cut loose (the
        # orchestrator's word, or the watch's 20 s or more): the drain gives way once a closure
        # runs late (closures.waiting_after), the others train on, and the checkpoint waits.
        if self.drain(until_late=closures.waiting_after(self.slowest)):
            self.checkpoint_due = False
            self.coordinator.join()  # a consistent step on disk
            if self.keeper:
                self.last_saved_step = int(self.step_var.numpy())
                self.last_checkpoint = self.keeper.save_and_report(self.last_saved_step, self.reporter) \
                    or self.last_checkpoint
            return True
        return not self.abandoned

    def snapshot_if_due(self) -> None:
        """A snapshot, saved while the closures in flight keep running (no drain, no join), so it
        costs the chief the save alone; its step is read first, and the variables it holds may
        have a few later updates (async training has no one consistent step anyway)."""
        now = time.monotonic()
        # Not in the first SNAPSHOT_AFTER_LOSS s after a worker went out: the chief's first save
        # then waits until TensorFlow's pending ops to the lost worker fail (16-19 s measured,
        # the chief holding every closure meanwhile); later saves do not.
        if (not self.keeper or not self.snapshot_every or now < self.next_snapshot or not self.first.done
                or self.checkpoint_due or self.link.stop_requested or self.any_late(now)
                or 0.0 < self.worker_loss.out_for() < SNAPSHOT_AFTER_LOSS):
            return
        step_now = int(self.step_var.numpy())
        if step_now > self.last_saved_step:
            began = time.perf_counter()
            self.last_saved_step = step_now
            self.last_checkpoint = self.keeper.save_and_report(step_now, self.reporter) or self.last_checkpoint
            log.info("snapshot at step %d in %.2f s, training went on", step_now, time.perf_counter() - began)
        self.next_snapshot = time.monotonic() + self.snapshot_every

    def evaluate(self) -> tuple[float | None, float | None]:
        """Evaluate on the chief itself, reading the variables from the ps tasks; queued
        closures keep the workers busy meanwhile."""
        step = int(self.step_var.numpy())
        began = time.perf_counter()
        val_loss, val_accuracy = means(self.evaluator(self.test_data).numpy())
        log.info("evaluated at step %d in %.2f s", step, time.perf_counter() - began)
        self.reporter.eval(step, val_loss, val_accuracy)
        return val_loss, val_accuracy

    def finish(self, lookout: closures.Lookout) -> TrainResult:
        """Drain what is in flight, save the final step and evaluate (not after a stop)."""
        drained = self.drain()
        lookout.stop()
        if drained:
            self.coordinator.join()
        else:
            # TensorFlow holds every later write of the chief (a variable's assign, a checkpoint's
            # SaveV2) behind a closure that waits on an unresponsive worker; reads still pass.
            # Measured with a frozen worker: the save hung until the stop's grace ran out. So the
            # chief ends at once, and the job resumes from its last checkpoint.
            log.warning("%d closure(s) did not finish within %.1f s of the stop (a worker lost or "
                        "frozen): ending without a checkpoint (TensorFlow would hold the save behind "
                        "them); the last one is %s", len(self.in_flight), drain_limit(self.slowest),
                        self.last_checkpoint or "none")
        self.report_news()
        self.link.disarm()  # nothing to train (resumed at the budget): still a clean start
        final_step = int(self.step_var.numpy())
        self.meter.maybe_emit(final_step, force=True)
        rate = self.meter.overall_rate()
        if self.keeper and self.last_saved_step != final_step and not self.abandoned:
            self.last_checkpoint = self.keeper.save_and_report(final_step, self.reporter) or self.last_checkpoint
        val_loss, val_accuracy = (None, None) if self.link.stop_requested else self.evaluate()
        return TrainResult(global_step=final_step, val_loss=val_loss, val_accuracy=val_accuracy,
                           examples_per_second=rate, checkpoint=self.last_checkpoint,
                           restored_step=self.restored_step, per_worker=self.meter.overall_per_worker(),
                           workers=self.workers)

    # --- beside the loop ---------------------------------------------------------------

    def take_requests(self) -> None:
        """Read the orchestrator's requests; a lost host's workers are cut loose at once (whatever
        the loop waits on), anything else waits for the loop, between two closures."""
        request = self.requests.poll()
        if request is None:
            return
        if isinstance(request.get("cut"), list):
            addresses = [str(address) for address in request["cut"][:64]]
            shut = sum(closures.cut_connections(address) for address in addresses)
            log.warning("the orchestrator lost %s: %d connection(s) shut", ", ".join(addresses), shut)
            self.reporter.writer.emit("membership", seq=request["seq"], cut=shut)
        else:
            self.pending.append(request)

    def look_out(self) -> None:
        """Beside the loop (closures.Lookout), once the workers run and until a stop: the
        orchestrator's requests, and the watch of the closures in flight."""
        if not self.first.done or self.link.stop_requested:
            return
        self.take_requests()
        if self.watch is not None:
            now = time.monotonic()
            self.watch.check(now, now - self.last_done, self.slowest, self.finished)

    def report_news(self) -> None:
        """An event and a log line for each worker counted out or taken back since the last call."""
        for what, index, why in self.worker_loss.news():
            self.reporter.writer.emit("worker", worker=f"worker:{index}", state=what, reason=why,
                                      step=int(self.step_var.numpy()))
            log.warning("worker:%d %s%s", index, {"lost": "is out", "drained": "takes no new closure"}.get(what, "is back"),
                        f" ({why})" if why else "")

    # --- collecting closures -----------------------------------------------------------

    def ready(self) -> int | None:
        """The position in ``in_flight`` of a closure that has its result, oldest first."""
        for position, (remote, _, _) in enumerate(self.in_flight):
            if _finished_within(remote, 0):
                return position
        return None

    def wait_target(self, now: float) -> Any:
        """The closure to wait on for one slice: the oldest one not yet late (a late one may be a
        lost worker's, while the others keep finishing), else the oldest."""
        late = closures.waiting_after(self.slowest)
        return next((remote for remote, _, sent in self.in_flight if now - sent <= late), self.in_flight[0][0])

    def any_late(self, now: float) -> bool:
        """Whether a closure in flight has run past :func:`closures.waiting_after` (a slow or lost
        worker's)."""
        late = closures.waiting_after(self.slowest)
        return self.first.done and any(now - sent > late for _, _, sent in self.in_flight)

    def drain(self, until_late: float | None = None) -> bool:
        """Collect every closure in flight; False if a stop left some behind (``abandoned``), or
        with ``until_late``, once one has run that long (:meth:`collect_one`)."""
        while self.in_flight:
            if not self.collect_one(until_late):
                return False
        return True

    def collect_one(self, until_late: float | None = None) -> bool:
        """Collect one closure in flight, the oldest that has its result: closures finish out of
        order when a worker is slow or lost, and the others' must not wait behind it. False,
        leaving them in flight, once a stop was requested and no closure finished for
        :func:`drain_limit` (a lost worker's: ``abandoned``), or, with ``until_late``, as soon
        as a closure in flight has run that long (a checkpoint's drain gives way)."""
        position = self._wait_for_one(until_late)
        if position is None:
            return False
        remote, n, sent = self.in_flight[position]
        del self.in_flight[position]
        self.last_done = time.monotonic()
        if self.first.done:      # the first closures wait on the workers' warm-up
            self.slowest = max(self.slowest, self.last_done - sent)
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
            self.finished += n
            return True
        if n:       # 0: a warm start's closure that only loaded the step function
            self._count(n, float(loss), int(worker))
        return True

    def _wait_for_one(self, until_late: float | None) -> int | None:
        """The position of a closure in flight that has its result, waiting in slices; None
        once the wait is given up (see :meth:`collect_one`)."""
        position = self.ready()
        while not self.abandoned and position is None:
            now = time.monotonic()
            if self.link.stop_requested:
                self.stop_seen = now if self.stop_seen is None else self.stop_seen
                self.abandoned = now - max(self.stop_seen, self.last_done) > drain_limit(self.slowest)
            elif self.first.done and until_late is not None and any(now - sent > until_late
                                                                    for _, _, sent in self.in_flight):
                return None
            _finished_within(self.wait_target(now), WAIT_SLICE)
            position = self.ready()
        return None if self.abandoned else position

    def _count(self, n: int, loss: float, worker: int) -> None:
        """A collected closure's ``n`` steps into the job's count, its events and the meter."""
        self.finished += n
        counted = self.first.counts(self.finished, loss)
        if not counted:
            log.info("first closure returned: the workers run")
        examples = n * self.plan.worker_batch_size
        self.reporter.trained(self.finished, n, examples, loss, timed=counted)
        if not counted:
            return
        self.meter.add(n, examples, loss, [(f"worker:{worker}", examples)])
        if self.meter.due():
            self.meter.maybe_emit(int(self.step_var.numpy()))


def _make_train_steps(job: Job, plan: TrainPlan, strategy: Any, model: Any,
                      optimizer: Any, step_var: tf.Variable, apply: Any) -> Any:
    """The scheduled function: ``n`` steps on one worker's iterator.

    Returns the mean loss over the ``n`` steps and the index of the worker that ran
    them (for the per-worker throughput in progress events); ``n`` = 0 only loads the
    function on a worker. ``apply``: the fused update (roles/raw_updates.py), or None
    for Keras' ``apply_gradients``.
    """

    def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        step = loss_and_gradients(job, model, x, y, plan.worker_batch_size)
        if apply is None:
            optimizer.apply_gradients(zip(step.grads, step.variables))
        else:
            apply(step.grads)
        return step.loss  # the mean over this worker's batch

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

