"""Training benchmarks (issue 3, "Benchmark"): pscluster's training loops against what people
write without it, on the same model, data, global batch, optimizer and learning rate
(``examples/distributed_mnist``; ``--model cnn|mlp``), measured in one run on this machine.

1. pscluster async (chief + 1 ps + 1 worker: ``pscluster up`` + ``pscluster train``) against
   the recipe of TensorFlow's parameter-server tutorial (one ``coordinator.schedule`` per step)
   run as the chief of the same cluster. Goal: >= 3x the steps/s.
2. the same pscluster async figure against one process training with Keras 3 ``fit`` and the
   best ``steps_per_execution`` of a sweep. Goal: pscluster / single >= 0.5.
3. pscluster sync (2 workers) against legacy tf-keras ``fit`` under MultiWorkerMirroredStrategy
   on the same two worker addresses (best ``steps_per_execution`` of a sweep). Goal: >= 1.2x.
4. time to 98.5 % test accuracy for each mode (async: chief + 2 ps + 2 workers; sync: 2 workers;
   sync-ps: 2 ps + 2 workers, the shape of inventories/local.yaml) against the single process
   (Keras ``fit``, evaluating every ``--eval-every`` steps), ``--accuracy-runs`` times each (medians).
   Goals (issue 15): async <= 1.4x and sync-ps <= 2.0x the single process; sync is reported.

Training processes start from the standby ``up`` (or the previous ``train``) left on their host
(roles/standby.py: TensorFlow already imported), as on any cluster that is up; before each
``train`` the benchmark waits until ``pscluster status`` says every standby is ready (the wait
is reported, not counted, like the ``up`` time). ``--no-standby`` (``pscluster_standby: false``)
measures the processes started afresh.

Throughput is optimizer steps per second after the first step (or first scheduled function /
execution), from each program's own clock; pscluster's is the training report's
``examples_per_second`` over the global batch. Parts 1-3 repeat ``--runs`` times, alternating
pscluster and baseline, and compare medians. Time to accuracy is wall clock from launching the
process (``pscluster train``, or the single process), so start-up counts on both sides; the
``up`` time of the cluster is shown beside it. Every program gets the same environment:
pscluster's task defaults (cluster/plan.py ``BASE_ENV``, which turns oneDNN's CPU kernels on)
plus ``OMP_NUM_THREADS=1`` as in inventories/local.yaml, plus any ``--env KEY=VALUE``
(``--env TF_ENABLE_ONEDNN_OPTS=0`` measures with TensorFlow's own default on this CPU). Clusters use ports 39000-39099
(``--port-base``) and are always brought down; baseline processes are stopped by their recorded
process group.

Usage: ``python -m benchmarks.training [--runs 2] [--steps 400] [--only 1,2,3,4] [--json]``
(see ``--help`` for the budgets; ``--quick`` checks the script, not for figures).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

from benchmarks.common import REPO, cli, env_pair, print_columns
from cluster.plan import BASE_ENV

PORT_RANGE = (39000, 39999)     # ours on this machine; everyone else stays out of it
PART_NAMES = {1: "async vs TF tutorial PS recipe", 2: "async vs single process",
              3: "sync vs tf-keras MWMS fit", 4: "time to target accuracy"}
GOALS = {1: 3.0, 2: 0.5, 3: 1.2}
# Part 4 (issue 15): time to the target accuracy, mode / single process, at most.
ACCURACY_GOALS = {"async": 1.4, "sync-ps": 2.0}
LOG = sys.stderr


@dataclass(frozen=True)
class ClusterShape:
    """One cluster the benchmark brings up: its mode, tasks per role and port offset."""

    key: str
    mode: str
    chief: int
    ps: int
    workers: int
    port_offset: int

    def describe(self) -> str:
        parts = [f"{self.ps} ps"] if self.ps else []
        parts.append(f"{self.workers} worker{'s' if self.workers > 1 else ''}")
        return f"pscluster {self.mode} ({', '.join(parts)})"


THROUGHPUT_ASYNC = ClusterShape("async-1ps-1w", "async", 1, 1, 1, 0)
THROUGHPUT_SYNC = ClusterShape("sync-2w", "sync", 0, 0, 2, 10)
ACCURACY_SHAPES = (ClusterShape("acc-async", "async", 1, 2, 2, 20),
                   ClusterShape("acc-sync", "sync", 0, 0, 2, 30),
                   ClusterShape("acc-sync-ps", "sync-ps", 0, 2, 2, 40))


# ------------------------------------------------------------------ pure parts
def inventory_text(shape: ClusterShape, port_base: int, env: dict[str, str], standby: bool = True) -> str:
    """A local (``ansible_connection: local``) inventory for ``shape``, like inventories/local.yaml."""
    lines = ["# written by benchmarks/training.py", "all:", "  vars:", "    ansible_connection: local",
             f"    pscluster_port_base: {port_base + shape.port_offset}", f"    pscluster_mode: {shape.mode}",
             *([] if standby else ["    pscluster_standby: false"]), "    pscluster_env:"]
    lines += [f"      {key}: {json.dumps(value)}" for key, value in env.items()]
    lines.append("  children:")
    for role, count in (("chief", shape.chief), ("ps", shape.ps), ("worker", shape.workers)):
        if count:
            lines += [f"    {role}:", "      hosts:", "        localhost:", f"          {role}_tasks: {count}"]
    return "\n".join(lines) + "\n"


def report_steps_per_second(report: dict, global_batch: int) -> float | None:
    """Steps/s from a ``pscluster train --json`` report (its rate excludes the first step)."""
    eps = report.get("examples_per_second")
    batch = report.get("global_batch_size") or global_batch
    return eps / batch if isinstance(eps, (int, float)) and batch else None


def first_reaching(evals: Sequence[dict], target: float) -> dict | None:
    """The first evaluation at or above ``target``, or None."""
    return next((e for e in evals if isinstance(e.get("val_accuracy"), (int, float))
                 and e["val_accuracy"] >= target), None)


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def best_sweep(runs: Sequence[dict]) -> tuple[int | None, dict[int, float | None]]:
    """Median steps/s per steps_per_execution over runs of a sweep, and the best K."""
    per_k: dict[int, list[float | None]] = {}
    for result in runs:
        for row in result.get("sweep", []):
            per_k.setdefault(row["steps_per_execution"], []).append(row.get("steps_per_second"))
    medians = {k: median(values) for k, values in sorted(per_k.items())}
    ranked = [k for k in medians if medians[k] is not None]
    return (max(ranked, key=lambda k: medians[k]) if ranked else None), medians


def largest_divisor(values: Sequence[int], of: int, prefer: int | None) -> int:
    """``prefer`` if it divides ``of``, else the largest of ``values`` that does (else 1)."""
    if prefer and of % prefer == 0:
        return prefer
    return max((v for v in values if of % v == 0), default=1)


def _fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _met(value: float | None, goal: float, at_most: bool = False) -> bool | None:
    if value is None:
        return None
    return value <= goal if at_most else value >= goal


# ------------------------------------------------------------------ processes
class Runner:
    """Runs the pscluster CLI and the baseline programs; stops what it started by process group."""

    def __init__(self, work: Path, env: dict[str, str], port_base: int, timeout: float,
                 batch_size: int, standby: bool = True) -> None:
        self.work = work
        self.standby = standby
        self.batch_size = batch_size
        self.state_dir = work / "state"
        self.env = env
        self.port_base = port_base
        self.timeout = timeout
        self.started: list[int] = []      # process-group ids of baselines still running

    def pscluster(self, args: Sequence[Any], check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
        return cli(list(args), self.state_dir, timeout=self.timeout, check=check)

    @contextmanager
    def cluster(self, shape: ClusterShape) -> Iterator[tuple[str, dict, float]]:
        """Brings ``shape`` up; yields (name, plan, up seconds); always brings it down."""
        name = f"bench-train-{shape.key}"
        inventory = self.work / f"{shape.key}.yaml"
        inventory.write_text(inventory_text(shape, self.port_base, self.env, self.standby))
        _, plan_proc = self.pscluster(["plan", inventory, "--name", name, "--json"])
        plan = json.loads(plan_proc.stdout)
        print(f"  up {name} ...", file=LOG, flush=True)
        try:
            up_seconds, _ = self.pscluster(["up", inventory, "--name", name])
            yield name, plan, up_seconds
        finally:
            _, proc = self.pscluster(["down", "--name", name], check=False)
            if proc.returncode != 0:
                print(f"  down {name} failed:\n{proc.stderr}", file=LOG, flush=True)

    def wait_standbys(self, name: str, timeout: float = 180.0) -> float:
        """Seconds until every training task's standby says TensorFlow is imported (0 without
        standbys)."""
        if not self.standby:
            return 0.0
        began = time.perf_counter()
        while True:
            _, proc = self.pscluster(["status", "--name", name, "--json"])
            trainers = [t for t in json.loads(proc.stdout)["tasks"] if t["kind"] == "train"]
            if all(t["standby"] and t["standby"]["ready"] for t in trainers):
                return time.perf_counter() - began
            if time.perf_counter() - began > timeout:
                raise RuntimeError(f"standbys of {name} not ready after {timeout:.0f} s: {trainers}")
            time.sleep(0.5)

    def train(self, name: str, steps: int, *extra: Any) -> tuple[float, dict]:
        """``pscluster train distributed_mnist --json``: (seconds from launch, report)."""
        checkpoints = tempfile.mkdtemp(prefix="ckpt-", dir=self.work)
        elapsed, proc = self.pscluster(["train", "distributed_mnist", "--name", name, "--steps", steps,
                                        "--batch-size", self.batch_size, "--checkpoint-dir", checkpoints,
                                        "--restart-policy", "never", "--json", *extra])
        return elapsed, json.loads(proc.stdout)

    def baselines(self, which: str, options: Sequence[Any], envs: Sequence[dict[str, str]]
                  ) -> tuple[float, list[dict]]:
        """Runs one baseline process per environment, together; (seconds, their JSON results).

        If one fails, the others (which may wait forever for it at a collective) are stopped.
        """
        argv = [sys.executable, "-m", "benchmarks.tf_baselines", which, "--batch-size", str(self.batch_size),
                *map(str, options)]
        began = time.perf_counter()
        procs = []
        for index, env in enumerate(envs):
            log = open(self.work / f"{which}-{len(self.started)}-{index}.log", "w")
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                    start_new_session=True)
            log.close()
            self.started.append(proc.pid)
            procs.append(proc)
        outputs: dict[int, str] = {}
        try:
            deadline = time.monotonic() + self.timeout
            while len(outputs) < len(procs):
                for i, proc in enumerate(procs):
                    if i not in outputs and proc.poll() is not None:
                        outputs[i] = proc.stdout.read()
                        if proc.returncode != 0:
                            raise RuntimeError(f"baseline {which} (process {i}) exited with {proc.returncode}; "
                                               f"log: {self.work}/{which}-*-{i}.log\n{self._tail(which, i)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"baseline {which} did not finish in {self.timeout:.0f} s")
                time.sleep(0.1)
        finally:
            for proc in procs:
                self._stop(proc)
        seconds = time.perf_counter() - began
        return seconds, [json.loads(outputs[i].strip().splitlines()[-1]) for i in range(len(procs))]

    def _tail(self, which: str, index: int) -> str:
        logs = sorted(self.work.glob(f"{which}-*-{index}.log"), key=os.path.getmtime)
        return "\n".join(logs[-1].read_text().splitlines()[-15:]) if logs else ""

    def _stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)      # its own session: pgid == the pid we recorded
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc.stdout:
            proc.stdout.close()
        if proc.pid in self.started:
            self.started.remove(proc.pid)

    def task_env(self, task: dict, tf_config: dict | None = None) -> dict[str, str]:
        """The environment pscluster gives ``task``, for a program started by hand in its place."""
        env = dict(os.environ)
        env.update({k: v for k, v in task["env"].items() if not k.startswith("PSCLUSTER_")})
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config)
        return env

    def single_env(self) -> dict[str, str]:
        """What a pscluster task gets, without the cluster: the defaults, then the inventory's env."""
        env = dict(os.environ, **dict(BASE_ENV), **self.env)
        env.pop("TF_CONFIG", None)
        return env


