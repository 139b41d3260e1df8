"""A cluster that changes (issue 23): what a resize costs, against the same change by hand.

For each mode (async, sync), on the local cluster and, as root, on the 3-host SSH lab:

* **planned resize** (`pscluster scale` to one more worker, mid-run): the *pause*, seconds from the
  last step reported before the resize to the first step reported after it, and the *steps lost*
  (the last step reached before, minus the step the job resumed from: the goal is 0). Async
  changes in place (roles/membership.py): the job never stops, so the pause is the longest gap
  between two step reports from the last before ``scale`` to the first after it returned, and
  the planned removal of that worker again (``scale`` back) is measured the same way;
* **`down` mid-run**: steps lost (the step reached, minus the step `train --resume` restores);
* **by hand** (`stop-job`, edit the inventory, `down`, `up`, `train --resume`): the same pause;
  the goal is a planned pause of at most a quarter of it;
* **unplanned host loss** (lab, async, `--min-workers 2 --host-timeout 5`): seconds from cutting a
  worker host's link to the first step after the job went on without it; the goal is at most
  ``--host-timeout`` + 10 s.

Each pause is the longest gap between two progress events the trainers wrote (their own
timestamps, from every trainer's events file), from the last one before the change to the first
one after it: a trainer reports a progress event about every 1.5 s, one when it stops (the step
it saved), and one at once after its first unit of work. A pause shorter than 1.5 s therefore
reads as up to 1.5 s. ``pause_record`` is the same gap in the cluster's job record as polled
here (the supervisor's own delays included: the measure of the first sessions).

Usage: ``python -m benchmarks.elastic [--modes async,sync] [--no-lab] [--no-local] [--json] [--work DIR]``
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import cli, print_columns  # noqa: E402
from testbed.procs import cluster_pids  # noqa: E402

LOCAL = REPO / "inventories" / "local.yaml"
STEPS = 1_000_000          # the job never ends by itself: each scenario stops it
RUN_BEFORE = 400           # steps trained before each change


class Job:
    """A `pscluster train` in the background and the steps its job record shows over time."""

    def __init__(self, state_dir: Path, name: str, *extra: str):
        self.state_dir, self.name = state_dir, name
        self.checkpoints = state_dir.parent / f"ckpt-{name}"
        # The environment `up` had (benchmarks.common.cli): a PYTHONPATH of its own here made every
        # standby `up` left unusable ("the environment TensorFlow reads at import differs"), so the
        # by-hand resume paid TensorFlow's import that a user's would not.
        env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1")
        # Its output goes to a file: a pipe nobody reads until the end fills up and stalls `train`.
        self.output = state_dir.parent / f"train-{name}-{int(time.time())}.err"
        state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "cluster", "train", "distributed_mnist", "--name", name,
                                          "--steps", str(STEPS), "--checkpoint-every", "1000",
                                          "--checkpoint-dir", str(self.checkpoints), *extra],
                                         cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        self.seen: list[tuple[float, int]] = []       # (time, step) at each change of the step

    def record(self) -> dict:
        try:
            return json.loads((self.state_dir / f"{self.name}.json").read_text()).get("job") or {}
        except (FileNotFoundError, ValueError):
            return {}

    def look(self) -> dict:
        """The job record now; a new step is noted in :attr:`seen`."""
        job = self.record()
        step = job.get("step")
        if step is not None and (not self.seen or self.seen[-1][1] != step):
            self.seen.append((time.monotonic(), step))
        return job

    def during(self, args: list, state_dir: Path) -> tuple[float, subprocess.CompletedProcess]:
        """Run ``pscluster ARGS`` while watching the job's steps (a change in place never stops it)."""
        env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1")
        began = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "cluster", *map(str, args)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while proc.poll() is None:
            self.look()
            time.sleep(0.05)
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"pscluster {' '.join(map(str, args))} failed:\n{err}")
        return time.perf_counter() - began, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def watch_until(self, what: str, done: Callable[[dict], bool], timeout: float = 900) -> dict:
        end = time.monotonic() + timeout
        while True:
            job = self.look()
            if done(job):
                return job
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{self.name}: never {what}: {job}\n{self.output.read_text()[-2000:]}")
            time.sleep(0.05)

    def pause_after(self, began: float, resumed_from: int) -> float:
        """Seconds from the last step seen before ``began`` to the first step seen after it past
        ``resumed_from``."""
        before = max(t for t, _ in self.seen if t <= began)
        after = min(t for t, step in self.seen if t > began and step > resumed_from)
        return after - before

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _inventory(work: Path, mode: str, workers: int) -> Path:
    path = work / f"{mode}-{workers}.yaml"
    path.write_text(LOCAL.read_text().replace("worker_tasks: 2", f"worker_tasks: {workers}")
                    .replace("pscluster_mode: async", f"pscluster_mode: {mode}"))
    return path


