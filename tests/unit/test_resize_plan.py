"""The pure part of a resize (cluster/lifecycle/resize.py): which tasks start, stop and stay, and what is
refused before anything changes; one scale at a time."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

from cluster.errors import PlanError, UsageError
from cluster.plan import plan_cluster
from cluster.lifecycle.resize import (can_overlap, check_resize, diff_plans, early_servers, in_place, membership,
                            pin_inventory, plan_changes_for, replan, with_workers)
from cluster.lifecycle.resize_request import ResizeRequest, resize_lock
from cluster.supervision.elastic import parse_host_list
from cluster.supervision.core import drop_out
from cluster.state import StateStore

from .test_plan import OPTIONS, local_plan, plan_text

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
    # The new worker:1 takes h3's address and port, which the old worker:2 frees: not preflighted.
    assert plan_changes_for(new, diff).tasks and not plan_changes_for(new, diff, old).tasks


def _in_place(old, new) -> bool:
    diff = diff_plans(old, new)
    return in_place(old, new, diff, early_servers(old, new, diff))


def test_async_workers_added_at_the_end_or_the_last_removed_change_in_place(write_inventory):
    two, three = lab(write_inventory, "h1", "h2"), lab(write_inventory, "h1", "h2", "h3")
    assert _in_place(two, three) and _in_place(three, two)
    assert _in_place(lab(write_inventory, "h1"), three)            # two at once
    # A middle host: the workers after it are renumbered, so they restart (and the chief with them).
    assert not _in_place(three, lab(write_inventory, "h1", "h3"))
    assert not _in_place(two, lab(write_inventory, "h1", "h3"))     # worker:1 moves to h3
    assert not _in_place(two, two)
    # Sync modes always restart at the new world size.
    assert not _in_place(lab(write_inventory, "h1", "h2", mode="sync"), lab(write_inventory, "h1", "h2", "h3", mode="sync"))


def test_a_new_worker_whose_server_cannot_start_early_is_not_in_place(write_inventory):
    two, three = lab(write_inventory, "h1", "h2"), lab(write_inventory, "h1", "h2", "h3")
    diff = diff_plans(two, three)
    assert not in_place(two, three, diff, early=[])


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


# ----------------------------------------------------------------------------- issue 42, M3: the inventory a re-plan reads

def test_a_re_plan_reads_the_inventory_up_recorded_from_any_directory(write_inventory, tmp_path, monkeypatch):
    pinned = pin_inventory(lab(write_inventory, "h1", "h2", "h3"))
    assert pinned.inventory_path == str((tmp_path / "lab.yaml").resolve()) and len(pinned.inventory_sha256 or "") == 64
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lab.yaml").write_text("all: {children: {worker: {hosts: {other: }}}}\n")   # a lab.yaml of its own
    monkeypatch.chdir(elsewhere)
    new = replan(pinned, port_base=None, limit=None, counts={"h3": 0}, pool=None)
    assert [t.host for t in new.tasks_of("worker")] == ["h1", "h2"]
    assert new.inventory_sha256 == pinned.inventory_sha256
    assert ResizeRequest.from_json(ResizeRequest(new).to_json()).plan == new      # the pin travels with the plan


@pytest.mark.parametrize("tamper, words", [
    (lambda path: path.write_text(path.read_text() + "\n# edited\n"), "changed since 'up'/'scale'"),
    (lambda path: path.unlink(), "is gone or unreadable"),
    (lambda path: os.chown(path, 4321, -1), "now belongs to uid 4321"),
    (lambda path: (path.parent / "group_vars").mkdir() or (path.parent / "group_vars" / "all.yml").write_text(
        "pscluster_port_base: 3000\n"), "changed since"),
])
def test_a_re_plan_refuses_an_inventory_gone_changed_or_of_another_owner(write_inventory, tmp_path, tamper, words):
    pinned = pin_inventory(lab(write_inventory, "h1", "h2", "h3"))
    tamper(tmp_path / "lab.yaml")
    with pytest.raises(UsageError) as caught:
        replan(pinned, port_base=None, limit=None, counts={"h3": 0}, pool=None)
    assert words in caught.value.message and pinned.inventory_path in caught.value.message
    assert "pscluster scale" in caught.value.hint


def test_a_re_plan_trusts_an_inventory_of_root_read_by_another_user(write_inventory, tmp_path, monkeypatch):
    """The compose lab's control container: pscluster runs as uid 1000 on an inventory the image
    holds as root's. Root's files are trusted, as ssh's StrictModes trusts them."""
    pinned = pin_inventory(lab(write_inventory, "h1", "h2", "h3"))
    os.chown(tmp_path / "lab.yaml", 0, -1)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    new = replan(pinned, port_base=None, limit=None, counts={"h3": 0}, pool=None)
    assert [t.host for t in new.tasks_of("worker")] == ["h1", "h2"]


