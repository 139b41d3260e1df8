"""roles/workerloss.py without TensorFlow: which workers are out, when they are taken back, and
what a worker thread does with a failure (the real coordinator: tests/local/test_roles.py)."""
from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest

from roles import workerloss


class Original:
    """TensorFlow's failure handler as the worker threads see it: records what it was given."""

    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    @contextlib.contextmanager
    def wait_on_failure(self, on_failure_fn=None, on_transient_failure_fn=None, on_recovery_fn=None,
                        worker_device_name="(unknown)"):
        try:
            yield
        except Exception as exc:  # noqa: BLE001
            self.seen.append(exc)
            if "swallow" not in str(exc):
                raise


class Lost(workerloss.WorkerLoss):
    """Takes ``ConnectionError`` for a worker's failure (TensorFlow's own test needs TensorFlow)."""

    def takes(self, error: BaseException) -> bool:
        return isinstance(error, ConnectionError)


def make(answers: dict[str, bool] | None = None, clock: list[float] | None = None):
    original = Original()
    workers = [SimpleNamespace(worker_index=i, failure_handler=original) for i in range(3)]
    coordinator = SimpleNamespace(_cluster=SimpleNamespace(workers=workers))
    now = clock if clock is not None else [100.0]
    loss = Lost(coordinator, ["h1:2224", "h2:2225", "h3:2226"], probe=lambda a: (answers or {}).get(a, False),
                clock=lambda: now[0], start=False)
    return loss, workers, original


def test_every_worker_gets_the_handler_once_and_the_rest_goes_to_tensorflows():
    loss, workers, original = make()
    assert all(isinstance(w.failure_handler, workerloss._Handler) for w in workers)
    handler = workers[0].failure_handler
    loss.guard(workers[0])
    assert workers[0].failure_handler is handler and handler.original is original
    # Not a worker's failure: TensorFlow's handler decides (here it re-raises one, swallows the other).
    with pytest.raises(ValueError):
        with handler.wait_on_failure(worker_device_name="/job:worker/task:0"):
            raise ValueError("a bug in the step function")
    with handler.wait_on_failure():
        raise ValueError("swallow: transient")
    assert [str(e) for e in original.seen] == ["a bug in the step function", "swallow: transient"]
    assert loss.out() == set() and loss.news() == []


def test_a_failed_worker_puts_its_closure_back_waits_out_and_comes_back_when_it_answers():
    answers: dict[str, bool] = {}
    clock = [100.0]
    loss, workers, original = make(answers, clock)
    calls: list[str] = []
    ended = threading.Event()

    def worker_thread() -> None:
        with workers[2].failure_handler.wait_on_failure(
                on_failure_fn=lambda e: calls.append(f"put back after {e}"),
                on_recovery_fn=lambda: calls.append("resources again"),
                worker_device_name="/job:worker/replica:0/task:2"):
            raise ConnectionError("Socket closed")
        ended.set()

    thread = threading.Thread(target=worker_thread, daemon=True)
    thread.start()
    for _ in range(200):
        if loss.out():
            break
        ended.wait(0.01)
    assert loss.out() == {2} and calls == ["put back after Socket closed"] and not ended.is_set()
    assert loss.live(3) == 2 and loss.live(1) == 1          # never fewer than one: the chief schedules
    assert loss.news() == [("lost", 2, "ConnectionError: Socket closed")] and loss.news() == []
    loss.probe_once()
    assert loss.rejoin_ready() == []                         # h3 does not answer yet
    answers["h3:2226"] = True
    loss.probe_once()
    assert loss.rejoin_ready() == [2]
    # What rejoin() does once TensorFlow's context took the cluster again (update_server_def):
    with loss._lock:
        parked = loss._parked.pop(2)
    parked.release.set()
    thread.join(5)
    assert ended.is_set() and calls == ["put back after Socket closed", "resources again"]
    assert original.seen == []                                # TensorFlow's recovery never ran


def test_one_worker_still_cut_off_holds_back_the_rejoin_of_the_others():
    answers = {"h2:2225": True}
    clock = [100.0]
    loss, _, _ = make(answers, clock)
    loss.park(1, "UnavailableError")
    loss.park(2, "UnavailableError")
    loss.park(2, "again")                                     # counted once
    assert [n[1] for n in loss.news()] == [1, 2]
    loss.probe_once()
    assert loss.rejoin_ready() == []                          # h3 still silent: update_server_def would wait on it
    answers["h3:2226"] = True
    loss.probe_once()
    assert sorted(loss.rejoin_ready()) == [1, 2]


def test_a_worker_that_leaves_the_cluster_is_released_and_forgotten():
    loss, workers, _ = make()
    parked = loss.park(2, "UnavailableError")
    loss.forget(range(2, 3))
    assert parked.release.is_set() and loss.out() == set()
    new = SimpleNamespace(worker_index=3, failure_handler=Original())
    workers.append(new)
    loss.follow(SimpleNamespace(_cluster=SimpleNamespace(workers=workers)), ["a:1", "b:2", "c:3", "d:4"])
    assert isinstance(new.failure_handler, workerloss._Handler) and loss.addresses[3] == "d:4"
    loss.stop()
    assert loss.stopped


class Queue:
    """The coordinator's closure queue as a held worker sees it: what it put back."""

    def __init__(self) -> None:
        self.put_back_ones: list[str] = []

    def put_back(self, closure) -> None:
        self.put_back_ones.append(closure)


