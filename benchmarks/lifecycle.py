"""Lifecycle benchmarks (issue 2), measured in one run on the network-namespace SSH lab.

1. ``pscluster up`` to all-ready for 3 hosts (2 ps + 3 workers) against a bare launch of the
   same five server commands in parallel over plain ``ssh`` (``setsid nohup ... &``, as people
   do by hand) with a TCP readiness loop. Medians of N runs, alternating, and their ratio.
2. ``pscluster down``: time, and what is left afterwards (processes, listening ports, state).
3. Preflight (``pscluster check``) across 4 and 64 fake hosts: the ratio shows the fan-out.

Usage: ``python -m benchmarks.lifecycle [--runs 5] [--json]`` (root; builds and removes its labs).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import cli  # noqa: E402
from testbed.netlab import Lab, write_inventory  # noqa: E402
from testbed.procs import cluster_pids  # noqa: E402

GROUPS = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-1", "node-2", "node-3"]}


def _wait_ports(targets: list[tuple[str, int]], timeout: float = 120) -> None:
    pending = list(targets)
    deadline = time.monotonic() + timeout
    while pending:
        still = []
        for address, port in pending:
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex((address, port)) != 0:
                    still.append((address, port))
        pending = still
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"bare launch: not ready: {pending}")
            time.sleep(0.1)


def bare_launch(lab: Lab, plan: dict) -> tuple[float, list[tuple[str, int]]]:
    """Start every standing server over plain ssh in parallel; time until all accept TCP."""
    began = time.perf_counter()
    procs = []
    for task in plan["tasks"]:
        if not task["standing"]:
            continue
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in task["env"].items())
        log = f"/tmp/bare-{plan['name']}-{task['role']}-{task['index']}.log"
        command = (f"cd {shlex.quote(task['workdir'])}; {env} setsid nohup "
                   f"{' '.join(map(shlex.quote, task['argv']))} >{log} 2>&1 </dev/null & echo $!")
        procs.append((task, subprocess.Popen(lab.ssh_argv(task["host"], command), stdout=subprocess.PIPE,
                                             text=True)))
    started = []
    for task, proc in procs:
        out, _ = proc.communicate(timeout=60)
        started.append((task["host"], int(out.strip())))
    _wait_ports([(task["address"], task["port"]) for task, _ in procs])
    return time.perf_counter() - began, started


def bare_teardown(lab: Lab, started: list[tuple[str, int]]) -> None:
    for host, pgid in started:      # the pids the launch printed: setsid made each a group leader
        subprocess.run(lab.ssh_argv(host, f"kill -- -{pgid}"), capture_output=True, timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(pid) for _, pid in started):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _listening(lab: Lab, ports: set[int]) -> list[str]:
    found = []
    for host in lab.hosts:
        out = lab.exec_in_netns(host.name, ["ss", "-ltnH"]).stdout
        for line in out.splitlines():
            port = int(line.split()[3].rsplit(":", 1)[1])
            if port in ports:
                found.append(f"{host.name}:{port}")
    return found


def up_down(runs: int, work: Path) -> dict:
    ups, bares, downs, leftovers = [], [], [], []
    with Lab(3, work / "lab3") as lab:
        inventory = write_inventory(lab, work / "bench.yaml", GROUPS,
                                    {"pscluster_port_base": 34000, "pscluster_workdir": str(REPO)})
        state_dir = work / "state"
        _, plan_proc = cli(["plan", inventory, "--json", "--name", "bench-up"], state_dir)
        plan = json.loads(plan_proc.stdout)
        bare_plan = dict(plan, tasks=[dict(t, port=t["port"] + 100) for t in plan["tasks"]])
        for task in bare_plan["tasks"]:      # the bare servers get their own ports, same layout
            cluster = {job: [f"{a.rsplit(':', 1)[0]}:{int(a.rsplit(':', 1)[1]) + 100}" for a in addresses]
                       for job, addresses in plan["cluster"].items()}
            task["env"] = dict(task["env"], TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": task["role"], "index": task["index"]}}),
                PSCLUSTER_CLUSTER="bench-bare")
        ports = {t["port"] for t in plan["tasks"]}
        for run in range(runs):
            order = ("pscluster", "bare") if run % 2 == 0 else ("bare", "pscluster")
            for which in order:
                if which == "pscluster":
                    elapsed, _ = cli(["up", inventory, "--name", "bench-up"], state_dir)
                    ups.append(elapsed)
                    elapsed, _ = cli(["down", "--name", "bench-up"], state_dir)
                    downs.append(elapsed)
                    left = len(cluster_pids("bench-up")) + len(_listening(lab, ports)) + \
                        len(list(state_dir.glob("*.json")))
                    leftovers.append(left)
                else:
                    elapsed, started = bare_launch(lab, bare_plan)
                    bares.append(elapsed)
                    bare_teardown(lab, started)
    return {
        "up_seconds": ups, "bare_seconds": bares, "down_seconds": downs, "leftovers": leftovers,
        "up_median": statistics.median(ups), "bare_median": statistics.median(bares),
        "up_ratio": statistics.median(ups) / statistics.median(bares),
        "down_median": statistics.median(downs), "leftovers_total": sum(leftovers),
    }


def _busy_cpu_seconds() -> float:
    """CPU seconds this machine has spent busy (all processes, all CPUs), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]                          # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def preflight_fanout(runs: int, work: Path) -> dict:
    """``pscluster check`` on 4 and 64 hosts, with where the CPU went.

    All 64 fake hosts share this machine's CPUs, so their sshd and host-side Python run on
    the same cores as the orchestrator: besides the wall time, record the machine's busy CPU
    seconds (the floor is busy / CPUs) and the orchestrator's own CPU (its child rusage). On
    real hosts the host-side part runs on each host, so the projection for 64 real hosts is
    the 4-host time plus the orchestrator's extra CPU, which is serial in one process.
    """
    times: dict[int, list[float]] = {4: [], 64: []}
    busy: dict[int, list[float]] = {4: [], 64: []}
    orchestrator: dict[int, list[float]] = {4: [], 64: []}
    with Lab(64, work / "lab64", subnet="127.78.0") as lab:
        state_dir = work / "state-preflight"
        inventories = {}
        for count in (4, 64):
            names = [host.name for host in lab.hosts[:count]]
            inventories[count] = write_inventory(lab, work / f"pre{count}.yaml", {"worker": names},
                                                 {"pscluster_port_base": 35000, "pscluster_mode": "sync",
                                                  "pscluster_workdir": str(REPO)})
        cli(["check", inventories[4]], state_dir)          # warm caches once
        for _ in range(runs):
            for count in (4, 64):
                busy_before, own_before = _busy_cpu_seconds(), _children_cpu_seconds()
                elapsed, _ = cli(["check", inventories[count]], state_dir)
                times[count].append(elapsed)
                busy[count].append(_busy_cpu_seconds() - busy_before)
                orchestrator[count].append(_children_cpu_seconds() - own_before)
    medians = {count: statistics.median(values) for count, values in times.items()}
    busy_64, own_64, own_4 = (statistics.median(busy[64]), statistics.median(orchestrator[64]),
                              statistics.median(orchestrator[4]))
    projected = medians[4] + max(0.0, own_64 - own_4)
    return {"preflight_seconds": times, "preflight_4_median": medians[4], "preflight_64_median": medians[64],
            "preflight_ratio": medians[64] / medians[4],
            "preflight_64_busy_cpu_seconds": busy_64, "preflight_64_orchestrator_cpu_seconds": own_64,
            "preflight_4_orchestrator_cpu_seconds": own_4, "cpus": os.cpu_count(),
            "preflight_64_cpu_floor_seconds": busy_64 / (os.cpu_count() or 1),
            "preflight_64_projected_seconds": projected, "preflight_projected_ratio": projected / medians[4]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pscluster-bench-") as tmp:
        work = Path(tmp)
        results = up_down(args.runs, work)
        results.update(preflight_fanout(max(3, args.runs), work))
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"up to all-ready, 3 hosts, 2 ps + 3 workers (median of {args.runs}):")
        print(f"  pscluster up   {results['up_median']:6.2f} s")
        print(f"  bare ssh       {results['bare_median']:6.2f} s")
        print(f"  ratio          {results['up_ratio']:6.2f}   (goal <= 1.15)")
        print(f"down: median {results['down_median']:.2f} s; leftovers after {args.runs} downs: "
              f"{results['leftovers_total']} (goal 0)")
        print(f"preflight: 4 hosts {results['preflight_4_median']:.2f} s, 64 hosts "
              f"{results['preflight_64_median']:.2f} s, ratio {results['preflight_ratio']:.2f} (goal <= 2)")
        print(f"  64 hosts kept {results['cpus']} CPUs busy for {results['preflight_64_busy_cpu_seconds']:.2f} "
              f"CPU-s (floor {results['preflight_64_cpu_floor_seconds']:.2f} s on this machine), of which the "
              f"orchestrator {results['preflight_64_orchestrator_cpu_seconds']:.2f} CPU-s "
              f"(4 hosts: {results['preflight_4_orchestrator_cpu_seconds']:.2f})")
        print(f"  projected for 64 real hosts (host-side work on each host): "
              f"{results['preflight_64_projected_seconds']:.2f} s, ratio {results['preflight_projected_ratio']:.2f}")
    return results


if __name__ == "__main__":
    main()
