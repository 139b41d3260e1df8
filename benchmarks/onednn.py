"""oneDNN on vs off: why pscluster's tasks get ``TF_ENABLE_ONEDNN_OPTS=1`` by default.

TensorFlow turns its oneDNN CPU kernels on by itself only on CPUs with AVX-512 VNNI / AMX
class features; elsewhere (this machine's AMD EPYC, most lab CPUs of a few years) they stay
off. This benchmark trains ``distributed_mnist`` with ``pscluster train`` on two local
clusters of the same shape that differ only in ``pscluster_env: {TF_ENABLE_ONEDNN_OPTS: 1|0}``,
alternating runs, and prints steps/s per mode and the on/off ratio of the medians (and the
test accuracy, which must not suffer).

Usage: ``python -m benchmarks.onednn [--modes async,sync] [--model cnn|mlp] [--runs 2]
[--steps 400] [--json] [--out FILE]``. Clusters use ports 39100-39199 and are always brought
down.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import print_columns, twin_main, twin_parser
from benchmarks.training import (ClusterShape, Twin, _fmt, alternate_twins, median, ratio,
                                 report_steps_per_second)

SHAPES = {"async": ClusterShape("async-1ps-2w", "async", 1, 1, 2, 0),
          "sync": ClusterShape("sync-2w", "sync", 0, 0, 2, 10),
          "sync-ps": ClusterShape("sync-ps-1ps-2w", "sync-ps", 0, 1, 2, 20)}
SETTINGS = ("1", "0")           # on first, then off


def onednn_ratio(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians of steps/s and accuracy per setting, and the on/off ratio of the steps/s medians."""
    out: dict[str, Any] = {}
    for setting in SETTINGS:
        rows = runs.get(setting, [])
        out[setting] = {"steps_per_second": median([r.get("steps_per_second") for r in rows]),
                        "val_accuracy": median([r.get("val_accuracy") for r in rows]),
                        "runs": [r.get("steps_per_second") for r in rows]}
    out["ratio"] = ratio(out["1"]["steps_per_second"], out["0"]["steps_per_second"])
    return out


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    twins = [Twin(f"onednn{setting}", f"TF_ENABLE_ONEDNN_OPTS={setting}",
                  {"OMP_NUM_THREADS": "1", "MNIST_MODEL": args.model, "TF_ENABLE_ONEDNN_OPTS": setting})
             for setting in SETTINGS]
    results: dict[str, Any] = {}
    for mode in args.modes:
        runs = alternate_twins(args, work, SHAPES[mode], twins)
        results[mode] = onednn_ratio({setting: [
            {"steps_per_second": report_steps_per_second(r["report"], args.batch_size),
             "val_accuracy": r["report"].get("val_accuracy"), "seconds": r["seconds"]} for r in rows]
            for setting, rows in zip(SETTINGS, runs)})
    return results


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"oneDNN CPU kernels on vs off: {args.model}, global batch {args.batch_size}, "
          f"{args.runs} run(s) of {args.steps} steps per setting (medians)")
    header = ("mode", "on: steps/s", "off: steps/s", "on / off", "accuracy on", "accuracy off")
    rows = []
    for mode, r in results.items():
        rows.append((mode, _fmt(r["1"]["steps_per_second"]), _fmt(r["0"]["steps_per_second"]),
                     _fmt(r["ratio"], digits=2), _fmt(r["1"]["val_accuracy"], digits=4),
                     _fmt(r["0"]["val_accuracy"], digits=4)))
    print_columns(header, rows)


def build_parser() -> argparse.ArgumentParser:
    p = twin_parser("python -m benchmarks.onednn", __doc__.split("\n\n")[0], modes="async,sync", runs=2,
                    steps=400, port_base=39100)
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    return twin_main(args, SHAPES, measure, print_table, prefix="pscluster-onednn-", config={"model": args.model})


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
