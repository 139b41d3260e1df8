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


class _Hide(importlib.abc.MetaPathFinder):
    """Makes imports fail while installed: ``"pkg"`` hides the package and its modules,
    ``"pkg."`` its modules only."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if any(name.startswith(p) if p.endswith(".") else name == p or name.startswith(p + ".")
               for p in self.prefixes):
            raise ImportError(f"{name} is not loaded while TensorFlow loads here (roles/tfruntime.py; "
                              "PSCLUSTER_TF_PLOTTING=1 loads matplotlib)")
        return None


# Keras's modules, not the top-level package: TensorFlow's API modules look its folder up with
# importlib.util.find_spec("keras"), which must still succeed; its eager `import keras.src.optimizers`
# is the one that fails (TensorFlow catches the ImportError).
KERAS_MODULES = ("keras.", "tf_keras.")


@contextlib.contextmanager
def _hidden(prefixes: tuple[str, ...]) -> Iterator[None]:
    if not prefixes:
        yield
        return
    finder = _Hide(prefixes)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_tensorflow(threads: ThreadConfig, keras: bool = True) -> Any:
    """Imports TensorFlow and applies ``threads`` to the eager runtime.

    Returns the ``tensorflow`` module.

    Keras, which ``import tensorflow`` loads, imports ``matplotlib.pyplot`` for its image-gallery
    helper when matplotlib is installed: 1.2 s of the 5.9 s of CPU an import takes here, paid by
    every server, standby and trainer, none of which plots. So matplotlib is hidden while
    TensorFlow loads (Keras leaves the helper without it); anything imported later, a user's job
    included, gets matplotlib as usual. ``PSCLUSTER_TF_PLOTTING=1`` keeps the import as it was.

    ``keras=False`` (a standing server, which runs only the graphs its peers send) also leaves
    Keras unloaded: ``import tensorflow`` loads all of it eagerly (``keras.src.optimizers``, for
    SavedModel's registry), about a fifth of the import's CPU here (benchmarks/server_start.py).
    ``tf.keras`` stays TensorFlow's lazy loader and loads Keras on first use.
    """
    hide: tuple[str, ...] = ()
    if "matplotlib" not in sys.modules and os.environ.get("PSCLUSTER_TF_PLOTTING") != "1":
        hide += ("matplotlib",)
    if not keras and "keras" not in sys.modules:
        hide += KERAS_MODULES
    with _hidden(hide):
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