# ----------------------------------------------------------------------------- elastic: the pure decisions

@pytest.mark.parametrize("workers, host, others, task, min_workers, drop, left", [
    ({"h1": 1, "h2": 1, "h3": 1}, "h3", (), None, 2, True, 2),          # a lost worker host, 2 remain
    ({"h1": 1, "h2": 1, "h3": 1}, "h3", (), None, 3, False, 2),         # fewer than --min-workers
    ({"h1": 1, "h2": 1, "h3": 1}, "h3", (), None, None, False, 2),      # not elastic: fail as before
    ({"h1": 1, "h2": 1, "h3": 2}, "h3", (), None, 2, True, 2),          # a host takes all its workers
    ({"h1": 1, "h2": 1}, "h1", ("chief", "ps"), None, 1, False, 1),     # the chief's host cannot go
    ({"localhost": 3}, "localhost", ("chief", "ps"), "worker:2", 2, True, 2),  # one worker used up its restarts
    ({"localhost": 2}, "localhost", ("chief", "ps"), "worker:1", 2, False, 1),
    ({"h1": 1, "h2": 1, "h3": 1}, "h1", ("chief", "ps"), "chief:0", 1, False, 3),  # a chief used up its restarts
    ({"h1": 1, "h2": 1, "h3": 1}, "h1", ("chief", "ps"), "ps:0", 1, False, 3),
])
def test_drop_out_rows(workers, host, others, task, min_workers, drop, left):
    verdict = drop_out(workers, host=host, other_roles=others, task=task, min_workers=min_workers)
    assert (verdict.drop, verdict.workers_left) == (drop, left), verdict.why


def test_with_workers_leaves_a_host_out_and_takes_it_back(write_inventory):
    from cluster.inventory import load_inventory
    full = lab(write_inventory, "h1", "h2", "h3")
    inventory = load_inventory("lab.yaml")
    shrunk = plan_cluster(with_workers(inventory, {"h3": 0}), OPTIONS)
    assert [t.host for t in shrunk.tasks_of("worker")] == ["h1", "h2"]
    assert diff_plans(full, shrunk).stop == ("worker:2",)
    grown = plan_cluster(with_workers(inventory, {}), OPTIONS)
    assert diff_plans(shrunk, grown).start == ("worker:2",) and not diff_plans(shrunk, grown).stop
    with pytest.raises(UsageError, match="not a worker host"):
        with_workers(inventory, {"elsewhere": 1})


def test_with_workers_cuts_a_gpu_list_and_refuses_more_than_it_holds(write_inventory):
    from cluster.inventory import load_inventory
    write_inventory("""
        all:
          vars: {pscluster_port_base: 2222}
          children:
            chief: {hosts: {g: {ansible_host: 127.77.0.2}}}
            ps: {hosts: {g: {ansible_host: 127.77.0.2}}}
            worker: {hosts: {g: {ansible_host: 127.77.0.2, worker_gpus: [[0], [1]]}}}
    """)
    inventory = load_inventory("lab.yaml")
    one = plan_cluster(with_workers(inventory, {"g": 1}), OPTIONS)
    assert [t.cuda_visible_devices for t in one.tasks_of("worker")] == ["0"]
    with pytest.raises(UsageError, match="at most 2 worker"):
        with_workers(inventory, {"g": 3})


@pytest.mark.parametrize("text, hosts", [
    ("h1\nh2:2\n", {"h1": None, "h2": 2}),
    ("# discovered\n\nh1  # first\n", {"h1": None}),
    ("", {}),
    ("h1:64\nh2:0\n", {"h1": 64, "h2": 0}),
])
def test_a_discovery_commands_host_list(text, hosts):
    assert parse_host_list(text, source="--hosts-from") == hosts


@pytest.mark.parametrize("text", ["h1:two", "h 1", "h1:99999", ":3", "h1\x1b[2J"])
def test_a_bad_host_list_line_is_named(text):
    with pytest.raises(UsageError, match="line 1"):
        parse_host_list(text, source="--hosts-from")


@pytest.mark.parametrize("count", ["65", "1024"])
def test_a_host_list_count_has_the_inventorys_cap(count):
    """Issue 42, L7: host:1024 passed, past worker_tasks' 1-64."""
    with pytest.raises(UsageError, match=f"line 2: h2:{count}: at most 64 workers per host"):
        parse_host_list(f"h1\nh2:{count}\n", source="--hosts-from")


