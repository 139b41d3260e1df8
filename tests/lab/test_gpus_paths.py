"""Lab tests of how tasks run on a host: as another user (ansible_become, through sudo -n -H -u)."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace

import pytest

from cluster.hosts import hostops
from cluster.lifecycle.tasks import new_record
from cluster.plan import TaskSpec
from cluster.transport.ssh import SSHTransport
from tests.lab.test_reach import _spec

pytestmark = [pytest.mark.lab]

USER = "psc-become-test"


@pytest.fixture
def task_user():
    if shutil.which("sudo") is None or shutil.which("useradd") is None:
        pytest.skip("sudo and useradd are needed")
    try:        # left by a run that was killed before its clean-up (the name is this test's own)
        pwd.getpwnam(USER)
        subprocess.run(["userdel", "--remove", USER], check=True, capture_output=True)
    except KeyError:
        pass
    created = subprocess.run(["useradd", "--create-home", USER], capture_output=True, text=True)
    assert created.returncode == 0, created.stderr
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", "--remove", USER], capture_output=True)


def test_a_task_runs_as_the_become_user_and_stop_ends_it(lab3, task_user):
    # The test virtualenv's interpreter lives under /root (0700): the task user runs the system one.
    workdir = tempfile.mkdtemp(prefix="psc-become-")
    os.chown(workdir, task_user.pw_uid, task_user.pw_gid)
    host = replace(_spec(lab3, "node-2"), python="/usr/bin/python3", workdir=workdir, become_user=USER)
    transport = SSHTransport(host)
    task = TaskSpec(role="worker", index=0, host="node-2", address=host.address, port=1, cuda_visible_devices=None,
                    standing=True, env=(), argv=("sleep", "300"), workdir=workdir,
                    log_path=f"{workdir}/.pscluster/become/worker-0.log",
                    events_path=f"{workdir}/.pscluster/become/worker-0.events.jsonl")
    try:
        root, _ = hostops.fsid(transport, "~/pscluster-become")      # ~ is the task user's home
        assert root == os.path.join(task_user.pw_dir, "pscluster-become")
        started = hostops.start(transport, task, new_record(task, kind="server", attempt=1), argv=task.argv, env={})
        assert os.stat(f"/proc/{started.pid}").st_uid == task_user.pw_uid
        assert os.stat(started.log).st_uid == task_user.pw_uid
        result = hostops.stop(transport, [started], grace=2.0)[started.key]
        assert result.found and not result.survivors
        time.sleep(0.2)
        assert not os.path.exists(f"/proc/{started.pid}") or "Z" in open(f"/proc/{started.pid}/stat").read().split()[2]
    finally:
        transport.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _hostctl_watchers() -> dict[int, int]:
    """pid -> uid of every hostctl watch process (the lab's hosts share this PID space)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            with open(f"/proc/{entry}/status") as handle:
                uid = next(int(line.split()[1]) for line in handle if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        # /usr/bin/python3: this test's interpreter (other lab clusters run the virtualenv's)
        if argv[0] == b"/usr/bin/python3" and b"-S" in argv and argv[-2:] == [b"watch", b""]:
            found[int(entry)] = uid
    return found


def test_the_watch_stream_runs_as_the_become_user(lab3, task_user):
    """N14 (issue 25): the supervisor's watch stream ran as the SSH user, not through
    `sudo -n -H -u`, so it could not read the become user's 0700 run folders."""
    workdir = tempfile.mkdtemp(prefix="psc-become-")
    os.chown(workdir, task_user.pw_uid, task_user.pw_gid)
    host = replace(_spec(lab3, "node-2"), python="/usr/bin/python3", workdir=workdir, become_user=USER)
    transport = SSHTransport(host)
    task = TaskSpec(role="worker", index=0, host="node-2", address=host.address, port=1, cuda_visible_devices=None,
                    standing=True, env=(), argv=("sh", "-c", "echo hello; sleep 300"), workdir=workdir,
                    log_path=f"{workdir}/.pscluster/become/worker-0.log",
                    events_path=f"{workdir}/.pscluster/become/worker-0.events.jsonl")
    stream = started = None
    try:
        started = hostops.start(transport, task, new_record(task, kind="server", attempt=1), argv=task.argv, env={})
        stream = hostops.watch(transport, [started], [(started.log, 0)])
        data = ""
        deadline = time.monotonic() + 30
        while "hello" not in data and time.monotonic() < deadline and not stream.closed:
            for line in stream.lines():
                update = hostops.parse_watch_line(line)
                data += "".join(read.data for read in update.reads) if update else ""
            time.sleep(0.1)
        watchers = _hostctl_watchers()
        assert "hello" in data, (data, stream.error)     # it read the task's log in the 0700 run folder
        assert watchers and set(watchers.values()) == {task_user.pw_uid}, watchers
    finally:
        if stream is not None:
            stream.close()
        if started is not None:
            hostops.stop(transport, [started], grace=2.0)      # before the fixture removes the user
        transport.close()
        shutil.rmtree(workdir, ignore_errors=True)
