"""Object-based checkpoints for the TF2 modes (async and sync), kept by the chief.

Async (ParameterServerStrategy): the variables live on the ps tasks and by default
each ps would write its own shard *on its own host*, which fails without a shared
filesystem (``NOT_FOUND ... default_temp``) and scatters the files when one exists.
Passing ``experimental_io_device`` set to the chief's CPU makes the chief read every
variable and write every file itself, so ``--checkpoint-dir`` only needs to exist on
the chief (and may be relative to the chief's working directory).

Sync (MultiWorkerMirroredStrategy): saving may run collectives, so every worker must
call save; TensorFlow's multi-worker guide has the non-chief workers write to a
throw-away directory and delete it, which :class:`CheckpointKeeper` does with
``keep=False``. Restoring needs the files only on the chief; the sync driver then
copies the chief's values to the other workers.

Async saves go through one ``tf.function``, traced (and registered on every task) when the keeper
is made, with a save to a scratch directory. TensorFlow's own eager
save of variables on several tasks traces a new function at every call
(``MultiDeviceSaver.save``), and registering a new function reaches every task of the cluster:
with a worker's host unreachable, each save waited for it (measured: a snapshot took 18 s after
the orchestrator shut the link to a cut worker; with the packets only dropped, an eager save
waited over 250 s while the traced one took 0.02 s).

Sync-ps (graph mode) uses ``tf.compat.v1.train.Saver`` instead; see syncps_driver.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management

MAX_TO_KEEP = 3
CHECKPOINT_NAME = "ckpt"
# Every traced save function, alive until the process ends (async trainers end with os._exit):
# deleting one removes it from the eager context, which waits for every pending remote op, and a
# frozen worker's never finish; the chief that ended without a checkpoint hung there, in
# AtomicFunction.__del__, when the driver returned.
_TRACED: list[Any] = []


class CheckpointKeeper:
    """Saves and restores one ``tf.train.Checkpoint`` under a directory.

    ``keep=False`` saves into a fresh temporary directory and deletes it afterwards
    (the non-chief side of the multi-worker protocol). ``io_device`` routes all file
    I/O through one device (the chief's CPU under ParameterServerStrategy).
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, *,
                 keep: bool = True, io_device: str | None = None) -> None:
        self._checkpoint = checkpoint
        self._keep = keep
        self._directory = directory if keep else tempfile.mkdtemp(prefix="pscluster-ckpt-")
        self._options = (tf.train.CheckpointOptions(experimental_io_device=io_device)
                         if io_device else tf.train.CheckpointOptions())
        if keep:
            os.makedirs(directory, exist_ok=True)
        self._manager = tf.train.CheckpointManager(
            checkpoint, self._directory, max_to_keep=MAX_TO_KEEP,
            checkpoint_name=CHECKPOINT_NAME)
        self._traced: Any = None
        if io_device:       # the variables live on other tasks (async): one traced save function
            # Made before the trace (it is saved, as CheckpointManager.save would, so that a
            # restore matches every object) and counted on the chief, outside the function.
            self._counter = checkpoint.save_counter
            self.retrace()

    def retrace(self) -> None:
        """Trace the save function again (async): a trace holds the variables' handles, and a
        ps moved in place (roles/psmove.py) gave them new ones. A keeper without an
        ``io_device`` traces nothing."""
        if not self._options.experimental_io_device:
            return
        checkpoint, options = self._checkpoint, self._options

        @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
        def write(prefix: tf.Tensor) -> tf.Tensor:
            return checkpoint.write(prefix, options=options)
        self._traced = write
        _TRACED.append(write)
        # Traced and registered now, while every task answers: the first call registers it on
        # all of them, and a first snapshot during a worker's cut waited 19 s for it.
        scratch = tempfile.mkdtemp(prefix="pscluster-ckpt-warm-")
        try:
            write(tf.constant(os.path.join(scratch, CHECKPOINT_NAME)))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @property
    def directory(self) -> str:
        return self._directory

    def latest(self) -> str | None:
        if not self._keep:
            return None
        return tf.train.latest_checkpoint(self._directory) if self._traced else self._manager.latest_checkpoint

    def restore_latest(self) -> str | None:
        """Restores the newest checkpoint; returns its path, or None if there is none.

        Every existing object must match the checkpoint: restoring another job's
        checkpoint fails here rather than training from half-restored weights.
        """
        path = self.latest()
        if path is None:
            return None
        status = self._checkpoint.restore(path, options=self._options)
        status.assert_existing_objects_matched()
        return path

    def save_and_report(self, step: int, reporter: Any) -> str | None:
        """Save at ``step`` and report the checkpoint (when this keeper keeps it)."""
        path = self.save(step)
        if path:
            reporter.checkpoint(step, path)
        return path

    def save(self, step: int) -> str | None:
        """Writes a checkpoint numbered ``step``; returns its path (None if not kept)."""
        if self._traced is not None:
            return self._save_traced(step)
        path = self._manager.save(checkpoint_number=step, options=self._options)
        if not self._keep:
            shutil.rmtree(self._directory, ignore_errors=True)
            return None
        return path

    def _save_traced(self, step: int) -> str:
        """What ``CheckpointManager.save`` does, with the traced function: write, record the
        newest in the directory's ``checkpoint`` file (relative paths) and keep MAX_TO_KEEP."""
        prefix = os.path.join(self._directory, f"{CHECKPOINT_NAME}-{step}")
        self._counter.assign_add(1)
        path = self._traced(tf.constant(prefix)).numpy().decode()
        state = tf.train.get_checkpoint_state(self._directory)
        kept = [p for p in (state.all_model_checkpoint_paths if state else []) if p != path] + [path]
        for old in kept[:-MAX_TO_KEEP]:
            for name in tf.io.gfile.glob(f"{old}.*"):
                tf.io.gfile.remove(name)
        checkpoint_management.update_checkpoint_state_internal(
            self._directory, path, all_model_checkpoint_paths=kept[-MAX_TO_KEEP:], save_relative_paths=True)
        return path

    def close(self) -> None:
        if not self._keep:
            shutil.rmtree(self._directory, ignore_errors=True)


def chief_io_device(task_type: str = "chief", task_index: int = 0) -> str:
    return f"/job:{task_type}/replica:0/task:{task_index}/device:CPU:0"


def make_step_counter() -> tf.Variable:
    """The global step of the TF2 modes; create it inside the strategy's scope."""
    return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")


def make_checkpoint(model: Any, optimizer: Any, step: tf.Variable) -> tf.train.Checkpoint:
    """The object graph saved in the TF2 modes: weights, optimizer state, global step."""
    return tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
