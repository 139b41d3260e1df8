"""The run history (cluster/history.py): numbers that count up per name, records that outlive
the cluster, the --keep limit, and hostctl's remove_job_dirs, which deletes only job folders."""
from __future__ import annotations

import sys

import pytest

from cluster.history import LogFile, RunHistory, RunRecord, remove_runs
from cluster.plan import HostSpec
from cluster.transport import TransportPool
from roles import hostctl


def local_host(workdir) -> HostSpec:
    return HostSpec(name="localhost", address="127.0.0.1", connection="local", ssh_port=None, user=None,
                    key_file=None, python=sys.executable, workdir=str(workdir), host_key_policy="accept-new",
                    known_hosts=None, connect_timeout=10.0)


def record(workdir, run: int, *, ended: float | None = 2.0, name: str = "exp") -> RunRecord:
    folder = f"{workdir}/.pscluster/{name}/job-{run}"
    logs = (LogFile("worker:1", "localhost", f"{folder}/worker-1.1.log"),
            LogFile("chief:0", "localhost", f"{folder}/chief-0.1.log"),
            LogFile("worker:1", "localhost", f"{folder}/worker-1.2.log", attempt=2))
    return RunRecord(name=name, id=run, entry="run", command=("python", "p.py"), started=1.0, ended=ended,
                     state="done" if ended else "running", exit_code=0 if ended else None, one_shot=True,
                     logs=logs, hosts=(local_host(workdir),))


def test_records_round_trip_and_numbers_count_up(tmp_path):
    history = RunHistory(tmp_path / "state")
    assert history.last_id("exp") == 0 and history.find("exp") is None
    history.save(record(tmp_path, 1))
    history.save(record(tmp_path, 2, ended=None))
    history.save(record(tmp_path, 2))                 # its end replaces its start
    assert [r.id for r in history.load("exp")] == [1, 2] and history.last_id("exp") == 2
    assert history.find("exp") == record(tmp_path, 2) and history.find("exp", 1) == record(tmp_path, 1)
    assert history.find("exp", 7) is None and history.names() == ["exp"]
    # Each task's newest attempt, in plan order.
    assert [(log.task, log.attempt) for log in history.find("exp").latest_logs()] == [("chief:0", 1), ("worker:1", 2)]


def test_keep_removes_the_oldest_ended_runs_with_their_folders(tmp_path):
    history = RunHistory(tmp_path / "state")
    for run in (1, 2, 3):
        history.save(record(tmp_path, run, ended=None if run == 1 else 2.0))     # run 1: still running
        folder = tmp_path / ".pscluster" / "exp" / f"job-{run}"
        folder.mkdir(parents=True)
        (folder / "chief-0.1.log").write_text("log\n")
    assert [r.id for r in history.beyond("exp", 1)] == [2]           # a running run is never removed
    with TransportPool() as pool:
        removed, problems = remove_runs(history, history.beyond("exp", 1), pool)
    assert (removed, problems) == (1, [])
    assert [r.id for r in history.load("exp")] == [1, 3]
    assert sorted(p.name for p in (tmp_path / ".pscluster" / "exp").iterdir()) == ["job-1", "job-3"]


def test_an_unreadable_history_is_named(tmp_path):
    history = RunHistory(tmp_path / "state")
    history.folder.mkdir(parents=True)
    history.path("exp").write_text("{not json")
    with pytest.raises(Exception, match="run history .* is unreadable"):
        history.load("exp")


@pytest.mark.parametrize("path", ["{w}", "{w}/.pscluster", "{w}/.pscluster/exp", "{w}/.pscluster/exp/jobs",
                                  "{w}/.pscluster/exp/job-1x", "{w}/other/exp/job-1", "/", "{w}/.pscluster/../job-1"])
def test_remove_job_dirs_refuses_anything_but_a_job_folder(tmp_path, path):
    (tmp_path / ".pscluster" / "exp" / "job-1").mkdir(parents=True)
    answer = hostctl.op_remove_job_dirs({"paths": [path.format(w=tmp_path)]})
    assert answer["removed"] == [] and len(answer["refused"]) == 1
    assert (tmp_path / ".pscluster" / "exp" / "job-1").is_dir()


