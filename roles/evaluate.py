"""Side-car evaluator: ``python -m roles.evaluate --mode {async|sync|sync-ps} --job JOB
--events PATH --checkpoint-dir DIR [the options of roles.train]``.

Started by ``pscluster train`` on the inventory's ``evaluator`` task, beside the trainers, in
every mode. It joins no cluster and starts no server (TF_CONFIG names it ``evaluator``, outside
the cluster spec, as TensorFlow expects): it waits for each new checkpoint the leader writes in
``--checkpoint-dir``, restores the model's weights from it, evaluates the job on its test split
and reports an ``eval`` event whose ``step`` is the checkpoint's step, and the same numbers as
TensorBoard scalars (``val_loss``, ``val_accuracy``) in ``<summary dir>/eval`` (beside the
leader's, given when the evaluator shares the leader's workdir path) or else
``<checkpoint dir>/eval``, where Estimator kept them. So the trainers never pause to evaluate.
It takes roles.train's command line (one argv builder, one parser) and derives the budget
from it: once it has evaluated a checkpoint at or past the last step it
writes ``done`` and exits 0; after a shorter run (``--deadline``) the orchestrator stops it
once it has reported the leader's final step.

Checkpoint layouts, as the drivers write them (both numbered by global step, ``ckpt-N``):

* async and sync: ``tf.train.Checkpoint(model=..., optimizer=..., step=...)``; the evaluator
  restores ``model`` alone (``expect_partial``), and checks every weight was found;
* sync-ps: a ``tf.compat.v1.train.Saver`` of every global variable, by name. The evaluator
  builds the model the way the driver does (global step first, then the model, in a fresh
  graph, so the variables get the same names) and restores those variables by name.

Which checkpoints: every new one, newest first (one that appears while another is evaluated
is next; those in between are skipped). Without ``--resume`` the checkpoint that was newest
when the evaluator started belongs to an earlier run and is skipped; with it (``train
--resume``, or a restarted evaluator) it is evaluated. A checkpoint deleted under it (the
leader keeps the newest three) is retried with the next one.

Exit codes: 0 evaluated the final checkpoint; 1 failed; 2 bad command line, environment or job.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from roles.events import EventWriter
from roles.jobs import JobError
from roles.tfconfig import ConfigError, TaskInfo, task_from_env
from roles.train import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, error_message, parse_options

log = logging.getLogger("pscluster.evaluate")

POLL_SECONDS = 1.0
SUMMARY_FOLDER = "eval"
_STEP = re.compile(r"-(\d+)$")


def checkpoint_step(path: str) -> int | None:
    """The global step a checkpoint prefix is numbered with (``.../ckpt-320`` -> 320)."""
    match = _STEP.search(path)
    return int(match.group(1)) if match else None


def checkpoint_stamp(path: str | None) -> tuple[str, int] | None:
    """(prefix, mtime of its index file): tells a checkpoint from an earlier one of the same name."""
    if path is None:
        return None
    try:
        return path, os.stat(path + ".index").st_mtime_ns
    except OSError:
        return path, 0


class CheckpointWatch:
    """Yields each new checkpoint of a directory, newest first; the one present at the start is
    skipped unless ``include_existing``."""

    def __init__(self, directory: str, latest: Callable[[str], str | None], *, include_existing: bool) -> None:
        self.directory = directory
        self.latest = latest
        self.seen: tuple[str, int] | None = None if include_existing else checkpoint_stamp(latest(directory))

    def poll(self) -> str | None:
        """The newest checkpoint if it was not seen yet (and mark it seen), else None."""
        stamp = checkpoint_stamp(self.latest(self.directory))
        if stamp is None or stamp == self.seen:
            return None
        self.seen = stamp
        return stamp[0]


def main(argv: Sequence[str] | None = None) -> int:
    started = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        options = parse_options(argv)
        task = task_from_env()
        if not options.checkpoint_dir:
            raise UsageError("--checkpoint-dir is required: the evaluator evaluates the checkpoints written there")
    except (UsageError, ConfigError) as e:
        print(f"roles.evaluate: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    writer = EventWriter(options.events, task.name)
    if options.data:
        os.environ["PSCLUSTER_DATA"] = os.path.abspath(options.data)
    try:
        return _evaluate_until_done(options, task, writer, started)
    except (ConfigError, UsageError, JobError) as e:
        log.error("%s", e)
        writer.emit("error", message=str(e), exception=type(e).__name__)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - the process boundary: report, then exit 1
        traceback.print_exc()
        writer.emit("error", message=error_message(e), exception=type(e).__name__)
        return EXIT_FAILED


def _evaluate_until_done(options: Any, task: TaskInfo, writer: EventWriter, started: float) -> int:
    from roles.tfconfig import threads_from_env
    from roles.tfruntime import import_tensorflow

    tf = import_tensorflow(threads_from_env())
    from roles.jobs import load_job
    from roles.settings import make_plan
    from roles.reporting import TaskReporter

    job = load_job(options.job)
    plan = make_plan(job, options, workers=task.num_workers)
    reporter = TaskReporter(writer, plan, is_chief=True)
    evaluation = GraphEvaluation(job, plan) if options.mode == "sync-ps" else EagerEvaluation(job, plan)
    watch = CheckpointWatch(options.checkpoint_dir, tf.train.latest_checkpoint, include_existing=options.resume)
    summaries = EvalSummaries(tf, os.path.join(options.summary_dir or options.checkpoint_dir, SUMMARY_FOLDER))
    reporter.start(None)
    log.info("%s: evaluating each new checkpoint in %s until step %d", task.name, options.checkpoint_dir,
             plan.steps_total)
    last: tuple[int, str, float | None, float | None] | None = None
    while last is None or last[0] < plan.steps_total:
        path = watch.poll()
        if path is None:
            time.sleep(POLL_SECONDS)
            continue
        step = checkpoint_step(path)
        try:
            val_loss, val_accuracy = evaluation.evaluate(path)
        except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
            # Deleted (the leader keeps the newest few) or still being written: take the next.
            log.warning("could not read %s (%s); waiting for the next checkpoint", path, type(e).__name__)
            continue
        if step is None:
            step = evaluation.restored_step
        reporter.eval(step, val_loss, val_accuracy)
        summaries.write(step, val_loss=val_loss, val_accuracy=val_accuracy)
        log.info("step %d: val_loss %s, val_accuracy %s (%s)", step, val_loss, val_accuracy, path)
        last = (step, path, val_loss, val_accuracy)
    writer.emit("done", mode=options.mode, workers=task.num_workers, global_step=last[0], val_loss=last[2],
                val_accuracy=last[3], wall_seconds=round(time.time() - started, 2), examples_per_second=None,
                checkpoint=last[1], restored_step=None)
    writer.close()
    return EXIT_OK


class EvalSummaries:
    """TensorBoard scalars in ``folder`` (``<checkpoint dir>/eval``, where Estimator kept them).

    Written with TensorFlow's own summary op and the scalars plugin's metadata, as
    ``tf.summary.scalar`` does: that function lives in the ``tensorboard`` package, which
    ``tensorflow-cpu`` does not install. A failure to write (a read-only folder) is logged once
    and ends the summaries, never the evaluation.
    """

    def __init__(self, tf: Any, folder: str) -> None:
        from tensorflow.core.framework import summary_pb2

        self.tf = tf
        self.folder = folder
        self.metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DATA_CLASS_SCALAR)
        self.writer: Any = None
        self.failed = False

    def write(self, step: int, **values: float | None) -> None:
        if self.failed:
            return
        tf = self.tf
        try:
            if self.writer is None:
                self.writer = tf.summary.create_file_writer(self.folder)
            with self.writer.as_default():
                for tag, value in values.items():
                    if value is not None:
                        tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=self.metadata)
            self.writer.flush()
        except Exception as e:  # noqa: BLE001 - summaries are a side show: never end the evaluation
            self.failed = True
            log.warning("no TensorBoard summaries in %s: %s", self.folder, error_message(e))


class EagerEvaluation:
    """async and sync: restore ``model`` from an object-based checkpoint, evaluate eagerly."""

    def __init__(self, job: Any, plan: Any) -> None:
        import tensorflow as tf

        from roles.datasets import eval_dataset, sample_batch
        from roles.evaluation import EVAL_BATCH_SIZE, make_evaluator
        from roles.jobs import Shard

        self.job = job
        self.model = job.build_model()
        self.model(sample_batch(job, plan.seed)[0], training=False)   # create the weights
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(model=self.model, step=self.step)
        self.evaluator = make_evaluator(job, self.model)
        self.test = eval_dataset(job, Shard(0, 1, "test", plan.seed), EVAL_BATCH_SIZE)
        self.restored_step = 0

    def evaluate(self, path: str) -> tuple[float | None, float | None]:
        from roles.evaluation import means

        status = self.checkpoint.restore(path)
        status.expect_partial()                      # the optimizer's state is not needed here
        status.assert_existing_objects_matched()     # ... but every weight must come from the file
        self.restored_step = int(self.step.numpy())
        return means(self.evaluator(self.test).numpy())


class GraphEvaluation:
    """sync-ps: restore by variable name from the driver's ``tf.compat.v1.train.Saver`` files."""

    def __init__(self, job: Any, plan: Any) -> None:
        import tensorflow as tf

        from roles.datasets import eval_dataset
        from roles.evaluation import EVAL_BATCH_SIZE, batch_sums
        from roles.jobs import Shard

        self.graph = tf.Graph()
        with self.graph.as_default():
            # In the driver's order, so the variables get the driver's names.
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            self.iterator = tf.compat.v1.data.make_initializable_iterator(
                eval_dataset(job, Shard(0, 1, "test", plan.seed), EVAL_BATCH_SIZE))
            x, y = self.iterator.get_next()
            model = job.build_model()
            model(x, training=False)
            self.sums = tf.function(lambda a, b: batch_sums(job, model, a, b))(x, y)
            self.saver = tf.compat.v1.train.Saver(var_list=tf.compat.v1.global_variables(), sharded=False)
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.restored_step = 0

    def evaluate(self, path: str) -> tuple[float | None, float | None]:
        import tensorflow as tf

        from roles.evaluation import means

        with self.graph.as_default():
            self.saver.restore(self.session, path)
            self.restored_step = int(self.session.run(self.global_step))
            self.session.run(self.iterator.initializer)
            totals = [0.0, 0.0, 0.0]
            while True:
                try:
                    batch = self.session.run(self.sums)
                except tf.errors.OutOfRangeError:
                    return means(totals)
                totals = [t + float(b) for t, b in zip(totals, batch)]


def _run_and_exit(argv: Sequence[str]) -> None:
    code = main(argv)
    # As a finished trainer: everything is on disk; TensorFlow's teardown only costs time.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _run_and_exit(sys.argv[1:])
