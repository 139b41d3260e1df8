"""docker/compose.yaml for real: three nodes running the node image's sshd on a bridge network,
and the control container running pscluster against them over SSH (host keys checked against
what the nodes published, key-only login), exactly as the README tells a user to run it.

Then faults, injected with Docker itself while a job trains: a worker node killed (the job goes on
in place without it; on the suite's cluster, after its first job), and, extended, a node frozen
for 20 s and a ps node restarted (these two end at 98.5 % validation accuracy or more after 4
epochs).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field

import pytest

from testbed import dockerlab
from tests.docker.conftest import docker, final_report, healthy, processes, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.tf]

PROJECT = "psclab"
NODES = {name: f"{PROJECT}_{name}_1" for name in ("node-1", "node-2", "node-3")}   # compose v1's names
# The control container's name is this run's: a run killed mid-way can leave its own in the
# engine's kept data root, and the name would be taken.
CONTROL = f"{PROJECT}-control-{os.getpid()}"
STATE = "/home/pscluster/.local/state/pscluster/docker.json"      # cluster 'docker' (inventories/docker.yaml)
IMAGE_UID = 1000          # the image's pscluster user (docker/Dockerfile PSCLUSTER_UID)
ACCURACY = 0.985
# Four epochs, the job's default: issue 27 named three, but three clear 98.5 % by too thin a
# margin (examples/distributed_mnist/job.py says so), and a CI run failed at 98.33 % after three
# with node-3 killed (2026-11-28).
EPOCHS = "4"


@dataclass
class ComposeLab:
    engine: object
    env: dict

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run([dockerlab.COMPOSE, "-p", PROJECT, "-f", str(dockerlab.REPO / "docker" / "compose.yaml"),
                               *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"docker-compose {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def pscluster(self, *args, timeout: float = 600) -> subprocess.CompletedProcess:
        """``pscluster ARGS`` in the control container, in the checkout baked into the image."""
        return subprocess.run([dockerlab.DOCKER, "exec", CONTROL, "pscluster", *map(str, args)], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def train(self, *args) -> "Training":
        after_job = self.job().get("id")        # the cluster's last job, if any: not this one
        proc = subprocess.Popen([dockerlab.DOCKER, "exec", CONTROL, "pscluster", "train", "distributed_mnist", "--json",
                                 *map(str, args)], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        return Training(self, proc, after_job)

    def job(self) -> dict:
        out = docker(self.engine, "exec", CONTROL, "cat", STATE, check=False)
        try:
            return json.loads(out).get("job") or {}
        except ValueError:
            return {}

    def ours(self, node: str) -> list[str]:
        """What runs in a node besides its init and sshd."""
        return [p for p in processes(self.engine, NODES[node])
                if not p.startswith(("/usr/bin/tini", "sshd: /usr/sbin/sshd", "/usr/sbin/sshd"))]


@dataclass
class Training:
    lab: ComposeLab
    proc: subprocess.Popen
    after_job: object = None
    stdout: str = ""
    stderr: str = ""
    began: float = field(default_factory=time.monotonic)

    def wait_step(self, step: int, timeout: float = 300) -> dict:
        """This job (not the record of one before it on the cluster) running past ``step``, with a
        checkpoint at or after half of it."""
        def reached():
            if self.proc.poll() is not None:
                self.finish(1)
                raise AssertionError(f"training ended before step {step}:\n{self.stderr[-3000:]}")
            job = self.lab.job()
            if job.get("state") != "running" or job.get("id") == self.after_job:
                return None
            return job if (job.get("step") or 0) >= step and (job.get("checkpoint_step") or 0) >= step // 2 else None
        return wait_for(f"step {step}", reached, timeout=timeout)

    def finish(self, timeout: float = 900) -> tuple[int, dict]:
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout += out
        self.stderr += err
        return self.proc.returncode, final_report(self.stdout) if self.proc.returncode == 0 else {}


@pytest.fixture(scope="module")
def lab(engine, tmp_path_factory):
    keys = tmp_path_factory.mktemp("compose-lab")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pscluster-lab", "-f", str(keys / "id_ed25519")],
                   check=True)
    for name in ("id_ed25519", "id_ed25519.pub"):    # the control runs as the image's user: it reads the key
        os.chown(keys / name, IMAGE_UID, IMAGE_UID)
    lab = ComposeLab(engine, engine.env() | {"PSCLUSTER_LAB_DIR": str(keys)})
    try:
        lab.compose("up", "-d", "--no-build", *NODES)
        wait_for("the nodes' sshd", lambda: healthy(engine, *NODES.values()), timeout=120)
        lab.compose("run", "-d", "--name", CONTROL, "control", "sleep", "infinity")
        yield lab
    finally:
        docker(engine, "rm", "-f", CONTROL, check=False)
        subprocess.run([dockerlab.COMPOSE, "-p", PROJECT, "-f", str(dockerlab.REPO / "docker" / "compose.yaml"),
                        "down", "-v", "--remove-orphans"], env=lab.env, capture_output=True, timeout=300)


@pytest.fixture
def cluster(lab):
    """An async cluster of inventories/docker.yaml, brought down (and checked empty) afterwards."""
    up = lab.pscluster("up", "inventories/docker.yaml")
    assert up.returncode == 0, up.stderr[-3000:]
    yield lab
    bring_back(lab)
    down = lab.pscluster("down", "--grace", "5")
    assert down.returncode == 0, down.stderr[-3000:]
    for node in NODES:
        wait_for(f"nothing of ours on {node}", lambda node=node: not lab.ours(node), timeout=30)


@pytest.mark.parametrize("mode", ["async", *(pytest.param(m, marks=pytest.mark.extended) for m in ("sync", "sync-ps"))])
def test_each_mode_runs_logs_status_and_down_leave_nothing(lab, mode):
    """Every mode trains in the compose lab (the suite runs async; sync and sync-ps are extended:
    tests/local/test_training.py trains every mode); on the async cluster a worker node is then
    killed (:func:`kill_a_worker_node`), so the suite brings the lab's cluster up once (issue 47).
    A user's program through `run` in containers is tests/docker/test_docker_connection.py's."""
    up = lab.pscluster("up", "inventories/docker.yaml", "--mode", mode)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        train = lab.pscluster("train", "distributed_mnist", "--steps", "300", "--json")
        assert train.returncode == 0, train.stderr[-3000:]
        report = final_report(train.stdout)
        assert report["val_accuracy"] >= 0.95 and report["global_step"] >= 300, (mode, report)
        logs = lab.pscluster("logs", "worker:2")
        assert logs.returncode == 0, logs.stderr
        assert "starting /opt/pscluster/venv/bin/python -m roles." in logs.stdout, logs.stdout[-2000:]
        status = lab.pscluster("status", "--json")
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert shown["mode"] == mode and {t["host"] for t in shown["tasks"]} == set(NODES), shown
        if mode == "async":
            kill_a_worker_node(lab)
    finally:
        bring_back(lab)
        down = lab.pscluster("down")
    assert down.returncode == 0, down.stderr[-3000:]
    assert "nothing left running" in down.stderr
    for node in NODES:
        wait_for(f"nothing of ours on {node} after {mode}", lambda node=node: not lab.ours(node), timeout=30)


def bring_back(lab: ComposeLab) -> None:
    """Every node running again (a test may leave one paused or stopped), its sshd answering."""
    for node in NODES.values():
        docker(lab.engine, "unpause", node, check=False)
        docker(lab.engine, "start", node, check=False)
    wait_for("the nodes' sshd", lambda: healthy(lab.engine, *NODES.values()), timeout=120)


def kill_a_worker_node(cluster: ComposeLab) -> None:
    """docker kill: node-3 (worker:2) is gone, with every process in it. Past --host-timeout the
    async job goes on in place without it (the default: no --min-workers given), nothing
    restored; it trains on, and a stop ends it with its work saved (stopped by state, not run
    to its budget: accuracy is the subject of the 300-step job before it)."""
    training = cluster.train("--epochs", EPOCHS, "--checkpoint-every", "50", "--host-timeout", "10")
    try:
        training.wait_step(200)
        docker(cluster.engine, "kill", NODES["node-3"])

        def went_on() -> dict | None:
            assert training.proc.poll() is None, training.finish(1)
            job = cluster.job()
            return job if "training goes on in place" in (job.get("message") or "") else None
        at = wait_for("the job going on in place without node-3", went_on, timeout=300)
        wait_for("200 steps more on node-1 and node-2",
                 lambda: (cluster.job().get("step") or 0) >= (at.get("step") or 0) + 200, timeout=300)
        stop = cluster.pscluster("stop-job")
        assert stop.returncode == 0, stop.stderr[-3000:]
        code, _ = training.finish()
    finally:
        if training.proc.poll() is None:
            training.proc.kill()
            training.proc.wait()
    assert code == 143, training.stderr[-3000:]     # stop-job SIGTERMs an attached train: its Ctrl-C path
    job = cluster.job()
    assert job["state"] == "stopped" and not job.get("restored_step"), job
    assert job["checkpoint_step"] >= (at.get("step") or 0) + 200, job
    said = " ".join(training.stderr.split())
    assert "node-3" in said and "worker:2" in said and "training goes on in place" in said, training.stderr[-3000:]


@pytest.mark.extended
def test_a_node_paused_for_20_s_is_a_frozen_host(cluster):
    """docker pause: node-2 (ps:1 and worker:1) stops answering for 20 s, then goes on."""
    training = cluster.train("--epochs", EPOCHS, "--checkpoint-every", "50")
    training.wait_step(200)
    docker(cluster.engine, "pause", NODES["node-2"])
    frozen_at = time.monotonic()
    time.sleep(20)                     # the fault itself: a host frozen for 20 s
    docker(cluster.engine, "unpause", NODES["node-2"])
    code, report = training.finish()
    assert code == 0, training.stderr[-3000:]
    assert report["val_accuracy"] >= ACCURACY, report
    assert time.monotonic() - frozen_at >= 20


@pytest.mark.extended
def test_a_restarted_ps_node_is_a_ps_restart(cluster):
    """docker restart: node-2 comes back with sshd only; its ps:1 (and worker:1) are restarted and
    training goes on from the chief's checkpoint."""
    training = cluster.train("--epochs", EPOCHS, "--checkpoint-every", "50")
    training.wait_step(200)
    docker(cluster.engine, "restart", "-t", "1", NODES["node-2"])
    code, report = training.finish()
    assert code == 0, training.stderr[-3000:]
    assert report["val_accuracy"] >= ACCURACY, report
    assert "ps:1" in training.stderr, training.stderr[-3000:]
