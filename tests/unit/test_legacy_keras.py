"""Issue 24 item 1: legacy Keras for `run` programs -- pscluster_keras (any inventory level,
validated), run --keras, TF_USE_LEGACY_KERAS for program tasks only, and the root-cause hint
on Keras 3's multi-worker failure."""
from __future__ import annotations

import json

import pytest

from cluster.errors import InventoryError, TaskError, known_failure_hint
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.program.runspec import program_env

from .test_cli_plan import Captured

OPTIONS = PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout", mode="sync")
INVENTORY = """
    all:
      vars: {pscluster_port_base: 2222%s}
      children:
        worker:
          vars: {%s}
          hosts:
            a: {ansible_connection: local%s}
            b: {ansible_connection: local}
"""
# What Keras 3's fit under MultiWorkerMirroredStrategy printed here (TF 2.21, Keras 3.15), cut.
KERAS3_FAILURE = """\
Traceback (most recent call last):
  File "main.py", line 48, in <module>
    multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
ValueError: Attempt to convert a value (PerReplica:{
  0: <tf.Tensor: shape=(64, 28, 28), dtype=float32, numpy=
array([[[0., 0., 0., ..., 0., 0., 0.],
        [0., 0., 0., ..., 0., 0., 0.]]], shape=(64, 28, 28), dtype=float32)>
}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.
"""


def keras_of(write_inventory, all_vars="", group_vars="", host_vars="") -> dict[str, str]:
    path = write_inventory(INVENTORY % (all_vars, group_vars, host_vars))
    plan = plan_cluster(load_inventory(path), OPTIONS)
    return {host.name: host.keras for host in plan.hosts}


def test_pscluster_keras_is_read_at_every_level_host_beating_group_beating_all(write_inventory):
    assert keras_of(write_inventory) == {"a": "keras3", "b": "keras3"}
    assert keras_of(write_inventory, all_vars=", pscluster_keras: legacy") == {"a": "legacy", "b": "legacy"}
    assert keras_of(write_inventory, group_vars="pscluster_keras: legacy") == {"a": "legacy", "b": "legacy"}
    assert keras_of(write_inventory, group_vars="pscluster_keras: legacy",
                    host_vars=", pscluster_keras: keras3") == {"a": "keras3", "b": "legacy"}


@pytest.mark.parametrize("value", ["lgacy", "[legacy]", "{a: 1}", "3", "true", "''"])
def test_a_bad_pscluster_keras_names_file_line_and_key(write_inventory, value):
    path = write_inventory(INVENTORY % ("", "", f", pscluster_keras: {value}"))
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    error = caught.value
    assert error.exit_code == 2 and error.file == "lab.yaml" and error.line == 7
    assert error.key_path == "worker.hosts.a.pscluster_keras"
    assert "expected one of keras3, legacy" in error.message


def test_program_tasks_get_tf_use_legacy_keras_where_legacy_is_asked_for(write_inventory):
    path = write_inventory(INVENTORY % ("", "", ", pscluster_keras: legacy"))
    plan = plan_cluster(load_inventory(path), OPTIONS)
    on_a, on_b = plan.task("worker:0"), plan.task("worker:1")
    assert program_env(plan, on_a)["TF_USE_LEGACY_KERAS"] == "1"
    assert "TF_USE_LEGACY_KERAS" not in program_env(plan, on_b)
    assert program_env(plan, on_b, "legacy")["TF_USE_LEGACY_KERAS"] == "1"         # run --keras legacy
    assert "TF_USE_LEGACY_KERAS" not in program_env(plan, on_a, "keras3")            # run --keras keras3
    # train's processes and the standing servers keep Keras 3: the planned task env has no switch.
    assert "TF_USE_LEGACY_KERAS" not in plan.task_env(on_a)


def test_run_dry_run_shows_the_switch(tmp_path, write_inventory):
    write_inventory(INVENTORY % ("", "", ""))
    cli = Captured(tmp_path / "state")
    assert cli.run("run", "lab.yaml", "--mode", "sync", "--keras", "legacy", "--dry-run", "--json", "--",
                   "python", "main.py") == 0, cli.stderr.getvalue()
    rows = json.loads(cli.stdout.getvalue())["tasks"]
    assert [row["env"].get("TF_USE_LEGACY_KERAS") for row in rows] == ["1", "1"]
    assert cli.run("run", "lab.yaml", "--keras", "new", "--dry-run", "--", "python", "main.py") == 2


