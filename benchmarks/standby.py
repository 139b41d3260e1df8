"""Standbys on vs off: what a standby (roles/standby.py) saves each ``pscluster train``.

Two local clusters of the same shape per mode, one with ``pscluster_standby: false``; runs of
``pscluster train distributed_mnist --steps N`` alternate between them. Before each run on the
standby cluster the benchmark waits until ``pscluster status`` reports its standbys ready
(TensorFlow imported), as a user who reads the last result before the next ``train`` would;
the wait is shown, not counted. Printed per mode: median seconds from launching ``train`` to its
exit on each side, their ratio and difference, and the steps/s (which a standby must not
change).

Usage: ``python -m benchmarks.standby [--modes async,sync,sync-ps] [--runs 3] [--steps 1200]
[--json] [--out FILE]``. Clusters use ports 39200-39299 and are always brought down.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import print_columns, twin_main, twin_parser
from benchmarks.training import (ClusterShape, Twin, _fmt, alternate_twins, median, ratio,
                                 report_steps_per_second)

# The part-4 shapes of benchmarks/training.py (inventories/local.yaml's for async and sync-ps).
SHAPES = {"async": ClusterShape("async-2ps-2w", "async", 1, 2, 2, 0),
          "sync": ClusterShape("sync-2w", "sync", 0, 0, 2, 10),
          "sync-ps": ClusterShape("sync-ps-2ps-2w", "sync-ps", 0, 2, 2, 20)}
SIDES = (True, False)       # standby first, then afresh


def compare(runs: dict[bool, list[dict]]) -> dict[str, Any]:
    """Medians per side, and standby / afresh of the launch-to-exit seconds."""
    out: dict[str, Any] = {}
    for side in SIDES:
        rows = runs.get(side, [])
        out["standby" if side else "afresh"] = {
            "seconds": median([r["seconds"] for r in rows]),
            "steps_per_second": median([r["steps_per_second"] for r in rows]),
            "runs": [r["seconds"] for r in rows], "waits": [r.get("wait") for r in rows]}
    standby, afresh = out["standby"]["seconds"], out["afresh"]["seconds"]
    out["ratio"] = ratio(standby, afresh)
    out["saved_seconds"] = round(afresh - standby, 2) if standby is not None and afresh is not None else None
    return out


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = {"OMP_NUM_THREADS": "1"}
    twins = [Twin("standby" if side else "afresh", "standby" if side else "afresh", env, standby=side,
                  wait_standbys=True) for side in SIDES]
    results: dict[str, Any] = {}
    for mode in args.modes:
        runs = alternate_twins(args, work, SHAPES[mode], twins)
        results[mode] = compare({side: [{"seconds": r["seconds"], "wait": r["wait"],
                                         "steps_per_second": report_steps_per_second(r["report"], args.batch_size)}
                                        for r in rows] for side, rows in zip(SIDES, runs)})
    return results


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"standbys on vs off: `pscluster train distributed_mnist --steps {args.steps}`, launch to exit, "
          f"{args.runs} alternated run(s) per side (medians)")
    header = ("mode", "standby: s", "afresh: s", "standby / afresh", "saved", "steps/s standby", "steps/s afresh")
    rows = []
    for mode, r in results.items():
        rows.append((mode, _fmt(r["standby"]["seconds"], digits=2), _fmt(r["afresh"]["seconds"], digits=2),
                     _fmt(r["ratio"], digits=3), _fmt(r["saved_seconds"], " s", digits=2),
                     _fmt(r["standby"]["steps_per_second"]), _fmt(r["afresh"]["steps_per_second"])))
    print_columns(header, rows)


def build_parser() -> argparse.ArgumentParser:
    return twin_parser("python -m benchmarks.standby", __doc__.split("\n\n")[0], modes="async,sync,sync-ps",
                       runs=3, steps=1200, port_base=39200)


def main(argv: list[str] | None = None) -> dict:
    return twin_main(build_parser().parse_args(argv), SHAPES, measure, print_table, prefix="pscluster-standby-",
                     config={})


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
