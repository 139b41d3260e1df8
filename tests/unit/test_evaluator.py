"""The side-car evaluator's pure parts: its place in the plan, its TF_CONFIG, its command line
(roles.train's, parsed back), the trainers' options beside it, which checkpoints it takes, the
manifest export that leaves it out, and how ``train`` prints an evaluation."""
from __future__ import annotations

import json
import os
import sys

import pytest

from cluster.console.liveview import eval_line
from cluster.errors import InventoryError, UsageError
from cluster.export import tfjob_manifest
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.supervision.train_job import check_checkpoints_shared
from cluster.supervision.train_spec import JobOptions, path_on, train_argv, with_evaluator
from cluster.transport import TransportPool
from roles.evaluate import CheckpointWatch, checkpoint_step
from roles.tfconfig import ConfigError, parse_tf_config
from roles.train import parse_options
from tests.helpers import REPO

OPTIONS = PlanOptions(local_python="/venv/bin/python", local_workdir="/checkout")
INVENTORY = """\
all:
  vars: {ansible_connection: local}
  children:
    chief: {hosts: {a: }}
    ps: {hosts: {a: }}
    worker: {hosts: {a: {worker_tasks: 2}}}
    evaluator: {hosts: {a: }}
"""


def plan(write_inventory, mode: str, text: str = INVENTORY, **options):
    return plan_cluster(load_inventory(write_inventory(text)), PlanOptions(**{**OPTIONS.__dict__, "mode": mode,
                                                                            **options}))


@pytest.mark.parametrize("mode, trainers", [("async", ["chief:0"]), ("sync", ["worker:0", "worker:1"]),
                                            ("sync-ps", ["worker:0", "worker:1"])])
def test_every_mode_plans_the_evaluator_as_a_job_process_outside_the_cluster(write_inventory, mode, trainers):
    planned = plan(write_inventory, mode)
    evaluator = planned.task("evaluator:0")
    assert [t.name for t in planned.evaluator_tasks] == ["evaluator:0"]
    assert [t.name for t in planned.training_tasks] == trainers            # the evaluator is not a trainer
    assert not evaluator.standing and "evaluator" not in planned.cluster_spec
    assert evaluator.argv == ("/venv/bin/python", "-m", "roles.evaluate", "--mode", mode)
    assert planned.tf_config(evaluator) == {"cluster": planned.cluster_spec, "task": {"type": "evaluator", "index": 0}}
    assert "evaluator" not in dict(planned.unused)
    assert evaluator.port not in {t.port for t in planned.tasks if t is not evaluator}


def test_train_runs_at_most_one_evaluator(write_inventory):
    with pytest.raises(InventoryError) as caught:
        plan(write_inventory, "async", INVENTORY.replace("evaluator: {hosts: {a: }}",
                                                         "evaluator: {hosts: {a: {evaluator_tasks: 2}}}"))
    assert "evaluator group holds 2 tasks" in caught.value.message and "evaluator_tasks: 1" in caught.value.hint
    # `run` plans it as any role: several evaluator programs are fine there.
    run = plan(write_inventory, "async", INVENTORY.replace("evaluator: {hosts: {a: }}",
                                                           "evaluator: {hosts: {a: {evaluator_tasks: 2}}}"),
               roles=("evaluator",))
    assert [t.name for t in run.tasks] == ["evaluator:0", "evaluator:1"]


def test_a_plan_without_evaluator_is_unchanged(write_inventory):
    planned = plan(write_inventory, "sync", INVENTORY.replace("    evaluator: {hosts: {a: }}\n", ""))
    assert planned.evaluator_tasks == () and [t.name for t in planned.tasks] == ["worker:0", "worker:1"]


def test_the_evaluator_reads_its_tf_config_outside_the_cluster():
    raw = json.dumps({"cluster": {"worker": ["a:1", "a:2"]}, "task": {"type": "evaluator", "index": 0}})
    task = parse_tf_config(raw)
    assert task.is_evaluator and task.name == "evaluator:0" and task.num_workers == 2
    with pytest.raises(ConfigError, match="must be an integer >= 0"):
        parse_tf_config(raw.replace('"index": 0', '"index": -1'))
    with pytest.raises(ConfigError, match="is not a job of the cluster"):     # any other role must be in it
        parse_tf_config(raw.replace("evaluator", "chief"))


@pytest.mark.parametrize("given, expected", [
    # (eval_every, checkpoint_every) -> what the trainers are told
    ((80, None), (None, 80)),            # --eval-every becomes the checkpoint cadence the evaluator follows
    ((80, 40), (None, 40)),              # --checkpoint-every wins
    ((None, 40), (None, 40)),
    ((None, None), (None, None)),        # only the final checkpoint
])
def test_beside_an_evaluator_the_trainers_never_evaluate_periodically(given, expected):
    options = with_evaluator(JobOptions(eval_every=given[0], checkpoint_every=given[1], steps=100))
    assert (options.eval_every, options.checkpoint_every, options.steps) == (*expected, 100)


def test_the_evaluator_takes_the_trainers_command_line(write_inventory):
    planned = plan(write_inventory, "sync")
    options = with_evaluator(JobOptions(steps=321, batch_size=96, eval_every=64, data="/data/mnist.npz"))
    argv = train_argv(planned.task("evaluator:0"), mode="sync", job_path="examples/distributed_mnist", events_path="/run/e.jsonl",
                      checkpoint_dir="/ckpt", options=options, resume=True)
    assert argv[:5] == ["/venv/bin/python", "-m", "roles.evaluate", "--mode", "sync"]
    assert "--collective-timeout" not in argv          # it joins no collective
    parsed = parse_options(argv[3:])
    assert (parsed.mode, parsed.checkpoint_dir, parsed.steps, parsed.batch_size, parsed.data, parsed.resume,
            parsed.eval_every, parsed.checkpoint_every) == ("sync", "/ckpt", 321, 96, "/data/mnist.npz", True, None, 64)


