"""TensorBoard summaries, the pure parts: where a point falls and what it holds (roles/summaries.py),
the step schedule cutting chunks at summary boundaries, and what `pscluster tensorboard` plans
(cluster/tensorboard.py): host, folder, argv, record, ports."""
from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.contracts import ProcessKind
from cluster.layout import leader_layout
from cluster.supervision.train_spec import JobRef
from cluster.tensorboard import board_spec, host_ports
from roles import hostctl
from roles.settings import StepSchedule
from roles.summaries import Summaries, SummaryPoint, SummaryWindow, event_file_name

from .test_state import lab_state
from .test_step_schedule import PLAN, walk


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_point_at_each_multiple_with_the_mean_loss_and_the_rates_of_its_interval():
    clock = Clock()
    window = SummaryWindow(10, 0, clock)
    clock.now = 105.0                     # the first unit: 5 s of tracing, not throughput
    assert window.add(4, 4, 256, 2.0, timed=False) is None
    clock.now = 106.0
    assert window.add(8, 4, 256, 1.0) is None
    clock.now = 106.5
    # hand-checked: loss (4*2 + 4*1 + 2*0.5) / 10 = 1.3; 6 timed steps in the 1.5 s since the first unit
    assert window.add(10, 2, 128, 0.5) == SummaryPoint(step=10, loss=1.3, steps_per_second=4.0,
                                                       examples_per_second=256.0)
    clock.now = 108.5
    assert window.add(20, 10, 640, 0.25) == SummaryPoint(20, 0.25, 5.0, 320.0)
    assert window.flush(20) is None       # nothing since the last point


def test_jumping_steps_give_one_point_per_interval_and_the_end_closes_a_partial_one():
    clock = Clock()
    window = SummaryWindow(10, 0, clock)
    points = []
    for step in (3, 7, 12, 14, 23, 28):   # sync-ps: the global step counts every worker's update
        clock.now += 1.0
        points.append(window.add(step, 3, 30, 1.0))
    assert [p.step for p in points if p] == [12, 23]      # 12 passed 10, 23 passed 20
    clock.now += 1.0
    last = window.flush(28)                               # 3 steps in the 2 s since 23
    assert last is not None and (last.step, last.loss, last.steps_per_second) == (28, 1.0, 1.5)


def test_a_resumed_run_starts_at_the_next_boundary():
    window = SummaryWindow(100, 250, Clock())
    assert window.next == 300
    assert window.add(290, 40, 40, 1.0) is None and window.add(300, 10, 10, 1.0).step == 300


def test_no_interval_below_one_step():
    with pytest.raises(ValueError):
        SummaryWindow(0, 0, Clock())


class FakeFile:
    def __init__(self, directory):
        self.directory, self.path, self.points, self.starts, self.closed = directory, directory + "/events", [], [], False

    def session_start(self, step):
        self.starts.append(step)

    def scalars(self, step, values):
        self.points.append((step, dict(values)))

    def close(self):
        self.closed = True


def test_summaries_write_the_scalars_the_issue_asks_for():
    files = []
    summaries = Summaries("/tb/job", 10, 0.05, 2, clock=Clock(), open_file=lambda d: files.append(FakeFile(d)) or files[-1])
    summaries.trained(10, 10, 640, 1.0)          # before start: nowhere to write yet
    summaries.start(40)                          # a restart resumed at step 40
    summaries.trained(45, 5, 320, 1.0, timed=False)
    summaries.trained(50, 5, 320, 0.5)
    summaries.eval(50, 0.4, 0.9)
    summaries.trained(53, 3, 192, 0.5)
    summaries.close(53)
    (file,) = files
    assert file.directory == "/tb/job" and file.starts == [40] and file.closed
    assert [step for step, _ in file.points] == [50, 50, 53]
    assert set(file.points[0][1]) == {"loss", "steps_per_second", "examples_per_second", "learning_rate", "restarts"}
    assert (file.points[0][1]["loss"], file.points[0][1]["learning_rate"], file.points[0][1]["restarts"]) == (0.75, 0.05, 2.0)
    assert file.points[1][1] == {"val_loss": 0.4, "val_accuracy": 0.9}


