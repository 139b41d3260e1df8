"""SIGTERM/SIGHUP inside a command become :class:`Terminated` (a KeyboardInterrupt, so every
Ctrl-C clean-up runs) once; a second one does not cut the clean-up short; handlers are restored."""
from __future__ import annotations

import os
import signal

import pytest

from cluster.cli import base as cli      # run, _run and the handlers live there
from cluster.errors import Terminated


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_termination_signal_raises_terminated_once_and_handlers_are_restored(sig):
    before = signal.getsignal(sig)
    cleaned_up = False
    with cli._terminations_interrupt() as received:
        with pytest.raises(KeyboardInterrupt) as caught:
            os.kill(os.getpid(), sig)
        os.kill(os.getpid(), sig)      # during the clean-up: ignored
        cleaned_up = True
    assert isinstance(caught.value, Terminated) and caught.value.signum == sig
    assert str(caught.value) == f"terminated by {sig.name}"
    assert received == [sig] and cleaned_up
    assert signal.getsignal(sig) == before


def test_run_exits_128_plus_the_signal_after_the_command_cleaned_up(monkeypatch):
    steps = []

    def command(argv, env):       # a command that cleans up on KeyboardInterrupt, as up/train/run do
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()
        except KeyboardInterrupt:
            steps.append("cleaned up")
            return 130
        return 0

    monkeypatch.setattr(cli, "_run", command)
    assert cli.run(["up", "x.yaml"]) == 143
    assert steps == ["cleaned up"]
