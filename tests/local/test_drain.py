"""`pscluster drain HOST` (issue 44, items 1 and 3) on real TensorFlow processes, local cluster.

Three local "hosts" (127.0.0.2-4, ``ansible_connection: local``, a port base each): the chief and
the ps on one, a worker on each of the others. Draining the host of worker:0 (the first of the
list: a drop-out no renumbering could do in place) while the job trains: the chief trains on
with worker:1, the job finishes its step budget without a restore, the `resized` event says
"drain HOST" (also to --notify-cmd), and status shows the host drained.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base
from tests.local.test_resize import cli, state_of, wait_for_steps
from testbed.procs import cluster_pids

pytestmark = pytest.mark.tf
STEPS = 2400     # ~15 s at the MLP's pace here: the drain (at step 100) lands well before the end


def async_inventory(path, workers):
    """Local "hosts" for an async MLP job: the chief and the ps on ``main``, a worker on each of
    ``workers`` (127.0.0.2 and up, ``main`` after them), a port base each."""
    def host(name: str, number: int) -> str:
        return "%s: {ansible_host: 127.0.0.%d, pscluster_port_base: %d}" % (name, number, port_base())
    lines = ["all:", "  vars:", "    ansible_connection: local", "    pscluster_mode: async",
             "    pscluster_env: {OMP_NUM_THREADS: 1, MNIST_MODEL: mlp}", "  children:",
             "    chief: {hosts: {%s}}" % host("main", 2 + len(workers)), "    ps: {hosts: {main: {}}}",
             "    worker:", "      hosts:"]
    lines += [f"        {host(name, 2 + i)}" for i, name in enumerate(workers)]
    path.write_text("\n".join(lines) + "\n")
    return path


def notify_command(notified) -> str:
    """A --notify-cmd that appends each event document to ``notified``."""
    return shlex.join([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')",
                       str(notified)])


def test_drain_an_async_worker_host_while_training_loses_no_step(tmp_path):
    name = f"drain-{os.getpid()}"
    state_dir = tmp_path / "state"
    inventory = async_inventory(tmp_path / "three-hosts.yaml", ("w1", "w2"))
    notified = tmp_path / "notified.jsonl"
    command = notify_command(notified)
    up = cli(state_dir, "up", inventory, "--name", name)
    try:
        assert up.returncode == 0, up.stderr
        train = subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", name, "--steps", str(STEPS),
                                           "--checkpoint-dir", str(tmp_path / "ckpt"), "--json",
                                           "--notify-cmd", command]),
                                 cwd=REPO, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        try:
            wait_for_steps(state_dir, name, train, 100)
            drain = cli(state_dir, "drain", "w1", "--name", name, "--deadline", "30s")
            assert drain.returncode == 0, drain.stderr
            assert "resized (drain w1) in place: worker:0 left" in drain.stderr, drain.stderr
            bad = cli(state_dir, "drain", "w2", "--name", name, "--deadline", "0")
            assert bad.returncode == 2 and "--deadline '0'" in bad.stderr, bad.stderr
            last = cli(state_dir, "drain", "w2", "--name", name)        # the last worker left: refused
            assert last.returncode == 2 and "no worker" in last.stderr, last.stderr
            out, err = train.communicate(timeout=300)
        finally:
            if train.poll() is None:
                train.kill()
        assert train.returncode == 0, err[-4000:]
        report = json.loads(out)
        state = state_of(state_dir, name)
        assert state["drained"] == {"w1": "drained"}, state["drained"]
        assert not state["job"].get("restored_step") and not state["job"].get("restarts"), state["job"]
        assert report["global_step"] >= STEPS, report
        assert not [r for r in state["processes"] if r["host"] == "w1" and not r.get("stopped")]
        status = json.loads(cli(state_dir, "status", "--name", name, "--json").stdout)
        assert status["drained"] == {"w1": "drained"}
        documents = [json.loads(line) for line in notified.read_text().splitlines() if line.strip()]
        resized = [d for d in documents if d["event"] == "resized"]
        assert [d["report"]["reason"] for d in resized] == ["drain w1"], (documents, err[-3000:])
        assert resized[0]["report"]["in_place"] and resized[0]["report"]["workers"] == 1
        print("drain:", " ".join(drain.stderr.split())[-300:])     # its timing, for the record (-s)
    finally:
        cli(state_dir, "down", "--name", name, "--now", "--grace", "2", timeout=300)
        for pid in cluster_pids(name):
            os.kill(pid, signal.SIGKILL)
        assert_no_survivors(name)
