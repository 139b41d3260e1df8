"""The TF1 example started by hand, as people do without pscluster: one process per ps and
worker with ``--ps_hosts/--worker_hosts/--job_name/--task_index``, wait for the workers, then
kill the parameter servers (which never exit by themselves).

Same program (examples/byo/tf1_flags.py), interpreter, ports and environment as
``pscluster run inventories/local.yaml --on ps,worker --port-base N`` gives each task, taken
from pscluster's own plan of the inventory: pscluster's task defaults (cluster/plan.py
``BASE_ENV``), the inventory's ``pscluster_env``, the plan's ``CUDA_VISIBLE_DEVICES`` mask
("" for the ps). Left out, as a person typing the commands would: ``TF_CONFIG`` and the
``PSCLUSTER_*`` variables (the TF1 script reads its flags only). Used by
benchmarks/run_overhead.py; alone:

    python -m benchmarks.byhand [--inventory inventories/local.yaml] [--steps 2000] [--port-base 39300] [--json]
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
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster

LOCAL = REPO / "inventories" / "local.yaml"

PROGRAM = "examples/byo/tf1_flags.py"
FINAL = re.compile(r"final test_accuracy=(?P<accuracy>[0-9.]+) test_loss=(?P<loss>[0-9.naif]+) "
                   r"steps=(?P<steps>\d+) seconds=(?P<seconds>[0-9.]+)")


@dataclass(frozen=True)
class HandTask:
    job_name: str
    task_index: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def plan_tasks(inventory: Path, port_base: int, steps: int, python: str = sys.executable) -> list[HandTask]:
    """The command line and environment of every ps and worker process, ps first, as
    ``pscluster run INVENTORY --on ps,worker --port-base PORT_BASE`` would start them here."""
    plan = plan_cluster(load_inventory(str(inventory)), PlanOptions(
        local_python=python, local_workdir=str(REPO), port_base=port_base, roles=("ps", "worker")))
    spec = plan.cluster_spec
    tasks = []
    for task in (*plan.tasks_of("ps"), *plan.tasks_of("worker")):
        host = plan.host(task.host)
        if not host.is_local:
            raise ValueError(f"{inventory}: host {host.name} is not local; by hand here means on this machine")
        env = {key: value for key, value in task.env if key != "TF_CONFIG" and not key.startswith("PSCLUSTER_")}
        argv = (host.python, PROGRAM, f"--ps_hosts={','.join(spec['ps'])}",
                f"--worker_hosts={','.join(spec['worker'])}", f"--job_name={task.role}",
                f"--task_index={task.index}", "--steps", str(steps))
        tasks.append(HandTask(task.role, task.index, argv, tuple(sorted(env.items()))))
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
    parser.add_argument("--inventory", type=Path, default=LOCAL, help="local hosts only (default: local.yaml)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--port-base", type=int, default=39300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pscluster-byhand-") as work:
        result = run_once(plan_tasks(args.inventory, args.port_base, args.steps), Path(work))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"by hand: {result['wall_seconds']:.1f} s, exit codes {result['exit_codes']}, final {result['final']}")
    return 0 if result["final"] and all(code == 0 for code in result["exit_codes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
