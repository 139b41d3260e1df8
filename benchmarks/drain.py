"""Issue 44: ``pscluster drain HOST --deadline 30s`` at a random moment of a training job, and
what a drain's planning costs the orchestrator at 1,000 hosts.

**Trials** (the local cluster: every "host" is this machine, 127.0.0.2 and up, a port base each,
as tests/local/test_drain.py does; with ``--lab``, the 3-host SSH lab of testbed/netlab.py, root:
``LAB_GROUPS`` gives each role's cluster there). Each trial is what a user types: ``up``, ``train
distributed_mnist --steps N --json`` (the MLP, MNIST_MODEL=mlp), ``drain HOST --deadline 30s``
once the job record's step passed a random step (20-60 % of the budget; ``--at``), the job's end, then
``down``. The roles (``--roles``):

=============  ===========================================================================
async-worker   async, chief on ``main``, ps on ``p1``, a worker on ``w1`` and ``w2``: one
               worker host (picked at random) drained; it leaves in place, the job finishes
sync-worker    sync (MultiWorkerMirroredStrategy), a worker on ``w1``, ``w2`` and ``w3``: ``w2``
               or ``w3`` drained (``w1`` runs worker:0, the leader, which a resize refuses to
               move), a resize (one save, a restart at the smaller size)
ps             the async cluster with a second ps on ``main``: ``p1`` drained, its ps (ps:1)
               moves to ps:0 in place (the chief moves the variables and traces its functions
               again; nothing restored, nothing restarted)
ps-one         the async cluster (one ps, on ``p1``): ``p1`` drained, its ps moves to ``main``
               (the chief's host: no other ps host), the job checkpoints at one step and its
               chief restarts there
ps-idle        the async cluster with ``pscluster_idle_ps: 1`` and the idle ps:1 on ``main``:
               ps:0 on ``p1`` holds every variable (the only ps that does); ``p1`` drained, its
               variables move to the idle ps in place
chief          the async cluster's ``main`` drained: the job checkpoints instead (exit 1)
=============  ===========================================================================

Per trial: the drain's wall time and exit status, whether it ended before the deadline, the
**steps lost** (steps redone after a restore plus, in async, the steps past the budget: closures
run twice; a checkpoint instead: the steps between the checkpoint and the job's last progress
event), the **pause** (the longest time the job's leader collected no work, a closure or a sync step,
from the drain's start until a minute after its end: its progress events say when their work came
in, ``work_pauses``; ``gap_before``: the longest such gap in the minute before; a record without
those fields, the longest time without a progress event, ``benchmarks.faults.pauses``), the
accuracy, and the processes **left** after ``down``.

**On paper** (``--paper``: no TensorFlow, seconds): the orchestrator's own time for a drain's
planning on synthetic plans of N = 16, 64, 256, 1,000 hosts (a worker per host; async: the
chief and the ps on h1 too), draining the host in the middle of the worker list: ``plan_drain``
(async: all a drain in place decides before it asks the chief), and ``plan_drain`` + the
re-plan from the inventory + ``diff_plans`` + ``check_resize`` (a sync drain's resize), beside
torch elastic's 10 s rendezvous at 4,000 hosts.

Goals (issue 44): async worker host: 0 steps lost, pause <= 1 s, every drain before the
deadline; sync: 0 steps lost, pause <= the planned resize's (1.9 s); ps host: 0 steps lost, pause
<= 5 s, before the deadline; nothing left after ``down``.

Usage: ``python -m benchmarks.drain [--trials 3] [--roles async-worker,sync-worker,ps,ps-one,ps-idle,chief]
[--steps N] [--deadline 30s] [--at 0.2-0.6] [--seed N] [--record FILE] [--lab]``; ``python -m benchmarks.drain --paper
[--hosts 16,64,256,1000] [--repeat 5]``; ``python -m benchmarks.drain --report FILE...``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.common import cli, down_counting_left, print_columns, stop_train  # noqa: E402
from benchmarks.faults import WINDOW, pauses  # noqa: E402

ROLES = ("async-worker", "sync-worker", "ps", "ps-one", "ps-idle", "chief")
PS_ROLES = ("ps", "ps-one", "ps-idle")
# benchmarks/faults.py's MLP budget in async; in sync three times its 800: the resize starts the
# new workers while the old ones train, ~20 s on this 2-core machine, and 800 steps were over by then.
BUDGET = {"async": 1500, "sync": 2400}
ACCURACY = 0.90                               # distributed_mnist's MLP bar
DEADLINE = "30s"
SYNC_RESIZE_PAUSE = 1.9                       # the planned sync resize's pause today (1.6-1.9 s)
TORCH_RENDEZVOUS = (4000, 10.0)               # torch elastic: a 10 s rendezvous at 4,000 hosts
ASYNC_GOAL = {"pause": 1.0, "lost": 0}
PS_GOAL = {"pause": 5.0, "lost": 0}


# ---------------------------------------------------------------------------- the trials
def inventory_text(role: str, port_base: int) -> str:
    """The local inventory of a trial of ``role`` (module docstring): each host 127.0.0.x with a
    port base of its own (20 ports apart from ``port_base``)."""
    sync = role == "sync-worker"
    hosts = ["w1", "w2", "w3"] if sync else ["main", "p1", "w1", "w2"]
    # ps: another ps to move to in place; ps-idle: one that holds nothing until then (listed last)
    ps_hosts = {"ps": ["main", "p1"], "ps-idle": ["p1", "main"]}.get(role, ["p1"])

    def host(name: str) -> str:
        number = hosts.index(name)
        return "%s: {ansible_host: 127.0.0.%d, pscluster_port_base: %d}" % (name, 2 + number, port_base + 20 * number)
    lines = ["all:", "  vars:", "    ansible_connection: local", f"    pscluster_mode: {'sync' if sync else 'async'}",
             "    pscluster_env: {OMP_NUM_THREADS: 1, MNIST_MODEL: mlp}", "  children:"]
    if role == "ps-idle":
        lines.insert(-2, "    pscluster_idle_ps: 1")
    if not sync:
        lines += ["    chief: {hosts: {%s}}" % host("main"), "    ps: {hosts: {%s}}" % ", ".join(map(host, ps_hosts))]
    lines += ["    worker:", "      hosts:"] + [f"        {host(h)}" for h in hosts if h.startswith("w")]
    return "\n".join(lines) + "\n"


# --lab: the 3-host SSH lab (testbed/netlab.py, node-1..node-3), each role's cluster and the host
# drained (one of them at random).
LAB_GROUPS = {
    "async-worker": ({"chief": ["node-1"], "ps": ["node-1"], "worker": ["node-2", "node-3"]}, ["node-2", "node-3"]),
    "sync-worker": ({"worker": ["node-1", "node-2", "node-3"]}, ["node-2", "node-3"]),
    "ps": ({"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-2", "node-3"]}, ["node-2"]),
    "ps-one": ({"chief": ["node-1"], "ps": ["node-2"], "worker": ["node-2", "node-3"]}, ["node-2"]),
    "ps-idle": ({"chief": ["node-1"], "ps": ["node-2", "node-1"], "worker": ["node-2", "node-3"]}, ["node-2"]),
    "chief": ({"chief": ["node-1"], "ps": ["node-1"], "worker": ["node-2", "node-3"]}, ["node-1"]),
}


def write_lab_inventory(lab: Any, path: Path, role: str, port_base: int) -> Path:
    from testbed.netlab import write_inventory
    mode = "sync" if role == "sync-worker" else "async"
    return write_inventory(lab, path, LAB_GROUPS[role][0], {
        "pscluster_port_base": port_base, "pscluster_mode": mode, "pscluster_intra_op_threads": 1,
        "pscluster_env": {"OMP_NUM_THREADS": 1, "MNIST_MODEL": "mlp"},
        **({"pscluster_idle_ps": 1} if role == "ps-idle" else {})})


def drained_host(role: str, rng: random.Random, lab: Any = None) -> str:
    if lab is not None:
        return rng.choice(LAB_GROUPS[role][1])
    if role in PS_ROLES:
        return "p1"
    if role == "chief":
        return "main"
    # In sync, w1 runs worker:0, the collective's leader: a resize refuses to move it (a chief drain).
    return rng.choice(["w2", "w3"] if role == "sync-worker" else ["w1", "w2"])


def _state(state_file: Path) -> dict[str, Any]:
    try:
        return json.loads(state_file.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def leader_events(state: dict[str, Any], mode: str, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` events of the job's leader (chief:0 in async, worker:0 in sync), every
    attempt: its events files, which the state's process records name."""
    leader = "chief:0" if mode == "async" else "worker:0"
    found = []
    paths = {r["events"] for r in state.get("processes", []) if r.get("task") == leader and r.get("events")}
    for path in paths:
        try:        # (a lab host's default workdir is ~/pscluster: the lab's hosts share this filesystem)
            lines = Path(path).expanduser().read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == kind:
                found.append(event)
    return found


