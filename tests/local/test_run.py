"""``pscluster run`` end to end on this machine: the three example programs of examples/byo/
(real TensorFlow), a failing worker, Ctrl-C, a restart, a killed orchestrator, bad input.

Every test ends by asserting that no process carrying its cluster's name survives."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests.helpers import module_cluster, REPO, accuracy_in, assert_no_survivors, cli_argv, cli_env, port_base, run_cli, run_json
from testbed.procs import cluster_pids

LOCAL = REPO / "inventories" / "local.yaml"
TF1 = ["python", "examples/byo/tf1_flags.py", "--ps_hosts={ps_hosts}", "--worker_hosts={worker_hosts}",
       "--job_name={job_name}", "--task_index={task_index}"]

def tasks_of(report: dict) -> dict[str, dict]:
    return {f"{t['role']}:{t['index']}": t for t in report["tasks"]}


def state_of(state_dir, name: str) -> dict:
    try:
        return json.loads((state_dir / f"{name}.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:     # gone, or gone between the open and the read (ESRCH)
        return False


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# ----------------------------------------------------------------------------- the three programs (TensorFlow)

@pytest.mark.tf
@pytest.mark.extended
def test_tf1_flags_script_one_shot_ends_its_parameter_servers(tmp_path, cleanup):
    """Extended since issue 47: tests/lab/test_run_lab.py runs the same script one shot on three
    hosts and checks every fact here (the ps stopped, the workers' exit codes and accuracy, the
    prefixed output, the cluster gone); ``--on`` runs end to end in test_process_control.py,
    test_secret_scope.py and test_signals.py."""
    name, state_dir = "run-tf1", tmp_path / "state"
    cleanup(name, state_dir)
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--on", "ps,worker", "--json", "--",
                    *TF1, "--steps", "400"], state_dir=state_dir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    tasks = tasks_of(report)
    assert sorted(tasks) == ["ps:0", "ps:1", "worker:0", "worker:1"] and report["exit_code"] == 0
    assert tasks["worker:0"]["exit_code"] == 0 and tasks["worker:1"]["exit_code"] == 0
    # The ps never exit by themselves (server.join()): run stopped them once the workers were done.
    assert tasks["ps:0"]["state"] == tasks["ps:1"]["state"] == "stopped"
    assert accuracy_in(proc.stderr, "worker:0") >= 0.90
    assert "[ps:1@localhost]" in proc.stderr                        # every task's output, prefixed
    assert not (state_dir / f"{name}.json").exists()               # one shot: the cluster is gone


@pytest.mark.tf
def test_tf_config_mirrored_script_on_a_sync_cluster(tmp_path, cleanup):
    name, state_dir = "run-mwms", tmp_path / "state"
    cleanup(name, state_dir)
    up = run_cli(["up", LOCAL, "--name", name, "--mode", "sync", "--port-base", port_base()], state_dir=state_dir)
    assert up.returncode == 0, up.stderr
    proc = run_cli(["run", "--name", name, "--json", "--", "python", "examples/byo/tf2_mwms.py", "--steps", "300"],
                   state_dir=state_dir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert sorted(tasks_of(report)) == ["worker:0", "worker:1"]       # sync: every worker runs the file
    assert all(task["exit_code"] == 0 for task in report["tasks"])
    assert accuracy_in(proc.stderr, "worker:0") >= 0.90
    status = run_json(["status", "--name", name], state_dir=state_dir)
    assert status["job"]["entry"] == "run" and status["job"]["state"] == "done"
    down = run_cli(["down", "--name", name], state_dir=state_dir)
    assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def async_up(tmp_path_factory):
    """One async cluster `up` for the module's runs on an up cluster (the coordinator, then the
    Ctrl-C that must keep its servers, which ends with its `down`). Down at the end if left up,
    and nothing left."""
    yield from module_cluster(tmp_path_factory, "run-up")


@pytest.mark.tf
def test_ps_coordinator_runs_on_the_chief_of_an_async_cluster(async_up):
    name, state_dir = async_up
    proc = run_cli(["run", "--name", name, "--json", "--", "python", "examples/byo/tf2_ps_coordinator.py",
                    "--steps", "400"], state_dir=state_dir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert list(tasks_of(report)) == ["chief:0"] and report["tasks"][0]["exit_code"] == 0
    assert accuracy_in(proc.stderr, "chief:0") >= 0.90
    status = run_json(["status", "--name", name], state_dir=state_dir)
    servers = [t for t in status["tasks"] if t["kind"] == "server"]
    assert servers and all(t["state"] == "ready" for t in servers)   # the standing servers stay up


@pytest.mark.tf
def test_the_same_binary_on_every_task_ends_when_its_chief_exits(tmp_path, cleanup):
    """TF's ParameterServerStrategy tutorial, "the same binary for all tasks": ps and workers sit
    in server.join() for ever; the run is over when the chief exits (it waited silently before).
    The chief trains as the tutorial's "Training with Model.fit" does (``--fit``:
    ``model.fit(tf.keras.utils.experimental.DatasetCreator(...))``, Keras 2 names, so
    ``--keras legacy``: issue 45 item 5); the custom loop is the test above's."""
    name, state_dir = "run-same", tmp_path / "state"
    cleanup(name, state_dir)
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--keras", "legacy", "--json", "--",
                    "python", "examples/byo/tf2_ps_coordinator.py", "--fit", "--epochs", "2", "--steps", "400"],
                   state_dir=state_dir, timeout=900)                 # a safety net: the run ends by itself
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    tasks = tasks_of(report)
    assert tasks["chief:0"]["state"] == "exited" and tasks["chief:0"]["exit_code"] == 0 and report["exit_code"] == 0
    assert {task: t["state"] for task, t in tasks.items() if task != "chief:0"} == \
        {"ps:0": "stopped", "ps:1": "stopped", "worker:0": "stopped", "worker:1": "stopped"}
    assert "chief:0 finished (--until chief): the run is over; stopping" in proc.stderr
    assert accuracy_in(proc.stderr, "chief:0") >= 0.90
    assert not (state_dir / f"{name}.json").exists()


