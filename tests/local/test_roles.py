"""The roles for real: TensorFlow servers and trainers as processes on localhost.

Every mode trains the reference MNIST job on a small budget and must show a falling
loss, a test accuracy of at least ACCURACY_BOUND, and a well-formed events file;
each mode also resumes from its checkpoint. The sync test uses the job's MLP variant
to save time; the others train the default CNN. The async test runs the chief in a
different working directory from the ps tasks with a *relative* checkpoint directory:
the checkpoint must appear complete under the chief's directory and nothing under the
ps tasks' (the chief writes everything; no shared path is needed). A tiny job written
into the test's tmp dir proves user jobs load and train.

Ports come from 23000-23999 (checked free just before use). Every process started
here is recorded and killed by its PID in a ``finally``. Budget on a 2-core machine:
about 2.5 minutes when it is otherwise idle, 4-5 minutes when other work keeps it busy
(15 TensorFlow processes start, and each import then takes 10-20 s).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from roles.events import EVENT_FIELDS, read_events
from testbed import netlab

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
MNIST_JOB = str(REPO / "examples" / "distributed_mnist")
PORT_RANGE = (23000, 23999)
ACCURACY_BOUND = 0.90
TRAIN_TIMEOUT = 300  # seconds per training run, far above the expected ~30-60 s


def free_ports(count: int) -> list[int]:
    """Distinct ports in PORT_RANGE that can be bound on every interface right now."""
    ports: list[int] = []
    candidates = list(range(PORT_RANGE[0], PORT_RANGE[1] + 1))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))  # TensorFlow servers listen on 0.0.0.0
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free ports in {PORT_RANGE}")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"


@dataclass
class LocalCluster:
    """A TF_CONFIG cluster on localhost plus the processes started for it."""

    cluster: dict[str, list[str]]
    logs: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    servers: dict[str, subprocess.Popen] = field(default_factory=dict)     # "worker:1" -> its server

    @classmethod
    def create(cls, logs: Path, chief: int = 0, ps: int = 0, workers: int = 0) -> "LocalCluster":
        ports = iter(free_ports(chief + ps + workers))
        cluster = {}
        for job, n in (("chief", chief), ("ps", ps), ("worker", workers)):
            if n:
                cluster[job] = [f"localhost:{next(ports)}" for _ in range(n)]
        logs.mkdir(parents=True, exist_ok=True)
        return cls(cluster=cluster, logs=logs)

    def env(self, job: str, index: int, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            TF_CONFIG=json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}}),
            GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="1", TF_ENABLE_ONEDNN_OPTS="0",
            CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
        env.update(extra)
        return env

    def start(self, argv: list[str], job: str, index: int, cwd: Path, log_name: str,
              **extra_env: str) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / log_name, "w")
        try:
            proc = subprocess.Popen([sys.executable, *argv], cwd=cwd,
                                    env=self.env(job, index, **extra_env),
                                    stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self.processes.append(proc)
        return proc

    def start_servers(self, jobs: tuple[str, ...], cwd: Path, **extra_env: str) -> None:
        for job in jobs:
            for i in range(len(self.cluster.get(job, []))):
                self.servers[f"{job}:{i}"] = self.start(["-m", "roles.server"], job, i, cwd,
                                                        f"server-{job}{i}.log", **extra_env)

    def stop(self) -> None:
        """Kills every process this cluster started, by its recorded PID."""
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class TrainRun:
    returncode: int
    events: list[dict]
    log: Path

    def first(self, kind: str) -> dict:
        found = [e for e in self.events if e["event"] == kind]
        assert found, f"no {kind!r} event in {[e['event'] for e in self.events]}\n{tail(self.log)}"
        return found[0]

    def all(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]


def train(cluster: LocalCluster, mode: str, tasks: list[tuple[str, int, Path]], args: list[str],
          run_name: str, job: str = MNIST_JOB, **extra_env: str) -> list[TrainRun]:
    """Starts ``roles.train`` for each (job, index, cwd) and waits for all of them."""
    started = []
    for job_name, index, cwd in tasks:
        events = cluster.logs / f"{run_name}-{job_name}{index}.jsonl"
        log_name = f"{run_name}-{job_name}{index}.log"
        argv = ["-m", "roles.train", "--mode", mode, "--job", job, "--events", str(events),
                "--start-timeout", "150", *args]
        started.append((cluster.start(argv, job_name, index, cwd, log_name, **extra_env),
                        events, cluster.logs / log_name))
    runs = []
    deadline = time.monotonic() + TRAIN_TIMEOUT
    for proc, events, log in started:
        try:
            proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"{run_name}: training did not finish in {TRAIN_TIMEOUT} s\n{tail(log)}")
        runs.append(TrainRun(proc.returncode, read_events(events) if events.exists() else [], log))
    for run in runs:
        assert run.returncode == 0, f"{run_name}: exit code {run.returncode}\n{tail(run.log)}"
    return runs


def check_events(run: TrainRun, mode: str, steps_total: int, chief: bool) -> None:
    """Well-formed stream: contract fields, start first, done last, steps rising."""
    kinds = [e["event"] for e in run.events]
    for event in run.events:
        assert {"event", "ts", "task"} <= set(event), event
        missing = set(EVENT_FIELDS[event["event"]]) - set(event)
        assert not missing, f"{event['event']} lacks {missing}"
    assert kinds[-1] == "done", kinds
    assert "error" not in kinds
    assert kinds[0] == "start", kinds
    start, done = run.first("start"), run.first("done")
    assert (start["mode"], done["mode"]) == (mode, mode)
    assert start["steps_total"] == steps_total
    assert done["global_step"] == steps_total
    progress_steps = [e["step"] for e in run.all("progress")]
    assert progress_steps, "no progress events"
    assert progress_steps == sorted(progress_steps)
    assert all(e["examples_per_second"] is None or e["examples_per_second"] > 0
               for e in run.all("progress"))
    if chief:
        assert done["val_accuracy"] is not None


def check_learned(run: TrainRun) -> None:
    losses = [e["loss"] for e in run.all("progress") if e["loss"] is not None]
    assert len(losses) >= 2, f"too few progress events to see the loss fall: {losses}"
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    done = run.first("done")
    assert done["val_accuracy"] >= ACCURACY_BOUND, done
    assert done["val_loss"] < 0.5, done


# --- fixtures ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def async_cluster(tmp_path_factory) -> Iterator[tuple[LocalCluster, Path]]:
    """chief + 2 ps + 2 worker servers; the servers run in their own directory."""
    root = tmp_path_factory.mktemp("async")
    cluster = LocalCluster.create(root / "logs", chief=1, ps=2, workers=2)
    try:
        cluster.start_servers(("ps", "worker"), cwd=root / "ps-and-workers-cwd")
        yield cluster, root
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def syncps_cluster(tmp_path_factory) -> Iterator[tuple[LocalCluster, Path]]:
    root = tmp_path_factory.mktemp("syncps")
    cluster = LocalCluster.create(root / "logs", ps=2, workers=2)
    try:
        cluster.start_servers(("ps",), cwd=root / "ps-cwd")
        yield cluster, root
    finally:
        cluster.stop()


# --- tests ---------------------------------------------------------------------------

@pytest.mark.extended
def test_async_relative_checkpoint_written_by_chief_and_resume(async_cluster):
    cluster, root = async_cluster
    chief_cwd = root / "chief-cwd"
    args = ["--steps", "200", "--checkpoint-dir", "ckpt", "--checkpoint-every", "100",
            "--eval-every", "100"]
    (run,) = train(cluster, "async", [("chief", 0, chief_cwd)], args, "async-1")
    check_events(run, "async", 200, chief=True)
    check_learned(run)
    evals = run.all("eval")  # at ~100 while training goes on, then the final one
    assert len(evals) == 2 and 0 < evals[0]["step"] <= 200 and evals[1]["step"] == 200
    assert evals[1]["val_accuracy"] == run.first("done")["val_accuracy"]

    placement = run.first("placement")["variables"]
    assert placement and all(v["device"].startswith("/job:ps/") for v in placement), placement
    assert {v["device"].split("/task:")[1][0] for v in placement} == {"0", "1"}  # round-robin
    assert [c["step"] for c in run.all("checkpoint")] == [100, 200]
    assert run.first("done")["checkpoint"] == "ckpt/ckpt-200"

    # The chief wrote the whole checkpoint under its own cwd; the ps tasks, whose cwd
    # differs, wrote nothing.
    ckpt = chief_cwd / "ckpt"
    assert (ckpt / "checkpoint").is_file() and (ckpt / "ckpt-200.index").is_file()
    assert list(ckpt.glob("ckpt-200.data-*"))
    assert not list((root / "ps-and-workers-cwd").rglob("*ckpt*"))

    (resumed,) = train(cluster, "async", [("chief", 0, chief_cwd)],
                       ["--steps", "260", "--checkpoint-dir", "ckpt", "--resume"], "async-2")
    start = resumed.first("start")
    assert start["restored_step"] == 200
    done = resumed.first("done")
    assert (done["global_step"], done["restored_step"]) == (260, 200)
    assert all(e["step"] > 200 for e in resumed.all("progress"))
    assert done["checkpoint"] == "ckpt/ckpt-260"
    assert done["val_accuracy"] >= ACCURACY_BOUND


TINY_JOB = """
    '''A user job: 2-D points, label = which side of a line. Trains in seconds.'''
    import keras
    import tensorflow as tf

    BATCH_SIZE = 64
    LEARNING_RATE = 0.05
    STEPS = 150

    def build_model():
        return keras.Sequential([keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(2)])

    def dataset(shard):
        split_seed = 1 if shard.split == "train" else 2
        x = tf.random.stateless_uniform([4000, 2], seed=[split_seed, 0], minval=-1, maxval=1)
        y = tf.cast(x[:, 0] + 0.5 * x[:, 1] > 0, tf.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).shard(shard.count, shard.index)

    def loss(labels, outputs):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)

    def optimizer(learning_rate):
        return keras.optimizers.SGD(learning_rate, momentum=0.9)
