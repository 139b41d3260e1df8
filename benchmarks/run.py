"""Run pscluster's benchmarks and print one summary table.

``python -m benchmarks [--only lifecycle,overhead,run_overhead,training,onednn,standby,soak] [--quick] [--out results.json]``

Each benchmark runs in its own process (``python -m benchmarks.<name> --json``) so a crash or a
leak in one cannot skew another; run them on an otherwise idle machine. ``--quick`` shrinks the
budgets (for checking the scripts, not for figures). The soak (20 cycles, ~20 minutes) runs only
when asked for with ``--only soak`` or ``--only all``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import print_columns

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ("lifecycle", "overhead", "run_overhead", "training", "onednn", "standby")
ARGS = {
    "lifecycle": (["--runs", "5"], ["--runs", "2"]),
    "overhead": (["--runs", "3", "--steps", "0"], ["--runs", "1", "--steps", "60", "--modes", "sync"]),
    "run_overhead": (["--rounds", "3"], ["--rounds", "1", "--steps", "100"]),
    "training": ([], ["--runs", "1", "--quick"]),
    "onednn": (["--modes", "async,sync,sync-ps"], ["--quick", "--modes", "sync"]),
    "standby": ([], ["--quick", "--modes", "async"]),
    "soak": (["--cycles", "20"], ["--cycles", "2"]),
}


def _run(name: str, quick: bool) -> dict:
    argv = [sys.executable, "-m", f"benchmarks.{name}", "--json", *ARGS[name][1 if quick else 0]]
    began = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1], "seconds": seconds}
    return dict(json.loads(proc.stdout), seconds=seconds)


def _rows(name: str, result: dict) -> list[tuple[str, str, str, str]]:
    """(benchmark, figure, measured, goal) rows for the summary."""
    if "error" in result:
        return [(name, "failed", result["error"][:80], "")]
    if name == "lifecycle":
        return [
            ("up vs bare ssh (3 hosts, 5 servers)", "ratio of medians",
             f"{result['up_ratio']:.2f} ({result['up_median']:.1f} s / {result['bare_median']:.1f} s)", "<= 1.15"),
            ("down", "median time, leftovers", f"{result['down_median']:.2f} s, {result['leftovers_total']}", "0 left"),
            ("preflight fan-out", "64 hosts / 4 hosts",
             f"{result['preflight_ratio']:.2f} ({result['preflight_64_median']:.2f} s / "
             f"{result['preflight_4_median']:.2f} s)", "<= 2"),
            ("preflight, 64 hosts", "wall / CPU floor (all hosts share this machine)",
             f"{result['preflight_64_median'] / result['preflight_64_cpu_floor_seconds']:.2f} "
             f"({result['preflight_64_busy_cpu_seconds']:.1f} CPU-s on {result['cpus']} CPUs)", ""),
            ("preflight fan-out, projected", "64 real hosts / 4 hosts",
             f"{result['preflight_projected_ratio']:.2f} ({result['preflight_64_projected_seconds']:.2f} s)", "<= 2"),
        ]
    if name == "overhead":
        rows = []
        for mode, row in result.items():
            if isinstance(row, dict) and "ratio" in row:
                budget = f"{row['steps']} steps" if row["steps"] else "whole default job"
                rows.append((f"train overhead ({mode}, {budget})", "pscluster / by hand",
                             f"{row['ratio']:.3f} ({row['pscluster_median']:.1f} s / {row['hand_median']:.1f} s)",
                             "<= 1.05"))
                rows.append((f"train overhead ({mode}), outside the trainer", "seconds pscluster adds -> ratio",
                             f"{row['added_seconds']:.2f} s -> {row['ratio_without_noise']:.3f}", "<= 1.05"))
        return rows
    if name == "run_overhead":
        return [(f"pscluster run overhead (TF1 example, {result['steps']} steps)", "run / by hand (medians)",
                 f"{result['ratio']:.3f} ({result['run_median_seconds']:.1f} s / "
                 f"{result['hand_median_seconds']:.1f} s)", "<= 1.05"),
                ("pscluster run overhead, outside the training", "seconds run adds -> ratio",
                 f"{result['added_seconds']:.2f} s -> {result['ratio_without_noise']:.3f}", "<= 1.05")]
    if name == "soak":
        return [("soak", f"{result['cycles']} cycles up/train/down", f"{result['leaks_total']} leaks", "0")]
    if name == "onednn":
        return [(f"oneDNN on vs off ({mode}, {result['config']['model']})", "steps/s on / off",
                 f"{row['ratio']:.2f} ({row['1']['steps_per_second']:.1f} / {row['0']['steps_per_second']:.1f})"
                 if row["ratio"] is not None else "n/a", "")
                for mode, row in result["modes"].items()]
    if name == "standby":
        return [(f"train with standbys vs without ({mode}, {result['config']['steps']} steps)",
                 "launch to exit, standby / afresh (medians)",
                 f"{row['ratio']:.3f} ({row['standby']['seconds']:.1f} s / {row['afresh']['seconds']:.1f} s, "
                 f"{row['saved_seconds']:.1f} s sooner)" if row["ratio"] is not None else "n/a", "")
                for mode, row in result["modes"].items()]
    if name == "training":
        return [(row["name"], row["figure"], row["measured"], row.get("goal", ""))
                for row in result.get("summary", [])]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(DEFAULT), help="comma list, or 'all' (adds the soak)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: check the scripts, not for figures")
    parser.add_argument("--out", help="write every result as JSON here")
    args = parser.parse_args(argv)
    names = list(ARGS) if args.only == "all" else args.only.split(",")
    results = {}
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results[name] = _run(name, args.quick)
    rows = [row for name in names for row in _rows(name, results[name])]
    print_columns(("benchmark", "figure", "measured", "goal"), rows)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 1 if any("error" in result for result in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
