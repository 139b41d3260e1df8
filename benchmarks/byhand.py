"""The TF1 example started by hand, as people do without pscluster: one process per ps and
worker with ``--ps_hosts/--worker_hosts/--job_name/--task_index``, wait for the workers, then
kill the parameter servers (which never exit by themselves).

Same program (examples/byo/tf1_flags.py), same interpreter, same environment as
``pscluster run inventories/local.yaml --on ps,worker`` gives each task: pscluster's task
defaults (cluster/plan.py ``BASE_ENV``), the inventory's ``pscluster_env`` and a CPU-only mask
for the ps. Used by benchmarks/run_overhead.py; alone:

    python -m benchmarks.byhand [--ps 2] [--workers 2] [--steps 2000] [--port-base 39300] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO
from cluster.plan import BASE_ENV

PROGRAM = "examples/byo/tf1_flags.py"
FINAL = re.compile(r"final test_accuracy=(?P<accuracy>[0-9.]+) test_loss=(?P<loss>[0-9.naif]+) "
                   r"steps=(?P<steps>\d+) seconds=(?P<seconds>[0-9.]+)")
INVENTORY_ENV = {"OMP_NUM_THREADS": "1"}      # inventories/local.yaml's pscluster_env


@dataclass(frozen=True)
class HandTask:
    job_name: str
    task_index: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def plan_tasks(ps: int, workers: int, port_base: int, steps: int, python: str = sys.executable) -> list[HandTask]:
    """The command line and environment of every process, ps first."""
    hosts = {"ps": [f"localhost:{port_base + i}" for i in range(ps)],
             "worker": [f"localhost:{port_base + ps + i}" for i in range(workers)]}
    tasks = []
    for job_name, count in (("ps", ps), ("worker", workers)):
        for index in range(count):
            env = {**dict(BASE_ENV), **INVENTORY_ENV}
            if job_name == "ps":
                env["CUDA_VISIBLE_DEVICES"] = ""
            argv = (python, PROGRAM, f"--ps_hosts={','.join(hosts['ps'])}",
                    f"--worker_hosts={','.join(hosts['worker'])}", f"--job_name={job_name}",
                    f"--task_index={index}", "--steps", str(steps))
            tasks.append(HandTask(job_name, index, argv, tuple(sorted(env.items()))))
    return tasks


def parse_final(text: str) -> dict | None:
    """The worker's ``final ...`` line as numbers (None if it printed none)."""
    found = FINAL.search(text)
    if not found:
        return None
    return {"accuracy": float(found["accuracy"]), "loss": float(found["loss"]), "steps": int(found["steps"]),
            "seconds": float(found["seconds"])}


def run_once(tasks: list[HandTask], work: Path, timeout: float = 1800) -> dict:
    """Start every process, wait for the workers, stop the ps; wall seconds of the whole."""
    began = time.perf_counter()
    procs = []
    try:
        for task in tasks:
            log = open(work / f"{task.job_name}-{task.task_index}.log", "w")
            procs.append((task, subprocess.Popen(task.argv, cwd=REPO, env={**os.environ, **dict(task.env)},
                                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)))
            log.close()
        codes = {}
        for task, proc in procs:
            if task.job_name == "worker":
                codes[f"worker:{task.task_index}"] = proc.wait(timeout=timeout)
    finally:
        for task, proc in procs:                # the ps, and anything left after a failure
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    wall = time.perf_counter() - began
    final = parse_final((work / "worker-0.log").read_text())
    return {"wall_seconds": wall, "exit_codes": codes, "final": final}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--port-base", type=int, default=39300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pscluster-byhand-") as work:
        result = run_once(plan_tasks(args.ps, args.workers, args.port_base, args.steps), Path(work))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"by hand: {result['wall_seconds']:.1f} s, exit codes {result['exit_codes']}, final {result['final']}")
    return 0 if result["final"] and all(code == 0 for code in result["exit_codes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