@pytest.mark.tf
@pytest.mark.extended
def test_on_failure_restarts_a_killed_worker(tmp_path, cleanup):
    name, state_dir = "run-restart", tmp_path / "state"
    cleanup(name, state_dir)
    # A budget long enough that worker:1 is still training when it is killed (it logs first at its
    # 100th local step; 700 steps could be over by the time the test looked, on a quiet machine).
    proc = subprocess.Popen(cli_argv(["run", LOCAL, "--name", name, "--port-base", port_base(), "--on", "ps,worker",
                                      "--restart-policy", "on-failure", "--json", "--", *TF1, "--steps", "3000"]),
                            cwd=REPO, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        def training_worker():
            records = [r for r in state_of(state_dir, name).get("processes", [])
                       if r["task"] == "worker:1" and r["kind"] == "run" and r["pid"] and not r["stopped"]]
            if records and os.path.exists(records[-1]["log"]) and "global step" in open(records[-1]["log"]).read():
                return records[-1]
            return None

        record = wait_for(training_worker, 300, "worker:1 to train")
        os.kill(record["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-4000:]
    tasks = tasks_of(json.loads(out))
    assert tasks["worker:1"]["restarts"] == 1 and tasks["worker:1"]["exit_code"] == 0
    assert "task-restarted: worker:1@localhost" in err


# ----------------------------------------------------------------------------- failures and signals (no TensorFlow)

PROGRAM = textwrap.dedent('''
    import os, sys, time
    task = os.environ["PSCLUSTER_TASK_TYPE"] + ":" + os.environ["PSCLUSTER_TASK_INDEX"]
    print("started", task, *sys.argv[1:], flush=True)
    if task == os.environ.get("FAIL_TASK"):
        time.sleep(1)
        print("cannot go on: disk full", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("SLEEP", "600")))
''')


def program_dir(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "prog.py").write_text(PROGRAM)
    return folder


def local_inventory(tmp_path, file: str = "local.yaml", **env) -> str:
    """local.yaml with extra environment for every task."""
    text = LOCAL.read_text()
    lines = "".join(f"      {key}: \"{value}\"\n" for key, value in env.items())
    text = text.replace("    pscluster_env:\n", "    pscluster_env:\n" + lines, 1)
    path = tmp_path / file
    path.write_text(text)
    return str(path)


def test_a_failing_worker_fails_the_run_with_its_exit_code_and_log(tmp_path, cleanup):
    name, state_dir = "run-fail", tmp_path / "state"
    cleanup(name, state_dir)
    inventory = local_inventory(tmp_path, FAIL_TASK="worker:1")
    proc = run_cli(["run", inventory, "--name", name, "--port-base", port_base(), "--json", "--", "python", "prog.py"],
                   state_dir=state_dir, cwd=program_dir(tmp_path), timeout=300)
    assert proc.returncode == 1
    error = proc.stderr[proc.stderr.index("error: "):]
    assert error.startswith("error: run failed (restart policy 'never'): worker:1@localhost: exited with code 3")
    assert "cannot go on: disk full" in error                       # its log tail
    report = json.loads(proc.stdout)
    assert report["exit_code"] == 1
    tasks = tasks_of(report)
    assert tasks["worker:1"]["exit_code"] == 3 and tasks["worker:0"]["state"] == "stopped"
    assert not (state_dir / f"{name}.json").exists()


def test_min_workers_a_failing_worker_drops_out_and_the_run_goes_on(tmp_path, cleanup):
    """`run --min-workers 1`: worker:1 fails for good (policy never); the run goes on with
    worker:0, whose clean exit ends it (exit 0). Asking for 2 fails as without the option, and more
    workers than run the program is refused before anything starts."""
    name, state_dir = "run-elastic", tmp_path / "state"
    cleanup(name, state_dir)
    project = program_dir(tmp_path)
    inventory = local_inventory(tmp_path, FAIL_TASK="worker:1", SLEEP="4")

    def one_shot(*extra):
        return run_cli(["run", inventory, "--name", name, "--port-base", port_base(), "--on", "worker", "--json",
                        *extra, "--", "python", "prog.py"], state_dir=state_dir, cwd=project, timeout=300)

    proc = one_shot("--min-workers", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert "resized (worker:1 failed (exited with code 3)): worker:1 dropped out; 2 -> 1 worker(s) go on" in said, said
    tasks = tasks_of(json.loads(proc.stdout))
    assert tasks["worker:1"]["state"] == "dropped" and tasks["worker:0"]["exit_code"] == 0, tasks
    refused = one_shot("--min-workers", "2")
    assert refused.returncode == 1 and "cannot go on without worker:1: 1 worker(s) would remain" in refused.stderr
    too_many = one_shot("--min-workers", "3")
    assert too_many.returncode == 2 and "--min-workers 3 is larger than the 2 worker(s)" in too_many.stderr
    assert "Traceback" not in too_many.stderr and not (state_dir / f"{name}.json").exists()


def test_a_hard_coded_task_index_is_warned_before_the_run_starts(tmp_path, cleanup):
    """Issue 24 item 7 through a real one-shot run: two workers get the same command line."""
    name, state_dir = "run-same-argv", tmp_path / "state"
    cleanup(name, state_dir)
    proc = run_cli(["run", local_inventory(tmp_path, SLEEP="0"), "--name", name, "--port-base", port_base(),
                    "--on", "worker", "--", "python", "prog.py", "--task_index=0"],
                   state_dir=state_dir, cwd=program_dir(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "worker:0 and worker:1 get the same command line" in said and "{task_index}" in said, said
    assert said.index("same command line") < said.index("▸ run python prog.py"), said   # before anything starts


def test_every_one_shot_run_keeps_its_own_logs(tmp_path, cleanup):
    """Runs of one name count up (job-1, job-2, ...): each run's logs stay readable after its
    cluster is gone, an error quotes its own run's log, and --keep removes the oldest."""
    name, state_dir = "run-logs", tmp_path / "state"
    cleanup(name, state_dir)
    project = program_dir(tmp_path)
    done, failing = local_inventory(tmp_path, SLEEP="0"), local_inventory(tmp_path, "fail.yaml", SLEEP="0",
                                                                          FAIL_TASK="worker:1")

    def one_shot(inventory, word, *extra):
        return run_cli(["run", inventory, "--name", name, "--port-base", port_base(), "--on", "worker", *extra,
                        "--", "python", "prog.py", word], state_dir=state_dir, cwd=project, timeout=300)

    for word in ("first", "second"):
        proc = one_shot(done, word)
        assert proc.returncode == 0, proc.stderr
    for run, word in ((1, "first"), (2, "second")):
        shown = run_cli(["logs", "--name", name, "--run", run, "worker:1"], state_dir=state_dir, check=True)
        assert f"started worker:1 {word}\n" in shown.stdout and "second" not in shown.stdout.replace(word, "")
    newest = run_cli(["logs", "--name", name], state_dir=state_dir, check=True)     # the cluster is gone
    assert "[worker:0@localhost] started worker:0 second" in newest.stdout
    failed = one_shot(failing, "third", "--keep", "2")
    assert failed.returncode == 1
    assert f"/.pscluster/{name}/job-3/worker-1.1.log" in failed.stderr      # its own run's log
    assert f"'pscluster logs --name {name} --run 3' shows every task's log of this run" in failed.stderr
    runs = {r["run"]: r for r in run_json(["runs", "--name", name], state_dir=state_dir)}
    assert sorted(runs) == [2, 3]                                            # --keep 2: run 1 is gone
    assert [runs[2]["command"], runs[2]["exit_code"], runs[3]["exit_code"]] == [["python", "prog.py", "second"], 0, 1]
    assert not (REPO / ".pscluster" / name / "job-1").exists() and (REPO / ".pscluster" / name / "job-2").is_dir()
    gone = run_cli(["logs", "--name", name, "--run", "1"], state_dir=state_dir)
    assert gone.returncode == 2 and "has no run 1" in gone.stderr and "Traceback" not in gone.stderr
    run_cli(["clean", "--name", name], state_dir=state_dir, check=True)
    assert not (REPO / ".pscluster" / name / "job-3").exists()
    assert run_cli(["runs", "--name", name], state_dir=state_dir).returncode == 2


def test_ctrl_c_stops_every_process_of_a_one_shot_run(tmp_path, cleanup):
    name, state_dir = "run-int", tmp_path / "state"
    cleanup(name, state_dir)
    proc = subprocess.Popen(cli_argv(["run", LOCAL, "--name", name, "--port-base", port_base(), "--", "python",
                                      "prog.py"]), cwd=program_dir(tmp_path), env=cli_env(state_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(cluster_pids(name)) >= 5 and len([r for r in state_of(state_dir, name).get("processes", [])
                                                           if r["pid"]]) == 5, 120, "five programs")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "run interrupted" in err
    assert not (state_dir / f"{name}.json").exists()
    assert_no_survivors(name)


@pytest.mark.tf
def test_ctrl_c_during_a_run_on_an_up_cluster_keeps_the_standing_servers(async_up, tmp_path):
    """On the cluster the coordinator ran on: a Ctrl-C ends the run, not the servers; then `down`."""
    name, state_dir = async_up
    servers = {r["key"]: r["pid"] for r in state_of(state_dir, name)["processes"] if r["kind"] == "server"}
    assert len(servers) == 4                                        # ps:0, ps:1, worker:0, worker:1 (async)
    proc = subprocess.Popen(cli_argv(["run", "--name", name, "--", "python", "prog.py"]), cwd=program_dir(tmp_path),
                            env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def running_programs():
            records = [r for r in state_of(state_dir, name).get("processes", [])
                       if r["kind"] == "run" and r["pid"] and not r["stopped"]]      # not the coordinator's
            return records if records and all(os.path.exists(r["log"]) and "started" in open(r["log"]).read()
                                               for r in records) else None

        programs = wait_for(running_programs, 120, "the program to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert [r["task"] for r in programs] == ["chief:0"]             # async: the task without a server
    for record in programs:                                         # the program is gone ...
        assert not _running(record["pid"]), record
    state = state_of(state_dir, name)
    assert state["phase"] == "up"
    assert all(r["stopped"] for r in state["processes"] if r["kind"] == "run")
    status = run_json(["status", "--name", name], state_dir=state_dir)
    rows = {f"{t['role']}:{t['index']}": t for t in status["tasks"] if t["kind"] == "server"}
    assert {task: row["state"] for task, row in rows.items()} == \
        {"ps:0": "ready", "ps:1": "ready", "worker:0": "ready", "worker:1": "ready"}   # ... the servers stay up
    assert sorted(row["pid"] for row in rows.values()) == sorted(servers.values())     # the same processes
    down = run_cli(["down", "--name", name], state_dir=state_dir)
    assert down.returncode == 0, down.stderr
    assert not (state_dir / f"{name}.json").exists()
    assert_no_survivors(name)


def test_down_stops_a_run_whose_orchestrator_was_killed(tmp_path, cleanup):
    name, state_dir = "run-orphan", tmp_path / "state"
    cleanup(name, state_dir)
    proc = subprocess.Popen(cli_argv(["run", LOCAL, "--name", name, "--port-base", port_base(), "--", "python",
                                      "prog.py"]), cwd=program_dir(tmp_path), env=cli_env(state_dir),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: len([r for r in state_of(state_dir, name).get("processes", []) if r["pid"]]) == 5, 120,
             "five programs")
    proc.kill()                       # SIGKILL: no cleanup at all
    proc.wait()
    assert len(cluster_pids(name)) >= 5
    status = run_json(["status", "--name", name], state_dir=state_dir)
    assert status["job"]["entry"] == "run" and {t["state"] for t in status["tasks"]} == {"running"}
    down = run_cli(["down", "--name", name], state_dir=state_dir)
    assert down.returncode == 0, down.stderr
    assert_no_survivors(name)


@pytest.mark.parametrize("args, message", [
    (["--", "python", "missing.py"], "localhost: missing.py does not exist in "),
    (["--on", "evaluator", "--", "python", "prog.py"], "defines no evaluator task"),
    (["--", "python", "prog.py", "--x={rank}"], "unknown placeholder {rank}"),
    (["--on", "ps,worker", "--until", "chief", "--", "python", "prog.py"], "--until chief: no chief runs the program"),
    ([], "no program to run"),
])
def test_bad_input_starts_nothing(tmp_path, cleanup, args, message):
    name, state_dir = "run-bad", tmp_path / "state"
    cleanup(name, state_dir)
    proc = run_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), *args], state_dir=state_dir,
                   cwd=program_dir(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (state_dir / f"{name}.json").exists() and not cluster_pids(name)
