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
    listening = threading.Event()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.3)         # worker 0 starts after worker 1
        server.bind(("127.0.0.1", port))
        server.listen()
        listening.set()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        wait_for_leader(worker(1, port), timeout=30)
        assert listening.is_set()       # it did not return before worker 0 listened
    finally:
        thread.join()
        server.close()


def test_worker_0_and_a_leader_that_never_comes_do_not_hold_it_up():
    port = free_port()
    wait_for_leader(worker(0, port), timeout=30)            # the leader waits for nobody
    began = time.monotonic()
    wait_for_leader(worker(1, port), timeout=0.2)           # nobody listens: gives up at the timeout
    assert time.monotonic() - began >= 0.2
