"""Issue 44: a parameter server's variables move while an async job trains (docs/platform-notes.md TF13).

Local `tf.distribute.Server` processes (roles.server) on 127.0.0.1, 2 ps + 2 workers, a spare ps
server started beforehand at a new port (the drain's notice: the old ps is still alive); a chief
process of its own per scenario, training an MLP (784-128-10, Adam, 10 steps a closure):

* ``move``: in place, in the same chief (roles/psmove.py): ps:1's variables read, the cluster
  switched to one with the spare as ps:2 and without ps:1 (``update_server_def``), the variables
  created again there, the step function traced again. In TensorFlow 2.21 the first step after
  fails (TF13: ``No worker known as /job:ps/replica:0/task:2``): the run reports the error, and
  that is the finding;
* ``move-spare``: the same, with the spare in the chief's cluster from its start as an idle ps:2
  (roles/psmove.keep_spares_idle): only ps:1 leaves the cluster, which works;
* ``shrink``: in place, ps:1's variables re-placed on ps:0 (2 ps -> 1, roles/psmove.py);
* ``rebuild``: in the same chief, a new strategy, coordinator and model against the cluster
  without ps:1, the values assigned from an in-memory copy;
* ``restart``: today's path with notice: a checkpoint, the chief process ends, a new chief
  process (TensorFlow imported anew) against the cluster with the spare as ps:1 restores it and
  trains.

Each prints the *pause* (from the end of the last closure before to the end of the first one
after), the steps lost (steps trained before, minus the step the job went on from: the goal is
0), whether the variables came back equal and whether a checkpoint written after the move reads back
equal; then the ratio of each pause to the restart's.

Usage: ``python -m benchmarks.ps_move [--trials N] [--json]``
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS_BEFORE = 200
STEPS_AFTER = 100
PER_CLOSURE = 10
SCENARIOS = ("move", "move-spare", "rebuild", "shrink", "restart")


# ---------------------------------------------------------------------------- the cluster
def free_ports(count: int) -> list[int]:
    """``count`` ports in 20000-31999 that nothing listens on now (below Linux's ephemeral range)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(20000, 31999)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


def new_server_move(cluster: dict, ps: int, address: str) -> object:
    """ps:``ps`` moves to a server at ``address`` that the chief's cluster did not have, joining as
    a new task index (the old name at a new address fails the same way, TF13): the move that
    TensorFlow 2.21 does not allow in place, kept here to show it."""
    from roles import psmove

    tasks = dict(enumerate(cluster["ps"]))
    fresh = max(tasks) + 1
    del tasks[ps]
    tasks[fresh] = address
    return psmove.PsMove(cluster={**{job: dict(enumerate(a)) for job, a in cluster.items()}, "ps": tasks},
                         destination={ps: fresh})


def restarted_cluster(cluster: dict, spare: str) -> dict:
    """The cluster a restarted chief is given: the spare in ps:1's place."""
    return dict(cluster, ps=[cluster["ps"][0], spare])


def _env(cluster: dict, job: str, index: int) -> dict:
    return dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}),
                GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
                PYTHONPATH=str(REPO))


def start_servers(cluster: dict, spare: str, spare_index: int, log_dir: Path,
                  known: bool = False) -> list[subprocess.Popen]:
    """Every ps and worker of ``cluster``, and a spare ps server at ``spare`` named
    ``ps:spare_index``; ``known``: every server starts with the spare in its cluster (the chief's
    cluster still leaves it out). The caller stops them (:func:`stop`)."""
    ps = list(cluster["ps"]) + [spare]
    ps[spare_index], ps[-1] = spare, ps[spare_index]
    spare_view = dict(cluster, ps=ps)       # its own view: only its task name counts
    view = spare_view if known else cluster
    specs = ([(view, job, i) for job in ("ps", "worker") for i in range(len(cluster[job]))]
             + [(spare_view, "ps", spare_index)])
    procs = []
    for n, (spec, job, index) in enumerate(specs):
        with open(log_dir / f"server-{n}-{job}{index}.log", "w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "roles.server"], cwd=REPO, env=_env(spec, job, index),
                                          stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    for address in [a for job in ("ps", "worker") for a in cluster[job]] + [spare]:
        _wait_port(address, 60)
    return procs


def _wait_port(address: str, timeout: float) -> None:
    host, _, port = address.rpartition(":")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no server at {address} after {timeout:.0f} s")


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)      # its own session: the group is this server alone
        proc.wait()


