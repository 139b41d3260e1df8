"""`status`'s view (cluster/lifecycle/status.py): the rows, the job and its supervisor's health in
one document, built below the command line (which only renders it)."""
from __future__ import annotations

import json
from pathlib import Path

from cluster.inventory import load_inventory
from cluster.jobrecord import JobProgress
from cluster.lifecycle.status import rows_after_up, status_view
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import RunState

REPO = Path(__file__).resolve().parents[2]


def state(job: JobProgress | None = None) -> RunState:
    plan = plan_cluster(load_inventory(str(REPO / "inventories" / "local.yaml")),
                        PlanOptions(local_python="/py", local_workdir="/wd"))
    return RunState(name="local", plan=plan, phase="up", job=job)


def test_a_cluster_without_a_job_has_no_supervisor_to_judge():
    view = status_view(state(), rows_after_up(state(), {}))
    document = view.to_json()
    assert document["job"] is None and document["supervisor"] is None
    assert [(t["role"], t["index"], t["state"]) for t in document["tasks"]] == \
        [(task.role, task.index, "not started") for task in state().plan.tasks]
    json.dumps(document)            # what `status --json` prints


def test_a_job_shows_the_steps_a_hard_stop_would_cost():
    job = JobProgress(id=3, job="distributed_mnist", mode="async", state="running", step=1500, checkpoint_step=1000)
    document = status_view(state(job), []).to_json()
    assert document["job"]["steps_since_checkpoint"] == 500
