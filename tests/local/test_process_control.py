"""Starting and stopping processes on a host with the real ``roles/hostctl.py`` (local host,
real processes, no TensorFlow): escaping children, a stop that overtakes its start, private
logs, and ``down`` forced into the middle of ``up`` and ``run`` (PSCLUSTER_TEST_PAUSE).

Every test checks by PID and start time, in /proc, that nothing it started survives."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from cluster.hosts import hostops
from cluster.plan import HostSpec
from cluster.state import ProcessRecord
from cluster.transport.local import LocalTransport
from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base, run_cli
from testbed.procs import cluster_pids

LOCAL = REPO / "inventories" / "local.yaml"

# Forks two children that leave the task's process group: one by setpgid(), one by setsid()
# (the way daemons and some launchers do); both ignore SIGTERM. Prints their pids, then either
# waits or exits at once (leaving them orphaned).
ESCAPER = textwrap.dedent("""
    import os, signal, sys, time
    pids = []
    for how in ("setpgid", "setsid"):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.setpgid(0, 0) if how == "setpgid" else os.setsid()
            time.sleep(600)
            os._exit(0)
        pids.append(pid)
    with open(sys.argv[1] + ".tmp", "w") as handle:
        handle.write(" ".join(map(str, pids)))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    if sys.argv[2] == "wait":
        time.sleep(600)
