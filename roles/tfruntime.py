"""The one place where a role imports TensorFlow and sizes its thread pools.

Thread-pool sizes must be set before TensorFlow runs its first op (eager mode
refuses to change them afterwards), and graph-mode sessions and standing servers take
them through a ``ConfigProto`` instead; both paths start here so no caller can forget
one of them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys
from typing import Any, Iterator

from roles.tfconfig import ThreadConfig


class _HidePlotting(importlib.abc.MetaPathFinder):
    """Makes ``import matplotlib`` (and its submodules) fail while installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"{name} is not loaded while TensorFlow loads (PSCLUSTER_TF_PLOTTING=1 loads it)")
        return None


@contextlib.contextmanager
def _without_plotting() -> Iterator[None]:
    if "matplotlib" in sys.modules or os.environ.get("PSCLUSTER_TF_PLOTTING") == "1":
        yield
        return
    finder = _HidePlotting()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_tensorflow(threads: ThreadConfig) -> Any:
    """Imports TensorFlow and applies ``threads`` to the eager runtime.

    Returns the ``tensorflow`` module.

    Keras, which ``import tensorflow`` loads, imports ``matplotlib.pyplot`` for its image-gallery
    helper when matplotlib is installed: 1.2 s of the 5.9 s of CPU an import takes here, paid by
    every server, standby and trainer, none of which plots. So matplotlib is hidden while
    TensorFlow loads (Keras leaves the helper without it); anything imported later, a user's job
    included, gets matplotlib as usual. ``PSCLUSTER_TF_PLOTTING=1`` keeps the import as it was.
    """
    with _without_plotting():
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
