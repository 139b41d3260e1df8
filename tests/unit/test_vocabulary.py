"""One vocabulary: the names cluster/ and roles/ share are declared once on each side, and roles/
(which never imports cluster/) keeps its own copies equal to cluster.contracts'."""
from __future__ import annotations

import dataclasses

import pytest

from cluster.contracts import DEFAULT_MODE, DEFAULT_STOP_GRACE, MODES, ExitStatus, Mode, resolve_mode
from roles import settings as trainer_plan
from roles import train as trainer


def test_roles_knows_the_same_modes():
    assert trainer_plan.MODES == MODES == tuple(mode.value for mode in Mode)


def test_roles_has_the_same_default_stop_grace():
    fields = {f.name: f.default for f in dataclasses.fields(trainer_plan.TrainOptions)}
    assert fields["stop_grace"] == DEFAULT_STOP_GRACE


def test_trainer_exit_codes_are_the_commands_exit_codes():
    assert (trainer.EXIT_OK, trainer.EXIT_FAILED, trainer.EXIT_USAGE) == (
        ExitStatus.OK, ExitStatus.FAILURE, ExitStatus.BAD_INPUT)


@pytest.mark.parametrize(("given", "expected"), [
    ((None, None), DEFAULT_MODE.value),
    ((None, "sync"), "sync"),
    (("sync-ps", "sync"), "sync-ps"),
    (("between-graph", None), "sync-ps"),
    ((None, "between-graph"), "sync-ps"),
    (("", "sync"), "sync"),
])
def test_the_mode_is_resolved_once(given, expected):
    assert resolve_mode(*given) == expected


def test_exit_statuses_print_as_numbers():
    assert f"{ExitStatus.DEADLINE}" == "4" and str(ExitStatus.BAD_INPUT) == "2"