# ------------------------------------------------------------------ the comparisons
@dataclass(frozen=True)
class Twin:
    """One side of a comparison on twin local clusters (benchmarks/onednn.py, benchmarks/standby.py)."""

    key: str                    # the cluster's name suffix and work folder
    describe: str               # what the progress line says of a run on this side
    env: dict[str, str] = field(default_factory=dict)    # pscluster_env of the cluster
    standby: bool = True        # pscluster_standby of the cluster
    wait_standbys: bool = False     # before each train, until its standbys are ready (shown, not counted)


def alternate_twins(args: argparse.Namespace, work: Path, shape: ClusterShape,
                    twins: Sequence[Twin]) -> list[list[dict]]:
    """Brings up one cluster of ``shape`` per twin (ports 50 apart), then ``args.runs`` rounds of
    ``train --steps args.steps``, one run per twin in turn; always brings them down.

    Returns, per twin, one ``{"seconds", "wait", "report"}`` per run (seconds from launch).
    """
    runs: list[list[dict]] = [[] for _ in twins]
    with ExitStack() as stack:
        clusters = []
        for offset, twin in enumerate(twins):
            runner = Runner(work / f"{shape.mode}-{twin.key}", twin.env, args.port_base + 50 * offset,
                            args.timeout, args.batch_size, standby=twin.standby)
            runner.work.mkdir(parents=True, exist_ok=True)
            # its own name: local clusters keep their run folders in this checkout
            name, _, _ = stack.enter_context(runner.cluster(replace(shape, key=f"{shape.key}-{twin.key}")))
            clusters.append((runner, name))
        for run in range(args.runs):
            for twin, (runner, name), rows in zip(twins, clusters, runs):
                wait = runner.wait_standbys(name) if twin.wait_standbys else 0.0
                print(f"  {shape.mode} run {run + 1}/{args.runs}: {twin.describe}", file=LOG, flush=True)
                seconds, report = runner.train(name, args.steps)
                rows.append({"seconds": round(seconds, 2), "wait": round(wait, 2), "report": report})
    return runs


