"""The supervision decisions, table-driven (cluster/supervision/core.py): every row of the
recovery table in docs/supervision.md, failure detection (exits, frozen processes, start
deadline, stalls, frozen-peer blame), restart policy and budget, lost hosts, job completion."""
from __future__ import annotations

import pytest

from cluster.contracts import Mode, ProcessKind, ProcState, RestartPolicy, Role, Until
from cluster.supervision.core import (Action, FailReason, HostView, Incident, IncidentKind, Proc, Recovery, RestartRules,
                                      Watchdog, default_until, find_incident, lost_host_failure, program_end,
                                      until_problem,
                                      program_recovery, train_outcome, train_recovery, verdict)

SERVER, TRAIN, PROGRAM = ProcessKind.SERVER, ProcessKind.TRAIN, ProcessKind.PROGRAM


def proc(task: str, kind: ProcessKind = TRAIN, host: str = "h1", **fields) -> Proc:
    role = task.split(":")[0]
    return Proc(key=f"{task}#1", task=task, role=Role(role), host=host, kind=kind, **fields)


def exited(task: str, kind: ProcessKind = TRAIN, code: int | None = 1, signal: int | None = None, **fields) -> Proc:
    return proc(task, kind, state=ProcState.EXITED, exit_code=code, signal=signal, **fields)


# ----------------------------------------------------------------------------- detection

@pytest.mark.parametrize("failed, kind, reason", [
    (exited("worker:1", code=3), IncidentKind.EXITED, "exited with code 3"),
    (exited("worker:1", code=None, signal=9), IncidentKind.EXITED, "was killed by signal 9"),
    (proc("worker:1", state=ProcState.GONE), IncidentKind.EXITED, "vanished (no exit status)"),
    (exited("ps:0", SERVER, code=0), IncidentKind.EXITED, "exited with code 0"),          # a server never ends
    (exited("chief:0", code=0), IncidentKind.EXITED, "exited with code 0"),              # ended without "done"
    (exited("worker:0", PROGRAM, code=2), IncidentKind.EXITED, "exited with code 2"),
])
def test_an_ended_process_is_an_incident(failed, kind, reason):
    incident = find_incident([proc("worker:0"), failed], now=100.0, watch=Watchdog())
    assert incident is not None and incident.proc == failed
    assert (incident.kind, incident.reason) == (kind, reason)


@pytest.mark.parametrize("ok", [
    exited("worker:1", code=0, done=True),                       # a training process that finished
    exited("worker:1", PROGRAM, code=0),                         # a program that exited 0
    exited("worker:1", code=3, finished=True),                   # already accounted for
])
def test_a_completed_process_is_not_an_incident(ok):
    assert find_incident([proc("worker:0"), ok], now=100.0, watch=Watchdog()) is None


def test_done_does_not_excuse_a_failed_exit():
    failed = exited("worker:1", code=1, done=True)
    assert find_incident([failed], now=1.0, watch=Watchdog()).proc == failed


def test_run_always_restarts_clean_exits():
    clean = exited("worker:0", PROGRAM, code=0)
    incident = find_incident([clean], now=1.0, watch=Watchdog(restart_clean_exits=True))
    assert incident.kind is IncidentKind.EXITED and incident.clean_exit


@pytest.mark.parametrize("frozen_for, expected", [(4.9, None), (5.1, IncidentKind.FROZEN)])
def test_a_frozen_process_fails_after_five_seconds(frozen_for, expected):
    frozen = proc("ps:0", SERVER, state=ProcState.FROZEN, frozen_since=100.0)
    incident = find_incident([frozen], now=100.0 + frozen_for, watch=Watchdog())
    assert (incident.kind if incident else None) is expected


@pytest.mark.parametrize("age, started, kind, expected", [
    (190.0, False, TRAIN, True),       # no "start" event by the deadline
    (170.0, False, TRAIN, False),      # still within it
    (190.0, True, TRAIN, False),       # started in time
    (190.0, False, PROGRAM, False),    # programs report nothing: no start deadline
    (190.0, False, SERVER, False),
])
def test_start_deadline(age, started, kind, expected):
    late = proc("worker:0", kind, launched=10.0, started=started)
    incident = find_incident([late], now=10.0 + age, watch=Watchdog(start_timeout=180.0))
    assert (incident is not None and incident.kind is IncidentKind.START_TIMEOUT) is expected


