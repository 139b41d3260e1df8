"""`pscluster scale` (issue 23, item 2) on real TensorFlow processes, local cluster.

A running `train` job is resized to the edited inventory (or a discovery command's list): async
workers added at the end or the last removed join or leave the running chief in place; sync
jobs checkpoint and start again from that step at the new size. The new worker trains; a
removed worker's server is stopped and nothing of it is left; a host that fails preflight
changes nothing.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base
from testbed.procs import cluster_pids

LOCAL = REPO / "inventories" / "local.yaml"

pytestmark = pytest.mark.tf
NAMES = itertools.count(1)
# The suite's resize tests train distributed_mnist's MLP under a budget they never reach and stop
# by state (`stop-job` once the resized job trained on), so the scale always lands mid-run and
# the test costs what its states cost, not a budget (issue 47). The extended variants keep their
# CNN budgets and accuracy bound; issue 23's 98.5 % after a resize is the SSH lab's
# (tests/lab/test_elastic_lab.py).
ACCURACY_BOUND = 0.96
UNREACHED = 1000000


def inventory(tmp_path, mode: str, workers: int, model: str = "cnn"):
    path = tmp_path / f"{mode}-{workers}.yaml"
    path.write_text(LOCAL.read_text().replace("worker_tasks: 2", f"worker_tasks: {workers}")
                    .replace("pscluster_mode: async", f"pscluster_mode: {mode}")
                    .replace("OMP_NUM_THREADS: 1", f"OMP_NUM_THREADS: 1\n      MNIST_MODEL: {model}"))
    return path


def cli(state_dir, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cli_argv(args), cwd=REPO, env=cli_env(state_dir), capture_output=True, text=True,
                          timeout=timeout)


def state_of(state_dir, name) -> dict:
    return json.loads((state_dir / f"{name}.json").read_text())


def wait_for_steps(state_dir, name, train, steps: int) -> dict:
    return wait_for(state_dir, name, train, f"step {steps}", lambda job: (job.get("step") or 0) >= steps)


def events_of(record: dict) -> list[dict]:
    with open(record["events"]) as handle:
        return [json.loads(line) for line in handle if line.strip()]


class Cluster:
    def __init__(self, tmp_path, mode: str, workers: int, model: str = "cnn"):
        self.name = f"resize-{mode}-{os.getpid()}-{next(NAMES)}"     # one per test: no log folder is reused
        self.state_dir, self.ckpt, self.mode = tmp_path / "state", tmp_path / "ckpt", mode
        self.port_base = port_base()
        up = cli(self.state_dir, "up", inventory(tmp_path, mode, workers, model), "--name", self.name,
                 "--port-base", self.port_base)
        assert up.returncode == 0, up.stderr

    def train(self, steps: int) -> subprocess.Popen:
        return subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", self.name, "--steps", str(steps),
                                          "--checkpoint-dir", str(self.ckpt), "--json"]),
                                cwd=REPO, env=cli_env(self.state_dir), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def scale_mid_train(self, steps: int, inventory_path, before_scale=None) -> tuple[dict, str]:
        """Train ``steps``; once 300 ran, ``before_scale()`` then ``scale`` to ``inventory_path``;
        the final report and train's stderr once the job is done."""
        train = self.train(steps)
        try:
            wait_for_steps(self.state_dir, self.name, train, 300)
            if before_scale is not None:
                before_scale()
            scale = cli(self.state_dir, "scale", inventory_path, "--name", self.name)
            assert scale.returncode == 0, scale.stderr
            out, err = train.communicate(timeout=900)
        finally:
            if train.poll() is None:
                train.kill()
        assert train.returncode == 0, err
        return json.loads(out), err

    def stop(self, train: subprocess.Popen) -> str:
        """`stop-job` (as another terminal would) and the attached train's stderr; the job record
        says it stopped."""
        stop = cli(self.state_dir, "stop-job", "--name", self.name)
        assert stop.returncode == 0, stop.stderr
        _, err = train.communicate(timeout=300)
        assert train.returncode == 143, err[-4000:]      # stop-job SIGTERMs an attached train
        assert state_of(self.state_dir, self.name)["job"]["state"] == "stopped"
        return err

    def close(self) -> None:
        cli(self.state_dir, "down", "--name", self.name, "--now", "--grace", "2", timeout=300)
        for pid in cluster_pids(self.name):
            os.kill(pid, signal.SIGKILL)
        assert_no_survivors(self.name)