def test_remove_job_dirs_does_not_follow_a_symlink(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    (tmp_path / ".pscluster" / "exp").mkdir(parents=True)
    (tmp_path / ".pscluster" / "exp" / "job-1").symlink_to(target)
    answer = hostctl.op_remove_job_dirs({"paths": [str(tmp_path / ".pscluster" / "exp" / "job-1")]})
    assert answer == {"removed": [], "refused": []} and (target / "keep.txt").exists()


def test_remove_job_dirs_refuses_a_run_folder_that_is_a_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "job-1").mkdir(parents=True)
    (tmp_path / ".pscluster").mkdir()
    (tmp_path / ".pscluster" / "exp").symlink_to(elsewhere)
    answer = hostctl.op_remove_job_dirs({"paths": [str(tmp_path / ".pscluster" / "exp" / "job-1")]})
    assert answer["removed"] == [] and len(answer["refused"]) == 1 and (elsewhere / "job-1").is_dir()


def cli_env(tmp_path):
    import contextlib
    import io

    from rich.console import Console

    from cluster.cli import Env
    from cluster.state import StateStore
    out, err = io.StringIO(), io.StringIO()
    env = Env(out=Console(file=out, width=200, color_system=None), err=Console(file=err, width=200),
              store=StateStore(tmp_path / "state"), pool_factory=lambda: contextlib.nullcontext())
    return env, out, err


@pytest.mark.parametrize("args, code, shown", [
    (["logs"], 0, "exp 2"),                                   # no cluster up: the only name's newest run
    (["logs", "--run", "1"], 0, "exp 1"),
    (["logs", "--name", "exp", "--run", "2", "chief:0"], 0, "exp 2 chief:0"),
    (["logs", "--name", "exp", "--run", "9"], 2, "'exp' has no run 9"),
    (["logs", "--name", "nope"], 2, "no cluster or run named 'nope' (known: exp)"),
    (["logs", "--name", "exp", "--run", "0"], 2, "Invalid value for '--run'"),
    (["logs", "--name", "exp", "--run", "x"], 2, "Invalid value for '--run'"),
    (["logs", "--name", "../exp", "--run", "1"], 2, "is not a valid cluster name"),
    (["runs", "--name", "nope"], 2, "no run of 'nope' is recorded"),
    (["clean", "--name", "nope"], 2, "no run of 'nope' is recorded"),
])
def test_logs_and_runs_read_the_history_and_refuse_bad_input(tmp_path, monkeypatch, capsys, args, code, shown):
    from cluster import cli, logs
    monkeypatch.setattr(logs, "stream_run_logs", lambda record, task, pool, write, **options:
                        write(f"{record.name} {record.id}" + (f" {task}" if task else "") + "\n"))
    env, out, err = cli_env(tmp_path)
    history = RunHistory(env.store.root)
    history.save(record(tmp_path, 1))
    history.save(record(tmp_path, 2))
    assert cli.run(args, env=env) == code
    text = out.getvalue() + err.getvalue() + capsys.readouterr().err
    assert shown in text and "Traceback" not in text


def test_runs_lists_every_name_and_logs_wants_a_name_when_several_are_recorded(tmp_path):
    import json

    from cluster import cli
    env, out, err = cli_env(tmp_path)
    history = RunHistory(env.store.root)
    history.save(record(tmp_path, 1))
    history.save(record(tmp_path, 4, name="other"))
    assert cli.run(["runs", "--json"], env=env) == 0
    listed = json.loads(out.getvalue())
    assert [(r["name"], r["run"], r["command"], r["exit_code"], r["tasks"]) for r in listed] == [
        ("exp", 1, ["python", "p.py"], 0, ["chief:0", "worker:1"]), ("other", 4, ["python", "p.py"], 0,
                                                                     ["chief:0", "worker:1"])]
    assert cli.run(["logs"], env=env) == 2
    assert "runs of several names are recorded" in err.getvalue() and "--name: exp, other" in err.getvalue()