def test_frozen_peer_is_blamed_in_sync_modes():
    frozen = proc("worker:0", state=ProcState.FROZEN, frozen_since=99.0)
    victim = exited("worker:1", code=1)        # failed because worker:0 stopped answering
    incident = find_incident([victim, frozen], now=100.0, watch=Watchdog(blame_frozen=True))
    assert incident.proc == frozen and incident.kind is IncidentKind.FROZEN
    assert "worker:1 exited with code 1 waiting for it" in incident.reason
    plain = find_incident([victim, frozen], now=100.0, watch=Watchdog(blame_frozen=False))
    assert plain.proc == victim


def test_sync_stall_blames_the_least_recent_reporter():
    watch = Watchdog(stall_after=90.0, leader="worker:0")
    leader = proc("worker:0", started=True, last_event=100.0)
    quiet = proc("worker:1", started=True, last_event=40.0)
    assert find_incident([leader, quiet], now=189.0, watch=watch) is None
    incident = find_incident([leader, quiet], now=191.0, watch=watch)
    assert incident.kind is IncidentKind.STALLED and incident.proc == quiet
    finished = proc("worker:0", started=True, last_event=100.0, done=True)
    assert find_incident([finished, quiet], now=500.0, watch=watch) is None      # leader done: no stall


def test_a_quiet_evaluator_is_not_blamed_for_a_stall():
    watch = Watchdog(stall_after=90.0, leader="worker:0")
    leader = proc("worker:0", started=True, last_event=100.0)
    peer = proc("worker:1", started=True, last_event=95.0)
    evaluator = proc("evaluator:0", started=True, last_event=10.0)       # waits for checkpoints
    assert find_incident([leader, peer, evaluator], now=150.0, watch=watch) is None
    incident = find_incident([leader, peer, evaluator], now=191.0, watch=watch)
    assert incident.kind is IncidentKind.STALLED and incident.proc == peer


# ----------------------------------------------------------------------------- restart policy and budget

def incident(failed: Proc) -> Incident:
    return Incident(IncidentKind.EXITED, failed, failed.exit_reason())


@pytest.mark.parametrize("policy, failed, used, action, delay, why", [
    ("never", exited("worker:0"), 0, Action.FAIL, 0.0, "restart policy 'never'"),
    ("on-failure", exited("worker:0"), 0, Action.RESTART, 1.0, None),
    ("on-failure", exited("worker:0"), 1, Action.RESTART, 2.0, None),
    ("on-failure", exited("worker:0"), 2, Action.RESTART, 4.0, None),
    ("on-failure", exited("worker:0"), 3, Action.FAIL, 0.0, "restart budget exhausted (3 restart(s) used)"),
    ("on-failure", exited("ps:0", SERVER, code=0), 0, Action.FAIL, 0.0, None),   # clean exit: not a failure to retry
    ("always", exited("ps:0", SERVER, code=0), 0, Action.RESTART, 1.0, None),
    ("always", exited("chief:0", code=0), 3, Action.FAIL, 0.0, "restart budget exhausted (3 restart(s) used)"),
    ("always", exited("worker:0", PROGRAM, code=0), 3, Action.ACCEPT, 0.0, None),  # run: the clean exit stands
    ("always", exited("worker:0", PROGRAM, code=1), 3, Action.FAIL, 0.0, "restart budget exhausted (3 restart(s) used)"),
    # the evaluator is restarted like any task, but where another task would fail the job it is given up
    ("on-failure", exited("evaluator:0"), 0, Action.RESTART, 1.0, None),
    ("never", exited("evaluator:0"), 0, Action.GIVE_UP, 0.0, "restart policy 'never'"),
    ("on-failure", exited("evaluator:0"), 3, Action.GIVE_UP, 0.0, "restart budget exhausted (3 restart(s) used)"),
    ("on-failure", exited("evaluator:0", code=0), 0, Action.GIVE_UP, 0.0, "it exited 0 before the job ended"),
    ("on-failure", exited("evaluator:0", PROGRAM), 0, Action.RESTART, 1.0, None),     # run: a program like any
    ("never", exited("evaluator:0", PROGRAM), 0, Action.FAIL, 0.0, "restart policy 'never'"),
])
def test_verdict(policy, failed, used, action, delay, why):
    result = verdict(RestartRules(RestartPolicy(policy), max_restarts=3), incident(failed), used)
    assert (result.action, result.delay, result.why) == (action, delay, why)