def throughput_async(runner: Runner, args: argparse.Namespace, parts: set[int]) -> dict:
    """Parts 1 and 2: one async cluster (1 ps, 1 worker); tutorial recipe; single-process sweep."""
    out: dict[str, Any] = {"pscluster": [], "tutorial": [], "single": []}
    with runner.cluster(THROUGHPUT_ASYNC) as (name, plan, up_seconds):
        out["up_seconds"] = round(up_seconds, 2)
        chief = next(t for t in plan["tasks"] if t["role"] == "chief")
        for run in range(args.runs):
            print(f"  run {run + 1}/{args.runs}: pscluster async", file=LOG, flush=True)
            seconds, report = runner.train(name, args.steps)
            out["pscluster"].append({"steps_per_second": report_steps_per_second(report, args.batch_size),
                                     "seconds": round(seconds, 2), "global_step": report.get("global_step"),
                                     "val_accuracy": report.get("val_accuracy")})
            if 1 in parts:
                print(f"  run {run + 1}/{args.runs}: tutorial recipe (chief of {name})", file=LOG, flush=True)
                seconds, (result,) = runner.baselines("tutorial-ps", ["--steps", args.steps],
                                                      [runner.task_env(chief)])
                out["tutorial"].append(dict(result, seconds=round(seconds, 2)))
            if 2 in parts:
                print(f"  run {run + 1}/{args.runs}: single process, Keras fit, K in {args.sweep}",
                      file=LOG, flush=True)
                seconds, (result,) = runner.baselines(
                    "keras-fit", ["--steps", args.steps, "--steps-per-execution", ",".join(map(str, args.sweep))],
                    [runner.single_env()])
                out["single"].append(dict(result, seconds=round(seconds, 2)))
    ours = median([r["steps_per_second"] for r in out["pscluster"]])
    out["pscluster_median"] = ours
    if 1 in parts:
        theirs = median([r["steps_per_second"] for r in out["tutorial"]])
        out["tutorial_median"] = theirs
        out["ratio_1"] = ratio(ours, theirs)
    if 2 in parts:
        best_k, medians = best_sweep(out["single"])
        out["single_sweep_medians"] = medians
        out["single_best_k"] = best_k
        out["single_median"] = medians.get(best_k) if best_k else None
        out["ratio_2"] = ratio(ours, out["single_median"])
    return out


