"""Fault injection on the SSH lab: real training, real kills, real cut links.

``fault_cluster`` brings a cluster up on the 3-host lab and starts ``pscluster train --json``
as a real background process; the test waits for training to reach a step, injects a fault
into a task found by its *recorded* pid (the fake hosts share this machine's PID space), and
reads the final report. Teardown runs ``pscluster down`` and asserts that no process of the
cluster survives.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testbed import netlab
from tests.helpers import REPO, assert_no_survivors, port_base, run_cli

# Short, fast jobs: the MLP variant of distributed_mnist, a few hundred steps, frequent checkpoints.
FAST_JOB_ENV = {"MNIST_MODEL": "mlp", "OMP_NUM_THREADS": 1}
ACCURACY_BOUND = 0.90


@dataclass
class Training:
    """A running ``pscluster train`` process."""

    cluster: "FaultCluster"
    proc: subprocess.Popen
    began: float = field(default_factory=time.monotonic)
    stdout: str = ""
    stderr: str = ""

    def job(self) -> dict:
        return self.cluster.state().get("job") or {}

    def wait_step(self, step: int, timeout: float = 180) -> dict:
        """Wait until the leader reported ``step`` (and a checkpoint at or after half of it)."""
        return self.wait_for(lambda job: (job.get("step") or 0) >= step and (job.get("checkpoint_step") or 0) >= step // 2,
                             timeout, f"step {step}")

    def wait_for(self, predicate, timeout: float = 180, what: str = "the state") -> dict:
        """Wait until ``predicate(job record)`` holds; the record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.finish(0)
                raise AssertionError(f"training ended before {what}:\n{self.stdout}\n{self.stderr}")
            job = self.job()
            if predicate(job):
                return job
            time.sleep(0.2)
        raise AssertionError(f"{what} not reached in {timeout} s; job: {self.job()}")

    def record(self, task: str, kind: str | None = None) -> dict:
        """The newest live process record of ``task`` (of ``kind``; none: not a standby, which a
        sync job refills a few seconds into training and which is not the task's process yet)."""
        records = [r for r in self.cluster.state()["processes"]
                   if r["task"] == task and not r["stopped"] and r["pid"]
                   and (r["kind"] != "standby" if kind is None else r["kind"] == kind)]
        assert records, f"no live record for {task}"
        return records[-1]

    def signal(self, task: str, sig: int, kind: str | None = None) -> dict:
        record = self.record(task, kind)
        os.kill(record["pid"], sig)        # the task's own recorded pid
        return record

    def finish(self, timeout: float = 600) -> tuple[int, dict | None]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)
            out, err = self.proc.communicate(timeout=60)
        self.stdout += out
        self.stderr += err
        try:
            report = json.loads(self.stdout) if self.proc.returncode == 0 else None
        except ValueError:
            report = None
        return self.proc.returncode, report

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.began


@dataclass
class FaultCluster:
    lab: object
    tmp: Path
    name: str
    write_inventory: object
    state_dir: Path = None
    env: dict = field(default_factory=dict)

    def __post_init__(self):
        self.state_dir = self.tmp / f"state-{self.name}"

    def state(self) -> dict:
        try:
            return json.loads((self.state_dir / f"{self.name}.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def inventory(self, groups: dict, mode: str, **extra) -> Path:
        extra.setdefault("pscluster_port_base", port_base())
        extra.setdefault("pscluster_workdir", str(REPO))
        extra.setdefault("pscluster_connect_timeout", 3)
        extra.setdefault("pscluster_env", dict(FAST_JOB_ENV))
        extra["pscluster_mode"] = mode
        return self.write_inventory(self.lab, self.tmp / f"{self.name}.yaml", groups, extra)

    def up(self, groups: dict, mode: str, **extra) -> None:
        proc = run_cli(["up", self.inventory(groups, mode, **extra), "--name", self.name], state_dir=self.state_dir,
                       env=self.env)
        assert proc.returncode == 0, proc.stderr

    def train(self, *args) -> Training:
        env = dict(os.environ, PSCLUSTER_STATE_DIR=str(self.state_dir), NO_COLOR="1", COLUMNS="200", **self.env)
        argv = [sys.executable, "-m", "cluster", "train", "distributed_mnist", "--name", self.name, "--json",
                *map(str, args)]
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return Training(self, proc)

    def cli(self, *args, **kw) -> subprocess.CompletedProcess:
        return run_cli([*args, "--name", self.name] if args[0] in ("down", "status", "logs") else list(args),
                       state_dir=self.state_dir, env=self.env, **kw)

    def down(self) -> subprocess.CompletedProcess:
        return self.cli("down", "--grace", "3")


@pytest.fixture(scope="module")
def shared_fault_cluster(_lab3_module, tmp_path_factory):
    """Factory of clusters kept up for the rest of the module, one per layout and mode: the tests
    whose fault leaves every server standing (a link cut and healed, a job stopped or failed)
    train on one ``up``. Each test gets it with every link healed; down, and nothing left, at the
    module's end."""
    clusters: dict[tuple, FaultCluster] = {}

    def get(groups: dict, mode: str) -> FaultCluster:
        key = (tuple((role, tuple(hosts)) for role, hosts in groups.items()), mode)
        if key not in clusters:
            name = f"f-shared-{len(clusters)}-{os.getpid()}"
            cluster = FaultCluster(_lab3_module, tmp_path_factory.mktemp(name), name, netlab.write_inventory)
            clusters[key] = cluster
            cluster.up(groups, mode)
        _lab3_module.heal_all()
        return clusters[key]

    yield get
    _take_down(_lab3_module, list(clusters.values()))


@pytest.fixture
def fault_cluster(tmp_path, lab3, write_lab_inventory, request):
    clusters: list[FaultCluster] = []

    def make(name: str | None = None) -> FaultCluster:
        name = name or "f-" + request.node.name.replace("test_", "")[:22].replace("_", "-")
        cluster = FaultCluster(lab3, tmp_path, name, write_lab_inventory)
        clusters.append(cluster)
        return cluster

    yield make
    _take_down(lab3, clusters)


def _take_down(lab, clusters: list[FaultCluster]) -> None:
    """Every link healed, each cluster still recorded down, then none of their processes left."""
    lab.heal_all()
    for cluster in clusters:
        if (cluster.state_dir / f"{cluster.name}.json").exists():
            cluster.down()
    for cluster in clusters:
        assert_no_survivors(cluster.name, timeout=15)
