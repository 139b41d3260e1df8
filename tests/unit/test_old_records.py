"""Files written before the record-level names became enums (tests/fixtures/records, see its
README): they load into the enums and are written again byte for byte, so old state files,
run histories and resize requests keep working across the change (docs/architecture.md, Records)."""
from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from cluster.contracts import Phase, ProcessKind, StrEnum
from cluster.errors import UsageError
from cluster.history import RunHistory, RunRecord
from cluster.lifecycle.resize_request import RESIZE_SUFFIX, RESULT_SUFFIX, ResizeRequest, post_request, post_result, take_request
from cluster.state import ProcessRecord, RunState, StateStore, file_lock, write_private_json

from .conftest import REPO

RECORDS = REPO / "tests" / "fixtures" / "records"


def text(name: str) -> str:
    return (RECORDS / name).read_text(encoding="utf-8")


def test_an_old_state_loads_into_the_enums_and_is_written_again_unchanged():
    state = RunState.from_json(json.loads(text("state.json")))
    assert state.phase is Phase.UP
    assert [record.kind for record in state.processes] == [ProcessKind.SERVER, ProcessKind.SERVER, ProcessKind.STANDBY,
                                                           ProcessKind.TRAIN, ProcessKind.PROGRAM, ProcessKind.TENSORBOARD]
    assert all(type(record.kind) is ProcessKind for record in state.processes)
    assert json.dumps(state.to_json(), indent=1) == text("state.json")


def test_for_task_spells_the_keys_the_old_records_have():
    """The four key spellings that seven places wrote, now one constructor's."""
    old = RunState.from_json(json.loads(text("state.json"))).processes
    jobs = {"chief:0#j3.1": 3, "worker:0#j2.1": 2}
    for record in old:
        again = ProcessRecord.for_task(record.task, record.host, record.kind, record.attempt, record.log,
                                       job=jobs.get(record.key), events=record.events)
        assert (again.key, again.exit_file, again.kind, again.events) == \
            (record.key, record.exit_file, record.kind, record.events)
    assert [record.key for record in old] == ["ps:0#1", "worker:1#2", "chief:0#s1", "chief:0#j3.1", "worker:0#j2.1",
                                              "tensorboard#1"]
    assert ProcessRecord.for_task("chief:0", "h", "standby", 2, "/w/s.log").key == "chief:0#s2"   # given as its string
    with pytest.raises(ValueError, match="job"):
        ProcessRecord.for_task("worker:0", "h", ProcessKind.TRAIN, 1, "/w/x.log")


def test_next_attempt_counts_per_kind_and_per_job():
    state = RunState.from_json(json.loads(text("state.json")))
    assert state.next_attempt("worker:1", ProcessKind.SERVER) == 2        # worker:1#2 is its only server record
    assert state.next_attempt("ps:0", ProcessKind.SERVER) == 2
    assert state.next_attempt("chief:0", ProcessKind.STANDBY) == 2
    assert state.next_attempt("chief:0", ProcessKind.TRAIN, job=3) == 2
    assert state.next_attempt("chief:0", ProcessKind.TRAIN, job=4) == 1   # each job counts from 1
    assert state.next_attempt("worker:0", ProcessKind.PROGRAM, job=2) == 2
    assert state.next_attempt("tensorboard", ProcessKind.TENSORBOARD) == 2
    record = state.processes[3]
    assert record.in_job(3) and not record.in_job(33) and not state.processes[0].in_job(1)


@pytest.mark.parametrize("phase", ["starting", "up", "failed", "stopping", "down"])
def test_each_phase_literal_loads_as_its_member_and_writes_its_string(phase):
    document = dict(json.loads(text("state.json")), phase=phase)
    state = RunState.from_json(document)
    assert state.phase is Phase(phase) and isinstance(state.phase, StrEnum)
    assert json.dumps(state.to_json()["phase"]) == f'"{phase}"'
    assert f"{state.phase}" == phase                    # messages name the phase as before


def test_a_phase_no_pscluster_wrote_is_refused():
    with pytest.raises(ValueError):
        RunState.from_json(dict(json.loads(text("state.json")), phase="sideways"))


def test_phases_that_let_a_new_up_take_the_name():
    assert [phase for phase in Phase if phase.ended] == [Phase.FAILED, Phase.DOWN]


def test_the_store_writes_an_old_state_again_byte_for_byte(tmp_path):
    store = StateStore(tmp_path)
    state = RunState.from_json(json.loads(text("state.json")))
    store.save(state)                       # sets `updated`, the one value that may differ
    written = (tmp_path / "lab.json").read_text(encoding="utf-8")
    # Compact since issue 46 (json's C encoder, not its indenting pure-Python one): the same keys in
    # the same order with the same values, on one line.
    old = json.dumps(json.loads(text("state.json")))
    assert written == old.replace('"updated": 1700000001.5', f'"updated": {state.updated!r}')
    assert store.load("lab") == state
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lab.json"]     # no temporary left


def test_an_old_run_history_is_written_again_byte_for_byte(tmp_path):
    records = [RunRecord.from_json(item) for item in json.loads(text("history.json"))]
    assert [(record.id, record.state, record.exit_code) for record in records] == [(2, "stopped", 130), (3, "running", None)]
    history = RunHistory(tmp_path)
    for record in records:
        history.save(record)
    assert (tmp_path / "history" / "lab.json").read_text(encoding="utf-8") == text("history.json")
    assert history.load("lab") == records


def test_an_old_resize_request_and_its_answer_are_written_again_byte_for_byte(tmp_path):
    store = StateStore(tmp_path)
    request = ResizeRequest.from_json(json.loads(text("resize.json")))
    post_request(store, "lab", request)
    assert (tmp_path / f"lab{RESIZE_SUFFIX}").read_text(encoding="utf-8") == text("resize.json")
    assert take_request(store, "lab") == request
    post_result(store, "lab", ok=True, message="resized: 2 workers")
    assert (tmp_path / f"lab{RESULT_SUFFIX}").read_text(encoding="utf-8") == text("resize-result.json")


def test_the_private_writer_replaces_a_file_0600_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "x.json"
    target.write_text("old")
    os.chmod(target, 0o644)
    old = os.umask(0o022)
    try:
        write_private_json(target, {"a": [1, 2]}, indent=1)
    finally:
        os.umask(old)
    assert target.read_text() == '{\n "a": [\n  1,\n  2\n ]\n}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [path.name for path in tmp_path.iterdir()] == ["x.json"]


def test_the_file_lock_refuses_after_its_wait_and_waits_without_one(tmp_path):
    path = tmp_path / "c.lock"
    with file_lock(path):
        with pytest.raises(UsageError, match="busy"):
            with file_lock(path, wait=0, busy=lambda: UsageError("busy")):
                pass
        with pytest.raises(Exception, match="locked by another pscluster command"):
            with file_lock(path, wait=0.1):
                pass
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.exists()     # the lock file stays
    order: list[str] = []
    with file_lock(path):
        def take() -> None:
            with file_lock(path):
                order.append("waited")
        waiter = threading.Thread(target=take)
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive()            # blocked: wait=None waits until the lock is free
        order.append("released")
    waiter.join(5)
    assert order == ["released", "waited"]
