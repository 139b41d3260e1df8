"""Detach and attach (issue 14 item 4), the pure parts and the files: may a new job start
(refusal and --replace), what ``status`` says about the supervisor, ``attach``'s exit code,
the events file ``attach`` replays, and the CLI's refusals (exit 2, nothing started)."""
from __future__ import annotations

import json
import os
import socket

import pytest

from cluster import liveness
from cluster.supervision import daemon as detach
from cluster.contracts import JobState, RestartPolicy
from cluster.errors import PsclusterError
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.jobrecord import JobProgress, Orchestrator
from cluster.state import RunState, StateStore

from .conftest import INVENTORIES
from .test_cli_plan import Captured

HERE = socket.gethostname()


def job(state=JobState.RUNNING, *, pid=4242, host=HERE, detached=True, **fields) -> JobProgress:
    return JobProgress(id=3, job="distributed_mnist", mode="async", state=state,
                       orchestrator=Orchestrator(pid, host, starttime="123", detached=detached,
                                                 log="/s/c.supervisor.log", events="/s/c.supervisor-4242.events"),
                       **fields)


# ----------------------------------------------------------------------------- may a new job start?

@pytest.mark.parametrize("state, alive, running, expected", [
    (None, False, 0, None),                                 # first job of the cluster
    (JobState.RUNNING, True, 0, "supervised"),              # a live job, its supervisor runs
    (JobState.STARTING, True, 0, "supervised"),
    (JobState.RESTARTING, True, 0, "supervised"),
    (JobState.RUNNING, False, 2, "orphaned"),               # supervisor killed, processes run on
    (JobState.RUNNING, False, 0, None),                     # supervisor killed, processes gone: today's cleanup
    (JobState.DONE, True, 0, None),                         # ended; its supervisor is just leaving
    (JobState.FAILED, False, 0, None),
    (JobState.STOPPED, False, 1, "orphaned"),               # a record left running (down could not reach it)
])
def test_job_conflict(state, alive, running, expected):
    last = None if state is None else job(state)
    conflict = detach.job_conflict("c", last, supervisor_alive=alive, running=running)
    assert (conflict.why if conflict else None) == expected


def test_refusal_names_the_job_its_supervisor_and_the_ways_out():
    conflict = detach.job_conflict("lab", job(), supervisor_alive=True, running=0)
    assert conflict is not None
    assert "job 3 (distributed_mnist)" in conflict.message and "'lab'" in conflict.message
    assert f"pid 4242 on {HERE}, detached" in conflict.message
    for way in ("pscluster attach --name lab", "pscluster stop-job --name lab", "--replace"):
        assert way in conflict.hint
    orphan = detach.job_conflict("lab", job(), supervisor_alive=False, running=2)
    assert orphan is not None and "2 process(es)" in orphan.message and "nothing restarts them" in orphan.message
    assert "stop-job" in orphan.hint and "--replace" in orphan.hint


# ----------------------------------------------------------------------------- status, attach's exit code

@pytest.mark.parametrize("record, alive, expected", [
    (job(), True, "alive"),
    (job(), False, "dead"),
    (job(host="elsewhere.example"), False, "elsewhere"),
    (job(JobState.DONE), False, "ended"),
])
def test_supervisor_health(record, alive, expected):
    health = liveness.supervisor_health(record.updated(heartbeat=100.0), alive=alive, here=HERE, now=102.5)
    assert health is not None and health.state == expected
    assert health.heartbeat_age == 2.5 and health.pid == 4242 and health.detached
    assert health.to_json()["state"] == expected


def test_no_supervisor_health_without_a_job_or_a_recorded_supervisor():
    assert liveness.supervisor_health(None, alive=False, here=HERE, now=0) is None
    bare = JobProgress(id=1, job="x", mode="async")
    assert liveness.supervisor_health(bare, alive=False, here=HERE, now=0) is None


