"""Sync-ps start-up: agree on a fresh resource container, then wait for the chief.

Why this exists: in graph mode, variables, queues and gradient accumulators live on
the ps tasks, shared by name, until the ps process ends. The ps tasks are standing
servers that outlive a training run, so a second run on the same cluster would find
the first run's state: a non-chief worker could read the old global step (already
at the budget), stop at once, and leave the chief waiting forever for its gradients;
leftover sync tokens and accumulated gradients would leak into the new run. Putting
each run's state in a container named for that run makes every run start clean; the
workers only have to agree on the name, which is what :func:`rendezvous` does through
a few control variables on ``/job:ps/task:0``:

1. the chief picks a random id, writes it to ``generation``, and keeps copying
   every worker's ``hello`` slot into its ``ack`` slot;
2. worker *i* writes a random nonce into ``hello[i]`` until it sees that nonce in
   ``ack[i]`` -- proof that a chief *of this run* has read it -- then reads
   ``generation`` and writes it into ``confirm[i]``;
3. the chief proceeds once every ``confirm[i]`` equals its id. Stale values from an
   earlier run can never match: both the nonces and the id are fresh random numbers.

Afterwards the chief sets ``ready`` to the id once it has initialised (or restored)
the run's variables; workers wait for that before opening their session. This also
saves time: a ``MonitoredTrainingSession`` on a non-chief that finds the model not
ready sleeps 30 s (SessionManager's fixed ``recovery_wait_secs``) before looking again.

Only the chief initialises the control variables, so there is no init race.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import tensorflow as tf

log = logging.getLogger("pscluster.syncps")

CONTROL_CONTAINER = "pscluster-control"
POLL_SECONDS = 0.1


def _fresh_id() -> int:
    return random.SystemRandom().randrange(1, 2**62)


class ControlChannel:
    """The control variables and a session to read and write them."""

    def __init__(self, target: str, num_workers: int, config: Any) -> None:
        self._graph = tf.Graph()
        n = num_workers
        with self._graph.as_default(), tf.compat.v1.container(CONTROL_CONTAINER), \
                tf.device("/job:ps/task:0/device:CPU:0"):
            def var(name: str, shape: list[int]) -> tf.Variable:
                # The worker count is in the name: another run with another count
                # must not meet a variable of the wrong shape.
                return tf.Variable(tf.zeros(shape, tf.int64), trainable=False,
                                   name=f"{name}_w{n}")

            self._hello = var("hello", [n])
            self._ack = var("ack", [n])
            self._confirm = var("confirm", [n])
            self._generation = var("generation", [])
            self._ready = var("ready", [])
            all_vars = [self._hello, self._ack, self._confirm, self._generation, self._ready]
            self._init = tf.compat.v1.variables_initializer(all_vars)
            self._initialized = tf.reduce_all(tf.stack(
                [tf.compat.v1.is_variable_initialized(v) for v in all_vars]))
            self._index = tf.compat.v1.placeholder(tf.int32, [])
            self._value = tf.compat.v1.placeholder(tf.int64, [])
            slot = tf.IndexedSlices(tf.reshape(self._value, [1]), tf.reshape(self._index, [1]))
            self._set_hello = self._hello.scatter_update(slot)
            self._set_confirm = self._confirm.scatter_update(slot)
            self._copy_ack = self._ack.assign(self._hello.read_value())
            self._set_generation = self._generation.assign(self._value)
            self._set_ready = self._ready.assign(self._value)
        self._session = tf.compat.v1.Session(target, graph=self._graph, config=config)

    def _run(self, fetches: Any, index: int = 0, value: int = 0) -> Any:
        return self._session.run(fetches, {self._index: index, self._value: value})

    def chief_agree(self, num_workers: int) -> int:
        """Chief side of the protocol; returns the run id once all workers confirmed."""
        if not self._run(self._initialized):
            self._run(self._init)
        run_id = _fresh_id()
        self._run(self._set_ready, value=0)
        self._run(self._set_generation, value=run_id)
        while True:
            self._run(self._copy_ack)
            confirmed = self._run(self._confirm)
            missing = [i for i in range(1, num_workers) if int(confirmed[i]) != run_id]
            if not missing:
                return run_id
            time.sleep(POLL_SECONDS)

    def worker_agree(self, index: int) -> int:
        """Worker side; returns the chief's run id."""
        while not self._run(self._initialized):
            time.sleep(POLL_SECONDS)
        nonce = _fresh_id()
        while True:
            self._run(self._set_hello, index=index, value=nonce)
            if int(self._run(self._ack)[index]) == nonce:
                run_id = int(self._run(self._generation))
                self._run(self._set_confirm, index=index, value=run_id)
                return run_id
            time.sleep(POLL_SECONDS)

    def announce_ready(self, run_id: int) -> None:
        self._run(self._set_ready, value=run_id)

    def wait_ready(self, run_id: int) -> None:
        while int(self._run(self._ready)) != run_id:
            time.sleep(POLL_SECONDS)


def container_name(run_id: int) -> str:
    return f"pscluster-run-{run_id:016x}"
