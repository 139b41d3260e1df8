"""What a supervisor's main thread pays per host while a job runs (issue 46), before and after
the twenty-sixth session's changes, measured in one run on a synthetic state of N hosts (no lab,
no TensorFlow): each host runs a ps and a program, as in ``benchmarks.scale``'s watch phase.

* **the job record's write**, once a second: the whole state to JSON, written and synced
  (:meth:`StateStore.save`). Before: every record through ``dataclasses.asdict`` and json's
  indenting (pure-Python) encoder; now: each frozen record's form kept from the last write
  (:func:`cluster.state.records_to_json`) and json's C encoder.
* **a program's output line**, one a second from every host in the scale benchmark's job, piped:
  before through rich's rendering (``Text.from_ansi``, ``Console.print``); now written directly
  when it is printable (cluster/console/live.py ``ProgramOutput``).

Prints CPU milliseconds per write and microseconds per line, old and new, their ratio, and what
each costs a second at N hosts (one write a second; N lines a second). The decisions the loop
skips for a heartbeat or an output line (cluster/supervision/executor.py ``absorb``) are not in
it: they are counted in ``benchmarks.scale``'s steady cores.

Usage: ``python -m benchmarks.supervisor_cost [--hosts 256,1000] [--repeat 5] [--lines 2000]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.text import Text  # noqa: E402

from benchmarks.common import print_columns  # noqa: E402
from cluster import console as ui  # noqa: E402
from cluster.contracts import ProcessKind  # noqa: E402
from cluster.inventory import load_inventory  # noqa: E402
from cluster.jobrecord import JobProgress  # noqa: E402
from cluster.plan import PlanOptions, plan_cluster  # noqa: E402
from cluster.state import ProcessRecord, RunState, StateStore, write_private_json  # noqa: E402


def synthetic_state(hosts: int, folder: Path) -> RunState:
    """A state of ``hosts`` hosts, each with a ps (a standing server) and a worker running a
    program, and the job record a supervisor writes (hosts heard, process states, watch pids)."""
    lines = ["all:", "  children:", "    chief:", "      hosts:", "        h1:",
             "    ps:", "      hosts:"]
    lines += [f"        h{i}: {{ansible_host: 127.0.{i // 250}.{i % 250 + 1}}}" for i in range(1, hosts + 1)]
    lines += ["    worker:", "      hosts:"]
    lines += [f"        h{i}:" for i in range(1, hosts + 1)]
    inventory = folder / "many.yaml"
    inventory.write_text("\n".join(lines) + "\n")
    plan = plan_cluster(load_inventory(str(inventory)), PlanOptions(local_python="python3", local_workdir="/w"))
    records = []
    for task in plan.tasks:
        kind = ProcessKind.SERVER if task.role == "ps" else ProcessKind.PROGRAM
        record = ProcessRecord.for_task(task.name, task.host, kind, 1, f"/w/.pscluster/many/{task.role}-{task.index}.log",
                                        job=None if kind is ProcessKind.SERVER else 1)
        records.append(dataclasses.replace(record, pid=10_000 + len(records), pgid=10_000 + len(records),
                                           starttime="123456", task_starttime="123457", started=1.7e9))
    job = JobProgress(id=1, job="run", mode=plan.mode, state="running", entry="run")
    job = job.updated(hosts_heard={host.name: 1.7e9 for host in plan.hosts},
                      proc_states={record.key: "running" for record in records},
                      watch_pids={host.name: 5000 + i for i, host in enumerate(plan.hosts)})
    return RunState(name="many", plan=plan, processes=records, job=job)


def cpu_ms(action: Callable[[], Any], repeat: int) -> float:
    """Median CPU milliseconds of ``action`` over ``repeat`` runs (one warm-up first)."""
    action()
    times = []
    for _ in range(repeat):
        began = time.process_time()
        action()
        times.append((time.process_time() - began) * 1000)
    return sorted(times)[len(times) // 2]


def write_old(store: StateStore, state: RunState) -> None:
    """The write before: every record through ``dataclasses.asdict``, the indenting encoder (the
    state's ``to_json`` looks its kept forms up too, a dict lookup per record, which this path
    pays on top: it slightly favours the new one's ratio, not measured apart)."""
    data = state.to_json()
    data["processes"] = [dataclasses.asdict(record) for record in state.processes]
    write_private_json(store.path(state.name), data, indent=1)


def line_costs(lines: int) -> tuple[float, float]:
    """Microseconds of CPU per piped output line: rich's rendering, then the direct write."""
    def console() -> Console:
        return Console(file=io.StringIO(), width=80, color_system=None, highlight=False, emoji=False)
    old, new = console(), console()
    output = ui.ProgramOutput(new, new)
    text = "step 1200 loss 0.1234 examples/s 5120.4 from a stand-in program"

    def rich_lines() -> None:
        for i in range(lines):
            old.print(Text(f"[worker:{i % 64}@h{i % 64}] ") + Text.from_ansi(text), soft_wrap=True, highlight=False)

    def direct_lines() -> None:
        for i in range(lines):
            output.handle("output", task=f"worker:{i % 64}", host=f"h{i % 64}", line=text)
    return cpu_ms(rich_lines, 3) * 1000 / lines, cpu_ms(direct_lines, 3) * 1000 / lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.supervisor_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="256,1000", help="comma list of sizes (default 256,1000)")
    parser.add_argument("--repeat", type=int, default=5, help="writes measured per size and way (default 5)")
    parser.add_argument("--lines", type=int, default=2000, help="output lines measured per way (default 2000)")
    args = parser.parse_args(argv)
    rows = []
    line_old, line_new = line_costs(args.lines)
    with tempfile.TemporaryDirectory(prefix="pscluster-supervisor-cost-") as tmp:
        store = StateStore(Path(tmp) / "state")
        for hosts in sorted({int(n) for n in args.hosts.split(",") if n.strip()}):
            state = synthetic_state(hosts, Path(tmp))
            store.save(state)           # its folder
            old = cpu_ms(lambda: write_old(store, state), args.repeat)
            new = cpu_ms(lambda: store.save(state), args.repeat)
            size = store.path(state.name).stat().st_size
            rows.append([str(hosts), f"{size / 1e6:.2f}", f"{old:.1f}", f"{new:.1f}", f"{new / old:.2f}",
                         f"{line_old:.0f}", f"{line_new:.0f}", f"{line_new / line_old:.2f}",
                         f"{(old + hosts * line_old / 1000) / 1000:.3f}", f"{(new + hosts * line_new / 1000) / 1000:.3f}"])
    print_columns(["hosts", "state MB", "write ms old", "write ms new", "ratio", "line us old", "line us new",
                   "ratio", "cores old", "cores new"], rows)
    print("(cores: one write and one output line per host each second, the main thread's share of both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