def _up(inventory: Path, name: str, state_dir: Path, port_base: int) -> None:
    cli(["up", inventory, "--name", name, "--port-base", port_base], state_dir)


def _down(name: str, state_dir: Path) -> None:
    cli(["down", "--name", name, "--now", "--grace", "2"], state_dir, check=False)
    for pid in cluster_pids(name):
        os.kill(pid, 9)


def progress_times(roots: list[Path], name: str, since: float) -> set[float]:
    """When the trainers of cluster ``name`` wrote a progress event (wall clock), from ``since``
    on (the folders keep earlier runs'). ``roots``: the workdirs to read."""
    return {event["ts"] for root in roots for path in (root / ".pscluster" / name).glob("job-*/*.events.jsonl")
            for event in _events(path) if event.get("event") == "progress" and event.get("ts", 0) >= since}


def trainer_pause(roots: list[Path], name: str, since: float, began: float, until: float,
                  seen: set[float] = frozenset()) -> float:
    """The longest gap between two progress events of the trainers (:func:`progress_times`, and
    ``seen``: times read before their files were replaced), from the last one before ``began`` to
    the first one at or after ``until``."""
    times = sorted(progress_times(roots, name, since) | set(seen))
    start = max((t for t in times if t <= began), default=began)
    end = min((t for t in times if t >= until), default=until)
    window = [start] + [t for t in times if start < t < end] + [end]
    return max(b - a for a, b in zip(window, window[1:]))


def _events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return [event for event in out if isinstance(event, dict)]


def planned(mode: str, grow: Path, shrink: Path, work: Path, port_base: int, where: str = "",
            roots: list[Path] | None = None) -> dict:
    """`scale` from ``shrink`` to ``grow`` mid-run; then `down` mid-run."""
    name, state_dir = f"elastic{where}-{mode}", work / f"state{where}-{mode}"
    roots = roots or [REPO]
    since = time.time()
    _up(shrink, name, state_dir, port_base)
    job = Job(state_dir, name)
    try:
        job.watch_until(f"trained {RUN_BEFORE} steps", lambda j: (j.get("step") or 0) >= RUN_BEFORE)
        reached = job.seen[-1][1]
        began, began_wall = time.monotonic(), time.time()
        seconds, proc = job.during(["scale", grow, "--name", name], state_dir)
        reached = max(step for t, step in job.seen if t <= began) if job.seen else reached
        removal = None
        if "in place" in proc.stdout + proc.stderr:
            pause_record = _pause_around(job, began, time.monotonic())
            pause = trainer_pause(roots, name, since, began_wall, time.time())
            restored = min(step for t, step in job.seen if t > began)     # it never went back
            again, again_wall = time.monotonic(), time.time()
            _, proc = job.during(["scale", shrink, "--name", name], state_dir)
            if "in place" not in proc.stdout + proc.stderr:
                raise RuntimeError(f"the removal was not made in place: {proc.stderr[-2000:]}")
            _pause_around(job, again, time.monotonic())
            removal = trainer_pause(roots, name, since, again_wall, time.time())
        else:
            after = job.watch_until("resumed", lambda j: j.get("state") == "running" and
                                    (j.get("step") or 0) > (j.get("restored_step") or 1 << 60))
            restored = after["restored_step"]
            # The longest gap between two step reports: the job may train on while the resize
            # prepares (new servers, standbys), so the pause is not counted from `scale`'s start.
            resumed = min(t for t, step in job.seen if t > began and step > restored)
            pause_record = _longest_gap(job, began, resumed)
            pause = trainer_pause(roots, name, since, began_wall, time.time())
        job.watch_until("trained after the resize", lambda j: (j.get("step") or 0) >= restored + RUN_BEFORE)
        last = job.seen[-1][1]
        cli(["down", "--name", name], state_dir)          # checkpoint first
        job.proc.wait(timeout=300)
    finally:
        job.stop()
        _down(name, state_dir)
    saved = _latest_checkpoint(job.checkpoints)
    return {"pause": pause, "pause_record": pause_record, "scale_seconds": seconds,
            "steps_lost_resize": max(0, reached - restored),
            "steps_lost_down": max(0, last - saved) if saved is not None else None, "removal_pause": removal}


