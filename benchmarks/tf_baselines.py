"""The programs the training benchmark (benchmarks/training.py) compares pscluster with.

Each is what a TensorFlow user writes without pscluster, on the same job (model, data,
loss, optimizer and learning rate from ``examples/distributed_mnist`` unless ``--job``
says otherwise) and the same global batch. Each prints exactly one JSON line on stdout;
everything else goes to stderr.

``python -m benchmarks.tf_baselines WHICH [options]``, WHICH one of:

* ``tutorial-ps``: the custom training loop of TensorFlow's parameter-server tutorial
  (tensorflow.org/tutorials/distribute/parameter_server_training): run as the chief of a
  standing cluster (TF_CONFIG), ``create_per_worker_dataset``, one ``coordinator.schedule``
  per step, ``join``. The tutorial also updates an accuracy metric inside the step; we
  leave it out, which only makes the baseline faster.
* ``keras-fit``: one process, Keras 3 ``model.fit``, for each ``--steps-per-execution``
  value in turn (a fresh model each time): the throughput sweep.
* ``keras-fit-accuracy``: one process, Keras 3 ``fit`` with a callback that evaluates on
  the test set every ``--eval-every`` steps; seconds are counted from ``--launched-at``
  (the launcher's ``time.time()``), so process start-up is included.
* ``mwms-tfkeras``: one worker of legacy tf-keras ``fit`` under
  MultiWorkerMirroredStrategy (``TF_USE_LEGACY_KERAS=1``); start one per worker with
  its TF_CONFIG. Same architecture, rebuilt with ``tf_keras`` layers (the parameter count
  is checked against the job's model), same per-worker shards, same global batch.

Throughput is optimizer steps per second after the first step (or first execution of
``steps_per_execution`` steps), so start-up and tracing are excluded, as pscluster's
drivers do. Input pipelines are the job's ``dataset()`` wrapped exactly as pscluster wraps
it (``roles/datasets.py``: repeat, batch with ``drop_remainder``, prefetch), and the test
evaluation is pscluster's (``roles/evaluation.py``), so both sides see the same numbers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_JOB = str(REPO / "examples" / "distributed_mnist")
SEED = 1234  # roles.train's default seed: same shuffles as pscluster


def rate_after_first(marks: Sequence[tuple[int, float]]) -> float | None:
    """Steps per second between the first and the last (steps_done, seconds) mark.

    The first mark is the end of the first step or execution, which carries tracing and
    start-up; None when there is nothing after it.
    """
    if len(marks) < 2 or marks[-1][1] <= marks[0][1]:
        return None
    return (marks[-1][0] - marks[0][0]) / (marks[-1][1] - marks[0][1])


def _emit(result: dict) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def _load(job_path: str) -> Any:
    from roles.jobs import load_job

    return load_job(job_path)


def _train_data(job: Any, index: Any, count: int, batch_size: int) -> Any:
    from roles.datasets import train_dataset
    from roles.jobs import Shard

    return train_dataset(job, Shard(index=index, count=count, split="train", seed=SEED), batch_size)


def _sample(job: Any) -> Any:
    from roles.datasets import sample_batch

    return sample_batch(job, SEED)[0]


# --------------------------------------------------------------------------- tutorial-ps
def tutorial_ps(args: argparse.Namespace) -> dict:
    import tensorflow as tf

    job = _load(args.job)
    batch = args.batch_size or job.batch_size
    lr = args.learning_rate or job.learning_rate
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    workers = resolver.cluster_spec().num_tasks("worker")

    with strategy.scope():
        model = job.build_model()
        model(_sample(job), training=False)       # variables now, on the ps
        optimizer = job.optimizer(lr)
        optimizer.build(model.trainable_variables)  # not lazily inside a scheduled function

    def dataset_fn(_context: Any) -> Any:
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        return _train_data(job, index, workers, batch)

    @tf.function
    def per_worker_dataset_fn() -> Any:
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step_fn(iterator: Any) -> Any:
        def replica_fn(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                per_example = tf.cast(job.loss(y, model(x, training=True)), tf.float32)
                loss = tf.nn.compute_average_loss(per_example)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        x, y = next(iterator)
        losses = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    began = time.perf_counter()
    coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()                              # first step: tracing, worker start-up
    first = time.perf_counter()
    last = None
    for _ in range(args.steps - 1):
        last = coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    ended = time.perf_counter()
    timed = args.steps - 1
    return {"baseline": "tutorial-ps", "workers": workers, "global_batch_size": batch,
            "learning_rate": lr, "steps": args.steps, "first_step_seconds": round(first - began, 3),
            "timed_steps": timed, "timed_seconds": round(ended - first, 3),
            "steps_per_second": round(timed / (ended - first), 3) if timed > 0 else None,
            "loss": float(last.fetch()) if last is not None else None}


# --------------------------------------------------------------------------- keras-fit
def _fit_callback(keras: Any, marks: list[tuple[int, float]], on_mark: Any = None) -> Any:
    class Marks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # ``batch`` is the index of the last step of the execution (Keras 3 and tf-keras).
            marks.append((batch + 1, time.perf_counter()))
            if on_mark is not None:
                on_mark(self.model, batch + 1)

    return Marks()


def _fit_steps(timed_steps: int, k: int) -> int:
    """One execution to warm up, then at least ``timed_steps`` more, in whole executions."""
    return k + max(1, math.ceil(timed_steps / k)) * k


def _timed_fit(keras_module: Any, model: Any, data: Any, timed_steps: int, k: int) -> dict:
    """One ``fit`` of about ``timed_steps`` steps after the first execution; its sweep row."""
    marks: list[tuple[int, float]] = []
    total = _fit_steps(timed_steps, k)
    began = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[_fit_callback(keras_module, marks)])
    rate = rate_after_first(marks)
    return {"steps_per_execution": k, "steps": total,
            "first_execution_seconds": round(marks[0][1] - began, 3) if marks else None,
            "steps_per_second": round(rate, 3) if rate else None}


def keras_fit(args: argparse.Namespace) -> dict:
    import keras

    job = _load(args.job)
    batch = args.batch_size or job.batch_size
    lr = args.learning_rate or job.learning_rate
    data = _train_data(job, 0, 1, batch)
    sweep = []
    for k in args.steps_per_execution:
        model = job.build_model()
        model.compile(optimizer=job.optimizer(lr), loss=job.loss, steps_per_execution=k)
        sweep.append(dict(_timed_fit(keras, model, data, args.steps, k), jit_compile=bool(model.jit_compile)))
        print(f"keras-fit K={k}: {sweep[-1]['steps_per_second']} steps/s", file=sys.stderr, flush=True)
    best = max((row for row in sweep if row["steps_per_second"]), key=lambda r: r["steps_per_second"],
               default=None)
    return {"baseline": "keras-fit", "global_batch_size": batch, "learning_rate": lr, "sweep": sweep,
            "best": best}


def keras_fit_accuracy(args: argparse.Namespace) -> dict:
    import keras

    from roles.datasets import eval_dataset
    from roles.evaluation import EVAL_BATCH_SIZE, make_evaluator, means
    from roles.jobs import Shard

    job = _load(args.job)
    batch = args.batch_size or job.batch_size
    lr = args.learning_rate or job.learning_rate
    k = args.steps_per_execution[0]
    if args.eval_every % k:
        raise SystemExit(f"--eval-every {args.eval_every} must be a multiple of --steps-per-execution {k}")
    launched = args.launched_at if args.launched_at is not None else time.time()
    model = job.build_model()
    model.compile(optimizer=job.optimizer(lr), loss=job.loss, steps_per_execution=k)
    evaluator = make_evaluator(job, model)
    test_data = eval_dataset(job, Shard(0, 1, "test", SEED), EVAL_BATCH_SIZE)
    evals: list[dict] = []

    def maybe_evaluate(model: Any, steps_done: int) -> None:
        if steps_done % args.eval_every:
            return
        val_loss, val_accuracy = means(evaluator(test_data).numpy())
        evals.append({"step": steps_done, "val_loss": val_loss, "val_accuracy": val_accuracy,
                      "seconds": round(time.time() - launched, 2)})
        print(f"step {steps_done}: val_accuracy {val_accuracy:.4f} at {evals[-1]['seconds']} s",
              file=sys.stderr, flush=True)
        if args.stop_at_target and val_accuracy is not None and val_accuracy >= args.target:
            model.stop_training = True

    marks: list[tuple[int, float]] = []
    total = math.ceil(args.steps / args.eval_every) * args.eval_every
    model.fit(_train_data(job, 0, 1, batch), epochs=1, steps_per_epoch=total, verbose=0,
              callbacks=[_fit_callback(keras, marks, maybe_evaluate)])
    reached = next((e for e in evals if e["val_accuracy"] is not None and e["val_accuracy"] >= args.target),
                   None)
    return {"baseline": "keras-fit-accuracy", "global_batch_size": batch, "learning_rate": lr,
            "steps_per_execution": k, "eval_every": args.eval_every, "target": args.target,
            "steps": marks[-1][0] if marks else 0, "evals": evals,
            "time_to_target_seconds": reached["seconds"] if reached else None,
            "step_at_target": reached["step"] if reached else None,
            "wall_seconds": round(time.time() - launched, 2)}


# --------------------------------------------------------------------------- mwms-tfkeras
def _tf_keras_model(tf_keras: Any) -> Any:
    """distributed_mnist's build_model(), layer for layer, in tf-keras."""
    layers = tf_keras.layers
    kind = os.environ.get("MNIST_MODEL", "cnn").strip().lower()
    if kind == "mlp":
        return tf_keras.Sequential([
            layers.Rescaling(1.0 / 255), layers.Flatten(),
            layers.Dense(256, activation="relu"), layers.Dense(10)], name="mnist_mlp")
    return tf_keras.Sequential([
        layers.Rescaling(1.0 / 255),
        layers.Reshape((28, 28, 1)),
        layers.Conv2D(16, 5, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(32, 5, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(128, activation="relu"),
        layers.Dense(10),
    ], name="mnist_cnn")


def mwms_tfkeras(args: argparse.Namespace) -> dict:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"         # before TensorFlow is imported
    import tensorflow as tf
    import tf_keras

    from roles.jobs import Shard
    from roles.datasets import train_dataset

    job = _load(args.job)
    if os.path.normpath(job.path) != os.path.normpath(os.path.join(DEFAULT_JOB, "job.py")):
        raise SystemExit("mwms-tfkeras rebuilds distributed_mnist's model with tf-keras layers; "
                         "it cannot run another job")
    batch = args.batch_size or job.batch_size
    lr = args.learning_rate or job.learning_rate
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    x0 = _sample(job)
    reference = job.build_model()                     # Keras 3, only to compare sizes
    reference(x0)
    params = int(reference.count_params())

    def dataset_fn(context: tf.distribute.InputContext) -> Any:
        shard = Shard(index=context.input_pipeline_id, count=context.num_input_pipelines,
                      split="train", seed=SEED)
        return train_dataset(job, shard, context.get_per_replica_batch_size(batch))

    def loss(labels: Any, outputs: Any) -> Any:
        # tf-keras hands a plain loss function labels of shape [batch, 1] (it matches their rank
        # to the outputs'); Keras 3 passes them as they come. Same values, same loss.
        return job.loss(tf.reshape(labels, [-1]), outputs)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    sweep = []
    for k in args.steps_per_execution:
        with strategy.scope():
            model = _tf_keras_model(tf_keras)
            model(x0)
            if model.count_params() != params:
                raise SystemExit(f"tf-keras model has {model.count_params()} parameters, "
                                 f"the job's has {params}")
            model.compile(optimizer=tf_keras.optimizers.Adam(lr), loss=loss, steps_per_execution=k)
        sweep.append(_timed_fit(tf_keras, model, data, args.steps, k))
        print(f"mwms-tfkeras worker {task['index']} K={k}: {sweep[-1]['steps_per_second']} steps/s",
              file=sys.stderr, flush=True)
    best = max((row for row in sweep if row["steps_per_second"]), key=lambda r: r["steps_per_second"],
               default=None)
    return {"baseline": "mwms-tfkeras", "task": task, "workers": workers, "global_batch_size": batch,
            "learning_rate": lr, "params": params, "sweep": sweep, "best": best}


BASELINES = {"tutorial-ps": tutorial_ps, "keras-fit": keras_fit,
             "keras-fit-accuracy": keras_fit_accuracy, "mwms-tfkeras": mwms_tfkeras}


def _ints(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tf_baselines",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=sorted(BASELINES))
    parser.add_argument("--job", default=DEFAULT_JOB, help="job file or directory (default distributed_mnist)")
    parser.add_argument("--steps", type=int, default=300,
                        help="tutorial-ps: steps in all; keras-fit, mwms-tfkeras: timed steps per K "
                             "(after one warm-up execution); keras-fit-accuracy: the step budget")
    parser.add_argument("--batch-size", type=int, help="global batch (default: the job's)")
    parser.add_argument("--learning-rate", type=float, help="default: the job's")
    parser.add_argument("--steps-per-execution", type=_ints, default=[1], metavar="K[,K...]")
    parser.add_argument("--eval-every", type=int, default=160, metavar="STEPS")
    parser.add_argument("--target", type=float, default=0.985)
    parser.add_argument("--stop-at-target", action="store_true")
    parser.add_argument("--launched-at", type=float, help="time.time() when the launcher started us")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    _emit(BASELINES[args.which](args))
    return 0


if __name__ == "__main__":
    code = main()
    if sys.argv[1:2] == ["tutorial-ps"]:
        # The coordinator's threads can stall interpreter teardown; the result is out.
        # (Not under MultiWorkerMirroredStrategy: worker 0 hosts the coordination service,
        # and its normal exit lets the other worker leave at the same time; roles/train.py.)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
