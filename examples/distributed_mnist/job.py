"""MNIST digits with a small CNN (or an MLP): the reference pscluster job.

Runs unchanged in every mode (``roles.train --mode async|sync|sync-ps --job
examples/distributed_mnist``) and reaches >= 98.5 % test accuracy with its defaults.
See roles/jobs.py for the job API this file implements.

Environment knobs:

* ``MNIST_MODEL``: ``cnn`` (default) or ``mlp`` (784-256-10: quicker, less accurate;
  the roles tests use it where the model does not matter).
* ``PSCLUSTER_DATA``: path of ``mnist.npz`` (``roles.train --data`` sets it); see
  data.py for where else it is looked for.

Images stay ``uint8`` in the input pipeline and are scaled inside the model: in async
mode the chief sends the arrays to each worker with its pipeline, and uint8 keeps that
at 47 MB instead of 188 MB. ``dataset`` turns them into eager tensors first, so that
they travel as one tensor (a captured input of the pipeline's function) and not as
constants inside its graph, which every worker's graph optimizer would copy several
times: that was 4 s of an async run's start-up (docs/benchmarks.md).
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf

from . import data

# Test accuracy measured on a 2-core machine, 2 workers (after 3 epochs / 4 epochs):
# async 99.07, 99.04 / 99.12; sync 98.97, 98.85 / 98.95; sync-ps 98.94, 98.65 / 99.08.
# Three epochs clear 98.5 % by too thin a margin for a default, so four. A constant
# rate: sync-ps can translate only constant-rate optimizers (roles/v1_optimizers.py).
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
EPOCHS = 4
TRAIN_EXAMPLES = 60_000
TEST_EXAMPLES = 10_000


def build_model() -> keras.Model:
    kind = os.environ.get("MNIST_MODEL", "cnn").strip().lower()
    if kind == "mlp":
        return keras.Sequential([
            keras.layers.Rescaling(1.0 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ], name="mnist_mlp")
    if kind != "cnn":
        raise ValueError(f"MNIST_MODEL={kind!r}: choose 'cnn' or 'mlp'")
    return keras.Sequential([
        keras.layers.Rescaling(1.0 / 255),
        keras.layers.Reshape((28, 28, 1)),
        keras.layers.Conv2D(16, 5, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(32, 5, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ], name="mnist_cnn")


def dataset(shard) -> tf.data.Dataset:
    x, y = data.mixed_split(shard.split)
    cut = isinstance(shard.index, int) and isinstance(shard.count, int)
    if cut and shard.count > 1:
        # This worker's shard, cut before the copy into tensors: the elements `ds.shard(count,
        # index)` gives, in the same order, for a count-th of the copy, and the shuffle buffer
        # fills from them alone (a worker's first batch, at every start and restart, came after
        # visiting the whole split). Async's per-worker datasets are traced: their index is a
        # tensor there, and tf.data cuts the shard.
        x, y = x[shard.index::shard.count], y[shard.index::shard.count]
    with tf.init_scope():  # eager even while a tf.function traces this (see above)
        x, y = tf.constant(x), tf.constant(y)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if not cut:
        ds = ds.shard(shard.count, shard.index)
    if shard.split == "train":
        # A full shuffle of the shard: it is at most 47 MB of uint8.
        ds = ds.shuffle(len(x) + 1 if cut else len(x) // shard.count + 1, seed=shard.seed,
                        reshuffle_each_iteration=True)
    return ds


def loss(labels, outputs) -> tf.Tensor:
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int32), logits=outputs)


def optimizer(learning_rate: float) -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(learning_rate)
