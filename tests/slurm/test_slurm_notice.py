"""Slurm's ``--signal`` to one node's watch step becomes a drain of that node (issue 44, item 2),
on a real Slurm.

In an allocation each node's ``hostctl watch`` runs as a job step (cluster/transport/slurm.py).
``scancel --signal=USR1 JOB.STEP`` to that step reaches the watch, which says so in a notice line
and goes on streaming (the first test, no TensorFlow: the watch opened as the supervisor opens
it); the supervisor turns that line into a drain of the node (the second: a real job).
"""
from __future__ import annotations

import json
import re
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


@pytest.mark.tf
@pytest.mark.slow
def test_usr1_to_a_workers_node_watch_step_drains_that_node_and_the_job_goes_on(slurm_lab, tmp_path):
    """The whole road on Slurm: an async job on two nodes (the chief and the only ps on the
    first, a worker on each); ``scancel --signal=USR1`` to the second node's watch step (found
    from the watch pid the job record keeps, through its cgroup: the lab tracks steps by cgroup)
    drains that node in place; the job trains on with the first node's worker."""
    from tests.slurm.test_slurm import _cli, _up_and_train, _wait_gone
    job = slurm_lab.salloc("-N2", "--ntasks-per-node=1")
    name, state_dir, inventory = "slurm-notice", tmp_path / "state", tmp_path / "slurm.yaml"
    node2 = slurm_lab.expand(job["SLURM_JOB_NODELIST"])[1]
    train = None
    try:
        train = _up_and_train(slurm_lab, job, name, state_dir, inventory, tmp_path / "train.err")

        def state_when(ok, what: str, seconds: float = 300) -> dict:
            end = time.monotonic() + seconds
            while True:
                assert train.poll() is None, (tmp_path / "train.err").read_text()[-3000:]
                try:
                    state = json.loads((state_dir / f"{name}.json").read_text())
                except (FileNotFoundError, ValueError):
                    state = {}
                if ok(state):
                    return state
                assert time.monotonic() < end, f"never {what}: {state.get('job')}"
                time.sleep(0.5)
        state = state_when(lambda s: ((s.get("job") or {}).get("step") or 0) >= 50
                           and node2 in (s["job"].get("watch_pids") or {}), "trained, node2's watch heard")
        # The watch pid the record keeps is its current stream's; a stream the supervisor replaces
        # (it points the streams at new processes) ends its step, and a notice to a stream it
        # closed is ignored: so the signal goes again, to the current step, until node2 drains.
        for _ in range(10):
            pid = state_when(lambda s: node2 in ((s.get("job") or {}).get("watch_pids") or {}),
                             "node2's watch heard")["job"]["watch_pids"][node2]
            try:
                with open(f"/proc/{pid}/cgroup") as handle:
                    where = next(line for line in handle if "freezer" in line)
            except FileNotFoundError:
                continue
            step = re.search(r"/job_(\d+)/step_(\d+)", where)
            assert step and step.group(1) == job["SLURM_JOB_ID"], where
            subprocess.run(["scancel", "--signal=USR1", f"{step.group(1)}.{step.group(2)}"], env=slurm_lab.env,
                           capture_output=True, timeout=30)
            try:
                state = state_when(lambda s: s.get("drained") == {node2: "drained"}
                                   and (s.get("job") or {}).get("workers") == 1, f"{node2} drained", seconds=30)
                break
            except AssertionError as exc:
                if "never" not in str(exc):
                    raise
        else:
            pytest.fail(f"{node2} never drained: {(tmp_path / 'train.err').read_text()[-3000:]}")
        assert state["job"]["state"] == "running" and not state["job"].get("restarts"), state["job"]
        text = (tmp_path / "train.err").read_text()
        assert f"notice for {node2} ({node2}'s watch got SIGUSR1" in text, text[-3000:]
    finally:
        if train is not None and train.poll() is None:
            train.terminate()
            train.wait(timeout=120)
        _cli(slurm_lab, job, ["down", "--name", name, "--now"], state_dir)
        subprocess.run(["scancel", job["SLURM_JOB_ID"]], env=slurm_lab.env, capture_output=True)
    assert _wait_gone(slurm_lab, name) == ([], [])
