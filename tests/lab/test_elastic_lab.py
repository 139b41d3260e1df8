"""A cluster that changes under a running job, over real SSH (issue 23): the 3-host lab, every
host in its own workdir (code synced to a host when it joins).

* `scale` adds node-3 mid-run (async, sync): its worker trains; accuracy >= 98.5 %.
* `scale` removes node-2 mid-run: it is drained, nothing of the cluster is left running there.
* node-3's link is cut under `--min-workers 2` (async): the job goes on in place without it,
  nothing restored; once the link heals, node-3's worker (its server never stopped) trains again.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base, run_cli
from testbed.netlab import write_inventory
from testbed.procs import cluster_pids

pytestmark = [pytest.mark.lab, pytest.mark.tf]

HOSTS = ("node-1", "node-2", "node-3")


def write(lab3, tmp_path, mode: str, workers: tuple[str, ...], base: int, model: str = "cnn"):
    def at(host: str) -> dict:
        return {host: {"pscluster_workdir": str(tmp_path / f"work-{host}")}}
    groups: dict = {"worker": {k: v for host in workers for k, v in at(host).items()}}
    if mode == "async":
        groups = {"chief": at("node-1"), "ps": at("node-1"), **groups}
    return write_inventory(lab3, tmp_path / f"{mode}-{'-'.join(workers)}.yaml", groups, {
        "pscluster_port_base": base, "pscluster_mode": mode, "pscluster_env": {"OMP_NUM_THREADS": 1, "MNIST_MODEL": model},
        "pscluster_intra_op_threads": 1})


@contextlib.contextmanager
def lab_cluster(tmp_path, lab3, name: str, mode: str, workers: tuple[str, ...], model: str = "cnn"):
    """``up`` of the lab with ``workers``; yields (state dir, port base); down and checked after."""
    state_dir, base = tmp_path / "state", port_base()
    down = None
    try:
        up = run_cli(["up", write(lab3, tmp_path, mode, workers, base, model), "--name", name], state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        yield state_dir, base
    finally:
        lab3.heal_all()
        if (state_dir / f"{name}.json").exists():
            down = run_cli(["down", "--name", name, "--now"], state_dir=state_dir)
    # `down` after a resize took a host out must not trip over that host's old records.
    assert down is None or (down.returncode == 0 and "Traceback" not in down.stderr), down.stderr
    assert_no_survivors(name)


def state_of(state_dir, name) -> dict:
    return json.loads((state_dir / f"{name}.json").read_text())


def chief_log_tail(state_dir, lines: int = 40) -> str:
    """The last lines of every chief log of the lab's node-1 (a failure's evidence: CI keeps no tmp)."""
    logs = sorted(state_dir.parent.glob("work-node-1/.pscluster/*/job-*/chief-0.*.log"))
    return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in logs)


def wait_until(state_dir, name, train, what: str, ok, timeout: float = 900) -> dict:
    end = time.monotonic() + timeout
    while True:
        assert train.poll() is None, train.stderr.read()[-4000:] + chief_log_tail(state_dir)
        state = state_of(state_dir, name)
        if ok(state):
            return state
        assert time.monotonic() < end, f"never {what}: {state.get('job')}\n{chief_log_tail(state_dir)}"
        time.sleep(0.3)


def start_train(state_dir, name, *extra) -> subprocess.Popen:
    return subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", name, "--json", *extra]), cwd=REPO,
                            env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def step(state: dict) -> int:
    return (state.get("job") or {}).get("step") or 0


def workers_of(state: dict) -> list[str]:
    return [t["host"] for t in state["plan"]["tasks"] if t["role"] == "worker"]


def finish(train: subprocess.Popen) -> tuple[dict, str]:
    out, err = train.communicate(timeout=900)
    assert train.returncode == 0, err[-4000:]
    return json.loads(out), err


def events_steps(record: dict) -> int:
    with open(record["events"]) as handle:
        return max((json.loads(line).get("step") or 0 for line in handle if line.strip()), default=0)


# Budgets: what reaches issue 23's 98.5 % with a margin (here 98.97 % after 3,500 async steps and
# 99.25 % after 2,000 sync steps); the eighth session cut them from 6,000 and 3,000.
@pytest.mark.extended
@pytest.mark.parametrize("mode, steps", [("async", 4000), ("sync", 2000)])
def test_scale_adds_node_3_mid_run(tmp_path, lab3, mode, steps):
    name = f"elastic-add-{mode}"
    with lab_cluster(tmp_path, lab3, name, mode, ("node-1", "node-2")) as (state_dir, base):
        train = start_train(state_dir, name, "--steps", steps)
        try:
            wait_until(state_dir, name, train, "trained 300 steps", lambda s: step(s) >= 300)
            scale = run_cli(["scale", write(lab3, tmp_path, mode, HOSTS, base), "--name", name], state_dir=state_dir)
            assert scale.returncode == 0, scale.stderr
            report, err = finish(train)
        finally:
            if train.poll() is None:
                train.kill()
        assert "3 worker(s)" in " ".join(err.split()) and report["workers"] == 3, err[-3000:]
        print(f"{mode}: accuracy {report['val_accuracy']} after {report['global_step']} steps")
        assert report["val_accuracy"] >= 0.985 and report["steps_redone"] == 0, report
        state = state_of(state_dir, name)
        assert workers_of(state) == list(HOSTS)
        if mode == "async":      # in place (the chief was told over SSH); the coordinator's count of each worker's work
            assert "resized (scale) in place: start worker:2@node-3" in " ".join(err.split()), err[-3000:]
            assert not report["restored_step"], report
            assert report["per_worker_examples_per_second"]["worker:2"] > 0, report
        else:                    # node-3's own training process reported its steps
            record = next(r for r in state["processes"] if r["host"] == "node-3" and r["kind"] == "train")
            assert events_steps(record) > 0
        assert (tmp_path / "work-node-3" / ".pscluster").is_dir()     # the code travelled to node-3


@pytest.mark.extended
def test_scale_removes_node_2_mid_run_and_drains_it(tmp_path, lab3):
    name = "elastic-remove"
    with lab_cluster(tmp_path, lab3, name, "async", HOSTS) as (state_dir, base):
        train = start_train(state_dir, name, "--steps", 4000)
        try:
            before = wait_until(state_dir, name, train, "trained 300 steps", lambda s: step(s) >= 300)
            on_node_2 = [r["pid"] for r in before["processes"] if r["host"] == "node-2" and not r.get("stopped")]
            assert on_node_2
            scale = run_cli(["scale", write(lab3, tmp_path, "async", ("node-1", "node-3"), base), "--name", name],
                            state_dir=state_dir)
            assert scale.returncode == 0, scale.stderr
            report, _ = finish(train)
        finally:
            if train.poll() is None:
                train.kill()
        assert report["workers"] == 2 and report["val_accuracy"] >= 0.985 and report["steps_redone"] == 0, report
        state = state_of(state_dir, name)
        assert workers_of(state) == ["node-1", "node-3"]
        assert not [r for r in state["processes"] if r["host"] == "node-2" and not r.get("stopped")]
        alive = set(cluster_pids(name))
        assert not alive & set(on_node_2), "node-2 was not drained"


def test_a_cut_host_drops_out_under_min_workers_and_rejoins_when_it_heals(tmp_path, lab3):
    """Async (issue 41): the job goes on in place, nothing restored, and node-3's worker comes
    back in place once the link heals (its server, still running, is watched again)."""
    name = "elastic-cut"
    with lab_cluster(tmp_path, lab3, name, "async", HOSTS, model="mlp") as (state_dir, _):     # stopped by state
        train = start_train(state_dir, name, "--steps", 100000, "--min-workers", 2, "--host-timeout", 5,
                            "--checkpoint-every", 500)
        try:
            at_cut = step(wait_until(state_dir, name, train, "trained 300 steps", lambda s: step(s) >= 300))
            lab3.cut("node-3")
            wait_until(state_dir, name, train, "went on without node-3, in place",
                       lambda s: "in place with 2 worker(s)" in (s["job"].get("message") or "")
                       and s["job"]["state"] == "running")
            at_heal = step(wait_until(state_dir, name, train, "trained on two workers",
                                      lambda s: step(s) >= at_cut + 300 and s["job"]["state"] == "running"))
            lab3.heal("node-3")
            # The supervisor took node-3 back (its message of the loss is cleared), and node-3's worker
            # trains again: the chief counts its examples (the plan never changed).
            wait_until(state_dir, name, train, "trained on node-3 after the rejoin",
                       lambda s: step(s) >= at_heal + 300 and (s["job"].get("per_worker") or {}).get("worker:2", 0) > 0
                       and "in place" not in (s["job"].get("message") or ""))
            stop = run_cli(["stop-job", "--name", name], state_dir=state_dir)
            assert stop.returncode == 0, stop.stderr
            _, err = train.communicate(timeout=300)
        finally:
            lab3.heal("node-3")
            if train.poll() is None:
                train.kill()
        said = " ".join(err.split())
        assert "node-3 lost for over 5 s" in said and "training goes on in place with 2 worker(s)" in said, err[-4000:]
        # The link healed: worker:2's server still runs and answers, so it is watched again, not restarted.
        assert "node-3 is back: worker:2 still running" in said, err[-4000:]
        assert "resumed from step" not in said and "resuming from" not in said, err[-4000:]    # nothing restored
        # The supervisor told the chief the moment node-3's heartbeat stopped (roles/closures.py cut).
        chief_logs = " ".join(p.read_text(errors="replace") for p in tmp_path.glob("work-node-1/.pscluster/*/job-*/chief-0.*.log"))
        assert "the orchestrator lost" in chief_logs, chief_logs[-3000:]
        final = state_of(state_dir, name)
        assert final["job"]["state"] == "stopped" and final["job"]["checkpoint_step"] > 0