"""


def test_user_job_from_tmp_dir(async_cluster, tmp_path):
    cluster, _ = async_cluster
    job = tmp_path / "tiny_job.py"
    job.write_text(textwrap.dedent(TINY_JOB))
    (run,) = train(cluster, "async", [("chief", 0, tmp_path / "chief")],
                   ["--steps-per-execution", "10"], "user-job", job=str(job))
    check_events(run, "async", 150, chief=True)
    done = run.first("done")
    assert done["val_accuracy"] >= 0.9, done
    assert done["checkpoint"] is None


def test_async_chief_trains_on_without_a_cut_off_worker_and_takes_it_back_when_it_heals(async_cluster, tmp_path):
    """Issue 41: a closure whose worker never answers must not hold the chief, nor the other
    workers, and the worker comes back in place. Here the link to worker:1 is cut (its packets
    dropped, so its kernel answers nothing either; where iptables cannot be used, its server is
    stopped by SIGSTOP instead), with no supervisor to act:

    * worker:0 trains on while worker:1's closure hangs (the chief collects closures in any order);
    * the chief cuts the hung closure loose (roles/closures.py), counts worker:1 out (a ``worker``
      event, ``lost``) and TensorFlow runs the closure on worker:0 (roles/workerloss.py);
    * the link heals; the chief's probe finds worker:1 answering and takes it back (``back``),
      and worker:1 trains again (it shows in a later progress event), with no restart;
    * a stop then ends the chief as a stop does (exit 143, ``error`` "Stopped")."""
    cluster, _ = async_cluster
    job = tmp_path / "tiny_job.py"
    job.write_text(textwrap.dedent(TINY_JOB))
    events, log = cluster.logs / "frozen-chief0.jsonl", cluster.logs / "frozen-chief0.log"
    chief = cluster.start(["-m", "roles.train", "--mode", "async", "--job", str(job), "--events", str(events),
                           "--start-timeout", "150", "--steps", "10000000", "--steps-per-execution", "10",
                           "--warmup-steps", "0"], "chief", 0, tmp_path / "chief", log.name)
    frozen = cluster.servers["worker:1"]
    blackhole = os.geteuid() == 0 and shutil.which("iptables") is not None and shutil.which("ip6tables") is not None
    heal: list[list[str]] = []

    def seen(predicate: Callable[[dict], bool], what: str) -> dict:
        deadline = time.monotonic() + TRAIN_TIMEOUT
        while True:
            found = [e for e in (read_events(events) if events.exists() else []) if predicate(e)]
            if found:
                return found[0]
            assert chief.poll() is None, f"the chief ended before {what}: {tail(log)}"
            assert time.monotonic() < deadline, f"no {what} within {TRAIN_TIMEOUT} s: {tail(log)}"
            time.sleep(0.2)

    try:
        first = seen(lambda e: e["event"] == "progress" and "worker:1" in (e.get("per_worker") or {}),
                     "progress of both workers")
        if blackhole:
            heal = netlab.cut_port(int(cluster.cluster["worker"][1].rsplit(":", 1)[1]))
        else:
            frozen.send_signal(signal.SIGSTOP)
        cut = read_events(events)[-1]["ts"]
        lost = seen(lambda e: e["event"] == "worker" and e["state"] == "lost", "worker:1 counted out")
        for command in heal:
            subprocess.run(command, check=False, capture_output=True)
        heal = []
        frozen.send_signal(signal.SIGCONT)
        back = seen(lambda e: e["event"] == "worker" and e["state"] == "back", "worker:1 taken back")
        seen(lambda e: e["event"] == "progress" and e["ts"] > back["ts"] and "worker:1" in (e.get("per_worker") or {}),
             "progress of worker:1 after it came back")
        chief.send_signal(signal.SIGTERM)
        chief.wait(TRAIN_TIMEOUT)
    finally:
        for command in heal:
            subprocess.run(command, check=False, capture_output=True)
        frozen.send_signal(signal.SIGCONT)
        if chief.poll() is None:
            chief.kill()
    run = TrainRun(chief.returncode, read_events(events), log)
    assert run.returncode == 128 + signal.SIGTERM and run.first("error")["exception"] == "Stopped", tail(log)
    assert lost["worker"] == "worker:1" and back["worker"] == "worker:1", (lost, back)
    # worker:0 trained on while worker:1's closure hung, before the chief cut it loose.
    during = [e["step"] for e in run.all("progress") if cut < e["ts"] < lost["ts"]]
    assert during and max(during) > first["step"], (first, during, lost)
    assert "worker:1's closure has run" in log.read_text() or not blackhole, tail(log)
    assert not run.all("start")[1:], "the chief never restarted"


def test_sync_two_workers_and_resume(tmp_path):
    # The MLP variant of the job keeps this test quick; the CNN runs in the other modes.
    mlp = {"MNIST_MODEL": "mlp"}
    cluster = LocalCluster.create(tmp_path / "logs", workers=2)
    try:
        cwd = [tmp_path / "w0", tmp_path / "w1"]  # only worker 0 (the chief) keeps files
        tasks = [("worker", 0, cwd[0]), ("worker", 1, cwd[1])]
        args = ["--steps", "150", "--checkpoint-dir", "ckpt", "--checkpoint-every", "100",
                "--eval-every", "50"]
        runs = train(cluster, "sync", tasks, args, "sync-1", **mlp)
        for i, run in enumerate(runs):
            check_events(run, "sync", 150, chief=(i == 0))
            check_learned(run)  # distributed evaluation: every worker knows the result
        assert runs[0].first("done")["val_accuracy"] == runs[1].first("done")["val_accuracy"]
        assert [e["step"] for e in runs[0].all("eval")] == [50, 100, 150]
        assert not runs[1].all("eval")  # job-level events come from the chief only
        assert [c["step"] for c in runs[0].all("checkpoint")] == [100, 150]
        assert not runs[1].all("checkpoint")
        assert (cwd[0] / "ckpt" / "ckpt-150.index").is_file()
        assert not (cwd[1] / "ckpt").exists()
        for run in runs:  # a finished run ends with the leaving handshake, not a teardown
            assert "left with the other workers" in run.log.read_text(errors="replace"), tail(run.log)

        # Only the chief has the checkpoint; worker 1 gets the restored values from it.
        runs = train(cluster, "sync", tasks,
                     ["--steps", "200", "--checkpoint-dir", "ckpt", "--resume"], "sync-2", **mlp)
        for run in runs:
            assert run.first("start")["restored_step"] == 150
            assert run.first("done")["global_step"] == 200
            assert all(e["step"] > 150 for e in run.all("progress"))
        assert runs[0].first("done")["val_accuracy"] >= ACCURACY_BOUND
    finally:
        cluster.stop()


@pytest.mark.extended
def test_syncps_train_and_resume_on_the_same_standing_ps(syncps_cluster):
    cluster, root = syncps_cluster
    tasks = [("worker", 0, root / "w0"), ("worker", 1, root / "w1")]
    threads = {"PSCLUSTER_INTRA_OP_THREADS": "1", "PSCLUSTER_INTER_OP_THREADS": "2"}
    args = ["--steps", "150", "--checkpoint-dir", "ckpt", "--checkpoint-every", "100",
            "--eval-every", "75"]
    runs = train(cluster, "sync-ps", tasks, args, "syncps-1", **threads)
    check_events(runs[0], "sync-ps", 150, chief=True)
    check_events(runs[1], "sync-ps", 150, chief=False)
    check_learned(runs[0])
    assert runs[1].first("done")["val_accuracy"] is None  # the chief evaluates
    assert [e["step"] for e in runs[0].all("eval")] == [75, 150]
    placement = runs[0].first("placement")["variables"]
    assert all(v["device"].startswith("/job:ps/") for v in placement), placement
    assert [c["step"] for c in runs[0].all("checkpoint")] == [100, 150]
    assert (root / "w0" / "ckpt" / "ckpt-150.index").is_file()
    assert not list((root / "ps-cwd").rglob("*ckpt*"))

    # Same standing ps tasks, which still hold run 1's variables and queues.
    runs = train(cluster, "sync-ps", tasks,
                 ["--steps", "200", "--checkpoint-dir", "ckpt", "--resume"], "syncps-2")
    assert runs[0].first("start")["restored_step"] == 150
    for run in runs:
        assert run.first("done")["global_step"] == 200
        assert all(e["step"] > 150 for e in run.all("progress"))
    assert runs[0].first("done")["val_accuracy"] >= ACCURACY_BOUND


def test_syncps_model_with_state_updates_trains_on_the_per_variable_path(syncps_cluster, tmp_path):
    """BatchNormalization statistics and a dropout seed change on every call: such a model cannot
    run on fetched values (roles/fused.py), so it reads its variables where they live; the
    statistics must still move."""
    cluster, root = syncps_cluster
    job = tmp_path / "stateful_job.py"
    job.write_text(textwrap.dedent(TINY_JOB).replace(
        """keras.Sequential([keras.layers.Dense(16, activation="relu"),""",
        """keras.Sequential([keras.layers.Dense(16, activation="relu"),
                                 keras.layers.BatchNormalization(), keras.layers.Dropout(0.1),"""))
    tasks = [("worker", 0, root / "s0"), ("worker", 1, root / "s1")]
    runs = train(cluster, "sync-ps", tasks, ["--steps", "120", "--checkpoint-dir", "ckpt"], "syncps-stateful",
                 job=str(job))
    for run in runs:
        assert run.first("done")["global_step"] == 120
    assert runs[0].first("done")["val_accuracy"] >= ACCURACY_BOUND
    names = [v["name"] for v in runs[0].first("placement")["variables"]]
    assert any("moving_mean" in n for n in names), names
    # The moving mean starts at zeros; after 120 steps of updates it is not.
    read = subprocess.run([sys.executable, "-c", (
        "import json, sys, tensorflow as tf\n"
        "r = tf.train.load_checkpoint(sys.argv[1])\n"
        "print(json.dumps([float(abs(r.get_tensor(k)).max()) for k in r.get_variable_to_shape_map()"
        " if 'moving_mean' in k]))"), str(root / "s0" / "ckpt" / "ckpt-120")],
        capture_output=True, text=True, timeout=120)
    largest = json.loads(read.stdout.strip().splitlines()[-1])
    assert largest and max(largest) > 0, (largest, read.stderr[-2000:])