def leader_progress(state: dict[str, Any], mode: str) -> list[tuple[float, int]]:
    """(time, step) of every progress event of the job's leader, every attempt."""
    return sorted((float(e["ts"]), e["step"]) for e in leader_events(state, mode, "progress")
                  if isinstance(e.get("step"), int))


def leader_work(state: dict[str, Any], mode: str) -> list[tuple[float, float, float, int]]:
    """(first, last, gap, step) of every progress event of the job's leader that says when its
    work came in (roles/reporting.py's ``work_from``/``work_to``/``gap``), every attempt, in
    time order."""
    return sorted((float(e["work_from"]), float(e["work_to"]), float(e.get("gap") or 0.0), e["step"])
                  for e in leader_events(state, mode, "progress")
                  if isinstance(e.get("step"), int) and isinstance(e.get("work_from"), (int, float))
                  and isinstance(e.get("work_to"), (int, float)))


def work_pauses(spans: list[tuple[float, float, float, int]], start: float, end: float,
                budget: int) -> tuple[float, float] | None:
    """(pause, gap before) between units of work (a closure, a sync step) rather than progress
    lines: the longest time the leader collected no work from the drain's start until WINDOW s
    after its end (a window's own longest gap, or the time from one window's last unit to the
    next one's first, a restarted process's included), and the same in the WINDOW s before.
    None without spans (a trainer older than the fields)."""
    spans = [span for span in spans if span[3] < budget]
    if not spans:
        return None

    def longest(lo: float, hi: float, spill: bool) -> float:
        inside = [span for span in spans if span[1] >= lo and span[0] <= hi]
        gaps = [gap for first, _, gap, _ in inside if first > lo]           # the gap into a unit after lo
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:]) if b[0] > lo and a[1] < hi and (spill or b[0] <= hi)]
        later = [span for span in spans if span[0] > hi] if spill else []
        if inside and later:     # the job went on only after the window: its first unit then
            gaps.append(later[0][0] - max(span[1] for span in inside))
        elif not inside and later:
            gaps.append(later[0][0] - lo)
        return max(gaps, default=0.0)
    return round(longest(start, end + WINDOW, True), 2), round(longest(start - WINDOW, start, False), 2)


