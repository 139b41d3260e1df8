"""Synchronous data-parallel training, TF2 style: every worker runs this same file, reads
its task from ``TF_CONFIG`` and trains under ``tf.distribute.MultiWorkerMirroredStrategy``
with a custom loop, as TensorFlow's multi-worker guides teach.

By hand: set ``TF_CONFIG`` in each worker's terminal and start the file there. With
pscluster, on a cluster brought up in sync mode (``pscluster up INVENTORY --mode sync``):

    pscluster run -- python examples/byo/tf2_mwms.py --steps 1500

(``run`` gives each worker its ``TF_CONFIG``). A custom loop and not ``Model.fit``: under
TensorFlow 2.21 with Keras 3, ``fit`` fails under the multi-worker strategies.

A 784-256-10 MLP on MNIST, Adam, global batch ``--batch_size`` split over the workers. Every
worker ends at the same step; worker 0 evaluates the test split and prints

    final test_accuracy=0.9712 test_loss=0.0912 steps=1500 seconds=41.2

then every worker leaves with ``os._exit``: destroying a distributed dataset iterator can
stall for seconds in TensorFlow's teardown.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_CANDIDATES = ("data/mnist.npz", os.path.join(HERE, "..", "distributed_mnist", "data", "mnist.npz"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1500, help="synchronous steps (default 1500)")
    parser.add_argument("--batch_size", type=int, default=128, help="global batch, split over the workers")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--data", help="mnist.npz (default: data/mnist.npz here, else pscluster's bundled copy)")
    parser.add_argument("--log_every", type=int, default=100)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch_size must be >= 1")
    return args


def data_path(given: str | None) -> str:
    if given:
        if not os.path.isfile(given):
            raise SystemExit(f"--data {given}: no such file")
        return given
    for candidate in DATA_CANDIDATES:
        if os.path.isfile(candidate):
            return candidate
    raise SystemExit("no MNIST file found: pass --data PATH/mnist.npz")


def task_of(environ: dict[str, str]) -> tuple[str, int, int]:
    """(task type, index, number of workers) from TF_CONFIG."""
    try:
        config = json.loads(environ["TF_CONFIG"])
        task = config["task"]
        return task["type"], int(task["index"]), len(config["cluster"].get("worker", []))
    except (KeyError, ValueError, TypeError) as exc:
        raise SystemExit(f"TF_CONFIG is missing or malformed ({exc}): run under 'pscluster run' "
                         "or set it as TensorFlow's multi-worker guide shows") from None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    task_type, index, workers = task_of(dict(os.environ))
    started = time.monotonic()
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with np.load(data_path(args.data)) as arrays:
        x_train, y_train = arrays["x_train"], arrays["y_train"].astype(np.int64)
        x_test, y_test = arrays["x_test"], arrays["y_test"].astype(np.int64)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Each worker reads its own shard; the global batch is split over the workers.
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        data = data.shuffle(10_000, seed=1234 + context.input_pipeline_id).repeat()
        return data.batch(context.get_per_replica_batch_size(args.batch_size)).prefetch(2)

    with strategy.scope():
        model = keras.Sequential([keras.layers.Rescaling(1.0 / 255), keras.layers.Flatten(),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.build((None, 28, 28))
        optimizer = keras.optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def step_fn(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = cross_entropy(labels, model(images, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))     # all-reduces the gradients
        return loss

    @tf.function
    def train_step(it) -> tf.Tensor:
        images, labels = next(it)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(images, labels)), axis=None)

    for step in range(1, args.steps + 1):
        loss = float(train_step(iterator))
        if step % args.log_every == 0:
            print(f"{task_type} {index}: step {step}/{args.steps}, loss {loss:.4f}", flush=True)
    # One last collective: every worker has finished every step before anyone leaves.
    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    if index == 0:
        # A plain call outside strategy.run reads this worker's copy of the variables: no
        # collective, so nobody else needs to be there (Keras' predict would all-gather).
        logits = np.concatenate([model(x_test[i:i + 2000], training=False).numpy()
                                 for i in range(0, len(x_test), 2000)])
        test_loss = float(np.mean(cross_entropy(y_test, logits)))
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
        print(f"final test_accuracy={accuracy:.4f} test_loss={test_loss:.4f} steps={args.steps} "
              f"seconds={time.monotonic() - started:.1f}", flush=True)
    else:
        print(f"{task_type} {index}: done after {args.steps} steps ({workers} workers)", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
