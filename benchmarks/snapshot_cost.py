"""Issue 41, items 3-4: what a snapshot every N seconds costs a job's step rate.

Per pair, on this machine: async, a chief, one ps and two workers (roles.server, roles.train; no
supervisor); sync, two workers (roles.train each). distributed_mnist (``--model``: its MLP or its
CNN, the default a user gets) for a fixed budget, once without snapshots and once with
``--snapshot-every N`` (async: the chief saves while training goes on, roles/async_driver.py;
sync: every worker after the same step, roles/sync_driver.py), in alternating order. The rate
is the trainer's own ``done.examples_per_second`` (its loop after the first call); the ratio with/without is printed per pair and as the median.

Usage: ``python -m benchmarks.snapshot_cost [--mode async|sync] [--model mlp|cnn] [--pairs 2] [--every 10] [--steps 3000] [--json]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from roles.events import read_events  # noqa: E402
from tests.local.test_roles import LocalCluster  # noqa: E402


def one_run(work: Path, steps: int, every: float | None, mode: str = "async", model: str = "mlp") -> dict[str, Any]:
    if mode == "async":
        cluster = LocalCluster.create(work / "logs", chief=1, ps=1, workers=2)
    else:
        cluster = LocalCluster.create(work / "logs", workers=2)
    events = work / "chief.jsonl"
    try:
        if mode == "async":
            cluster.start_servers(("ps", "worker"), cwd=work / "servers")

        def argv(events_file: Path) -> list[str]:
            found = ["-m", "roles.train", "--mode", mode, "--job", str(REPO / "examples" / "distributed_mnist"),
                     "--events", str(events_file), "--steps", str(steps), "--checkpoint-dir", str(work / "ckpt"),
                     "--summary-every", "0"]
            return found + (["--snapshot-every", str(every)] if every else [])
        if mode == "async":
            chief = cluster.start(argv(events), "chief", 0, work / "chief", "chief.log", MNIST_MODEL=model)
        else:       # the sync workers: worker:0 is the chief
            chief = cluster.start(argv(events), "worker", 0, work / "chief", "chief.log", MNIST_MODEL=model)
            cluster.start(argv(work / "worker-1.jsonl"), "worker", 1, work / "worker-1", "worker-1.log", MNIST_MODEL=model)
        code = chief.wait(900)
    finally:
        cluster.stop()
    seen = read_events(events) if events.exists() else []
    done = [e for e in seen if e["event"] == "done"]
    if code != 0 or not done:
        raise RuntimeError(f"the chief failed (exit {code}): see {work / 'logs' / 'chief.log'}")
    saves = [e for e in seen if e["event"] == "checkpoint"]
    return {"rate": done[0]["examples_per_second"], "saves": len(saves), "wall": done[0]["wall_seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--mode", choices=("async", "sync"), default="async")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="distributed_mnist's MNIST_MODEL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="snapshot-cost-"))
    rows = []
    for pair in range(args.pairs):
        order = [None, args.every] if pair % 2 == 0 else [args.every, None]
        runs = {}
        for every in order:
            runs[every] = one_run(work / f"pair-{pair}-{'on' if every else 'off'}", args.steps, every,
                                  args.mode, args.model)
            print(f"pair {pair + 1}, snapshots {'every %gs' % every if every else 'off'}: {runs[every]}",
                  file=sys.stderr, flush=True)
        rows.append({"off": runs[None], "on": runs[args.every],
                     "ratio": round(runs[args.every]["rate"] / runs[None]["rate"], 3)})
    median = statistics.median(r["ratio"] for r in rows)
    if args.json:
        print(json.dumps({"rows": rows, "median_ratio": median}, indent=2))
    else:
        print(f"| pair | rate off (ex/s) | rate with a snapshot every {args.every:g} s (ex/s) | snapshots | ratio |")
        print("|---|---|---|---|---|")
        for number, r in enumerate(rows, 1):
            print(f"| {number} | {r['off']['rate']:.0f} | {r['on']['rate']:.0f} | {r['on']['saves']} | {r['ratio']} |")
        print(f"\nmedian rate with snapshots / without: {median:.3f} ({(1 - median) * 100:+.1f} % cost)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
