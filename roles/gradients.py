"""The loss and gradients every driver computes, in one place.

A job gives ``loss(labels, outputs)``, one value per example (roles/jobs.py). The three drivers
turn it into what they optimise the same way:

- async (roles/async_driver.py): each worker's step is its own update, so its loss is the mean
  over the worker's batch (``batch_size=plan.worker_batch_size``);
- sync (roles/sync_driver.py): the replicas' gradients are summed by the all-reduce, so each
  replica's loss is its share of the global mean (``batch_size=plan.global_batch_size``,
  ``tf.nn.compute_average_loss``'s contract);
- sync-ps (roles/syncps_driver.py): a TF1 graph whose gradients ``SyncReplicasOptimizer``
  averages over the workers, so each worker's loss is the mean over its batch (``mean_loss``);
  its gradients come from ``tf.gradients`` in the graph (on the values, with roles/fused.py),
  not from a tape.

The loss is cast to float32 whatever the model's outputs are: a mixed-precision model's float16
loss would lose the small gradients.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from roles.jobs import Job


class Gradients(NamedTuple):
    loss: tf.Tensor           # what the gradients are of: the per-example loss summed / batch_size
    per_example: tf.Tensor    # the job's loss, one float32 per example of this replica's batch
    grads: list[Any]          # one per trainable variable, in the order of ``variables``
    variables: list[Any]      # the model's trainable variables


def per_example_loss(job: Job, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    return tf.cast(job.loss(labels, outputs), tf.float32)


def mean_loss(job: Job, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """The mean of the job's loss over a batch (sync-ps's step; evaluation sums in float64: roles/evaluation.py)."""
    return tf.reduce_mean(per_example_loss(job, labels, outputs))


def loss_and_gradients(job: Job, model: Any, x: tf.Tensor, y: tf.Tensor, batch_size: int) -> Gradients:
    """One forward and backward pass of ``model`` on a replica's batch ``(x, y)``.

    ``batch_size`` scales the summed loss: the worker's batch (async: its mean) or the global
    batch (sync: the replicas' gradients are then summed into the global mean's).
    """
    with tf.GradientTape() as tape:
        outputs = model(x, training=True)
        per_example = per_example_loss(job, y, outputs)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch_size)
    variables = model.trainable_variables
    return Gradients(loss, per_example, tape.gradient(loss, variables), variables)