def chief_membership_seconds(state: dict[str, Any], what: str = "moved") -> list[float]:
    """The seconds of each in-place ps move the async chief made (its ``membership`` events with
    ``moved``: from its drain of the closures in flight to its functions traced again), the
    chief's own measure of the move's pause, finer than the reporting gap; ``what="retired"``:
    each hold of a drained worker (until its closure in flight ended; the others train on)."""
    return [float(e.get("seconds") or 0.0) for e in leader_events(state, "async", "membership") if e.get(what)]


_CHECKPOINTED = re.compile(r"checkpointed at step (\d+)")
_DRAINED_IN = re.compile(r"drained in ([0-9.]+) s")
_RESTART = re.compile(r"\(([0-9.]+) s to restart")


def resized_after_the_end(row: dict[str, Any]) -> bool:
    """A drain whose resize (sync, or a ps move) saved at the budget's last step: the job trained
    to its end with every worker, so there was no pause to measure (and the host was not free
    before the end). Marks ``row`` so (its outcome, no pause)."""
    if row["role"] not in ("sync-worker", *PS_ROLES) or (row.get("restored_step") or 0) < row["budget"]:
        return False
    row["outcome"] = "resized after the end" + ("" if row["drain_rc"] == 0 else f" (drain exit {row['drain_rc']})")
    row["pause"] = None
    return True