def test_the_manifest_export_leaves_the_evaluator_out(write_inventory):
    manifest = tfjob_manifest(plan(write_inventory, "async"), image="img")
    assert list(manifest["spec"]["tfReplicaSpecs"]) == ["Chief", "PS", "Worker"]
    assert "evaluator: not exported" in manifest["metadata"]["annotations"]["pscluster/unused-roles"]


# ----------------------------------------------------------------------------- which checkpoints

@pytest.mark.parametrize("path, step", [("/c/ckpt-320", 320), ("ckpt-0", 0), ("/c/model.ckpt", None),
                                        ("/c-5/ckpt", None)])
def test_checkpoint_step(path, step):
    assert checkpoint_step(path) == step


def _write(tmp_path, name: str, mtime_ns: int) -> str:
    prefix = str(tmp_path / name)
    with open(prefix + ".index", "w"):
        pass
    os.utime(prefix + ".index", ns=(mtime_ns, mtime_ns))
    return prefix


def test_each_new_checkpoint_once_and_not_an_earlier_runs(tmp_path):
    latest: list[str | None] = [_write(tmp_path, "ckpt-256", 1_000)]    # left by an earlier run
    watch = CheckpointWatch(str(tmp_path), lambda _: latest[0], include_existing=False)
    assert watch.poll() is None
    latest[0] = _write(tmp_path, "ckpt-64", 2_000)
    assert watch.poll() == latest[0] and watch.poll() is None
    latest[0] = _write(tmp_path, "ckpt-256", 3_000)                     # same name as the old one, rewritten
    assert watch.poll() == latest[0] and watch.poll() is None


def test_with_resume_the_newest_checkpoint_is_evaluated(tmp_path):
    latest: list[str | None] = [None]
    watch = CheckpointWatch(str(tmp_path), lambda _: latest[0], include_existing=True)
    assert watch.poll() is None                                         # nothing yet
    latest[0] = _write(tmp_path, "ckpt-128", 1_000)
    assert CheckpointWatch(str(tmp_path), lambda _: latest[0], include_existing=True).poll() == latest[0]


def test_train_prints_an_evaluation_as_one_line():
    line = eval_line({"task": "evaluator:0", "step": 320, "val_loss": 0.12345, "val_accuracy": 0.96})
    assert line == "eval at step 320:  val_loss 0.1235  val_accuracy 0.9600  (evaluator:0)"
    leader = eval_line({"task": "worker:0", "step": 1, "val_loss": None, "val_accuracy": None})
    assert leader == "eval at step 1:"       # the leader's own evaluation is not labelled


# ----------------------------------------------------------------------------- where the checkpoints are

def two_host_plan(tmp_path):
    """Leader on host a, evaluator on host b: two local "hosts" with their own workdirs (real hostctl)."""
    inventory = tmp_path / "two.yaml"
    inventory.write_text(f"""\
all:
  vars: {{ansible_connection: local, pscluster_python: {sys.executable}}}
  children:
    worker: {{hosts: {{a: {{pscluster_workdir: {tmp_path / 'a'}}}}}}}
    evaluator: {{hosts: {{b: {{pscluster_workdir: {tmp_path / 'b'}}}}}}}
""")
    return plan_cluster(load_inventory(str(inventory)), PlanOptions(**{**OPTIONS.__dict__, "mode": "sync"}))


def test_an_evaluator_on_another_host_must_see_the_leaders_checkpoint_folder(tmp_path):
    planned = two_host_plan(tmp_path)
    leader, evaluators = planned.task("worker:0"), planned.evaluator_tasks
    with TransportPool() as pool:
        check_checkpoints_shared(planned, pool, str(tmp_path / "shared"), leader, evaluators)     # one folder: fine
        with pytest.raises(UsageError) as caught:     # relative: a/ckpt on a, b/ckpt on b
            check_checkpoints_shared(planned, pool, "ckpt", leader, evaluators)
    assert "evaluator:0 on b cannot read the checkpoints worker:0 writes on a" in caught.value.message
    assert "ckpt is not one shared folder" in caught.value.message and caught.value.message.endswith("/b/ckpt)")
    assert "both hosts share" in caught.value.hint


def test_path_on_a_host():
    host = plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")), OPTIONS).host("localhost")
    assert [path_on(host, p) for p in ("/abs/ckpt", "~/ckpt", "rel/ckpt")] == \
        ["/abs/ckpt", "~/ckpt", "/checkout/rel/ckpt"]


@pytest.mark.parametrize("reporter", ["TrainDisplay", "EventLineReporter"])
def test_train_shows_each_evaluation_as_a_row(reporter):
    import io

    from rich.console import Console

    from cluster import console as ui
    from cluster.events import validated

    buffer = io.StringIO()
    display = getattr(ui, reporter)(Console(file=buffer, width=200, color_system=None))
    data = validated("eval", {"task": "evaluator:0", "step": 64, "val_loss": 0.5, "val_accuracy": 0.875})
    display.handle("eval", **data)
    if hasattr(display, "close"):
        display.close()
    assert "eval at step 64:  val_loss 0.5000  val_accuracy 0.8750  (evaluator:0)" in buffer.getvalue()
