"""``pscluster bench``: one real study on this machine (TensorFlow processes, ~2 minutes on 2
cores); the study's pure planning and arithmetic are tested in tests/unit/test_bench_study.py."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli


@pytest.mark.tf
def test_local_study_json_table_and_plot(tmp_path):
    """Two async configurations on local.yaml (MLP, 32 steps): complete JSON, sane values, a PNG,
    and nothing left running."""
    data = yaml.safe_load((REPO / "inventories/local.yaml").read_text())
    data["all"]["vars"].update(pscluster_port_base=port_base(),
                               pscluster_env={"MNIST_MODEL": "mlp", "OMP_NUM_THREADS": 1})
    inventory = tmp_path / "local.yaml"
    inventory.write_text(yaml.safe_dump(data))
    out, plot, state_dir = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "state"
    # 4 steps per scheduled function, so that 32 steps leave several timed ones (the first is not).
    proc = run_cli(["bench", "distributed_mnist", inventory, "--workers", "1,2", "--mode", "async",
                    "--steps", "32", "--steps-per-execution", "4", "--json", "--out", out, "--plot", plot],
                   state_dir=state_dir, timeout=400)
    names = ["bench-async-1w-pack-r1", "bench-async-2w-pack-r1"]
    for name in names:
        assert_no_survivors(name)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == document
    results = document["results"]
    assert [(r["mode"], r["workers"], r["placement"], r["repeat"], r["name"], r["status"]) for r in results] == [
        ("async", 1, "pack", 1, names[0], "ok"), ("async", 2, "pack", 1, names[1], "ok")]
    for r in results:
        assert r["error"] is None and r["down_error"] is None
        assert r["bringup_seconds"] > 0 and r["train_seconds"] > 0
        assert r["examples_per_second"] > 0 and r["steps_per_second"] > 0
        assert r["global_step"] == 32
        assert 0 < r["efficiency"] <= 1.5
        assert 0 < r["val_accuracy"] <= 1 and r["val_loss"] > 0
        assert r["time_to_target_seconds"] is None
        assert r["hosts"] == [{"host": "localhost", "workers": r["workers"], "slots": 2,
                               "slots_from": "worker_tasks"}]
        assert sorted(r["per_worker_examples_per_second"]) == [f"worker:{i}" for i in range(r["workers"])]
    assert results[0]["efficiency"] == 1.0
    environment = document["environment"]
    assert environment["command"].startswith("pscluster bench distributed_mnist ")
    assert environment["pscluster"] and environment["date"] and environment["control"]["python"]
    [host] = environment["hosts"]
    assert host["host"] == "localhost" and host["cpus"] >= 1 and host["tf_version"] and host["tf_dist"]
    assert isinstance(host["gpus"], list)
    assert [(row["workers"], row["ok"], row["runs"]) for row in document["summary"]] == [(1, 1, 1), (2, 1, 1)]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000
    assert list(state_dir.glob("*.json")) == []
