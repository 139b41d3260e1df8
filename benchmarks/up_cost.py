"""What ``up`` costs the control process per phase, two ways alternated in one run (issue 46):
``--compare sync`` (default), the code sync direct against through the relay
(cluster/hosts/relay.py); ``--compare probes``, readiness probes of every pending server each
round against once its host says its port listens (cluster/lifecycle/tasks.py ``wait_ready``);
``--compare spread``, every SSH connection in this process (``PSCLUSTER_CONTROL_PROCESSES=0``)
against held by ``--helpers K`` helper processes (cluster/transport/spread.py): then the table
adds the helpers' CPU seconds in ``up`` (their sum, and the busiest one's).

A many-hosts lab (testbed/manylab.py, root) of N hosts with stand-in servers; ``bring_up`` runs
in this process on them (the CLI's own start-up left out), each host's workdir empty (11.9 MB
of ``roles/`` and ``examples/`` to copy), alternately with ``pscluster_sync_relay: false``
(``direct``: every host copied to over its SSH connection) and the default (``relay``), then
``down``. With ``--compare probes`` both ways relay, and ``every-round`` sets
``PROBE_EVERY_ROUND`` above the host count (every pending server probed every round, as before)
against the default (``heard``). Per run: this process's CPU seconds (every thread) and wall
seconds per phase of ``up`` (preflight, sync, start, ready: from its ``phase`` events), and their
totals. Prints each run, then the medians and the ratio of the second way to the first.

``--idle S``: then, on the same lab, one SSH connection to every host held open and silent for S
seconds, and what they cost this process meanwhile (keepalives, paramiko's readers): the part of
a phase's CPU that grows with its wall time, not with its work.

Usage (root): ``python -m benchmarks.up_cost [--hosts 64] [--pairs 2] [--compare sync|probes|spread] [--helpers 2] [--idle 30]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import print_columns, process_cpu_seconds  # noqa: E402
from testbed import manylab  # noqa: E402

from cluster.cli.base import _plan  # noqa: E402
from rich.console import Console  # noqa: E402

from cluster.console.live import RichReporter  # noqa: E402
from cluster.events import Reporter, TeeReporter  # noqa: E402
from cluster.fanout import fan_out  # noqa: E402
from cluster.lifecycle import tasks  # noqa: E402
from cluster.lifecycle.updown import bring_down, bring_up  # noqa: E402
from cluster.state import StateStore  # noqa: E402
from cluster.transport import TransportPool, spread  # noqa: E402


class PhaseClock(Reporter):
    """CPU and wall seconds of this process at each ``phase`` event."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, float]] = [("begin", time.process_time(), time.monotonic())]

    def handle(self, kind: str, **data: Any) -> None:
        if kind == "phase":
            self.marks.append((str(data.get("name")), time.process_time(), time.monotonic()))

    def phases(self) -> dict[str, tuple[float, float]]:
        """phase -> (CPU s, wall s) from its event to the next."""
        spans: dict[str, tuple[float, float]] = {}
        marks = [*self.marks, ("end", time.process_time(), time.monotonic())]
        for (name, cpu, wall), (_, cpu_next, wall_next) in zip(marks[1:], marks[2:]):
            before = spans.get(name, (0.0, 0.0))
            spans[name] = (before[0] + cpu_next - cpu, before[1] + wall_next - wall)
        spans["all"] = (marks[-1][1] - marks[0][1], marks[-1][2] - marks[0][2])
        return spans