def test_a_failing_write_turns_summaries_off_and_training_goes_on():
    class Broken(FakeFile):
        def scalars(self, step, values):
            raise OSError("No space left on device")

    summaries = Summaries("/tb", 1, 0.1, 0, clock=Clock(), open_file=Broken)
    summaries.start(0)
    summaries.trained(1, 1, 64, 1.0)             # raises inside: logged, then off
    summaries.trained(2, 1, 64, 1.0)
    summaries.close(2)


def test_event_files_sort_by_time_and_are_found_by_tensorboard():
    older, newer = event_file_name("h", 9, 1700000000.5), event_file_name("h", 1, 1700000001.25)
    assert "tfevents" in older and sorted([newer, older]) == [older, newer]


def test_the_schedule_cuts_chunks_at_summary_boundaries():
    plan = dataclasses.replace(PLAN, checkpoint_every=None, eval_every=None, summary_every=10, steps_total=30)
    # hand-checked: K=8 cut at 10, 20 and 30
    assert [n for _, n, _ in walk(plan)] == [8, 2, 8, 2, 8, 2]
    schedule = StepSchedule(plan, 0)
    schedule.reached(13)                  # a jump past 10: the next cut is at 20
    assert schedule.chunk(13) == 7


def test_tensorboard_runs_on_the_leaders_host_over_the_run_folder():
    for mode, leader in (("async", "chief:0"), ("sync", "worker:0"), ("sync-ps", "worker:0")):
        state = lab_state(mode=mode)
        spec = board_spec(state)
        assert spec.owner.name == leader
        workdir = spec.owner.workdir.rstrip("/")
        assert spec.logdir == leader_layout(state.plan).tensorboard_root == f"{workdir}/.pscluster/lab/tensorboard"
        assert spec.argv("/venv/bin/python", 6007) == ["/venv/bin/python", "-m", "tensorboard.main", "--logdir",
                                                       spec.logdir, "--host", "127.0.0.1", "--port", "6007"]
        record = spec.record
        assert (record.key, record.task, record.host, record.kind) == ("tensorboard#1", "tensorboard", spec.owner.host,
                                                                       ProcessKind.TENSORBOARD)
        assert record.log == f"{workdir}/.pscluster/lab/tensorboard.1.log"
        env = spec.env("lab")
        assert "TF_CONFIG" not in env and env["PSCLUSTER_CLUSTER"] == "lab" and env["CUDA_VISIBLE_DEVICES"] == ""
        # a second start gets its own record and log; status rows (plan tasks) never see these
        state.processes.append(record)
        assert board_spec(state).record.key == "tensorboard#2"
        assert state.latest(leader) is not record


def test_a_jobs_summaries_live_in_its_own_run_of_the_tensorboard_folder():
    state = lab_state()
    job = JobRef("distributed_mnist", "distributed_mnist", Path("/checkout/examples/distributed_mnist"), True)
    layout = leader_layout(state.plan)
    assert layout.summary_dir(job.name) == layout.tensorboard_root + "/distributed_mnist"


def test_ports_tried_for_tensorboard():
    assert host_ports(6006, local=True) == [6006]             # the URL's port is TensorBoard's own
    assert host_ports(6006, local=False) == list(range(6006, 6026))
    assert host_ports(65530, local=False) == list(range(65530, 65536))


