"""The one place where a role imports TensorFlow and sizes its thread pools.

Thread-pool sizes must be set before TensorFlow runs its first op (eager mode
refuses to change them afterwards), and graph-mode sessions and standing servers take
them through a ``ConfigProto`` instead; both paths start here so no caller can forget
one of them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import site
import sys
import sysconfig
import types
from dataclasses import dataclass
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
    return _with_threads(tf.compat.v1.ConfigProto(**fields), threads)


def _with_threads(config: Any, threads: ThreadConfig) -> Any:
    if threads.intra_op:
        config.intra_op_parallelism_threads = threads.intra_op
    if threads.inter_op:
        config.inter_op_parallelism_threads = threads.inter_op
    return config


@dataclass(frozen=True)
class ServerRuntime:
    """What a standing server needs of TensorFlow, and how it was loaded.

    ``light``: True when only the server's own modules were loaded (``import_server_runtime``),
    False when it is the full ``import tensorflow`` (a plugin folder, the escape hatch, or a
    TensorFlow whose server module moved).
    """

    Server: Any
    ClusterSpec: Any
    ConfigProto: Any
    start_errors: tuple[type[BaseException], ...]
    light: bool


FULL_IMPORT_ENV = "PSCLUSTER_TF_FULL_IMPORT"


def _site_dirs() -> list[str]:
    """The folders TensorFlow's own ``__init__`` searches for ``tensorflow-plugins``."""
    dirs = [p for p in sys.path if "site-packages" in p]
    if site.ENABLE_USER_SITE and site.USER_SITE:
        dirs.append(site.USER_SITE)
    dirs += site.getsitepackages()
    for scheme in sysconfig.get_scheme_names():
        for name in ("purelib", "platlib"):
            with contextlib.suppress(KeyError):
                dirs.append(sysconfig.get_path(name, scheme))
    return dirs


def plugins_present(tf_dir: str) -> bool:
    """True when ``import tensorflow`` would load kernels or devices a server might run: first
    party kernels (``tensorflow/core/kernels``), a ``tensorflow-plugins`` folder beside any
    site-packages, or ``TF_PLUGGABLE_DEVICE_LIBRARY_PATH``."""
    if os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"):
        return True
    if os.path.exists(os.path.join(tf_dir, "core", "kernels")):
        return True
    return any(os.path.exists(os.path.join(d, "tensorflow-plugins")) for d in _site_dirs())


def _full_runtime(threads: ThreadConfig) -> ServerRuntime:
    tf = import_tensorflow(threads, keras=False)
    return ServerRuntime(tf.distribute.Server, tf.train.ClusterSpec, tf.compat.v1.ConfigProto,
                         (tf.errors.UnknownError, tf.errors.InvalidArgumentError), light=False)


def import_server_runtime(threads: ThreadConfig) -> ServerRuntime:
    """Loads the part of TensorFlow a standing ps or worker server runs, and nothing else.

    A server only hosts a gRPC ``Server``: every op it runs comes from its peers' graphs and
    executes in TensorFlow's C++ runtime, whose kernels register when the core library loads.
    ``import tensorflow`` also builds the whole Python API (about 2,300 modules): 4.4 CPU-s here,
    against 0.6 CPU-s for ``tensorflow.python.training.server_lib`` alone (319 modules,
    ``python -m benchmarks.server_start``). Every ``up`` starts one server per ps and async
    worker task, on the critical path, so the light load is the default.

    The package's ``__init__`` is skipped by giving ``tensorflow`` a bare package object (its real
    search path) while the server modules load, then taking it out of ``sys.modules`` again, so
    a later ``import tensorflow`` in the same process runs the real ``__init__`` as usual.
    Loaded as TensorFlow itself would (``import tensorflow``) whenever that could load more than
    the core: a plugin folder (``plugins_present``), ``PSCLUSTER_TF_FULL_IMPORT=1``,
    TensorFlow already loaded, or a TensorFlow whose server module cannot be loaded this way.
    """
    if os.environ.get(FULL_IMPORT_ENV) == "1" or "tensorflow" in sys.modules:
        return _full_runtime(threads)
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("TensorFlow is not installed in this Python (pip install tensorflow)")
    tf_dir = list(spec.submodule_search_locations)[0]
    if plugins_present(tf_dir):
        return _full_runtime(threads)
    bare = types.ModuleType("tensorflow")
    bare.__path__ = list(spec.submodule_search_locations)
    bare.__spec__ = spec
    bare.__file__ = spec.origin
    before = set(sys.modules)
    sys.modules["tensorflow"] = bare
    try:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.framework import errors
        from tensorflow.python.training import server_lib
    except ImportError:
        server_lib = None
        for name in set(sys.modules) - before:      # a half-done light load: load in full instead
            if name.startswith("tensorflow."):
                del sys.modules[name]
    finally:
        del sys.modules["tensorflow"]
    if server_lib is None:
        return _full_runtime(threads)
    return ServerRuntime(server_lib.Server, server_lib.ClusterSpec, config_pb2.ConfigProto,
                         (errors.UnknownError, errors.InvalidArgumentError), light=True)


def server_config(runtime: ServerRuntime, threads: ThreadConfig) -> Any:
    """The server's ``ConfigProto`` with ``threads``, or None when neither pool is set."""
    if not (threads.intra_op or threads.inter_op):
        return None
    return _with_threads(runtime.ConfigProto(), threads)
