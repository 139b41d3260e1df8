"""The hand-over between hostctl and a standby (roles/hostctl.py ``adopt``, roles/standby.py),
with real processes and a stand-in ``tensorflow`` package on PYTHONPATH so that no test here
waits for the real import (tests/local/test_standby.py runs it with TensorFlow end to end).

The standby is started as hostctl starts every task (a monitor, pid file, exit file); then
``adopt`` requests go through its FIFO: one it accepts (its process becomes the task, under
the new log and token), one it must decline (another import-time environment), and one whose
TensorFlow import failed."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from roles import hostctl
from tests.helpers import REPO

FAKE_TF = '''
import os, time
__version__ = "0.0-standin"
if os.environ.get("STANDIN_TF_BROKEN"):
    raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")
'''


@pytest.fixture
def env(tmp_path):
    (tmp_path / "site" / "tensorflow").mkdir(parents=True)
    (tmp_path / "site" / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    return {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
            "TF_CONFIG": json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                                                 "worker": ["127.0.0.1:3"]},
                                     "task": {"type": "chief", "index": 0}})}


def _wait(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def start_standby(tmp_path, env, name="chief-0.1"):
    log = str(tmp_path / "standby" / f"{name}.log")
    argv = [sys.executable, "-m", "roles.standby", "--fifo", log + ".fifo", "--ready", log + ".ready"]
    record = hostctl.op_start({"argv": argv, "env": env, "cwd": str(REPO), "log": log, "token": "s1",
                               "inherit_env": True})
    assert "error" not in record, record
    _wait(lambda: os.path.exists(log + ".fifo"), "the standby's FIFO")
    # Listening: blocked opening its FIFO for the next request (a request before that finds
    # nobody to read it, as a standby that is frozen or gone would).
    _wait(lambda: _blocked_on_a_fifo(record["pid"]), "the standby listens on its FIFO")
    return dict(record, key="chief:0#s1", fifo=log + ".fifo")


def _blocked_on_a_fifo(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as handle:
            return handle.read().strip() == "wait_for_partner"      # the kernel's fifo_open wait
    except OSError:
        return False


def adopt(tmp_path, standby, env, job="job-1"):
    log = str(tmp_path / job / "chief-0.1.log")
    events = str(tmp_path / job / "chief-0.1.events.jsonl")
    argv = [sys.executable, "-m", "roles.train", "--mode", "async", "--job", str(tmp_path / "nojob.py"),
            "--events", events, "--start-timeout", "30"]
    answer = hostctl.op_adopt({"argv": argv, "env": env, "cwd": str(REPO), "log": log, "token": "t1",
                               "fresh": [events], "standby": standby})
    return answer, log, events


def gone(pid: int) -> bool:
    stat = hostctl._proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def test_an_accepted_job_runs_in_the_standbys_process(tmp_path, env):
    standby = start_standby(tmp_path, env)
    _wait(lambda: os.path.exists(tmp_path / "standby" / "chief-0.1.log.ready"), "TensorFlow 'imported'")
    answer, log, events = adopt(tmp_path, standby, env)
    assert answer["pid"] == answer["adopted"] == standby["pid"], answer
    assert answer["pgid"] == standby["pgid"] and answer["exit_file"] == standby["exit_file"]
    assert answer["log"] == log and answer["token"] == "t1"
    assert json.load(open(log + ".pid"))["pid"] == standby["pid"]          # `down` finds it by the new log too
    assert not os.path.exists(log + ".adopt") and not os.path.exists(standby["fifo"])
    # It runs roles.train from the split on: the job file is missing, so the trainer reports that
    # in the new events file and the task exits 2 (the monitor records it in the standby's exit file).
    _wait(lambda: os.path.exists(standby["exit_file"]), "the trainer's exit")
    assert json.load(open(standby["exit_file"]))["exit_code"] == 2
    error = [json.loads(line) for line in open(events)][-1]
    assert error["event"] == "error" and "nojob.py" in error["message"]
    text = open(log).read()
    assert text.startswith("pscluster: ") and f"standby pid {standby['pid']}: TensorFlow already imported" in text
    assert f"standby pid {standby['pid']} runs this job" in text


def test_another_import_time_environment_is_declined_and_the_standby_is_gone(tmp_path, env):
    standby = start_standby(tmp_path, env)
    answer, log, _ = adopt(tmp_path, standby, dict(env, OMP_NUM_THREADS="2", SECRET_TOKEN="s3cr3t"))
    assert answer == {"declined": "the environment TensorFlow reads at import differs in OMP_NUM_THREADS"}
    _wait(lambda: gone(standby["pid"]), "the declined standby ends")
    assert "s3cr3t" not in open(standby["log"]).read() and not os.path.exists(log + ".pid")


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` has taken the stop. /proc/PID/stat is the main thread only: a thread
    blocked in the FIFO's open keeps counting as its reader until it is scheduled and takes the
    stop itself, which on a loaded machine can come well after the main thread's "T"."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as handle:
                states.append(handle.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue        # a thread that ended
    return bool(states) and all(state in ("T", "t") for state in states)


def _children_ended(pid: int) -> bool:
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    return all(gone(int(child)) for child in children)


def test_a_standby_whose_import_failed_declines(tmp_path, env):
    standby = start_standby(tmp_path, dict(env, STANDIN_TF_BROKEN="1"))
    _wait(lambda: "cannot open shared object file" in open(standby["log"]).read(), "the failed import")
    _wait(lambda: _children_ended(standby["pid"]), "the importing child ends")
    answer, _, _ = adopt(tmp_path, standby, dict(env, STANDIN_TF_BROKEN="1"))
    assert answer["declined"].startswith("its TensorFlow process ended (exit code 1)"), answer
    _wait(lambda: gone(standby["pid"]), "the standby ends")


def test_no_listener_is_declined_at_once(tmp_path, env):
    standby = start_standby(tmp_path, env)
    os.kill(standby["pid"], 19)       # SIGSTOP: its blocking open of the FIFO is interrupted
    try:
        # Stopped ("T") only once it woke, left its open of the FIFO (no reader then) and took the
        # stop: every thread of it, since the open may be in any of them.
        _wait(lambda: _all_threads_stopped(standby["pid"]), "every thread of the standby is stopped")
        began = time.monotonic()
        answer, _, _ = adopt(tmp_path, standby, env)
        assert answer == {"declined": "the standby is not listening"} and time.monotonic() - began < 5
        _wait(lambda: gone(standby["pid"]), "the frozen standby is killed")
    finally:
        if not gone(standby["pid"]):
            os.kill(standby["pid"], 9)
