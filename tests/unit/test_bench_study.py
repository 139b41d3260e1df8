"""``pscluster bench``: the study's pure planning and arithmetic on hand-checked cases
(the real study on this machine is in tests/local/test_bench.py)."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from cluster.bench import study as bench
from cluster.cli import Env, run
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import StateStore
from tests.helpers import REPO

OPTIONS = PlanOptions(local_python="/here/venv/bin/python", local_workdir="/here/checkout")

# node-a: two GPU workers (slots from worker_gpus), chief and ps; node-b: 3 workers by count;
# node-c: one implicit worker (slots from its CPU count, 4 below).
THREE_HOSTS = """
all:
  vars:
    pscluster_port_base: 5000
  children:
    chief: {hosts: {node-a: {ansible_host: 198.51.100.1}}}
    ps: {hosts: {node-a: {ansible_host: 198.51.100.1}}}
    worker:
      hosts:
        node-a: {ansible_host: 198.51.100.1, worker_gpus: [[0], [1]]}
        node-b: {ansible_host: 198.51.100.2, worker_tasks: 3}
        node-c: {ansible_host: 198.51.100.3}
"""
CPUS = {"node-a": 8, "node-b": 8, "node-c": 4}


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "three.yaml"
    path.write_text(THREE_HOSTS)
    return load_inventory(str(path))


def spec(**fields) -> bench.StudySpec:
    return bench.StudySpec(**{"modes": ("async",), "workers": (1,), "placements": ("pack",), "steps": 10,
                              **fields})


def placed(config: bench.BenchConfig) -> list[tuple[str, str, str | None]]:
    """(worker task, host, CUDA_VISIBLE_DEVICES) of a configuration's plan."""
    return [(task.name, task.host, task.cuda_visible_devices) for task in config.plan.tasks_of("worker")]


def test_slots_come_from_gpus_then_tasks_then_cpus(inventory):
    assert bench.worker_slots(inventory, CPUS) == (
        bench.HostSlots("node-a", 2, "worker_gpus"), bench.HostSlots("node-b", 3, "worker_tasks"),
        bench.HostSlots("node-c", 4, "cpus"))


def test_spread_puts_one_worker_per_host_in_inventory_order(inventory):
    configs = bench.plan_study(inventory, spec(workers=(1, 2, 3, 4), placements=("spread",)), OPTIONS, CPUS)
    by_workers = {config.workers: config for config in configs}
    assert placed(by_workers[1]) == [("worker:0", "node-a", "0")]
    assert placed(by_workers[3]) == [("worker:0", "node-a", "0"), ("worker:1", "node-b", None),
                                     ("worker:2", "node-c", None)]
    impossible = by_workers[4]
    assert impossible.plan is None and impossible.hosts == ()
    assert impossible.impossible == ("spread places one worker per host: 4 workers need 4 worker hosts, "
                                     "the inventory has 3 (node-a, node-b, node-c)")


def test_pack_fills_each_host_before_the_next(inventory):
    configs = bench.plan_study(inventory, spec(workers=(3, 6, 9, 10)), OPTIONS, CPUS)
    by_workers = {config.workers: config for config in configs}
    assert placed(by_workers[3]) == [("worker:0", "node-a", "0"), ("worker:1", "node-a", "1"),
                                     ("worker:2", "node-b", None)]
    assert [(use.host, use.workers, use.source) for use in by_workers[6].hosts] == [
        ("node-a", 2, "worker_gpus"), ("node-b", 3, "worker_tasks"), ("node-c", 1, "cpus")]
    assert [task.host for task in by_workers[9].plan.tasks_of("worker")] == ["node-a"] * 2 + ["node-b"] * 3 + \
        ["node-c"] * 4
    assert by_workers[10].plan is None
    assert by_workers[10].impossible == ("pack: 10 workers need 10 slots, the worker hosts have 9 (node-a: 2 "
                                         "from worker_gpus, node-b: 3 from worker_tasks, node-c: 4 from cpus)")


def test_a_configuration_is_the_plan_of_the_equivalent_inventory(inventory, tmp_path):
    """Ports, masks, TF_CONFIG and argv are exactly what plan_cluster makes of an inventory that
    lists only those workers (with the configuration's port base)."""
    configs = bench.plan_study(inventory, spec(workers=(1, 3), repeat=2), OPTIONS, CPUS)
    assert [c.name for c in configs] == ["bench-async-1w-pack-r1", "bench-async-3w-pack-r1",
                                         "bench-async-1w-pack-r2", "bench-async-3w-pack-r2"]
    config = configs[3]                   # the 4th cluster: ports shifted by 3 x (1 chief + 1 ps + 3 workers)
    same = tmp_path / "same.yaml"
    same.write_text(THREE_HOSTS.replace("5000", "5015").replace("worker_tasks: 3", "worker_tasks: 1")
                    .replace("        node-c: {ansible_host: 198.51.100.3}\n", ""))
    expected = plan_cluster(load_inventory(str(same)), PlanOptions(**{**OPTIONS.__dict__, "name": config.name}))
    assert config.plan.cluster == expected.cluster
    assert config.plan.tasks == expected.tasks
    assert [t.port for t in config.plan.tasks] == [5015, 5016, 5017, 5018, 5015]
    bases = [min(t.port for t in c.plan.tasks) for c in configs]
    assert bases == [5000, 5005, 5010, 5015]