@pytest.mark.parametrize("record, code", [
    (job(JobState.DONE, result={"global_step": 10}), 0),
    (job(JobState.DONE, result={"global_step": 5, "deadline_reached": True}), 4),
    (job(JobState.FAILED), 1),
    (job(JobState.STOPPED), 130),
])
def test_exit_status_is_what_train_would_have_exited_with(record, code):
    assert detach.exit_status(record) == code


# ----------------------------------------------------------------------------- liveness

def test_orchestrator_alive_checks_pid_host_and_start_time():
    me = os.getpid()
    started = liveness.process_starttime(me)
    assert started is not None
    assert liveness.orchestrator_alive(Orchestrator(me, HERE, starttime=started))
    assert liveness.orchestrator_alive(Orchestrator(me, HERE))                    # older records: pid only
    assert not liveness.orchestrator_alive(Orchestrator(me, HERE, starttime="1"))   # a reused PID
    assert not liveness.orchestrator_alive(Orchestrator(me, "another-host", starttime=started))
    assert not liveness.orchestrator_alive(None)


def test_the_job_record_round_trips_the_supervisor_and_reads_old_records():
    record = job(heartbeat=12.5)
    again = JobProgress.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record
    old = JobProgress.from_json({"id": 1, "job": "x", "mode": "async", "orchestrator": {"pid": 5, "host": "h"}})
    assert old.orchestrator == Orchestrator(5, "h") and not old.orchestrator.detached


# ----------------------------------------------------------------------------- the events file

def test_parse_events_keeps_a_half_written_line_for_later():
    data = b'{"kind": "message", "data": {"text": "a"}}\nnot json\n{"kind": "job", "data": {"st'
    events, used = detach.parse_events(data)
    assert events == [("message", {"text": "a"})]
    assert used == data.index(b"not json\n") + len(b"not json\n")


def test_event_log_starts_at_the_first_event_and_removes_older_daemons_files(tmp_path):
    old = tmp_path / "c.supervisor-1.events"
    old.write_text("{}\n")
    other = tmp_path / "d.supervisor-1.events"          # another cluster's
    other.write_text("{}\n")
    files = detach.DaemonFiles.of(tmp_path, "c", 2)
    log = detach.EventLog(files.events)
    assert old.exists()                                  # a refused daemon removes nothing
    log.emit("message", text="hello")
    log.emit("job", step=5, worker_progress=("worker:0", {"step": 5}))
    log.close()
    assert not old.exists() and other.exists()
    events, _ = detach.parse_events((tmp_path / "c.supervisor-2.events").read_bytes())
    assert events == [("message", {"text": "hello", "level": "info"}),
                      ("job", {"step": 5, "worker_progress": ["worker:0", {"step": 5}]})]


@pytest.fixture
def cluster_state(tmp_path):
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="/nonexistent/python", local_workdir=str(tmp_path), name="c"))
    store = StateStore(tmp_path / "state")
    return store, RunState(name="c", plan=plan, phase="up")


def test_follow_replays_the_events_then_returns_the_ended_job(cluster_state, tmp_path):
    store, state = cluster_state
    files = detach.DaemonFiles.of(store.root, "c", 4242)
    running = job().updated(orchestrator=files.orchestrator(4242, HERE))
    state.job = running
    store.save(state)
    log = detach.EventLog(files.events)
    log.emit("task-failed", task="worker:1", host="localhost", error="was killed by signal 9")
    seen: list[tuple[str, dict]] = []
    turns = []

    def sleep(seconds):            # the job ends while attach waits
        turns.append(seconds)
        log.emit("task-restarted", task="worker:1", host="localhost", detail="restart 1")
        state.job = running.updated(state=JobState.DONE, result={"global_step": 7})
        store.save(state)

    final = detach.follow(store, "c", 3, lambda kind, data: seen.append((kind, data)), sleep=sleep,
                          alive=lambda info: True)
    assert final.state is JobState.DONE and detach.exit_status(final) == 0
    assert [kind for kind, _ in seen] == ["task-failed", "task-restarted"]
    assert len(turns) == 1


