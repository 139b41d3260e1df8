"""The standby's decision whether it may run a job (roles/standby.py), and the orchestrator's
bookkeeping of standbys (which tasks get one, how a state finds it). Pure: no TensorFlow, no
process; the adoption itself is tested end to end in tests/local/test_standby.py."""
from __future__ import annotations

import sys

import pytest

from cluster.contracts import ProcessKind
from cluster.inventory import load_inventory
from cluster.lifecycle.tasks import standby_starts
from cluster.plan import PlanOptions, plan_cluster
from cluster.state import ProcessRecord, RunState
from roles.standby import digests, import_time_env, project_sources, verdict

PYTHON = "/opt/venv/bin/python"
ENV = {"HOME": "/home/u", "PATH": "/usr/bin", "TF_ENABLE_ONEDNN_OPTS": "1", "OMP_NUM_THREADS": "2",
       "PSCLUSTER_INTRA_OP_THREADS": "2", "TF_CONFIG": '{"task": {"type": "chief", "index": 0}}',
       "SSH_CONNECTION": "127.0.0.1 5000 127.0.0.2 22"}


def request(**changes):
    base = {"argv": [PYTHON, "-m", "roles.train", "--mode", "async", "--job", "j"], "env": dict(ENV),
            "cwd": "/", "log": "/work/x.log", "reply": "/work/x.log.adopt"}
    base.update(changes)
    return base


def decide(req, *, env=ENV, sources=None, loaded=None):
    return verdict(req, interpreter=PYTHON, cwd="/", env=env, sources=sources or {}, loaded=loaded or {})


def test_a_matching_request_is_taken():
    assert decide(request()) is None


def test_variables_read_after_the_import_and_unrelated_ones_may_differ():
    env = dict(ENV, TF_CONFIG='{"task": {"type": "chief", "index": 1}}', SSH_CONNECTION="other", PATH="/x",
               SECRET_TOKEN="s3cret", PSCLUSTER_DATA="/d")
    assert decide(request(env=env)) is None


@pytest.mark.parametrize("name, value", [("OMP_NUM_THREADS", "1"), ("TF_ENABLE_ONEDNN_OPTS", "0"),
                                         ("PSCLUSTER_INTRA_OP_THREADS", "4"), ("CUDA_VISIBLE_DEVICES", "0"),
                                         ("HOME", "/home/other"), ("PYTHONPATH", "/lib"), ("LD_PRELOAD", "x.so")])
def test_an_import_time_variable_that_changed_or_appeared_declines(name, value):
    reason = decide(request(env=dict(ENV, **{name: value})))
    assert reason is not None and name in reason


def test_a_variable_that_vanished_declines():
    env = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}
    assert "OMP_NUM_THREADS" in decide(request(env=env))


def test_the_reason_names_variables_never_values():
    reason = decide(request(env=dict(ENV, TF_SECRET_KEY="hunter2")))
    assert "TF_SECRET_KEY" in reason and "hunter2" not in reason


@pytest.mark.parametrize("req, words", [
    (request(argv=[PYTHON, "-m", "roles.server"]), "roles.train"),
    (request(argv=["/usr/bin/python3", "-m", "roles.train", "--mode", "async"]), "interpreter"),
    (request(cwd="/elsewhere"), "folder"),
    (request(env={"A": 1}), "environment"),
    (request(log=None), "log"),
    ([1, 2], "JSON object"),
])
def test_a_request_this_standby_cannot_run_declines(req, words):
    reason = decide(req)
    assert reason is not None and words in reason


def test_code_changed_on_disk_since_the_standby_started_declines(tmp_path):
    module = tmp_path / "mod.py"
    module.write_text("x = 1\n")
    sources = {"roles.mod": str(module)}
    loaded = digests(sources)
    assert decide(request(), sources=sources, loaded=loaded) is None
    module.write_text("x = 2\n")
    assert "roles.mod" in decide(request(), sources=sources, loaded=loaded)
    module.unlink()
    assert "roles.mod" in decide(request(), sources=sources, loaded=loaded)


def test_the_import_time_set_and_the_project_modules():
    assert import_time_env(ENV) == {k: ENV[k] for k in ("HOME", "TF_ENABLE_ONEDNN_OPTS", "OMP_NUM_THREADS",
                                                        "PSCLUSTER_INTRA_OP_THREADS")}
    # the task's name is read when the job runs: another task's standby on the host may take it
    assert decide(request(env={**ENV, "PSCLUSTER_TASK": "worker:1"}), env={**ENV, "PSCLUSTER_TASK": "worker:2"}) is None
    assert "CUDA_VISIBLE_DEVICES" in decide(request(env={**ENV, "CUDA_VISIBLE_DEVICES": "1"}),
                                            env={**ENV, "CUDA_VISIBLE_DEVICES": "0"})
    import roles.standby  # noqa: F401 - loaded, so it must be among the project's sources
    sources = project_sources(sys.modules)
    assert "roles.standby" in sources and "roles.guardian" in sources
    assert not any(name.split(".")[0] != "roles" for name in sources)


# ------------------------------------------------------------------ orchestrator side
def _plan(tmp_path, text: str, mode: str):
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return plan_cluster(load_inventory(str(path)), PlanOptions(local_python=PYTHON, local_workdir="/w", mode=mode))


INVENTORY = """
all:
  vars: {ansible_connection: local, pscluster_python: /opt/venv/bin/python, pscluster_workdir: /w}
  children:
    chief: {hosts: {a: }}
    ps: {hosts: {a: }}
    worker: {hosts: {a: {worker_tasks: 2}, b: {pscluster_standby: false}}}
"""


