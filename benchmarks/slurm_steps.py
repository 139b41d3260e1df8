"""How many Slurm job steps pscluster makes per phase as the allocation grows (issue 46: "the same
loop on Slurm: how many job steps a 256-node allocation needs for `up` and for watching, and
whether it stays within Slurm's default limits").

On slurm hosts every command pscluster sends is a step of the job (cluster/transport/slurm.py):
a short one per status, stop, read or file write, a long-lived one per started task (the step
holds hostctl's monitor) and per watch stream. This script counts them on a real Slurm 22.05
(testbed/slurmlab.py) for allocations of each ``--nodes`` size, with the many-hosts lab's
stand-in servers (testbed/standin.py, through the same ``pscluster_python`` wrapper) so that no
TensorFlow runs: a sync-ps cluster with a ps (a standing server) and a worker on every node; the
job is a ``pscluster run`` of ``standin.py program`` on the workers, supervised ``--watch``
seconds, then Ctrl-C. Per phase (``check``, ``up``, ``status``, ``run``, ``down``):

* **steps made**: Slurm numbers a job's steps from 0 in order, so a one-line probe step on the
  first node before and after a phase (``echo $SLURM_STEP_ID``) brackets what the phase made;
* **peak running steps** (``squeue --steps``) and **peak srun clients** on this machine (each
  long-lived step is an ``srun`` process here), with their summed RSS, sampled twice a second.

Then a line ``a + b*N`` per figure (the counts are exact), the figures at 256 and 1,000 nodes,
and Slurm's limits from ``scontrol show config`` (MaxStepCount is per job).

Usage (root): ``python -m benchmarks.slurm_steps [--nodes 2,4,8] [--watch 20] [--json]``.
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
from pathlib import Path
from typing import Any, Sequence

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import scalefit  # noqa: E402
from benchmarks.common import print_columns  # noqa: E402
from testbed.manylab import STANDIN, write_standin_python  # noqa: E402
from testbed.procs import cluster_pids  # noqa: E402
from testbed.slurmlab import SlurmLab, missing_tools  # noqa: E402

PHASES = ("check", "up", "status", "run", "down")
FIGURES = ("steps", "running", "sruns", "srun_mb")
PROJECT_TO = (256, 1000)
LIMIT_KEYS = ("MaxStepCount", "MaxJobCount", "MaxTasksPerNode", "MaxArraySize")


def step_counter(lab: SlurmLab, job: str, node: str) -> int:
    """The id of a new one-line step on ``node``: how many steps the job has made so far."""
    out = subprocess.run(["srun", f"--jobid={job}", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--overlap",
                          "sh", "-c", "echo $SLURM_STEP_ID"], env=lab.env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip().isdigit():
        raise RuntimeError(f"probe step failed ({out.returncode}): {out.stderr.strip()}")
    return int(out.stdout.strip())


def running_steps(lab: SlurmLab, job: str) -> int:
    out = subprocess.run(["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i"], env=lab.env,
                         capture_output=True, text=True, timeout=30)
    return len([line for line in out.stdout.split() if line.startswith(f"{job}.")])


def srun_clients(job: str) -> tuple[int, float]:
    """``srun`` processes of ``job`` on this machine and their summed RSS (MB)."""
    count, rss_kb = 0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as handle:
                if handle.read().strip() != "srun":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if f"--jobid={job}".encode() not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/status") as handle:
                rss = re.search(r"^VmRSS:\s+(\d+)", handle.read(), re.M)
        except OSError:
            continue
        count += 1
        rss_kb += int(rss.group(1)) if rss else 0
    return count, rss_kb / 1024


def write_inventory(path: Path, nodes: Sequence[str], *, python: Path, workdir: Path, port_base: int) -> Path:
    """A sync-ps cluster on ``nodes``: a ps and a worker on each, as ``up --slurm`` writes hosts."""
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"pscluster_python": str(python), "pscluster_workdir": str(workdir), "pscluster_mode": "sync-ps",
                 "pscluster_standby": False, "pscluster_port_base": port_base},
        "hosts": {node: {"ansible_connection": "slurm"} for node in nodes},
        "children": {"ps": {"hosts": {node: {} for node in nodes}},
                     "worker": {"hosts": {node: {} for node in nodes}}}}}, sort_keys=False))
    return path


def run_phase(lab: SlurmLab, job: dict[str, str], argv: Sequence[str], state: Path, *,
              interrupt_after: float | None = None, timeout: float = 900) -> dict[str, Any]:
    """``pscluster ARGV`` inside the allocation (as from a login node), sampled every 0.5 s."""
    env = dict(lab.env, **job, PSCLUSTER_STATE_DIR=str(state), NO_COLOR="1", COLUMNS="200")
    began = time.monotonic()
    proc = subprocess.Popen(lab.login_shell() + [sys.executable, "-m", "cluster", *argv], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = {"running": 0.0, "sruns": 0.0, "srun_mb": 0.0}
    interrupted = False
    while proc.poll() is None:
        now = time.monotonic() - began
        sruns, srun_mb = srun_clients(job["SLURM_JOB_ID"])
        for key, value in (("running", running_steps(lab, job["SLURM_JOB_ID"])), ("sruns", sruns),
                           ("srun_mb", srun_mb)):
            peak[key] = max(peak[key], value)
        if interrupt_after is not None and not interrupted and now >= interrupt_after:
            proc.send_signal(signal.SIGINT)
            interrupted = True
        if now > timeout:
            proc.kill()
        time.sleep(0.5)
    output = proc.stdout.read().decode(errors="replace") if proc.stdout is not None else ""
    return {"wall_s": time.monotonic() - began, "rc": proc.returncode, **peak, "output_tail": output[-1500:]}


def run_size(lab: SlurmLab, n: int, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    job = lab.salloc(f"-N{n}", "--ntasks-per-node=1")
    job_id = job["SLURM_JOB_ID"]
    nodes = lab.expand(job["SLURM_JOB_NODELIST"])
    name = f"steps{n}"
    state = work / f"state{n}"
    inventory = write_inventory(work / f"{name}.yaml", nodes, python=work / "bin" / "python",
                                workdir=work / f"work{n}", port_base=args.port_base)
    program = ["--", "python", str(STANDIN), "program", "--every", "1"]
    phases = [("check", ["check", str(inventory), "--name", name], None),
              ("up", ["up", str(inventory), "--name", name], None),
              ("status", ["status", "--name", name], None),
              ("run", ["run", "--name", name, "--on", "worker", "--grace", "2", *program], args.watch),
              ("down", ["down", "--name", name, "--grace", "2"], None)]
    rows: list[dict[str, Any]] = []
    try:
        before = step_counter(lab, job_id, nodes[0])
        for phase, argv, interrupt in phases:
            row = run_phase(lab, job, argv, state, interrupt_after=interrupt)
            after = step_counter(lab, job_id, nodes[0])
            row.update(nodes=n, phase=phase, steps=after - before - 1)
            before = after
            if phase == "down":
                row["left"] = len(cluster_pids(name))
            rows.append(row)
            print(f"  {n:>3} {phase:<6} {row['wall_s']:6.1f} s  steps {row['steps']:4}  running {row['running']:.0f}"
                  f"  srun {row['sruns']:.0f} ({row['srun_mb']:.0f} MB)  rc {row['rc']}", file=sys.stderr, flush=True)
            if row["rc"] not in (0, 130):
                print(row["output_tail"], file=sys.stderr)
                if phase in ("check", "up"):
                    raise RuntimeError(f"pscluster {phase} on {n} nodes failed")
    finally:
        if not rows or rows[-1]["phase"] != "down":
            run_phase(lab, job, ["down", "--name", name, "--now"], state)
        subprocess.run(["scancel", job_id], env=lab.env, capture_output=True, timeout=60)
    return rows


def slurm_limits(lab: SlurmLab) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "config"], env=lab.env, capture_output=True, text=True, timeout=30)
    found = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in LIMIT_KEYS:
            found[key.strip()] = value.strip()
    return found


def report(rows: Sequence[dict[str, Any]], limits: dict[str, str]) -> None:
    sizes = sorted({row["nodes"] for row in rows})
    print_columns(["nodes", "phase", "wall s", "steps made", "peak running steps", "peak srun clients",
                   "their RSS MB", "left"],
                  [[row["nodes"], row["phase"], f"{row['wall_s']:.1f}", row["steps"], f"{row['running']:.0f}",
                    f"{row['sruns']:.0f}", f"{row['srun_mb']:.0f}", row.get("left", "")] for row in rows])
    print()
    header = ["phase", "figure", "fit (N nodes)"] + [f"{n:,} nodes" for n in PROJECT_TO]
    lines = []
    for phase in PHASES:
        for figure in FIGURES:
            points = [(float(row["nodes"]), float(row[figure])) for row in rows if row["phase"] == phase]
            if len(points) < 2 or len(sizes) < 2:
                continue
            fit = scalefit.fit_linear([x for x, _ in points], [y for _, y in points])
            a, b = fit.a, fit.b
            lines.append([phase, figure, f"{a:.1f} + {b:.2f}*N"] + [f"{a + b * n:,.0f}" for n in PROJECT_TO])
    print_columns(header, lines)
    print()
    print("Slurm's limits here (scontrol show config): "
          + ", ".join(f"{key}={value}" for key, value in limits.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slurm_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2,4,8", help="comma list of allocation sizes (default 2,4,8)")
    parser.add_argument("--watch", type=float, default=20.0, help="seconds the run is supervised per size")
    parser.add_argument("--port-base", type=int, default=39400)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or missing_tools():
        raise SystemExit(f"needs root and Slurm's tools (missing: {', '.join(missing_tools()) or 'none'})")
    sizes = sorted({int(s) for s in args.nodes.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > 64:
        raise SystemExit("--nodes: sizes from 1 to 64")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pscluster-slurm-steps-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        write_standin_python(work / "bin" / "python")
        lab = SlurmLab(nodes=sizes[-1], gpus=1)
        try:
            lab.start()
            limits = slurm_limits(lab)
            for n in sizes:
                rows += run_size(lab, n, work, args)
        finally:
            lab.stop()
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in row.items() if k != "output_tail"} for row in rows],
                          "limits": limits}, indent=1))
    else:
        report(rows, limits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
