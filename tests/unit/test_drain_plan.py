"""The pure part of `pscluster drain HOST` (cluster/lifecycle/drain.py): the deadline, what each
task of the host does, and what is refused before anything moves; the CLI's exit 2 messages."""
from __future__ import annotations

import json

import pytest

from cluster.errors import UsageError
from cluster.lifecycle.drain import (CHECKPOINT, DRAINED, IN_PLACE, PS_MOVE, RESIZE, mark_drained,
                                     parse_deadline, plan_drain)
from cluster.lifecycle.resize_request import ResizeRequest
from cluster.state import RunState

from .test_cli_plan import Captured
from .test_resize_plan import lab


@pytest.mark.parametrize("text, seconds", [("30", 30.0), ("30s", 30.0), ("1.5m", 90.0), ("500ms", 0.5),
                                           ("1h", 3600.0), (" 2 min ", 120.0), ("1e1s", 10.0)])
def test_deadlines_read_as_seconds(text, seconds):
    assert parse_deadline(text) == seconds


@pytest.mark.parametrize("text, said", [("0", "more than 0"), ("0s", "more than 0"), ("-5", "not a duration"),
                                        ("nan", "not a duration"), ("inf", "not a duration"), ("abc", "not a duration"),
                                        ("", "not a duration"), ("30x", "not a duration"), ("2d", "not a duration"),
                                        ("25h", "more than a day"),
                                        ("1e999", "not a finite duration"), ("-inf", "not a duration")])
def test_bad_deadlines_are_refused_with_a_hint(text, said):
    with pytest.raises(UsageError) as caught:
        parse_deadline(text)
    assert said in caught.value.message and f"--deadline {text!r}" in caught.value.message
    assert "--deadline 30s" in caught.value.hint


def test_an_async_worker_anywhere_in_the_list_leaves_in_place(write_inventory):
    plan = lab(write_inventory, "h2", "h3", "h4")
    drain = plan_drain(plan, "h2", job_live=True)       # worker:0, the first: no renumbering
    assert [(m.task, m.action) for m in drain.moves] == [("worker:0", IN_PLACE)]
    assert drain.action == IN_PLACE


def test_a_sync_worker_or_no_job_leaves_through_the_resize(write_inventory):
    sync = lab(write_inventory, "h2", "h3", mode="sync")
    assert plan_drain(sync, "h3", job_live=True).action == RESIZE
    # worker:0 leads a sync job (its checkpoints): the resize would refuse it, so the drain says
    # before anything moves that the job is checkpointed instead (issue 44's chief rule)
    leader = plan_drain(sync, sync.leader.host, job_live=True)
    assert [(m.task, m.action) for m in leader.moves] == [("worker:0", CHECKPOINT)]
    assert "leads the sync job" in leader.describe()
    assert plan_drain(sync, sync.leader.host, job_live=False).action == RESIZE     # no job: nothing to keep
    idle = lab(write_inventory, "h2", "h3")
    assert plan_drain(idle, "h3", job_live=False).action == RESIZE


def test_the_chief_and_ps_host_checkpoints_instead(write_inventory):
    plan = lab(write_inventory, "h2", "h3")
    drain = plan_drain(plan, "h1", job_live=True)
    # its ps could move, but the chief cannot: the host as a whole checkpoints the job instead
    assert {m.role: m.action for m in drain.moves} == {"chief": CHECKPOINT, "ps": PS_MOVE}
    assert drain.action == CHECKPOINT
    assert "cannot be drained" in drain.describe()


PS_HOSTS = """
all:
  vars: {ansible_user: u, pscluster_port_base: 2222, pscluster_mode: MODE}
  children:
    chief: {hosts: {h1: {ansible_host: 127.77.0.2}}}
    ps: {hosts: {h1: {ansible_host: 127.77.0.2}, h2: {ansible_host: 127.77.0.3}, h4: {ansible_host: 127.77.0.5}}}
    worker: {hosts: {h2: {ansible_host: 127.77.0.3}, h3: {ansible_host: 127.77.0.4}}}
"""