def test_hostctl_finds_event_files_a_few_folders_down(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("x.tfevents.1", "a/y.tfevents.2", "a/b/z.tfevents.3", "a/notes.txt"):
        (tmp_path / name).write_text("")
    found = hostctl.op_find({"root": str(tmp_path), "contains": "tfevents", "depth": 1})
    assert found == {"root": str(tmp_path), "exists": True, "files": ["a/y.tfevents.2", "x.tfevents.1"]}
    assert hostctl.op_find({"root": str(tmp_path / "none"), "contains": "tfevents"})["exists"] is False


def test_the_supervisor_tells_the_leader_where_to_write_and_how_many_restarts_came_before(tmp_path):
    """Only the leader gets --summary-dir; a relaunch after a restart carries the job's count."""
    from cluster.supervision.train_spec import JobOptions
    from roles.train import parse_options

    from .conftest import idle_supervisor
    supervisor = idle_supervisor(tmp_path, name="tb", mode="sync", options=JobOptions(summary_every=7))
    plan = supervisor.plan
    launched = {}
    supervisor.launch = lambda task, record, *, argv, **_: launched.setdefault(task.name, []).append(argv)
    for task in plan.training_tasks:
        supervisor.kind.launch_train(supervisor, task, resume=False)
    supervisor.count_restart("worker:1")
    supervisor.kind.launch_train(supervisor, plan.task("worker:0"), resume=True)
    first, again = (parse_options(argv[3:]) for argv in launched["worker:0"])
    (other,) = (parse_options(argv[3:]) for argv in launched["worker:1"])
    assert first.summary_dir == again.summary_dir == "/checkout/.pscluster/tb/tensorboard/distributed_mnist"
    assert (first.restarts, again.restarts) == (0, 1)
    assert other.summary_dir is None and first.summary_every == other.summary_every == 7


def test_a_tensorboard_that_exits_is_reported_with_the_install_hint_and_its_record_stopped(tmp_path, monkeypatch):
    """TensorBoard missing on the leader's host: the module error from its log, a hint, nothing left recorded live."""
    from cluster import tensorboard
    from cluster.hosts import hostops
    from cluster.errors import HostError
    from cluster.state import StateStore
    from cluster.transport import TransportPool

    store = StateStore(tmp_path / "state")
    store.save(lab_state(name="tb", mode="sync"))
    calls = []
    monkeypatch.setattr(hostops, "find", lambda t, root, **kw: hostops.Found(root, True, ("mnist/events.out.tfevents.1",)))
    monkeypatch.setattr(hostops, "facts", lambda t, **kw: type("F", (), {"busy_ports": ((6006, "in use"),)})())
    monkeypatch.setattr(hostops, "start", lambda t, task, record, **kw: calls.append(("start", kw["argv"])) or
                        replace(record, pid=11, pgid=11))
    monkeypatch.setattr(hostops, "status", lambda t, records: {
        records[0].key: hostops.TaskStatus(records[0].key, "exited", exit_code=1)})
    monkeypatch.setattr(hostops, "log_tail", lambda t, path, **kw: "ModuleNotFoundError: No module named 'tensorboard'")
    monkeypatch.setattr(hostops, "stop", lambda t, records, **kw: calls.append(("stop", [r.key for r in records])))
    monkeypatch.setattr(tensorboard, "answers", lambda url: False)

    class Forwarding:
        def forward(self, address, port, *, local_port=0):
            calls.append(("forward", address, port, local_port))
            return f"127.0.0.1:{local_port}"

    pool = TransportPool(factory=lambda host: Forwarding())
    run = tensorboard.TensorBoardRun(store=store, name="tb", pool=pool, port=6006, sleep=lambda _: None)
    with pytest.raises(HostError) as caught:
        run.start()
    assert "pip install 'pscluster[tensorboard]'" in (caught.value.hint or "")
    # 6006 is taken on the SSH host: TensorBoard listens on 6007 there, the forward on 6006 here
    assert calls[0] == ("forward", "127.0.0.1", 6007, 6006)
    assert calls[1][0] == "start" and calls[1][1][-2:] == ["--port", "6007"]
    assert calls[2] == ("stop", ["tensorboard#1"])
    (record,) = [r for r in store.load("tb").processes if r.kind == "tensorboard"]
    assert record.stopped and record.pid == 11
