"""Slurm's ``--signal`` to one node's watch step becomes a notice (issue 44, item 2), on a real Slurm.

In an allocation each node's ``hostctl watch`` runs as a job step (cluster/transport/slurm.py).
``scancel --signal=USR1 JOB.STEP`` to that step reaches the watch, which says so in a notice line
and goes on streaming; the supervisor turns that line into a drain of the node
(cluster/supervision/links.py, notices.py; the drain itself: tests/local/test_notices.py).
No TensorFlow here: the watch is opened as the supervisor opens it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cluster.hosts import hostops
from cluster.plan import HostSpec
from cluster.transport import open_transport

pytestmark = [pytest.mark.lab]


def test_scancel_signal_usr1_to_a_nodes_watch_step_is_a_notice_and_the_watch_goes_on(slurm_lab, tmp_path,
                                                                                      monkeypatch):
    job = slurm_lab.salloc("-N1")
    for key, value in {**slurm_lab.env, **job}.items():
        monkeypatch.setenv(key, value)
    node = slurm_lab.expand(job["SLURM_JOB_NODELIST"])[0]
    host = HostSpec(name=node, address=node, connection="slurm", ssh_port=None, user=None, key_file=None,
                    python=sys.executable, workdir=str(tmp_path), host_key_policy="reject", known_hosts=None,
                    connect_timeout=10.0)
    stream = hostops.watch(open_transport(host), [], [], interval=0.1, heartbeat=0.2)
    seen: list[dict] = []

    def wait_for(condition, what: str, seconds: float = 60.0) -> None:
        end = time.monotonic() + seconds
        while not condition():
            assert not stream.closed or condition(), f"the watch step ended before {what}: {stream.error}"
            assert time.monotonic() < end, f"never {what}; saw {seen[-3:]}"
            seen.extend(json.loads(line) for line in stream.lines() if line.startswith("{"))
            time.sleep(0.05)
    try:
        wait_for(lambda: bool(seen), "a first line")
        steps = subprocess.run(["squeue", "-h", "-s", "-j", job["SLURM_JOB_ID"], "-o", "%i"], env=slurm_lab.env,
                               capture_output=True, text=True, timeout=30).stdout.split()
        assert len(steps) == 1, steps          # the watch is the allocation's only step
        subprocess.run(["scancel", "--signal=USR1", steps[0]], env=slurm_lab.env, check=True, timeout=30)
        wait_for(lambda: any("notice" in line for line in seen), "a notice line")
        notices = [line["notice"] for line in seen if "notice" in line]
        assert notices == [{"signal": "SIGUSR1"}]
        after = len(seen)
        wait_for(lambda: len(seen) >= after + 3, "more lines after the notice")      # it goes on
        assert not stream.closed
    finally:
        stream.close()
        subprocess.run(["scancel", job["SLURM_JOB_ID"]], env=slurm_lab.env, timeout=30)