def one_up(lab: manylab.ManyLab, n: int, work: Path, way: str, run: int,
           helpers: int = 2, *, display: bool = False) -> dict[str, tuple[float, float]]:
    """``up`` of ``n`` hosts in this process (``display``: its events also rendered as the CLI
    renders them, to a file, not a terminal), then ``down``; per phase (CPU s, wall s)."""
    name = f"cost{run}"
    inventory = manylab.write_inventory(lab, work / f"{name}.yaml", hosts=n, workdirs=f"work-{name}",
                                        extra_vars={"pscluster_sync_relay": way != "direct"})
    store = StateStore(work / "state")
    clock = PhaseClock()
    every_round = tasks.PROBE_EVERY_ROUND
    setting = os.environ.get(spread.ENV)
    with TransportPool() as pool:
        plan = _plan(str(inventory), name=name, mode=None, port_base=None)
        try:
            if way == "every-round":
                tasks.PROBE_EVERY_ROUND = n + 1
            if way in ("one", "spread"):
                os.environ[spread.ENV] = str(helpers if way == "spread" else 0)
            if display:
                with open(os.devnull, "w") as sink:
                    rich = RichReporter(Console(file=sink, no_color=True, highlight=False, emoji=False, width=200))
                    try:
                        bring_up(plan, store=store, reporter=TeeReporter(clock, rich), pool=pool)
                    finally:
                        rich.close()
            else:
                bring_up(plan, store=store, reporter=clock, pool=pool)
            spans = clock.phases()
            cpus = [process_cpu_seconds(pid) for pid in pool.helper_pids()]
            spans["helpers"] = (sum(cpus), 0.0)
            spans["busiest"] = (max(cpus, default=0.0), 0.0)
            return spans
        finally:
            tasks.PROBE_EVERY_ROUND = every_round
            if setting is None:
                os.environ.pop(spread.ENV, None)
            else:
                os.environ[spread.ENV] = setting
            bring_down(name, store=store, reporter=Reporter(), grace=2, pool=pool)


def idle_cost(lab: manylab.ManyLab, n: int, work: Path, seconds: float) -> float:
    """CPU microseconds per host and second of ``n`` open, silent SSH connections."""
    inventory = manylab.write_inventory(lab, work / "idle.yaml", hosts=n, workdirs="work-idle")
    plan = _plan(str(inventory), name="idle", mode=None, port_base=None)
    with TransportPool() as pool:
        fan_out(list(plan.hosts), lambda host: pool.get(host).connect(), name="connect")
        time.sleep(2.0)                    # the connections' own start settled
        began = time.process_time()
        time.sleep(seconds)
        return (time.process_time() - began) / seconds / n * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.up_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=2, help="pairs of runs, alternated (default 2)")
    parser.add_argument("--compare", choices=("sync", "probes", "spread"), default="sync")
    parser.add_argument("--helpers", type=int, default=2, help="helper processes with --compare spread (default 2)")
    parser.add_argument("--idle", type=float, default=0.0, metavar="S",
                        help="then hold a silent connection to every host for S seconds and print its cost")
    args = parser.parse_args(argv)
    first, second = {"sync": ("direct", "relay"), "probes": ("every-round", "heard"),
                     "spread": ("one", "spread")}[args.compare]
    order = [way for pair in range(args.pairs) for way in ((first, second) if pair % 2 == 0 else (second, first))]
    results: dict[str, list[dict[str, tuple[float, float]]]] = {first: [], second: []}
    phases: tuple[str, ...] = ("preflight", "sync", "start", "ready", "all")
    if args.compare == "spread":
        phases += ("helpers", "busiest")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pscluster-upcost-") as tmp:
        work = Path(tmp)
        with manylab.ManyLab(args.hosts, work / "lab") as lab:
            for run, way in enumerate(order):
                spans = one_up(lab, args.hosts, work, way, run, args.helpers)
                results[way].append(spans)
                rows.append([str(run + 1), way, *(f"{spans.get(p, (0, 0))[0]:.2f} / {spans.get(p, (0, 0))[1]:.1f}"
                                                  for p in phases)])
                print(f"  run {run + 1} {way}: {spans['all'][0]:.2f} CPU-s, {spans['all'][1]:.1f} s", file=sys.stderr,
                      flush=True)
            idle = idle_cost(lab, args.hosts, work, args.idle) if args.idle else None
    if idle is not None:
        print(f"{args.hosts} silent connections for {args.idle:g} s: {idle:.0f} CPU-µs per host and second "
              f"({idle * args.hosts / 1e6:.3f} cores)")
    if not rows:
        return 0
    print(f"up of {args.hosts} hosts, CPU s / wall s of this process per phase")
    print_columns(["run", args.compare, *phases], rows)
    print()
    medians = []
    for phase in phases:
        before = statistics.median(s.get(phase, (0.0, 0.0))[0] for s in results[first])
        after = statistics.median(s.get(phase, (0.0, 0.0))[0] for s in results[second])
        medians.append([phase, f"{before:.2f}", f"{after:.2f}", f"{after / before:.2f}" if before else "-",
                        f"{(before - after) / args.hosts * 1000:.1f}"])
    print_columns(["phase", f"CPU s, {first}", f"CPU s, {second}", f"ratio {second}/{first}", "ms saved a host"],
                  medians)
    return 0


if __name__ == "__main__":
    sys.exit(main())