def test_new_servers_that_can_start_before_the_job_stops(write_inventory):
    from cluster.lifecycle.resize import early_servers
    old, grown = lab(write_inventory, "h1", "h2"), lab(write_inventory, "h1", "h2", "h3")
    assert [t.name for t in early_servers(old, grown, diff_plans(old, grown))] == ["worker:2"]
    assert early_servers(old, grown, diff_plans(old, grown), unreachable={"h3"}) == []
    # Removing h2 renumbers h3's worker onto the address and port the old worker:2 holds: it waits.
    full, shrunk = lab(write_inventory, "h1", "h2", "h3"), lab(write_inventory, "h1", "h3")
    assert early_servers(full, shrunk, diff_plans(full, shrunk)) == []


@pytest.mark.parametrize("mode_from, up_mode, edited_mode, refused", [
    ("inventory", "async", "sync", "lab.yaml:2: all.vars.pscluster_mode: the edited inventory runs sync, "
                                   "but cluster 'lab' runs async: 'scale' keeps the mode"),
    ("inventory", "sync", None, "lab.yaml: the edited inventory runs async, but cluster 'lab' runs sync: "
                                "'scale' keeps the mode (it sets no pscluster_mode: the default is async)"),
    ("inventory", "sync-ps", "between-graph", None),    # an alias of sync-ps: the same mode
    ("option", "sync", "async", None),                  # `up --mode sync`: scale keeps it, as before
    (None, "async", "sync", None),                      # a state written before mode_from: as before
])
def test_scale_refuses_an_edited_inventory_that_asks_for_another_mode(write_inventory, tmp_path, capsys,
                                                                      mode_from, up_mode, edited_mode, refused):
    import io

    from rich.console import Console

    from cluster.cli import Env
    from cluster.cli.cluster_cmds import _check_scale_mode
    from cluster.inventory import load_inventory
    from cluster.state import RunState
    store = StateStore(tmp_path / "state")
    state = RunState(name="lab", plan=lab(write_inventory, "h1", mode=up_mode), phase="up", mode_from=mode_from)
    store.save(state)
    assert store.load("lab").mode_from == mode_from             # kept in the state file
    text = LAB.replace("WORKERS", "        h1: {ansible_host: 127.77.0.2}\n        h2: {ansible_host: 127.77.0.3}")
    text = text.replace("MODE", edited_mode) if edited_mode else text.replace(", pscluster_mode: MODE", "")
    path = write_inventory(text)
    if refused is None:
        _check_scale_mode(load_inventory(path), path, state)     # no error: scale goes on
        return
    from cluster.cli import run
    err = io.StringIO()
    env = Env(out=Console(file=io.StringIO()), err=Console(file=err, width=500), store=store)
    assert run(["scale", path, "--name", "lab"], env=env) == 2
    shown = " ".join((capsys.readouterr().err + err.getvalue()).split())
    assert refused in shown and "pscluster down --name lab, pscluster up lab.yaml" in shown, shown
    assert store.load("lab").plan == state.plan                 # nothing changed


def _standbys(plan, **moved):
    """Every training task's standby on its own host, but for ``moved`` (task name -> host or None)."""
    hosts = {task.name: task.host for task in plan.training_tasks}
    hosts.update({name.replace("_", ":"): host for name, host in moved.items()})
    return hosts


@pytest.mark.parametrize("before, after, elsewhere", [
    (("h1", "h2"), ("h1", "h2", "h3"), {"worker_2": "h1"}),
    # the renumbered worker:1 moved to h3: its standby from before is on h2
    (("h1", "h2", "h3"), ("h1", "h3"), {"worker_1": "h2"})])
def test_a_sync_resize_overlaps_when_every_new_worker_has_its_standby_on_its_host(write_inventory, before, after,
                                                                                   elsewhere):
    old, new = lab(write_inventory, *before, mode="sync"), lab(write_inventory, *after, mode="sync")
    diff = diff_plans(old, new)
    assert can_overlap(old, new, diff, _standbys(new))
    assert not can_overlap(old, new, diff, _standbys(new, worker_0=None))      # a standby missing
    assert not can_overlap(old, new, diff, _standbys(new, **elsewhere))        # on another host


def test_no_overlap_for_async_or_a_change_of_standing_servers(write_inventory):
    old, new = lab(write_inventory, "h1", "h2"), lab(write_inventory, "h1", "h2", "h3")
    assert not can_overlap(old, new, diff_plans(old, new), _standbys(new))              # async
    old, new = lab(write_inventory, "h1", "h2", mode="sync-ps"), lab(write_inventory, "h1", "h2", "h3", mode="sync-ps")
    assert new.standing_tasks and not can_overlap(old, new, diff_plans(old, new), _standbys(new))
    same = lab(write_inventory, "h1", "h2", mode="sync")
    assert not can_overlap(same, same, diff_plans(same, same), _standbys(same))          # nothing changes
    # a ps more: a standing server starts, which the usual path does between stop and relaunch
    more_ps = plan_text(write_inventory, LAB.replace("MODE", "sync-ps").replace(
        "ps: {hosts: {h1: {ansible_host: 127.77.0.2}}}",
        "ps: {hosts: {h1: {ansible_host: 127.77.0.2}, h2: {ansible_host: 127.77.0.3}}}").replace(
        "WORKERS", "        h1: {ansible_host: 127.77.0.2}\n        h2: {ansible_host: 127.77.0.3}"), name="lab")
    assert not can_overlap(old, more_ps, diff_plans(old, more_ps), _standbys(more_ps))


