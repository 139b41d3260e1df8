"""Issue 41: what an async chief loses when one worker's link is cut for good mid-closure.

Per trial, on this machine: a chief, one ps and three workers (roles.server, roles.train, the
tiny job of tests/local/test_roles.py, 10 steps per closure), no supervisor. Once the chief
reports progress, after a random 2-12 s, every packet to and from worker:1's port is dropped
(iptables and ip6tables, so neither end's kernel answers: a cut link, not a dead process) and
stays dropped. Measured from the chief's own events:

* ``pause``: the longest gap between two progress events from the cut until the budget was
  scheduled (a progress event comes about every 1.5 s while the chief trains), against the longest
  gap before the cut: how long the other workers waited on the lost one;
* ``end_wait``: seconds from the last progress event to ``done``: a closure of worker:1 still in
  flight at the end is collected only once the chief cut it loose and another worker ran it;
* ``lost``: seconds from the cut to the chief's ``worker`` event counting worker:1 out;
* ``waited``: seconds from the cut to the chief's first ``waiting`` event naming worker:1;
* ``extra_steps``: the final step minus the budget (closures that ran twice: the one cut loose);
* ``outcome``: ``finished`` (the chief reached its budget with worker:1 still cut off) or ``hang``
  (it did not within ``--limit`` seconds of the cut).

Needs root (iptables). Usage: ``python -m benchmarks.worker_cut [--trials 3] [--json] [--work DIR]``
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from roles.events import read_events  # noqa: E402
from testbed import netlab  # noqa: E402
from tests.local.test_roles import TINY_JOB, LocalCluster  # noqa: E402

STEPS = 6000


def _events(path: Path) -> list[dict[str, Any]]:
    return read_events(path) if path.exists() else []


def trial(work: Path, limit: float, rng: random.Random) -> dict[str, Any]:
    cluster = LocalCluster.create(work / "logs", chief=1, ps=1, workers=3)
    job = work / "tiny_job.py"
    job.write_text(textwrap.dedent(TINY_JOB))
    events = work / "chief.jsonl"
    heal: list[list[str]] = []
    try:
        cluster.start_servers(("ps", "worker"), cwd=work / "servers", OMP_NUM_THREADS="1")
        chief = cluster.start(["-m", "roles.train", "--mode", "async", "--job", str(job), "--events", str(events),
                               "--start-timeout", "300", "--steps", str(STEPS), "--steps-per-execution", "10",
                               "--warmup-steps", "0"], "chief", 0, work / "chief", "chief.log", OMP_NUM_THREADS="1")
        while not [e for e in _events(events) if e["event"] == "progress"]:
            if chief.poll() is not None:
                raise RuntimeError(f"the chief ended before training: see {work / 'logs' / 'chief.log'}")
            time.sleep(0.2)
        time.sleep(rng.uniform(2, 12))
        if chief.poll() is not None:
            raise RuntimeError("the budget ran out before the cut: raise STEPS")
        cut_at = time.time()
        heal = netlab.cut_port(int(cluster.cluster["worker"][1].rsplit(":", 1)[1]))
        try:
            code: int | None = chief.wait(limit)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        for command in heal:
            subprocess.run(command, check=False, capture_output=True)
        cluster.stop()
    seen = _events(events)
    stamps = [e["ts"] for e in seen if e["event"] == "progress"]
    before = [b - a for a, b in zip(stamps, stamps[1:]) if b <= cut_at]
    training = [e["ts"] for e in seen if e["event"] == "progress" and e["step"] < STEPS]   # not the final report
    after = [cut_at] + [t for t in training if t > cut_at]
    waits = [e["ts"] - cut_at for e in seen if e["event"] == "waiting" and e.get("worker") == "worker:1"]
    lost = [e["ts"] - cut_at for e in seen if e["event"] == "worker" and e.get("state") == "lost"]
    done = [e for e in seen if e["event"] == "done"]
    return {"outcome": "finished" if code == 0 and done else ("hang" if code is None else f"exit {code}"),
            "pause": round(max(b - a for a, b in zip(after, after[1:])) if len(after) > 1 else limit, 1),
            "gap_before": round(max(before, default=0.0), 1),
            "end_wait": round(done[0]["ts"] - after[-1], 1) if done and len(after) > 1 else None,
            "waited": round(min(waits), 1) if waits else None,
            "lost": round(min(lost), 1) if lost else None,
            "extra_steps": (done[0]["global_step"] - STEPS) if done else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--limit", type=float, default=240.0, help="seconds after the cut before a trial is a hang")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("iptables") or not shutil.which("ip6tables"):
        print("benchmarks.worker_cut: needs root, iptables and ip6tables", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="worker-cut-"))
    rng = random.Random(args.seed)
    rows = []
    for number in range(1, args.trials + 1):
        row = trial(work / f"trial-{number}", args.limit, rng)
        rows.append(row)
        print(f"trial {number}: {row}", file=sys.stderr, flush=True)
    finished = [r for r in rows if r["outcome"] == "finished"]
    summary = {"trials": len(rows), "finished": len(finished), "hangs": sum(r["outcome"] == "hang" for r in rows),
               "pause_max": max((r["pause"] for r in rows), default=None),
               "end_wait_max": max((r["end_wait"] or 0 for r in finished), default=None),
               "pause_over_gap_before": round(max(r["pause"] for r in finished) / max(r["gap_before"] for r in finished), 1)
               if finished else None,
               "extra_steps_max": max((r["extra_steps"] or 0 for r in finished), default=None)}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
    else:
        print("| trial | outcome | pause (s) | longest gap before (s) | wait at the end (s) | first `waiting` (s) "
              "| counted out (s) | extra steps |")
        print("|---|---|---|---|---|---|---|---|")
        for number, r in enumerate(rows, 1):
            print(f"| {number} | {r['outcome']} | {r['pause']} | {r['gap_before']} | {r['end_wait']} | {r['waited']} "
                  f"| {r['lost']} | {r['extra_steps']} |")
        print(f"\n{summary['finished']}/{summary['trials']} finished, {summary['hangs']} hang(s); the longest pause "
              f"was {summary['pause_over_gap_before']}x the longest gap between progress reports before the cut")
    return 0 if summary["hangs"] == 0 and len(finished) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
