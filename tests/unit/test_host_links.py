"""cluster/supervision/links.py: a host's watch stream, lost and found again (issue 41).

A 5 s link cut on the lab took 10-68 s to be seen healed: the stream reopened after the loss was
judged by the silence of the old one and closed before its first line, again and again. These
tests drive a HostLink with a fake stream and clock."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from cluster.supervision import links


class Line(str):
    """A watch line as the fake parser gives it: the text; a notice when it says ``notice SIGNAL``."""
    pid = None

    @property
    def notice(self):
        return {"signal": self.split()[1]} if self.startswith("notice ") else None


class FakeStream:
    def __init__(self):
        self.pending: list[str] = []
        self.closed = False
        self.closed_here = False
        self.error = None

    def lines(self):
        out, self.pending = self.pending, []
        return out

    def close(self):
        self.closed_here = True
        self.closed = True


class FakeTransport:
    def __init__(self):
        self.resets = 0
        self.gone = None          # what ended() says: None, or the error of a host gone for good
        self.fail_next = None     # an exception the next watch raises

    def reset(self):
        self.resets += 1

    def ended(self):
        return self.gone


@pytest.fixture
def link(monkeypatch):
    clock = SimpleNamespace(now=100.0)
    transport = FakeTransport()
    opened: list[FakeStream] = []

    def watch(_transport, _records, _files, interval):
        if transport.fail_next is not None:
            error, transport.fail_next = transport.fail_next, None
            raise error
        stream = FakeStream()
        opened.append(stream)
        return stream
    monkeypatch.setattr(links.hostops, "watch", watch)
    monkeypatch.setattr(links.hostops, "parse_watch_line", Line)
    pool = SimpleNamespace(get=lambda host: transport)
    host_link = links.HostLink(SimpleNamespace(name="h3"), pool, clock=lambda: clock.now)
    host_link.set_targets([], [])
    _wait(lambda: host_link.stream is not None)
    yield host_link, clock, transport, opened
    host_link.close()


def _wait(condition, timeout=5.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end
        time.sleep(0.01)


def test_a_reopened_stream_gets_its_own_grace_and_the_loss_ends_with_its_first_line(link):
    host_link, clock, transport, opened = link
    opened[0].pending.append("beat")
    assert host_link.poll(clock.now) == ["beat"] and host_link.lost_since is None
    clock.now += links.LOST_AFTER + 1          # the link is cut: silence
    assert host_link.poll(clock.now) == [] and host_link.lost_since == 100.0
    _wait(lambda: host_link.stream is not None and host_link.stream is not opened[0])
    assert transport.resets == 1               # the new stream on a new connection
    assert opened[0].closed
    # The new stream has not spoken yet: polled again and again, it is kept (it was closed here
    # before its first line, judged from the old stream's last line).
    for _ in range(5):
        clock.now += 0.5
        host_link.poll(clock.now)
    assert len(opened) == 2 and not opened[1].closed
    opened[1].pending.append("beat")
    assert host_link.poll(clock.now) == ["beat"]
    assert host_link.lost_since is None and host_link.error is None


def test_a_reopened_stream_that_stays_silent_is_given_up_and_opened_again(link):
    host_link, clock, transport, opened = link
    clock.now += links.LOST_AFTER + 1
    host_link.poll(clock.now)
    _wait(lambda: len(opened) == 2 and host_link.stream is opened[1])
    clock.now += links.LOST_AFTER + 1
    host_link.poll(clock.now)
    assert opened[1].closed
    _wait(lambda: len(opened) == 3)
    assert transport.resets == 1               # one reset per loss


def test_a_notice_counts_only_from_a_stream_the_link_did_not_close_and_its_end_is_no_loss(link):
    host_link, clock, transport, opened = link
    opened[0].closed_here = True                # closed by us (a close SIGTERMs the watch): not a notice
    opened[0].pending.append("notice SIGTERM")
    host_link.poll(clock.now)
    assert host_link.take_notice() is None
    opened[0].closed_here = False               # SIGTERM from elsewhere: the host's own shutdown
    opened[0].pending.append("notice SIGTERM")
    opened[0].closed = True                     # ... and the watch ended after its line
    assert host_link.poll(clock.now) == ["notice SIGTERM"]
    assert host_link.take_notice() == {"signal": "SIGTERM"} and host_link.take_notice() is None
    assert host_link.lost_since is None and transport.resets == 0      # not lost: reopened as is
    _wait(lambda: len(opened) == 2 and host_link.stream is opened[1])
    clock.now += links.LOST_AFTER + 1           # the new stream stays silent: now the host is lost
    host_link.poll(clock.now)
    assert host_link.lost_since is not None


def test_a_host_gone_for_good_is_not_reopened_and_the_link_says_why(link):
    """A Slurm job that ended (transport.ended()): its hosts will not answer again, and their
    tasks are gone with it; the link stops reopening and keeps the reason for the supervisor."""
    from cluster.errors import HostEndedError
    host_link, clock, transport, opened = link
    opened[0].pending.append("beat")
    host_link.poll(clock.now)
    opened[0].closed = True                     # lost: Slurm does not know yet (SlurmdTimeout)
    clock.now += 1
    host_link.poll(clock.now)
    _wait(lambda: len(opened) == 2)
    assert host_link.ended is None
    transport.gone = HostEndedError("h3", "Slurm job 7 has ended (NODE_FAIL, reason NodeDown): Slurm ends its steps",
                                    whole_job=True)
    opened[1].closed = True                     # srun ended with its job
    clock.now += 1
    host_link.poll(clock.now)
    _wait(lambda: host_link.ended is not None)
    assert host_link.lost_since is not None and "NODE_FAIL" in host_link.error
    time.sleep(links.REOPEN_DELAY / 4)
    assert len(opened) == 2 and host_link.stream is None        # no watch opened again


def test_an_unexpected_error_while_reopening_does_not_end_the_reopening(link, monkeypatch):
    """An error that is not pscluster's (a broken pipe to srun) is named and the link tries again:
    before, it ended the reopening thread and the host stayed lost until its timeout."""
    host_link, clock, transport, opened = link
    monkeypatch.setattr(links, "REOPEN_DELAY", 0.05)
    transport.fail_next = BrokenPipeError(32, "Broken pipe")
    opened[0].closed = True
    clock.now += 1
    host_link.poll(clock.now)
    _wait(lambda: len(opened) == 2)
    assert "BrokenPipeError" in host_link.error and host_link.ended is None
    opened[1].pending.append("beat")
    clock.now += 1
    assert host_link.poll(clock.now) == ["beat"] and host_link.lost_since is None and host_link.error is None
