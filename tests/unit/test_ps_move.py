"""A ps moved off a host lost for good (issue 41 item 3): where it goes (cluster/supervision/core.py
``place_lost_ps``, table-driven) and the plan it makes (cluster/plan.py ``move_task`` through
cluster/lifecycle/resize.py ``replan``): the ps on its new host and a free port, the lost host's
workers out, every other task where it was, and the move kept by later re-plans."""
from __future__ import annotations

import pytest

from cluster.contracts import Mode, RestartPolicy
from cluster.errors import UsageError
from cluster.lifecycle.resize import diff_plans, pin_inventory, ps_spares, replan, restarting
from cluster.supervision.core import place_lost_ps

from .test_plan import plan_text

# The fault lab of benchmarks/faults.py: chief, ps:0, worker:0 on n1; ps:1, worker:1 on n2; worker:2 on n3.
LAB = [("chief:0", "n1"), ("ps:0", "n1"), ("ps:1", "n2"), ("worker:0", "n1"), ("worker:1", "n2"), ("worker:2", "n3")]
ON_FAILURE, NEVER = RestartPolicy.ON_FAILURE, RestartPolicy.NEVER


@pytest.mark.parametrize("tasks, lost, spares, unreachable, to, words", [
    # no spare group: the surviving ps host with the fewest tasks
    (LAB, "n2", (), (), "n1", "surviving ps host with the fewest tasks (3)"),
    # a spare group: its first host that is not lost
    (LAB, "n2", ("s1", "s2"), (), "s1", "first host of the inventory's ps_spare group"),
    (LAB, "n2", ("s1", "s2"), ("s1",), "s2", "ps_spare"),
    (LAB, "n2", ("n2", "s2"), (), "s2", "ps_spare"),                       # the lost host itself is no spare
    # of two surviving ps hosts, the one with fewer tasks; equals: the first in plan order
    ([("chief:0", "n1"), ("ps:0", "n1"), ("ps:1", "n2"), ("ps:2", "n3"), ("worker:0", "n3")], "n2", (), (), "n1",
     "fewest tasks (2)"),
    ([("chief:0", "n1"), ("ps:0", "n1"), ("ps:1", "n2"), ("ps:2", "n3"), ("worker:0", "n1")], "n2", (), (), "n3",
     "fewest tasks (1)"),
    # the only ps host lost: the chief's host takes it
    ([("chief:0", "n1"), ("ps:0", "n2"), ("worker:0", "n2"), ("worker:1", "n3")], "n2", (), (), "n1", "runs the chief"),
    # the surviving ps host does not answer either: the chief's host
    ([("chief:0", "n1"), ("ps:0", "n3"), ("ps:1", "n2"), ("worker:0", "n1")], "n2", (), ("n3",), "n1", "runs the chief"),
    # refused
    (LAB, "n1", (), (), None, "also runs chief"),
    (LAB, "n3", (), (), None, "n3 runs no ps"),
    ([("chief:0", "n1"), ("ps:0", "n2"), ("evaluator:0", "n2"), ("worker:0", "n1")], "n2", (), (), None,
     "also runs evaluator"),
    ([("chief:0", "n1"), ("ps:0", "n2"), ("worker:0", "n2")], "n2", (), ("n1",), None, "no host of the cluster answers"),
])
def test_where_a_lost_hosts_ps_goes(tasks, lost, spares, unreachable, to, words):
    move = place_lost_ps(tasks, lost=lost, mode=Mode.ASYNC, policy=ON_FAILURE, spares=spares, unreachable=unreachable)
    assert move.to == to and words in move.why, move
    if to is not None:
        assert move.tasks == tuple(name for name, host in tasks if host == lost and name.startswith("ps:"))


@pytest.mark.parametrize("mode, policy, words", [
    (Mode.ASYNC, NEVER, "restart policy 'never'"),
    (Mode.SYNC_PS, ON_FAILURE, "sync-ps mode: a lost ps is not moved"),
    (Mode.SYNC, ON_FAILURE, "sync mode"),
])
def test_a_ps_is_moved_only_in_async_mode_and_never_under_policy_never(mode, policy, words):
    move = place_lost_ps(LAB, lost="n2", mode=mode, policy=policy, spares=("s1",))
    assert move.to is None and words in move.why and move.tasks == ("ps:1",)


FAULT_LAB = """
all:
  vars: {ansible_user: u, pscluster_port_base: 3000, pscluster_mode: async}
  children:
    chief: {hosts: {n1: {ansible_host: 127.77.0.2}}}
    ps: {hosts: {n1: {}, n2: {ansible_host: 127.77.0.3}}}
    worker: {hosts: {n1: {}, n2: {}, n3: {ansible_host: 127.77.0.4}}}
SPARES
"""


def fault_lab(write_inventory, spares: str = ""):
    return pin_inventory(plan_text(write_inventory, FAULT_LAB.replace("SPARES", spares), name="lab"))