# ---------------------------------------------------------------------------- the chief
def chief(scenario: str, cluster: dict, spare: str, ckpt: str, phase: str) -> dict:
    """One chief process's part of ``scenario``; returns what it measured."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager import context

    from roles import psmove

    def build(strategy: object) -> tuple:
        with strategy.scope():      # type: ignore[attr-defined]
            model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                                         tf.keras.layers.Dense(10)])
            optimizer = tf.keras.optimizers.Adam(1e-3)
            optimizer.build(model.trainable_variables)
            step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        return model, optimizer, step

    def traced(strategy: object, model: object, optimizer: object, step: object) -> object:
        lossf = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function
        def train(iterator: object, n: tf.Tensor) -> tf.Tensor:
            def one(x: tf.Tensor, y: tf.Tensor) -> None:
                with tf.GradientTape() as tape:
                    loss = lossf(y, model(x, training=True))      # type: ignore[operator]
                grads = tape.gradient(loss, model.trainable_variables)   # type: ignore[attr-defined]
                optimizer.apply_gradients(zip(grads, model.trainable_variables))  # type: ignore[attr-defined]

            for _ in tf.range(n):
                x, y = next(iterator)       # type: ignore[call-overload]
                strategy.run(one, args=(x, y))      # type: ignore[attr-defined]
            step.assign_add(tf.cast(n, tf.int64))     # type: ignore[attr-defined]
            return step.read_value()        # type: ignore[attr-defined]
        return train

    def datasets(coordinator: object) -> object:
        def fn() -> tf.data.Dataset:
            rng = np.random.default_rng(0)
            x = rng.random((512, 784), dtype=np.float32)
            y = rng.integers(0, 10, 512)
            return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
        return iter(coordinator.create_per_worker_dataset(fn))     # type: ignore[attr-defined]

    def train(coordinator: object, fn: object, iterator: object, steps: int) -> float:
        """Train ``steps``; returns when the first closure's result came (perf_counter)."""
        first = None
        for _ in range(steps // PER_CLOSURE):
            remote = coordinator.schedule(fn, args=(iterator, tf.constant(PER_CLOSURE)))  # type: ignore[attr-defined]
            if first is None:
                remote.fetch()
                first = time.time()
        coordinator.join()      # type: ignore[attr-defined]
        return first or time.time()

    def checksum(variables: list) -> float:
        return float(sum(np.abs(v.numpy()).astype(np.float64).sum() for v in variables))

    resolver_env = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    os.environ["TF_CONFIG"] = resolver_env
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    if scenario == "move-spare":        # the spare (ps:2) is in the cluster, idle: no variable there
        psmove.keep_spares_idle(strategy, 1)
    model, optimizer, step = build(strategy)
    everything = list(model.weights) + list(optimizer.variables) + [step]
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    io = tf.train.CheckpointOptions(experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0")
    iterator = datasets(coordinator)
    fn = traced(strategy, model, optimizer, step)

    if phase == "after":        # a restarted chief: restore, train
        checkpoint.read(ckpt, options=io).assert_existing_objects_matched()
        restored, restored_sum = int(step.numpy()), checksum(everything)
        first = train(coordinator, fn, iterator, STEPS_AFTER)
        return {"first_after": first, "restored": restored, "sum_after": restored_sum, "step_end": int(step.numpy())}

    placement = sorted({psmove.ps_task(v.device) for v in psmove.resource_variables(everything)} - {None})
    train(coordinator, fn, iterator, STEPS_BEFORE)
    last_before = time.time()
    before, total = int(step.numpy()), checksum(everything)
    out: dict = {"placement": placement, "step_before": before, "sum_before": total}
    if scenario == "restart":
        checkpoint.write(ckpt, options=io)
        out["last_before"] = last_before
        return out

    began = time.perf_counter()
    if scenario in ("move", "move-spare", "shrink"):
        move = (psmove.plan_shrink(cluster, 1) if scenario == "shrink" else
                psmove.plan_shrink(cluster, 1, to=2) if scenario == "move-spare" else new_server_move(cluster, 1, spare))
        report = psmove.move_variables(strategy, coordinator, everything, move)
        out.update(variables=report.variables, bytes=report.bytes, read_s=report.read_s,
                   switch_s=report.switch_s, create_s=report.create_s)
        out["sum_moved"] = checksum(everything)
        fn = traced(strategy, model, optimizer, step)       # the old trace holds the old handles
        out["moved_placement"] = sorted({psmove.ps_task(v.device) for v in psmove.resource_variables(everything)})
    else:                       # rebuild: a new strategy, coordinator and model from an in-memory copy, on ps:0
        values = [v.numpy() for v in everything]
        new_cluster = dict(cluster, ps=cluster["ps"][:1])
        server_def = context.get_server_def()
        server_def.cluster.CopyFrom(tf.train.ClusterSpec(new_cluster).as_cluster_def())
        context.context().update_server_def(server_def)
        os.environ["TF_CONFIG"] = json.dumps({"cluster": new_cluster, "task": {"type": "chief", "index": 0}})
        strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        model, optimizer, step = build(strategy)
        everything = list(model.weights) + list(optimizer.variables) + [step]
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)   # the old one's are gone
        for variable, value in zip(everything, values):
            variable.assign(value)
        iterator = datasets(coordinator)
        fn = traced(strategy, model, optimizer, step)
        out["sum_moved"] = checksum(everything)
    out["prepare_s"] = time.perf_counter() - began
    out["step_from"] = int(step.numpy())
    first = train(coordinator, fn, iterator, STEPS_AFTER)
    out.update(pause=first - last_before, step_end=int(step.numpy()))
    # A checkpoint after the move holds the moved variables (the restart path depends on it).
    path = checkpoint.write(ckpt + "-after", options=io)
    want = checksum(everything)
    for variable in everything:
        variable.assign(tf.zeros_like(variable))
    checkpoint.read(path, options=io).assert_existing_objects_matched()
    out["checkpoint_after"] = abs(checksum(everything) - want) <= 1e-6 * max(1.0, want)
    return out


# ---------------------------------------------------------------------------- one trial
def _chief_proc(args: list[str], log: Path) -> dict:
    env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
               PYTHONPATH=str(REPO))
    with open(log, "a") as err:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.ps_move", "--chief", *args], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=err, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"chief {' '.join(args)} failed ({proc.returncode}); see {log}:\n"
                           f"{log.read_text()[-3000:]}")
    return json.loads(lines[-1])