def _pause_around(job: Job, began: float, ended: float) -> float:
    """A change in place: the longest gap between two step reports, from the last one before
    ``began`` to the first one after ``ended``."""
    job.watch_until("trained after the resize", lambda j: any(t > ended for t, _ in job.seen))
    return _longest_gap(job, began, min(t for t, _ in job.seen if t > ended))


def _longest_gap(job: Job, began: float, until: float) -> float:
    """The longest gap between two step reports from the last one before ``began`` to ``until``."""
    times = [t for t, _ in job.seen]
    window = [t for t in times if max(t for t in times if t <= began) <= t <= until]
    return max(b - a for a, b in zip(window, window[1:]))


def _latest_checkpoint(folder: Path) -> int | None:
    """The step of the newest checkpoint in ``folder`` (TensorFlow's index file)."""
    index = folder / "checkpoint"
    if not index.exists():
        return None
    line = next(line for line in index.read_text().splitlines() if line.startswith("model_checkpoint_path"))
    return int(line.split("ckpt-")[-1].strip().strip('"'))


def by_hand(mode: str, grow: Path, shrink: Path, work: Path, port_base: int, where: str = "",
            roots: list[Path] | None = None) -> dict:
    """stop-job, down, up the edited inventory, train --resume: the pause a user sees."""
    name, state_dir = f"elastic{where}-hand-{mode}", work / f"state{where}-hand-{mode}"
    roots = roots or [REPO]
    since = time.time()
    _up(shrink, name, state_dir, port_base)
    job = Job(state_dir, name)
    try:
        job.watch_until(f"trained {RUN_BEFORE} steps", lambda j: (j.get("step") or 0) >= RUN_BEFORE)
        began, began_wall = time.monotonic(), time.time()
        cli(["stop-job", "--name", name], state_dir)
        job.proc.wait(timeout=300)
        before = progress_times(roots, name, since)
        cli(["down", "--name", name], state_dir)
        _up(grow, name, state_dir, port_base)
        resumed = Job(state_dir, name, "--resume")
        resumed.seen = list(job.seen)
        try:
            after = resumed.watch_until("resumed", lambda j: j.get("state") == "running" and
                                        (j.get("step") or 0) > (j.get("restored_step") or 1 << 60))
            pause_record = resumed.pause_after(began, after["restored_step"])
            pause = trainer_pause(roots, name, since, began_wall, time.time(), before)
        finally:
            resumed.stop()
    finally:
        job.stop()
        _down(name, state_dir)
    return {"pause": pause, "pause_record": pause_record}


def lab_planned(modes: list[str], work: Path) -> dict:
    """The planned resize and its by-hand twin on the 3-host SSH lab: node-3 joins (each host in
    its own workdir, so code travels, as on real hosts)."""
    from testbed.netlab import Lab, write_inventory
    results: dict[str, Any] = {}
    with Lab(3, work / "lab-planned", subnet="auto") as lab:
        for number, mode in enumerate(modes):
            def inventory(workers: tuple[str, ...]) -> Path:
                def at(host: str) -> dict:
                    return {host: {"pscluster_workdir": str(work / f"work-{mode}-{host}")}}
                groups: dict = {"worker": {k: v for host in workers for k, v in at(host).items()}}
                if mode == "async":
                    groups = {"chief": at("node-1"), "ps": at("node-1"), **groups}
                return write_inventory(lab, work / f"lab-{mode}-{len(workers)}.yaml", groups, {
                    "pscluster_mode": mode, "pscluster_env": {"OMP_NUM_THREADS": 1}, "pscluster_intra_op_threads": 1})
            grow, shrink = inventory(("node-1", "node-2", "node-3")), inventory(("node-1", "node-2"))
            base = 37000 + 100 * number
            roots = [work / f"work-{mode}-{host}" for host in ("node-1", "node-2", "node-3")]
            results[mode] = {"planned": planned(mode, grow, shrink, work, base, where="-lab", roots=roots),
                             "by_hand": by_hand(mode, grow, shrink, work, base + 50, where="-lab", roots=roots)}
            results[mode]["ratio"] = results[mode]["planned"]["pause"] / results[mode]["by_hand"]["pause"]
            print(f"lab {mode}: {json.dumps(results[mode])}", file=sys.stderr, flush=True)
    return results