@pytest.mark.parametrize("policy, failed, used, reason", [
    ("never", exited("worker:0"), 0, FailReason.POLICY),
    ("on-failure", exited("ps:0", SERVER, code=0), 0, FailReason.CLEAN_EXIT),
    ("on-failure", exited("worker:0"), 3, FailReason.BUDGET),
    ("on-failure", exited("evaluator:0"), 3, FailReason.BUDGET),      # given up, for the same reason
    ("on-failure", exited("worker:0"), 1, None),                      # restarted: nothing forbids it
])
def test_a_verdict_names_what_forbids_the_restart(policy, failed, used, reason):
    """The executor tells a used-up budget from a policy by this, never by the prose of ``why``."""
    assert verdict(RestartRules(RestartPolicy(policy), max_restarts=3), incident(failed), used).reason is reason


@pytest.mark.parametrize("policy, failed, used, for_good", [
    ("never", exited("worker:1"), 0, True),                        # failed, and nothing will restart it
    ("never", exited("worker:1", code=0), 0, False),               # a clean exit is not a failure
    ("on-failure", exited("worker:1"), 3, True),                   # its budget is used
    ("on-failure", exited("worker:1"), 2, False),                  # it restarts
    ("on-failure", exited("worker:1", code=0), 0, False),
])
def test_a_task_that_failed_for_good_may_drop_out_of_an_elastic_job(policy, failed, used, for_good):
    assert verdict(RestartRules(RestartPolicy(policy), max_restarts=3), incident(failed), used).for_good is for_good


