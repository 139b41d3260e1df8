"""The executor's bookkeeping with the clock and sleep replaced (no process is started): the
restart budget belongs to each job, not to the cluster's lifetime (issue 16 item 4), a restart
counts in both the job and the cluster's totals, and exhaustion fails with the last cause."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.contracts import JobState, ProcessKind, ProcState, RestartPolicy
from cluster.events import RecordingReporter
from cluster.inventory import load_inventory
from cluster.plan import PlanOptions, plan_cluster
from cluster.jobrecord import JobProgress
from cluster.state import ProcessRecord, RunState, StateStore
from cluster.supervision import core
from cluster.supervision.executor import JobExecutor
from cluster.supervision.jobkind import JobFailed, JobKind, Watched
from cluster.transport import TransportPool

from .conftest import INVENTORIES


class ScriptedKind(JobKind):
    """A job kind whose recoveries only count (the hooks these tests reach, and JobKind's defaults);
    its processes are made up."""

    entry = "train"
    failure_prefix = "training failed"
    one_shot = False

    def __init__(self):
        self.recoveries: list[core.Recovery] = []

    def job_name(self):
        return "new"

    def command(self):
        return ("new",)

    def recovery(self, ex, incident):
        plan = core.Recovery(wait_hosts=(), stop=())
        self.recoveries.append(plan)
        return plan


@pytest.fixture
def job(tmp_path):
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="/nonexistent/python", local_workdir=str(tmp_path), name="budget"))
    store = StateStore(tmp_path / "state")
    # An earlier job on this cluster used up worker:0's restarts.
    state = RunState(name="budget", plan=plan, phase="up", restarts={"worker:0": 3},
                     job=JobProgress(id=1, job="old", mode="async", state=JobState.FAILED, restarts={"worker:0": 3}))
    store.save(state)
    sleeps: list[float] = []
    executor = JobExecutor(ScriptedKind(), store=store, name="budget", reporter=RecordingReporter(), pool=TransportPool(),
                           root=tmp_path, rules=core.RestartRules(RestartPolicy.ON_FAILURE, max_restarts=2),
                           clock=lambda: 100.0, sleep=sleeps.append, wall=lambda: 1700000000.0)
    executor.retarget = lambda: None          # no watch streams: nothing runs
    executor.begin()                          # job 2, after the old one
    task = plan.task("worker:0")
    record = ProcessRecord(key="worker:0#j2.1", task="worker:0", host=task.host, kind="run", attempt=1,
                           log=str(tmp_path / "nope.log"), exit_file=str(tmp_path / "nope.log.exit"))
    executor.watched[record.key] = Watched(task, record, ProcessKind.PROGRAM, launched=90.0,
                                           state=ProcState.EXITED, exit_code=1)
    yield executor, store, sleeps
    executor.pool.close()


def incident_of(executor) -> core.Incident:
    return core.find_incident(executor.views(), now=100.0, watch=core.Watchdog())


def test_a_new_job_gets_the_whole_budget_again(job):
    executor, store, sleeps = job
    assert executor.state.job.restarts == {}
    executor.handle(incident_of(executor))               # restarted: the old job's 3 restarts do not count
    assert executor.kind.recoveries and sleeps == [1.0]
    assert executor.state.job.restarts == {"worker:0": 1}
    assert store.load("budget").restarts == {"worker:0": 4}      # the cluster's lifetime total, for status


def test_the_budget_is_spent_within_one_job(job):
    executor, store, sleeps = job
    executor.handle(incident_of(executor))
    executor.handle(incident_of(executor))
    with pytest.raises(JobFailed) as caught:
        executor.handle(incident_of(executor))
    assert sleeps == [1.0, 2.0]                           # backoff doubles
    assert "restart budget exhausted (2 restart(s) used)" in str(caught.value)
    assert "worker:0@localhost: exited with code 1" in str(caught.value)


def test_policy_never_fails_at_once(job):
    executor, _, sleeps = job
    executor.rules = replace(executor.rules, policy=RestartPolicy.NEVER)
    with pytest.raises(JobFailed) as caught:
        executor.handle(incident_of(executor))
    assert str(caught.value).startswith("training failed (restart policy 'never'): worker:0@localhost")
    assert sleeps == [] and not executor.kind.recoveries


def test_a_restart_is_announced_as_a_job_state_change(job):
    executor, _, _ = job
    executor.handle(incident_of(executor))
    [change] = executor.reporter.of("job-state")
    assert change.data == {"cluster": "budget", "job": "new", "job_id": 2, "entry": "train", "event": "restarted",
                           "time": 1700000000.0,
                           "report": {"task": "worker:0", "host": "localhost", "reason": "exited with code 1",
                                      "restart": 1, "max_restarts": 2}}


@pytest.mark.parametrize("policy", [RestartPolicy.NEVER, RestartPolicy.ON_FAILURE])
def test_a_failed_evaluator_is_given_up_and_the_job_goes_on(job, policy):
    executor, _, sleeps = job
    executor.rules = replace(executor.rules, policy=policy)
    executor.state.job = executor.progress.updated(restarts={"evaluator:0": 2})    # on-failure: budget spent
    trainer = executor.watched.pop("worker:0#j2.1")
    evaluator = replace(trainer.task, role="evaluator", index=0)
    record = replace(trainer.record, key="evaluator:0#j2.1", task="evaluator:0", kind="train")
    executor.watched[record.key] = Watched(evaluator, record, ProcessKind.TRAIN, launched=90.0,
                                           state=ProcState.EXITED, exit_code=1)
    executor.handle(incident_of(executor))               # no JobFailed
    assert executor.watched == {} and sleeps == [] and not executor.kind.recoveries
    given_up = [e for e in executor.reporter.events if e.kind == "message" and "given up" in e.data["text"]]
    assert given_up and "training goes on without it" in executor.state.job.message


class _Link:
    def __init__(self, last_seen: float, opened_at: float = 0.0, lost_since: float | None = None, stream=object()):
        self.last_seen, self.opened_at, self.lost_since, self.stream = last_seen, opened_at, lost_since, stream
        self.watch_pid: int | None = None


def test_the_record_says_which_hosts_were_heard_and_when_in_wall_time():
    """What `status` answers from (issue 46): a lost host, one whose stream is reopening, or one
    not heard on its new stream yet, is left out, so status asks it."""
    from cluster.supervision.executor import heard
    links = {"h1": _Link(98.0), "h2": _Link(99.0, lost_since=95.0), "h3": _Link(99.0, stream=None),
             "h4": _Link(97.0, opened_at=97.5)}
    plan = plan_cluster(load_inventory(str(INVENTORIES / "local.yaml")),
                        PlanOptions(local_python="python3", local_workdir="/w"))
    task = plan.tasks[0]
    record = ProcessRecord.for_task(task.name, task.host, ProcessKind.SERVER, 1, "/w/x.log")
    watched = {record.key: Watched(task, record, ProcessKind.SERVER, 0.0, state=ProcState.FROZEN)}
    links["h1"].watch_pid = 4321
    found = heard(links, watched, now=100.0, wall=5000.0)       # type: ignore[arg-type]
    assert found == {"hosts_heard": {"h1": 4998.0}, "proc_states": {record.key: "frozen"}, "watch_pids": {"h1": 4321}}


class _LostLink:
    def __init__(self, lost_since: float, ended=None):
        self.lost_since, self.error, self.ended = lost_since, "no heartbeat for 4 s", ended
        self.reported = True          # on_host_lost: said already

    def poll(self, now):
        return []

    def close(self):
        pass


class _WaitingKind(ScriptedKind):
    """Its recovery waits for the host; ``goes_on``: whether it goes on without a lost host (a ps moved)."""

    def __init__(self, goes_on: bool):
        super().__init__()
        self.goes_on, self.dropped = goes_on, []

    def recovery(self, ex, incident):
        return core.Recovery(wait_hosts=("localhost",), stop=(), relaunch=("worker:0",))

    def drop_out(self, ex, host, why, task=None):
        self.dropped.append((host, why))
        return self.goes_on

    def relaunch(self, ex, task):
        raise AssertionError("a moot recovery relaunched a task")


@pytest.mark.parametrize("goes_on", [True, False])
def test_a_restart_that_waits_for_a_host_lost_past_the_timeout_asks_the_kind_to_go_on_without_it(job, goes_on):
    """Issue 41 item 3: the async chief fails with its lost ps and waits for the ps host; once that
    host is lost for longer than --host-timeout, counted from its loss as decide() counts it, the
    job kind may go on without it (the ps moved); else the job fails naming the host."""
    executor, _, sleeps = job
    executor.kind = _WaitingKind(goes_on)
    executor.links = {"localhost": _LostLink(lost_since=30.0)}     # at 100: lost for 70 s, timeout 60
    if goes_on:
        executor.handle(incident_of(executor))
    else:
        with pytest.raises(JobFailed) as caught:
            executor.handle(incident_of(executor))
        assert "localhost: unreachable for 70 s (no heartbeat for 4 s)" in str(caught.value)
    assert executor.kind.dropped == [("localhost", "lost for over 60 s (no heartbeat for 4 s)")]
    assert sleeps == [1.0]                    # the backoff, then no wait: the host was lost long enough
    assert not executor.reporter.of("job-state") or executor.reporter.of("job-state")[-1].data["event"] != "restarted"


@pytest.mark.parametrize("whole_job, goes_on", [(True, True), (False, True), (False, False)])
def test_a_host_gone_for_good_is_acted_on_without_waiting_for_the_host_timeout(job, whole_job, goes_on):
    """Issue 41 item 5, Slurm: the link says its host will not answer again (HostLink.ended).
    The whole job ended (NODE_FAIL without --no-kill): the job fails at once with Slurm's word,
    nothing asked of the kind. The node left the allocation (--no-kill): the kind goes on without
    it now (lost for 5 s here, the timeout is 60), or the job fails with the reason."""
    from cluster.errors import HostEndedError
    executor, _, _ = job
    executor.kind = _WaitingKind(goes_on)
    executor.watched.clear()
    gone = HostEndedError("localhost", "Slurm job 7 has ended (NODE_FAIL, reason NodeDown)" if whole_job else
                          "localhost left Slurm job 7", whole_job=whole_job)
    executor.links = {"localhost": _LostLink(lost_since=95.0, ended=gone)}
    if whole_job or not goes_on:
        with pytest.raises(JobFailed) as caught:
            executor.decide(100.0)
        assert str(gone).splitlines()[0] in str(caught.value)
    else:
        assert executor.decide(100.0) is False
    expected = [] if whole_job else [("localhost", "is out of the Slurm job's allocation (a failed node)")]
    assert executor.kind.dropped == expected


@pytest.mark.parametrize("goes_on", [True, False])
def test_a_restart_that_waits_for_a_node_out_of_the_allocation_goes_on_without_it_at_once(job, goes_on):
    """The restart's wait for a host (the async chief with a lost ps) learns that the node is out
    of the Slurm allocation (--no-kill): no host timeout to wait out (lost 5 s of 60 here)."""
    from cluster.errors import HostEndedError
    executor, _, sleeps = job
    executor.kind = _WaitingKind(goes_on)
    executor.links = {"localhost": _LostLink(lost_since=95.0, ended=HostEndedError(
        "localhost", "localhost is not in Slurm job 7's allocation (n1)", whole_job=False))}
    if goes_on:
        executor.handle(incident_of(executor))
    else:
        with pytest.raises(JobFailed, match="not in Slurm job 7's allocation"):
            executor.handle(incident_of(executor))
    assert executor.kind.dropped == [("localhost", "is out of the Slurm job's allocation (a failed node)")]
    assert sleeps == [1.0]                    # the backoff only: no wait for the host


def test_a_chunk_goes_to_the_processes_that_read_its_file_and_to_none_forgotten(job):
    from cluster.hosts.hostops import FileChunk, WatchUpdate
    executor, _, _ = job
    heard: list[tuple[str, str]] = []
    executor.kind.on_chunk = lambda ex, watched, chunk, now: heard.append((watched.record.key, chunk.data))
    plan = executor.plan
    made = []
    for index, task in enumerate(plan.tasks[:3]):
        record = ProcessRecord(key=f"{task.name}#x", task=task.name, host=task.host, kind="run", attempt=1,
                               log=f"/l{index}", exit_file=f"/l{index}.exit")
        made.append(executor.adopt(task, record, ProcessKind.PROGRAM, files=(f"/l{index}",)))

    def chunk(path, data, offset=0):
        return WatchUpdate(ts=0.0, states={}, reads=(FileChunk(True, 9, offset, offset + len(data), data, path),))
    executor.absorb(chunk("/l1", "one"), 100.0)
    executor.absorb(chunk("/l2", "two"), 100.0)
    executor.absorb(chunk("/nobody", "x"), 100.0)
    assert heard == [(made[1].record.key, "one"), (made[2].record.key, "two")]
    executor.forget([made[1]])                       # forgotten: reads nothing more
    late = ProcessRecord(key="late#x", task=made[0].task.name, host=made[0].task.host, kind="run", attempt=2,
                         log="/l1", exit_file="/l1.exit")
    executor.watched[late.key] = Watched(made[0].task, late, ProcessKind.PROGRAM, launched=100.0, files=("/l1",))
    executor.absorb(chunk("/l1", "again", offset=3), 100.0)   # put in directly, not through adopt: found too
    assert heard[2:] == [("late#x", "again")]


def test_only_a_changed_state_or_a_trainers_bytes_make_the_turn_decide_at_once(job):
    """Issue 46: a heartbeat or a program's output line does not make the loop decide over every
    process at once (it decides every DECIDE_SECONDS anyway); a state that changed, an exit, or a
    trainer's events do."""
    from cluster.hosts.hostops import FileChunk, TaskStatus, WatchUpdate
    executor, _, _ = job
    executor.kind.on_chunk = lambda ex, watched, chunk, now: None
    executor.kind.on_exit = lambda ex, watched, now: None
    task, trainer_task = executor.plan.tasks[:2]
    program = executor.adopt(task, ProcessRecord(key="p#x", task=task.name, host=task.host, kind="run", attempt=1,
                                                 log="/p", exit_file="/p.exit"), ProcessKind.PROGRAM, files=("/p",))
    executor.adopt(trainer_task, ProcessRecord(key="t#x", task=trainer_task.name, host=trainer_task.host, kind="train",
                                               attempt=1, log="/t", exit_file="/t.exit", events="/e"),
                   ProcessKind.TRAIN, files=("/e",))

    def update(states=None, path=None, data="x", offset=0):
        reads = () if path is None else (FileChunk(True, 9, offset, offset + len(data), data, path),)
        return WatchUpdate(ts=0.0, states=states or {}, reads=reads)
    running = {"p#x": TaskStatus(key="p#x", state="running")}
    assert executor.absorb(update(running), 100.0) is False                  # a heartbeat: nothing changed
    assert executor.absorb(update(running, "/p", "line\n"), 100.0) is False  # a program's output
    assert executor.absorb(update(running, "/e", "{}\n"), 100.0) is True     # a trainer's event
    exited = {"p#x": TaskStatus(key="p#x", state="exited", exit_code=0)}
    assert executor.absorb(update(exited), 100.0) is True and program.state.value == "exited"
    assert executor.absorb(update(exited), 100.0) is False
