"""Where sync-ps spends its time: start-up phases and a traced step, measured on a real cluster.

Brings up the sync-ps shape of ``python -m benchmarks.training`` part 4 (2 ps + 2 workers,
local, same environment), runs ``pscluster train distributed_mnist --steps S`` with
``PSCLUSTER_TRACE_STEPS=N`` (roles/steptrace.py: each worker traces N steps after
``--after`` steps with TensorFlow's full trace), brings the cluster down, and prints

* the start-up of worker 0 and worker 1: seconds from launch to each phase, from the
  task logs and events (TensorFlow imported, run agreed, graph built, session ready, first
  progress);
* per worker: the client's ``session.run`` wall time per step, the span of each task's ops,
  and the milliseconds per step in each category (compute, transfer, token queue,
  accumulator, apply, other), plus the session overhead and the costliest ops.

Usage: ``python -m benchmarks.syncps_profile [--steps 300] [--trace 30] [--after 100] [--json]``.
Ports 39600-39649 (``--port-base``); the cluster is always brought down.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import cli, env_pair, print_columns
from benchmarks.training import ClusterShape, inventory_text
from roles.steptrace import CATEGORIES, Profile

SHAPE = ClusterShape("profile-sync-ps", "sync-ps", 0, 2, 2, 0)
LOG = sys.stderr
# (phase, pattern in the task log); the first match of each counts.
LOG_PHASES = (
    ("TensorFlow imported, options read", re.compile(r"pscluster\.train INFO")),
    ("run agreed with the other workers", re.compile(r"run container")),
    ("graph built", re.compile(r"graph built")),
    ("session ready (variables initialized)", re.compile(r"Done running local_init_op")),
)
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_LAUNCH = re.compile(r"^pscluster: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) starting")


def phases(log_text: str, events: list[dict]) -> list[tuple[str, float]]:
    """Seconds from the task's launch to each phase (pure: log text and parsed events)."""
    launch = None
    found: dict[str, float] = {}
    for line in log_text.splitlines():
        if launch is None:
            m = _LAUNCH.match(line)
            if m:
                launch = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            continue
        m = _LOG_TIME.match(line)
        if not m:
            continue
        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, pattern in LOG_PHASES:
            if name not in found and pattern.search(line):
                found[name] = at
    for kind, name in (("start", "training loop entered (start event)"),
                       ("progress", "first progress event (first steps done)")):
        ts = next((e["ts"] for e in events if e.get("event") == kind), None)
        if ts is not None:
            found[name] = ts
    if launch is None:
        return []
    # The launch line has whole seconds: phases are at most 1 s early.
    return sorted(((name, round(at - launch, 2)) for name, at in found.items()), key=lambda p: p[1])


def _read_events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {"OMP_NUM_THREADS": "1", "MNIST_MODEL": "cnn", "PSCLUSTER_TRACE_STEPS": str(args.trace),
           "PSCLUSTER_TRACE_AFTER": str(args.after), **dict(args.env)}
    out: dict[str, Any] = {"steps": args.steps, "trace": args.trace, "after": args.after,
                           "load_average_start": [round(v, 2) for v in os.getloadavg()]}
    name = f"bench-profile-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="pscluster-profile-") as tmp:
        work = Path(tmp)
        state = work / "state"
        inventory = work / "inventory.yaml"
        inventory.write_text(inventory_text(SHAPE, args.port_base, env))
        _, proc = cli(["plan", inventory, "--name", name, "--json"], state)
        plan = json.loads(proc.stdout)
        run_dir = Path(plan["tasks"][0]["workdir"]) / ".pscluster" / name
        try:
            print(f"  up {name} ...", file=LOG, flush=True)
            cli(["up", inventory, "--name", name], state)
            print(f"  train {args.steps} steps, tracing {args.trace} after {args.after} ...", file=LOG, flush=True)
            elapsed, proc = cli(["train", "distributed_mnist", "--name", name, "--steps", args.steps,
                                 "--restart-policy", "never", "--json",
                                 "--checkpoint-dir", work / "ckpt"], state)
            out["train_seconds"] = round(elapsed, 2)
            report = json.loads(proc.stdout)
            out["steps_per_second"] = round((report.get("examples_per_second") or 0) / report["global_batch_size"], 2)
            job_dir = max(run_dir.glob("job-*"), key=lambda p: p.stat().st_mtime)
            for worker in range(SHAPE.workers):
                stem = job_dir / f"worker-{worker}.1"
                events = _read_events(Path(f"{stem}.events.jsonl"))
                trace = Path(f"{stem}.events.jsonl.trace.json")
                out[f"worker:{worker}"] = {
                    "phases": phases(Path(f"{stem}.log").read_text(errors="replace"), events),
                    "profile": json.loads(trace.read_text()) if trace.exists() else None}
        finally:
            _, down = cli(["down", "--name", name], state, check=False)
            if down.returncode != 0:
                print(f"  down {name} failed:\n{down.stderr}", file=LOG, flush=True)
    out["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    return out


def print_report(out: dict[str, Any]) -> None:
    print(f"sync-ps profile: 2 ps + 2 workers, {out['steps']} steps, {out['trace']} traced after step "
          f"{out['after']}; {out['steps_per_second']} steps/s untraced-and-traced overall; load "
          f"{out['load_average_start'][0]:.2f} -> {out['load_average_end'][0]:.2f}")
    workers = [k for k in out if k.startswith("worker:")]
    names = list(dict.fromkeys(name for w in workers for name, _ in out[w]["phases"]))
    print("\nstart-up, seconds from the task's launch")
    print_columns(["phase", *workers],
                  [[name, *(_fmt(dict(out[w]["phases"]).get(name)) for w in workers)] for name in names])
    for w in workers:
        data = out[w]["profile"]
        if not data:
            print(f"\n{w}: no trace written")
            continue
        profile = Profile.from_json(data)
        tasks = sorted(profile.by_category)
        print(f"\n{w}: session.run {profile.wall_ms:.1f} ms per step ({profile.steps} traced); "
              f"session overhead (wall - {w}'s span) {profile.session_overhead_ms(w):.1f} ms")
        rows = [["span", *(_fmt(profile.span_ms.get(t)) for t in tasks)]]
        rows += [[c, *(_fmt(profile.by_category[t][c]) for t in tasks)] for c in CATEGORIES]
        rows += [["transfers per step (ops)", *(_fmt(profile.counts.get(t, {}).get("transfer")) for t in tasks)]]
        print_columns(["ms per step", *tasks], rows)
        print("  costliest ops: " + ", ".join(f"{t} {o} {ms:.1f}" for t, o, ms in profile.top_ops[:6]))


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--trace", type=int, default=30, help="steps traced per worker (default 30)")
    p.add_argument("--after", type=int, default=100, help="steps before tracing starts (default 100)")
    p.add_argument("--port-base", type=int, default=39600)
    p.add_argument("--env", action="append", default=[], type=env_pair, metavar="KEY=VALUE",
                   help="extra environment for every task (repeatable), e.g. PSCLUSTER_INTER_OP_THREADS=1")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.after + args.trace >= args.steps:
        raise SystemExit("--after + --trace must stay below --steps")
    began = time.perf_counter()
    out = run(args)
    out["seconds"] = round(time.perf_counter() - began, 1)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_report(out)
    return out


if __name__ == "__main__":
    main()
