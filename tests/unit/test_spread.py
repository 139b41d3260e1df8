"""Connections held by helper processes (cluster/transport/spread.py, issue 46): real helpers
serving a local host (its LocalTransport lives in the helper), the pool's choice, errors that
cross whole, a helper that dies or is sent Ctrl-C. Over SSH: tests/lab/test_manylab.py."""
from __future__ import annotations

import os
import pickle
import signal
import sys
import time

import pytest

from cluster.errors import HostEndedError, HostError, InventoryError, UnreachableHostError, UsageError
from cluster.plan import HostSpec
from cluster.transport import LocalTransport, TransportPool
from cluster.transport.base import Stream
from cluster.transport.spread import ENV, SPREAD_MIN_HOSTS, Helper, SpreadTransport, helpers_for


def host(name: str, workdir, connection: str = "local") -> HostSpec:
    return HostSpec(name=name, address="127.0.0.1", connection=connection, ssh_port=None, user=None,
                    key_file=None, python=sys.executable, workdir=str(workdir), host_key_policy="accept-new",
                    known_hosts=None, connect_timeout=10.0)


@pytest.fixture
def helper():
    one = Helper(0)
    yield one
    one.close()


def _until_closed(stream: Stream, limit: float = 20.0) -> list[str]:
    lines, deadline = [], time.monotonic() + limit
    while not stream.closed:
        assert time.monotonic() < deadline, f"the stream did not end: {lines}"
        lines += stream.lines()
        stream.wait(1.0, poll=0.01)         # a relayed stream wakes this when a line or its end comes
    return lines + stream.lines()


def test_how_many_helpers():
    assert helpers_for(SPREAD_MIN_HOSTS - 1, setting="", cores=16) == 0
    assert helpers_for(SPREAD_MIN_HOSTS, setting="", cores=16) == 2
    assert helpers_for(1000, setting="", cores=16) == 8
    assert helpers_for(1000, setting="", cores=2) == 1        # the cores less this process's own
    assert helpers_for(1000, setting="", cores=1) == 1
    assert helpers_for(1000, setting="0", cores=16) == 0
    assert helpers_for(3, setting="4", cores=16) == 3         # no helper without a host
    for bad in ("two", "-1", "65", "1.5"):
        with pytest.raises(UsageError, match=ENV):
            helpers_for(500, setting=bad)


@pytest.mark.parametrize("error", [
    HostError("node-a", "start failed", argv=["python", "-m", "x"], exit_code=3, stderr="Traceback\nboom",
              hint="see its log"),
    UnreachableHostError("node-b", "cannot reach 127.0.0.2: refused"),
    HostEndedError("node-c", "the Slurm job ended", whole_job=True),
    InventoryError("lab.yaml", 4, "ps.hosts", "expected a mapping", hint="indent it"),
])
def test_errors_cross_a_process_whole(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error) and copy.__dict__ == error.__dict__


def test_commands_streams_and_copies_run_in_the_helper(helper, tmp_path):
    transport = SpreadTransport(host("localhost", tmp_path), helper)
    transport.connect()
    result = transport.run(["sh", "-c", "echo out; echo err >&2; echo $PPID; exit 3"], stdin=b"ignored")
    assert (result.host, result.exit_code, result.stderr) == ("localhost", 3, "err\n")
    out, parent = result.stdout.splitlines()
    assert out == "out" and int(parent) == helper.process.pid      # run by the helper, not here
    assert transport.run(["cat"], stdin=b"fed\n").stdout == "fed\n"
    with pytest.raises(HostError, match="timed out") as timed_out:
        transport.run(["sleep", "5"], timeout=0.5)
    assert timed_out.value.host == "localhost"

    stream = transport.stream(["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.05; done; printf tail"])
    assert _until_closed(stream) == ["line1", "line2", "line3"]      # an unended last line is no line
    assert stream.error is None and not stream.closed_here

    source = tmp_path / "tool.sh"
    source.write_text("#!/bin/sh\n")
    source.chmod(0o755)
    transport.put_files([(str(source), f"{tmp_path}/sub/tool.sh")], root=str(tmp_path))
    copied = tmp_path / "sub" / "tool.sh"
    assert copied.read_text() == "#!/bin/sh\n" and copied.stat().st_mode & 0o777 == 0o755
    with pytest.raises(HostError, match="not below the workdir") as outside:     # the helper's refusal, whole
        transport.put_files([(str(source), f"{tmp_path}/../elsewhere.sh")], root=str(tmp_path))
    assert outside.value.hint and "never written" in outside.value.hint
    assert not (tmp_path.parent / "elsewhere.sh").exists()
    assert transport.describe() is None and transport.ended() is None
    assert transport.tunnel("127.0.0.1", 2222) is None and transport._direct      # asked once, then known
    transport.reset()
    transport.close()
    assert transport.run(["true"]).ok          # closed transports reconnect, as every transport does