def test_a_mode_the_inventory_cannot_run_is_impossible_not_a_crash(tmp_path):
    path = tmp_path / "no_chief.yaml"
    path.write_text("all:\n  children:\n    ps: {hosts: {a: }}\n    worker: {hosts: {a: , b: }}\n")
    configs = bench.plan_study(load_inventory(str(path)), spec(modes=("async", "sync"), workers=(2,),
                                                               placements=("spread",)), OPTIONS, {})
    assert configs[0].plan is None and "needs a chief task" in configs[0].impossible
    assert configs[1].impossible is None and [t.name for t in configs[1].plan.tasks] == ["worker:0", "worker:1"]


def result(workers: int, eps: float | None, repeat: int = 1, placement: str = "pack", status: str = "ok"):
    return bench.BenchResult("async", workers, placement, repeat, f"n{workers}r{repeat}", status,
                             examples_per_second=eps)


def test_efficiency_against_the_median_one_worker_throughput():
    results = bench.with_efficiency([result(1, 100.0, 1), result(1, 120.0, 2), result(1, 80.0, 3),
                                     result(2, 150.0), result(4, 200.0), result(2, 300.0, placement="spread")])
    assert [r.efficiency for r in results] == [1.0, 1.2, 0.8, 0.75, 0.5, None]
    rows = {(row.placement, row.workers): row for row in bench.summarize(results)}
    one = rows[("pack", 1)]
    assert (one.examples_per_second.median, one.examples_per_second.low, one.examples_per_second.high) == \
        (100.0, 80.0, 120.0)
    assert (one.efficiency.median, one.efficiency.low, one.efficiency.high) == (1.0, 0.8, 1.2)
    assert rows[("spread", 2)].efficiency is None


def test_measured_values_and_time_to_target():
    config = bench.BenchConfig("sync", 2, "pack", 1, "bench-sync-2w-pack-r1", (), None)
    report = {"wall_seconds": 20.0, "global_step": 300, "examples_per_second": 2560.0, "val_accuracy": 0.97,
              "val_loss": 0.1, "evals": [{"step": 100, "val_accuracy": 0.9, "seconds": 8.5},
                                         {"step": 200, "val_accuracy": 0.96, "seconds": 14.25}]}
    measured = bench.measured(config, bringup_seconds=5.0, report=report, global_batch_size=128,
                              per_worker={"worker:0": 1280.04}, target=0.95)
    assert (measured.steps_per_second, measured.train_seconds, measured.bringup_seconds) == (20.0, 20.0, 5.0)
    assert measured.time_to_target_seconds == 14.25
    assert measured.to_json()["per_worker_examples_per_second"] == {"worker:0": 1280.0}
    assert bench.time_to_target(report, 0.97) == 20.0          # the final evaluation counts, at wall time
    assert bench.time_to_target(report, 0.99) is None
    assert bench.time_to_target(report, None) is None


def test_bad_lists_are_usage_errors(tmp_path):
    for argv in (["--workers", "1,two"], ["--workers", "1", "--mode", "async,fast"],
                 ["--workers", "0,1"], ["--workers", "1", "--placement", "scatter"]):
        err = io.StringIO()
        env = Env(out=Console(file=io.StringIO()), err=Console(file=err, width=300), store=StateStore(tmp_path))
        assert run(["bench", "distributed_mnist", str(REPO / "inventories/local.yaml"), *argv], env=env) == 2, argv
        assert "--" in err.getvalue()


def local_inventory():
    return load_inventory(str(REPO / "inventories" / "local.yaml"))


@pytest.mark.parametrize("workers, modes, placements, error", [
    ("1,x", None, "spread", "--workers: expected whole numbers"),
    ("0,1", None, "spread", "at least 1 worker"),
    ("1", "sync,fast", "spread", "--mode: fast is not one of"),
    ("1", None, "scatter", "--placement: scatter is not one of"),
    (" , ", None, "spread", "--workers: give at least one value"),
])
def test_the_study_a_command_line_asks_for_is_checked_below_the_command(workers, modes, placements, error):
    from cluster.errors import UsageError
    with pytest.raises(UsageError, match=error):
        bench.StudySpec.from_command_line(local_inventory(), workers=workers, modes=modes, placements=placements, steps=10)


def test_a_study_defaults_to_the_inventory_s_mode_and_takes_aliases():
    spec = bench.StudySpec.from_command_line(local_inventory(), workers="2,1,2", modes="between-graph,sync-ps", placements="pack",
                                       steps=10)
    assert (spec.modes, spec.workers, spec.placements) == (("sync-ps",), (1, 2), ("pack",))
    assert bench.StudySpec.from_command_line(local_inventory(), workers="1", modes=None, placements="spread", steps=10).modes == \
        (local_inventory().mode or "async",)
