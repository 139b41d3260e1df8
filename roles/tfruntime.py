"""The one place where a role imports TensorFlow and sizes its thread pools.

Thread-pool sizes must be set before TensorFlow runs its first op (eager mode
refuses to change them afterwards), and graph-mode sessions and standing servers take
them through a ``ConfigProto`` instead; both paths start here so no caller can forget
one of them.
"""

from __future__ import annotations

from typing import Any

from roles.tfconfig import ThreadConfig


def import_tensorflow(threads: ThreadConfig) -> Any:
    """Imports TensorFlow and applies ``threads`` to the eager runtime.

    Returns the ``tensorflow`` module.
    """
    import tensorflow as tf

    if threads.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(threads.intra_op)
    if threads.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(threads.inter_op)
    return tf


def session_config(tf: Any, threads: ThreadConfig, **fields: Any) -> Any:
    """A ``tf.compat.v1.ConfigProto`` carrying ``threads`` plus any extra fields."""
    config = tf.compat.v1.ConfigProto(**fields)
    if threads.intra_op:
        config.intra_op_parallelism_threads = threads.intra_op
    if threads.inter_op:
        config.inter_op_parallelism_threads = threads.inter_op
    return config
