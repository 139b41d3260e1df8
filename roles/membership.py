"""Async mode: the chief takes workers in and lets them go without a restart.

TensorFlow 2.21's ``ClusterCoordinator`` reads its workers once, from the strategy's cluster
resolver, and has no ``add_worker`` (TensorFlow PR #48601 tried and was closed). What it does
have, checked here with real servers (tests/local/test_resize.py, benchmarks/elastic.py):

* ``context.context().update_server_def(server_def)`` with a cluster that has one more (or one
  fewer) ``worker`` task takes effect in ~0.02 s: the chief's eager context creates the
  newcomer's remote context (its server already runs, started with the new cluster) and drops
  the one that left; the ps and the other workers are not touched. (``connect_to_cluster``
  would try ``set_server_def``, i.e. a second server on the chief's port, and fail.)
* the coordinator's ``Cluster`` then needs a ``Worker`` (a closure-processing thread) for the
  new task, or the one of the task that leaves stopped; the worker preemption handler keeps
  the server def it reconnects with, so it gets the new one.
* per-worker values (``create_per_worker_dataset``) have one entry per worker when created, so
  the driver creates them again, sharded by the new count.

Only a change at the end of the worker list is made in place: workers are numbered in
inventory order, and a task whose index or address changes must restart. The orchestrator
(cluster/supervision/train_resize.py) asks only for such changes and otherwise restarts the job from a
checkpoint; the chief still refuses anything else, and says why.

The request comes as a file beside the chief's events file (``<events>.membership``, JSON
``{"seq": N, "cluster": {...}}``, written by ``hostctl tell``); the driver looks for it between
closures, and answers with a ``membership`` event (``seq``, ``workers``, ``step``, or
``refused``).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Mapping, Sequence

log = logging.getLogger("pscluster.membership")

SUFFIX = ".membership"


class MembershipRefused(ValueError):
    """A change the chief cannot make in place (the reason is the message)."""


def control_path(events_path: str) -> str:
    return events_path + SUFFIX


class Requests:
    """Polls the request file; one ``stat`` per call while nothing changed. A file left by an
    earlier trainer with the same events path (a cluster of the same name, up again) is removed
    at once: create this before the ``start`` event, after which the orchestrator may ask."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.seq = 0
        self._seen: tuple[int, int] | None = None
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass

    def poll(self) -> dict | None:
        """The next request ({"seq", "cluster"}), or None."""
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        mark = (st.st_mtime_ns, st.st_size)
        if mark == self._seen:
            return None
        self._seen = mark
        try:
            with open(self.path) as handle:
                request = json.load(handle)
        except (OSError, ValueError):
            return None
        if not isinstance(request, dict) or not isinstance(request.get("seq"), int) or request["seq"] <= self.seq:
            return None
        self.seq = request["seq"]
        return request


def plan_change(old: Mapping[str, Sequence[str]], new: Any) -> tuple[list[str], int]:
    """``(workers to add, workers to remove)`` to go from cluster ``old`` to ``new`` in place.

    Raises:
        MembershipRefused: ``new`` is not a cluster, changes a job other than ``worker``, keeps
            no worker, or changes a worker other than at the end of the list.
    """
    if not isinstance(new, dict) or not all(isinstance(v, list) and all(isinstance(a, str) for a in v)
                                            for v in new.values()):
        raise MembershipRefused("the request holds no cluster")
    for job in sorted(set(old) | set(new)):
        if job != "worker" and list(old.get(job, [])) != list(new.get(job, [])):
            raise MembershipRefused(f"it changes the {job!r} tasks ({list(old.get(job, []))} -> "
                                    f"{list(new.get(job, []))}); only workers change in place")
    before, after = list(old.get("worker", [])), list(new.get("worker", []))
    if not after:
        raise MembershipRefused("it leaves no worker")
    if after[:len(before)] == before:
        return after[len(before):], 0
    if before[:len(after)] == after:
        return [], len(before) - len(after)
    raise MembershipRefused("a worker other than the last ones changes (its index or address)")


def apply_change(strategy: Any, coordinator: Any, new_cluster: Mapping[str, Sequence[str]],
                 added: Sequence[str], removed: int) -> None:
    """Point the chief's context and the coordinator at ``new_cluster``; nothing may be in flight
    (the caller joined the coordinator). Per-worker values must be created again afterwards."""
    import tensorflow as tf
    from tensorflow.python.distribute.coordinator import cluster_coordinator
    from tensorflow.python.eager import context

    cluster = coordinator._cluster       # noqa: SLF001 - no public API (module docstring)
    workers = len(new_cluster["worker"])
    leaving = cluster.workers[workers:] if removed else []
    for worker in leaving:
        worker.stop()
        # Its thread waits for a closure tagged with its index: hand it one that only ends it.
        cluster.closure_queue.put(_EndThread(), tag=worker.worker_index)
    del cluster.workers[workers:]

    # The cluster only: TensorFlow ignores a change of device filters after the first connection.
    server_def = context.get_server_def()
    server_def.cluster.CopyFrom(tf.train.ClusterSpec(dict(new_cluster)).as_cluster_def())
    context.context().update_server_def(server_def)

    cluster._num_workers = workers      # noqa: SLF001
    strategy._num_workers = workers     # noqa: SLF001
    strategy.extended._num_workers = workers  # noqa: SLF001
    handler = cluster.failure_handler
    handler._server_def = context.get_server_def()  # noqa: SLF001 - it reconnects with this one
    handler._num_workers = workers      # noqa: SLF001
    first_new = len(cluster.workers)
    for index in range(first_new, workers):
        cluster.workers.append(cluster_coordinator.Worker(index, f"/job:worker/replica:0/task:{index}", cluster))
    log.info("membership: %d worker(s) now (%d added, %d removed)", workers, len(added), removed)


class _EndThread:
    """The closure a leaving worker's thread takes last: it sees it must stop and cancels it."""

    tag = None

    def mark_cancelled(self) -> None:
        pass
