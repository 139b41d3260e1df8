"""Fewer, larger transfers between a worker and the ps tasks: one tensor per ps per direction.

A model that reads its variables where they live sends one tensor per variable from its ps
to the worker (in graph mode twice: once for the forward pass, once for the backward), and
its gradients travel back one per variable. Each transfer is an RPC; on a few shared cores
the RPCs, not the bytes, are what costs (docs/benchmarks.md, "sync-ps profile"). Here the
variables on one ps are read as one flat tensor, cut up on the worker, and the gradients for
one ps travel as one flat tensor, cut up on the ps, next to their variables.

The model then runs on values (Keras ``stateless_call``), which is exact only when the model
has no state that a call changes: callers use this for models without non-trainable
variables (no BatchNormalization statistics, no dropout seed) and keep the plain path
otherwise (:func:`usable`).
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf


def usable(model: Any) -> bool:
    """True when the model's call changes no state, so it may run on fetched values."""
    return not model.non_trainable_variables and bool(model.trainable_variables)


def inference(model: Any, values: Sequence[Any]) -> Any:
    """``x -> outputs`` of ``model`` in inference mode on ``values`` (from :func:`read`)."""
    return lambda x: model.stateless_call(list(values), [], x, training=False)[0]


def _groups(variables: Sequence[Any]) -> list[list[int]]:
    by_device: dict[str, list[int]] = {}
    for i, v in enumerate(variables):
        by_device.setdefault(str(v.device), []).append(i)
    return list(by_device.values())


def read(variables: Sequence[Any]) -> list[Any]:
    """The values of ``variables`` (TensorFlow variables), one transfer per device."""
    values: list[Any] = [None] * len(variables)
    for indices in _groups(variables):
        group = [variables[i] for i in indices]
        with tf.compat.v1.colocate_with(group[0]):
            flat = tf.concat([tf.reshape(v.read_value(), [-1]) for v in group], axis=0)
        pieces = tf.split(flat, [int(v.shape.num_elements()) for v in group])
        for i, v, piece in zip(indices, group, pieces):
            values[i] = tf.reshape(piece, v.shape)
    return values


def send(grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
    """``grads`` (computed here) as tensors on their variables' devices, one transfer per device."""
    out: list[Any] = [None] * len(variables)
    for indices in _groups(variables):
        group = [variables[i] for i in indices]
        flat = tf.concat([tf.reshape(grads[i], [-1]) for i in indices], axis=0)
        with tf.compat.v1.colocate_with(group[0]):
            pieces = tf.split(tf.identity(flat), [int(v.shape.num_elements()) for v in group])
            for i, v, piece in zip(indices, group, pieces):
                out[i] = tf.reshape(piece, v.shape)
    return out
