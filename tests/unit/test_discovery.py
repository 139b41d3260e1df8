"""``train --hosts-from``'s command runs in the background (cluster.supervision.elastic.Discovery):
real processes, a clock the test moves. The supervisor's loop polls it once per turn and never
waits on it; a command past its timeout, or still running when the job ends, is stopped with
everything it started."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from cluster.events import RecordingReporter
from cluster.supervision.elastic import Discovery


def warnings(reporter: RecordingReporter) -> list[str]:
    return [e.data["text"] for e in reporter.of("message") if e.data.get("level") == "warning"]


def until_ended(discovery: Discovery, reporter: RecordingReporter, now: float) -> dict | None:
    """Poll (the clock held at ``now``, so nothing restarts) until the command has ended and been read."""
    deadline = time.monotonic() + 30
    while discovery.proc is not None:
        assert time.monotonic() < deadline, "the discovery command did not end"
        found = discovery.poll(now, reporter)
        if found is not None:
            return found
        time.sleep(0.02)
    return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:     # gone, or gone between the open and the read (ESRCH)
        return False


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_the_first_poll_starts_the_command_and_a_later_one_gives_its_host_list(tmp_path):
    reporter = RecordingReporter()
    discovery = Discovery(script(tmp_path, "echo node-1\necho 'node-2:2  # two'\n"), every=10)
    assert discovery.poll(0.0, reporter) is None            # started, not waited on
    assert discovery.proc is not None
    assert until_ended(discovery, reporter, 0.0) == {"node-1": None, "node-2": 2}
    assert not warnings(reporter)


def test_it_runs_again_only_once_every_seconds_have_passed(tmp_path):
    reporter = RecordingReporter()
    count = tmp_path / "runs"
    discovery = Discovery(script(tmp_path, f"echo run >> {count}\necho node-1\n"), every=10)
    discovery.poll(0.0, reporter)
    until_ended(discovery, reporter, 0.0)
    assert discovery.poll(9.9, reporter) is None and discovery.proc is None      # not due
    discovery.poll(10.0, reporter)
    assert until_ended(discovery, reporter, 10.0) == {"node-1": None}
    assert count.read_text().count("run") == 2


def test_a_slow_command_does_not_hold_the_loop_and_is_stopped_with_its_children_after_the_timeout(tmp_path):
    reporter = RecordingReporter()
    child = tmp_path / "child.pid"
    # A script whose child keeps running (and holds its output) after the script is killed.
    discovery = Discovery(script(tmp_path, f"sleep 300 &\necho $! > {child}\nwait\n"), every=10, timeout=5)
    discovery.poll(0.0, reporter)
    deadline = time.monotonic() + 30
    while not child.exists() or not child.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sleeper = int(child.read_text())
    assert discovery.poll(4.0, reporter) is None and discovery.proc is not None      # still running: not waited on
    assert alive(sleeper)
    assert discovery.poll(5.5, reporter) is None
    assert discovery.proc is None
    # SIGKILL to the group is delivered asynchronously: wait for the child's death (a CI run saw it alive)
    deadline = time.monotonic() + 10
    while alive(sleeper):
        assert time.monotonic() < deadline, "the script's child outlived the stop"
        time.sleep(0.01)
    assert warnings(reporter) == ["--hosts-from: still running after 5 s: stopped, with what it started; "
                                  "membership unchanged"]


def test_one_turn_reads_at_most_the_limit_of_a_flooded_stderr(tmp_path):
    """A pipe that a command fills as fast as it is read would keep a turn reading; a file the
    size of a flood stands for it, deterministically: one read takes at most the limit of it."""
    from types import SimpleNamespace
    (tmp_path / "out").write_bytes(b"")
    (tmp_path / "err").write_bytes(b"x" * (8 << 20))
    discovery = Discovery("unused", every=10, limit=1 << 20)
    with open(tmp_path / "out", "rb") as out, open(tmp_path / "err", "rb") as err:
        discovery.proc = SimpleNamespace(stdout=out, stderr=err)      # type: ignore[assignment]
        assert discovery._read()
        assert err.tell() <= (1 << 20) + (1 << 16) and len(discovery.err) == 4096
    discovery.proc = None


def test_close_stops_a_command_still_running_when_the_job_ends(tmp_path):
    reporter = RecordingReporter()
    discovery = Discovery(f"{sys.executable} -c 'import time; time.sleep(300)'", every=10)
    discovery.poll(0.0, reporter)
    pid = discovery.proc.pid
    discovery.close()
    assert discovery.proc is None and not alive(pid)
    discovery.close()       # twice: nothing to do


@pytest.mark.parametrize("body, said", [
    ("echo 'no such host here' >&2\nexit 3\n", "--hosts-from exited with 3: 'no such host here'"),
    ("printf 'node-1\\n\\377\\n'\n", "--hosts-from printed bytes that are not UTF-8"),
    ("echo 'node 1'\n", "--hosts-from, line 1: expected 'host' or 'host:workers'"),
    ("echo node-1:x\n", "--hosts-from, line 1: expected 'host' or 'host:workers'"),
    ("head -c 1100000 /dev/zero | tr '\\0' 'a'\n", "--hosts-from printed more than 1 MiB: stopped"),
    ("yes node-1\n", "--hosts-from printed more than 1 MiB: stopped"),        # never ends by itself
])
def test_a_command_that_fails_or_prints_nonsense_changes_nothing_and_says_why(tmp_path, body, said):
    reporter = RecordingReporter()
    discovery = Discovery(script(tmp_path, body), every=10)
    discovery.poll(0.0, reporter)
    assert until_ended(discovery, reporter, 0.0) is None
    assert len(warnings(reporter)) == 1 and warnings(reporter)[0].startswith(said), warnings(reporter)
    assert warnings(reporter)[0].endswith("membership unchanged")


@pytest.mark.parametrize("command, said", [
    ("/nonexistent/discover", "--hosts-from: [Errno 2]"),
    ("discover 'unclosed", "--hosts-from: No closing quotation"),
    ("  ", "--hosts-from: the command is empty"),
])
def test_a_command_that_cannot_start_is_a_warning_and_is_tried_again_when_due(command, said):
    reporter = RecordingReporter()
    discovery = Discovery(command, every=10)
    assert discovery.poll(0.0, reporter) is None and discovery.proc is None
    assert discovery.poll(10.0, reporter) is None
    assert [w[:len(said)] for w in warnings(reporter)] == [said, said]


def test_no_file_is_left_open(tmp_path):
    reporter = RecordingReporter()
    before = len(os.listdir("/proc/self/fd"))
    discovery = Discovery(script(tmp_path, "echo node-1\n"), every=1)
    for now in (0.0, 1.0, 2.0):
        discovery.poll(now, reporter)
        until_ended(discovery, reporter, now)
    discovery.poll(3.0, reporter)
    discovery.close()
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("value, shown", [
    ("", "Invalid value for '--hosts-from': the command is empty"),
    ("   ", "Invalid value for '--hosts-from': the command is empty"),
    ("discover 'unclosed", "Invalid value for '--hosts-from': cannot split the command: No closing quotation"),
])
def test_a_hosts_from_that_cannot_run_is_refused_before_anything_starts(tmp_path, capsys, value, shown):
    import io

    from rich.console import Console

    from cluster.cli import Env, run
    from cluster.state import StateStore
    err = io.StringIO()
    env = Env(out=Console(file=io.StringIO()), err=Console(file=err, width=500), store=StateStore(tmp_path))
    assert run(["train", "distributed_mnist", "--hosts-from", value], env=env) == 2
    assert shown in " ".join((capsys.readouterr().err + err.getvalue()).split())
    assert not list(tmp_path.iterdir())         # no cluster state written


def test_a_command_that_exited_0_leaves_no_background_child(tmp_path):
    """Issue 42, L8: `sh -c 'sleep 123 & echo h1'` exited 0 and left its `sleep`, one per poll."""
    reporter = RecordingReporter()
    discovery = Discovery(script(tmp_path, "sleep 123 &\necho $! > " + str(tmp_path / "child") + "\necho h1\n"),
                          every=10)
    discovery.poll(0.0, reporter)
    assert discovery.proc is not None
    group = discovery.proc.pid
    try:
        assert until_ended(discovery, reporter, 0.0) == {"h1": None}
        child = int((tmp_path / "child").read_text())
        deadline = time.monotonic() + 10           # SIGKILL lands asynchronously
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child)
    finally:
        try:
            os.killpg(group, 9)                    # without the fix: the sleep this test started
        except ProcessLookupError:
            pass