def host_loss(work: Path) -> dict:
    """Lab: cut a worker host's link under --min-workers 2 --host-timeout 5 (async)."""
    from testbed.netlab import Lab, write_inventory
    name, state_dir, timeout = "elastic-cut", work / "state-cut", 5
    with Lab(3, work / "lab3", subnet="auto") as lab:
        groups = {"chief": ["node-1"], "ps": ["node-1"], "worker": ["node-1", "node-2", "node-3"]}
        inventory = write_inventory(lab, work / "cut.yaml", groups, {
            "pscluster_port_base": 35000, "pscluster_mode": "async", "pscluster_env": {"OMP_NUM_THREADS": 1},
            "pscluster_workdir": str(REPO)})
        cli(["up", inventory, "--name", name], state_dir)
        job = Job(state_dir, name, "--min-workers", "2", "--host-timeout", str(timeout))
        try:
            job.watch_until(f"trained {RUN_BEFORE} steps", lambda j: (j.get("step") or 0) >= RUN_BEFORE)
            began = time.monotonic()
            at_cut = job.seen[-1][1]
            lab.cut("node-3")
            # The chief saves after 2 s without its closure on node-3 (roles/async_driver.py):
            # "went on" is the first step reported after the record shows two workers running.
            job.watch_until("went on without node-3", lambda j: j.get("workers") == 2 and j.get("state") == "running")
            resized = time.monotonic()
            after = job.watch_until("trained without node-3", lambda j: any(t > resized for t, _ in job.seen))
            first = min(t for t, _ in job.seen if t > resized)
            restored = after.get("restored_step") or 0
            lab.heal("node-3")
        finally:
            lab.heal_all()
            job.stop()
            _down(name, state_dir)
    return {"continue_seconds": first - began, "host_timeout": timeout, "steps_lost": max(0, at_cut - restored)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.elastic", description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="async,sync", help="comma-separated; 'none' for the host loss alone")
    parser.add_argument("--no-lab", action="store_true", help="skip the SSH lab (planned resizes, host loss)")
    parser.add_argument("--no-local", action="store_true", help="skip the local cluster (planned resizes)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--work", type=Path, help="keep the states and each train's output here (default: a "
                                                   "temporary folder, removed)")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pscluster-elastic-") as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        modes = [mode for mode in args.modes.split(",") if mode and mode != "none"]
        for number, mode in enumerate([] if args.no_local else modes):
            grow, shrink = _inventory(work, mode, 3), _inventory(work, mode, 2)
            base = 36000 + 100 * number
            results[mode] = {"planned": planned(mode, grow, shrink, work, base),
                             "by_hand": by_hand(mode, grow, shrink, work, base + 50)}
            results[mode]["ratio"] = results[mode]["planned"]["pause"] / results[mode]["by_hand"]["pause"]
            print(f"{mode}: {json.dumps(results[mode])}", file=sys.stderr, flush=True)
        if not args.no_lab and os.geteuid() == 0:
            if modes:
                results["lab"] = lab_planned(modes, work)
            results["host_loss"] = host_loss(work)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    rows = []
    for where, found in (("local", results), ("SSH lab", results.get("lab", {}))):
        for mode in modes:
            if mode not in found:
                continue
            r = found[mode]
            removal = r["planned"].get("removal_pause")
            record = r["planned"]["pause_record"] / r["by_hand"]["pause_record"]
            rows.append([f"{mode} ({where})", f"{r['planned']['pause']:.1f}", f"{r['by_hand']['pause']:.1f}",
                         f"{r['ratio']:.2f}", f"{r['planned']['pause_record']:.1f} / {r['by_hand']['pause_record']:.1f}"
                         f" = {record:.2f}", "-" if removal is None else f"{removal:.1f}",
                         str(r["planned"]["steps_lost_resize"]), str(r["planned"]["steps_lost_down"])])
    print_columns(["mode", "scale pause s", "by hand s", "ratio", "job record: scale / by hand", "remove again s",
                   "steps lost: scale",
                   "steps lost: down"], rows)
    if "host_loss" in results:
        loss = results["host_loss"]
        print(f"unplanned host loss (lab, async): went on after {loss['continue_seconds']:.1f} s "
              f"(goal <= --host-timeout {loss['host_timeout']} + 10 s), {loss['steps_lost']} steps lost "
              f"(the steps at the cut against those the job resumed from)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
