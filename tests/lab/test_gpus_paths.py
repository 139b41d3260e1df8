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

from cluster import hostops
from cluster.launcher import new_record
from cluster.plan import TaskSpec
from cluster.transport.ssh import SSHTransport
from tests.lab.test_reach import _spec

pytestmark = [pytest.mark.lab]

USER = "psc-become-test"


@pytest.fixture
def task_user():
    if shutil.which("sudo") is None or shutil.which("useradd") is None:
        pytest.skip("sudo and useradd are needed")
    subprocess.run(["useradd", "--create-home", USER], check=True, capture_output=True)
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