def throughput_sync(runner: Runner, args: argparse.Namespace) -> dict:
    """Part 3: pscluster sync vs tf-keras fit under MWMS on the same two worker addresses."""
    out: dict[str, Any] = {"pscluster": [], "tfkeras": []}
    with runner.cluster(THROUGHPUT_SYNC) as (name, plan, up_seconds):
        out["up_seconds"] = round(up_seconds, 2)
        workers = [t for t in plan["tasks"] if t["role"] == "worker"]
        cluster = {"worker": plan["cluster"]["worker"]}
        envs = [runner.task_env(t, {"cluster": cluster, "task": {"type": "worker", "index": t["index"]}})
                for t in workers]
        for env in envs:
            env["TF_USE_LEGACY_KERAS"] = "1"
        for run in range(args.runs):
            print(f"  run {run + 1}/{args.runs}: pscluster sync", file=LOG, flush=True)
            seconds, report = runner.train(name, args.steps)
            out["pscluster"].append({"steps_per_second": report_steps_per_second(report, args.batch_size),
                                     "seconds": round(seconds, 2), "global_step": report.get("global_step"),
                                     "val_accuracy": report.get("val_accuracy")})
            print(f"  run {run + 1}/{args.runs}: tf-keras fit under MWMS, K in {args.mwms_sweep}",
                  file=LOG, flush=True)
            seconds, results = runner.baselines(
                "mwms-tfkeras", ["--steps", args.steps,
                                 "--steps-per-execution", ",".join(map(str, args.mwms_sweep))], envs)
            chief = next(r for r in results if r["task"]["index"] == 0)   # worker 0 times, like pscluster
            out["tfkeras"].append(dict(chief, seconds=round(seconds, 2)))
    best_k, medians = best_sweep(out["tfkeras"])
    out["pscluster_median"] = median([r["steps_per_second"] for r in out["pscluster"]])
    out["tfkeras_sweep_medians"] = medians
    out["tfkeras_best_k"] = best_k
    out["tfkeras_median"] = medians.get(best_k) if best_k else None
    out["ratio_3"] = ratio(out["pscluster_median"], out["tfkeras_median"])
    return out