def test_backoff_doubles_and_is_capped():
    rules = RestartRules(max_restarts=100, backoff=1.0, max_backoff=30.0)
    assert [rules.delay(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]


# ----------------------------------------------------------------------------- the recovery table

HOSTS = ("h1", "h2", "h3")
EVALUATOR = proc("evaluator:0", TRAIN, "h3")
ASYNC_SERVERS = ("ps:0", "ps:1", "worker:0", "worker:1")


def async_procs():
    return [proc("ps:0", SERVER, "h1"), proc("ps:1", SERVER, "h2"), proc("worker:0", SERVER, "h2"),
            proc("worker:1", SERVER, "h3"), proc("chief:0", TRAIN, "h1")]


def sync_procs():
    return [proc("worker:0", TRAIN, "h1"), proc("worker:1", TRAIN, "h2"), proc("worker:2", TRAIN, "h3")]


def syncps_procs():
    return [proc("ps:0", SERVER, "h1"), proc("ps:1", SERVER, "h2")] + sync_procs()


@pytest.mark.parametrize("mode, procs, failed, expected", [
    # async | a worker server: restart it on its host; the coordinator takes it back
    ("async", async_procs(), "worker:1",
     Recovery(wait_hosts=("h3",), stop=("worker:1#1",), restart_servers=("worker:1",))),
    # async | a ps: restart it (the chief then fails by itself and is restarted as below)
    ("async", async_procs(), "ps:0",
     Recovery(wait_hosts=("h1",), stop=("ps:0#1",), restart_servers=("ps:0",))),
    # async | the chief: once every server answers, restart it; it restores the last checkpoint
    ("async", async_procs(), "chief:0",
     Recovery(wait_hosts=HOSTS, stop=("chief:0#1",), ensure_servers=True, relaunch=("chief:0",))),
    # sync | a worker died, froze or stalled: the whole group restarts and resumes
    ("sync", sync_procs(), "worker:1",
     Recovery(wait_hosts=HOSTS, stop=("worker:0#1", "worker:1#1", "worker:2#1"),
              relaunch=("worker:0", "worker:1", "worker:2"))),
    # sync-ps | a worker: workers and ps stop, the ps restart, the workers relaunch
    ("sync-ps", syncps_procs(), "worker:2",
     Recovery(wait_hosts=HOSTS, stop=("worker:0#1", "worker:1#1", "worker:2#1", "ps:0#1", "ps:1#1"),
              restart_servers=("ps:0", "ps:1"), relaunch=("worker:0", "worker:1", "worker:2"))),
    # sync-ps | a ps: the same
    ("sync-ps", syncps_procs(), "ps:1",
     Recovery(wait_hosts=HOSTS, stop=("worker:0#1", "worker:1#1", "worker:2#1", "ps:0#1", "ps:1#1"),
              restart_servers=("ps:0", "ps:1"), relaunch=("worker:0", "worker:1", "worker:2"))),
    # any | the evaluator: restarted alone on its host; training goes on
    ("async", async_procs() + [EVALUATOR], "evaluator:0",
     Recovery(wait_hosts=("h3",), stop=("evaluator:0#1",), relaunch=("evaluator:0",))),
    ("sync", sync_procs() + [EVALUATOR], "evaluator:0",
     Recovery(wait_hosts=("h3",), stop=("evaluator:0#1",), relaunch=("evaluator:0",))),
    ("sync-ps", syncps_procs() + [EVALUATOR], "evaluator:0",
     Recovery(wait_hosts=("h3",), stop=("evaluator:0#1",), relaunch=("evaluator:0",))),
    # sync | a worker, with an evaluator: the group restarts, the evaluator is left running
    ("sync", sync_procs() + [EVALUATOR], "worker:1",
     Recovery(wait_hosts=HOSTS, stop=("worker:0#1", "worker:1#1", "worker:2#1"),
              relaunch=("worker:0", "worker:1", "worker:2"))),
    # sync-ps | a ps, with an evaluator: the same
    ("sync-ps", syncps_procs() + [EVALUATOR], "ps:0",
     Recovery(wait_hosts=HOSTS, stop=("worker:0#1", "worker:1#1", "worker:2#1", "ps:0#1", "ps:1#1"),
              restart_servers=("ps:0", "ps:1"), relaunch=("worker:0", "worker:1", "worker:2"))),
])
def test_train_recovery_table(mode, procs, failed, expected):
    victim = next(p for p in procs if p.task == failed)
    servers = [p.task for p in procs if p.kind is SERVER]
    trainers = [p.task for p in procs if p.kind is TRAIN and not p.is_evaluator]   # plan.training_tasks
    assert train_recovery(Mode(mode), victim, procs, hosts=HOSTS, servers=servers, trainers=trainers) == expected


def test_program_recovery_restarts_the_one_task():
    failed = proc("worker:1", PROGRAM, "h2")
    assert program_recovery(failed) == Recovery(wait_hosts=("h2",), stop=("worker:1#1",), relaunch=("worker:1",))


# ----------------------------------------------------------------------------- hosts

@pytest.mark.parametrize("policy, lost_for, fails", [
    ("on-failure", 59.0, False), ("on-failure", 61.0, True), ("always", 61.0, True), ("never", 0.5, True),
])
def test_a_lost_host_fails_the_job_after_the_host_timeout(policy, lost_for, fails):
    hosts = [HostView("h1"), HostView("h2", lost_since=100.0, error="no heartbeat for 4 s")]
    failed = lost_host_failure(hosts, now=100.0 + lost_for, host_timeout=60.0, policy=RestartPolicy(policy))
    assert (failed.host if failed else None) == ("h2" if fails else None)


# ----------------------------------------------------------------------------- completion

def test_training_completes_when_the_leader_finished_and_the_others_ended():
    leader = exited("worker:0", code=0, done=True)
    running = proc("worker:1")
    assert not train_outcome([leader, running], leader="worker:0", leader_done_at=None, now=10.0).complete
    waiting = train_outcome([leader, running], leader="worker:0", leader_done_at=10.0, now=39.0)
    assert not waiting.complete
    late = train_outcome([leader, running], leader="worker:0", leader_done_at=10.0, now=41.0)
    assert late.complete and late.stop == ("worker:1#1",)        # stragglers are stopped
    finished = proc("worker:1", finished=True)
    assert train_outcome([leader, finished], leader="worker:0", leader_done_at=10.0, now=11.0).complete
    servers = [leader, proc("ps:0", SERVER)]                      # standing servers do not hold it up
    assert train_outcome(servers, leader="worker:0", leader_done_at=10.0, now=11.0).complete


@pytest.mark.parametrize("evaluator, now, complete, stop", [
    (proc("evaluator:0"), 41.0, False, ()),                          # past the trainers' linger: still waited for
    (proc("evaluator:0"), 131.0, True, ("evaluator:0#1",)),          # past its own: stopped
    (proc("evaluator:0", finished=True), 11.0, True, ()),            # evaluated the final checkpoint
    (exited("evaluator:0", code=0, done=True), 11.0, True, ()),      # ... and exited by itself
])
def test_training_waits_for_the_evaluator_to_evaluate_the_final_checkpoint(evaluator, now, complete, stop):
    leader = exited("chief:0", code=0, done=True)
    outcome = train_outcome([leader, evaluator], leader="chief:0", leader_done_at=10.0, now=now)
    assert (outcome.complete, outcome.stop) == (complete, stop)


def done(task: str, kind: ProcessKind = PROGRAM) -> Proc:
    return exited(task, kind, code=0, finished=True)


CHIEF, WORKERS, ALL = Until.CHIEF, Until.WORKERS, Until.ALL


@pytest.mark.parametrize("procs, until, finished, stop", [
    # TF1 between-graph (no chief; --until workers by default): the ps never end, run stops them.
    ([done("worker:0"), done("worker:1"), proc("ps:0", PROGRAM)], WORKERS, True, ("ps:0#1",)),
    ([done("worker:0"), proc("worker:1", PROGRAM), proc("ps:0", PROGRAM)], WORKERS, False, ()),
    # A coordinator on a cluster that is up: the standing servers are not the run's.
    ([done("chief:0"), proc("ps:0", SERVER), proc("worker:0", SERVER)], CHIEF, True, ()),
    # The same binary on every task (ParameterServerStrategy): the chief's exit ends the run.
    ([done("chief:0"), proc("ps:0", PROGRAM), proc("worker:0", PROGRAM), proc("worker:1", PROGRAM)], CHIEF,
     True, ("ps:0#1", "worker:0#1", "worker:1#1")),
    ([proc("chief:0", PROGRAM), done("worker:0"), done("worker:1")], CHIEF, False, ()),
    # MWMS with a chief, --until workers: the chief finished, a worker still saves.
    ([done("chief:0"), proc("worker:0", PROGRAM), done("worker:1")], WORKERS, False, ()),
    ([done("chief:0"), done("worker:0"), proc("evaluator:0", PROGRAM)], WORKERS, True, ("evaluator:0#1",)),
    ([done("ps:0"), done("ps:1")], ALL, True, ()),                                       # --on ps
    ([done("ps:0"), proc("ps:1", PROGRAM)], ALL, False, ()),
    ([done("worker:0"), done("ps:0")], ALL, True, ()),                                 # a ps that exits by itself
    ([], CHIEF, False, ()),
])
def test_a_run_ends_when_what_until_names_finished(procs, until, finished, stop):
    end = program_end(procs, until=until)
    assert (end.done, end.stop) == (finished, stop)


def test_a_run_never_waits_silently_on_tasks_that_never_exit():
    # --until all, TF1: the workers are done, only the ps (server.join()) are left.
    procs = [done("worker:0"), proc("ps:0", PROGRAM), proc("ps:1", PROGRAM)]
    first = program_end(procs, until=ALL, now=5.0)
    assert (first.done, first.idle) == (False, ("ps:0", "ps:1"))        # named, so the executor says so
    assert not program_end(procs, until=ALL, idle_since=5.0, now=14.0).done   # their linger
    last = program_end(procs, until=ALL, idle_since=5.0, now=15.0)
    assert (last.done, last.stop) == (True, ("ps:0#1", "ps:1#1")) and "never exit" in last.why


@pytest.mark.parametrize("serving_workers, idle", [(True, ("worker:0", "ps:0")), (False, ())])
def test_parameter_server_strategy_workers_never_exit_once_their_chief_is_gone(serving_workers, idle):
    procs = [done("chief:0"), proc("worker:0", PROGRAM), proc("ps:0", PROGRAM)]
    end = program_end(procs, until=WORKERS, serving_workers=serving_workers, now=1.0)
    assert (end.done, end.idle) == (False, idle)
    # While the chief coordinates, a worker is expected to serve: nothing is idle.
    busy = [proc("chief:0", PROGRAM), proc("worker:0", PROGRAM), proc("ps:0", PROGRAM)]
    assert program_end(busy, until=WORKERS, serving_workers=True).idle == ()


@pytest.mark.parametrize("roles, until", [
    (["chief", "ps", "worker"], CHIEF), (["ps", "worker"], WORKERS), (["worker"], WORKERS), (["ps"], ALL),
    (["chief"], CHIEF), (["worker", "evaluator"], WORKERS),
])
def test_default_until(roles, until):
    assert default_until(roles) is until


@pytest.mark.parametrize("until, roles, problem", [
    (CHIEF, ["ps", "worker"], "--until chief: no chief runs the program"),
    (WORKERS, ["ps"], "--until workers: no chief or worker runs the program"),
    (CHIEF, ["chief", "worker"], None), (WORKERS, ["chief"], None), (ALL, ["ps"], None),
])
def test_until_must_name_tasks_that_run(until, roles, problem):
    assert until_problem(until, roles) == problem
