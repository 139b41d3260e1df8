"""A one-shot `run`'s cluster and its options, checked below the command line
(cluster/supervision/program_job.py: one_shot_plan, check_program_tasks)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cluster.errors import UsageError
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import RunState, StateStore
from cluster.supervision.program_job import check_program_tasks, one_shot_plan

REPO = Path(__file__).resolve().parents[2]


def planned(mode: str = "async", roles=("chief", "ps", "worker")):
    return plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                        PlanOptions(local_python="/py", local_workdir="/wd", mode=mode, roles=roles, name="shot"))


def test_firewall_and_keras_are_applied_and_the_plan_is_otherwise_unchanged(tmp_path):
    plan = planned()
    shot = one_shot_plan(plan, store=StateStore(tmp_path), on=None, firewall=True, keras="legacy", until=None,
                         min_workers=None)
    assert shot.firewall and all(host.keras == "legacy" for host in shot.hosts)
    assert shot.tasks == plan.tasks


@pytest.mark.parametrize("on, until, min_workers, error", [
    (("ps",), None, 1, "--min-workers 1 is larger than the 0 worker"),
    (None, None, 3, "--min-workers 3 is larger than the 2 worker"),
])
def test_bad_options_are_usage_errors_before_anything_starts(tmp_path, on, until, min_workers, error):
    with pytest.raises(UsageError, match=error):
        one_shot_plan(planned(), store=StateStore(tmp_path), on=on, firewall=False, keras=None, until=until,
                      min_workers=min_workers)


def test_until_must_name_tasks_that_run_the_program():
    plan = planned(mode="sync", roles=("worker",))
    with pytest.raises(UsageError, match="chief"):
        check_program_tasks(plan.tasks, until="chief", min_workers=None)
    check_program_tasks(plan.tasks, until="workers", min_workers=2)


def test_a_name_in_use_is_refused(tmp_path):
    plan = planned()
    store = StateStore(tmp_path)
    store.save(RunState(name=plan.name, plan=plan, phase="up"))
    with pytest.raises(UsageError, match="exists already"):
        one_shot_plan(plan, store=store, on=None, firewall=False, keras=None, until=None, min_workers=None)
