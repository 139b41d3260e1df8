"""``up`` with the SSH connections held by helper processes (cluster/transport/spread.py), at
several sizes on a many-hosts lab, projected to 1,000 real hosts (issue 46: ``up`` of 1,000 hosts
≤ 3× the time of 16).

In one run, on one lab (testbed/manylab.py, stand-in servers, every host's workdir empty):
``up`` of ``--base`` hosts as a user gets it (below 128 hosts: every connection in the control
process), then ``up`` of each ``--sizes`` with ``--helpers K`` helpers, then ``up`` of the
largest size again with every connection in the control process, for the ratio. Each ``up`` runs
in this process (benchmarks/up_cost.py ``one_up``, the CLI's start-up left out, its progress
display kept: rendered as ``pscluster up`` renders it into a file) and is brought down after.
Per run: this process's CPU seconds, the helpers' (together, and the busiest one's), wall seconds.

Then the projection (benchmarks/scalefit.py ``project_spread_up``): a line through the control
process's CPU and one through the helpers' (their waiting, ``--idle-us`` CPU-µs a connection and
second, taken out), and ``up`` of ``--target`` real hosts with the helpers ``pscluster`` starts
there by default on a control machine of ``--cores`` cores, each helper on a core of its own.
This machine's 2 cores also run the lab's hosts, so no wall time measured here shows helpers
working side by side; what the projection takes from here is CPU per host.

``--repeat R``: every size R times, in turn, and the medians.

Usage (root): ``python -m benchmarks.up_spread [--sizes 32,64,128,256] [--base 16] [--helpers 2]
[--repeat 1] [--idle-us 203] [--cores 16 4] [--json F]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import scalefit  # noqa: E402
from benchmarks.common import print_columns  # noqa: E402
from benchmarks.up_cost import one_up  # noqa: E402
from testbed import manylab  # noqa: E402

from cluster.transport import spread  # noqa: E402


def median_row(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each figure's median over ``rows`` (runs of one size and way)."""
    return {key: statistics.median(r[key] for r in rows) for key in ("cpu_s", "wall_s", "helpers_cpu_s", "busiest_cpu_s")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.up_spread", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32,64,128,256", help="host counts of the runs with helpers")
    parser.add_argument("--base", type=int, default=16, help="the size the ratio is taken to (default 16)")
    parser.add_argument("--helpers", type=int, default=2, help="helper processes in the runs here (default 2)")
    parser.add_argument("--idle-us", type=float, default=203.0,
                        help="CPU-µs a silent connection costs a second (benchmarks.up_cost --idle; default 203)")
    parser.add_argument("--cores", type=int, nargs="+", default=[16, 4],
                        help="control machines' cores to project for (default 16 4)")
    parser.add_argument("--target", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each size, alternated; medians (default 1)")
    parser.add_argument("--json", metavar="F", help="also write the runs and projections to F")
    args = parser.parse_args(argv)
    sizes = sorted({int(size) for size in args.sizes.split(",")})
    rows: list[dict[str, Any]] = []

    def record(run: int, n: int, way: str, spans: dict) -> dict[str, Any]:
        row = {"hosts": n, "way": way, "cpu_s": spans["all"][0], "wall_s": spans["all"][1],
               "helpers_cpu_s": spans["helpers"][0], "busiest_cpu_s": spans["busiest"][0],
               "phases_cpu_s": {phase: round(cpu, 3) for phase, (cpu, _) in spans.items()
                                if phase not in ("all", "helpers", "busiest")}}
        rows.append(row)
        print(f"  run {run + 1}: {n} hosts {way}: {row['cpu_s']:.2f} CPU-s here, helpers {row['helpers_cpu_s']:.2f}, "
              f"{row['wall_s']:.1f} s", file=sys.stderr, flush=True)
        return row

    with tempfile.TemporaryDirectory(prefix="pscluster-upspread-") as tmp:
        work = Path(tmp)
        with manylab.ManyLab(max(*sizes, args.base), work / "lab") as lab:
            run = 0
            for _ in range(args.repeat):
                for n in (args.base, *sizes):
                    way = "one" if n == args.base else "spread"
                    record(run, n, way, one_up(lab, n, work, way, run, args.helpers, display=True))
                    run += 1
            record(run, sizes[-1], "one", one_up(lab, sizes[-1], work, "one", run, display=True))

    print(f"up, this process's CPU (every connection here: 'one'; {args.helpers} helpers: 'spread') and the helpers'")
    print_columns(["hosts", "way", "CPU s here", "ms a host", "helpers CPU s", "busiest helper", "wall s"],
                  [[str(r["hosts"]), r["way"], f"{r['cpu_s']:.2f}", f"{r['cpu_s'] / r['hosts'] * 1000:.1f}",
                    f"{r['helpers_cpu_s']:.2f}", f"{r['busiest_cpu_s']:.2f}", f"{r['wall_s']:.1f}"] for r in rows])
    medians = {(n, way): median_row([r for r in rows if (r["hosts"], r["way"]) == (n, way)])
               for n, way in {(r["hosts"], r["way"]) for r in rows}}
    if args.repeat > 1:
        print(f"\nmedians of {args.repeat} runs")
        print_columns(["hosts", "way", "CPU s here", "ms a host", "helpers CPU s", "busiest helper", "wall s"],
                      [[str(n), way, f"{r['cpu_s']:.2f}", f"{r['cpu_s'] / n * 1000:.1f}", f"{r['helpers_cpu_s']:.2f}",
                        f"{r['busiest_cpu_s']:.2f}", f"{r['wall_s']:.1f}"] for (n, way), r in sorted(medians.items())])
    largest = sizes[-1]
    base = medians[(args.base, "one")]
    one = medians[(largest, "one")]
    spread_row = medians[(largest, "spread")]
    print(f"\nat {largest} hosts, this process's CPU with helpers / without: "
          f"{spread_row['cpu_s']:.2f} / {one['cpu_s']:.2f} = {spread_row['cpu_s'] / one['cpu_s']:.2f}; "
          f"all CPU (here + helpers) / without: {(spread_row['cpu_s'] + spread_row['helpers_cpu_s']) / one['cpu_s']:.2f}")
    parent = {n: r["cpu_s"] for (n, way), r in medians.items() if way == "spread"}
    helpers = {n: (r["helpers_cpu_s"], r["wall_s"]) for (n, way), r in medians.items() if way == "spread"}
    projections = []
    for cores in args.cores:
        count = spread.helpers_for(args.target, setting="", cores=cores)
        projected = scalefit.project_spread_up(base["wall_s"], parent, helpers, args.idle_us, hosts=args.target,
                                               helper_count=count, base=args.base)
        projections.append({"cores": cores, **projected.__dict__})
    print(f"\nup of {args.target} real hosts, projected (base: up of {args.base} hosts here, "
          f"{base['wall_s']:.1f} s, every connection in one process)")
    print_columns(["control cores", "helpers", "ms a host here", "ms a host, helpers", "here s", "busiest helper s",
                   "up s", f"ratio to {args.base}"],
                  [[str(p["cores"]), str(p["helpers"]), f"{p['parent_slope'] * 1000:.1f}",
                    f"{p['helper_slope'] * 1000:.1f}", f"{p['parent_s']:.1f}", f"{p['helper_s']:.1f}",
                    f"{p['wall_s']:.1f}", f"{p['ratio']:.2f}"] for p in projections])
    if args.json:
        Path(args.json).write_text(json.dumps({"config": {"sizes": sizes, "base": args.base, "helpers": args.helpers,
                                                          "idle_us": args.idle_us, "cpus": os.cpu_count(),
                                                          "repeat": args.repeat},
                                               "runs": rows, "projections": projections}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
