"""Checkpoint on stop, the process side without TensorFlow: the guardian of roles/guardian.py
forwards SIGTERM as a stop request within --stop-grace, and `train --deadline` parses durations."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import click
import pytest

from cluster.cli import DurationParam
from tests.helpers import REPO

TRAINER = textwrap.dedent("""
    import sys, time
    from roles.guardian import split
    import signal
    marker, grace, finish = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "finish"
    link = split(60, "the first step", lambda m, e: print("report:", e, m, flush=True), stop_grace=grace)
    if len(sys.argv) > 4:     # as sync mode's coordination service does: SIGTERM no longer reaches Python
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    link.disarm()
    open(marker + ".ready", "w").close()
    end = time.monotonic() + 30
    while not link.stop_requested and time.monotonic() < end:
        time.sleep(0.02)
    open(marker + ".saved", "w").write(link.stop_reason)   # "the checkpoint"
    if finish:
        link.finished()
        sys.exit(143)
    time.sleep(60)                                         # a save that never ends
""")


def run_trainer(tmp_path, grace: float, finish: bool, *extra: str) -> tuple[int, str, float]:
    marker = str(tmp_path / "t")
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, marker, str(grace), "finish" if finish else "hang", *extra],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 30
        while not os.path.exists(marker + ".ready"):
            assert proc.poll() is None and time.monotonic() < end
            time.sleep(0.02)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)             # to the guardian only, as `kill PID` would
        out, _ = proc.communicate(timeout=30)
        return proc.returncode, out, time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_is_a_stop_request_when_there_is_a_grace(tmp_path):
    code, out, _ = run_trainer(tmp_path, grace=10, finish=True)
    assert code == 143 and (tmp_path / "t.saved").read_text() == "SIGTERM"
    assert "report:" not in out                      # the trainer reported for itself


def test_the_stop_request_reaches_a_trainer_whose_sigterm_tensorflow_took_over(tmp_path):
    """Sync mode: the guardian asks with SIGUSR1, which the coordination service leaves alone."""
    code, out, _ = run_trainer(tmp_path, 10, True, "sigterm-taken")
    assert code == 143 and (tmp_path / "t.saved").read_text() == "SIGTERM", out
    assert "report:" not in out


def test_a_trainer_still_saving_after_the_grace_is_killed(tmp_path):
    code, out, seconds = run_trainer(tmp_path, grace=1, finish=False)
    assert code == 143 and (tmp_path / "t.saved").exists()
    assert 0.9 <= seconds < 10 and "report: Terminated" in out


def test_without_a_grace_sigterm_kills_at_once(tmp_path):
    code, out, _ = run_trainer(tmp_path, grace=0, finish=True)
    assert code == 143 and not (tmp_path / "t.saved").exists()
    assert "report: Terminated" in out


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("45m", 2700), ("2h", 7200), ("1.5d", 129600)])
def test_durations(text, seconds):
    assert DurationParam().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["", "h", "2x", "-5m", "0s", "soon",
                                  "nans", "nan", "infs", "inf", "-inf", "1e400s", "1e400", "400d", "1e9"])  # N9
def test_bad_durations_say_how_to_write_one(text):
    with pytest.raises(click.BadParameter, match="duration"):
        DurationParam().convert(text, None, None)


def test_supervisor_margin_is_30_s_unless_a_test_sets_it(monkeypatch):
    from cluster.supervision.jobstop import SUPERVISOR_MARGIN, supervisor_margin

    monkeypatch.delenv("PSCLUSTER_TEST_SUPERVISOR_MARGIN", raising=False)
    assert supervisor_margin() == SUPERVISOR_MARGIN == 30.0
    monkeypatch.setenv("PSCLUSTER_TEST_SUPERVISOR_MARGIN", "2")
    assert supervisor_margin() == 2.0
    for bad, expected in (("-5", 0.0), ("soon", 30.0)):
        monkeypatch.setenv("PSCLUSTER_TEST_SUPERVISOR_MARGIN", bad)
        assert supervisor_margin() == expected
