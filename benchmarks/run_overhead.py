"""``pscluster run`` against the same processes started by hand (issue 11): wall time of a
one-shot ``pscluster run inventories/local.yaml --on ps,worker -- python
examples/byo/tf1_flags.py ...`` (preflight, start, live output, ps stopped, cluster taken
down: the whole command) against benchmarks/byhand.py (the same program, processes, ports
count and environment, started with subprocess; the ps killed when the workers are done).
Alternating rounds, medians and their ratio (goal <= 1.05).

Usage: ``python -m benchmarks.run_overhead [--rounds 3] [--steps 6000] [--json]`` (6000 steps: ~35 s by hand
on the 2-core test machine, so a fixed cost of a few seconds weighs as it would on a real job).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.byhand import LOCAL, PROGRAM, parse_final, plan_tasks, run_once
from benchmarks.common import cli, print_columns

PORTS = {"run": 39400, "hand": 39450}


def pscluster_once(steps: int, work: Path, round_index: int) -> dict:
    args = ["run", LOCAL, "--name", f"overhead-run-{round_index}", "--port-base",
            PORTS["run"], "--on", "ps,worker", "--json", "--", "python", PROGRAM, "--ps_hosts={ps_hosts}",
            "--worker_hosts={worker_hosts}", "--job_name={job_name}", "--task_index={task_index}",
            "--steps", steps]
    wall, proc = cli(args, work / "state")
    report = json.loads(proc.stdout)
    finals = [line for line in proc.stderr.splitlines() if line.startswith("[worker:0@")]
    return {"wall_seconds": wall, "exit_code": report["exit_code"], "final": parse_final("\n".join(finals))}


def ratio(run_walls: list[float], hand_walls: list[float]) -> float:
    return statistics.median(run_walls) / statistics.median(hand_walls)


def outside_seconds(results: list[dict]) -> list[float]:
    """Wall time outside worker 0's own training (its ``seconds=``: from building the graph to
    the final line), one per round with a final line. The training time varies most from round
    to round on a shared machine; what pscluster adds is all outside it."""
    return [r["wall_seconds"] - r["final"]["seconds"] for r in results if r["final"]]


def added_seconds(runs: list[dict], hands: list[dict]) -> float:
    """Median seconds ``pscluster run`` spends outside the training, beyond what starting the
    same processes by hand spends there."""
    return statistics.median(outside_seconds(runs)) - statistics.median(outside_seconds(hands))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6000, help="global steps of the TF1 example (default 6000)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows, runs, hands = [], [], []
    with tempfile.TemporaryDirectory(prefix="pscluster-run-overhead-") as tmp:
        work = Path(tmp)
        for index in range(args.rounds):
            # Alternate which side goes first, so a warming page cache favours neither.
            order = ("run", "hand") if index % 2 == 0 else ("hand", "run")
            for side in order:
                folder = work / f"{side}-{index}"
                folder.mkdir()
                if side == "run":
                    result = pscluster_once(args.steps, folder, index)
                    runs.append(result)
                else:
                    result = run_once(plan_tasks(LOCAL, PORTS["hand"], args.steps), folder)
                    hands.append(result)
                final = result["final"] or {}
                rows.append((str(index + 1), side, f"{result['wall_seconds']:.1f}", str(final.get("accuracy")),
                             str(final.get("seconds"))))
                print(f"round {index + 1} {side}: {result['wall_seconds']:.1f} s", file=sys.stderr)
    summary = {"rounds": args.rounds, "steps": args.steps,
               "run_median_seconds": statistics.median(r["wall_seconds"] for r in runs),
               "hand_median_seconds": statistics.median(h["wall_seconds"] for h in hands),
               "ratio": ratio([r["wall_seconds"] for r in runs], [h["wall_seconds"] for h in hands]),
               "goal": 1.05, "runs": runs, "by_hand": hands}
    summary["added_seconds"] = added_seconds(runs, hands)
    summary["ratio_without_noise"] = (summary["hand_median_seconds"] + summary["added_seconds"]) / \
        summary["hand_median_seconds"]
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_columns(("round", "side", "wall s", "test accuracy", "worker 0 s"), rows)
        print(f"\npscluster run / by hand (medians): {summary['run_median_seconds']:.1f} s / "
              f"{summary['hand_median_seconds']:.1f} s = {summary['ratio']:.3f} (goal <= 1.05)")
        print(f"outside worker 0's training, run adds {summary['added_seconds']:.2f} s (medians) -> ratio "
              f"without the training's round-to-round noise {summary['ratio_without_noise']:.3f}")
    ok = all(r["exit_code"] == 0 and r["final"] for r in runs) and all(h["final"] for h in hands)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
