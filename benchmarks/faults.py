"""Issue 41: what an unplanned fault costs, over many trials at random moments (the 3-host SSH lab).

The lab of the issue: three fake hosts (network namespaces with their own sshd, each its own
workdir). Async: chief, ps:0 and worker:0 on node-1, ps:1 and worker:1 on node-2, worker:2 on
node-3. Sync (MultiWorkerMirroredStrategy): one worker on each. Each trial is what a user types:
``up``, ``train distributed_mnist --steps N --json`` (the defaults: a 60 s host timeout, a
snapshot every 15 s in async, the derived stall timeout; ``--host-timeout`` sets one), one fault at a random step (15-60 % of
the budget), then ``down``. The faults (``--faults`` picks some):

=================  ========================================================================
cut-5s/20s/60s     node-3's link down for that long, then healed (worker:2)
cut-for-good       node-3's link down until the job ends, under ``--min-workers 2``
one-way            node-1 drops every packet from node-3 for 20 s (node-3 still hears node-1)
throttle           node-3's link at 1 Mbit/s for 30 s
sigstop-worker     worker:2 SIGSTOPped for 60 s, then continued
kill-worker        SIGKILL of worker:1 (the middle of the list)
kill-ps            SIGKILL of ps:1 (async)
kill-chief         SIGKILL of the chief (async: chief:0; sync: worker:0, the collective's chief)
ps-cut-for-good    node-2 (ps:1, worker:1) cut until the job ends, under ``--min-workers 2`` (async): ps:1
                   moves to node-1, worker:1 leaves, the chief restarts from its newest snapshot
chief-cut-20s      node-1's link down for 20 s (the chief, ps:0 and worker:0)
=================  ========================================================================

Per trial: the **outcome** (``rode through``: finished at ≥ 98.5 % with every worker, nothing
restored; ``went on without``: finished after dropping a worker; ``restored``: finished after a
restore; ``failed: <the CLI's error line>``; ``crashed``: ended without one; ``hang``: did not
end within ``--limit`` s of the fault's end, stopped by this script), **steps lost** (steps redone after a restore, plus in async
the steps past the budget: closures that ran twice), the **pause** (the longest time without a
progress event of the job's leader, about one every 1.5 s while it trains, from the fault until
60 s after its end; ``gap_before``: the longest in the 60 s before it, the reporting interval
under this machine's load; ``pause_record``: the same on the job record as `status` shows it),
and the processes **left** after ``down``.

Goals (issue 41): 0 hangs; async worker faults lose at most the closures in flight on the worker
(2 closures of 32 steps: 64) and go on within ``--host-timeout`` + 5 s; a ps fault loses at most
one snapshot interval of steps (15 s at the job's own rate), and after a ps host lost for good
training goes on within ``--host-timeout`` + 10 s; nothing left after ``down``.

Every trial is appended to ``--record`` (JSON lines) as it ends; ``--report FILE...`` prints
the table of every trial recorded (runs of this script add up). Needs root (the lab).

Usage: ``python -m benchmarks.faults [--trials 24] [--modes async,sync] [--faults cut-20s,kill-ps]
[--quick | --ci] [--model cnn|mlp] [--record FILE] [--seed N]`` or ``python -m benchmarks.faults
--report FILE...``. ``--ci`` is the short form ``.ci/run`` runs after the suite: distributed_mnist's
MLP (90 % is its bar), three trials: the 20-s cut of a worker host (issue 41's hang came from
one), a killed ps, a killed sync worker.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import cli, down_counting_left, stop_train  # noqa: E402
from testbed.netlab import Lab, LabUnavailable, check_available, write_inventory  # noqa: E402

# distributed_mnist's models (MNIST_MODEL): the CNN a user gets, with budgets that reach 98.5 % with
# a margin (tests/lab/test_elastic_lab.py), and the MLP of the fault tests for CI's short form.
MODELS: dict[str, dict[str, Any]] = {"cnn": {"budget": {"async": 3500, "sync": 2000}, "accuracy": 0.985},
                                     "mlp": {"budget": {"async": 1500, "sync": 800}, "accuracy": 0.90}}
HOST_TIMEOUT = 60.0                # train's default --host-timeout
IN_FLIGHT_STEPS = 2 * 32          # roles/async_driver.py: 2 closures per worker of 32 steps
SNAPSHOT_EVERY = 15.0             # cluster/supervision/train_spec.py DEFAULT_SNAPSHOT_EVERY


@dataclass
class Trial:
    """What a fault acts on: the lab, the cluster's state file and the job's own records."""

    lab: Lab
    state_file: Path
    mode: str

    def record(self, task: str) -> dict[str, Any]:
        kind = "train" if task.startswith("chief") or self.mode == "sync" else "server"
        records = [r for r in json.loads(self.state_file.read_text())["processes"]
                   if r["task"] == task and r["kind"] == kind and not r.get("stopped") and r.get("pid")]
        if not records:
            raise RuntimeError(f"no live {kind} record of {task}")
        return records[-1]

    def signal(self, task: str, sig: int) -> Callable[[], None]:
        pid = self.record(task)["pid"]
        born = _starttime(pid)
        os.kill(pid, sig)

        def resume() -> None:
            if sig == signal.SIGSTOP and born is not None and _starttime(pid) == born:
                os.kill(pid, signal.SIGCONT)
        return resume


def _starttime(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _cut(host: str, seconds: float | None) -> tuple[Callable[[Trial], Callable[[], None]], float | None]:
    def apply(t: Trial) -> Callable[[], None]:
        t.lab.cut(host)
        return lambda: t.lab.heal(host)
    return apply, seconds


def _one_way(t: Trial) -> Callable[[], None]:
    t.lab.block("node-3", "node-1")

    def undo() -> None:
        t.lab.exec_in_netns("node-1", ["nft", "delete", "table", "inet", "netlab_block"], check=True)
    return undo


def _throttle(t: Trial) -> Callable[[], None]:
    t.lab.throttle("node-3", "1mbit")
    return lambda: t.lab.unthrottle("node-3")


def _chief(t: Trial) -> str:
    return "chief:0" if t.mode == "async" else "worker:0"


@dataclass(frozen=True)
class Fault:
    name: str
    apply: Callable[[Trial], Callable[[], None]]
    seconds: float | None          # until it is undone; None: until the job ends
    modes: tuple[str, ...] = ("async", "sync")
    min_workers: bool = False
    kind: str = "worker"           # what the goals hold it to: worker, ps, chief, host


def _faults() -> dict[str, Fault]:
    faults = [Fault("cut-5s", *_cut("node-3", 5)), Fault("cut-20s", *_cut("node-3", 20)),
              Fault("cut-60s", *_cut("node-3", 60)),
              Fault("cut-for-good", *_cut("node-3", None), min_workers=True),
              Fault("one-way", _one_way, 20), Fault("throttle", _throttle, 30),
              Fault("sigstop-worker", lambda t: t.signal("worker:2", signal.SIGSTOP), 60),
              Fault("kill-worker", lambda t: t.signal("worker:1", signal.SIGKILL), 0),
              Fault("kill-ps", lambda t: t.signal("ps:1", signal.SIGKILL), 0, modes=("async",), kind="ps"),
              Fault("kill-chief", lambda t: t.signal(_chief(t), signal.SIGKILL), 0, kind="chief"),
              Fault("ps-cut-for-good", *_cut("node-2", None), modes=("async",), min_workers=True, kind="ps"),
              Fault("chief-cut-20s", *_cut("node-1", 20), kind="host")]
    return {fault.name: fault for fault in faults}


FAULTS = _faults()


def _groups(mode: str, work: Path) -> dict[str, Any]:
    def at(*hosts: str) -> dict[str, Any]:
        return {host: {"pscluster_workdir": str(work / f"work-{host}")} for host in hosts}
    workers = at("node-1", "node-2", "node-3")
    return {"chief": at("node-1"), "ps": at("node-1", "node-2"), "worker": workers} if mode == "async" else {"worker": workers}


def _job(state_file: Path) -> dict[str, Any]:
    try:
        return json.loads(state_file.read_text()).get("job") or {}
    except (FileNotFoundError, ValueError):
        return {}


def _leader_events(work: Path, name: str, mode: str, pattern: str = "job-*/{leader}.*.events.jsonl"):
    """Every event the job's leader wrote (its files on node-1's workdir, the lab's shared disk)."""
    leader = "chief-0" if mode == "async" else "worker-0"
    for path in (work / "work-node-1" / ".pscluster" / name).glob(pattern.format(leader=leader)):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("step"), int):
                yield event


