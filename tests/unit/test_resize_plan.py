"""The pure part of a resize (cluster/resize.py): which tasks start, stop and stay, and what is
refused before anything changes; one scale at a time."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.errors import PlanError, UsageError
from cluster.resize import (ResizeRequest, check_resize, diff_plans, membership, plan_changes_for, resize_lock)
from cluster.state import StateStore

from .test_plan import local_plan, plan_text

LAB = """
all:
  vars: {ansible_user: u, pscluster_port_base: 2222, pscluster_mode: MODE}
  children:
    chief: {hosts: {h1: {ansible_host: 127.77.0.2}}}
    ps: {hosts: {h1: {ansible_host: 127.77.0.2}}}
    worker:
      hosts:
WORKERS
"""


def lab(write_inventory, *hosts: str, mode: str = "async"):
    """h1..hN at 127.77.0.(i+1), one worker each."""
    workers = "\n".join(f"        {h}: {{ansible_host: 127.77.0.{int(h[1:]) + 1}}}" for h in hosts)
    return plan_text(write_inventory, LAB.replace("MODE", mode).replace("WORKERS", workers), name="lab")


def test_adding_a_host_starts_its_worker_and_keeps_the_rest(write_inventory):
    old, new = lab(write_inventory, "h1", "h2"), lab(write_inventory, "h1", "h2", "h3")
    diff = diff_plans(old, new)
    assert diff.start == ("worker:2",) and diff.stop == () and "worker:1" in diff.keep
    assert [t.name for t in plan_changes_for(new, diff).tasks] == ["worker:2"]
    assert [h.name for h in plan_changes_for(new, diff).hosts] == ["h3"]
    check_resize(old, new, diff, job_live=True)
    assert membership(new)["worker"] == ["worker:0@h1", "worker:1@h2", "worker:2@h3"]


def test_removing_a_middle_host_renumbers_the_workers_after_it(write_inventory):
    old, new = lab(write_inventory, "h1", "h2", "h3"), lab(write_inventory, "h1", "h3")
    diff = diff_plans(old, new)
    # worker:1 is h3's task now: the old worker:1 (h2) and worker:2 (h3) stop, the new worker:1 starts.
    assert diff.stop == ("worker:1", "worker:2") and diff.start == ("worker:1",)
    check_resize(old, new, diff, job_live=True)


def test_same_inventory_is_no_change():
    assert diff_plans(local_plan(), local_plan()).empty


def test_a_gpu_mask_change_restarts_that_task():
    old = local_plan()
    moved = replace(old, tasks=tuple(replace(t, cuda_visible_devices="1") if t.name == "worker:1" else t
                                     for t in old.tasks))
    assert diff_plans(old, moved).start == ("worker:1",)


@pytest.mark.parametrize("change, words", [
    (lambda w: lab(w, "h1", "h2", mode="sync"), "scale keeps the mode"),
])
def test_refused_before_anything_changes(write_inventory, change, words):
    old = lab(write_inventory, "h1", "h2")
    new = change(write_inventory)
    with pytest.raises(UsageError, match=words):
        check_resize(old, new, diff_plans(old, new), job_live=True)


def test_removing_the_last_worker_is_refused(write_inventory):
    """The planner refuses the edited inventory already (exit 2, before scale changes anything);
    check_resize refuses it too for a plan made otherwise."""
    text = LAB.replace("MODE", "async").replace("    worker:\n      hosts:\nWORKERS\n", "")
    with pytest.raises(PlanError, match="needs at least one worker"):
        plan_text(write_inventory, text, name="lab")
    old = lab(write_inventory, "h1")
    new = replace(old, tasks=tuple(t for t in old.tasks if t.role != "worker"))
    with pytest.raises(UsageError, match="without a worker"):
        check_resize(old, new, diff_plans(old, new), job_live=False)


def test_the_leaders_host_cannot_go_while_a_job_runs(write_inventory):
    old, new = lab(write_inventory, "h1", "h2", mode="sync"), lab(write_inventory, "h2", mode="sync")
    diff = diff_plans(old, new)
    with pytest.raises(UsageError, match="worker:0 on h1 keeps the running job's checkpoints"):
        check_resize(old, new, diff, job_live=True)
    check_resize(old, new, diff, job_live=False)        # no job: nothing to keep


def test_a_firewalled_cluster_is_refused(write_inventory):
    old = replace(lab(write_inventory, "h1"), firewall=True)
    new = lab(write_inventory, "h1", "h2")
    with pytest.raises(UsageError, match="--firewall"):
        check_resize(old, new, diff_plans(old, new), job_live=False)


def test_two_scales_at_once_the_second_is_refused(tmp_path):
    store = StateStore(tmp_path)
    with resize_lock(store, "lab"):
        with pytest.raises(UsageError, match="another 'pscluster scale'"):
            with resize_lock(store, "lab"):
                pass
    with resize_lock(store, "lab"):     # released after the first
        pass


def test_a_request_survives_its_round_trip(write_inventory):
    request = ResizeRequest(lab(write_inventory, "h1", "h2"), keep_global_batch=True, reason="hosts-from")
    assert ResizeRequest.from_json(request.to_json()) == request