def test_a_drained_worker_ends_its_closure_then_puts_the_next_back_and_waits_until_taken_back():
    answers = {"h2:2225": True}          # worker 1's server still runs when the drain comes
    loss, workers, _ = make(answers)
    queue = Queue()
    recovered: list[int] = []
    for worker in workers:
        worker._cluster = SimpleNamespace(closure_queue=queue)
        worker._should_worker_thread_run = True
        worker._on_worker_recovery = lambda i=worker.worker_index: recovered.append(i)
    assert loss.hold(workers[1], "closure A") is False          # not drained: it runs A, busy
    assert loss.retire([1]) == [1] and loss.retire([1]) == []   # counted out at once, once
    assert loss.out() == {1} and loss.live(3) == 2
    assert loss.news() == [("drained", 1, "drained")]
    assert not loss.idle([1]) and loss.idle([0, 2])              # A still runs there
    loss.done(1)
    assert loss.idle([1])                                        # the chief may now say so: servers stop
    # Its thread's next closure goes back to the queue, and it waits (no closure runs there).
    held = threading.Thread(target=lambda: recovered.append(100 + loss.hold(workers[1], "closure B")), daemon=True)
    held.start()
    for _ in range(200):
        if queue.put_back_ones:
            break
        threading.Event().wait(0.01)
    assert queue.put_back_ones == ["closure B"] and held.is_alive() and loss.idle([1])
    # Its drained server still answers: not taken back; it stops (quiet), then answers again (undrain).
    loss.probe_once()
    assert loss.rejoin_ready() == []
    answers["h2:2225"] = False
    loss.probe_once()
    assert loss.rejoin_ready() == []
    answers["h2:2225"] = True
    loss.probe_once()
    assert loss.rejoin_ready() == [1]
    with loss._lock:                                             # what rejoin() does after update_server_def
        parked = loss._parked.pop(1)
    parked.taken_back = True
    parked.release.set()
    held.join(5)
    assert recovered == [1, 101]                                 # its resources again, then it takes closures


def test_a_drained_worker_released_by_the_chiefs_end_or_by_leaving_runs_nothing_more():
    loss, workers, _ = make()
    queue = Queue()
    workers[0]._cluster = SimpleNamespace(closure_queue=queue)
    workers[0]._should_worker_thread_run = True
    workers[0]._on_worker_recovery = lambda: pytest.fail("no recovery after the chief's end")
    workers[1]._cluster = SimpleNamespace(closure_queue=queue)
    workers[1]._on_worker_recovery = lambda: pytest.fail("no recovery of a worker that left the cluster")
    loss.retire([0, 1])
    held = [threading.Thread(target=loss.hold, args=(workers[i], f"closure {i}"), daemon=True) for i in (0, 1)]
    for thread in held:
        thread.start()
    for _ in range(200):
        if len(queue.put_back_ones) == 2:
            break
        threading.Event().wait(0.01)
    loss.forget([1])                       # worker 1 leaves the cluster (scale): released, not recovered
    held[1].join(5)
    loss.stop()
    held[0].join(5)
    assert not any(t.is_alive() for t in held) and sorted(queue.put_back_ones) == ["closure 0", "closure 1"]
    assert loss.hold(workers[0], "closure D") is False            # after the end: TensorFlow's as before


def test_tcp_answers_only_where_something_listens():
    import socket
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        assert workerloss.tcp_answers(f"127.0.0.1:{port}")
    finally:
        server.close()
    assert not workerloss.tcp_answers(f"127.0.0.1:{port}", timeout=0.2)
    assert not workerloss.tcp_answers("no-port-here")


class EndlessLost(Lost):
    """As Lost, and an input that never ends: EOFError stands for TensorFlow's OutOfRangeError."""

    def broken_input(self, error: BaseException) -> bool:
        return self.endless_input and isinstance(error, EOFError)


def test_the_end_of_an_endless_input_is_a_broken_worker_a_few_times_then_tensorflows():
    original = Original()
    workers = [SimpleNamespace(worker_index=i, failure_handler=original) for i in range(2)]
    coordinator = SimpleNamespace(_cluster=SimpleNamespace(workers=workers))
    loss = EndlessLost(coordinator, ["h1:2224", "h2:2225"], probe=lambda a: True, start=False, endless_input=True)
    handler = workers[1].failure_handler
    assert [handler._takes(EOFError("End of sequence")) for _ in range(workerloss.MAX_BROKEN_INPUT + 1)] == \
        [True] * workerloss.MAX_BROKEN_INPUT + [False]
    assert workers[0].failure_handler._takes(EOFError("End of sequence"))      # counted per worker
    assert not handler._takes(ValueError("a bug in the step function"))
    # A worker whose iterator broke is parked as a lost one, its closure put back.
    calls: list[str] = []
    thread = threading.Thread(target=lambda: _fail_once(workers[0].failure_handler, EOFError("End of sequence"), calls),
                              daemon=True)
    thread.start()
    for _ in range(200):
        if loss.out():
            break
        thread.join(0.01)
    assert loss.out() == {0} and calls == ["put back after End of sequence"]
    assert loss.news() == [("lost", 0, "EOFError: End of sequence")]
    loss.stop()
    thread.join(5)


def _fail_once(handler, error, calls):
    with handler.wait_on_failure(on_failure_fn=lambda e: calls.append(f"put back after {e}"),
                                 worker_device_name="/job:worker/replica:0/task:0"):
        raise error


def test_without_an_endless_input_its_end_is_tensorflows():
    loss, workers, _ = make()
    assert loss.endless_input is False and not workerloss.WorkerLoss.broken_input(loss, EOFError())
