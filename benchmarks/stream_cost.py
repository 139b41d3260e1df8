"""What the watch streams of N hosts cost the supervisor, read by a thread per stream (before)
or pulled by the supervisor's turns (now), measured in one run (issue 46).

A many-hosts lab (testbed/manylab.py, root) of N hosts; one SSH connection to each
(:class:`cluster.transport.ssh.SSHTransport`) and on it the real ``hostctl watch``
(:func:`cluster.hosts.hostops.watch`) with nothing to watch, so each host sends its heartbeat
line once a second, as a supervised host does when its tasks say nothing. This process then
does what the supervisor's loop does with them (cluster/supervision/executor.py): every 0.1 s,
each stream's new lines, each parsed (:func:`hostops.parse_watch_line`). Two ways to read them,
alternated over the same connections:

* ``thread``: a reader thread per stream puts each line on a queue (the :class:`Stream` of the
  twenty-sixth session and before);
* ``pulled``: no thread; each turn reads what has come (``Stream(..., ready=...)``, today's SSH
  watch streams).

Per pass: the CPU seconds of this process (every thread) per second over the last half of
``--seconds`` (after the streams spoke), CPU microseconds per line, and the process's threads.
Prints each pass and the ratio pulled / thread of the medians.

Usage (root): ``python -m benchmarks.stream_cost [--hosts 64,256] [--seconds 30] [--passes 2]``.
The lab has max(N) hosts and is removed at the end, whatever happens.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import print_columns  # noqa: E402
from testbed import manylab  # noqa: E402

from cluster.fanout import fan_out  # noqa: E402
from cluster.hosts import hostops  # noqa: E402
from cluster.inventory import load_inventory  # noqa: E402
from cluster.plan import PlanOptions, plan_cluster  # noqa: E402
from cluster.transport.base import Stream  # noqa: E402
from cluster.transport.ssh import SSHTransport  # noqa: E402

TURN = 0.1          # the supervisor's LOOP_SECONDS


def open_streams(transports: Sequence[SSHTransport], how: str) -> list[Stream]:
    """A watch stream on each connection, read the way ``how`` says."""
    def one(transport: SSHTransport) -> Stream:
        pulled = hostops.watch(transport, [], [], interval=1.0, heartbeat=1.0)
        if how == "pulled":
            return pulled
        # The same channel, read by a thread (the Stream before): the pulled object is never read.
        return Stream(pulled._read_chunk, pulled._close)
    return [o.result() for o in fan_out(list(transports), one, name="streams", key=lambda t: t.host.name)]


def run_pass(transports: Sequence[SSHTransport], how: str, seconds: float) -> dict[str, Any]:
    streams = open_streams(transports, how)
    try:
        lines = lines_half = 0
        began = time.monotonic()
        half = began + seconds / 2
        cpu_half: float | None = None
        wall_half = began
        threads = threading.active_count()
        while time.monotonic() - began < seconds:
            for stream in streams:
                for line in stream.lines():
                    if hostops.parse_watch_line(line) is not None:
                        lines += 1
            if cpu_half is None and time.monotonic() >= half:
                cpu_half, lines_half, wall_half = time.process_time(), lines, time.monotonic()
                threads = threading.active_count()
            time.sleep(TURN)
        assert cpu_half is not None
        cpu, wall = time.process_time() - cpu_half, time.monotonic() - wall_half
        closed = sum(stream.closed for stream in streams)
    finally:
        for stream in streams:
            stream.close()
    heard = lines - lines_half
    return {"how": how, "hosts": len(transports), "cores": cpu / wall, "lines_per_s": heard / wall,
            "us_per_line": 1e6 * cpu / heard if heard else None, "threads": threads, "closed": closed}


def measure(lab: manylab.ManyLab, n: int, work: Path, seconds: float, passes: int) -> list[dict[str, Any]]:
    inventory = manylab.write_inventory(lab, work / f"inv-{n}.yaml", hosts=n)
    plan = plan_cluster(load_inventory(str(inventory)), PlanOptions(local_python="", local_workdir=""))
    transports = [SSHTransport(host) for host in plan.hosts]
    try:
        for outcome in fan_out(transports, lambda t: t.connect(), name="connect", key=lambda t: t.host.name):
            outcome.result()
        rows = []
        for number in range(passes):
            for how in ("thread", "pulled"):
                row = {**run_pass(transports, how, seconds), "pass": number + 1}
                print(f"{n} hosts, pass {number + 1}, {how}: {row['cores']:.4f} cores, "
                      f"{row['us_per_line'] or 0:.0f} µs a line, {row['threads']} threads, "
                      f"{row['lines_per_s']:.0f} lines/s, {row['closed']} closed", flush=True)
                rows.append(row)
        return rows
    finally:
        for transport in transports:
            transport.close()


def report(rows: Sequence[dict[str, Any]]) -> None:
    out = []
    for n in sorted({r["hosts"] for r in rows}):
        by = {how: [r for r in rows if r["hosts"] == n and r["how"] == how] for how in ("thread", "pulled")}
        cores = {how: statistics.median(r["cores"] for r in group) for how, group in by.items()}
        per_line = {how: statistics.median(r["us_per_line"] for r in group if r["us_per_line"])
                    for how, group in by.items()}
        threads = {how: max(r["threads"] for r in group) for how, group in by.items()}
        out.append([str(n), f"{cores['thread']:.4f}", f"{cores['pulled']:.4f}", f"{cores['pulled'] / cores['thread']:.2f}",
                    f"{per_line['thread']:.0f}", f"{per_line['pulled']:.0f}", str(threads["thread"]), str(threads["pulled"])])
    print()
    print_columns(["hosts", "cores, thread", "cores, pulled", "ratio", "µs a line, thread", "µs a line, pulled",
                   "threads, thread", "threads, pulled"], out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="64,256", help="comma list of sizes")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds each pass reads")
    parser.add_argument("--passes", type=int, default=2, help="passes of each way per size")
    args = parser.parse_args(argv)
    sizes = sorted(int(n) for n in args.hosts.split(","))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stream-cost-") as tmp:
        work = Path(tmp)
        with manylab.ManyLab(sizes[-1], work / "lab") as lab:
            for n in sizes:
                rows += measure(lab, n, work, args.seconds, args.passes)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
