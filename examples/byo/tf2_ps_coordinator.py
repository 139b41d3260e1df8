"""Asynchronous parameter-server training, TF2 style: a ``ParameterServerStrategy``
coordinator with a custom loop, and the same binary on every task, as TensorFlow's tutorial
has it ("If you use the same binary for all tasks"). Every task reads its role from
``TF_CONFIG``: a ps or worker starts a ``tf.distribute.Server`` and blocks in
``server.join()``; the chief coordinates. Either way works:

    pscluster run inventories/local.yaml -- python examples/byo/tf2_ps_coordinator.py --steps 3000

one shot, on every task (the ps and workers never exit by themselves: the run is over when the
chief exits, as TFJob's success policy has it, and they are stopped then), or only on the chief
of an async cluster whose ps and worker servers ``pscluster up`` already started:

    pscluster up inventories/local.yaml
    pscluster run -- python examples/byo/tf2_ps_coordinator.py --steps 3000

By hand: one terminal per task, each with its own ``TF_CONFIG='{"cluster": {...}, "task":
{"type": "ps", "index": 0}}'``. A 784-256-10 MLP on MNIST, Adam. Each scheduled function runs
``--steps_per_function`` steps on one worker; the coordinator keeps a few functions in flight
per worker. At the end the chief evaluates the test split (reading the variables from the ps)
and prints

    final test_accuracy=0.9712 test_loss=0.0912 steps=3000 seconds=41.2

then leaves with ``os._exit`` (the coordinator's threads would otherwise keep polling
workers).

``--fit`` trains with ``model.fit`` instead, as the tutorial's "Training with Model.fit" has it:
``model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=..., steps_per_epoch=...)``
on a ``tf.keras`` model compiled in the strategy's scope (``--steps`` split over ``--epochs``).
Those are Keras 2 names, which Keras 3 removed (``AttributeError: module 'keras.utils' has no
attribute 'experimental'``): run it with legacy Keras,

    pscluster run inventories/local.yaml --keras legacy -- python examples/byo/tf2_ps_coordinator.py --fit
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_CANDIDATES = ("data/mnist.npz", os.path.join(HERE, "..", "distributed_mnist", "data", "mnist.npz"))
SERVER_ROLES = ("ps", "worker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps in total (default 3000)")
    parser.add_argument("--batch_size", type=int, default=128, help="examples per step on a worker")
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--steps_per_function", type=int, default=20,
                        help="steps per scheduled function (fewer RPCs per step)")
    parser.add_argument("--connect_timeout", type=float, default=120.0,
                        help="chief: seconds to wait for every ps and worker to listen")
    parser.add_argument("--data", help="mnist.npz (default: data/mnist.npz here, else pscluster's bundled copy)")
    parser.add_argument("--fit", action="store_true",
                        help="train with tf.keras model.fit on a DatasetCreator (Keras 2: run with --keras legacy)")
    parser.add_argument("--epochs", type=int, default=3, help="--fit: epochs the steps are split over (default 3)")
    args = parser.parse_args(argv)
    if min(args.steps, args.batch_size, args.steps_per_function, args.epochs) < 1:
        parser.error("--steps, --batch_size, --steps_per_function and --epochs must be >= 1")
    if args.fit and args.steps < args.epochs:
        parser.error(f"--fit: --steps {args.steps} is fewer than --epochs {args.epochs}")
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


def task_of(environ: dict[str, str]) -> tuple[str, int, dict[str, list[str]]]:
    """(task type, index, cluster) from ``TF_CONFIG``; a cluster needs a chief, ps and workers."""
    try:
        config = json.loads(environ["TF_CONFIG"])
        role, index, cluster = config["task"]["type"], int(config["task"]["index"]), config["cluster"]
    except (KeyError, ValueError, TypeError) as exc:
        raise SystemExit(f"TF_CONFIG is missing or malformed ({exc}): run under 'pscluster run'") from None
    if not cluster.get("chief") or not cluster.get("ps") or not cluster.get("worker"):
        raise SystemExit("ParameterServerStrategy needs a chief, ps and worker tasks; TF_CONFIG's cluster has "
                         f"{', '.join(sorted(cluster)) or 'none'}")
    if role not in ("chief", *SERVER_ROLES):
        raise SystemExit(f"task type {role!r}: this program runs as chief, ps or worker")
    return role, index, cluster


def wait_listening(addresses: list[str], timeout: float) -> None:
    """Until every ``host:port`` accepts a connection: the servers start with the chief, and
    under GRPC_FAIL_FAST the coordinator's first call to one that is not up yet fails."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, _, port = address.rpartition(":")
        while True:
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{address} did not listen within {timeout:.0f} s") from None
                time.sleep(0.2)


def serve(tf, role: str, index: int) -> None:
    """A ps or worker: a gRPC server the chief's coordinator drives; it never returns."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=role, task_index=index,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"{role}:{index} serving at {server.target}", flush=True)
    server.join()


def coordinate(tf, args: argparse.Namespace, cluster: dict[str, list[str]], started: float) -> None:
    wait_listening([*cluster["ps"], *cluster["worker"]], args.connect_timeout)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with np.load(data_path(args.data)) as arrays:
        x_train, y_train = arrays["x_train"], arrays["y_train"].astype(np.int64)
        x_test, y_test = arrays["x_test"], arrays["y_test"].astype(np.int64)
    train = fit if args.fit else custom_loop
    model, steps = train(tf, args, strategy, x_train, y_train)
    logits = np.concatenate([model(x_test[i:i + 2000], training=False).numpy() for i in range(0, len(x_test), 2000)])
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    test_loss = float(-np.mean(log_probs[np.arange(len(y_test)), y_test]))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"final test_accuracy={accuracy:.4f} test_loss={test_loss:.4f} steps={steps} "
          f"seconds={time.monotonic() - started:.1f}", flush=True)


def custom_loop(tf, args: argparse.Namespace, strategy, x_train: np.ndarray, y_train: np.ndarray):
    """A ClusterCoordinator scheduling functions of ``--steps_per_function`` steps; (model, steps)."""
    import keras

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Rescaling(1.0 / 255), keras.layers.Flatten(),
                                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.build((None, 28, 28))
        optimizer = keras.optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def dataset_fn() -> tf.data.Dataset:
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
            coordinator.join()
            print(f"chief: step {scheduled}/{args.steps}, loss {float(results[-1].fetch()):.4f}", flush=True)
            last_report, results = scheduled, []
    coordinator.join()
    return model, args.steps


def fit(tf, args: argparse.Namespace, strategy, x_train: np.ndarray, y_train: np.ndarray):
    """``--fit``: the tutorial's "Training with Model.fit", Keras 2 (tf-keras) names; (model, steps)."""
    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch_size = input_context.get_per_replica_batch_size(args.batch_size)
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return data.shuffle(10_000).repeat().batch(batch_size).prefetch(2)

    train_input = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Rescaling(1.0 / 255), tf.keras.layers.Flatten(),
                                     tf.keras.layers.Dense(256, activation="relu"), tf.keras.layers.Dense(10)])
        model.compile(optimizer=tf.keras.optimizers.legacy.Adam(args.learning_rate),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=args.steps_per_function)
    steps_per_epoch = args.steps // args.epochs
    model.fit(train_input, epochs=args.epochs, steps_per_epoch=steps_per_epoch, verbose=2)
    return model, steps_per_epoch * args.epochs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    role, index, cluster = task_of(dict(os.environ))
    started = time.monotonic()
    import tensorflow as tf

    if role in SERVER_ROLES:
        serve(tf, role, index)
        return
    coordinate(tf, args, cluster, started)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
