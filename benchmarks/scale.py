"""The control side at scale (issue 46): what one ``pscluster`` process costs per phase as the
number of hosts grows, on a many-hosts lab (testbed/manylab.py) whose tasks are stand-ins
(testbed/standin.py), so the control side is measured and not TensorFlow.

For each size N, on the lab's first N hosts (a between-graph cluster: a ps, a standing server,
and a worker, a training task, on every host): ``check``, ``up``, ``status``, ``watch`` (a
``pscluster run`` of a stand-in program on every worker, supervised for ``--watch`` seconds:
one hostctl watch stream per host, heartbeats, the job record; then Ctrl-C), ``scale`` to N+1
hosts, ``down`` (and the processes of the cluster left afterwards). Per phase: wall seconds,
CPU seconds of the pscluster process (user + system, its threads and the children it waited
for), ``cores`` (watch only: CPU seconds per second over the second half of the window, the
steady state), peak RSS, and the peaks of its threads, open file descriptors and established
TCP connections, sampled every ``--interval`` seconds from /proc. Then a fit per figure and
phase (benchmarks/scalefit.py), projections to 1,000 and 10,000 hosts, and which limit the
projections reach first.

``--throttle 0.1`` runs each size a second time with every tenth host behind a ``--rate`` link
(tc tbf on its bridge-side veth), phases marked ``~slow``, and prints their wall and CPU
seconds against the all-fast pass (issue 46: "hosts that answer slowly").

Usage (root): ``python -m benchmarks.scale --hosts 4,16,64 [--watch 60] [--throttle 0.1 [--rate 8mbit]]
[--json] [--out F] [--profile DIR] [--idle-us US]``; ``--from F [--idle-us US]`` reports a saved run
(``--idle-us``: also ``up`` projected for 1,000 real hosts, benchmarks/scalefit.py ``project_up``).
The lab has max(N)+1 hosts and is removed at the end, whatever happens.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import scalefit  # noqa: E402
from benchmarks.common import print_columns, process_cpu_seconds  # noqa: E402
from testbed import manylab  # noqa: E402
from testbed.procs import cluster_pids, socket_inodes  # noqa: E402

from cluster.errors import PsclusterError  # noqa: E402
from cluster.state import StateStore  # noqa: E402

READY_TIMEOUT = 600.0   # seconds for a watch phase's job to have every process running
READY_EVERY = 1.0       # seconds between looks at the job record for that


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _established(pid: int, inodes: set[str]) -> int:
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = _read(f"/proc/{pid}/net/{table}").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:
                count += 1
    return count


def sample(pid: int) -> dict[str, float] | None:
    """Threads, fds, established TCP connections, peak RSS (MB) and CPU seconds of ``pid`` now."""
    try:
        status = dict(line.split(":", 1) for line in _read(f"/proc/{pid}/status").splitlines() if ":" in line)
        fds = os.listdir(f"/proc/{pid}/fd")
        sockets = socket_inodes(pid)
        return {"threads": float(status["Threads"]), "fds": float(len(fds)),
                "conns": float(_established(pid, sockets)),
                "rss_mb": int(status["VmHWM"].split()[0]) / 1024, "cpu": process_cpu_seconds(pid)}
    except (OSError, KeyError, ValueError, IndexError):
        return None         # it ended between two reads


def measure(args: Sequence[str], state_dir: Path, *, interval: float, interrupt_after: float | None = None,
            timeout: float = 1800, profile: Path | None = None,
            during: Sequence[str] | None = None, ready: Callable[[], bool] | None = None,
            ready_timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    """Run ``pscluster ARGS`` and measure it; ``interrupt_after``: send SIGINT (Ctrl-C) then;
    ``profile``: under cProfile (its main thread), the stats written there (CPU figures inflated);
    ``ready``: ``interrupt_after`` (and the ``cores`` window) counts from when it first holds
    (``ready_s``; at ``ready_timeout`` at the latest, then ``ready_s`` is None): at 256 hosts the
    job's start alone outlasted a 60 s window, which then measured the start, not the steady state."""
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1")
    began = time.monotonic()
    runner = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    # SIGINT back to its default in the child: started from a shell's background job (`cmd &`,
    # no job control), this script and its children ignore SIGINT, and the watch phase's Ctrl-C
    # then never ended the run (Python keeps an ignored SIGINT ignored).
    proc = subprocess.Popen([sys.executable, *runner, "-m", "cluster", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    peaks = {"threads": 0.0, "fds": 0.0, "conns": 0.0, "rss_mb": 0.0}
    cpu_at: list[tuple[float, float]] = []
    interrupted = False
    ready_at: float | None = None if ready is not None else 0.0
    next_look = 0.0
    output = bytearray()
    os.set_blocking(proc.stdout.fileno(), False)        # type: ignore[union-attr]
    while proc.poll() is None:
        now = time.monotonic() - began
        seen = sample(proc.pid)
        if seen is not None:
            for key in peaks:
                peaks[key] = max(peaks[key], seen[key])
            cpu_at.append((now, seen["cpu"]))
        if ready_at is None and now >= next_look:
            next_look = now + READY_EVERY
            if ready is not None and ready():
                ready_at = now
        origin = ready_at if ready_at is not None else (ready_timeout if now >= ready_timeout else None)
        if interrupt_after is not None and not interrupted and origin is not None and now >= origin + interrupt_after:
            if during is not None:
                row_during = _beside(during, env)
            proc.send_signal(signal.SIGINT)
            interrupted = True
        if now > timeout:
            proc.kill()
        output += proc.stdout.read() or b""             # type: ignore[union-attr]
        time.sleep(interval)
    wall = time.monotonic() - began
    output += proc.stdout.read() or b""                 # type: ignore[union-attr]
    # CPU seconds: _ChildCpu (poll() reaped it); peak RSS: VmHWM at the last sample
    row: dict[str, Any] = {"wall_s": wall, "rc": proc.returncode, **peaks,
                           "output_tail": output.decode(errors="replace")[-1500:]}
    if interrupt_after is not None:
        origin = ready_at if ready_at is not None else ready_timeout
        row["cores"] = steady_cores(cpu_at, origin + interrupt_after / 2, origin + interrupt_after)
        if ready is not None:
            row["ready_s"] = ready_at
    if during is not None and interrupted:
        row["during"] = row_during
    return row


def all_running(state_dir: Path, name: str, count: int) -> bool:
    """Whether the supervisor's job record has ``count`` processes running (the ps servers and
    the program on every worker): the job's steady state has begun."""
    try:
        state = StateStore(state_dir).load(name)
    except (PsclusterError, OSError):
        return False        # mid-write: the next look
    job = state.job if state is not None else None
    states = (job.proc_states or {}) if job is not None else {}
    return sum(1 for value in states.values() if value == "running") >= count


def _beside(args: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``pscluster ARGS`` to its end while the measured one runs (``status`` of a supervised
    job): its wall and CPU seconds, from its own rusage."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cluster", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.stdout.read() if proc.stdout is not None else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": time.monotonic() - began, "cpu_s": usage.ru_utime + usage.ru_stime, "rc": proc.returncode,
            "output_tail": output.decode(errors="replace")[-1500:]}


def steady_cores(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """CPU seconds per second between the samples nearest ``start`` and ``end`` (None: too few)."""
    inside = [p for p in points if start <= p[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


class _ChildCpu:
    """CPU of the children reaped so far, so each phase's figure is its own process's."""

    def __init__(self) -> None:
        self.base = resource.getrusage(resource.RUSAGE_CHILDREN)

    def take(self, row: dict[str, Any]) -> None:
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        row["cpu_s"] = (now.ru_utime - self.base.ru_utime) + (now.ru_stime - self.base.ru_stime)
        self.base = now


def slow_hosts(lab: manylab.ManyLab, n: int, fraction: float) -> list[str]:
    """Every ``1/fraction``-th host of the first ``n + 1`` (``scale``'s extra one included):
    node-10, node-20, ... for 0.1."""
    if fraction <= 0:
        return []
    every = max(1, round(1 / fraction))
    return [name for i, name in enumerate(lab.names[:n + 1], start=1) if i % every == 0]


def run_size(lab: manylab.ManyLab, n: int, work: Path, args: argparse.Namespace,
             suffix: str = "") -> list[dict[str, Any]]:
    """The six phases on the lab's first ``n`` hosts; the cluster is always brought down.
    ``suffix`` marks a pass's phases (``~slow``: a tenth of the hosts throttled)."""
    name = f"scale{n}{'t' if suffix else ''}"
    # Workdirs of this pass's own: every host gets the code in `up` (the hosts of a smaller size
    # had it already before, and the throttled pass sent nothing at all).
    inventory = manylab.write_inventory(lab, work / f"{name}.yaml", hosts=n, workdirs=f"work-{name}")
    scaled = manylab.write_inventory(lab, work / f"{name}-plus1.yaml", hosts=n + 1, workdirs=f"work-{name}")
    state = work / "state"
    program = ["--", "python", str(manylab.STANDIN), "program", "--every", str(args.every)]
    phases = [
        ("check", ["check", str(inventory), "--name", name], None),
        ("up", ["up", str(inventory), "--name", name], None),
        ("status", ["status", "--name", name], None),
        # `run`'s default policy (never) fails the run on the first host silent for 4 s: at 256
        # hosts on this machine (load average ~100) one was, once; on-failure waits --host-timeout.
        ("watch", ["run", "--name", name, "--on", "worker", "--grace", "2", "--restart-policy", args.policy,
                   *program], args.watch),
        ("scale", ["scale", str(scaled), "--name", name], None),
        ("down", ["down", "--name", name, "--grace", "2"], None),
    ]
    rows = []
    cpu = _ChildCpu()
    try:
        for phase, argv, interrupt in phases:
            profile = Path(args.profile) / f"{name}-{phase}.prof" if args.profile and phase == "watch" else None
            during = ["status", "--name", name] if phase == "watch" else None
            ready = (lambda: all_running(state, name, 2 * n)) if phase == "watch" else None
            row = measure(argv, state, interval=args.interval, interrupt_after=interrupt, profile=profile,
                          during=during, ready=ready)
            cpu.take(row)
            row.update(hosts=n, phase=phase + suffix)
            beside = row.pop("during", None)
            if phase == "down":
                row["left"] = len(cluster_pids(name))
            rows.append(row)
            started = (f"  all running after {row['ready_s']:.1f} s" if row.get("ready_s") is not None else
                       "  NOT all running: the window is the start's" if "ready_s" in row else "")
            print(f"  {n:>5} {phase:<7} {row['wall_s']:7.2f} s  cpu {row['cpu_s']:6.2f} s  rc {row['rc']}{started}",
                  file=sys.stderr, flush=True)
            if row["rc"] not in (0, 130):
                print(row["output_tail"], file=sys.stderr)
            if beside is not None:
                # `status` while the job is supervised: from the supervisor's record (issue 46)
                rows.append({**beside, "hosts": n, "phase": "status*" + suffix})
                print(f"  {n:>5} status* {beside['wall_s']:7.2f} s  cpu {beside['cpu_s']:6.2f} s  rc {beside['rc']}",
                      file=sys.stderr, flush=True)
                print(beside["output_tail"][-600:], file=sys.stderr)
            if row["rc"] not in (0, 130) and phase in ("up", "check") and not suffix:
                raise RuntimeError(f"pscluster {phase} at {n} hosts failed:\n{row['output_tail']}")
    finally:
        if not rows or rows[-1]["phase"] != "down":
            measure(["down", "--name", name, "--now"], state, interval=1.0)
    return rows


def limits(rows: Sequence[dict[str, Any]]) -> list[scalefit.Limit]:
    """What runs out on this control machine, and the issue's goals."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    pid_max = int(_read("/proc/sys/kernel/pid_max"))
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 20
    found = []
    for phase in scalefit.PHASES:
        found += [scalefit.Limit(phase, "fds", nofile, f"ulimit -n ({nofile})"),
                  scalefit.Limit(phase, "threads", pid_max, f"pid_max ({pid_max}), threads are PIDs"),
                  scalefit.Limit(phase, "rss_mb", 1024, "goal: 1 GiB RSS"),
                  scalefit.Limit(phase, "rss_mb", memory_mb, f"this machine's memory ({memory_mb / 1024:.0f} GiB)")]
    found += [scalefit.Limit("watch", "cores", 0.5, "goal: 0.5 core steady"),
              scalefit.Limit("watch", "cores", 1.0, "one core (a Python process's GIL)"),
              scalefit.Limit("status", "wall_s", 3.0, "goal: status <= 3 s")]
    return found


def run_slow(lab: manylab.ManyLab, n: int, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The six phases again with ``--throttle`` of the hosts (scale's extra host included) behind
    a ``--rate`` link (tbf on the bridge side: what is sent to them), then the links freed."""
    slow = slow_hosts(lab, n, args.throttle)
    for host in slow:
        lab.throttle(host, args.rate)
    print(f"  {n:>5} {len(slow)} host(s) throttled to {args.rate}: {', '.join(slow[:5])}"
          f"{' ...' if len(slow) > 5 else ''}", file=sys.stderr, flush=True)
    try:
        return run_size(lab, n, work, args, suffix="~slow")
    finally:
        for host in slow:
            lab.unthrottle(host)


def slow_ratios(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Per size and phase: wall and CPU seconds with a tenth throttled against all fast."""
    plain = {(row["hosts"], row["phase"]): row for row in rows}
    body = []
    for row in rows:
        if not row["phase"].endswith("~slow"):
            continue
        base = plain.get((row["hosts"], row["phase"][:-len("~slow")]))
        if base is None:
            continue
        body.append([str(row["hosts"]), base["phase"], f"{base['wall_s']:.2f}", f"{row['wall_s']:.2f}",
                     f"{row['wall_s'] / base['wall_s']:.2f}" if base["wall_s"] else "-",
                     f"{base.get('cpu_s', 0):.2f}", f"{row.get('cpu_s', 0):.2f}", str(row["rc"])])
    return ["hosts", "phase", "wall s, all fast", "wall s, a tenth slow", "ratio", "CPU s, fast", "CPU s, slow",
            "rc (slow)"], body


def report(rows: Sequence[dict[str, Any]], idle_us: float | None = None) -> None:
    print_columns(*scalefit.table(rows))
    slow = slow_ratios(rows)
    if slow[1]:
        print()
        print_columns(*slow)
    print()
    print_columns(*scalefit.projection_table(rows))
    print()
    for found in scalefit.first_exhausted(rows, limits(rows))[:8]:
        at = "never" if found.hosts is None else f"N ≈ {found.hosts:,.0f}"
        print(f"  {found.limit.phase:<7} {found.limit.metric:<8} reaches {found.limit.what}: {at} "
              f"({found.fit.describe()})")
    projected = scalefit.project_up(rows, idle_us) if idle_us is not None else None
    if projected is not None:
        print(f"\n  up of {projected.hosts:,} real hosts: {projected.wall:.1f} s against {projected.base} hosts' "
              f"{projected.base_wall:.2f} s, ratio {projected.ratio:.1f} (goal <= 3; {projected.per_host * 1000:.1f} "
              f"control CPU-ms a host of work, {idle_us:.0f} CPU-µs a host and second of waiting)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="4,16,64", help="comma list of sizes (default 4,16,64)")
    parser.add_argument("--watch", type=float, default=60.0, help="seconds a job is supervised per size")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between the stand-in program's lines")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between /proc samples")
    parser.add_argument("--throttle", type=float, default=0.0, metavar="FRACTION",
                        help="also run each size with this fraction of the hosts behind a slow link (e.g. 0.1)")
    parser.add_argument("--rate", default="8mbit", help="the slow links' rate (tc tbf; default 8mbit)")
    parser.add_argument("--policy", default="on-failure", choices=("never", "on-failure"),
                        help="the run's --restart-policy (default on-failure: a silent host is waited for)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--profile", metavar="DIR",
                        help="run the watch phase under cProfile, its stats in DIR (its CPU figures are then inflated)")
    parser.add_argument("--from", dest="saved", metavar="FILE",
                        help="report a run saved with --out instead of measuring (no lab)")
    parser.add_argument("--idle-us", type=float, metavar="US",
                        help="CPU-µs a silent connection costs per second (benchmarks.up_cost --idle): "
                             "also project `up` for 1,000 real hosts with it")
    args = parser.parse_args(argv)
    if args.saved:
        report(json.loads(Path(args.saved).read_text())["rows"], idle_us=args.idle_us)
        return 0
    sizes = sorted({int(s) for s in args.hosts.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] + 1 > manylab.MAX_HOSTS:
        raise SystemExit(f"--hosts: sizes from 1 to {manylab.MAX_HOSTS - 1}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pscluster-scale-") as tmp:
        work = Path(tmp)
        with manylab.ManyLab(sizes[-1] + 1, work / "lab") as lab:
            print(f"lab of {len(lab.hosts)} hosts in {lab.timings.get('start', 0):.1f} s", file=sys.stderr)
            for n in sizes:
                rows += run_size(lab, n, work, args)
                if args.throttle:
                    rows += run_slow(lab, n, work, args)
    document = {"rows": [{k: v for k, v in row.items() if k != "output_tail"} for row in rows],
                "config": {"hosts": sizes, "watch_s": args.watch, "cpus": os.cpu_count(), "policy": args.policy,
                           "throttle": args.throttle, "rate": args.rate}}
    if args.out:
        Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        report(rows, idle_us=args.idle_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
