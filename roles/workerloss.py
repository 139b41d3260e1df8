"""Async mode: a worker that fails or goes away leaves the chief's coordinator at once, and comes
back when it answers again; no other worker waits for it, and no checkpoint is restored.

TensorFlow 2.21's ``ClusterCoordinator`` already survives a worker failure (its
``WorkerPreemptionHandler``): the failed worker's closure is put back for another worker, and the
worker's thread waits until the cluster is "recovered". But the recovery is one
``update_server_def`` of the whole cluster, which blocks until *every* worker answers, holding
the coordinator's update lock; measured here (benchmarks/worker_cut.py), the chief's progress
stopped for ~20 s after each lost worker's closure failed, and a worker cut off for good made the
recovery loop retry for good.

So each worker thread gets a :class:`_Handler` in front of TensorFlow's (the ``failure_handler``
attribute the thread reads for every closure). For a plain worker failure (what TensorFlow's own
``_is_worker_failure`` says, and no error of a parameter server or of a cancellation):

* the closure goes back to the queue (TensorFlow's own ``on_failure_fn``), another worker runs it;
* the thread *parks* (it takes no closure) and the worker is counted out: the chief keeps
  ``IN_FLIGHT_PER_WORKER`` closures per live worker, and collects them in any order, so the
  others never wait on it;
* a probe thread tries the worker's address every :data:`PROBE_EVERY` seconds; once it accepts a
  connection, the chief (between two closures, :meth:`WorkerLoss.rejoin_ready`) points its context at
  the cluster again (``update_server_def`` with the same cluster: TensorFlow finds the worker's
  new incarnation and creates its remote context; the other workers' are untouched) and unparks
  the thread, which creates its per-worker resources again (TensorFlow's ``on_recovery_fn``: the
  worker's dataset iterator) before it takes closures.

One more error is a worker's failure when the chief says its input never ends
(``endless_input``: roles/datasets.py repeats every training set): an ``OutOfRangeError`` ("End of
sequence") from a closure. It cannot be the end of the data; it is a worker whose per-worker
iterator broke in its recovery (seen in CI: a 20-s cut, the worker back in 0.9 s, a closure's
transient failure from its own stale channel to a ps, then "Unable to find the relevant tensor
remote_handle" and End of sequence, which TensorFlow passed to the chief: the chief exited and
was restarted from its snapshot, 164 steps lost). Such a worker is counted out like any other and
its resources are created again when it is taken back, at most ``MAX_BROKEN_INPUT`` times a
worker; after that the error goes to TensorFlow as before.

A worker the orchestrator drains (``pscluster drain HOST``: roles/async_driver.py passes the
request to :meth:`WorkerLoss.retire`) leaves without a failure: it is counted out at once, its
closure in flight ends where it runs, and its thread, before its next closure, puts that closure
back for the others and waits (:meth:`WorkerLoss.hold`, a wrapper of the worker's
``_process_closure``). Once none of its closures runs (:meth:`WorkerLoss.idle`) the chief says so
and the orchestrator stops its servers: no closure is cut and run again, so no step is done
twice (before, the stop failed its closure in flight: 32 steps done again in every trial of
benchmarks/drain.py). Undrained, it is taken back like a lost worker once its address, quiet
after the stop, answers again.

Everything else (a parameter server's error, an error of the user's function) goes to
TensorFlow's handler unchanged. A closure that hangs rather than fails (a link cut without a
reset) is made to fail by roles/closures.py.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

log = logging.getLogger("pscluster.workerloss")

PROBE_EVERY = 1.0          # seconds between two connection attempts to a parked worker's address
PROBE_TIMEOUT = 0.5
# A parked worker whose server answers is taken back at most this often (a failed rejoin waits).
REJOIN_RETRY = 5.0
MAX_BROKEN_INPUT = 3       # times one worker's broken iterator is taken for a failure (module docstring)


def tcp_answers(address: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether something accepts a TCP connection at ``address`` ("host:port")."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


@dataclass
class Parked:
    """A worker out of the coordinator: why, since when, and the event its thread waits on."""

    index: int
    reason: str
    since: float
    release: threading.Event = field(default_factory=threading.Event)
    answering: bool = False
    next_try: float = 0.0
    # Retired by the orchestrator (a drain, :meth:`WorkerLoss.retire`): its thread waits before
    # its next closure, and it is taken back only once its address went quiet and answers again
    # (undrain: its servers start anew), not while the drained server still runs.
    drained: bool = False
    seen_down: bool = True
    taken_back: bool = False        # released by :meth:`WorkerLoss.rejoin` (not by forget or stop)


class WorkerLoss:
    """The chief's view of which workers are out, and the means to take them back.

    ``coordinator``: TensorFlow's ``ClusterCoordinator``; ``addresses``: the worker addresses by
    index. Call :func:`install` first (once per process). ``probe(address) -> bool``, ``clock``
    and ``start`` (False: no probe thread; call :meth:`probe_once`) are for tests."""

    def __init__(self, coordinator: Any, addresses: Sequence[str], *,
                 probe: Callable[[str], bool] = tcp_answers,
                 clock: Callable[[], float] = time.monotonic, start: bool = True,
                 endless_input: bool = False) -> None:
        self._cluster = coordinator._cluster          # noqa: SLF001 - no public API (module docstring)
        self.addresses = list(addresses)
        self.endless_input = endless_input
        self._probe = probe
        self._clock = clock
        self._lock = threading.Lock()
        self._parked: dict[int, Parked] = {}
        self._news: list[tuple[str, int, str]] = []     # ("lost"|"drained"|"back", index, reason), for the main thread
        self._busy: set[int] = set()                    # workers whose thread runs a closure now
        self._stopped = threading.Event()
        for worker in self._cluster.workers:
            self.guard(worker)
        if start:
            threading.Thread(target=self._probe_loop, name="pscluster-worker-probe", daemon=True).start()

    # ------------------------------------------------------------------ the worker threads' side
    def guard(self, worker: Any) -> None:
        """Put a :class:`_Handler` in front of ``worker``'s failure handler (once)."""
        if not isinstance(worker.failure_handler, _Handler):
            worker.failure_handler = _Handler(self, worker.worker_index, worker.failure_handler)

    def takes(self, error: BaseException) -> bool:
        """Whether ``error`` is a worker's failure this module handles (else TensorFlow's handler)."""
        from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
        from tensorflow.python.framework import errors

        if self._cluster.closure_queue._cancellation_mgr.is_cancelled:   # noqa: SLF001 - the job is failing
            return False
        if isinstance(error, errors.CancelledError):
            return False        # derived from a ps's transient failure: TensorFlow ignores it
        if cc._is_ps_failure(error):                                      # noqa: SLF001
            return False
        return bool(cc._is_worker_failure(error))                         # noqa: SLF001

    def broken_input(self, error: BaseException) -> bool:
        """Whether ``error`` is a worker's broken iterator: the end of an input that never ends."""
        if not self.endless_input:
            return False
        from tensorflow.python.framework import errors

        return isinstance(error, errors.OutOfRangeError)

    def park(self, index: int, reason: str) -> Parked:
        """Count worker ``index`` out (called by its thread, which then waits on ``release``)."""
        with self._lock:
            parked = self._parked.get(index)
            if parked is None:
                parked = self._parked[index] = Parked(index, reason, self._clock())
                self._news.append(("lost", index, reason))
            return parked

    def hold(self, worker: Any, closure: Any) -> bool:
        """Before ``worker``'s thread runs ``closure`` (:func:`install`'s wrapper): a retired
        worker puts it back for the others and waits until it is taken back or the chief ends
        (True: the closure was not run here); any other marks itself busy (False)."""
        index = worker.worker_index
        with self._lock:
            parked = self._parked.get(index)
            if parked is None or not parked.drained or self.stopped:
                self._busy.add(index)
                return False
        worker._cluster.closure_queue.put_back(closure)    # noqa: SLF001 - its own queue
        parked.release.wait()
        if parked.taken_back and not self.stopped:
            worker._on_worker_recovery()    # noqa: SLF001 - as after a failure: its resources again
        return True

    def done(self, index: int) -> None:
        """Worker ``index``'s thread ended a closure."""
        with self._lock:
            self._busy.discard(index)

    # ------------------------------------------------------------------ the chief's side
    def retire(self, indices: Iterable[int], reason: str = "drained") -> list[int]:
        """Count workers ``indices`` out between two closures (``pscluster drain``): each one's
        closure in flight ends where it runs, and its thread takes no other. The indices newly
        retired (one already out stays as it is)."""
        retired = []
        with self._lock:
            for index in indices:
                if index not in self._parked:
                    self._parked[index] = Parked(index, reason, self._clock(), drained=True, seen_down=False)
                    self._news.append(("drained", index, reason))
                    retired.append(index)
        return retired

    def idle(self, indices: Iterable[int]) -> bool:
        """Whether no worker of ``indices`` runs a closure (a retired one: its last one ended)."""
        with self._lock:
            return not set(indices) & self._busy

    def out(self) -> set[int]:
        with self._lock:
            return set(self._parked)

    def out_for(self) -> float:
        """Seconds since the most recent of the workers out went out (0.0: none is out)."""
        with self._lock:
            newest = max((parked.since for parked in self._parked.values()), default=None)
        return 0.0 if newest is None else self._clock() - newest

    def live(self, total: int) -> int:
        """Workers that take closures, of ``total`` (at least one, so that the chief schedules)."""
        return max(1, total - len(self.out()))

    def news(self) -> list[tuple[str, int, str]]:
        """What changed since the last call: ``("lost", index, reason)`` or ``("back", index, "")``."""
        with self._lock:
            news, self._news = self._news, []
            return news

    def rejoin_ready(self) -> list[int]:
        """The parked workers to take back now: all of them, once every one answers again and its
        turn to try has come. (``update_server_def`` asks every worker of the cluster for its
        status and waits for the answer: with one still cut off, it would hold the chief.)"""
        now = self._clock()
        with self._lock:
            parked = list(self._parked.values())
            if parked and all(p.answering and now >= p.next_try for p in parked):
                return [p.index for p in parked]
            return []

    def rejoin(self, indices: Sequence[int]) -> list[int]:
        """Take workers ``indices`` back: one ``update_server_def`` with the chief's cluster, then
        each parked thread goes on (it recreates its per-worker resources first). The indices
        taken back; those whose server did not take the context wait :data:`REJOIN_RETRY`."""
        from tensorflow.python.eager import context

        try:
            context.context().update_server_def(context.get_server_def())
        except Exception as exc:  # noqa: BLE001 - any failure leaves the worker out, tried again later
            log.warning("taking back worker(s) %s failed (%s); trying again in %.0f s", list(indices),
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__, REJOIN_RETRY)
            with self._lock:
                for index in indices:
                    if index in self._parked:
                        self._parked[index].answering = False
                        self._parked[index].next_try = self._clock() + REJOIN_RETRY
            return []
        back = []
        with self._lock:
            for index in indices:
                parked = self._parked.pop(index, None)
                if parked is not None:
                    parked.taken_back = True
                    parked.release.set()
                    back.append(index)
                    self._news.append(("back", index, f"out for {self._clock() - parked.since:.1f} s"))
        return back

    def forget(self, indices: Iterable[int]) -> None:
        """Workers ``indices`` leave the cluster (a change of membership): a parked one's thread is
        released to end (TensorFlow's ``Worker.stop`` was called on it)."""
        with self._lock:
            for index in indices:
                parked = self._parked.pop(index, None)
                if parked is not None:
                    parked.release.set()

    def follow(self, coordinator: Any, addresses: Sequence[str]) -> None:
        """After a change of membership: the new worker list, and a handler for new workers."""
        self._cluster = coordinator._cluster          # noqa: SLF001
        self.addresses = list(addresses)
        for worker in self._cluster.workers:
            self.guard(worker)

    def stop(self) -> None:
        """Release every parked thread without taking it back (the chief ends)."""
        self._stopped.set()
        with self._lock:
            for parked in self._parked.values():
                parked.release.set()

    def _probe_loop(self) -> None:
        while not self._stopped.wait(PROBE_EVERY):
            self.probe_once()

    def probe_once(self) -> None:
        """Try the address of every parked worker not yet known to answer (a retired one's must
        have gone quiet once first)."""
        with self._lock:
            waiting = [(p.index, self.addresses[p.index]) for p in self._parked.values()
                       if not p.answering and p.index < len(self.addresses)]
        for index, address in waiting:
            answers = self._probe(address)
            with self._lock:
                parked = self._parked.get(index)
                if parked is None:
                    continue
                if not parked.seen_down:
                    parked.seen_down = not answers
                elif answers:
                    parked.answering = True

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()


