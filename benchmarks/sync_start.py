"""Where a sync worker's start goes, and what two TensorFlow settings would save (issue 23).

A sync resize restarts every worker (MultiWorkerMirroredStrategy cannot change its cluster), and
on a 2-core host the pause is the CPU of that start. This script starts N sync workers at once on
127.0.0.1, each built as roles/sync_driver.py builds them (strategy, the job's model and
optimizer, the distributed dataset, the traced step loop, the first step), and prints per
setting: the wall seconds until every worker has made its first step, each worker's CPU seconds
for it, and the steady steps/s after it. TensorFlow is imported before the clock starts, as in a
standby. Settings, alternated:

* ``shipped``: the step loop as roles/sync_driver.py traces it (since the eighth session: a
  ``tf.while_loop`` traced without autograph; the per-replica step, the user's model and loss,
  still goes through autograph);
* ``loop-autograph``: the loop as it was before, a ``for ... in tf.range`` loop that autograph
  converts (for the record of what the change saved);
* ``grappler-off``: TensorFlow's graph optimizer disabled for the whole process.

Usage: ``python -m benchmarks.sync_start [--workers 3] [--repeats 3] [--chunks 10] [--model cnn]``
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import print_columns  # noqa: E402

SETTINGS = ("shipped", "loop-autograph", "grappler-off")
JOB = REPO / "examples" / "distributed_mnist"
BATCH = 128
STEPS_PER_CHUNK = 20


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def worker(index: int, ports: list[int], setting: str, go: Path, chunks: int) -> dict[str, Any]:
    """One worker: import, wait for ``go``, then time its start and its steady steps."""
    import tensorflow as tf

    from roles.datasets import sample_batch, train_dataset
    from roles.checkpoint import make_step_counter
    from roles.jobs import Shard, load_job
    from roles.sync_driver import _make_train_steps

    job = load_job(str(JOB))
    if setting == "grappler-off":
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    Path(f"{go}.ready{index}").touch()
    while not go.exists():
        time.sleep(0.005)
    began, cpu = time.monotonic(), time.process_time()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": [f"127.0.0.1:{p}" for p in ports]}),
        task_type="worker", task_id=index, rpc_layer="grpc")
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=120, implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    global_batch = BATCH * len(ports)
    x0, _ = sample_batch(job, 1)
    with strategy.scope():
        model = job.build_model()
        model(x0, training=False)
        optimizer = job.optimizer(job.learning_rate)
        optimizer.build(model.trainable_variables)
        step_var = make_step_counter()

    def dataset_fn(context: Any) -> Any:
        shard = Shard(index=context.input_pipeline_id, count=context.num_input_pipelines, split="train", seed=1)
        return train_dataset(job, shard, context.get_per_replica_batch_size(global_batch))

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    if setting == "loop-autograph":
        train_steps = _loop_with_autograph(tf, job, strategy, model, optimizer, iterator, global_batch)
    else:      # the step loop roles/sync_driver.py traces, as it is
        shipped = _make_train_steps(job, _plan(global_batch, len(ports)), strategy, model, optimizer, step_var)
        train_steps = functools.partial(shipped, iterator)
    float(train_steps(tf.constant(1)))
    start, start_cpu = time.monotonic() - began, time.process_time() - cpu
    steady = time.monotonic()
    for _ in range(chunks):
        float(train_steps(tf.constant(STEPS_PER_CHUNK)))
    rate = chunks * STEPS_PER_CHUNK / (time.monotonic() - steady)
    return {"start": start, "cpu": start_cpu, "steps_per_second": rate}


def _plan(global_batch: int, workers: int) -> Any:
    """The part of a sync job's TrainPlan that its step loop reads (the global batch)."""
    from roles.settings import TrainPlan

    return TrainPlan(mode="sync", workers=workers, global_batch_size=global_batch, worker_batch_size=BATCH,
                     steps_total=1, epochs=None, learning_rate=0.0, steps_per_execution=STEPS_PER_CHUNK,
                     train_examples=None, checkpoint_dir=None, checkpoint_every=None, eval_every=None,
                     resume=False, seed=1, start_timeout=120, collective_timeout=120)


def _loop_with_autograph(tf: Any, job: Any, strategy: Any, model: Any, optimizer: Any, iterator: Any,
                         global_batch: int) -> Any:
    """The step loop roles/sync_driver.py shipped until the eighth session: a ``for ... in
    tf.range`` loop that autograph converts, with the per-replica step inside."""
    def step_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_example = tf.cast(job.loss(y, model(x, training=True)), tf.float32)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(per_example)

    @tf.function
    def loop(n: Any) -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(n):
            local = strategy.experimental_local_results(strategy.run(step_fn, args=next(iterator)))
            total += tf.add_n(local) / len(local)
        return total / tf.cast(n, tf.float32)
    return loop


def run_once(setting: str, workers: int, chunks: int, model: str, work: Path) -> dict[str, Any]:
    go = work / f"go-{setting}-{time.monotonic_ns()}"
    ports = free_ports(workers)
    env = dict(os.environ, MNIST_MODEL=model, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.sync_start", "--worker", str(i),
                               "--ports", ",".join(map(str, ports)), "--setting", setting,
                               "--go", str(go), "--chunks", str(chunks)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(workers)]
    # Every worker imports TensorFlow (as a standby has) and says so before the clock starts.
    ready = [Path(f"{go}.ready{i}") for i in range(workers)]
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready):
        if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
            for proc in procs:
                proc.kill()
            raise RuntimeError(f"{setting}: a worker ended or did not import TensorFlow within 300 s")
        time.sleep(0.05)
    go.touch()
    rows = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"{setting}: a worker failed (exit {proc.returncode})")
            rows.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return {"setting": setting, "wall": max(r["start"] for r in rows),
            "cpu": statistics.mean(r["cpu"] for r in rows),
            "steps_per_second": statistics.mean(r["steps_per_second"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sync_start", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunks", type=int, default=10, help=f"steady chunks of {STEPS_PER_CHUNK} steps after the start")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp"))
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ports", help=argparse.SUPPRESS)
    p.add_argument("--setting", help=argparse.SUPPRESS)
    p.add_argument("--go", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        result = worker(args.worker, [int(x) for x in args.ports.split(",")], args.setting, Path(args.go), args.chunks)
        print(json.dumps(result), flush=True)
        os._exit(0)     # a sync worker's teardown can stall (roles/sync_driver.py, leave)
    settings = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        p.error(f"--settings: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="sync-start-") as work:
        for _ in range(args.repeats):
            for setting in settings:
                runs[setting].append(run_once(setting, args.workers, args.chunks, args.model, Path(work)))
    if args.json:
        print(json.dumps(runs, indent=1))
        return 0
    def median(setting: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[setting])
    base = settings[0]
    rows = [[setting, f"{median(setting, 'wall'):.2f}", f"{median(setting, 'cpu'):.2f}",
             f"{median(setting, 'cpu') / median(base, 'cpu'):.2f}", f"{median(setting, 'steps_per_second'):.2f}",
             f"{median(setting, 'steps_per_second') / median(base, 'steps_per_second'):.2f}"] for setting in settings]
    print(f"{args.workers} sync workers started at once ({args.model}), medians of {args.repeats} alternated runs")
    print_columns(["setting", "wall to first step s", "CPU s per worker", f"CPU vs {settings[0]}",
                   "steps/s after", f"steps/s vs {settings[0]}"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