def _first_save(work: Path, name: str, mode: str) -> int | None:
    """The step of the leader's first checkpoint event in its first attempt (a fault before it
    restarts from 0); None: the first attempt saved nothing."""
    return next((event["step"] for event in _leader_events(work, name, mode, "job-1/{leader}.1.events.jsonl")
                 if event.get("event") == "checkpoint"), None)


def _progress(work: Path, name: str, mode: str) -> list[tuple[float, int]]:
    """(time, step) of every progress event the job's leader wrote, every attempt of it (its own
    clock: the record's step stands still while the supervisor restarts a task, training not)."""
    return sorted((float(event["ts"]), event["step"]) for event in _leader_events(work, name, mode)
                  if event.get("event") == "progress")


WINDOW = 60.0      # seconds after a fault's end within which its pause is looked for


def pauses(progress: list[tuple[float, int]], start: float, end: float, budget: int) -> tuple[float, float]:
    """(pause, gap before): the longest time without a progress event of the leader from the
    fault's start until WINDOW s after its end (or the last event before the budget: the final
    report comes after the last save), and the longest gap in the WINDOW s before the fault (the
    reporting interval under this machine's load, to compare with). Gaps long after a fault are
    the machine's load, not the fault's cost."""
    before = [t for t, step in progress if start - WINDOW <= t <= start]
    later = [t for t, step in progress if t > start and step < budget]
    # Every event in the window, and the first after it (a job that went on only later).
    after = [t for t in later if t <= end + WINDOW] + [t for t in later if t > end + WINDOW][:1]
    ends = [start] + after
    pause = max((b - a for a, b in zip(ends, ends[1:])), default=0.0)
    gap = max((b - a for a, b in zip(before, before[1:])), default=0.0)
    return round(pause, 1), round(gap, 1)


