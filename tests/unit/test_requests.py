"""The run and train requests (cluster/program/request.py, supervision/training.TrainRequest): a
value built from flags travels as JSON to a --detach supervisor and comes back equal; a missing or
unknown field is refused by name; and run --dry-run shows each task's launch_spec, what the run starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.errors import UsageError
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.program.request import RunRequest
from cluster.program.runspec import Workspace, dry_run, launch_spec
from cluster.supervision.train_spec import JobOptions, TrainRequest

RUN = RunRequest(program=("python", "train.py", "--task_index={task_index}"), cwd="/src/project", keep=20,
                 inventory="lab.yaml", name="lab", mode="sync", on=("worker",), sync_paths=("data",), keras="legacy",
                 notify_urls=("https://example.org/hook",), until="workers", min_workers=1, as_json=True)
TRAIN = TrainRequest(job="distributed_mnist", name="lab",
                     options=JobOptions(steps=40, snapshot_every=0.0, stall_timeout=None, extra_args=("--x",)),
                     min_workers=2, hosts_from="./hosts.sh", notify_cmds=("notify-send",), keep=5)


@pytest.mark.parametrize("request_value", [RUN, TRAIN], ids=["run", "train"])
def test_a_request_comes_back_equal_from_its_json(request_value):
    sent = json.loads(json.dumps(request_value.to_json()))     # as the supervisor's stdin carries it
    back = type(request_value).from_json(sent)
    assert back == request_value
    assert isinstance(back.to_json(), dict) and back.to_json() == sent


def test_the_train_request_s_options_come_back_as_job_options():
    back = TrainRequest.from_json(json.loads(json.dumps(TRAIN.to_json())))
    assert isinstance(back.options, JobOptions)
    assert back.options.extra_args == ("--x",) and back.notify_cmds == ("notify-send",)


def test_a_missing_field_is_refused_by_name():
    sent = RUN.to_json()
    del sent["cwd"], sent["keep"]
    with pytest.raises(UsageError, match=r"RunRequest: missing field\(s\) cwd, keep"):
        RunRequest.from_json(sent)


def test_an_unknown_field_is_refused_by_name_also_in_a_nested_value():
    with pytest.raises(UsageError, match=r"RunRequest: unknown field\(s\) detach"):
        RunRequest.from_json({**RUN.to_json(), "detach": True})
    sent = TRAIN.to_json()
    sent["options"]["epoch"] = 3
    with pytest.raises(UsageError, match=r"TrainRequest.options: unknown field\(s\) epoch"):
        TrainRequest.from_json(sent)


def test_a_request_that_is_not_an_object_is_refused():
    with pytest.raises(UsageError, match="a JSON object expected, not list"):
        RunRequest.from_json([1, 2])


def test_the_flags_checks_name_the_option():
    with pytest.raises(UsageError, match="no program to run"):
        RunRequest(program=(), cwd="/", keep=20).check()
    with pytest.raises(UsageError, match="apply to a one-shot run"):
        RunRequest(program=("true",), cwd="/", keep=20, mode="sync").check()
    with pytest.raises(UsageError, match="--detach and --replace"):
        RunRequest(program=("true",), cwd="/", keep=20, inventory="lab.yaml").check(detach=True)


INVENTORY = """
all:
  vars:
    ansible_connection: local
  children:
    chief: {hosts: {node-a: {}}}
    ps: {hosts: {node-a: {}}}
    worker:
      hosts:
        node-a: {}
        node-b: {pscluster_secret_env: [API_TOKEN], pscluster_workdir: /srv/work}
"""


def test_the_dry_run_is_the_launch_spec_of_each_task(tmp_path):
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    inventory = load_inventory(str(tmp_path / "lab.yaml"))
    plan = plan_cluster(inventory, PlanOptions(local_python="/usr/bin/python3", local_workdir=str(tmp_path),
                                               name="lab", mode="async"))
    space = Workspace(cwd=Path(tmp_path), root=Path(tmp_path))
    rows = dry_run(plan, plan.tasks, RUN, space)
    assert rows == [launch_spec(plan, task, RUN, space).to_row() for task in plan.tasks]
    # What the launch gets differs only in the secret's value, which the dry run masks.
    worker1 = plan.tasks_of("worker")[1]
    launched = launch_spec(plan, worker1, RUN, space, {"API_TOKEN": "s3cret"})
    shown = next(row for row in rows if row["task"] == worker1.name)
    assert shown["env"]["API_TOKEN"] == "****" and launched.env["API_TOKEN"] == "s3cret"
    assert {**shown, "env": {**shown["env"], "API_TOKEN": "s3cret"}} == launched.to_row()
    assert launched.argv == (plan.host(worker1.host).python, "train.py", f"--task_index={worker1.index}")