def test_a_run_with_no_recorded_end_is_pruned_once_old_and_its_processes_are_gone(tmp_path):
    """Issue 45 item 8: a crashed run (no end recorded) stayed for ever."""
    from cluster.history import STALE_AFTER
    history = RunHistory(tmp_path / "state")
    for run in (1, 2, 3, 4):
        history.save(record(tmp_path, run, ended=None if run in (1, 2) else 2.0))
    now = 1.0 + STALE_AFTER + 1
    assert [r.id for r in history.beyond("exp", 1, now=now)] == [3]                    # nobody says gone
    assert [r.id for r in history.beyond("exp", 1, gone=lambda r: True, now=now)] == [1, 2, 3]
    assert [r.id for r in history.beyond("exp", 1, gone=lambda r: r.id == 2, now=now)] == [2, 3]
    assert [r.id for r in history.beyond("exp", 1, gone=lambda r: True, now=now - 2)] == [3]   # too young
    assert [r.id for r in history.beyond("exp", 4, gone=lambda r: True, now=now)] == []       # within --keep


def test_a_runs_processes_are_gone_when_its_cluster_is_down_or_none_runs(tmp_path):
    import dataclasses
    import os
    import socket

    from cluster.state import ProcessRecord, StateStore
    from cluster.liveness import process_starttime
    from cluster.supervision.daemon import run_gone
    from cluster.jobrecord import JobProgress, Orchestrator

    from .test_state import lab_state
    store = StateStore(tmp_path / "state")
    gone = run_gone(store)
    assert gone(record(tmp_path, 3, ended=None, name="lab"))                # no state: `down` stopped it all
    state = lab_state("lab")
    state.processes = [ProcessRecord(key="worker:0#j3.1", task="worker:0", host="node-a", kind="run", attempt=1,
                                     log="/w/job-3/worker-0.1.log", exit_file="/w/job-3/worker-0.1.exit")]
    state.job = JobProgress(id=3, job="p.py", mode="async", orchestrator=Orchestrator(999_999_999, "elsewhere"))
    store.save(state)
    assert not gone(record(tmp_path, 3, ended=None, name="lab"))            # an orphan process still runs
    state.processes = [dataclasses.replace(state.processes[0], stopped=True)]
    store.save(state)
    assert gone(record(tmp_path, 3, ended=None, name="lab"))                # supervisor gone, nothing runs
    state.job = JobProgress(id=3, job="p.py", mode="async", orchestrator=Orchestrator(
        os.getpid(), socket.gethostname(), starttime=process_starttime(os.getpid())))
    store.save(state)
    assert not gone(record(tmp_path, 3, ended=None, name="lab"))            # its supervisor runs here
    assert gone(record(tmp_path, 2, ended=None, name="lab"))                # an earlier job of the cluster
    (tmp_path / "state" / "lab.json").write_text("{broken")
    assert not gone(record(tmp_path, 2, ended=None, name="lab"))            # unreadable: keep it


def test_train_takes_keep_as_run_does(tmp_path, monkeypatch, capsys):
    from cluster import cli
    from cluster.supervision import train_job

    from .test_state import lab_state
    env, out, err = cli_env(tmp_path)
    env.store.save(lab_state("lab"))
    seen = {}

    def executor(**settings):
        seen.update(settings)
        raise KeyboardInterrupt
    monkeypatch.setattr(train_job, "train_executor", executor)
    assert cli.run(["train", "distributed_mnist", "--name", "lab", "--keep", "3"], env=env) == 130
    assert seen["keep"] == 3
    for bad in ("0", "x", "-1"):
        assert cli.run(["train", "distributed_mnist", "--name", "lab", "--keep", bad], env=env) == 2
    assert "Invalid value for '--keep'" in err.getvalue() + capsys.readouterr().err