def went_without(said: str) -> bool:
    """Whether the job dropped a worker and did not take it back before the end (``train``'s
    output, whitespace folded): a resize without it, or the chief counting it out for good."""
    return "in place with" in said or "resized (" in said or said.count("is out of training") > said.count("trains again")


def _reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip().lower().startswith("error")]
    return (lines[-1] if lines else (stderr.strip().splitlines() or ["(no output)"])[-1])[:160]


def _model(row: dict[str, Any]) -> dict[str, Any]:
    return MODELS[row.get("model", "cnn")]


def trial(lab: Lab, work: Path, number: int, mode: str, fault: Fault, rng: random.Random,
          limit: float, host_timeout: float | None = None, model: str = "cnn",
          after_save: bool = False) -> dict[str, Any]:
    """One trial; ``after_save``: the fault waits for the job's first save too (CI's short form:
    a restore must then resume from the newest save, not from the start)."""
    name = f"faults-{number}"
    state_dir = work / "state"
    state_file = state_dir / f"{name}.json"
    inventory = write_inventory(lab, work / f"{name}.yaml", _groups(mode, work), {
        "pscluster_port_base": 39000 + (number % 8) * 40, "pscluster_mode": mode,
        "pscluster_env": {"OMP_NUM_THREADS": 1, "MNIST_MODEL": model}, "pscluster_intra_op_threads": 1})
    row: dict[str, Any] = {"mode": mode, "fault": fault.name, "trial": number, "model": model,
                           "host_timeout": host_timeout or HOST_TIMEOUT}
    _, up = cli(["up", inventory, "--name", name], state_dir, check=False)
    if up.returncode != 0:
        row["outcome"] = f"up failed: {_reason(up.stderr)}"
        cli(["down", "--name", name, "--now"], state_dir, check=False)
        return row
    # A fault after the first save (15 s in) needs a budget that lasts past it: twice the steps.
    budget = _model(row)["budget"][mode] * (2 if after_save else 1)
    argv = [sys.executable, "-m", "cluster", "train", "distributed_mnist", "--name", name, "--json",
            "--steps", str(budget)] + (["--host-timeout", f"{host_timeout:g}"] if host_timeout else []) \
        + (["--min-workers", "2"] if fault.min_workers else [])
    out_path, err_path = work / f"{name}.out", work / f"{name}.err"
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1", COLUMNS="200")
    seen: list[tuple[float, int]] = []

    def look() -> dict[str, Any]:
        job = _job(state_file)
        step = job.get("step")
        if step is not None and (not seen or seen[-1][1] != step):
            seen.append((time.monotonic(), step))
        return job

    trigger = int(budget * rng.uniform(0.15, 0.6))
    undo: Callable[[], None] | None = None
    hang = False
    with open(out_path, "w") as out, open(err_path, "w") as err:
        train = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
        try:
            job: dict[str, Any] = {}
            while train.poll() is None:
                job = look()
                if (job.get("step") or 0) >= trigger and (job.get("checkpoint_step") or not after_save):
                    break
                time.sleep(0.1)
            if train.poll() is not None:
                row["outcome"] = "ended before the fault"
            else:
                fault_at, fault_wall, row["fault_step"] = time.monotonic(), time.time(), seen[-1][1]
                if after_save:
                    row["saved_at_fault"] = job.get("checkpoint_step") or 0
                undo = fault.apply(Trial(lab, state_file, mode))
                heal_at = fault_at + fault.seconds if fault.seconds is not None else None
                deadline = fault_at + (fault.seconds or 0) + limit
                while train.poll() is None:
                    look()
                    now = time.monotonic()
                    if heal_at is not None and now >= heal_at and undo is not None:
                        undo()
                        undo = None
                    if now > deadline:
                        hang = True
                        break
                    time.sleep(0.1)
                row["fault_ts"], row["fault_end_ts"] = fault_wall, fault_wall + (fault.seconds or 0)
                row["pause"], row["gap_before"] = pauses(_progress(work, name, mode), row["fault_ts"],
                                                         row["fault_end_ts"], budget)
                look()
                marks = [fault_at] + [t for t, _ in seen if t > fault_at]
                row["pause_record"] = round(max((b - a for a, b in zip(marks, marks[1:])), default=0.0), 1)
        finally:
            if undo is not None:
                undo()
            lab.heal_all()
            stop_train(train)
    stdout, stderr = out_path.read_text(), err_path.read_text()
    if "outcome" not in row:
        report: dict[str, Any] = {}
        if train.returncode == 0:
            try:
                report = json.loads(stdout)
            except ValueError:
                pass
        row["restored_step"] = report.get("restored_step") or 0
        said = " ".join(stderr.split())
        if hang:
            row["outcome"] = "hang"
        elif not report:
            # A named failure is the CLI's own "error:" line (a task's log tail may quote a traceback).
            named = any(line.startswith("error:") for line in stderr.splitlines())
            row["outcome"] = ("failed: " if named else "crashed: ") + _reason(stderr)
        elif (report.get("val_accuracy") or 0) < _model(row)["accuracy"]:
            row["outcome"] = f"finished at {report.get('val_accuracy')}"
        elif row["restored_step"] or report.get("steps_redone"):
            # (from the start when nothing was saved yet: restored_step 0); a ps host lost for good:
            # its ps moved to another host first (cluster/supervision/train_resize.py move_ps)
            row["outcome"] = "ps moved, restored" if " moved from " in said else "restored"
        elif went_without(said):
            row["outcome"] = "went on without"
        else:
            row["outcome"] = "rode through"
        if report:
            over = max(0, (report.get("global_step") or budget) - budget) if mode == "async" else 0
            row["steps_lost"] = (report.get("steps_redone") or 0) + over
            row["accuracy"] = report.get("val_accuracy")
            row["restarts"] = report.get("restarts") or {}
            seconds = report.get("train_seconds") or report.get("wall_seconds") or 0
            row["snapshot_steps"] = round(SNAPSHOT_EVERY * budget / seconds) if seconds else None
            row["first_save_step"] = _first_save(work, name, mode)
    down, row["left"] = down_counting_left(name, state_dir)
    if down.returncode != 0:
        row["down"] = _reason(down.stderr)
    return row


