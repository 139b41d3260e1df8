"""Test-set evaluation shared by the drivers: loss and accuracy sums over a dataset.

The evaluator returns *sums* (loss, correct, count) rather than means so that shards
evaluated on different workers combine exactly with one all-reduce.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from roles import fused
from roles.jobs import Job

EVAL_BATCH_SIZE = 500


def default_accuracy(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """1.0 where the highest-scoring class is the label (sparse labels, class scores)."""
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int64)
    labels = tf.reshape(tf.cast(labels, tf.int64), tf.shape(predicted))
    return tf.cast(tf.equal(predicted, labels), tf.float32)


def batch_sums(job: Job, model: Any, x: tf.Tensor, y: tf.Tensor,
               call: Callable[[tf.Tensor], tf.Tensor] | None = None) -> tf.Tensor:
    """[loss_sum, correct_sum, count] of one batch, as float64 for exact totals.

    ``call`` computes the outputs instead of ``model(x, training=False)`` (sync-ps: the
    model on values read in one transfer per ps, roles/fused.py).
    """
    outputs = call(x) if call is not None else model(x, training=False)
    per_example_loss = tf.cast(job.loss(y, outputs), tf.float64)
    accuracy = job.accuracy or default_accuracy
    correct = tf.cast(accuracy(y, outputs), tf.float64)
    count = tf.cast(tf.shape(per_example_loss)[0], tf.float64)
    return tf.stack([tf.reduce_sum(per_example_loss), tf.reduce_sum(correct), count])


def make_evaluator(job: Job, model: Any,
                   read_once: bool = False) -> tf.types.experimental.PolymorphicFunction:
    """A tf.function mapping a batched dataset to [loss_sum, correct_sum, count].

    The whole pass runs in one call, so a graph-mode caller (sync-ps) needs one
    ``session.run`` and never sees OutOfRangeError.

    ``read_once`` (async: the variables live on the ps tasks) reads the variables at the
    start of the pass, one transfer per ps (roles/fused.py), and runs the model on those
    values; otherwise every batch reads every variable from its ps again. Models with
    state a call changes (:func:`roles.fused.usable`) keep the plain path.
    """
    read_once = read_once and fused.usable(model)

    @tf.function
    def evaluate(dataset: tf.data.Dataset) -> tf.Tensor:
        call = None
        if read_once:
            call = fused.inference(model, fused.read([v.value for v in model.trainable_variables]))
        totals = tf.zeros([3], tf.float64)
        for x, y in dataset:
            totals += batch_sums(job, model, x, y, call)
        return totals

    return evaluate


def means(totals: Any) -> tuple[float | None, float | None]:
    """(val_loss, val_accuracy) from [loss_sum, correct_sum, count]."""
    loss_sum, correct, count = (float(v) for v in totals)
    if count <= 0:
        return None, None
    return loss_sum / count, correct / count
