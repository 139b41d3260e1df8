"""Orchestration overhead (issue 5): total wall time of ``pscluster train distributed_mnist``
against the same training started by hand on the same cluster: a shell script that sets
TF_CONFIG and CUDA_VISIBLE_DEVICES per process, starts each training process in the
background and waits for all of them, as people do today. Same arguments, same checkpoint
cadence, alternating runs; medians and their ratio per mode (goal <= 1.05).

Usage: ``python -m benchmarks.overhead [--runs 3] [--steps 200] [--modes sync,async] [--json]``
(``--steps 0``: the job's default budget, i.e. the whole ``pscluster train distributed_mnist``)
(a local cluster from inventories/local.yaml on free ports).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, cli


def hand_script(plan: dict, steps: int, checkpoint_dir: str, work: Path) -> str:
    """The shell script a person writes: one background process per training task, then wait."""
    lines = ["#!/bin/sh", "# started by hand: one line per process, as in the classic tutorials", "set -e",
             f"cd {shlex.quote(str(REPO))}"]
    for task in plan["tasks"]:
        if task["standing"]:
            continue
        env = task["env"]
        mask = f"CUDA_VISIBLE_DEVICES={shlex.quote(env['CUDA_VISIBLE_DEVICES'])} " \
            if "CUDA_VISIBLE_DEVICES" in env else ""
        extra = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()
                         if k not in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES"))
        events = work / f"hand-{task['role']}-{task['index']}.jsonl"
        argv = list(task["argv"]) + ["--job", "examples/distributed_mnist", "--events", str(events),
                                     "--checkpoint-dir", checkpoint_dir, "--start-timeout", "180",
                                     *_budget(steps)]
        if plan["mode"] == "sync":
            argv += ["--collective-timeout", "30"]
        lines.append(f"{mask}TF_CONFIG={shlex.quote(env['TF_CONFIG'])} {extra} "
                     f"{' '.join(map(shlex.quote, argv))} > {work}/hand-{task['role']}-{task['index']}.log 2>&1 &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def measure(mode: str, runs: int, steps: int, work: Path, port_base: int) -> dict:
    state_dir = work / f"state-{mode}"
    name = f"overhead-{mode}"
    cli(["up", REPO / "inventories/local.yaml", "--name", name, "--mode", mode, "--port-base", port_base],
         state_dir)
    try:
        _, plan_proc = cli(["plan", REPO / "inventories/local.yaml", "--name", name, "--mode", mode,
                             "--port-base", port_base, "--json"], state_dir)
        plan = json.loads(plan_proc.stdout)
        ours, hand, ours_outside, hand_outside, accuracy = [], [], [], [], []
        for run in range(runs):
            for which in (("pscluster", "hand") if run % 2 == 0 else ("hand", "pscluster")):
                checkpoints = str(work / f"ckpt-{mode}-{which}-{run}")
                if which == "pscluster":
                    elapsed, proc = cli(["train", "distributed_mnist", "--name", name, *_budget(steps),
                                          "--checkpoint-dir", checkpoints, "--json"], state_dir)
                    report = json.loads(proc.stdout)
                    ours.append(elapsed)
                    ours_outside.append(elapsed - report["train_seconds"])
                    accuracy.append(report.get("val_accuracy"))
                else:
                    script = work / f"hand-{mode}.sh"
                    script.write_text(hand_script(plan, steps, checkpoints, work))
                    began = time.perf_counter()
                    proc = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=1200)
                    hand.append(time.perf_counter() - began)
                    if proc.returncode != 0:
                        raise RuntimeError(f"hand-started training failed:\n{proc.stderr}")
                    hand_outside.append(hand[-1] - _process_wall(work / "hand-chief-0.jsonl"
                                                                 if mode == "async" else work / "hand-worker-0.jsonl"))
    finally:
        cli(["down", "--name", name], state_dir)
    added = statistics.median(ours_outside) - statistics.median(hand_outside)
    return {"mode": mode, "steps": steps, "pscluster_seconds": ours, "hand_seconds": hand,
            "pscluster_median": statistics.median(ours), "hand_median": statistics.median(hand),
            "ratio": statistics.median(ours) / statistics.median(hand),
            "pscluster_outside_seconds": ours_outside, "hand_outside_seconds": hand_outside,
            "pscluster_val_accuracy": accuracy, "added_seconds": added, "ratio_without_noise": (statistics.median(hand) + added) / statistics.median(hand)}


def _budget(steps: int) -> list[str]:
    """``--steps N``, or nothing for 0: the job's own default budget (distributed_mnist: 4 epochs)."""
    return ["--steps", str(steps)] if steps else []


def _process_wall(events: Path) -> float:
    """The training process's own wall time, from its ``done`` event."""
    for line in reversed(events.read_text().splitlines()):
        event = json.loads(line)
        if event.get("event") == "done":
            return event["wall_seconds"]
    raise RuntimeError(f"{events}: no done event")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200,
                        help="step budget per run; 0 = the job's default (the full distributed_mnist run)")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="pscluster-overhead-") as tmp:
        for offset, mode in enumerate(args.modes.split(",")):
            results[mode] = measure(mode, args.runs, args.steps, Path(tmp), 37000 + 20 * offset)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for mode, row in results.items():
            budget = f"{row['steps']} steps" if row["steps"] else "job default"
            print(f"{mode:6s} {budget}: pscluster train {row['pscluster_median']:6.1f} s, by hand "
                  f"{row['hand_median']:6.1f} s, ratio {row['ratio']:.3f} (goal <= 1.05; medians of {args.runs})")
            print(f"       time outside the training process: pscluster adds {row['added_seconds']:.2f} s "
                  f"-> ratio without run-to-run noise {row['ratio_without_noise']:.3f}; runs (s): pscluster "
                  f"{' '.join(f'{v:.1f}' for v in row['pscluster_seconds'])}, by hand "
                  f"{' '.join(f'{v:.1f}' for v in row['hand_seconds'])}; pscluster test accuracy "
                  f"{' '.join(f'{v:.4f}' for v in row['pscluster_val_accuracy'] if v is not None)}")
    return results


if __name__ == "__main__":
    main()
