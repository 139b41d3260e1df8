"""Jobs: what to train, written once and run unchanged in every mode.

A *job* is a Python file (or a directory holding ``job.py``) that says what to train:
the model, the data, the loss, the optimizer and default hyperparameters. It knows
nothing about parameter servers, workers or modes; ``roles.train --mode`` decides how
it is distributed (async ParameterServerStrategy, sync MultiWorkerMirroredStrategy or
classic sync parameter servers), and the same job runs in all three.

Writing a job
=============

Define these names at module level (``examples/distributed_mnist/job.py`` is a
complete example)::

    import keras
    import tensorflow as tf

    BATCH_SIZE = 128          # examples per optimizer update (see "Batch size" below)
    LEARNING_RATE = 1e-3
    EPOCHS = 3                # or STEPS = 5000 (an optimizer-update budget)
    TRAIN_EXAMPLES = 60000    # size of the train split; needed to turn epochs into steps

    def build_model() -> keras.Model:
        return keras.Sequential([...])            # Keras 3 layers; no input shape needed

    def dataset(shard) -> tf.data.Dataset:
        # Unbatched (features, label) examples of *this worker's* shard of
        # shard.split ("train" or "test"). Shuffle the train split here if you want;
        # the driver repeats, batches and prefetches.
        ds = tf.data.Dataset.from_tensor_slices(load_arrays(shard.split))
        ds = ds.shard(shard.count, shard.index)
        if shard.split == "train":
            ds = ds.shuffle(10_000, seed=shard.seed)
        return ds

    def loss(labels, outputs) -> tf.Tensor:
        # One loss value per example, shape [batch]; the driver averages it over the
        # global batch so gradients are right however many workers share a step.
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)

    def optimizer(learning_rate: float) -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(learning_rate)

Optional:

* ``accuracy(labels, outputs)`` -> per-example 1.0/0.0, used for ``val_accuracy``.
  The default treats ``outputs`` as class scores: ``argmax(outputs) == labels``.

Rules that keep a job portable across modes
-------------------------------------------

* ``shard.index`` may be a scalar ``tf.Tensor`` rather than an ``int``: in async mode
  the coordinator traces ``dataset`` once and runs the traced function on every
  worker, each of which substitutes its own index. Shard with TensorFlow ops
  (``Dataset.shard``, ``tf.gather``), not Python slicing or ``if shard.index == 0``.
  ``shard.count`` and ``shard.split`` are always plain Python values.
* ``dataset`` runs inside a traced function in async mode (eagerly in the other
  modes): build the pipeline from tf.data ops. Reading files with Python is fine
  (it happens at trace time, on the process that builds the pipeline: the chief in
  async mode, each worker in the sync modes), but Python generators
  (``from_generator``, ``py_function``) cannot run on a remote worker.
* Arrays held in memory: make them tensors eagerly before ``from_tensor_slices``
  (``with tf.init_scope(): x = tf.constant(x)``). Inside the traced function a NumPy
  array becomes a constant of the graph the chief sends to each worker, where the
  graph optimizer copies it several times: 47 MB of MNIST cost 4 s of async start-up.
  An eager tensor travels once per worker, as an input of that function.
* Use Keras 3 (``import keras``). In sync-ps mode the driver builds the model inside a
  TF1-style graph and converts your optimizer to its ``tf.compat.v1.train`` twin; the
  supported optimizers there are SGD (with momentum/nesterov), Adam, RMSprop and
  Adagrad with a constant learning rate and no weight decay or clipping.
* ``build_model`` is called once per process, inside the strategy's scope (or under
  the sync-ps device setter); do not create variables anywhere else.
* Hyperparameters that are not part of this API come from environment variables,
  which the orchestrator can set per task. ``roles.train --data PATH`` is exported as
  ``PSCLUSTER_DATA`` before the job is loaded.

Batch size, steps and learning rate
-----------------------------------

``BATCH_SIZE`` is the number of examples behind one optimizer update, in every mode:
in the sync modes each of N workers takes ``BATCH_SIZE // N`` examples per step; in
async mode each worker takes ``BATCH_SIZE`` examples per step and updates on its own.
So an epoch is the same number of updates (``TRAIN_EXAMPLES / BATCH_SIZE``) whatever
the mode or the number of workers. ``--scale-lr`` multiplies the learning rate by the
number of workers (the linear scaling rule, for when you also scale ``--batch-size``).

Loading
=======

:func:`load_job` imports a job from a ``.py`` file, or from a directory holding
``job.py``; a directory is imported as a package, so its ``job.py`` may import
sibling modules relatively (``from . import data``). Missing or ill-typed names fail
with a :class:`JobError` naming the file and the name.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

REQUIRED_FUNCTIONS = ("build_model", "dataset", "loss", "optimizer")
OPTIONAL_FUNCTIONS = ("accuracy",)


class JobError(ValueError):
    """A job file cannot be loaded or does not follow the job API."""


@dataclass(frozen=True)
class Shard:
    """Which part of a split the current input pipeline reads.

    ``index`` is an ``int`` or, in async mode, a scalar int64 ``tf.Tensor`` (see the
    module docstring). ``seed`` is the same on every worker; shuffle with it so a run
    is repeatable.
    """

    index: Any
    count: int
    split: str
    seed: int = 0


@dataclass(frozen=True)
class Job:
    """A loaded job: its callables and its defaults."""

    name: str
    path: str
    build_model: Callable[[], Any]
    dataset: Callable[[Shard], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[float], Any]
    accuracy: Callable[[Any, Any], Any] | None
    batch_size: int
    learning_rate: float
    epochs: float | None
    steps: int | None
    train_examples: int | None


def _module_name(path: str) -> str:
    # Unique per path, stable per process: two jobs with the same file name coexist.
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    stem = os.path.splitext(os.path.basename(path.rstrip(os.sep)))[0]
    safe = "".join(c if c.isalnum() else "_" for c in stem) or "job"
    return f"pscluster_job_{safe}_{digest}"


def _import_file(path: str) -> ModuleType:
    name = _module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise JobError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_package_job(directory: str) -> ModuleType:
    """Imports ``directory`` as a package and returns its ``job`` submodule."""
    name = _module_name(directory)
    if name not in sys.modules:
        init = os.path.join(directory, "__init__.py")
        if os.path.exists(init):
            spec = importlib.util.spec_from_file_location(
                name, init, submodule_search_locations=[directory])
        else:
            spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
            if spec is not None:
                spec.submodule_search_locations = [directory]
        if spec is None:
            raise JobError(f"{directory}: cannot be imported as a package")
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        try:
            if spec.loader is not None:
                spec.loader.exec_module(package)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    try:
        return importlib.import_module(f"{name}.job")
    except BaseException:
        sys.modules.pop(f"{name}.job", None)
        raise


def import_job_module(path: str | os.PathLike[str]) -> tuple[ModuleType, str]:
    """Imports the module behind ``path``; returns it and the file it came from.

    Raises:
        JobError: the path does not exist or is neither a .py file nor a directory
            with job.py. Exceptions raised by the job's own code propagate unchanged,
            with the job file in their traceback.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        job_file = os.path.join(path, "job.py")
        if not os.path.isfile(job_file):
            raise JobError(f"{path}: a job directory must contain job.py")
        return _import_package_job(path), job_file
    if not os.path.exists(path):
        raise JobError(f"{path}: no such job file or directory")
    if not path.endswith(".py"):
        raise JobError(f"{path}: a job is a .py file or a directory containing job.py")
    return _import_file(path), path


