"""Time from ``sbatch`` to the first training step, against the same cluster over SSH (issue 13).

Builds both labs once (not timed): a real Slurm 22.05 with two nodes (testbed/slurmlab.py)
and a two-host SSH lab (testbed/netlab.py), then, taking turns (Slurm first in even runs,
SSH first in odd ones):

* **Slurm**: ``sbatch --wait`` of the script ``pscluster export LAB_INVENTORY --format sbatch``
  writes (``up --slurm``, ``train``, ``down`` inside the job);
* **SSH**: ``pscluster up LAB_INVENTORY`` then ``pscluster train`` then ``down``, as a user types them.

The layout is the same on both sides (async: chief on node 1, one ps and one worker on each
of the two nodes; the batch script's ``up --slurm --ps 2 --workers-per-node 1`` is exported
from the SSH inventory), as are the job (distributed_mnist, the MLP, ``--steps``), and
``OMP_NUM_THREADS=1``.

"First training step" is the same on both sides: the ``ts`` of the leader's (``chief:0``)
``start`` event in its events file (roles/events.py): the trainer has connected to the cluster,
created the model's variables on the ps tasks and restored nothing; its training loop (the
workers' datasets, tracing, step 1) starts next. The clock starts just
before ``sbatch`` / ``pscluster up``. ``up`` is the time ``up`` reports for itself
("is up in N s"); "end of training" is the leader's ``done`` event (``sbatch --wait`` polls with
growing intervals, so the moment it returns says little). Medians of ``--runs`` (default 2);
root needed (network namespaces).

Usage: ``python -m benchmarks.slurm_start [--runs 2] [--steps 200] [--json]``
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import print_columns  # noqa: E402
from cluster.layout import HostLayout  # noqa: E402
from testbed.netlab import Lab, write_inventory  # noqa: E402
from testbed.slurmlab import SlurmLab, missing_tools  # noqa: E402

GROUPS = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-1", "node-2"]}
JOB_ENV = {"OMP_NUM_THREADS": "1", "MNIST_MODEL": "mlp"}


def leader_ts(name: str, kind: str = "start") -> float:
    """The time of the leader's first ``kind`` event in cluster ``name`` (its events under the checkout)."""
    run_dir = HostLayout(str(REPO), name).run_dir       # the local hosts' workdir is this checkout
    for path in sorted(glob.glob(f"{run_dir}/job-*/chief-0.1.events.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == kind:
                    return float(event["ts"])
    raise RuntimeError(f"no {kind} event of chief:0 under {run_dir}")


def up_seconds(text: str) -> float | None:
    match = re.search(r"is up in ([0-9.]+) s", text)
    return float(match.group(1)) if match else None


def _pscluster(args: list, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "cluster", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"pscluster {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def slurm_run(slurm: SlurmLab, inventory: Path, work: Path, name: str, steps: int) -> dict:
    work.mkdir(parents=True)
    env = dict(slurm.env, **JOB_ENV, PSCLUSTER_STATE_DIR=str(work / "state"), NO_COLOR="1", COLUMNS="200")
    script = work / "job.sh"
    _pscluster(["export", inventory, "--format", "sbatch", "--name", name, "--steps", steps, "--time", "0:20:00",
                "-o", script], env)
    began = time.time()
    batch = subprocess.run(["sbatch", "--wait", "--parsable", "-o", str(work / "out-%j.txt"), str(script)],
                           cwd=work, env=env, capture_output=True, text=True, timeout=900)
    job = batch.stdout.strip().split(";")[0]
    output = (work / f"out-{job}.txt").read_text() if job else ""
    if batch.returncode != 0:
        raise RuntimeError(f"batch job {job} failed ({batch.returncode}):\n{output[-3000:]}{batch.stderr}")
    return {"first_step": leader_ts(name) - began, "up": up_seconds(output), "done": leader_ts(name, "done") - began}


def ssh_run(inventory: Path, work: Path, name: str, steps: int) -> dict:
    work.mkdir(parents=True)
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(work / "state"), NO_COLOR="1", COLUMNS="200")
    began = time.time()
    up = _pscluster(["up", inventory, "--name", name], env)
    try:
        _pscluster(["train", "distributed_mnist", "--name", name, "--steps", steps], env)
    finally:
        subprocess.run([sys.executable, "-m", "cluster", "down", "--name", name], cwd=REPO, env=env,
                       capture_output=True, timeout=300)
    return {"first_step": leader_ts(name) - began, "up": up_seconds(up.stderr), "done": leader_ts(name, "done") - began}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slurm_start", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per side, taking turns (default 2)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of each run (default 200)")
    parser.add_argument("--json", action="store_true", help="also print every figure as JSON")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or missing_tools():
        raise SystemExit(f"needs root and Slurm's tools (missing: {', '.join(missing_tools()) or 'none'}); "
                         "run scripts/bootstrap.sh")
    results: dict[str, list[dict]] = {"slurm": [], "ssh": []}
    tag = f"slst{os.getpid() % 10000}"
    with tempfile.TemporaryDirectory(prefix="pscluster-slurm-start-") as tmp:
        work = Path(tmp)
        slurm = SlurmLab(nodes=2, gpus=2)
        try:
            slurm.start()
            with Lab(2, work / "lab", subnet="auto") as lab:
                inventory = write_inventory(lab, work / "lab.yaml", GROUPS, {
                    "pscluster_workdir": str(REPO), "pscluster_port_base": 38600, "pscluster_mode": "async",
                    "pscluster_env": JOB_ENV})
                for run in range(args.runs):
                    order = ("slurm", "ssh") if run % 2 == 0 else ("ssh", "slurm")
                    for side in order:
                        name = f"{tag}-{side}{run}"
                        try:
                            if side == "slurm":
                                result = slurm_run(slurm, inventory, work / name, name, args.steps)
                            else:
                                result = ssh_run(inventory, work / name, name, args.steps)
                        finally:
                            shutil.rmtree(HostLayout(str(REPO), name).run_dir, ignore_errors=True)
                        results[side].append(result)
                        print(f"run {run + 1} {side:5}: first step {result['first_step']:.1f} s "
                              f"(up {result['up']} s, done {result['done']:.1f} s)", flush=True)
        finally:
            slurm.stop()
    summary = {side: {key: statistics.median(r[key] for r in runs if r[key] is not None)
                      for key in ("first_step", "up", "done")} for side, runs in results.items()}
    rows = [[what, f"{summary['slurm'][key]:.1f}", f"{summary['ssh'][key]:.1f}",
             f"{summary['slurm'][key] / summary['ssh'][key]:.2f}"]
            for what, key in (("to the first training step", "first_step"), ("  of which `up` (its own figure)", "up"),
                              (f"to the end of training ({args.steps} steps)", "done"))]
    print(f"\nmedians of {args.runs} run(s) per side, seconds (async, chief + 2 ps + 2 workers on 2 nodes, "
          f"MLP, {args.steps} steps)")
    print_columns(["from sbatch / pscluster up", "Slurm (sbatch)", "SSH (up + train)", "Slurm / SSH"], rows)
    document = {"runs": results, "medians": summary, "steps": args.steps}
    if args.json:
        print(json.dumps(document, indent=2))
    return document


if __name__ == "__main__":
    main()
