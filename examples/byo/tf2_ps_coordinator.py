"""Asynchronous parameter-server training, TF2 style: a ``ParameterServerStrategy``
coordinator with a custom loop, run as the chief. The ps and worker tasks are plain
``tf.distribute.Server``s, which ``pscluster up`` already starts (async mode), so only this
file runs, on the chief, with its ``TF_CONFIG``:

    pscluster up inventories/local.yaml
    pscluster run -- python examples/byo/tf2_ps_coordinator.py --steps 3000

A 784-256-10 MLP on MNIST, Adam. Each scheduled function runs ``--steps_per_function``
steps on one worker; the coordinator keeps a few functions in flight per worker. At the
end the chief evaluates the test split (reading the variables from the ps) and prints

    final test_accuracy=0.9712 test_loss=0.0912 steps=3000 seconds=41.2

then leaves with ``os._exit`` (the coordinator's threads would otherwise keep polling
workers). The standing servers stay up for the next program.
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
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps in total (default 3000)")
    parser.add_argument("--batch_size", type=int, default=128, help="examples per step on a worker")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--steps_per_function", type=int, default=20,
                        help="steps per scheduled function (fewer RPCs per step)")
    parser.add_argument("--data", help="mnist.npz (default: data/mnist.npz here, else pscluster's bundled copy)")
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.steps_per_function) < 1:
        parser.error("--steps, --batch_size and --steps_per_function must be >= 1")
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


def check_chief(environ: dict[str, str]) -> None:
    """The coordinator is the chief; refuse to start as anything else."""
    try:
        config = json.loads(environ["TF_CONFIG"])
        role = config["task"]["type"]
        cluster = config["cluster"]
    except (KeyError, ValueError, TypeError) as exc:
        raise SystemExit(f"TF_CONFIG is missing or malformed ({exc}): run under 'pscluster run'") from None
    if role != "chief" or not cluster.get("ps") or not cluster.get("worker"):
        raise SystemExit("this coordinator runs as the chief of a cluster with ps and worker tasks "
                         f"(TF_CONFIG says task type {role!r}); bring the cluster up in async mode")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    check_chief(dict(os.environ))
    started = time.monotonic()
    import keras
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with np.load(data_path(args.data)) as arrays:
        x_train, y_train = arrays["x_train"], arrays["y_train"].astype(np.int64)
        x_test, y_test = arrays["x_test"], arrays["y_test"].astype(np.int64)

    with strategy.scope():
        model = keras.Sequential([keras.layers.Rescaling(1.0 / 255), keras.layers.Flatten(),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.build((None, 28, 28))
        optimizer = keras.optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset_fn() -> tf.data.Dataset:
        # Built on each worker: its own shuffle order over the whole training split.
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10_000, seed=worker)
        return data.repeat().batch(args.batch_size).prefetch(2)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def step_fn(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(cross_entropy(labels, model(images, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_steps(it, n: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(n):
            images, labels = next(it)
            total += strategy.run(step_fn, args=(images, labels))
        return total / tf.cast(n, tf.float32)

    scheduled, results, last_report = 0, [], 0
    while scheduled < args.steps:
        n = min(args.steps_per_function, args.steps - scheduled)
        results.append(coordinator.schedule(train_steps, args=(iterator, tf.constant(n))))
        scheduled += n
        if scheduled - last_report >= 500 or scheduled == args.steps:
            coordinator.join()                  # the functions scheduled so far are done
            print(f"chief: step {scheduled}/{args.steps}, loss {float(results[-1].fetch()):.4f}", flush=True)
            last_report, results = scheduled, []
    coordinator.join()
    logits = np.concatenate([model(x_test[i:i + 2000], training=False).numpy() for i in range(0, len(x_test), 2000)])
    test_loss = float(np.mean(cross_entropy(y_test, logits)))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"final test_accuracy={accuracy:.4f} test_loss={test_loss:.4f} steps={args.steps} "
          f"seconds={time.monotonic() - started:.1f}", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
