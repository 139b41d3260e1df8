"""Cluster state (cluster/state.py): JSON round trip, the store's files, names and lock."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.contracts import JobState
from cluster.errors import StateError, UsageError
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.jobrecord import JobProgress, Orchestrator
from cluster.state import ProcessRecord, RunState, StateStore, default_state_dir

from .conftest import INVENTORIES

OPTIONS = PlanOptions(local_python="/here/python", local_workdir="/here/checkout")


def lab_state(name: str = "lab", mode: str | None = None) -> RunState:
    plan = plan_cluster(load_inventory(str(INVENTORIES / "lab.yaml")),
                        PlanOptions(**{**OPTIONS.__dict__, "name": name, "mode": mode}))
    records = [
        ProcessRecord(key="ps:0#1", task="ps:0", host="node-a", kind="server", attempt=1,
                      log="/opt/pscluster/work/.pscluster/lab/ps-0.log", exit_file="/tmp/ps-0.exit",
                      pid=4242, pgid=4240, starttime="123456", task_starttime="123460", started=1700000000.25),
        ProcessRecord(key="worker:1#2", task="worker:1", host="node-b", kind="server", attempt=2,
                      log="/opt/pscluster/work/.pscluster/lab/worker-1.log", exit_file="/tmp/worker-1.exit",
                      events="/opt/pscluster/work/.pscluster/lab/worker-1.events.jsonl", stopped=True),
    ]
    return RunState(name=name, plan=plan, phase="up", processes=records, created=1700000000.0,
                    updated=1700000001.5, message="all servers ready", job=JobProgress(id=3, job="mnist", mode=mode or "async", state=JobState.RUNNING, step=12,
                                                               restarts={"worker:1": 1},
                                                               orchestrator=Orchestrator(4321, "ctl")),
                    restarts={"worker:1": 1}, synced={"node-a": "sha256:ab12"}, firewall={"node-b": "table"})


@pytest.mark.parametrize("mode", ["async", "sync", "sync-ps"])
def test_run_state_json_round_trip(mode):
    state = lab_state(mode=mode)
    document = json.loads(json.dumps(state.to_json()))
    back = RunState.from_json(document)
    assert back == state
    assert back.plan == state.plan                 # tuples stay tuples: plans compare equal
    assert back.mode == mode
    assert back.plan.task("worker:2").env == state.plan.task("worker:2").env
    hash(back.plan)                                # still a frozen, hashable value


def test_run_state_queries():
    state = lab_state()
    assert [record.key for record in state.live_records()] == ["ps:0#1"]
    assert state.latest("worker:1").attempt == 2
    assert state.latest("chief:0") is None
    state.replace_record(ProcessRecord(key="ps:0#1", task="ps:0", host="node-a", kind="server", attempt=1,
                                       log="x", exit_file="y", stopped=True))
    assert state.live_records() == []


def test_store_save_load_delete(tmp_path):
    store = StateStore(tmp_path / "state")
    assert store.names() == []                     # the directory does not exist yet
    assert store.load("lab") is None
    state = lab_state()
    store.save(state)
    assert sorted(path.name for path in (tmp_path / "state").iterdir()) == ["lab.json"]   # no temporary left
    assert store.names() == ["lab"]
    assert store.load("lab") == state
    store.delete("lab")
    assert store.load("lab") is None
    assert store.names() == []
    store.delete("lab")                            # idempotent


def test_store_keeps_clusters_apart(tmp_path):
    store = StateStore(tmp_path)
    store.save(lab_state("exp1"))
    store.save(lab_state("exp2", mode="sync"))
    assert store.names() == ["exp1", "exp2"]
    assert (store.load("exp1").mode, store.load("exp2").mode) == ("async", "sync")


@pytest.mark.parametrize("content", ["{", "[]", '{"name": "lab"}', "null"])
def test_unreadable_state(tmp_path, content):
    (tmp_path / "lab.json").write_text(content)
    with pytest.raises(StateError) as caught:
        StateStore(tmp_path).load("lab")
    assert str(tmp_path / "lab.json") in caught.value.message
    assert caught.value.hint


def test_resolve_name_without_clusters(tmp_path):
    with pytest.raises(UsageError) as caught:
        StateStore(tmp_path).resolve_name(None)
    assert caught.value.message == "no cluster is up"
    assert "pscluster up" in caught.value.hint
    assert caught.value.exit_code == 2


def test_resolve_name_of_the_only_cluster(tmp_path):
    store = StateStore(tmp_path)
    store.save(lab_state("exp1"))
    assert store.resolve_name(None) == "exp1"
    assert store.resolve_name("exp1") == "exp1"


def test_resolve_name_with_several_clusters(tmp_path):
    store = StateStore(tmp_path)
    store.save(lab_state("exp1"))
    store.save(lab_state("exp2"))
    with pytest.raises(UsageError) as caught:
        store.resolve_name(None)
    assert caught.value.message == "several clusters are up (exp1, exp2)"
    assert "--name" in caught.value.hint
    assert store.resolve_name("exp2") == "exp2"


def test_resolve_unknown_name(tmp_path):
    store = StateStore(tmp_path)
    with pytest.raises(UsageError) as caught:
        store.resolve_name("nope")
    assert caught.value.message == "no cluster named 'nope' (known: none)"
    store.save(lab_state("exp1"))
    with pytest.raises(UsageError) as caught:
        store.resolve_name("nope")
    assert caught.value.message == "no cluster named 'nope' (known: exp1)"


def test_resize_files_beside_a_state_are_not_clusters(tmp_path):
    from cluster.lifecycle.resize_request import RESIZE_SUFFIX, post_result
    store = StateStore(tmp_path)
    store.save(lab_state("bar23s"))
    post_result(store, "bar23s", ok=True, message="resized")
    post_result(store, "barlab23", ok=False, message="gone")    # an answer that outlived its cluster
    (tmp_path / f"bar23s{RESIZE_SUFFIX}").write_text("{}")
    assert store.names() == ["bar23s"]
    with pytest.raises(UsageError) as caught:
        store.resolve_name("X")
    assert caught.value.message == "no cluster named 'X' (known: bar23s)"
    assert store.resolve_name(None) == "bar23s"


def test_lock_is_exclusive(tmp_path):
    store = StateStore(tmp_path)
    with store.lock("lab"):
        with pytest.raises(StateError) as caught:
            with store.lock("lab", wait=0.2):
                pass
        assert caught.value.message == "cluster 'lab' is locked by another pscluster command"
        with store.lock("other", wait=0):          # another cluster is not blocked
            pass
    with store.lock("lab", wait=0):                # released on exit
        pass


def test_lock_stays_exclusive_when_the_state_is_deleted_under_it(tmp_path):
    # `down` deletes the state while it holds the lock (lifecycle/updown.bring_down). Another command
    # arriving meanwhile must still wait: deleting the state must not hand out a second lock.
    store = StateStore(tmp_path)
    store.save(lab_state())
    with store.lock("lab"):
        store.delete("lab")
        assert store.load("lab") is None
        with pytest.raises(StateError):
            with store.lock("lab", wait=0.2):
                pass


def test_lock_is_released_when_the_body_raises(tmp_path):
    store = StateStore(tmp_path)
    with pytest.raises(RuntimeError):
        with store.lock("lab"):
            raise RuntimeError("boom")
    with store.lock("lab", wait=0):
        pass


def test_update_saves_under_the_lock(tmp_path):
    store = StateStore(tmp_path)
    state = lab_state()
    state.phase = "stopping"
    store.update(state)
    assert store.load("lab").phase == "stopping"
    assert store.names() == ["lab"]                # the lock file is not a cluster


def test_default_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PSCLUSTER_STATE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "explicit"
    monkeypatch.delenv("PSCLUSTER_STATE_DIR")
    assert default_state_dir() == tmp_path / "xdg" / "pscluster"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "pscluster"
    assert StateStore().root == default_state_dir()
    assert not Path(tmp_path / "home").exists()    # nothing is created by asking