def test_closing_a_stream_ends_its_command(helper, tmp_path):
    transport = SpreadTransport(host("localhost", tmp_path), helper)
    stream = transport.stream(["sh", "-c", "echo $$; exec sleep 60"])
    deadline = time.monotonic() + 20
    lines: list[str] = []
    while not lines:
        assert time.monotonic() < deadline
        lines = stream.lines()
        stream.wait(1.0, poll=0.01)
    pid = int(lines[0])
    stream.close()
    assert stream.closed and stream.closed_here
    assert not os.path.exists(f"/proc/{pid}"), "the streamed command outlived its stream's close"


def test_a_dead_helper_fails_its_calls_at_once_and_says_so(tmp_path):
    helper = Helper(3)
    try:
        transport = SpreadTransport(host("localhost", tmp_path), helper)
        stream = transport.stream(["sh", "-c", "echo $$; exec sleep 60"])
        deadline = time.monotonic() + 20
        while not (lines := stream.lines()):
            assert time.monotonic() < deadline
            stream.wait(1.0, poll=0.01)
        sleeper = int(lines[0])
        helper.process.kill()
        _until_closed(stream)
        os.kill(sleeper, signal.SIGKILL)     # the local host's command was the helper's child
        assert stream.error and "helper process ended" in stream.error
        with pytest.raises(HostError, match="helper process 3 holding this host's connection is gone") as gone:
            transport.run(["true"])
        assert "exit code -9" in str(gone.value) and ENV in (gone.value.hint or "")
        transport.close()        # nothing to close: no error either
    finally:
        helper.close()


def test_a_helper_ignores_ctrl_c_and_termination_and_ends_with_its_stdin(helper, tmp_path):
    """A signal to the process group must leave the helper to the control process, which stops
    what it started through the helper's connections first (cli/base.py)."""
    transport = SpreadTransport(host("localhost", tmp_path), helper)
    assert transport.run(["true"]).ok         # it has started and set its handlers
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        os.kill(helper.process.pid, sig)
        assert transport.run(["echo", "still here"]).stdout == "still here\n"
    helper.close()
    assert helper.process.returncode == 0


def test_the_pool_spreads_only_many_ssh_hosts_that_have_no_transport_yet(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    ssh = [host(f"node-{i}", tmp_path, "ssh") for i in range(4)]
    local = host("localhost", tmp_path)
    with TransportPool() as pool:
        assert pool.spread([*ssh, local]) == 0           # few hosts: every connection here
        assert type(pool.get(ssh[0])).__name__ == "SSHTransport"
        assert pool.spread(ssh, helpers=2) == 2
        assert type(pool.get(ssh[0])).__name__ == "SSHTransport"   # it had its transport already
        moved = [pool.get(one) for one in ssh[1:]]
        assert all(isinstance(one, SpreadTransport) for one in moved)
        assert {one.helper.index for one in moved} == {0, 1}            # shared out in turn
        assert isinstance(pool.get(local), LocalTransport)
        helpers = [one.helper.process for one in moved]
    assert all(process.poll() is not None for process in helpers), "a helper outlived its pool"
    monkeypatch.setenv(ENV, "2")
    with TransportPool(factory=LocalTransport) as pool:      # a pool of a test's own transports: never spread
        assert pool.spread(ssh) == 0


def test_wait_lines_waits_for_a_pulled_stream_and_sees_its_end():
    chunks = [b"one\ntw", b"o\n", b"", b"never"]
    stream = Stream(lambda: chunks.pop(0), lambda: None, ready=lambda: True)
    assert stream.wait_lines() == ["one"]
    assert stream.wait_lines() == ["two"]
    assert stream.wait_lines() == [] and stream.closed and stream.error is None
    assert chunks == [b"never"]      # nothing read after the end


def test_a_relayed_stream_is_waited_on_not_polled(helper, tmp_path):
    """The relay's many threads wait for a first line (cluster/hosts/relay.py ``_first_line``):
    a relayed stream wakes its waiter when a line comes, well before the wait's limit."""
    transport = SpreadTransport(host("localhost", tmp_path), helper)
    stream = transport.stream(["sh", "-c", "read go; echo $go"], stdin=b"now\n")
    began = time.monotonic()
    lines: list[str] = []
    while not lines:
        stream.wait(60.0, poll=60.0)
        lines = stream.lines()
        assert time.monotonic() - began < 50, "the wait ran to its limit: no line woke it"
    assert lines == ["now"]
    while not stream.closed:         # its end wakes it too
        stream.wait(60.0, poll=60.0)
        assert stream.lines() == []
        assert time.monotonic() - began < 50, "the wait ran to its limit: the end did not wake it"


def test_a_call_for_a_host_the_helper_never_heard_of_is_answered_with_an_error(helper, tmp_path):
    """Every request gets an answer, whatever goes wrong in the helper: the caller waits for it."""
    from cluster.errors import PsclusterError
    helper._hosts.add("ghost")          # as if its description had been lost on the way
    with pytest.raises(PsclusterError, match="no host 'ghost' here"):
        SpreadTransport(host("ghost", tmp_path), helper).run(["true"])
    assert SpreadTransport(host("localhost", tmp_path), helper).run(["true"]).ok    # the helper goes on
