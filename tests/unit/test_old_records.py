"""Files written before the record-level names became enums (tests/fixtures/records, see its
README): they load into the enums and are written again byte for byte, so old state files,
run histories and resize requests keep working across the change (docs/architecture.md, Records)."""
from __future__ import annotations

import json

import pytest

from cluster.contracts import Phase, StrEnum
from cluster.state import RunState

from .conftest import REPO

RECORDS = REPO / "tests" / "fixtures" / "records"


def text(name: str) -> str:
    return (RECORDS / name).read_text(encoding="utf-8")


def test_an_old_state_loads_into_the_enums_and_is_written_again_unchanged():
    state = RunState.from_json(json.loads(text("state.json")))
    assert state.phase is Phase.UP
    assert json.dumps(state.to_json(), indent=1) == text("state.json")


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