def test_keras3s_multi_worker_failure_gets_the_hint():
    hint = known_failure_hint(KERAS3_FAILURE)
    assert hint is not None and "--keras legacy" in hint and "pscluster_keras: legacy" in hint
    # only the last line survived in a short tail: still recognised
    assert known_failure_hint(KERAS3_FAILURE.splitlines()[-1]) == hint
    assert known_failure_hint("ValueError: something else\n") is None
    error = TaskError("worker:0", "node-b", "exited with code 1", exit_code=1, log_tail=KERAS3_FAILURE)
    assert error.hint == hint and "ValueError: Attempt to convert a value (PerReplica:{" in str(error)
    assert TaskError("worker:0", "b", "x", log_tail=KERAS3_FAILURE, hint="given").hint == "given"


PS_FIT_FAILURE = """Traceback (most recent call last):
  File "/home/u/pscluster/examples/byo/tf2_ps_fit.py", line 120, in fit
    model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=args.epochs,
              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
AttributeError: module 'keras.utils' has no attribute 'experimental'
"""


@pytest.mark.parametrize("line", [
    "AttributeError: module 'keras.utils' has no attribute 'experimental'",      # DatasetCreator
    "AttributeError: module 'keras._tf_keras.keras.layers' has no attribute 'experimental'",   # preprocessing
    "AttributeError: module 'keras.utils' has no attribute 'SidecarEvaluator'",
    "AttributeError: module 'keras.optimizers' has no attribute 'experimental'",
    "AttributeError: module 'keras._tf_keras.keras.backend' has no attribute 'get_session'",
    "ModuleNotFoundError: No module named 'tensorflow.keras.layers.experimental'",
    "ImportError: `keras.optimizers.legacy` is not supported in Keras 3. When using `tf.keras`, to continue ...",
])
def test_keras2_only_names_get_the_legacy_keras_hint(line):
    """Issue 45 item 5: TensorFlow's ParameterServerStrategy tutorial (`model.fit(DatasetCreator(...))`)
    fails under Keras 3 with no hint; it runs unchanged with `run --keras legacy`."""
    hint = known_failure_hint(f"{line}\n")
    assert hint is not None and "Keras 3 removed" in hint
    assert "--keras legacy" in hint and "pscluster_keras: legacy" in hint
    error = TaskError("chief:0", "localhost", "exited with code 1", exit_code=1, log_tail=PS_FIT_FAILURE)
    assert error.hint == hint and "has no attribute 'experimental'" in str(error)


@pytest.mark.parametrize("line", [
    "AttributeError: module 'numpy' has no attribute 'experimental'",
    "AttributeError: 'Sequential' object has no attribute 'experimental'",
    "ModuleNotFoundError: No module named 'keras_tuner'",
])
def test_other_missing_names_get_no_keras_hint(line):
    assert known_failure_hint(f"{line}\n") is None


def test_preflight_checks_tf_keras_on_legacy_hosts_only(write_inventory):
    from cluster.hosts.preflight import check_host
    from .test_preflight_checks import facts
    path = write_inventory(INVENTORY % ("", "", ", pscluster_keras: legacy"))
    plan = plan_cluster(load_inventory(path), OPTIONS)
    mismatched = facts("a", tf_keras_version="2.20.0", tf_keras_importable=True)
    keras = {host: [r for r in check_host(plan, plan.host(host), mismatched, 0.1) if r.check == "keras"]
             for host in ("a", "b")}
    assert keras["b"] == []                                       # keras3: nothing to check
    [result] = keras["a"]
    assert not result.ok and result.host == "a"
    assert result.detail == "tf-keras 2.20.0 does not match TensorFlow 2.21.0 (need 2.21.x)"
    assert "pip install tf-keras==2.21.0" in result.hint
    matched = facts("a", tf_keras_version="2.21.0", tf_keras_importable=True)
    assert [r.ok for r in check_host(plan, plan.host("a"), matched, 0.1) if r.check == "keras"] == [True]
