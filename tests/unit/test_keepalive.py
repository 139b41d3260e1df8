"""cluster/transport/keepalive.py: the one watchdog of every SSH connection, driven by hand (a
clock of our own, requests run when the test says), on fake connections."""
from __future__ import annotations

import threading

from cluster.transport.keepalive import Keepalives


class FakeConnection:
    def __init__(self, answers: bool = True):
        self.answers = answers
        self.active = True
        self.requests = 0
        self.closed = threading.Event()

    def is_active(self) -> bool:
        return self.active

    def global_request(self, kind, data=None, wait=True):
        assert kind == "keepalive@openssh.com" and wait
        self.requests += 1
        if not self.answers:       # a dead host: paramiko waits until the connection is closed
            self.closed.wait(5)
        return None

    def close(self) -> None:
        self.active = False
        self.closed.set()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock, queue: list) -> Keepalives:
    return Keepalives(every=2.0, dead_after=10.0, clock=clock, submit=queue.append)


def test_a_request_goes_out_every_two_seconds_to_a_live_host():
    clock, queue = Clock(), []
    keep = make(clock, queue)
    conn = FakeConnection()
    keep.watch(conn, start=False)
    assert keep.check(101.0) == [] and queue == []          # not due yet
    clock.now = 102.0
    keep.check(102.0)
    assert len(queue) == 1
    keep.check(103.0)
    assert len(queue) == 1                                  # one request out at a time
    queue.pop()()                                           # answered at once, at 102.0
    keep.check(103.5)
    assert queue == []
    keep.check(104.0)
    assert len(queue) == 1 and conn.requests == 1


def test_a_host_that_does_not_answer_for_ten_seconds_is_closed_and_forgotten():
    clock, queue = Clock(), []
    keep = make(clock, queue)
    conn = FakeConnection(answers=False)
    keep.watch(conn, start=False)
    keep.check(102.0)
    clock.now = 102.5
    sender = threading.Thread(target=queue.pop())           # sent at 102.5; blocks like paramiko
    sender.start()
    while conn.requests == 0:
        pass
    assert keep.check(112.4) == []                          # 9.9 s since it was sent
    (dead,) = keep.check(112.6)
    assert dead.conn is conn and dead.dead and not conn.active
    sender.join(5)
    assert not sender.is_alive()                            # the close freed the worker
    assert keep.watched() == 0


def test_time_waiting_for_a_free_worker_is_not_counted_as_silence():
    clock, queue = Clock(), []
    keep = make(clock, queue)
    conn = FakeConnection()
    keep.watch(conn, start=False)
    keep.check(102.0)                                       # queued, no worker free for a minute
    assert keep.check(162.0) == [] and conn.active
    clock.now = 162.0
    queue.pop()()
    assert keep.check(163.0) == [] and conn.active


def test_a_connection_closed_elsewhere_leaves_the_watch():
    clock, queue = Clock(), []
    keep = make(clock, queue)
    conns = [FakeConnection(), FakeConnection()]
    for conn in conns:
        keep.watch(conn, start=False)
    conns[0].active = False
    keep.check(102.0)
    assert keep.watched() == 1 and len(queue) == 1


def test_a_connection_that_brings_data_is_asked_nothing_until_it_falls_silent():
    """A host's watch stream speaks every second (keepalive.heard): its connection answered, so
    no request goes out while it does; once it falls silent, the requests (and the dead check)
    start again from the last data."""
    from cluster.transport.keepalive import heard
    clock, queue = Clock(), []
    keep = make(clock, queue)
    conn = FakeConnection(answers=False)
    keep.watch(conn, start=False)
    for now in (101.0, 102.0, 103.0, 104.0, 105.0):
        heard(conn, now - 0.5)              # a chunk half a second ago
        keep.check(now)
    assert queue == [] and conn.requests == 0
    keep.check(106.4)                       # silent since 104.5: not yet due
    assert queue == []
    keep.check(106.5)                       # 2 s of silence: asked
    assert len(queue) == 1
    threading.Thread(target=queue.pop(), daemon=True).start()   # a dead host: no answer
    for _ in range(200):                    # until the request is out (its time starts then)
        if conn.requests:
            break
        threading.Event().wait(0.01)
    clock.now = 117.0
    assert keep.check(117.0) and not conn.active    # unanswered for over 10 s: closed