def test_an_async_ps_host_moves_its_ps_and_its_workers_leave_with_it(write_inventory):
    """Issue 44: a ps of an async job moves (through a checkpoint at one step: no step lost); a
    host with a ps and a worker drains as one move; sync-ps or no job: the ps stays."""
    from .test_plan import plan_text
    plan = plan_text(write_inventory, PS_HOSTS.replace("MODE", "async"), name="lab")
    only_ps = plan_drain(plan, "h4", job_live=True)
    assert [(m.task, m.action) for m in only_ps.moves] == [("ps:2", PS_MOVE)] and only_ps.action == PS_MOVE
    # other ps hosts: the chief moves its variables to one of them in place
    assert "no step lost" in only_ps.describe() and "another ps in place" in only_ps.describe()
    both = plan_drain(plan, "h2", job_live=True)
    assert {m.role: m.action for m in both.moves} == {"ps": PS_MOVE, "worker": IN_PLACE} and both.action == PS_MOVE
    idle = plan_drain(plan, "h4", job_live=False)
    assert idle.action == CHECKPOINT and "stays" in idle.describe()
    syncps = plan_text(write_inventory, PS_HOSTS.replace("MODE", "sync-ps"), name="lab")
    held = plan_drain(syncps, "h4", job_live=True)
    assert held.action == CHECKPOINT and "sync-ps job's ps cannot move" in held.describe()


def test_the_only_ps_host_moves_its_ps_through_a_restart(write_inventory):
    """With no other ps host, TensorFlow has no ps to take the variables in place (TF13): the move
    goes through a checkpoint and the chief's restart, and the drain says so before it starts."""
    from .test_plan import plan_text
    text = PS_HOSTS.replace("MODE", "async").replace(
        "ps: {hosts: {h1: {ansible_host: 127.77.0.2}, h2: {ansible_host: 127.77.0.3}, h4: {ansible_host: 127.77.0.5}}}",
        "ps: {hosts: {h4: {ansible_host: 127.77.0.5}}}")
    plan = plan_text(write_inventory, text, name="lab")
    drain = plan_drain(plan, "h4", job_live=True)
    assert drain.action == PS_MOVE and "chief restarts from there" in drain.describe(), drain.describe()
    assert "in place" not in drain.describe()


def test_unknown_host_and_the_last_worker_are_refused_before_anything_moves(write_inventory):
    plan = lab(write_inventory, "h2", "h3")
    with pytest.raises(UsageError) as caught:
        plan_drain(plan, "h9", job_live=True)
    assert "'h9' is not a host of cluster 'lab'" in caught.value.message and "h2" in caught.value.hint
    with pytest.raises(UsageError) as caught:
        plan_drain(plan, "h3", job_live=True, drained=("h2",))      # h2 drained already: h3 holds the last
    assert "no worker" in caught.value.message
    assert plan_drain(plan, "h3", job_live=True).action == IN_PLACE


def test_the_drained_state_and_the_request_round_trip(write_inventory):
    plan = lab(write_inventory, "h2", "h3")
    state = RunState(name="lab", plan=plan)
    mark_drained(state.drained, "h2", DRAINED)
    assert RunState.from_json(json.loads(json.dumps(state.to_json()))).drained == {"h2": DRAINED}
    mark_drained(state.drained, "h2", None)
    assert state.drained == {}
    request = ResizeRequest(plan, reason="drain h2", drain="h2")
    again = ResizeRequest.from_json(json.loads(json.dumps(request.to_json())))
    assert (again.drain, again.undrain, again.reason) == ("h2", None, "drain h2")
    assert ResizeRequest.from_json({"plan": request.to_json()["plan"]}).drain is None     # an older request
    assert again.within is None and "within" not in request.to_json()
    timed = ResizeRequest(plan, reason="drain h2", drain="h2", within=50.0)
    assert ResizeRequest.from_json(json.loads(json.dumps(timed.to_json()))).within == 50.0
    for bad in (-1, 0, "50", True, float("nan"), float("inf"), None):
        assert ResizeRequest.from_json({**timed.to_json(), "within": bad}).within is None, bad


@pytest.mark.parametrize("args, said", [(["drain", "h1", "--deadline", "abc"], "--deadline 'abc': not a duration"),
                                        (["drain", "h1", "--deadline", "-1"], "not a duration"),
                                        (["drain", "h1", "--name", "nope"], "nope"),
                                        (["undrain", "h1", "--name", "nope"], "nope")])
def test_the_cli_exits_2_on_bad_input(tmp_path, args, said):
    captured = Captured(tmp_path / "state")
    assert captured.run(*args) == 2, captured.stderr.getvalue()
    said_there = captured.stderr.getvalue()
    assert said in said_there and "Traceback" not in said_there