class _CoordinatorContext:
    """The ``context`` module as TensorFlow's coordinator sees it, with one change: leaving a
    worker's ``executor_scope`` does not wait for the thread's previous executor.

    TensorFlow's ``executor_scope`` keeps the previous executor as a Python ``Executor`` wrapper,
    and that wrapper's ``__del__`` waits for every pending node of the executor it wraps: the
    context's default one, shared by every thread. With a worker just cut off, that executor
    holds nodes bound for it (the deletion of its remote tensors), so every other worker's
    thread, at the end of each closure, waited until the lost worker's RPCs failed: ~20 s in
    which no worker trained (py-spy: ``Executor.__del__`` -> ``WaitForAllPendingNodes`` under
    ``Closure.execute_on``). Each worker's own executor is synchronous, so its closure has ended
    when the scope is left; the wait bought nothing."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    @contextlib.contextmanager
    def executor_scope(self, executor: Any) -> Iterator[None]:
        from tensorflow.python import pywrap_tfe

        ctx = self._module.context()
        ctx.ensure_initialized()
        handle = ctx._context_handle                  # noqa: SLF001
        previous = pywrap_tfe.TFE_ContextGetExecutorForThread(handle)
        try:
            ctx.executor = executor
            yield
        finally:
            pywrap_tfe.TFE_ContextSetExecutorForThread(handle, previous)
            pywrap_tfe.TFE_DeleteExecutor(previous)   # the wrapper only; it does not own the executor


def install() -> None:
    """Give TensorFlow's coordinator the :class:`_CoordinatorContext`, and its worker threads
    :meth:`WorkerLoss.hold` before each closure (once per process)."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    if not isinstance(cc.context, _CoordinatorContext):
        cc.context = _CoordinatorContext(cc.context)
    original = cc.Worker._process_closure       # noqa: SLF001 - no public hook (module docstring)
    if getattr(original, "pscluster_hold", False):
        return

    def process(worker: Any, closure: Any) -> Any:
        handler = worker.failure_handler
        loss = handler._loss if isinstance(handler, _Handler) else None    # noqa: SLF001
        if loss is None:
            return original(worker, closure)
        if loss.hold(worker, closure):
            return None
        try:
            return original(worker, closure)
        finally:
            loss.done(worker.worker_index)

    process.pscluster_hold = True       # type: ignore[attr-defined]
    cc.Worker._process_closure = process   # noqa: SLF001