@pytest.mark.parametrize("mode", [pytest.param("async", marks=pytest.mark.extended), "sync"])
def test_scale_adds_a_worker_to_a_running_job(tmp_path, mode):
    """Stopped by state: once the resized job trained on at 3 workers (the new worker's own steps,
    sync; its examples in the chief's counts, async), `stop-job`."""
    cluster = Cluster(tmp_path, mode, 2, model="mlp")
    train = cluster.train(UNREACHED)
    try:
        wait_for_steps(cluster.state_dir, cluster.name, train, 300)
        scale = cli(cluster.state_dir, "scale", inventory(tmp_path, mode, 3, "mlp"), "--name", cluster.name)
        assert scale.returncode == 0, scale.stderr
        grown = wait_for_workers(cluster.state_dir, cluster.name, train, 3)
        job = wait_for_steps(cluster.state_dir, cluster.name, train, max(grown["step"], grown.get("restored_step") or 0) + 200)
        if mode == "async":
            job = wait_for(cluster.state_dir, cluster.name, train, "worker:2's examples in the chief's counts",
                           lambda job: (job.get("per_worker") or {}).get("worker:2", 0) > 0)
        state = state_of(cluster.state_dir, cluster.name)
        # Plan, state and status agree with the new inventory.
        planned = cli(cluster.state_dir, "plan", inventory(tmp_path, mode, 3, "mlp"), "--name", cluster.name,
                      "--port-base", cluster.port_base, "--json")
        assert [t["port"] for t in json.loads(planned.stdout)["tasks"]] == [t["port"] for t in state["plan"]["tasks"]]
        status = json.loads(cli(cluster.state_dir, "status", "--name", cluster.name, "--json").stdout)
        assert [f"{t['role']}:{t['index']}" for t in status["tasks"] if t["role"] == "worker"] == \
            ["worker:0", "worker:1", "worker:2"]
        err = cluster.stop(train)
        said = " ".join(err.split())
        trainers = [r for r in state["processes"] if r["kind"] == "train" and r["task"] in ("chief:0", "worker:0")]
        if mode == "async":
            # In place: the running chief takes worker:2 between two closures; nothing restarts.
            assert "resized (scale) in place: start worker:2@localhost; 2 -> 3 worker(s)" in said, err
            assert not job.get("restored_step") and len(trainers) == 1, (job, trainers)
        else:
            assert "resized (scale): start worker:2@localhost; 2 -> 3 worker(s)" in said, err
            # The job saved at one step and the new group restored exactly there: no step redone.
            assert job["restored_step"] and job["restored_step"] >= (grown.get("restored_step") or 0), job
            # The new workers started on the old ones' ports while those trained (roles/handover.py),
            # each at its gate until the old ones had saved; the old ones released their listeners.
            assert "the new workers started while the old ones trained" in said, err
            workers = [r for r in state["processes"] if r["kind"] == "train" and r["task"].startswith("worker:")]
            first = [r for r in workers if r["attempt"] == 1 and r["task"] != "worker:2"]
            relaunched = [r for r in workers if r not in first]
            assert len(first) == 2 and len(relaunched) == 3, workers
            assert all(os.path.exists(r["events"] + ".gate") for r in relaunched), relaunched
            assert sorted(e.get("released") for r in first for e in events_of(r) if e["event"] == "membership") == [1, 1]
            # The new group restored at or past the old group's last step: nothing redone.
            last_old = max(e.get("step") or 0 for r in first for e in events_of(r))
            assert last_old <= job["restored_step"], (last_old, job)
            record = next(r for r in state["processes"] if r["task"] == "worker:2" and r["kind"] == "train")
            assert max(e.get("step") or 0 for e in events_of(record)) > job["restored_step"]     # it trained
    finally:
        if train.poll() is None:
            train.kill()
        cluster.close()


@pytest.mark.extended
def test_scale_removes_a_worker_and_a_host_that_fails_preflight_changes_nothing(tmp_path):
    cluster = Cluster(tmp_path, "async", 3)
    seen: dict = {}
    try:
        def refused_then_running() -> None:
            # A new worker whose port is taken: preflight refuses, the job goes on as it was.
            before = state_of(cluster.state_dir, cluster.name)
            busy_port = int(cluster.port_base) + 6           # worker:3's port in the 4-worker plan
            with socket.socket() as blocker:
                blocker.bind(("127.0.0.1", busy_port))
                blocker.listen()
                refused = cli(cluster.state_dir, "scale", inventory(tmp_path, "async", 4), "--name", cluster.name)
            assert refused.returncode != 0 and "localhost" in refused.stderr and str(busy_port) in refused.stderr, \
                refused.stderr
            after = state_of(cluster.state_dir, cluster.name)
            assert after["plan"] == before["plan"] and after["job"]["state"] == "running"
            seen["worker2"] = next(r for r in after["processes"] if r["task"] == "worker:2" and r["kind"] == "server")

        report, err = cluster.scale_mid_train(2500, inventory(tmp_path, "async", 2), refused_then_running)
        worker2 = seen["worker2"]
        assert report["workers"] == 2 and report["steps_redone"] == 0 and report["val_accuracy"] >= ACCURACY_BOUND, report
        # The last worker leaves in place: it finished its closure, the chief went on with two.
        assert "resized (scale) in place: stop worker:2; 3 -> 2 worker(s)" in " ".join(err.split()), err
        assert not report["restored_step"], report
        state = state_of(cluster.state_dir, cluster.name)
        assert worker2["pid"] not in cluster_pids(cluster.name), "the removed worker's server is still running"
        assert not [r for r in state["processes"] if r["task"] == "worker:2" and not r.get("stopped")]
        assert [t for t in state["plan"]["tasks"] if t["role"] == "worker"][-1]["index"] == 1
    finally:
        cluster.close()


