"""A sync worker other than 0 waits for worker 0's port before joining the strategy
(roles/tfconfig.wait_for_leader): with real sockets, no TensorFlow."""
from __future__ import annotations

import socket
import threading
import time

from roles.tfconfig import TaskInfo, wait_for_leader


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worker(index: int, port: int) -> TaskInfo:
    return TaskInfo(cluster={"worker": (f"127.0.0.1:{port}", "127.0.0.1:1")}, task_type="worker", task_index=index)


def test_worker_1_returns_once_worker_0_listens():
    port = free_port()
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (wait_for_leader(worker(1, port), timeout=60), returned.set()))
    waiter.start()                      # worker 1 starts first: nobody listens on worker 0's port
    with socket.socket() as server:
        assert not returned.is_set()    # it cannot return before worker 0 listens (or 60 s pass)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        waiter.join(timeout=60)         # a safety net only: it returns at its next try
        assert returned.is_set()


def test_worker_0_and_a_leader_that_never_comes_do_not_hold_it_up():
    port = free_port()
    wait_for_leader(worker(0, port), timeout=30)            # the leader waits for nobody
    began = time.monotonic()
    wait_for_leader(worker(1, port), timeout=0.2)           # nobody listens: gives up at the timeout
    assert time.monotonic() - began >= 0.2
