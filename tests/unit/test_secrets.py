"""Secret scope (cluster/secrets.py, issue 16 items 7 and 8).

A secret goes only to the tasks of the hosts that name it, and only to training/program
processes unless pscluster_secret_env_roles also asks for the standing servers of a role.
Reserved names cannot be secrets.
"""
from __future__ import annotations

import json
import os

import pytest

from cluster import secrets as rule
from cluster.errors import InventoryError, UsageError
from cluster.inventory import load_inventory
from cluster.lifecycle.tasks import task_env
from cluster.plan import ClusterPlan, PlanOptions, plan_cluster
from cluster.state import plan_from_json, plan_to_json

OPTIONS = PlanOptions(local_python="/py", local_workdir="/wd")

# node-a names A (and asks for its ps servers to have it); node-b names B; node-c names none.
INVENTORY = """
all:
  vars:
    pscluster_mode: async
  children:
    chief:
      hosts:
        node-a:
    ps:
      hosts:
        node-a:
          pscluster_secret_env: [A]
          pscluster_secret_env_roles: [ps]
        node-c:
    worker:
      hosts:
        node-b:
          pscluster_secret_env: [B]
        node-c:
"""
ENVIRON = {"A": "alpha", "B": "beta", "OTHER": "x"}


def make_plan(write_inventory, text: str = INVENTORY) -> ClusterPlan:
    return plan_cluster(load_inventory(write_inventory(text)), OPTIONS)


def given(secrets: rule.Secrets, plan: ClusterPlan, *, standing: bool) -> dict[str, dict[str, str]]:
    """task name -> the secret variables it gets (only tasks that get some)."""
    result = {}
    for task in plan.tasks:
        env = task_env(plan, task, secrets, standing=standing)
        got = {key: env[key] for key in ENVIRON if key in env}
        if got:
            result[task.name] = got
    return result


def test_training_processes_get_only_their_hosts_secrets(write_inventory):
    plan = make_plan(write_inventory)
    secrets = rule.collect(plan, ENVIRON)
    # chief:0 and ps:0 on node-a, worker:0 on node-b; node-c's ps:1 and worker:1 get nothing.
    assert given(secrets, plan, standing=False) == {"chief:0": {"A": "alpha"}, "ps:0": {"A": "alpha"},
                                                    "worker:0": {"B": "beta"}}


def test_standing_servers_get_secrets_only_for_roles_the_host_lists(write_inventory):
    plan = make_plan(write_inventory)
    secrets = rule.collect(plan, ENVIRON)
    # node-a lists [ps]: its ps server has A; node-b lists no role: its standing worker has nothing.
    assert given(secrets, plan, standing=True) == {"ps:0": {"A": "alpha"}}


def test_without_roles_no_standing_server_gets_a_secret(write_inventory):
    plan = make_plan(write_inventory, INVENTORY.replace("          pscluster_secret_env_roles: [ps]\n", ""))
    assert given(rule.collect(plan, ENVIRON), plan, standing=True) == {}


def test_group_vars_reach_the_groups_hosts(write_inventory):
    text = INVENTORY.replace("    worker:\n      hosts:", "    worker:\n      vars:\n"
                             "        pscluster_secret_env: [OTHER]\n      hosts:")
    plan = make_plan(write_inventory, text)
    got = given(rule.collect(plan, ENVIRON), plan, standing=False)
    # node-b's own list replaces the group's (host variables win, as in Ansible)
    assert got["worker:1"] == {"OTHER": "x"} and got["worker:0"] == {"B": "beta"}


def test_an_unset_secret_is_an_error_naming_it(write_inventory):
    plan = make_plan(write_inventory)
    with pytest.raises(UsageError, match="secret variable.s. B named in pscluster_secret_env are not set"):
        rule.collect(plan, {"A": "alpha"})


def test_no_secrets_no_env_change(write_inventory):
    plan = make_plan(write_inventory)
    task = plan.tasks[0]
    assert task_env(plan, task, None, standing=False) == plan.task_env(task)


def test_roles_survive_the_state_file(write_inventory):
    plan = make_plan(write_inventory)
    again = plan_from_json(json.loads(json.dumps(plan_to_json(plan))))
    assert again.host("node-a").secret_env_roles == ("ps",)
    assert given(rule.collect(again, ENVIRON), again, standing=True) == {"ps:0": {"A": "alpha"}}


def test_merged_sets_of_one_inventory(write_inventory):
    plan = make_plan(write_inventory)
    one = rule.collect(plan, ENVIRON)
    merged = rule.merge_all([one, one])
    assert given(merged, plan, standing=False) == given(one, plan, standing=False)


@pytest.mark.parametrize("name", ["TF_CONFIG", "CUDA_VISIBLE_DEVICES", "PSCLUSTER_TASK", "PSCLUSTER_CLUSTER"])
def test_reserved_names_cannot_be_secrets(write_inventory, name):
    path = write_inventory(f"all:\n  vars:\n    pscluster_secret_env: [OK, {name}]\n  children:\n"
                           f"    worker:\n      hosts:\n        node-a:\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value).splitlines()[0] == (
        f"lab.yaml:3: all.vars.pscluster_secret_env[1]: {name} is set by pscluster for each task "
        f"and cannot be a secret")
    assert "PSCLUSTER_*" in str(caught.value)


@pytest.mark.parametrize("value, shown", [("[chief]", "a list"), ("ps", '"ps"'), ("[ps, bogus]", "a list")])
def test_bad_secret_roles(write_inventory, value, shown):
    path = write_inventory(f"all:\n  vars:\n    pscluster_secret_env_roles: {value}\n  children:\n"
                           f"    worker:\n      hosts:\n        node-a:\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value).splitlines()[0] == (
        f"lab.yaml:3: all.vars.pscluster_secret_env_roles: expected a list of standing server roles, got {shown}")


def test_secrets_are_taken_out_of_this_process_s_environment(write_inventory, monkeypatch):
    """A local task inherits pscluster's environment: a secret left there would reach every task."""
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    found = rule.take_from_environment(make_plan(write_inventory))
    assert found.values == {"A": "alpha", "B": "beta"}
    assert "A" not in os.environ and "B" not in os.environ and os.environ["OTHER"] == "x"