def plan_trials(trials: int, modes: list[str], faults: list[str], rng: random.Random) -> list[tuple[str, Fault]]:
    """Round robin over every (mode, fault) that applies, each round in a random order."""
    pairs = [(mode, FAULTS[name]) for name in faults for mode in modes if mode in FAULTS[name].modes]
    order: list[tuple[str, Fault]] = []
    while len(order) < trials and pairs:
        round_ = list(pairs)
        rng.shuffle(round_)
        order += round_
    return order[:trials]


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """Each of issue 41's goals and whether these trials meet it."""
    lines: list[str] = []
    if not rows:
        return lines
    hangs = [r for r in rows if r["outcome"] == "hang"]
    lines.append(f"{'MET ' if not hangs else 'MISS'} 0 hangs: {len(hangs)} in {len(rows)} trials")
    ended = [r for r in rows if r["outcome"] in ("rode through", "went on without", "restored", "ps moved, restored")
             or r["outcome"].startswith("failed: ")]
    bars = "/".join(sorted({f"{_model(r)['accuracy']:.1%}" for r in rows}))
    lines.append(f"{'MET ' if len(ended) == len(rows) else 'MISS'} every trial finished at >= {bars} or failed "
                 f"naming the cause: {len(ended)}/{len(rows)}")
    worker = [r for r in rows if r["mode"] == "async" and FAULTS[r["fault"]].kind == "worker" and "steps_lost" in r]
    if worker:
        lost = max(r["steps_lost"] for r in worker)
        worst = max(worker, key=lambda r: r["pause"] - r.get("host_timeout", HOST_TIMEOUT))
        lines.append(f"{'MET ' if lost <= IN_FLIGHT_STEPS else 'MISS'} async worker faults lose <= the closures in "
                     f"flight ({IN_FLIGHT_STEPS} steps): at most {lost}")
        bound = worst.get("host_timeout", HOST_TIMEOUT) + 5
        lines.append(f"{'MET ' if worst['pause'] <= bound else 'MISS'} async worker faults go on within "
                     f"--host-timeout + 5 s ({bound:g} s): longest pause {max(r['pause'] for r in worker)} s")
    ps = [r for r in rows if FAULTS[r["fault"]].kind == "ps" and "steps_lost" in r and r.get("snapshot_steps")]
    if ps:
        # One interval at the job's rate, or everything before the first save (a fault before it
        # restarts from step 0: the first snapshot comes 15 s after the chief's start).
        def bound(r: dict[str, Any]) -> int:
            before_first = r.get("first_save_step") if r.get("first_save_step") is not None else r["steps_lost"]
            return max(r["snapshot_steps"], before_first)
        worst = max(ps, key=lambda r: r["steps_lost"] / bound(r))
        lines.append(f"{'MET ' if worst['steps_lost'] <= bound(worst) else 'MISS'} ps faults lose <= one "
                     f"snapshot interval (or what came before the first save): at most {worst['steps_lost']} "
                     f"steps against {bound(worst)}")
    moved = [r for r in rows if r["fault"] == "ps-cut-for-good" and r["outcome"] == "ps moved, restored"]
    if moved:
        # The pause counts from the cut: the host timeout runs from its last heartbeat, about then.
        worst = max(moved, key=lambda r: r["pause"] - r.get("host_timeout", HOST_TIMEOUT))
        bound = worst.get("host_timeout", HOST_TIMEOUT) + 10
        lines.append(f"{'MET ' if worst['pause'] <= bound else 'MISS'} a ps host lost for good: training goes on "
                     f"within --host-timeout + 10 s ({bound:g} s): longest pause {max(r['pause'] for r in moved)} s")
    saved = [r for r in rows if r.get("saved_at_fault")]
    if saved:
        # A fault after a save must restore, from it (or a newer one), never from the start; one
        # that ended the job's budget first proved nothing.
        short = [r for r in saved if r["outcome"] not in ("restored", "ps moved, restored")
                 or (r.get("restored_step") or 0) < r["saved_at_fault"]]
        lines.append(f"{'MET ' if not short else 'MISS'} a restore after a save resumes from the newest save: "
                     f"{len(saved) - len(short)}/{len(saved)}"
                     + "".join(f"; {r['mode']} {r['fault']} saved {r['saved_at_fault']}, restored "
                               f"{r.get('restored_step') or 0}" for r in short))
    left = sum(r.get("left") or 0 for r in rows)
    lines.append(f"{'MET ' if not left else 'MISS'} nothing left after down: {left} process(es)")
    return lines


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| mode | fault | trials | outcomes | steps lost (max) | pause max (s) | left after down |",
           "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["mode"], r["fault"]) for r in rows}, key=lambda k: (k[0], list(FAULTS).index(k[1])))
    for mode, fault in keys:
        group = [r for r in rows if (r["mode"], r["fault"]) == (mode, fault)]
        counts: dict[str, int] = {}
        for r in group:
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        outcomes = "; ".join(f"{count}x {what}" for what, count in sorted(counts.items(), key=lambda kv: -kv[1]))
        lost = [r["steps_lost"] for r in group if "steps_lost" in r]
        pauses = [r["pause"] for r in group if "pause" in r and r["outcome"] != "hang"]
        out.append(f"| {mode} | {fault} | {len(group)} | {outcomes} | {max(lost) if lost else '-'} "
                   f"| {max(pauses) if pauses else '-'} | {sum(r.get('left') or 0 for r in group)} |")
    return "\n".join(out)