def test_undrain_of_a_host_that_is_not_drained_and_a_drain_during_a_scale_are_refused(tmp_path, write_inventory):
    from cluster.contracts import Phase
    from cluster.events import RecordingReporter
    from cluster.lifecycle.resize_request import resize_lock
    from cluster.state import StateStore
    from cluster.supervision.drain_job import drain_host, undrain_host
    store = StateStore(tmp_path / "state")
    plan = lab(write_inventory, "h2", "h3")
    store.save(RunState(name="lab", plan=plan, phase=Phase.UP))
    with pytest.raises(UsageError) as caught:
        undrain_host(store, "lab", "h2", pool=None, reporter=RecordingReporter(), secrets=lambda plan: None)  # type: ignore[arg-type]
    assert "'h2' is not drained in cluster 'lab'" in caught.value.message and "none" in caught.value.hint
    with pytest.raises(UsageError) as caught:
        drain_host(store, "lab", "h9", deadline=30, pool=None, reporter=RecordingReporter(),  # type: ignore[arg-type]
                   secrets=lambda plan: None)
    assert "'h9' is not a host of cluster 'lab'" in caught.value.message
    state = store.load("lab")
    assert state is not None and state.drained == {}
    with resize_lock(store, "lab"):       # a scale runs: the idle cluster's drain (through scale) is refused
        with pytest.raises(UsageError) as caught:
            drain_host(store, "lab", "h2", deadline=30, pool=None, reporter=RecordingReporter(),  # type: ignore[arg-type]
                       secrets=lambda plan: None)
    assert "another 'pscluster scale'" in caught.value.message
    state = store.load("lab")
    assert state is not None and state.drained == {}      # a refused drain leaves no mark


def test_a_move_that_does_not_come_in_time_leaves_time_to_checkpoint_instead(tmp_path, write_inventory, monkeypatch):
    """benchmarks.drain: a sync drain's resize that had not come after the whole deadline made the
    drain fail with nothing checkpointed; the move now gets the deadline less the reserve."""
    from cluster.contracts import JobState, Phase
    from cluster.errors import PsclusterError
    from cluster.events import RecordingReporter
    from cluster.jobrecord import JobProgress
    from cluster.lifecycle import resize
    from cluster.state import StateStore
    from cluster.supervision import drain_job, jobstop
    store = StateStore(tmp_path / "state")
    plan = lab(write_inventory, "h2", "h3", mode="sync")
    job = JobProgress(id=1, job="mnist", mode="sync", state=JobState.RUNNING)
    store.save(RunState(name="lab", plan=plan, phase=Phase.UP, job=job))
    now = [0.0]
    asked: dict[str, float] = {}

    def slow_resize(store, name, new, *, timeout, **kwargs):
        asked["timeout"] = timeout
        now[0] += timeout                       # the supervisor never answered within it
        raise PsclusterError(f"job 1's supervisor has not resized it after {timeout:g} s")

    def stop(name, *, grace, **kwargs):
        asked["grace"] = grace
        return JobProgress(id=1, job="mnist", mode="sync", state=JobState.STOPPED, checkpoint_step=640)

    monkeypatch.setattr(resize, "replan", lambda plan, **kwargs: plan)
    monkeypatch.setattr(resize, "scale_cluster", slow_resize)
    monkeypatch.setattr(jobstop, "stop_running_job", stop)
    result = drain_job.drain_host(store, "lab", "h3", deadline=30, pool=None, reporter=RecordingReporter(),  # type: ignore[arg-type]
                                  secrets=lambda plan: None, clock=lambda: now[0])
    assert asked["timeout"] == 30 - drain_job.CHECKPOINT_RESERVE
    assert asked["grace"] == drain_job.CHECKPOINT_RESERVE        # what is left of the deadline
    assert not result.ok and "checkpointed at step 640" in result.message and result.left == ("worker:1",)
    assert drain_job.checkpoint_reserve(6) == 2                  # a short deadline keeps a third


IDLE_PS = PS_HOSTS.replace("MODE", "async").replace(
    "pscluster_mode: async}", "pscluster_mode: async, pscluster_idle_ps: 1}").replace(
    "ps: {hosts: {h1: {ansible_host: 127.77.0.2}, h2: {ansible_host: 127.77.0.3}, h4: {ansible_host: 127.77.0.5}}}",
    "ps: {hosts: {h4: {ansible_host: 127.77.0.5}, h2: {ansible_host: 127.77.0.3}}}")