@pytest.mark.parametrize("mode, tasks", [("async", ["chief:0"]), ("sync", ["worker:0", "worker:1"]),
                                         ("sync-ps", ["worker:0", "worker:1"])])
def test_a_standby_for_each_training_task_on_hosts_that_allow_one(tmp_path, mode, tasks):
    plan = _plan(tmp_path, INVENTORY, mode)
    state = RunState(name=plan.name, plan=plan)
    items = standby_starts(plan, state, None)
    assert [task.name for task, *_ in items] == tasks            # worker:2 is on b: pscluster_standby: false
    task, record, argv, env = items[0]
    assert record.kind == ProcessKind.STANDBY and record.key == f"{task.name}#s1"
    assert record.log == f"/w/.pscluster/inv/standby/{task.role}-{task.index}.1.log"
    assert argv == ["/opt/venv/bin/python", "-m", "roles.standby", "--fifo", record.log + ".fifo",
                    "--ready", record.log + ".ready"]
    assert env == plan.task_env(task)


def test_only_the_tasks_asked_for(tmp_path):
    # after a job, `train` refills only the standbys it took (none on a cluster brought up without)
    plan = _plan(tmp_path, INVENTORY, "sync")
    state = RunState(name=plan.name, plan=plan)
    assert [t.name for t, *_ in standby_starts(plan, state, None, {"worker:1"})] == ["worker:1"]
    assert standby_starts(plan, state, None, set()) == []


def test_a_state_finds_the_live_standby_and_latest_ignores_it(tmp_path):
    plan = _plan(tmp_path, INVENTORY, "async")
    state = RunState(name=plan.name, plan=plan)
    (task, record, _, _), = standby_starts(plan, state, None)
    state.processes.append(record)
    assert state.standby("chief:0") == record and state.latest("chief:0") is None
    assert standby_starts(plan, state, None) == []                 # it has one already
    train = ProcessRecord(key="chief:0#j1.1", task="chief:0", host="a", kind="train", attempt=1,
                          log="/w/l", exit_file="/w/l.exit")
    state.processes[0] = ProcessRecord(**{**record.__dict__, "stopped": True})     # taken over
    state.processes.append(train)
    assert state.standby("chief:0") is None and state.latest("chief:0") == train
    (_, second, _, _), = standby_starts(plan, state, None)
    assert second.key == "chief:0#s2" and second.log.endswith("/standby/chief-0.2.log")


def test_slurm_hosts_never_get_one(tmp_path):
    plan = _plan(tmp_path, INVENTORY.replace("ansible_connection: local", "ansible_connection: slurm"), "async")
    assert not plan.host("a").standby
    assert standby_starts(plan, RunState(name=plan.name, plan=plan), None) == []


def test_a_standby_start_removes_an_earlier_ready_file(tmp_path):
    # A cluster of the same name left standby/chief-0.1.log.ready behind: the new standby's start
    # removes it, or `status` would call a standby ready while it still imports TensorFlow.
    from cluster.hosts.hostops import _start_request
    plan = _plan(tmp_path, INVENTORY, "async")
    (task, record, argv, env), = standby_starts(plan, RunState(name=plan.name, plan=plan), None)
    assert _start_request(task, record, argv, env)["fresh"] == [record.log + ".ready"]


def test_an_elastic_job_refills_its_standbys_only_once_the_relaunched_leader_trains():
    """After a relaunch that took standbys (a resize, a host's loss), new standbys are started
    once the leader reports a step again, not inside the relaunch's pause, where their
    TensorFlow import would take the CPU the new processes' start needs."""
    from types import SimpleNamespace

    from cluster.contracts import Mode
    from cluster.supervision.elastic import Elastic
    from cluster.supervision.train_job import TrainJob

    train = TrainJob(SimpleNamespace(name="j"), SimpleNamespace(), Elastic(min_workers=1))
    refills: list[set[str]] = []
    train.refill_standbys = lambda ex: refills.append(set(train.standby_tasks))     # type: ignore[method-assign]
    train.resizer.elastic_turn = lambda ex: None                                   # type: ignore[method-assign]
    train.resizer.notice_turn = lambda ex: None                                    # type: ignore[method-assign]
    leader = SimpleNamespace(name="worker:0", role="worker")
    train.leader = leader
    ex = SimpleNamespace(plan=SimpleNamespace(mode=Mode.SYNC), set_job=lambda **_: None, job_record=dict,
                         reporter=SimpleNamespace(emit=lambda *_, **__: None))
    train.last_step = 1224                     # trained before the relaunch
    train.standby_tasks = {"worker:0", "worker:1", "worker:2"}     # the relaunch took these
    train.resizer.between_turns(ex)            # the relaunched workers still start: no refill
    assert refills == []
    follower = SimpleNamespace(task=SimpleNamespace(name="worker:1", role="worker"), last_event=0.0)
    train.on_event(ex, follower, {"event": "progress", "step": 1225}, 1.0)
    train.resizer.between_turns(ex)            # a follower's step is not the job's
    assert refills == []
    watched = SimpleNamespace(task=leader, last_event=0.0)
    train.on_event(ex, watched, {"event": "progress", "step": 1225}, 1.0)
    train.resizer.between_turns(ex)
    assert refills == [{"worker:0", "worker:1", "worker:2"}] and not train.standby_tasks