def recompute(row: dict[str, Any], work: Path) -> dict[str, Any]:
    """A row recorded before the script kept the fault's time (and its window for the pause), or
    its outcome's finer names, done again from the trial's files in ``work`` when they are there."""
    progress = _progress(work, f"faults-{row['trial']}", row["mode"])
    if "fault_ts" not in row and row.get("fault_step") is not None and progress:
        # The fault came when the job record showed fault_step: the first event at or past it.
        found = next((t for t, step in progress if step >= row["fault_step"]), None)
        if found is not None:
            row["fault_ts"], row["fault_end_ts"] = found, found + (FAULTS[row["fault"]].seconds or 0)
            row["pause"], row["gap_before"] = pauses(progress, found, row["fault_end_ts"],
                                                     _model(row)["budget"][row["mode"]])
    err = work / f"faults-{row['trial']}.err"
    if row.get("outcome") == "rode through":
        if row.get("mode") == "sync" and row.get("steps_lost"):
            row["outcome"] = "restored"
        elif err.exists() and went_without(" ".join(err.read_text(errors="replace").split())):
            row["outcome"] = "went on without"
    return row


def report(paths: list[Path]) -> int:
    rows = [recompute(json.loads(line), path.parent)
            for path in paths for line in path.read_text().splitlines() if line.strip()]
    print(table(rows))
    print()
    print("\n".join(goals(rows)))
    return 0 if all(line.startswith("MET") for line in goals(rows)) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--modes", default="async,sync")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--ci", action="store_true",
                        help="CI's short form: the MLP, three trials (async cut-20s and kill-ps, sync kill-worker)")
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn", help="distributed_mnist's MNIST_MODEL")
    parser.add_argument("--quick", action="store_true",
                        help="one trial per fault kind: the async ones, and the sync cut-20s and kill-worker")
    parser.add_argument("--host-timeout", type=float, help="train --host-timeout (default: train's own, 60 s)")
    parser.add_argument("--limit", type=float, default=300.0,
                        help="seconds after the fault's end before a trial counts as a hang")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--record", type=Path, help="append every trial here as a JSON line")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--report", type=Path, nargs="+", metavar="FILE", help="print the table of recorded trials")
    args = parser.parse_args(argv)
    if args.report:
        return report(args.report)
    names = [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAULTS]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown or not names or not set(modes) <= {"async", "sync"}:
        parser.error(f"unknown fault(s) {unknown} or mode(s) {modes}: faults are {', '.join(FAULTS)}; modes async, sync")
    try:
        check_available()
    except LabUnavailable as exc:
        print(f"benchmarks.faults: the SSH lab is not available here: {exc}", file=sys.stderr)
        return 2
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    # SIGTERM (or SIGINT, which a shell's background job ignores) ends the trial in flight
    # through its cleanup: the job stopped, the cluster down, the lab removed.
    signal.signal(signal.SIGTERM, interrupted)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    after_save: set[str] = set()      # the faults that wait for the job's first save
    if args.ci:
        args.model = "mlp"
        # The restores wait for the first save: each then proves it resumes from the newest save
        # (what tests/local once proved apart, issue 47).
        order = [("async", FAULTS["cut-20s"]), ("async", FAULTS["kill-ps"]), ("sync", FAULTS["kill-worker"])]
        after_save = {"kill-ps", "kill-worker"}
    elif args.quick:
        order = [("async", fault) for fault in FAULTS.values() if "async" in fault.modes] + \
            [("sync", FAULTS["cut-20s"]), ("sync", FAULTS["kill-worker"])]
    else:
        order = plan_trials(args.trials, modes, names, rng)
    work = args.work or Path(tempfile.mkdtemp(prefix="pscluster-faults-"))
    record = args.record or work / "faults.jsonl"
    print(f"benchmarks.faults: {len(order)} trial(s), seed {seed}, recorded in {record}", file=sys.stderr, flush=True)
    rows = []
    with Lab(3, work / "lab", subnet="auto") as lab:
        for number, (mode, fault) in enumerate(order, 1):
            began = time.monotonic()
            row = trial(lab, work, number, mode, fault, rng, args.limit, args.host_timeout, args.model,
                        after_save=fault.name in after_save)
            row["seconds"] = round(time.monotonic() - began)
            rows.append(row)
            with open(record, "a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"trial {number}/{len(order)}: {json.dumps(row)}", file=sys.stderr, flush=True)
    print(table(rows))
    print()
    print("\n".join(goals(rows)))
    return 0 if all(line.startswith("MET") for line in goals(rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