def time_to_accuracy(runner: Runner, args: argparse.Namespace, single_k: int) -> dict:
    """Part 4: seconds from launch to the first evaluation at or above the target, per mode.

    Each side runs ``--accuracy-runs`` times (the single process first, then each cluster, up
    once for its runs); the figures are medians, because the step at which 98.5 % is first
    seen moves by one or two evaluations from run to run.
    """
    out: dict[str, Any] = {"target": args.target, "eval_every": args.eval_every, "budget_steps": args.accuracy_steps,
                           "runs": args.accuracy_runs}
    singles = []
    for i in range(args.accuracy_runs):
        print(f"  single process, Keras fit K={single_k}, eval every {args.eval_every} "
              f"(run {i + 1}/{args.accuracy_runs})", file=LOG, flush=True)
        _, (single,) = runner.baselines("keras-fit-accuracy", [
            "--steps", args.accuracy_steps, "--steps-per-execution", single_k, "--eval-every", args.eval_every,
            "--target", args.target, "--stop-at-target", "--launched-at", repr(time.time())], [runner.single_env()])
        singles.append(single)
    out["single"] = dict(singles[0], **summarize_runs(singles))
    for shape in ACCURACY_SHAPES:
        print(f"  {shape.describe()}: train with --eval-every {args.eval_every}", file=LOG, flush=True)
        runs = []
        with runner.cluster(shape) as (name, _plan, up_seconds):
            for _ in range(args.accuracy_runs):
                waited = runner.wait_standbys(name)
                elapsed, report = runner.train(name, args.accuracy_steps, "--eval-every", args.eval_every)
                runs.append(dict(accuracy_run(report, elapsed, args.target, args.batch_size),
                                 standby_wait_seconds=round(waited, 2)))
        out[shape.mode] = {"cluster": shape.describe(), "up_seconds": round(up_seconds, 2), "runs": runs,
                           **summarize_runs(runs)}
    return out