def _number(module: ModuleType, job_file: str, name: str, kind: type, *,
            required: bool) -> Any:
    if not hasattr(module, name):
        if required:
            raise JobError(f"{job_file}: the job must define {name} "
                           f"(see the job API in roles/jobs.py)")
        return None
    value = getattr(module, name)
    if value is None and not required:
        return None
    ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
    if isinstance(value, bool) or not ok or value <= 0:
        raise JobError(f"{job_file}: {name} must be a positive "
                       f"{'number' if kind is float else 'integer'}, got {value!r}")
    return kind(value)


def job_from_module(module: ModuleType, job_file: str) -> Job:
    """Validates a job module against the API and wraps it in a :class:`Job`."""
    functions: dict[str, Callable[..., Any] | None] = {}
    for name in REQUIRED_FUNCTIONS + OPTIONAL_FUNCTIONS:
        fn = getattr(module, name, None)
        if fn is None:
            if name in REQUIRED_FUNCTIONS:
                raise JobError(f"{job_file}: the job must define a function {name}() "
                               f"(see the job API in roles/jobs.py)")
        elif not callable(fn):
            raise JobError(f"{job_file}: {name} must be a function, got {type(fn).__name__}")
        functions[name] = fn
    epochs = _number(module, job_file, "EPOCHS", float, required=False)
    steps = _number(module, job_file, "STEPS", int, required=False)
    if epochs is None and steps is None:
        raise JobError(f"{job_file}: the job must define EPOCHS or STEPS (its default budget)")
    train_examples = _number(module, job_file, "TRAIN_EXAMPLES", int, required=False)
    return Job(
        name=os.path.basename(os.path.dirname(job_file))
        if os.path.basename(job_file) == "job.py" else os.path.basename(job_file)[:-3],
        path=job_file,
        build_model=functions["build_model"],  # type: ignore[arg-type]
        dataset=functions["dataset"],  # type: ignore[arg-type]
        loss=functions["loss"],  # type: ignore[arg-type]
        optimizer=functions["optimizer"],  # type: ignore[arg-type]
        accuracy=functions["accuracy"],
        batch_size=_number(module, job_file, "BATCH_SIZE", int, required=True),
        learning_rate=_number(module, job_file, "LEARNING_RATE", float, required=True),
        epochs=epochs,
        steps=steps,
        train_examples=train_examples,
    )


def load_job(path: str | os.PathLike[str]) -> Job:
    """Loads and validates the job at ``path`` (a .py file or a directory with job.py)."""
    module, job_file = import_job_module(path)
    return job_from_module(module, job_file)