""")


def local_transport(workdir) -> LocalTransport:
    return LocalTransport(HostSpec(name="localhost", address="127.0.0.1", connection="local", ssh_port=None,
                                   user=None, key_file=None, python=sys.executable, workdir=str(workdir),
                                   host_key_policy="accept-new", known_hosts=None, connect_timeout=10.0))


def record_for(log: str, key: str = "worker:0#1") -> ProcessRecord:
    return ProcessRecord(key=key, task="worker:0", host="localhost", kind="run", attempt=1, log=log,
                         exit_file=log + ".exit")


def start(transport, record: ProcessRecord, argv, cwd) -> dict:
    answer = hostops.call(transport, "start", {"argv": list(argv), "env": {}, "cwd": str(cwd), "log": record.log,
                                               "token": record.token})
    return answer


def starttime(pid: int) -> str | None:
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def wait_file(path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return open(path).read()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def assert_dead(identities: dict[int, str]) -> None:
    alive = {pid: st for pid, st in identities.items() if starttime(pid) == st}
    for pid in alive:          # clean up what the test started before failing
        os.kill(pid, 9)
    assert not alive, f"survived stop: {sorted(alive)}"


@pytest.mark.parametrize("task_waits", [True, False], ids=["task-running", "task-exited"])
def test_stop_ends_children_that_left_the_group_or_the_session(tmp_path, task_waits):
    transport = local_transport(tmp_path)
    record = record_for(str(tmp_path / ".pscluster" / "c" / "worker-0.log"))
    pids_file = tmp_path / "pids"
    started = start(transport, record, [sys.executable, "-c", ESCAPER, str(pids_file),
                                        "wait" if task_waits else "exit"], tmp_path)
    assert "error" not in started, started
    children = {int(pid): starttime(int(pid)) for pid in wait_file(pids_file).split()}
    assert all(children.values()), children
    if not task_waits:      # the task is gone; its escaped children are not
        deadline = time.monotonic() + 20
        while hostops.status(transport, [record])[record.key].state != "exited" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hostops.status(transport, [record])[record.key].state == "exited"
    result = hostops.stop(transport, [record], grace=1.0)[record.key]
    assert result.found and result.survivors == ()
    assert "SIGKILL" in result.signals          # they ignore SIGTERM: the kill phase reached them
    assert_dead(children)
    assert_dead({started["pgid"]: started["starttime"]})


def test_stop_that_overtakes_its_start_cancels_it(tmp_path):
    transport = local_transport(tmp_path)
    record = record_for(str(tmp_path / ".pscluster" / "c" / "worker-0.log"))
    # `down` reached the host first: no pid file yet. The stop must not call it "stopped" and
    # forget it: it cancels this start, which then spawns nothing.
    result = hostops.stop(transport, [record], grace=1.0)[record.key]
    assert result.cancelled and not result.found
    marker = tmp_path / "started-anyway"
    answer = start(transport, record, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path)
    assert answer.get("cancelled"), answer
    time.sleep(0.5)
    assert not marker.exists() and not os.path.exists(record.log + ".pid")
    # A later start of the same log (a new record, a new token) is not blocked by the old marker.
    later = record_for(record.log, key="worker:0#2")
    answer = start(transport, later, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path)
    assert "error" not in answer, answer
    wait_file(marker)
    # ... and a stale pid file of that earlier start is not taken for a newer record's.
    newest = record_for(record.log, key="worker:0#3")
    assert hostops.stop(transport, [newest], grace=1.0)[newest.key].cancelled


def test_logs_and_run_folders_are_private(tmp_path):
    transport = local_transport(tmp_path)
    run_dir = tmp_path / ".pscluster" / "c"
    run_dir.mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / ".pscluster", 0o755)
    log = run_dir / "job-1" / "worker-0.1.log"
    log.parent.mkdir(mode=0o755)
    log.write_text("old\n")
    os.chmod(log, 0o644)
    record = record_for(str(log))
    answer = start(transport, record, [sys.executable, "-c", "print('hello')"], tmp_path)
    assert "error" not in answer, answer
    wait_file(record.log + ".exit")
    for folder in (tmp_path / ".pscluster", run_dir, log.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


# ----------------------------------------------------------------------------- down forced into up / run

@pytest.fixture
def reap():
    """Names of clusters whose leftovers (processes this test started) are killed after the test,
    so a failing race test does not leave servers running for the next one."""
    names: list[str] = []
    yield names.append
    for name in names:
        for pid in cluster_pids(name):
            os.kill(pid, 9)


def wait_paused(flag, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(str(flag) + ".waiting"):
        if proc.poll() is not None:
            raise AssertionError(f"exited before the pause point ({proc.returncode}):\n{proc.communicate()[1]}")
        if time.monotonic() > deadline:
            raise AssertionError("never reached the pause point")
        time.sleep(0.05)


def down_at(point: str, args, *, name: str, state_dir, flag, seen=None) -> tuple[int, str]:
    """Run ``pscluster ARGS`` paused at ``point``, run ``down`` there, let it go on; returns its
    exit code and stderr. ``seen(state)`` inspects the state at the pause."""
    proc = subprocess.Popen(cli_argv(args), cwd=REPO, env=cli_env(state_dir, {"PSCLUSTER_TEST_PAUSE": f"{point}:{flag}"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_paused(flag, proc)
        if seen is not None:
            seen(json.loads((state_dir / f"{name}.json").read_text()))
        # A supervisor held at the pause cannot answer `down`'s stop; the stop from the records
        # after the wait is the path under test, so the wait is cut to 2 s (30 by default).
        down = run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir,
                       env={"PSCLUSTER_TEST_SUPERVISOR_MARGIN": "2"})
        assert down.returncode == 0, down.stderr
        flag.touch()
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr


def test_down_between_record_and_start_of_up_leaves_nothing(tmp_path, reap):
    """`up` saved its records and is about to start the servers on the host when `down` runs.

    Before the fix `down` found no pid file, marked the records stopped and deleted the state;
    `up` then started the servers, got "taken down by another command" and left them running,
    recorded nowhere."""
    name, state_dir = "race-up", tmp_path / "state"
    reap(name)
    records = []

    def seen(state):
        records.extend(state["processes"])
        assert len(records) == 4 and all(r["pid"] is None for r in records)   # ps:0, ps:1, worker:0, worker:1

    code, stderr = down_at("before-start", ["up", LOCAL, "--name", name, "--port-base", port_base()], name=name,
                           state_dir=state_dir, flag=tmp_path / "go", seen=seen)
    assert code == 1 and "taken down by another command" in stderr, stderr
    assert not (state_dir / f"{name}.json").exists()      # down's outcome stands: up rewrote nothing
    for record in records:                                # and no server was ever spawned
        written = json.loads(open(record["log"] + ".pid").read()) if os.path.exists(record["log"] + ".pid") else {}
        assert written.get("token") != record["token"], record["log"]
    assert_no_survivors(name)


def test_down_between_start_and_record_of_up_leaves_nothing(tmp_path, reap):
    """The servers run on the host, their pids are not saved yet, and `down` runs."""
    name, state_dir = "race-up2", tmp_path / "state"
    reap(name)
    code, stderr = down_at("after-start", ["up", LOCAL, "--name", name, "--port-base", port_base()], name=name,
                           state_dir=state_dir, flag=tmp_path / "go")
    assert code == 1 and "taken down by another command" in stderr, stderr
    assert not (state_dir / f"{name}.json").exists()
    assert_no_survivors(name)


def test_down_between_record_and_start_of_a_run_program(tmp_path, reap):
    """The same race for `pscluster run` (one shot): its program start is overtaken by `down`."""
    name, state_dir = "race-run", tmp_path / "state"
    reap(name)
    code, stderr = down_at("before-start", ["run", LOCAL, "--name", name, "--port-base", port_base(), "--on", "worker",
                                            "--", "python", "-c", "import time; time.sleep(600)"],
                           name=name, state_dir=state_dir, flag=tmp_path / "go")
    assert code != 0, stderr
    assert not (state_dir / f"{name}.json").exists()
    assert_no_survivors(name)


def test_run_program_whose_child_escapes_the_session_is_stopped(tmp_path, reap):
    """`pscluster run`'s program forks children into a new process group and a new session
    and exits; the run's take-down must still end them (before: "survived SIGKILL"/leaked)."""
    name, state_dir = "escape-run", tmp_path / "state"
    reap(name)
    pids_file = tmp_path / "pids"
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--on", "worker", "--",
                    "python", str(script), f"{pids_file}-{{task_index}}", "exit"], state_dir=state_dir, timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        children = {}
        for index in (0, 1):
            path = f"{pids_file}-{index}"
            if os.path.exists(path):
                children.update({int(pid): None for pid in open(path).read().split()})
        survivors = [pid for pid in children if starttime(pid)]
        for pid in survivors:
            os.kill(pid, 9)
    assert len(children) == 4 and not survivors, survivors
    assert_no_survivors(name)
