"""What the benchmark scripts share: running the real ``pscluster`` CLI and timing it, and
printing a plain text table."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent


def cli(args, state_dir: Path, *, timeout: float = 1200, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``pscluster ARGS`` as a user would; returns (wall seconds, completed process)."""
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1")
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cluster", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - began
    if check and proc.returncode != 0:
        raise RuntimeError(f"pscluster {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return elapsed, proc


def stop_train(train: subprocess.Popen) -> None:
    """End a ``train`` process still running as Ctrl-C would (its cleanup runs), killed after 120 s."""
    if train.poll() is None:
        train.send_signal(signal.SIGINT)
        try:
            train.wait(120)
        except subprocess.TimeoutExpired:
            train.kill()
            train.wait()


def down_counting_left(name: str, state_dir: Path) -> tuple[subprocess.CompletedProcess, int]:
    """``down --grace 3`` (``--now`` after it if it failed), then the processes of cluster
    ``name`` still there after up to 20 s: (the first ``down``, how many are left)."""
    from testbed.procs import cluster_pids
    _, down = cli(["down", "--name", name, "--grace", "3"], state_dir, check=False)
    if down.returncode != 0:
        cli(["down", "--name", name, "--now"], state_dir, check=False)
    end = time.monotonic() + 20
    while cluster_pids(name) and time.monotonic() < end:
        time.sleep(0.2)
    return down, len(cluster_pids(name))


def process_cpu_seconds(pid: int) -> float:
    """A process's CPU seconds so far, its threads' user and system time (from /proc)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")      # utime, stime


def print_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` under ``header`` in left-aligned columns, with a dashed rule under the header."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def env_pair(text: str) -> tuple[str, str]:
    """argparse type for ``--env KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def twin_parser(prog: str, description: str, *, modes: str, runs: int, steps: int,
                port_base: int) -> argparse.ArgumentParser:
    """The options of a benchmark comparing two settings on twin local clusters, per mode
    (benchmarks/onednn.py, benchmarks/standby.py)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--modes", default=modes, help=f"comma list of async, sync, sync-ps (default {modes})")
    p.add_argument("--runs", type=int, default=runs, help=f"alternated runs per setting (default {runs})")
    p.add_argument("--steps", type=int, default=steps, help=f"training steps per run (default {steps})")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--port-base", type=int, default=port_base, help=f"first of 100 ports (default {port_base})")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--quick", action="store_true", help="tiny budget: checks the script, gives no figures")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out")
    return p


def twin_main(args: argparse.Namespace, shapes: Mapping[str, Any],
              measure: Callable[[argparse.Namespace, Path], dict[str, Any]],
              print_table: Callable[[dict[str, Any], argparse.Namespace], None], *,
              prefix: str, config: dict[str, Any]) -> dict:
    """Check ``--modes``, measure in a temporary folder, then print the table or the JSON
    document (``{"modes": ..., "config": ...}``) and write it to ``--out``."""
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in shapes]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; choose from {sorted(shapes)}")
    if args.runs < 1 or args.steps < 64:
        raise SystemExit("need --runs >= 1 and --steps >= 64")
    if args.quick:
        args.runs, args.steps = 1, 64
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        results = {"modes": measure(args, Path(tmp)),
                   "config": dict(config, runs=args.runs, steps=args.steps, global_batch_size=args.batch_size,
                                  cpus=os.cpu_count())}
    results["config"]["seconds"] = round(time.perf_counter() - began, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print_table(results["modes"], args)
    return results