def test_follow_without_events_file_shows_the_job_record(cluster_state):
    store, state = cluster_state
    state.job = job().updated(orchestrator=Orchestrator(4242, HERE), step=10, steps_total=100)
    store.save(state)
    seen = []

    def sleep(seconds):
        state.job = state.job.updated(state=JobState.FAILED, message="boom")
        store.save(state)

    final = detach.follow(store, "c", 3, lambda kind, data: seen.append((kind, data)), sleep=sleep,
                          alive=lambda info: True)
    assert final.state is JobState.FAILED and detach.exit_status(final) == 1
    assert seen[0] == ("job", {"id": 3, "job": "distributed_mnist", "mode": "async", "state": "running",
                               "entry": "train", "step": 10, "steps_total": 100})


def test_follow_says_when_the_supervisor_is_gone(cluster_state):
    store, state = cluster_state
    state.job = job()
    store.save(state)
    with pytest.raises(detach.SupervisorGone) as caught:
        detach.follow(store, "c", 3, lambda kind, data: None, sleep=lambda s: None, alive=lambda info: False)
    assert "pid 4242" in str(caught.value) and "stop-job --name c" in str(caught.value)
    store.delete("c")
    with pytest.raises(PsclusterError, match="taken down"):
        detach.follow(store, "c", 3, lambda kind, data: None, sleep=lambda s: None)


# ----------------------------------------------------------------------------- the CLI's refusals

def test_train_detach_refuses_a_live_job_with_exit_2(cluster_state):
    store, state = cluster_state
    me = os.getpid()      # this test process plays the live supervisor
    state.job = job().updated(orchestrator=Orchestrator(me, HERE, starttime=liveness.process_starttime(me)))
    store.save(state)
    for argv in (["train", "distributed_mnist", "--name", "c", "--detach"],
                 ["train", "distributed_mnist", "--name", "c"],
                 ["run", "--name", "c", "--detach", "--", "true"]):
        cli = Captured(store.root)
        cli.env.store = store
        assert cli.run(*argv) == 2, cli.stderr.getvalue()
        err = " ".join(cli.stderr.getvalue().split())
        assert "job 3 (distributed_mnist) is still running on cluster 'c'" in err and "--replace" in err
    assert not list(store.root.glob("*.supervisor*"))        # no daemon was started


@pytest.mark.parametrize("argv", [["run", "--name", "c", "--detach", "--until", "workers", "--", "python", "p.py"],
                                  ["train", "distributed_mnist", "--name", "c", "--steps", "40", "--detach"]])
def test_detach_hands_the_supervisor_its_request_as_json(cluster_state, monkeypatch, argv):
    """Issue 43 item 2: the daemon receives request.to_json() (not click's parameters), which
    rebuilds the very request; the supervisor runs its body with it, unchanged."""
    from cluster.program.request import RunRequest
    from cluster.supervision.train_spec import TrainRequest
    store, state = cluster_state
    store.save(state)
    sent = []

    def spawn(root, name, request):
        sent.append(json.loads(json.dumps(request)))
        raise PsclusterError("spawned (test)")
    monkeypatch.setattr(detach, "spawn_supervisor", spawn)
    cli = Captured(store.root)
    cli.env.store = store
    assert cli.run(*argv) == 1, cli.stderr.getvalue()
    (request,) = sent
    assert request["command"] == argv[0] and set(request) == {"command", "request"}
    value = (RunRequest if argv[0] == "run" else TrainRequest).from_json(request["request"])
    assert value.name == "c" and value.to_json() == request["request"]
    if argv[0] == "run":
        assert value.program == ("python", "p.py") and value.until == "workers" and value.cwd == os.getcwd()
    else:
        assert value.job == "distributed_mnist" and value.options.steps == 40


def test_supervise_refuses_a_request_with_a_field_it_does_not_know(cluster_state, monkeypatch):
    import io
    store, state = cluster_state
    store.save(state)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"command": "run", "request": {"program": ["true"]}})))
    cli = Captured(store.root)
    cli.env.store = store
    assert cli.run("supervise", "--name", "c") == 2
    assert "RunRequest: missing field(s) cwd, keep, inventory" in " ".join(cli.stderr.getvalue().split())


