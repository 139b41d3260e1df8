"""StateWriter notices that another command took the cluster over: `down` changed the phase or
deleted the state, or a later `up` of the same name wrote a new state (a new `created`)."""
from __future__ import annotations

import pytest

from cluster.errors import Aborted
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import RunState, StateStore, StateWriter
from tests.unit.conftest import INVENTORIES


def test_writer_aborts_when_down_or_a_new_up_took_the_cluster(tmp_path):
    plan, writer = _a_starting_cluster(tmp_path)
    store, mine = writer.store, writer.state
    writer.change(lambda s: s.synced.update({"localhost": "synced"}))
    assert store.load(plan.name).synced == {"localhost": "synced"}

    store.save(RunState(name=plan.name, plan=plan, created=mine.created + 1))    # down, then another up
    with pytest.raises(Aborted):
        writer.change(lambda s: s.synced.update({"other": "synced"}))
    assert store.load(plan.name).synced == {}                                       # the new state untouched

    store.delete(plan.name)
    with pytest.raises(Aborted):
        writer.change(lambda s: None)
    assert store.load(plan.name) is None


def test_writer_reads_the_state_back_only_when_another_command_wrote_it(tmp_path, monkeypatch):
    """A supervisor writes once a second: re-reading the whole state each time grew with the
    cluster (issue 46); the file as this writer left it needs no second look."""
    plan, writer = _a_starting_cluster(tmp_path)
    store = writer.store
    loads = []
    real_load = store.load
    monkeypatch.setattr(store, "load", lambda name: loads.append(name) or real_load(name))
    for _ in range(5):
        writer.change(lambda s: None)
    assert len(loads) == 1                         # the first change only
    other = real_load(plan.name)
    other.message = "another command"
    store.save(other)                              # the same cluster, written by someone else
    writer.change(lambda s: None)
    assert len(loads) == 2


def test_a_records_json_form_is_kept_while_the_same_record_is_in_the_state(tmp_path):
    """Issue 46: a supervisor writes every record once a second; a frozen record's form is built
    once, a replaced record's again, and a record that left the state is forgotten."""
    import dataclasses

    from cluster.contracts import ProcessKind
    from cluster.state import ProcessRecord, records_to_json

    first = ProcessRecord.for_task("worker:0", "h1", ProcessKind.TRAIN, 1, "/l/w0.log", job=1)
    second = ProcessRecord.for_task("ps:0", "h2", ProcessKind.SERVER, 1, "/l/p0.log")
    forms = records_to_json([first, second])
    assert forms == [dataclasses.asdict(first), dataclasses.asdict(second)]
    again = records_to_json([first, second])
    assert again[0] is forms[0] and again[1] is forms[1]
    moved = dataclasses.replace(second, pid=42)
    third = records_to_json([first, moved])
    assert third[0] is forms[0] and third[1] == dataclasses.asdict(moved) and third[1]["pid"] == 42
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="python3", local_workdir="/w"))
    store = StateStore(tmp_path)
    store.save(RunState(name=plan.name, plan=plan, processes=[first, moved]))
    assert store.load(plan.name).processes == [first, moved]



def test_the_saved_text_is_the_states_json_byte_for_byte_as_records_change(tmp_path):
    """Issue 46: a save joins the kept texts of the plan and of unchanged records; the file must
    be what ``json.dumps(state.to_json())`` writes, through every kind of change."""
    import dataclasses
    import json

    from cluster.contracts import ProcessKind
    from cluster.state import ProcessRecord

    plan, writer = _a_starting_cluster(tmp_path)
    path = writer.store.path(plan.name)
    first = ProcessRecord.for_task("worker:0", "h1", ProcessKind.TRAIN, 1, "/l/w0.log", job=1)
    second = ProcessRecord.for_task("ps:0", "h2", ProcessKind.SERVER, 1, "/l/p0.log")
    changes = [lambda s: s.replace_records([first, second]),
               lambda s: s.replace_record(dataclasses.replace(second, pid=42)),      # one record changes
               lambda s: setattr(s, "message", 'a "quoted" message\nwith ünïcode'),
               lambda s: s.synced.update({"h1": "abc"}),
               lambda s: setattr(s, "processes", [])]
    for change in changes:
        writer.change(change)
        text = path.read_text(encoding="utf-8")
        assert text == json.dumps(writer.state.to_json())
        assert json.loads(json.dumps(writer.store.load(plan.name).to_json())) == json.loads(text)
    assert writer.saves == len(changes)


def test_a_save_right_after_another_waits_for_the_changes_under_way_to_join_it(tmp_path, monkeypatch):
    """Issue 46: in a burst (a save within COMMIT_BURST of the last), the saver pauses first; the
    changes other threads make meanwhile go to disk with its own, in one save. Deterministic: the
    pause is the test's, and returns once the other changes are made."""
    import threading

    from cluster import state as state_module

    plan, writer = _a_starting_cluster(tmp_path)
    writer.change(lambda s: setattr(s, "message", "first"))      # no burst before it: saved at once
    assert writer.saves == 1
    others: list[threading.Thread] = []

    def pause() -> None:
        for i in range(6):
            thread = threading.Thread(target=writer.change, args=(lambda s, i=i: s.synced.update({f"h{i}": "x"}),))
            thread.start()
            others.append(thread)
        while writer._changed < 1 + 1 + 6:     # the first, the pausing one's, and the six
            threading.Event().wait(0.001)

    monkeypatch.setattr(state_module, "_commit_pause", pause)
    writer.change(lambda s: setattr(s, "message", "second"))
    for thread in others:
        thread.join(10)
    assert writer.saves == 2, "the six changes made during the pause needed saves of their own"
    on_disk = writer.store.load(plan.name)
    assert on_disk.message == "second" and on_disk.synced == {f"h{i}": "x" for i in range(6)}


def test_changes_waiting_for_a_save_go_to_disk_together_in_one(tmp_path):
    """Group commit (issue 46): 15 threads change the state while a save is under way (the test
    holds the writer's save turn); each change() returns with its change on disk, and the 15
    changes take one save between them, not 15."""
    import threading

    plan, writer = _a_starting_cluster(tmp_path)
    mutated = threading.Semaphore(0)
    on_disk: dict[int, bool] = {}

    def change(i):
        def mutate(s):
            s.synced[f"h{i}"] = "synced"
            mutated.release()
        writer.change(mutate)
        on_disk[i] = f"h{i}" in StateStore(tmp_path).load(plan.name).synced

    with writer._saving:                       # a save under way: every change waits for its turn
        threads = [threading.Thread(target=change, args=(i,)) for i in range(15)]
        for thread in threads:
            thread.start()
        for _ in threads:
            assert mutated.acquire(timeout=60)  # all 15 changed the state in memory
        assert writer.saves == 0 and on_disk == {}
    for thread in threads:
        thread.join(60)
    assert on_disk == {i: True for i in range(15)}
    assert writer.saves == 1


def _a_starting_cluster(tmp_path):
    """The local inventory's plan, and a writer of its state as `up` has it (phase starting)."""
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="python3", local_workdir="/w"))
    store = StateStore(tmp_path)
    state = RunState(name=plan.name, plan=plan)
    store.save(state)
    return plan, StateWriter(store, state, expect_phase="starting")
