"""A pulled :class:`~cluster.transport.base.Stream` (an SSH watch stream, issue 46): no reader
thread; ``lines()`` reads what has come, in the caller's thread. The same stream over a real
sshd: tests/lab/test_sshd_limits.py."""
from __future__ import annotations

import threading

from cluster.transport.base import Stream


class Chunks:
    """A channel stand-in: chunks that have "come", then an end (b"") or an error."""

    def __init__(self) -> None:
        self.waiting: list[bytes] = []
        self.ended = False
        self.broken: Exception | None = None
        self.reads = 0
        self.closed = 0

    def ready(self) -> bool:
        return bool(self.waiting) or self.ended or self.broken is not None

    def read(self) -> bytes:
        self.reads += 1
        if self.broken is not None:
            raise self.broken
        if self.waiting:
            return self.waiting.pop(0)
        assert self.ended, "read() when ready() said it would wait"
        return b""

    def close(self) -> None:
        self.closed += 1


def test_a_pulled_stream_starts_no_thread_and_reads_only_what_has_come():
    chunks = Chunks()
    before = threading.active_count()
    stream = Stream(chunks.read, chunks.close, ready=chunks.ready)
    assert threading.active_count() == before
    assert stream.lines() == [] and chunks.reads == 0 and not stream.closed
    chunks.waiting += [b'{"a": 1}\n{"b"', b': 2}\npart']
    assert stream.lines() == ['{"a": 1}', '{"b": 2}']      # a line split over two chunks is whole
    assert stream.lines() == [] and not stream.closed
    chunks.waiting.append(b"ial\n")
    assert stream.lines() == ["partial"]


def test_its_end_closes_it_after_the_last_lines_and_it_is_read_no_more():
    chunks = Chunks()
    stream = Stream(chunks.read, chunks.close, ready=chunks.ready)
    chunks.waiting.append(b"last\n")
    chunks.ended = True
    assert stream.lines() == ["last"] and stream.closed and stream.error is None
    reads = chunks.reads
    assert stream.lines() == [] and chunks.reads == reads


def test_a_broken_connection_closes_it_and_says_why():
    chunks = Chunks()
    stream = Stream(chunks.read, chunks.close, ready=chunks.ready)
    chunks.waiting.append(b"one\n")
    assert stream.lines() == ["one"]
    chunks.broken = EOFError("the connection closed")
    assert stream.lines() == [] and stream.closed
    assert stream.error == "EOFError: the connection closed"


def test_close_here_is_said_and_closes_the_channel_once_asked():
    chunks = Chunks()
    stream = Stream(chunks.read, chunks.close, ready=chunks.ready)
    stream.close()
    assert stream.closed and stream.closed_here and chunks.closed == 1
    chunks.waiting.append(b"after\n")
    assert stream.lines() == []          # nothing is read from a stream closed here


def test_a_pushed_stream_still_has_its_reader_thread():
    done = threading.Event()
    sent = [b"x\ny\n"]

    def read() -> bytes:
        if sent:
            return sent.pop()
        done.set()
        return b""
    stream = Stream(read, lambda: None)
    assert done.wait(10)
    stream._thread.join(10)           # the thread ends with its command's output
    assert stream.closed and stream.lines() == ["x", "y"]
