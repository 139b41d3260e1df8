"""roles/psmove.py's pure parts: which ps moves where, and what is refused (TF13)."""
from __future__ import annotations

import types

import pytest

from roles import psmove
from roles.psmove import MoveRefused, plan_request, plan_shrink, ps_task

CLUSTER = {"chief": ["h:1"], "ps": ["h:2", "h:3", "h:4"], "worker": ["h:5", "h:6"]}


def test_shrink_to_the_lowest_other_ps_keeps_the_others_names():
    move = plan_shrink(CLUSTER, 1)
    assert move.destination == {1: 0}
    assert move.cluster["ps"] == {0: "h:2", 2: "h:4"}           # sparse: ps:2 stays ps:2
    assert move.cluster["worker"] == {0: "h:5", 1: "h:6"}
    assert CLUSTER["ps"] == ["h:2", "h:3", "h:4"]               # the input is left alone


def test_move_to_a_spare_of_the_cluster():
    assert plan_shrink(CLUSTER, 0, to=2).destination == {0: 2}
    assert plan_shrink(CLUSTER, 0, to=2).cluster["ps"] == {1: "h:3", 2: "h:4"}


def test_a_sparse_cluster_moves_again():
    once = plan_shrink(CLUSTER, 1, to=2).cluster
    again = plan_shrink(once, 2)
    assert again.cluster["ps"] == {0: "h:2"} and again.destination == {2: 0}


@pytest.mark.parametrize("ps, to, says", [
    (7, None, "there is no ps:7"),
    (1, 1, "cannot take"),
    (1, 9, "cannot take"),
])
def test_refused(ps, to, says):
    with pytest.raises(MoveRefused, match=says):
        plan_shrink(CLUSTER, ps, to)


def test_the_only_ps_has_nowhere_to_go():
    with pytest.raises(MoveRefused, match="only ps"):
        plan_shrink({"ps": ["h:2"], "worker": ["h:5"]}, 0)


def test_request_by_index_by_address_or_neither():
    assert plan_request(CLUSTER, {"ps": 1, "to": 2}).destination == {1: 2}
    assert plan_request(CLUSTER, {"ps": 1, "to": "h:4"}).destination == {1: 2}
    assert plan_request(CLUSTER, {"ps": 2}).destination == {2: 0}


@pytest.mark.parametrize("request_, says", [
    (None, "no ps task index"),
    ({"ps": "1"}, "no ps task index"),
    ({"ps": True}, "no ps task index"),
    ({"ps": 1, "to": 2.0}, "must be a ps task index"),
    ({"ps": 1, "to": "other:9"}, "cannot take in a new ps server in place"),
])
def test_bad_requests(request_, says):
    with pytest.raises(MoveRefused, match=says):
        plan_request(CLUSTER, request_)


@pytest.mark.parametrize("device, task", [
    ("/job:ps/replica:0/task:1/device:CPU:0", 1),
    ("/job:ps/task:12", 12),
    ("/job:worker/replica:0/task:1/device:CPU:0", None),
    ("", None),
])
def test_ps_task(device, task):
    assert ps_task(device) == task


def test_the_variables_behind_keras_and_strategy_wrappers_once_each():
    inner = types.SimpleNamespace(_handle="h")
    wrapper = types.SimpleNamespace(_v=inner)           # ParameterServerStrategy's ps_values
    keras = types.SimpleNamespace(_value=wrapper)       # Keras 3's Variable
    plain = types.SimpleNamespace(_handle="p")
    assert psmove.resource_variables([keras, plain, inner, object()]) == [inner, plain]


def test_new_variables_stay_on_tasks_that_exist():
    assert psmove._dense_prefix({0: "a", 2: "b"}) == 1
    assert psmove._dense_prefix({1: "a"}) == 1
    assert psmove._dense_prefix({0: "a", 1: "b"}) == 2


def test_spares_kept_idle():
    strategy = types.SimpleNamespace(extended=types.SimpleNamespace(_num_ps=3))
    psmove.keep_spares_idle(strategy, 1)
    assert strategy.extended._num_ps == 2
    with pytest.raises(MoveRefused, match="leave none"):
        psmove.keep_spares_idle(strategy, 2)


def test_the_chiefs_cluster_after_moves_in_place_lists_no_ps_that_moved_away():
    """roles/async_driver.py keeps the orchestrator's cluster (every ps listed) and points its
    context at this one: a membership change after a move must not bring ps:1 back."""
    cluster = {"chief": ["c:1"], "ps": ["p0:1", "p1:1", "p2:1"], "worker": ["w0:1", "w1:1"]}
    assert psmove.effective_cluster(cluster, {}) == cluster
    moved = psmove.effective_cluster(cluster, {1: 0})
    assert moved == {"chief": ["c:1"], "ps": {0: "p0:1", 2: "p2:1"}, "worker": ["w0:1", "w1:1"]}
    assert cluster["ps"] == ["p0:1", "p1:1", "p2:1"]        # the orchestrator's stays as it was
    # a second move: ps:0 onto ps:2 (the request names tasks of the effective cluster)
    again = psmove.plan_request(moved, {"ps": 0, "to": 2})
    assert again.destination == {0: 2} and again.cluster["ps"] == {2: "p2:1"}


@pytest.mark.parametrize("env, num_ps, idle", [
    ({}, 2, 0), ({"PSCLUSTER_IDLE_PS": "1"}, 2, 1), ({"PSCLUSTER_IDLE_PS": "3"}, 2, 1),
    ({"PSCLUSTER_IDLE_PS": "1"}, 1, 0), ({"PSCLUSTER_IDLE_PS": "one"}, 3, 0), ({"PSCLUSTER_IDLE_PS": "-2"}, 3, 0),
])
def test_the_chief_keeps_idle_what_it_was_told_and_never_every_ps(env, num_ps, idle):
    """PSCLUSTER_IDLE_PS (the plan's pscluster_idle_ps): a re-planned cluster with fewer ps, or a
    value that is not a count, never leaves the variables without a ps."""
    assert psmove.idle_count(num_ps, env) == idle