def accuracy_run(report: dict, elapsed: float, target: float, batch_size: int) -> dict:
    """One ``pscluster train`` of part 4: its evaluations timed from the launch of the command."""
    # The report's eval seconds count from the orchestrator's start of `train`; add the CLI's own
    # start-up, bounded above by (launch-to-exit) - (train's wall time).
    startup = max(0.0, elapsed - (report.get("wall_seconds") or elapsed))
    evals = [dict(e, seconds_from_launch=round(e["seconds"] + startup, 2))
             for e in report.get("evals") or [] if isinstance(e.get("seconds"), (int, float))]
    reached = first_reaching(evals, target)
    return {"train_launch_seconds": round(elapsed, 2), "cli_startup_seconds": round(startup, 2), "evals": evals,
            "final_val_accuracy": report.get("val_accuracy"), "global_step": report.get("global_step"),
            "time_to_target_seconds": reached["seconds_from_launch"] if reached else None,
            "step_at_target": reached["step"] if reached else None,
            "steps_per_second": report_steps_per_second(report, batch_size)}


def summarize_runs(runs: Sequence[dict]) -> dict:
    """Medians over runs of time to target, step at target, final accuracy and steps/s.

    A run that never reached the target counts as infinitely slow; with an even count the
    lower middle run is the median, so it is None only when more than half missed.
    """
    times = [r.get("time_to_target_seconds") for r in runs]
    ranked = sorted(runs, key=lambda r: float("inf") if r.get("time_to_target_seconds") is None
                    else r["time_to_target_seconds"])
    middle = ranked[(len(ranked) - 1) // 2] if ranked else {}
    return {"time_to_target_seconds": middle.get("time_to_target_seconds"), "times_to_target": times,
            "step_at_target": middle.get("step_at_target"),     # of the median run
            "steps_at_target": [r.get("step_at_target") for r in runs],
            "final_val_accuracy": median([r.get("final_val_accuracy") for r in runs]),
            "steps_per_second": median([r.get("steps_per_second") for r in runs])}


# ------------------------------------------------------------------ report
def table_rows(results: dict, args: argparse.Namespace) -> list[dict]:
    """One row per configuration; ratio, goal and verdict on the row that carries the comparison."""
    rows: list[dict] = []

    def add(part: int, configuration: str, measured: str, value: float | None = None,
            goal: float | None = None, figure: str = "", goal_text: str | None = None) -> None:
        at_most = part == 4      # part 4 is a time: lower is better
        rows.append({"part": part, "comparison": f"{part} {PART_NAMES[part]}", "configuration": configuration,
                     "measured": measured, "ratio": value, "figure": figure,
                     "goal": goal_text if goal_text is not None else (f">= {goal:g}" if goal else ""),
                     "met": _met(value, goal, at_most) if goal else None})

    a = results.get("async")
    if a and "ratio_1" in a:
        add(1, f"{THROUGHPUT_ASYNC.describe()}, K=32 default", _fmt(a["pscluster_median"], " steps/s"),
            a["ratio_1"], GOALS[1], "pscluster / tutorial (steps/s)")
        add(1, "TF tutorial recipe (1 schedule per step), same cluster", _fmt(a["tutorial_median"], " steps/s"))
    if a and "ratio_2" in a:
        add(2, f"{THROUGHPUT_ASYNC.describe()}", _fmt(a["pscluster_median"], " steps/s"),
            a["ratio_2"], GOALS[2], "pscluster / single (steps/s)")
        sweep = ", ".join(f"K={k}: {_fmt(v)}" for k, v in a["single_sweep_medians"].items())
        add(2, f"single process, Keras 3 fit, best K={a['single_best_k']} ({sweep})",
            _fmt(a["single_median"], " steps/s"))
    s = results.get("sync")
    if s:
        add(3, f"{THROUGHPUT_SYNC.describe()}, K=8 default", _fmt(s["pscluster_median"], " steps/s"),
            s["ratio_3"], GOALS[3], "pscluster / tf-keras (steps/s)")
        sweep = ", ".join(f"K={k}: {_fmt(v)}" for k, v in s["tfkeras_sweep_medians"].items())
        add(3, f"tf-keras fit, MWMS 2 workers, best K={s['tfkeras_best_k']} ({sweep})",
            _fmt(s["tfkeras_median"], " steps/s"))
    t = results.get("accuracy")
    if t:
        target = f"{t['target'] * 100:g}%"
        single = t["single"]
        base = single.get("time_to_target_seconds")
        add(4, f"single process, Keras 3 fit K={single['steps_per_execution']}",
            _reached(base, single.get("step_at_target"), target) + _spread(single), None, None, "", "")
        for mode in ("async", "sync", "sync-ps"):
            row = t.get(mode)
            if row:
                value = ratio(row["time_to_target_seconds"], base)
                add(4, f"{row['cluster']} (+{row['up_seconds']:.0f} s up)",
                    _reached(row["time_to_target_seconds"], row["step_at_target"], target,
                             row.get("final_val_accuracy")) + _spread(row),
                    value, ACCURACY_GOALS.get(mode), f"time to {target}: mode / single (medians)",
                    f"<= {ACCURACY_GOALS[mode]:g}" if mode in ACCURACY_GOALS else "report")
    return rows


def _spread(row: dict) -> str:
    """`` [17.9 s @512, 18.5 s @512, 25.2 s @768]``: every run behind a median."""
    times, steps = row.get("times_to_target") or [], row.get("steps_at_target") or []
    if len(times) < 2:
        return ""
    return " [" + ", ".join("missed" if t is None else f"{t:.1f} s @{s}" for t, s in zip(times, steps)) + "]"


def _reached(seconds: float | None, step: int | None, target: str, final: float | None = None) -> str:
    if seconds is None:
        tail = f", final {final * 100:.2f}%" if isinstance(final, (int, float)) else ""
        return f"not reached{tail}"
    return f"{seconds:.1f} s (step {step})"


def summary(rows: list[dict]) -> list[dict]:
    """The rows ``python -m benchmarks`` shows: one per comparison that carries a ratio."""
    found = []
    for row in rows:
        if row["figure"]:
            measured = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f} ({row['measured']})"
            found.append({"name": f"{row['comparison']}: {row['configuration']}", "figure": row["figure"],
                          "measured": measured, "goal": row["goal"], "met": row["met"]})
    return found


