"""The epoch shown with an evaluation: the trainer's own, else scaled from the last progress."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from .conftest import idle_supervisor


@pytest.fixture
def supervisor(tmp_path):
    return idle_supervisor(tmp_path, name="ep", mode="async")


def _leader(sup):
    return SimpleNamespace(task=sup.kind.leader, last_event=0.0, started=True)


def test_the_trainers_epoch_is_shown_even_before_any_progress_event(supervisor):
    supervisor.kind.on_event(supervisor, _leader(supervisor), {"event": "eval", "step": 128, "val_loss": 0.2,
                                                               "val_accuracy": 0.95, "epoch": 0.2731}, now=100.0)
    (shown,) = supervisor.reporter.of("eval")
    assert (shown["step"], shown["epoch"], shown["seconds"]) == (128, 0.2731, 10.0)


def test_without_the_trainers_epoch_it_is_scaled_from_the_last_progress(supervisor):
    supervisor.set_job(step=100, epoch=0.5)
    supervisor.kind.on_event(supervisor, _leader(supervisor), {"event": "eval", "step": 150, "val_loss": 0.2,
                                                               "val_accuracy": 0.95}, now=100.0)
    (shown,) = supervisor.reporter.of("eval")
    assert shown["epoch"] == 0.75
