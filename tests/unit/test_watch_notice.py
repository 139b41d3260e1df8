"""A host's watch told to go (roles/hostctl.py ``op_watch``, cluster/supervision/links.py): real
``hostctl watch`` processes on this machine (the local transport), no TensorFlow.

SIGTERM (the host's own shutdown) and SIGUSR1 (Slurm's ``--signal``) each give one line with a
notice; after SIGTERM the watch ends, after SIGUSR1 it goes on. The link keeps a notice only from
a stream it did not close itself (the local transport closes a stream with SIGTERM), and a
stream that ends after its notice is reopened without the host counting as lost."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from cluster.hosts import hostops
from cluster.plan import HostSpec
from cluster.supervision import links
from cluster.transport import TransportPool


def local_host(tmp_path) -> HostSpec:
    return HostSpec(name="h1", address="127.0.0.1", connection="local", ssh_port=None, user=None, key_file=None,
                    python=sys.executable, workdir=str(tmp_path), host_key_policy="reject", known_hosts=None,
                    connect_timeout=5.0)


def until(condition, what: str, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < end, what
        time.sleep(0.02)


def lines_until(stream, condition, what: str) -> list[dict]:
    seen: list[dict] = []

    def more():
        seen.extend(json.loads(line) for line in stream.lines())
        return condition(seen)
    until(more, f"{what}; saw {seen[-3:]}")
    return seen


@pytest.mark.parametrize("sig, goes_on", [(signal.SIGTERM, False), (signal.SIGUSR1, True)])
def test_a_signalled_watch_says_so_once_and_ends_only_on_sigterm(tmp_path, sig, goes_on):
    with TransportPool() as pool:
        stream = hostops.watch(pool.get(local_host(tmp_path)), [], [], interval=0.1, heartbeat=0.2)
        try:
            first = lines_until(stream, lambda seen: seen, "no first line")[0]
            pid = first["pid"]
            assert "notice" not in first
            os.kill(pid, sig)
            seen = lines_until(stream, lambda seen: any("notice" in d for d in seen), "no notice line")
            notices = [d["notice"] for d in seen if "notice" in d]
            assert notices == [{"signal": sig.name}]
            update = hostops.parse_watch_line(json.dumps(next(d for d in seen if "notice" in d)))
            assert update is not None and update.notice == {"signal": sig.name} and update.pid == pid
            if goes_on:
                beats = len(seen)
                lines_until(stream, lambda more: len(more) >= 3, "the watch did not go on after SIGUSR1")
                assert not stream.closed and beats
            else:
                until(lambda: stream.closed, "the watch did not end after SIGTERM")
        finally:
            stream.close()


def test_the_link_keeps_a_notice_from_outside_never_from_a_stream_it_closed(tmp_path):
    """set_targets closes the old stream (SIGTERM, which makes that watch write a notice): the
    link never reports it. A SIGTERM from outside is reported once, and the link reopens without
    counting the host lost."""
    with TransportPool() as pool:
        link = links.HostLink(local_host(tmp_path), pool)
        try:
            link.set_targets([], [])

            def heard():
                link.poll(time.monotonic())
                return link.watch_pid
            first_pid = until(heard, "the link heard nothing")
            old = link.stream
            link.set_targets([], [])            # closes `old` with SIGTERM: its notice is not ours
            assert old is not None and old.closed_here
            # The closed stream did say it (so this test can fail), and nobody reads it.
            said = until(lambda: [line for line in old.lines() if '"notice"' in line] or old.closed,
                         "the closed stream neither spoke nor ended")
            second_pid = until(lambda: heard() != first_pid and link.watch_pid, "no new watch")
            for _ in range(10):
                link.poll(time.monotonic())
                time.sleep(0.05)
            assert said is not True, "the closed stream said nothing: its notice is what this test is about"
            assert link.take_notice() is None and link.lost_since is None
            os.kill(second_pid, signal.SIGTERM)  # the host's own shutdown
            until(lambda: link.poll(time.monotonic()) is not None and link.notice, "no notice from outside")
            assert link.take_notice() == {"signal": "SIGTERM"} and link.take_notice() is None
            until(lambda: heard() not in (None, second_pid), "the link did not reopen")
            assert link.lost_since is None and not link.reported
        finally:
            link.close()