def test_the_only_ps_with_an_idle_ps_moves_in_place(write_inventory):
    """pscluster_idle_ps: 1 puts ps:1 (h2) in the chief's cluster from its start holding nothing
    (the chief is told PSCLUSTER_IDLE_PS): h4's ps, the only one that holds variables, then
    moves in place instead of through a restart, and the plan says which ps is idle."""
    from .test_plan import plan_text
    plan = plan_text(write_inventory, IDLE_PS, name="lab")
    assert plan.idle_ps == 1 and [t.host for t in plan.tasks_of("ps")] == ["h4", "h2"]
    assert dict(plan.task("chief:0").env)["PSCLUSTER_IDLE_PS"] == "1"
    assert not [t for t in plan.tasks if t.role != "chief" and "PSCLUSTER_IDLE_PS" in dict(t.env)]
    drain = plan_drain(plan, "h4", job_live=True)
    assert drain.action == PS_MOVE and "another ps in place" in drain.describe(), drain.describe()
    assert plan.to_json()["idle_ps"] == 1
    import io
    from rich.console import Console
    from cluster.console.tables import render_plan
    text = io.StringIO()
    render_plan(Console(file=text, width=300, color_system=None), plan)
    assert "ps:1 kept idle by the chief (pscluster_idle_ps)" in text.getvalue(), text.getvalue()


@pytest.mark.parametrize("change, said", [
    ("pscluster_mode: async, pscluster_idle_ps: 1", "idle ps tasks are for mode async"),
    ("pscluster_mode: async, pscluster_idle_ps: 2", "2 idle ps of 2 ps task(s) leave none for the variables"),
    ("pscluster_mode: async, pscluster_idle_ps: -1", "expected a ps task count"),
    ("pscluster_mode: async, pscluster_idle_ps: yes", "expected a ps task count"),
])
def test_idle_ps_that_cannot_be_are_refused_naming_the_key(write_inventory, change, said):
    from cluster.errors import InventoryError
    from .test_plan import plan_text
    text = IDLE_PS.replace("pscluster_mode: async, pscluster_idle_ps: 1", change)
    if "for mode async" in said:
        text = text.replace("pscluster_mode: async", "pscluster_mode: sync-ps")
    with pytest.raises(InventoryError, match=r"pscluster_idle_ps") as raised:
        plan_text(write_inventory, text, name="lab")
    assert said in str(raised.value) and raised.value.exit_code == 2


def test_idle_ps_is_set_for_the_whole_cluster_only(write_inventory):
    from cluster.errors import InventoryError
    from .test_plan import plan_text
    text = IDLE_PS.replace("pscluster_idle_ps: 1}", "}").replace(
        "h2: {ansible_host: 127.77.0.3}}}", "h2: {ansible_host: 127.77.0.3, pscluster_idle_ps: 1}}}", 1)
    with pytest.raises(InventoryError, match="applies to the whole cluster"):
        plan_text(write_inventory, text, name="lab")


def test_the_idle_ps_survives_the_state_and_a_one_shot_run_has_none(write_inventory):
    from cluster.state import plan_from_json, plan_to_json
    from .test_plan import plan_text
    plan = plan_text(write_inventory, IDLE_PS, name="lab")
    assert plan_from_json(json.loads(json.dumps(plan_to_json(plan)))).idle_ps == 1
    old = plan_to_json(plan)
    del old["idle_ps"]
    assert plan_from_json(old).idle_ps == 0        # a state of an earlier version
    run = plan_text(write_inventory, IDLE_PS, name="lab", roles=("chief", "ps", "worker"))
    assert run.idle_ps == 0 and "PSCLUSTER_IDLE_PS" not in dict(run.task("chief:0").env)


def test_a_moving_ps_goes_to_the_ps_that_holds_the_fewest_variables():
    from cluster.lifecycle.drain import ps_target
    held = {0: 6, 1: 0, 2: 3}
    assert ps_target([1, 2], held, 6) == 1          # the idle one, not the lowest index holding some
    assert held == {0: 6, 1: 6, 2: 3}
    assert ps_target([1, 2], held, 4) == 2          # the next one goes where there is less now
    assert ps_target([2, 1], {}, 0) == 1            # no placement heard: the lowest index
    with pytest.raises(ValueError):
        ps_target([], {}, 1)


def test_the_placement_event_says_how_many_variables_each_ps_holds():
    from cluster.supervision.train_job import ps_index
    assert ps_index("/job:ps/replica:0/task:1/device:CPU:0") == 1
    assert ps_index("/job:ps/task:12") == 12
    assert ps_index("/job:worker/replica:0/task:1/device:CPU:0") is None
    assert ps_index("/job:psx/task:1") is None and ps_index("") is None