def summarize(row: dict[str, Any], report: dict[str, Any], progress: list[tuple[float, int]],
              drain_stderr: str, work: list[tuple[float, float, float, int]] | None = None) -> dict[str, Any]:
    """Fill ``row`` (its role, drain_ts, drain_end_ts, drain_rc, drain_s, budget, deadline_s) with
    what a trial's report, the leader's progress and the drain's output say (module docstring)."""
    budget = row["budget"]
    said = " ".join(drain_stderr.split())
    row["before_deadline"] = row["drain_rc"] == 0 and row["drain_s"] <= row["deadline_s"]
    row["pause"], row["gap_before"] = pauses(progress, row["drain_ts"], row["drain_end_ts"], budget)
    finer = work_pauses(work or [], row["drain_ts"], row["drain_end_ts"], budget)
    if finer is not None:       # between units of work: the reporting gap no longer hides the pause
        row["report_pause"], row["report_gap_before"] = row["pause"], row["gap_before"]
        row["pause"], row["gap_before"] = finer
    checkpointed = _CHECKPOINTED.search(said)
    own = _DRAINED_IN.search(said)
    row["drain_own_s"] = float(own.group(1)) if own else None      # its own count, the CLI's start left out
    if row["role"] == "chief" or (row["drain_rc"] == 1 and checkpointed):     # (a ps whose move failed too)
        row["outcome"] = ("checkpoint instead" if row["drain_rc"] == 1 and checkpointed
                          else f"drain exit {row['drain_rc']}")
        row["checkpoint_step"] = int(checkpointed.group(1)) if checkpointed else None
        row["checkpoint_in_deadline"] = bool(checkpointed) and row["drain_s"] <= row["deadline_s"]
        row["pause"] = None         # the job stopped: no pause to speak of
        last = max((step for _, step in progress), default=None)
        if checkpointed and last is not None:
            row["steps_lost"] = max(0, last - int(checkpointed.group(1)))
        return row
    if not report:
        row["outcome"] = "job failed"
        return row
    row["restored_step"] = report.get("restored_step") or 0
    over = max(0, (report.get("global_step") or budget) - budget) if row["role"] in ("async-worker", *PS_ROLES) \
        else 0
    row["steps_lost"] = (report.get("steps_redone") or 0) + over
    row["global_step"] = report.get("global_step")
    row["accuracy"] = report.get("val_accuracy")
    if resized_after_the_end(row):
        pass
    elif row["drain_rc"] != 0:
        row["outcome"] = f"drain exit {row['drain_rc']}"
    elif (row["accuracy"] or 0) < ACCURACY:
        row["outcome"] = f"finished at {row['accuracy']}"
    else:
        row["outcome"] = "drained"
    return row


