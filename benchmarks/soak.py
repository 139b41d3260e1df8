"""Soak (issue 4): N cycles of ``up`` -> ``train`` (short) -> ``down`` on the 3-host SSH lab,
the modes taking turns (async, sync, sync-ps),
checking after every cycle that nothing is left: no task process (by the cluster's environment
marker), no host-control process (``hostctl`` watch/monitor), no listening port of the cluster
on any host, no state file. Prints the leak count per cycle and in total (goal: zero).

Usage: ``python -m benchmarks.soak [--cycles 20] [--json]`` (root; builds and removes its lab).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import cli  # noqa: E402
from cluster.hosts.hostops import BOOTSTRAP  # noqa: E402
from testbed.netlab import Lab, write_inventory  # noqa: E402
from testbed.procs import cluster_pids, netns_of  # noqa: E402

MODES = ("async", "sync", "sync-ps")     # one per cycle, in turn
GROUPS = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}


def hostctl_processes(lab: Lab) -> list[int]:
    """Live host-control processes inside this lab's hosts (the bootstrap line is on their command
    line); counted, never killed. Other users of this machine may run their own, elsewhere."""
    marker = BOOTSTRAP.encode()
    namespaces = {host.netns for host in lab.hosts}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker in open(f"/proc/{entry}/cmdline", "rb").read():
                    state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
                    if state not in ("Z", "X") and netns_of(int(entry)) in namespaces:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def listening(lab: Lab, ports: set[int]) -> list[str]:
    found = []
    for host in lab.hosts:
        for line in lab.exec_in_netns(host.name, ["ss", "-ltnH"]).stdout.splitlines():
            port = int(line.split()[3].rsplit(":", 1)[1])
            if port in ports:
                found.append(f"{host.name}:{port}")
    return found


def run(cycles: int, work: Path, modes: tuple[str, ...] = MODES, log=print) -> dict:
    rows = []
    with Lab(3, work / "lab") as lab:
        state_dir = work / "state"
        inventory = write_inventory(lab, work / "soak.yaml", GROUPS, {
            "pscluster_port_base": 36000, "pscluster_workdir": str(REPO), "pscluster_mode": "async",
            "pscluster_env": {"MNIST_MODEL": "mlp", "OMP_NUM_THREADS": 1}})
        ports = set()
        for mode in modes:
            plan = json.loads(cli(["plan", inventory, "--json", "--name", "soak", "--mode", mode],
                                  state_dir)[1].stdout)
            ports |= {task["port"] for task in plan["tasks"]}
        for cycle in range(1, cycles + 1):
            mode = modes[(cycle - 1) % len(modes)]
            began = time.perf_counter()
            failures = []
            for args in (["up", inventory, "--name", "soak", "--mode", mode],
                         ["train", "distributed_mnist", "--name", "soak", "--steps", 60, "--json"],
                         ["down", "--name", "soak"]):
                _, proc = cli(args, state_dir, check=False)
                if proc.returncode != 0:
                    failures.append(f"{args[0]}: {proc.stderr.strip().splitlines()[-1:]}")
                    if args[0] != "down":
                        cli(["down", "--name", "soak"], state_dir, check=False)
                        break
            time.sleep(1.0)     # a monitor reaped by PID 1 can linger a moment as a zombie
            leaks = {
                "task_processes": cluster_pids("soak"),
                "hostctl_processes": hostctl_processes(lab),
                "listening_ports": listening(lab, ports),
                "state_files": [p.name for p in state_dir.glob("*.json")],
            }
            count = sum(len(v) for v in leaks.values())
            rows.append({"cycle": cycle, "mode": mode, "seconds": round(time.perf_counter() - began, 1), "leaks": count,
                         "details": leaks if count else {}, "failures": failures})
            log(f"cycle {cycle:2d} ({mode}): {rows[-1]['seconds']:5.1f} s, leaks {count}"
                + (f", failures {failures}" if failures else "") + (f" {leaks}" if count else ""))
    return {"cycles": cycles, "modes": list(modes), "leaks_total": sum(r["leaks"] for r in rows),
            "failures_total": sum(len(r["failures"]) for r in rows),
            "cycle_seconds_median": statistics.median(r["seconds"] for r in rows), "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--modes", default=",".join(MODES), help="modes to rotate through, one per cycle")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pscluster-soak-") as tmp:
        results = run(args.cycles, Path(tmp), tuple(args.modes.split(",")),
                      log=(lambda *_: None) if args.json else print)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"soak: {args.cycles} cycles of up -> train -> down, median {results['cycle_seconds_median']:.1f} s "
              f"per cycle; leaks {results['leaks_total']} (goal 0); failed steps {results['failures_total']}")
    return results


if __name__ == "__main__":
    main()