def test_gpus_rule_out_an_overlap_without_memory_growth(write_inventory):
    from cluster.lifecycle.resize import gpus_allow_overlap
    task = lab(write_inventory, "h1", "h2", mode="sync").task("worker:1")
    growing = replace(task, env=task.env + (("TF_FORCE_GPU_ALLOW_GROWTH", "true"),))
    assert gpus_allow_overlap(task, 0) and gpus_allow_overlap(growing, 0)
    # TensorFlow takes nearly all of a GPU at its first op: a second process there would start with none
    assert not gpus_allow_overlap(task, 1)
    assert gpus_allow_overlap(growing, 2)
    assert not gpus_allow_overlap(replace(task, env=(("TF_FORCE_GPU_ALLOW_GROWTH", "false"),)), 1)
    assert not gpus_allow_overlap(task, None) and not gpus_allow_overlap(growing, None)     # unknown


# ----------------------------------------------------------------------------- issue 42, L5: secrets after a resize

def test_a_resize_gives_new_tasks_the_edited_inventorys_secret_scope(write_inventory):
    from cluster.secrets import collect
    from cluster.lifecycle.tasks import task_env
    lab_text = LAB.replace("MODE", "async")
    old = plan_text(write_inventory, lab_text.replace("WORKERS", "        h1: {pscluster_secret_env: [WANDB_API_KEY]}"),
                    name="lab")
    new = plan_text(write_inventory, lab_text.replace("WORKERS", "        h1: \n        h2: {ansible_host: 127.77.0.3, "
                                                      "pscluster_secret_env: [WANDB_API_KEY]}"), name="lab")
    held = collect(old, {"WANDB_API_KEY": "k"})                     # what `train` took at its start
    assert held.names == {"h1": ("WANDB_API_KEY",)}
    request = ResizeRequest.from_json(ResizeRequest(new, secret_names={"h2": ("WANDB_API_KEY",)},
                                                    secret_roles={}).to_json())
    scoped = request.secrets_for(held)
    assert scoped is not None and scoped.names == {"h2": ("WANDB_API_KEY",)}
    worker_h2 = next(t for t in new.tasks_of("worker") if t.host == "h2")
    worker_h1 = next(t for t in new.tasks_of("worker") if t.host == "h1")
    assert task_env(new, worker_h2, scoped, standing=False)["WANDB_API_KEY"] == "k"
    assert "WANDB_API_KEY" not in task_env(new, worker_h1, scoped, standing=False)    # h1 no longer names it
    with pytest.raises(UsageError, match="OTHER_KEY"):
        ResizeRequest(new, secret_names={"h2": ("OTHER_KEY",)}).secrets_for(held)
    assert ResizeRequest(new).secrets_for(held) == scoped                             # default: the plan's own scope


def test_a_renumbered_worker_takes_the_standby_waiting_on_its_host(write_inventory):
    """Draining h2 of h1-h3 (sync) renumbers worker:2@h3 to worker:1@h3: worker:1's own standby
    waits on h2, worker:2's on h3. The new worker:1 takes h3's (benchmarks.drain: without it the
    new workers started only after the old ones stopped, a 6.7 s pause against 1.1 s)."""
    from cluster.contracts import ProcessKind
    from cluster.lifecycle.resize import match_standbys
    from cluster.state import ProcessRecord
    new = lab(write_inventory, "h1", "h3", mode="sync")

    def standby(task: str, host: str, stopped: bool = False) -> ProcessRecord:
        record = ProcessRecord.for_task(task, host, ProcessKind.STANDBY, 1, f"/tmp/{task}.log")
        return replace(record, stopped=stopped)
    records = [standby("worker:0", "h1"), standby("worker:1", "h2"), standby("worker:2", "h3")]
    found = match_standbys(new.training_tasks, records)
    assert {name: (r.task, r.host) if r else None for name, r in found.items()} == \
        {"worker:0": ("worker:0", "h1"), "worker:1": ("worker:2", "h3")}
    # a stopped standby, or none on the host: nothing to take (the task starts afresh)
    found = match_standbys(new.training_tasks, [records[0], records[1], standby("worker:2", "h3", stopped=True)])
    assert found["worker:1"] is None and found["worker:0"] is records[0]
    # a task's own standby on its own host is never given to another
    same = lab(write_inventory, "h1", "h2", mode="sync")
    found = match_standbys(same.training_tasks, records)
    assert found == {"worker:0": records[0], "worker:1": records[1]}