def test_one_shot_run_cannot_detach(tmp_path):
    cli = Captured(tmp_path / "state")
    assert cli.run("run", str(INVENTORIES / "local.yaml"), "--detach", "--", "true") == 2
    assert "a run on a cluster that is up" in cli.stderr.getvalue()
    assert not (tmp_path / "state").exists()


def test_stop_job_and_attach_without_a_job(cluster_state):
    store, state = cluster_state
    store.save(state)
    cli = Captured(store.root)
    assert cli.run("stop-job", "--name", "c") == 0
    assert "no job is running on 'c'" in cli.stderr.getvalue()
    assert cli.run("attach", "--name", "c") == 2
    assert "has not run a job yet" in cli.stderr.getvalue()


def test_attach_to_an_ended_job_prints_its_report_and_exit_code(cluster_state):
    store, state = cluster_state
    state.job = job(JobState.FAILED, message="worker:1@localhost: was killed by signal 9; restart budget exhausted")
    store.save(state)
    cli = Captured(store.root)
    assert cli.run("attach", "--name", "c") == 1
    assert "job 3 (distributed_mnist) failed: worker:1@localhost" in cli.stderr.getvalue()


# ----------------------------------------------------------------------------- the executor's claim

def test_claim_refuses_an_orphaned_job_whose_processes_run_unless_replace(cluster_state, monkeypatch):
    from cluster.errors import UsageError
    from cluster.events import RecordingReporter
    from cluster.state import ProcessRecord
    from cluster.supervision import core
    from cluster.supervision.executor import JobExecutor
    from cluster.transport import TransportPool
    store, state = cluster_state
    state.job = job(host="gone-host")             # its supervisor cannot be alive here
    state.processes = [ProcessRecord(key="chief:0#j3.1", task="chief:0", host="localhost", kind="train", attempt=1,
                                     log="/x.log", exit_file="/x.log.exit", pid=5)]
    store.save(state)
    running = {"count": 1}
    monkeypatch.setattr(JobExecutor, "count_running", lambda self, state, records: running["count"])

    def executor(replace: bool) -> JobExecutor:        # claim() asks nothing of a job kind
        return JobExecutor(None, store=store, name="c", reporter=RecordingReporter(), pool=TransportPool(), root=store.root,
                           rules=core.RestartRules(RestartPolicy.ON_FAILURE, 1), replace=replace)

    with pytest.raises(UsageError) as caught:
        executor(False).claim()
    assert "still has 1 process(es) running" in caught.value.message and "--replace" in (caught.value.hint or "")
    assert executor(True).claim().job == state.job            # --replace: run() then stops them
    running["count"] = 0                                       # processes gone: today's clean-up, no refusal
    assert executor(False).claim().name == "c"


@pytest.mark.parametrize("final, result, code", [
    (JobState.DONE, {"global_step": 10}, 0),
    (JobState.DONE, {"global_step": 5, "deadline_reached": True}, 4),
    (JobState.FAILED, None, 1),
    (JobState.STOPPED, None, 130),
])
def test_the_run_history_records_the_code_attach_exits_with(tmp_path, final, result, code):
    """One mapping (jobrecord.job_exit_status): the executor's end of a job wrote its own (issue 43)."""
    from .conftest import idle_supervisor
    supervisor = idle_supervisor(tmp_path, name="codes", mode="async")
    from cluster.history import RunHistory
    supervisor.history = RunHistory(supervisor.store.root)      # what the executor's start sets
    supervisor.prune_runs = lambda: None              # no hosts to clean
    supervisor.finish(final, **({"result": result} if result else {}))
    recorded = supervisor.history.find("codes", supervisor.job_id)
    assert recorded is not None and recorded.exit_code == detach.exit_status(supervisor.state.job) == code
    assert type(recorded.exit_code) is int
