"""First round, item 17 (issue 25): logs and run folders were opened without O_NOFOLLOW and
without checking who owns the workdir, so in a shared workdir another user could plant a
symlink and redirect a task's log (as the task's user: into ~/.bashrc, say)."""
from __future__ import annotations

import os

import pytest

from roles import hostctl


def start(workdir, name="c1"):
    log = os.path.join(str(workdir), ".pscluster", name, "worker-0.log")
    return _call(hostctl.op_start, {
        "argv": ["true"], "env": {}, "cwd": str(workdir), "log": log, "token": "t1", "inherit_env": True}), log


def _call(operation, request):
    try:
        return operation(request)
    except Exception as exc:       # what hostctl.main reports
        return {"error": "%s: %s" % (type(exc).__name__, exc)}


def test_a_symlink_planted_for_the_log_is_not_followed(tmp_path):
    victim = tmp_path / "bashrc"
    victim.write_text("original\n")
    run = tmp_path / "work" / ".pscluster" / "c1"
    run.mkdir(parents=True)
    (run / "worker-0.log").symlink_to(victim)
    result, log = start(tmp_path / "work")
    assert "is a symlink" in result["error"]
    assert victim.read_text() == "original\n"


@pytest.mark.parametrize("planted", ["run_root", "cluster"])
def test_a_run_folder_that_is_a_symlink_is_refused(tmp_path, planted):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    work = tmp_path / "work"
    if planted == "run_root":
        work.mkdir()
        (work / ".pscluster").symlink_to(elsewhere)
    else:
        (work / ".pscluster").mkdir(parents=True)
        (work / ".pscluster" / "c1").symlink_to(elsewhere)
    result, _ = start(work)
    assert "is not a folder (a symlink?)" in result["error"]
    assert os.listdir(elsewhere) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_workdir_or_run_folder_of_another_user_is_refused(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, 54321, 54321)
    result, _ = start(work)
    assert "belongs to uid 54321" in result["error"]
    os.chown(work, 0, 0)
    (work / ".pscluster" / "c1").mkdir(parents=True, exist_ok=True)
    os.chown(work / ".pscluster", 54321, 54321)
    result, _ = start(work)
    assert "belongs to uid 54321" in result["error"] and ".pscluster" in result["error"]


@pytest.mark.parametrize("bits", [0o1777, 0o777, 0o775])
def test_a_workdir_others_can_write_is_refused_sticky_or_not(tmp_path, bits):
    """Issue 42, L2: a root-owned world-writable workdir (/tmp, /scratch, /dev/shm) was accepted;
    anyone there could create roles/ or .pscluster first and own what pscluster wrote into it."""
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(work, bits)
    result, _ = start(work)
    assert f"is writable by group or others (mode {bits:04o})" in result["error"]
    facts = hostctl.op_facts({"ports": [], "gpus": False, "workdir": str(work)})
    assert facts["workdir_error"] is None and "writable by group or others" in facts["workdir_unsafe"]
    os.chmod(work, 0o755)
    assert "error" not in start(work)[0]
    assert hostctl.op_facts({"ports": [], "gpus": False, "workdir": str(work)})["workdir_unsafe"] is None


def test_a_roles_task_does_not_import_what_lies_in_the_workdir(tmp_path):
    """Issue 42, L3: `python -m roles.X` put the workdir first on sys.path, so a json.py a `run`
    program left there shadowed the standard library in pscluster's own servers and trainers."""
    import json
    import sys
    import time
    work = tmp_path / "work"
    (work / "roles").mkdir(parents=True)
    (work / "roles" / "__init__.py").write_text("")
    report = tmp_path / "report.json"
    (work / "roles" / "show.py").write_text(
        "import json, sys, roles\n"
        f"open({str(report)!r}, 'w').write(json.dumps({{'json': json.__file__, 'roles': roles.__file__}}))\n")
    (work / "json.py").write_text("raise SystemExit('the workdir shadowed the standard library')\n")
    log = os.path.join(str(work), ".pscluster", "c1", "worker-0.log")
    result = _call(hostctl.op_start, {"argv": [sys.executable, "-m", "roles.show"], "env": {}, "cwd": str(work),
                                      "log": log, "token": "t1", "inherit_env": True})
    assert "error" not in result, result
    deadline = time.monotonic() + 30
    while not os.path.exists(log + ".exit") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert report.exists(), open(log).read()
    seen = json.loads(report.read_text())
    assert not seen["json"].startswith(str(work) + os.sep)
    assert os.path.realpath(seen["roles"]) == str((work / "roles" / "__init__.py").resolve())
    assert os.readlink(work / ".pscluster" / "path" / "roles") == os.path.join("..", "..", "roles")