def trial(work: Path, number: int, role: str, rng: random.Random, *, steps: int | None, deadline: str,
          limit: float, lab: Any = None, at: tuple[float, float] = (0.2, 0.6)) -> dict[str, Any]:
    mode = "sync" if role == "sync-worker" else "async"
    name = f"drain-{os.getpid()}-{number}"
    state_dir = work / "state"
    state_file = state_dir / f"{name}.json"
    path = work / f"{name}.yaml"
    work.mkdir(parents=True, exist_ok=True)
    # Ports in 15000-15799: away from the tests' 20000-31999 (another session may run them).
    if lab is None:
        path.write_text(inventory_text(role, 15000 + (number % 8) * 100))
    else:
        write_lab_inventory(lab, path, role, 15000 + (number % 8) * 100)
    budget = steps or BUDGET[mode]
    host = drained_host(role, rng, lab)
    row: dict[str, Any] = {"role": role, "trial": number, "host": host, "budget": budget,
                           "deadline": deadline, "where": "local" if lab is None else "SSH lab"}
    _, up = cli(["up", path, "--name", name], state_dir, check=False)
    if up.returncode != 0:
        row["outcome"] = f"up failed: {(up.stderr.strip().splitlines() or ['?'])[-1][:160]}"
        cli(["down", "--name", name, "--now"], state_dir, check=False)
        return row
    argv = [sys.executable, "-m", "cluster", "train", "distributed_mnist", "--name", name, "--json",
            "--steps", str(budget), "--checkpoint-dir", str(work / f"{name}-ckpt")]
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1", COLUMNS="200")
    out_path, err_path = work / f"{name}.out", work / f"{name}.err"
    trigger = int(budget * rng.uniform(*at))
    drain_err = ""
    with open(out_path, "w") as out, open(err_path, "w") as err:
        train = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
        try:
            while ((_state(state_file).get("job") or {}).get("step") or 0) < trigger and train.poll() is None:
                time.sleep(0.1)
            if train.poll() is not None:
                row["outcome"] = "ended before the drain"
            else:
                row["drain_step"] = (_state(state_file).get("job") or {}).get("step")
                row["drain_ts"] = time.time()
                seconds, drain = cli(["drain", host, "--name", name, "--deadline", deadline], state_dir,
                                     check=False, timeout=limit)
                row["drain_end_ts"], row["drain_s"], row["drain_rc"] = time.time(), round(seconds, 2), drain.returncode
                drain_err = drain.stderr
                row["drain_said"] = " ".join(drain.stderr.split())[-300:]
                train.wait(limit)
        except subprocess.TimeoutExpired:
            row["outcome"] = "hang"
        finally:
            stop_train(train)
    row["train_rc"] = train.returncode
    if "outcome" not in row:
        from cluster.lifecycle.drain import parse_deadline
        row["deadline_s"] = parse_deadline(deadline)
        report: dict[str, Any] = {}
        if train.returncode == 0:
            try:
                report = json.loads(out_path.read_text())
            except ValueError:
                pass
        summarize(row, report, leader_progress(_state(state_file), mode), drain_err,
                  leader_work(_state(state_file), mode))
        if role in ("ps", "ps-idle"):
            row["chief_move_s"] = max(chief_membership_seconds(_state(state_file)), default=None)
        if role == "async-worker":
            row["chief_hold_s"] = max(chief_membership_seconds(_state(state_file), "retired"), default=None)
    _, row["left"] = down_counting_left(name, state_dir)
    return row