class _Handler:
    """Stands in front of TensorFlow's failure handler for one worker thread (module docstring)."""

    def __init__(self, loss: WorkerLoss, index: int, original: Any) -> None:
        self._loss = loss
        self._index = index
        self.original = original
        self.broken_inputs = 0      # the times this worker's broken iterator was taken for a failure

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def _takes(self, exc: BaseException) -> bool:
        if self._loss.takes(exc):
            return True
        if self.broken_inputs < MAX_BROKEN_INPUT and self._loss.broken_input(exc):
            self.broken_inputs += 1
            return True
        return False

    @contextlib.contextmanager
    def wait_on_failure(self, on_failure_fn: Callable[[Exception], Any] | None = None,
                        on_transient_failure_fn: Callable[[], Any] | None = None,
                        on_recovery_fn: Callable[[], Any] | None = None,
                        worker_device_name: str = "(unknown)") -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - sorted below; what is not ours goes to TensorFlow
            if self._loss.stopped or not self._takes(exc):
                with self.original.wait_on_failure(on_failure_fn=on_failure_fn,
                                                   on_transient_failure_fn=on_transient_failure_fn,
                                                   on_recovery_fn=on_recovery_fn,
                                                   worker_device_name=worker_device_name):
                    raise
                return
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            log.warning("worker %s failed (%s): its closure goes to another worker; it is out until it "
                        "answers again", worker_device_name, reason)
            if on_failure_fn is not None:
                on_failure_fn(exc)          # TensorFlow's: the closure back to the queue, resources aborted
            parked = self._loss.park(self._index, reason)
            parked.release.wait()
            if self._loss.stopped:
                return
            log.info("worker %s is back", worker_device_name)
            if on_recovery_fn is not None:
                with self.wait_on_failure(on_transient_failure_fn=on_transient_failure_fn,
                                          worker_device_name=worker_device_name):
                    on_recovery_fn()        # TensorFlow's: the worker's resources scheduled again