def test_the_moved_ps_takes_a_free_port_on_its_new_host_and_nothing_else_moves(write_inventory):
    old = fault_lab(write_inventory)
    assert ps_spares(old) == ()
    assert [(t.name, t.host, t.port) for t in old.tasks] == [
        ("chief:0", "n1", 3000), ("ps:0", "n1", 3001), ("ps:1", "n2", 3000), ("worker:0", "n1", 3002),
        ("worker:1", "n2", 3001), ("worker:2", "n3", 3000)]
    new = replan(old, port_base=None, limit=None, counts={"n2": 0}, pool=None, moved={"ps:1": ("n1", None)})
    assert [(t.name, t.host, t.port) for t in new.tasks] == [
        ("chief:0", "n1", 3000), ("ps:0", "n1", 3001), ("ps:1", "n1", 3003), ("worker:0", "n1", 3002),
        ("worker:1", "n3", 3000)]          # n2's worker left; n3's renumbered, on its host and port
    assert new.cluster_spec["ps"] == ["127.77.0.2:3001", "127.77.0.2:3003"]
    moved = new.task("ps:1")
    assert (moved.address, moved.standing, moved.cuda_visible_devices) == ("127.77.0.2", True, "")
    assert dict(moved.env)["PSCLUSTER_TASK"] == "ps:1" and moved.argv[1:] == ("-m", "roles.server")
    assert "TF_CONFIG" not in dict(moved.env) and '"127.77.0.2:3003"' in new.tf_config_text(new.task("worker:0"))
    assert [h.name for h in new.hosts] == ["n1", "n3"]          # n2 runs nothing of the new plan
    diff = diff_plans(old, new)
    assert set(diff.start) == {"ps:1", "worker:1"} and set(diff.stop) == {"ps:1", "worker:1", "worker:2"}
    assert {"chief:0", "ps:0", "worker:0"} <= set(diff.keep)
    # The servers that stay start again: they would route ps:1 to n2 (docs/platform-notes.md TF13).
    again = restarting(diff, [t.name for t in new.standing_tasks if t.name != "ps:1"])
    assert set(again.start) == {"ps:1", "worker:1", "ps:0", "worker:0"} and again.keep == ("chief:0",)
    assert set(again.stop) == {"ps:1", "worker:1", "worker:2", "ps:0", "worker:0"}


def test_a_later_re_plan_keeps_the_ps_where_it_moved(write_inventory):
    """n2 answers again and rejoins with its worker: ps:1 stays on n1, on the same port (its
    variables live there now), although the inventory still places it on n2."""
    old = fault_lab(write_inventory)
    moved = replan(old, port_base=None, limit=None, counts={"n2": 0}, pool=None, moved={"ps:1": ("n1", None)})
    back = replan(moved, port_base=None, limit=None, counts={}, pool=None, moved={"ps:1": ("n1", 3003)})
    assert [(t.name, t.host, t.port) for t in back.tasks] == [
        ("chief:0", "n1", 3000), ("ps:0", "n1", 3001), ("ps:1", "n1", 3003), ("worker:0", "n1", 3002),
        ("worker:1", "n2", 3001), ("worker:2", "n3", 3000)]
    assert "ps:1" in diff_plans(moved, back).keep


def test_a_spare_host_takes_the_ps_from_the_port_base(write_inventory):
    old = fault_lab(write_inventory, "    ps_spare: {hosts: {s1: {ansible_host: 127.77.0.9}}}")
    assert ps_spares(old) == ("s1",) and "s1" not in [h.name for h in old.hosts]    # nothing runs there before
    new = replan(old, port_base=None, limit=None, counts={"n2": 0}, pool=None, moved={"ps:1": ("s1", None)})
    moved = new.task("ps:1")
    assert (moved.host, moved.address, moved.port) == ("s1", "127.77.0.9", 3000)
    assert new.host("s1").address == "127.77.0.9" and moved.argv[0] == new.host("s1").python


def test_a_ps_only_host_left_out_has_no_workers_to_take_away(write_inventory):
    text = FAULT_LAB.replace("ps: {hosts: {n1: {}, n2: {ansible_host: 127.77.0.3}}}",
                             "ps: {hosts: {n1: {}, n4: {ansible_host: 127.77.0.5}}}").replace("SPARES", "")
    old = pin_inventory(plan_text(write_inventory, text, name="lab"))
    new = replan(old, port_base=None, limit=None, counts={"n4": 0}, pool=None, moved={"ps:1": ("n1", None)})
    assert new.task("ps:1").host == "n1" and len(new.tasks_of("worker")) == 3


def test_a_move_to_a_host_the_inventory_no_longer_names_is_refused(write_inventory):
    old = fault_lab(write_inventory)
    with pytest.raises(UsageError, match="ps:1 was moved to gone"):
        replan(old, port_base=None, limit=None, counts={}, pool=None, moved={"ps:1": ("gone", 3003)})


@pytest.mark.parametrize("pause, met", [(68.0, True), (75.0, False)])
def test_the_fault_benchmark_holds_a_ps_host_loss_to_the_host_timeout_plus_10_s(pause, met):
    from benchmarks.faults import goals
    row = {"mode": "async", "fault": "ps-cut-for-good", "outcome": "ps moved, restored", "pause": pause,
           "host_timeout": 60.0, "steps_lost": 100, "snapshot_steps": 900, "first_save_step": 300, "left": 0}
    [line] = [line for line in goals([row]) if "ps host lost for good" in line]
    assert line.startswith("MET " if met else "MISS") and "(70 s)" in line, line
