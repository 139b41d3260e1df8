"""Files written before the record-level names became enums (tests/fixtures/records, see its
README): they load into the enums and are written again byte for byte, so old state files,
run histories and resize requests keep working across the change (docs/architecture.md, Records)."""
from __future__ import annotations

import json

import pytest

from cluster.contracts import Phase, ProcessKind, StrEnum
from cluster.state import ProcessRecord, RunState

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