@pytest.mark.extended
def test_min_workers_a_worker_that_used_up_its_restarts_drops_out_and_training_goes_on(tmp_path):
    cluster = Cluster(tmp_path, "async", 3)
    try:
        train = subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", cluster.name, "--steps", "2500",
                                           "--checkpoint-dir", str(cluster.ckpt), "--json", "--min-workers", "2",
                                           "--max-restarts", "0"]),
                                 cwd=REPO, env=cli_env(cluster.state_dir), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            wait_for_steps(cluster.state_dir, cluster.name, train, 300)
            server = next(r for r in state_of(cluster.state_dir, cluster.name)["processes"]
                          if r["task"] == "worker:2" and r["kind"] == "server" and not r.get("stopped"))
            os.kill(server["pid"], signal.SIGKILL)
            out, err = train.communicate(timeout=900)
        finally:
            if train.poll() is None:
                train.kill()
        assert train.returncode == 0, err
        report = json.loads(out)
        said = " ".join(err.split())
        assert "resized (worker:2 used up its restarts" in said and "3 -> 2 worker(s)" in said, err
        assert report["workers"] == 2 and report["val_accuracy"] >= ACCURACY_BOUND, report
        state = state_of(cluster.state_dir, cluster.name)
        assert [t["index"] for t in state["plan"]["tasks"] if t["role"] == "worker"] == [0, 1]
    finally:
        cluster.close()


def test_hosts_from_grows_and_shrinks_an_async_job_in_place(tmp_path):
    """`train --hosts-from CMD`: the discovery command's list says 3 workers, then 2 again; the
    running chief takes each change in place (no checkpoint, no restart). Stopped by state once
    the job trained on at 2 workers."""
    cluster = Cluster(tmp_path, "async", 2, model="mlp")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# host:workers, as horovodrun's --host-discovery-script prints them\nlocalhost:2\n")
    try:
        train = subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", cluster.name, "--steps", UNREACHED,
                                           "--checkpoint-dir", str(cluster.ckpt), "--json",
                                           "--hosts-from", f"cat {hosts}", "--hosts-every", "1"]),
                                 cwd=REPO, env=cli_env(cluster.state_dir), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            wait_for_steps(cluster.state_dir, cluster.name, train, 300)
            hosts.write_text("localhost:3\n")
            grown = wait_for_workers(cluster.state_dir, cluster.name, train, 3)
            wait_for(cluster.state_dir, cluster.name, train, "worker:2 training while in",      # it trained while in
                     lambda job: (job.get("step") or 0) >= grown["step"] + 200
                     and (job.get("per_worker") or {}).get("worker:2", 0) > 0)
            hosts.write_text("localhost:2\n")
            shrunk = wait_for_workers(cluster.state_dir, cluster.name, train, 2)
            job = wait_for_steps(cluster.state_dir, cluster.name, train, shrunk["step"] + 200)
            err = cluster.stop(train)
        finally:
            if train.poll() is None:
                train.kill()
        said = " ".join(err.split())
        assert "resized (--hosts-from) in place: start worker:2@localhost; 2 -> 3 worker(s)" in said, err
        assert "resized (--hosts-from) in place: stop worker:2; 3 -> 2 worker(s)" in said, err
        assert job["workers"] == 2 and not job.get("restored_step"), job
        state = state_of(cluster.state_dir, cluster.name)
        assert not state["job"].get("restored_step") and not state["job"].get("restarts"), state["job"]
        assert not [r for r in state["processes"] if r["task"] == "worker:2" and not r.get("stopped")]
    finally:
        cluster.close()


def wait_for(state_dir, name, train, what: str, ok) -> dict:
    """The job record once ``ok(job)`` holds while it runs."""
    end = time.monotonic() + 600
    while True:
        assert train.poll() is None, train.stderr.read()[-3000:]
        job = state_of(state_dir, name).get("job") or {}
        if ok(job) and job.get("state") == "running":
            return job
        assert time.monotonic() < end, f"never {what}: {job}"
        time.sleep(0.3)


def wait_for_workers(state_dir, name, train, workers: int) -> dict:
    return wait_for(state_dir, name, train, f"{workers} workers", lambda job: job.get("workers") == workers)