def print_table(rows: list[dict]) -> None:
    header = ("comparison", "configuration", "steps/s or seconds", "ratio", "goal", "met?")
    cells = [header]
    last = None
    for row in rows:
        cells.append(("" if row["comparison"] == last else row["comparison"], row["configuration"], row["measured"],
                      "" if not row["figure"] else _fmt(row["ratio"], digits=2), row["goal"],
                      {True: "yes", False: "NO", None: ""}[row["met"]] if row["figure"] else ""))
        last = row["comparison"]
    print_columns(header, cells[1:])


def environment(argv: Sequence[str]) -> dict:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": "python -m benchmarks.training " + " ".join(argv), "cpus": os.cpu_count(),
            "load_average_start": [round(v, 2) for v in os.getloadavg()], "python": platform.python_version(),
            "tensorflow": version("tensorflow-cpu") or version("tensorflow"), "keras": version("keras"),
            "tf_keras": version("tf-keras") or version("tf_keras")}


def _ints(text: str) -> list[int]:
    values = sorted({int(part) for part in text.split(",") if part.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="repeats of parts 1-3, alternating (median; default 2)")
    p.add_argument("--steps", type=int, default=400,
                   help="throughput budget in global steps per run and configuration (default 400)")
    p.add_argument("--only", type=_ints, default=[1, 2, 3, 4], help="comma list of parts, e.g. 1,2")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--out", help="also write the JSON document to this file")
    p.add_argument("--quick", action="store_true", help="tiny budgets: checks the script, gives no figures")
    p.add_argument("--sweep", type=_ints, default=[1, 8, 32, 128],
                   help="steps_per_execution values for the single process (default 1,8,32,128)")
    p.add_argument("--mwms-sweep", type=_ints, default=[1, 8],
                   help="steps_per_execution values for tf-keras under MWMS (default 1,8)")
    p.add_argument("--accuracy-steps", type=int, default=1200,
                   help="part 4: step budget per mode (default 1200, ~2.6 epochs)")
    p.add_argument("--accuracy-runs", type=int, default=3, help="part 4: runs per side (medians; default 3)")
    p.add_argument("--eval-every", type=int, default=128, help="part 4: steps between evaluations (default 128)")
    p.add_argument("--target", type=float, default=0.985, help="part 4: test accuracy to reach (default 0.985)")
    p.add_argument("--single-k", type=int,
                   help="part 4: the single process's steps_per_execution (default: the best of part 2's "
                        "sweep that divides --eval-every, else the largest sweep value that does)")
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn", help="distributed_mnist's MNIST_MODEL")
    p.add_argument("--env", action="append", default=[], type=env_pair, metavar="KEY=VALUE",
                   help="extra environment for every program (pscluster_env of the clusters); repeatable")
    p.add_argument("--batch-size", type=int, default=128, help="global batch (distributed_mnist's default 128)")
    p.add_argument("--port-base", type=int, default=PORT_RANGE[0], help="first of 50 ports (default 39000)")
    p.add_argument("--work", help="keep inventories, state and baseline logs in this folder "
                   "(default: a temporary folder, removed at the end)")
    p.add_argument("--timeout", type=float, default=900, help="seconds any one command may take (default 900)")
    p.add_argument("--no-standby", dest="standby", action="store_false",
                   help="clusters without standbys (pscluster_standby: false): training processes import "
                        "TensorFlow after `train` starts them")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.quick:
        args.steps, args.accuracy_steps, args.eval_every, args.accuracy_runs = 64, 128, 64, 1
        args.sweep, args.mwms_sweep = [1, 8], [1, 8]
    if not PORT_RANGE[0] <= args.port_base <= PORT_RANGE[1] - 49:
        raise SystemExit(f"--port-base must leave 50 ports inside {PORT_RANGE[0]}-{PORT_RANGE[1]}")
    if args.runs < 1 or args.accuracy_runs < 1 or args.steps < 64 or args.accuracy_steps < args.eval_every:
        raise SystemExit("need --runs >= 1, --accuracy-runs >= 1, --steps >= 64 (async runs 32 steps per scheduled function) "
                         "and --accuracy-steps >= --eval-every")
    parts = set(args.only)
    task_env = {"OMP_NUM_THREADS": "1", "MNIST_MODEL": args.model, **dict(args.env)}
    results: dict[str, Any] = {"environment": environment(argv),
                               "config": {"runs": args.runs, "steps": args.steps, "sweep": args.sweep,
                                          "mwms_sweep": args.mwms_sweep, "accuracy_steps": args.accuracy_steps,
                                          "eval_every": args.eval_every, "target": args.target,
                                          "model": args.model, "global_batch_size": args.batch_size,
                                          "standby": args.standby,
                                          "task_env": {**dict(BASE_ENV), **task_env}, "parts": sorted(parts)}}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pscluster-training-") as tmp:
        work = Path(args.work).resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runner = Runner(work, task_env, args.port_base, args.timeout, args.batch_size, args.standby)
        if parts & {1, 2}:
            print(f"parts {sorted(parts & {1, 2})}: async throughput", file=LOG, flush=True)
            results["async"] = throughput_async(runner, args, parts)
        if 3 in parts:
            print("part 3: sync throughput", file=LOG, flush=True)
            results["sync"] = throughput_sync(runner, args)
        if 4 in parts:
            print("part 4: time to accuracy", file=LOG, flush=True)
            preferred = args.single_k or (results.get("async") or {}).get("single_best_k")
            single_k = args.single_k or largest_divisor(args.sweep, args.eval_every, preferred)
            if args.eval_every % single_k:
                raise SystemExit(f"--single-k {single_k} must divide --eval-every {args.eval_every}")
            results["accuracy"] = time_to_accuracy(runner, args, single_k)
    results["environment"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    results["environment"]["seconds"] = round(time.perf_counter() - began, 1)
    rows = table_rows(results, args)
    results["table"] = rows
    results["summary"] = summary(rows)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        env = results["environment"]
        onednn = results["config"]["task_env"].get("TF_ENABLE_ONEDNN_OPTS")
        print(f"training benchmarks, {args.model}, global batch {args.batch_size}, "
              f"TF_ENABLE_ONEDNN_OPTS={onednn}, standbys {'on' if args.standby else 'off'}, {args.runs} run(s) of "
              f"{args.steps} steps (medians); load average {env['load_average_start'][0]:.2f} -> "
              f"{env['load_average_end'][0]:.2f} on {env['cpus']} CPUs; {env['seconds']:.0f} s")
        print_table(rows)
    return results


if __name__ == "__main__":
    main()
