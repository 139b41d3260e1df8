"""Issue 24 items 1 and 3 end to end on this machine: TensorFlow's Keras `fit` tutorial program
(examples/byo/keras_fit: main.py + mnist_setup.py) through a one-shot `run`, with legacy Keras
and without (its failure carries the hint), and a module a host lacks named before anything
starts. Few steps: these check the path, not the training."""
from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, accuracy_in, assert_no_survivors, port_base, run_cli

LOCAL = REPO / "inventories" / "local.yaml"
KERAS_FIT = ["python", "examples/byo/keras_fit/main.py", "--epochs", "1", "--steps_per_epoch", "15"]


@pytest.mark.tf
def test_keras_fit_program_trains_with_legacy_keras(tmp_path, cleanup):
    name, state_dir = "run-kfit", tmp_path / "state"
    cleanup(name, state_dir)
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--mode", "sync", "--keras", "legacy",
                    "--json", "--", *KERAS_FIT], state_dir=state_dir, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert {f"{t['role']}:{t['index']}": t["exit_code"] for t in report["tasks"]} == {"worker:0": 0, "worker:1": 0}
    assert 0.0 < accuracy_in(proc.stderr, "worker:0") <= 1.0        # printed by the program itself
    assert not (state_dir / f"{name}.json").exists()


@pytest.mark.tf
def test_keras_fit_program_fails_under_keras3_with_the_hint(tmp_path, cleanup):
    name, state_dir = "run-kfit3", tmp_path / "state"
    cleanup(name, state_dir)
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--mode", "sync", "--",
                    *KERAS_FIT], state_dir=state_dir, timeout=600)
    assert proc.returncode == 1, proc.stderr[-4000:]
    summary = " ".join(proc.stderr[proc.stderr.rindex("error: run failed"):].split())    # as wrapped to 200
    assert "ValueError: Attempt to convert a value (PerReplica:" in summary
    assert "hint: Keras 3's fit does not work under TensorFlow's multi-worker strategies" in summary
    assert "--keras legacy" in summary and "pscluster_keras: legacy" in summary
    assert not (state_dir / f"{name}.json").exists()


def test_a_module_the_script_imports_that_a_host_lacks_is_named_before_anything_starts(tmp_path):
    name, state_dir = "run-nomod", tmp_path / "state"
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("import os\nimport helper\nprint('started', flush=True)\n")
    (project / "helper.py").write_text("import numpy\nimport no_such_module_24b\n")
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--mode", "sync", "--",
                    "python", "main.py"], state_dir=state_dir, cwd=project, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "localhost: module 'no_such_module_24b' (imported at helper.py:2) is not installed for" in proc.stderr
    assert "nothing was started" in proc.stderr and "pip install no_such_module_24b" in proc.stderr
    assert "started" not in proc.stdout and "[worker:0@" not in proc.stderr
    assert not (state_dir / f"{name}.json").exists()
    assert_no_survivors(name)