def _first_error(text: str) -> str:
    """The first TensorFlow error message in a chief's log tail."""
    for marker in ("No worker known as", "RecvTensor expects a different device incarnation", "Error"):
        at = text.find(marker)
        if at >= 0:
            return text[at:at + 160].split("\\n")[0].split("\n")[0]
    return text[-160:]


def trial(scenario: str, work: Path, ports: list[int] | None = None) -> dict:
    """One run of ``scenario`` on servers of its own (stopped at the end, by PID); ``ports``: six
    free ports (default: picked here)."""
    ports = ports or free_ports(6)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{p}" for p in ports[1:3]],
               "worker": [f"127.0.0.1:{p}" for p in ports[3:5]]}
    spare = f"127.0.0.1:{ports[5]}"
    folder = Path(tempfile.mkdtemp(prefix=f"{scenario}-", dir=work))
    procs = start_servers(cluster, spare, 1 if scenario == "restart" else 2, folder, known=scenario == "move-spare")
    pids = [proc.pid for proc in procs]
    try:
        ckpt = str(folder / "ckpt")
        if scenario == "move-spare":
            cluster = dict(cluster, ps=list(cluster["ps"]) + [spare])
        common = ["--cluster", json.dumps(cluster), "--spare", spare, "--ckpt", ckpt]
        try:
            result = _chief_proc([scenario, "before", *common], folder / "chief.log")
        except RuntimeError as exc:
            if scenario != "move":
                raise
            # Expected in TensorFlow 2.21 (module docstring): the first step after the switch fails.
            return {"failed": _first_error(str(exc)), "pause": float("nan"), "steps_lost": None,
                    "equal": False, "ok": False, "server_pids": pids}
        if scenario == "restart":       # the new chief knows the cluster with the spare
            moved = restarted_cluster(cluster, spare)
            after = _chief_proc([scenario, "after", "--cluster", json.dumps(moved), "--spare", spare, "--ckpt", ckpt],
                                folder / "chief.log")
            result.update(pause=after["first_after"] - result["last_before"], step_from=after["restored"],
                          sum_moved=after["sum_after"], step_end=after["step_end"])
        result["server_pids"] = pids
        result["steps_lost"] = result["step_before"] - result["step_from"]
        result["equal"] = abs(result["sum_moved"] - result["sum_before"]) <= 1e-6 * max(1.0, result["sum_before"])
        result["ok"] = (result["steps_lost"] == 0 and result["step_end"] == result["step_from"] + STEPS_AFTER
                        and 1 not in result.get("moved_placement", []))     # nothing left on ps:1
        return result
    finally:
        stop(procs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--chief", nargs=2, metavar=("SCENARIO", "PHASE"))
    parser.add_argument("--cluster")
    parser.add_argument("--spare")
    parser.add_argument("--ckpt")
    args = parser.parse_args(argv)
    if args.chief:
        result = chief(args.chief[0], json.loads(args.cluster), args.spare, args.ckpt, args.chief[1])
        print(json.dumps(result), flush=True)
        os._exit(0)     # no teardown of the remote contexts (TF10: it can wait on every task)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {','.join(SCENARIOS)}")
    work = Path(tempfile.mkdtemp(prefix="ps-move-"))
    results: dict[str, list[dict]] = {s: [] for s in scenarios}
    for n in range(args.trials):
        for scenario in scenarios:          # taking turns: a slow moment of the machine hits all
            results[scenario].append(trial(scenario, work))
            r = results[scenario][-1]
            print(f"trial {n + 1} {scenario:8s} pause {r['pause']:6.2f} s  steps lost {r['steps_lost']}  "
                  f"values equal {r['equal']}  ok {r['ok']}", file=sys.stderr, flush=True)
    summary = {s: summarize(rs) for s, rs in results.items()}
    if summary.get("restart", {}).get("pause_median_s"):
        for s in summary:
            if summary[s].get("pause_median_s") is not None:
                summary[s]["vs_restart"] = round(summary[s]["pause_median_s"] / summary["restart"]["pause_median_s"], 3)
    if args.json:
        print(json.dumps({"summary": summary, "trials": results}, indent=1))
    else:
        print(f"{'scenario':10s} {'pause (median)':>15s} {'vs restart':>11s} {'steps lost':>11s}  ok")
        for s, row in summary.items():
            if "failed" in row:
                print(f"{s:10s} failed: {row['failed']}")
                continue
            print(f"{s:10s} {row['pause_median_s']:13.2f} s {row.get('vs_restart', float('nan')):11.3f} "
                  f"{row['steps_lost_max']:11d}  {row['all_ok']}")
    # The in-place move to a new server fails in TensorFlow 2.21 (TF13): its failure is the finding.
    return 0 if all(row["all_ok"] for s, row in summary.items() if s != "move") else 1


def summarize(trials: list[dict]) -> dict:
    failed = [t["failed"] for t in trials if "failed" in t]
    if failed:
        return {"failed": failed[0], "failures": len(failed), "all_ok": False}
    return {"pause_median_s": round(statistics.median(t["pause"] for t in trials), 3),
            "pauses_s": [round(t["pause"], 3) for t in trials],
            "prepare_median_s": (round(statistics.median(t["prepare_s"] for t in trials), 3)
                                 if all("prepare_s" in t for t in trials) else None),
            "steps_lost_max": max(t["steps_lost"] for t in trials),
            "all_ok": all(t["ok"] and t["equal"] and t.get("checkpoint_after", True) for t in trials)}

if __name__ == "__main__":
    sys.exit(main())