# ---------------------------------------------------------------------------- the table
def _max(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    return max(values) if values else "-"


def table(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One line per role: trials, outcomes, drain time (median, max), before the deadline,
    steps lost (max), pause (max) and the gap before (max), accuracy (min), left after down."""
    out = []
    keys = [(where, role) for where in ("local", "SSH lab") for role in ROLES
            if any(row["role"] == role and row.get("where", "local") == where for row in rows)]
    for where, role in keys:
        group = [row for row in rows if row["role"] == role and row.get("where", "local") == where]
        counts: dict[str, int] = {}
        for row in group:
            counts[row.get("outcome", "?")] = counts.get(row.get("outcome", "?"), 0) + 1
        drains = [row["drain_s"] for row in group if "drain_s" in row]
        accuracy = [row["accuracy"] for row in group if row.get("accuracy") is not None]
        if all(r.get("outcome") == "checkpoint instead" or r["role"] == "chief" for r in group):
            within = f"{sum(bool(r.get('checkpoint_in_deadline')) for r in group)}/{len(group)} checkpointed"
        else:
            within = f"{sum(bool(r.get('before_deadline')) for r in group)}/{len(group)}"
        out.append([role if where == "local" else f"{role} (SSH lab)", str(len(group)), "; ".join(f"{n}x {what}" for what, n in counts.items()),
                    f"{statistics.median(drains):.1f} / {max(drains):.1f}" if drains else "-", within,
                    str(_max([r.get("steps_lost") for r in group])), str(_max([r.get("pause") for r in group])),
                    str(_max([r.get("gap_before") for r in group])),
                    f"{min(accuracy):.3f}" if accuracy else "-", str(sum(r.get("left") or 0 for r in group))])
    return out


HEADER = ["role", "trials", "outcomes", "drain s (median / max)", "before deadline", "steps lost (max)",
          "pause max (s)", "gap before (s)", "accuracy (min)", "left"]


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 44's goals that these trials speak to, each MET or MISSED."""
    lines = []

    def line(ok: bool, text: str) -> None:
        lines.append(f"{'MET   ' if ok else 'MISSED'} {text}")
    for role, goal, bound in (("async-worker", "async worker host", ASYNC_GOAL), ("ps", "ps host", PS_GOAL),
                              ("ps-one", "the only ps's host", PS_GOAL),
                              ("ps-idle", "the only ps's host, an idle ps in the cluster", PS_GOAL)):
        group = [r for r in rows if r["role"] == role]
        if not group:
            continue
        within = sum(bool(r.get("before_deadline")) for r in group)
        lost = [r.get("steps_lost") for r in group]
        paused = [r["pause"] for r in group if r.get("pause") is not None]
        worst: str = f"longest {max(paused)} s" if len(paused) == len(group) else "the job stopped"
        line(within == len(group), f"{goal}: {within}/{len(group)} before the deadline")
        line(all(x is not None and x <= bound["lost"] for x in lost), f"{goal}: 0 steps lost (lost: {lost})")
        line(within == len(group) and len(paused) == len(group) and max(paused) <= bound["pause"],
             f"{goal}: chief pause <= {bound['pause']:g} s ({worst})")
    sync = [r for r in rows if r["role"] == "sync-worker"]
    if sync:
        lost = [r.get("steps_lost") for r in sync]
        paused = [r["pause"] for r in sync if r.get("pause") is not None]
        said = f"longest {max(paused)} s" if paused else "none measured"
        line(all(x == 0 for x in lost), f"sync worker host: 0 steps lost (lost: {lost})")
        line(len(paused) == len(sync) and max(paused) <= SYNC_RESIZE_PAUSE,
             f"sync worker host: pause <= the planned resize's {SYNC_RESIZE_PAUSE} s ({said}; "
             f"{len(sync) - len(paused)} resized only after the job's end)")
    chief = [r for r in rows if r["role"] == "chief"]
    if chief:
        line(all(r.get("checkpoint_in_deadline") for r in chief),
             f"chief host: checkpointed within the deadline instead: "
             f"{sum(bool(r.get('checkpoint_in_deadline')) for r in chief)}/{len(chief)}")
    left = sum(r.get("left") or 0 for r in rows)
    line(not left, f"nothing left after down: {left} process(es)")
    return lines


def print_trials(rows: list[dict[str, Any]]) -> int:
    print_columns(HEADER, table(rows))
    print()
    lines = goals(rows)
    print("\n".join(lines))
    restarts = [(float(m.group(1)), "started while the old ones trained" in r.get("drain_said", ""))
                for r in rows if r["role"] == "sync-worker"
                for m in [_RESTART.search(r.get("drain_said", ""))] if m]
    if restarts:
        overlapped = sorted(s for s, over in restarts if over)
        usual = sorted(s for s, over in restarts if not over)
        print("note   sync worker host: the resize's own count of its restart (the pause): "
              + "; ".join(f"{label} {len(group)}x, {group[0]:.2f}-{group[-1]:.2f} s" for label, group in
                          (("new workers started while the old ones trained", overlapped),
                           ("the usual path", usual)) if group))
    holds = sorted(r["chief_hold_s"] for r in rows if r.get("chief_hold_s") is not None)
    if holds:
        print(f"note   async worker host: the chief held the drained worker back {holds[0]:.2f}-{holds[-1]:.2f} s "
              f"(median {statistics.median(holds):.2f} s) until its closure in flight ended, the other workers "
              f"training meanwhile")
    moves = sorted(r["chief_move_s"] for r in rows if r.get("chief_move_s") is not None)
    if moves:
        print(f"note   ps host, in place: the chief's move (its own count: closures in flight ended, variables "
              f"moved, functions traced again) {moves[0]:.2f}-{moves[-1]:.2f} s, median "
              f"{statistics.median(moves):.2f} s, in {len(moves)} trial(s)")
    return 0 if all(line.startswith("MET") for line in lines) else 1


# ---------------------------------------------------------------------------- on paper
def synthetic_inventory(path: Path, hosts: int, mode: str) -> Path:
    """``hosts`` hosts h1..hN, a worker on every one; async: the chief and a ps on h1 too."""
    groups = "chief: {hosts: {h1: }}\nps: {hosts: {h1: }}\n" if mode == "async" else ""
    path.write_text(f"all: {{vars: {{pscluster_mode: {mode}}}}}\n{groups}worker: {{hosts: {{\"h[1:{hosts}]\": }}}}\n")
    return path


def paper(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """The orchestrator's time (CPU and wall, median of ``repeat``) for a drain's planning of
    a worker host in the middle of the list at each size: async in place (plan_drain), sync
    (plan_drain + the resize's re-plan, diff and checks)."""
    from cluster.inventory import load_inventory
    from cluster.lifecycle import resize
    from cluster.lifecycle.drain import plan_drain, worker_counts_without
    from cluster.plan import PlanOptions, plan_cluster

    results = []
    with tempfile.TemporaryDirectory(prefix="drain-paper-") as tmp:
        for hosts in sizes:
            for mode in ("async", "sync"):
                path = synthetic_inventory(Path(tmp) / f"{mode}-{hosts}.yaml", hosts, mode)
                options = PlanOptions(local_python=sys.executable, local_workdir=str(REPO), name=f"paper-{hosts}")
                plan = resize.pin_inventory(plan_cluster(load_inventory(str(path)), options))
                host = f"h{hosts // 2 + 1}"      # a host in the middle of the worker list
                walls, cpus = [], []
                touched = 0
                for _ in range(repeat):
                    wall, cpu = time.perf_counter(), time.process_time()
                    drain = plan_drain(plan, host, job_live=True)
                    if mode == "sync":
                        new = resize.replan(plan, port_base=None, limit=None, pool=None,
                                            counts=worker_counts_without(resize.worker_counts(plan), host))
                        diff = resize.diff_plans(plan, new)
                        resize.check_resize(plan, new, diff, job_live=True)
                        touched = len(diff.start) + len(diff.stop)
                    else:
                        touched = len(drain.moves)
                    walls.append(time.perf_counter() - wall)
                    cpus.append(time.process_time() - cpu)
                results.append({"hosts": hosts, "mode": mode, "tasks": len(plan.tasks), "action": drain.action,
                                "tasks_moved": touched, "wall_s": round(statistics.median(walls), 4),
                                "cpu_s": round(statistics.median(cpus), 4)})
    return results


def print_paper(results: list[dict[str, Any]]) -> None:
    rows = [[str(r["hosts"]), r["mode"], str(r["tasks"]), r["action"], str(r["tasks_moved"]),
             f"{r['wall_s'] * 1000:.1f}", f"{r['cpu_s'] * 1000:.1f}"] for r in results]
    hosts, seconds = TORCH_RENDEZVOUS
    rows.append([str(hosts), "torch elastic", "-", "rendezvous", "all", f"{seconds * 1000:.0f}", "-"])
    print_columns(["hosts", "mode", "tasks", "drain", "tasks stopped + started", "wall ms (median)", "cpu ms"], rows)
    at = [r for r in results if r["hosts"] == max(x["hosts"] for x in results)]
    print()
    for r in at:
        print(f"{'MET   ' if r['wall_s'] < seconds else 'MISSED'} a {r['mode']} drain's planning at {r['hosts']} "
              f"hosts: {r['wall_s']:.3f} s against torch elastic's {seconds:g} s rendezvous at {hosts} hosts")


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drain", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3, help="trials per role (default 3)")
    parser.add_argument("--roles", default=",".join(ROLES), help="comma-separated, of: " + ", ".join(ROLES))
    parser.add_argument("--steps", type=int, help="the step budget (default: async 1500, sync 2400)")
    parser.add_argument("--deadline", default=DEADLINE, help=f"drain --deadline (default {DEADLINE})")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds a drain or the job's end may take")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--at", default="0.2-0.6", metavar="LOW[-HIGH]",
                        help="the drain's moment, a fraction of the step budget (default 0.2-0.6, at random)")
    parser.add_argument("--record", type=Path, help="append every trial here as a JSON line")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--report", type=Path, nargs="+", metavar="FILE", help="print the table of recorded trials")
    parser.add_argument("--paper", action="store_true", help="only the planning time on synthetic plans")
    parser.add_argument("--hosts", default="16,64,256,1000", help="--paper's sizes")
    parser.add_argument("--repeat", type=int, default=5, help="--paper's repetitions per size")
    parser.add_argument("--json", action="store_true", help="--paper: the results as JSON")
    parser.add_argument("--lab", action="store_true", help="the trials on the 3-host SSH lab (root), not the local cluster")
    args = parser.parse_args(argv)
    if args.paper:
        try:
            sizes = [int(n) for n in args.hosts.split(",") if n.strip()]
        except ValueError:
            parser.error(f"--hosts {args.hosts!r}: give comma-separated host counts, e.g. 16,64,256,1000")
        if not sizes or min(sizes) < 2 or args.repeat < 1:
            parser.error("--hosts: each size at least 2; --repeat at least 1")
        results = paper(sizes, args.repeat)
        if args.json:
            print(json.dumps(results, indent=1))
        else:
            print_paper(results)
        return 0
    if args.report:
        rows = [json.loads(line) for p in args.report for line in p.read_text().splitlines() if line.strip()]
        for row in rows:        # recorded before the script told a resize after the end apart
            if row["role"] == "chief" or row.get("outcome") == "checkpoint instead":    # (older ps rows too)
                row["pause"] = None
            elif "drain_rc" in row:
                resized_after_the_end(row)
        return print_trials(rows)
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles or args.trials < 1:
        parser.error(f"--roles: unknown {unknown}, choose from {', '.join(ROLES)}; --trials at least 1")
    from cluster.errors import UsageError
    from cluster.lifecycle.drain import parse_deadline
    try:
        parse_deadline(args.deadline)
    except UsageError as exc:
        parser.error(str(exc))

    try:
        low, _, high = args.at.partition("-")
        at = (float(low), float(high or low))
    except ValueError:
        at = (-1.0, -1.0)
    if not 0 < at[0] <= at[1] < 1:
        parser.error(f"--at {args.at!r}: a fraction of the budget, or a range of them, e.g. 0.2 or 0.2-0.6")

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)     # the trial in flight ends through its cleanup
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    order = [role for _ in range(args.trials) for role in roles]
    work = args.work or Path(tempfile.mkdtemp(prefix="pscluster-drain-"))
    record = args.record or work / "drain.jsonl"
    print(f"benchmarks.drain: {len(order)} trial(s), seed {seed}, recorded in {record}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []

    def run_trials(lab: Any = None) -> None:
        for number, role in enumerate(order, 1):
            began = time.monotonic()
            row = trial(work, number, role, rng, steps=args.steps, deadline=args.deadline, limit=args.limit, lab=lab,
                        at=at)
            row["seconds"] = round(time.monotonic() - began)
            rows.append(row)
            with open(record, "a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"trial {number}/{len(order)}: {json.dumps(row)}", file=sys.stderr, flush=True)
    if args.lab:
        from testbed.netlab import Lab
        with Lab(3, work / "lab", subnet="auto") as lab:
            run_trials(lab)
    else:
        run_trials()
    return print_trials(rows)


if __name__ == "__main__":
    sys.exit(main())
