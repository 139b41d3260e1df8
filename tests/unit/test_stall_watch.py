"""Issue 41, item 1: no silent hang. The async chief's closure watch (roles/closures.py: which
worker it waits on, and cutting a hung call loose, on real sockets), the supervisor's stall limit
(cluster/supervision/core.py) and what the job record, status and the CLI say. The end-to-end
proof, a worker's link cut while a closure runs on it, is tests/faults/test_async_faults.py."""
from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from cluster.console.tables import render_job_line
from cluster.contracts import JobState, ProcessKind, ProcState, Role
from cluster.supervision.core import (IncidentKind, Proc, Watchdog, find_incident, stall_limit,
                                      stall_shown_after)
from cluster.jobrecord import JobProgress
from cluster.supervision.train_spec import JobOptions
from roles import closures
from tests.helpers import run_cli

from .conftest import idle_supervisor

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"


def _line(remote: str, state: str, inode: str) -> str:
    return f"   0: 0100007F:9C40 {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1"


# ----------------------------------------------------------------------------- /proc parsing

def test_connected_inodes_takes_connections_to_the_address_only():
    lines = [HEADER,
             _line("0400004D:2710", "01", "111"),      # 77.0.0.4:10000 (127.77.0.4 is 04004D7F)
             _line("04004D7F:2710", "01", "222"),      # 127.77.0.4:10000, established
             _line("04004D7F:2710", "08", "333"),      # the same, CLOSE_WAIT: still a connection
             _line("04004D7F:2711", "01", "444"),      # another port
             _line("04004D7F:2710", "0A", "555"),      # a listener is no connection
             _line("0000000000000000FFFF000004004D7F:2710", "01", "666"),   # tcp6, IPv4-mapped
             "garbage", ""]
    assert closures.connected_inodes(lines, {"127.77.0.4"}, 10000) == {"222", "333", "666"}
    assert closures.connected_inodes(lines, {"127.77.0.5"}, 10000) == set()


def test_resolve_takes_addresses_and_names():
    assert closures.resolve("127.0.0.1") == {"127.0.0.1"}
    assert "127.0.0.1" in closures.resolve("localhost")
    assert closures.resolve("no-such-host.invalid") == set()


def test_cut_connections_ends_this_process_connection_and_nothing_else():
    server = socket.create_server(("127.0.0.1", 0))
    other = socket.create_server(("127.0.0.1", 0))
    port, other_port = server.getsockname()[1], other.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    kept = socket.create_connection(("127.0.0.1", other_port))
    accepted, _ = server.accept()
    accepted_kept, _ = other.accept()
    try:
        assert closures.own_connections(f"127.0.0.1:{port}") == [client.fileno()]
        assert closures.cut_connections(f"localhost:{port}") == 1
        accepted.settimeout(10)
        assert accepted.recv(1) == b""                  # the peer sees the connection end...
        with pytest.raises(OSError):
            client.send(b"x")                           # ...and so does its owner, whose fd stays open
        assert client.fileno() >= 0
        kept.sendall(b"y")                              # the other connection is untouched
        accepted_kept.settimeout(10)
        assert accepted_kept.recv(1) == b"y"
        assert closures.cut_connections("127.0.0.1:notaport") == 0
        assert closures.cut_connections(f"no-such-host.invalid:{port}") == 0
    finally:
        for sock in (client, kept, accepted, accepted_kept, server, other):
            sock.close()


# ----------------------------------------------------------------------------- the chief's watch

class FakeChief:
    def __init__(self):
        self.events: list[dict] = []
        self.cut: list[str] = []
        self.busy: dict[int, float] = {}

    def watch(self) -> closures.ClosureWatch:
        return closures.ClosureWatch(["h1:2224", "h2:2225", "h3:2226"],
                                     lambda event, **fields: self.events.append({"event": event, **fields}),
                                     cut=lambda address: self.cut.append(address) or 2, busy=lambda: self.busy)


def test_the_chief_names_the_worker_it_waits_on_and_cuts_a_hung_one_loose_once():
    chief = FakeChief()
    watch = chief.watch()
    chief.busy = {0: 99.0, 2: 90.0, 1: 98.0}        # worker:2's closure began first
    watch.check(100.0, waited=4.0, slowest=0.5, step=640)
    assert chief.events == []                       # under waiting_after (5 s): a normal wait
    watch.check(100.0, waited=6.0, slowest=0.5, step=640)
    assert chief.events == [{"event": "waiting", "worker": "worker:2", "seconds": 6.0, "step": 640}]
    watch.check(102.0, waited=8.0, slowest=0.5, step=640)
    assert len(chief.events) == 1                   # repeated every WAITING_EVERY seconds only
    watch.check(105.0, waited=11.0, slowest=0.5, step=640)
    assert len(chief.events) == 2 and chief.cut == []       # 15 s: under stuck_after (20 s)
    # The others finish their closures (nothing is waited on), but worker:2's has run 21 s.
    watch.check(111.0, waited=0.3, slowest=0.5, step=700)
    assert chief.cut == ["h3:2226"] and watch.cuts == 1 and len(chief.events) == 2
    chief.busy = {2: 90.0}                          # the others' closures finished
    watch.check(130.0, waited=30.0, slowest=0.5, step=700)
    assert chief.cut == ["h3:2226"]                 # the same closure is cut once
    chief.busy = {2: 125.0, 0: 100.0}               # worker:2 came back and hangs again; worker:0 too
    watch.check(150.0, waited=1.0, slowest=0.5, step=800)
    assert chief.cut == ["h3:2226", "h1:2224", "h3:2226"]     # every hung one, by index


def test_a_slow_job_is_judged_by_its_own_units_of_work():
    chief = FakeChief()
    watch = chief.watch()
    chief.busy = {1: 0.0}
    watch.check(100.0, waited=100.0, slowest=12.0, step=10)      # 100 s < 10 x 12 s: slow, not hung
    assert chief.cut == [] and chief.events[0]["worker"] == "worker:1"
    watch.check(130.0, waited=130.0, slowest=12.0, step=10)
    assert chief.cut == ["h2:2225"]


def test_no_busy_worker_or_an_unknown_index_is_never_cut():
    chief = FakeChief()
    watch = chief.watch()
    watch.check(100.0, waited=100.0, slowest=0.1, step=1)
    chief.busy = {7: 0.0}                          # a worker the watch does not know (yet)
    watch.check(100.0, waited=100.0, slowest=0.1, step=1)
    assert chief.cut == [] and chief.events[-1]["worker"] == "worker:7"


def test_the_lookout_acts_while_the_loop_is_blocked_and_survives_a_failing_look():
    """The chief's loop may block where no wait of ours is (a save behind a cut worker): the cut
    requests and the watch run on a thread beside it (roles/closures.py Lookout)."""
    import threading
    looked, blocked = [], threading.Event()

    def look():
        looked.append(1)
        if len(looked) == 2:
            raise RuntimeError("one bad look")
        if len(looked) >= 5:
            blocked.set()

    lookout = closures.Lookout(look, every=0.01).start()
    try:
        assert blocked.wait(10), "the lookout stopped after a failing look"    # the "loop" blocks here
    finally:
        lookout.stop()
    count = len(looked)
    threading.Event().wait(0.1)
    assert len(looked) == count      # stopped: no look after stop()


# ----------------------------------------------------------------------------- the supervisor's limit

@pytest.mark.parametrize("option, slowest, sync, expected", [
    (None, 0.5, False, 60.0),            # derived: the larger of 60 s...
    (None, 6.0, False, 120.0),           # ...and 20 units of work
    (None, 0.5, True, 90.0),             # sync: at least twice the collective timeout + 30 s
    (0.0, 5.0, False, None),             # 0: off
    (30.0, 1.0, False, 30.0),            # given
    (30.0, 40.0, False, 80.0),           # given, but a unit of work took longer: twice that unit
])
def test_stall_limit(option, slowest, sync, expected):
    assert stall_limit(option, slowest_unit=slowest, sync=sync, collective_timeout=30.0) == expected


def test_stall_is_shown_after_a_few_units_of_work():
    assert stall_shown_after(0.5) == 10.0 and stall_shown_after(5.0) == 20.0


def test_an_async_stall_blames_the_chief_and_names_the_worker_it_waits_on():
    chief = Proc(key="chief:0#1", task="chief:0", role=Role.CHIEF, host="h1", kind=ProcessKind.TRAIN,
                 started=True, last_event=100.0)
    worker = Proc(key="worker:2#1", task="worker:2", role=Role.WORKER, host="h3", kind=ProcessKind.SERVER)
    watch = Watchdog(stall_after=60.0, leader="chief:0", waiting_on="worker:2@h3")
    assert find_incident([chief, worker], now=159.0, watch=watch) is None
    incident = find_incident([chief, worker], now=161.0, watch=watch)
    assert incident.kind is IncidentKind.STALLED and incident.proc == chief
    assert incident.reason == "stopped making progress (61 s without an event; waiting on worker:2@h3)"


# ----------------------------------------------------------------------------- record, status, CLI

def _leader(sup, last_event=0.0):
    return SimpleNamespace(task=sup.kind.leader, last_event=last_event, started=True)


def test_a_waiting_event_marks_the_job_stalled_until_progress_comes(tmp_path):
    sup = idle_supervisor(tmp_path, name="st", mode="async")
    sup.kind.trained_since_launch = True
    leader = _leader(sup, last_event=90.0)
    sup.set_job(state=JobState.RUNNING, step=640, heartbeat=1700000000.0)
    sup.kind.on_event(sup, leader, {"event": "waiting", "worker": "worker:1", "seconds": 12.0, "step": 640}, now=100.0)
    assert leader.last_event == 90.0                # waiting is not progress: the stall watch keeps counting
    job = sup.progress
    assert job.waiting_on == "worker:1@localhost" and job.stalled_since == 1700000000.0 - 12.0
    assert "stalled for 12 s (waiting on worker:1@localhost)" in render_job_line(job)
    assert any("no progress for 12 s: waiting on worker:1@localhost" in m["text"] for m in sup.reporter.of("message"))
    assert sup.kind.watchdog(sup).waiting_on == "worker:1@localhost"
    sup.kind.on_event(sup, leader, {"event": "waiting", "worker": ["hostile"], "seconds": "x", "step": 1}, now=101.0)
    sup.kind.on_event(sup, leader, {"event": "progress", "step": 700}, now=102.0)
    assert sup.progress.stalled_since is None and sup.progress.waiting_on is None
    assert "stalled" not in render_job_line(sup.progress)


def test_a_silent_leader_is_shown_stalled_before_it_is_acted_on(tmp_path):
    sup = idle_supervisor(tmp_path, name="st2", mode="sync")
    sup.kind.trained_since_launch = True
    leader = SimpleNamespace(task=sup.kind.leader, last_event=50.0, started=True, kind=ProcessKind.TRAIN,
                             ended_at=None, done=False)
    quiet = SimpleNamespace(task=sup.plan.task("worker:1"), last_event=40.0, started=True, kind=ProcessKind.TRAIN,
                            ended_at=None, done=False)
    sup.watched = {"l": leader, "q": quiet}
    sup.kind.watch_stall(sup, 55.0)
    assert sup.progress.stalled_since is None       # 5 s: under a few units of work
    sup.kind.watch_stall(sup, 61.0)
    assert sup.progress.waiting_on == "worker:1@localhost" and sup.progress.stalled_since is not None


def test_status_json_says_how_long_the_job_has_stalled():
    job = JobProgress(id=1, job="distributed_mnist", mode="async", state=JobState.RUNNING, heartbeat=1000.0,
                      stalled_since=958.0, waiting_on="worker:2@h3")
    assert job.stalled_for == 42.0
    assert JobProgress.from_json(job.to_json()).waiting_on == "worker:2@h3"
    assert job.updated(state=JobState.DONE).stalled_for is None


@pytest.mark.parametrize("value, words", [("-1", "-1"), ("nan", "not a finite number"),
                                          ("5", "shorter than a unit of work")])
def test_a_bad_stall_timeout_is_refused_before_anything_starts(tmp_path, value, words):
    proc = run_cli(["train", "distributed_mnist", "--name", "nothing-up", "--stall-timeout", value], state_dir=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_stall_timeout_reaches_the_options():
    assert JobOptions(stall_timeout=0.0).stall_timeout == 0.0 and JobOptions().stall_timeout is None


def test_a_turn_that_blocked_is_not_counted_as_the_trainers_silence(tmp_path):
    """A restart that held the supervisor's loop 16 s (it waits for the new server to answer)
    read no event meanwhile: that time is not the leader's silence, so the next turn shows no
    stall and the slowest unit of work does not grow by it. A short turn forgives nothing."""
    from cluster.supervision.executor import DEAF_SLACK, LOOP_SECONDS
    sup = idle_supervisor(tmp_path, name="st3", mode="sync")
    sup.kind.trained_since_launch = True
    leader = SimpleNamespace(task=sup.kind.leader, last_event=100.0, started=True, kind=ProcessKind.TRAIN,
                             ended_at=None, done=False)
    sup.watched = {"l": leader}
    sup.forgive_deafness(LOOP_SECONDS + DEAF_SLACK * 0.5)
    assert leader.last_event == 100.0
    sup.forgive_deafness(16.0)
    assert leader.last_event == pytest.approx(100.0 + 16.0 - LOOP_SECONDS - DEAF_SLACK)
    sup.kind.watch_stall(sup, 116.5)
    assert sup.progress.stalled_since is None
    sup.kind.on_event(sup, leader, {"event": "progress", "step": 700}, now=116.6)
    assert sup.kind.slowest_unit < 2.0


TWO_HOSTS = """\
all:
  children:
    chief: {hosts: {h1: {ansible_host: 127.0.0.1}}}
    ps: {hosts: {h1: {ansible_host: 127.0.0.1}}}
    worker: {hosts: {h1: {ansible_host: 127.0.0.1}, h2: {ansible_host: 127.0.0.2}}}
"""


@pytest.mark.parametrize("policy, goes_on", [("on-failure", True), ("never", False)])
def test_an_async_job_goes_on_in_place_without_a_lost_worker_host_without_min_workers(tmp_path, policy, goes_on):
    """Issue 41 item 2, the default a user gets: no --min-workers, and a worker-only host lost
    past --host-timeout does not fail an async job (its chief already trains on without it); it
    is kept in the plan and taken back when it answers. --restart-policy never still fails."""
    inventory = tmp_path / "two.yaml"
    inventory.write_text(TWO_HOSTS)
    sup = idle_supervisor(tmp_path, name="inplace", mode="async", options=JobOptions(restart_policy=policy),
                          inventory=inventory)
    try:
        assert sup.kind.drop_out(sup, "h2", "lost for over 60 s (no heartbeat for 4 s)") is goes_on
        if goes_on:
            assert "h2" in sup.kind.resizer.away
            assert "training goes on in place with 1 worker(s)" in sup.progress.message
        # h1 also runs the chief and ps:0: never dropped.
        assert sup.kind.drop_out(sup, "h1", "lost for over 60 s") is False
    finally:
        for link in sup.kind.resizer.away.values():
            link.close()


def test_a_chief_recovery_leaves_a_host_out_in_place_alone(tmp_path, monkeypatch):
    """CI's failure: with h2 out in place, a restart of the chief waited for every server to
    answer, restarted h2's worker (unreachable), blamed the chief for it and then resized onto
    h2. The chief's recovery neither waits for nor probes nor starts anything on h2; h1's
    servers are still ensured."""
    from cluster.supervision import executor as executor_module
    from cluster.supervision.core import Incident

    inventory = tmp_path / "two.yaml"
    inventory.write_text(TWO_HOSTS)
    sup = idle_supervisor(tmp_path, name="inplace2", mode="async", inventory=inventory)
    probed: list[str] = []

    class Answering:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def probe(self, target, **_):
            probed.append(target)
            return SimpleNamespace(ok=True)

    monkeypatch.setattr(executor_module, "Prober", Answering)
    try:
        assert sup.kind.drop_out(sup, "h2", "lost for over 60 s (no heartbeat for 4 s)")
        assert sup.kind.out_in_place(sup) == {"h2"}
        chief = Proc(key="c", task="chief:0", role=Role.CHIEF, host="h1", kind=ProcessKind.TRAIN,
                     state=ProcState.EXITED, exit_code=1, started=True)
        recovery = sup.kind.recovery(sup, Incident(IncidentKind.EXITED, chief, "exited with code 1"))
        assert recovery.ensure_servers and "h2" not in recovery.wait_hosts and "h1" in recovery.wait_hosts
        sup.ensure_servers()
        targets = {t.target: t.host for t in sup.plan.standing_tasks}
        assert probed and {targets[p] for p in probed} == {"h1"}, probed
    finally:
        for link in sup.kind.resizer.away.values():
            link.close()


def test_status_says_what_the_supervisor_says_now_while_the_job_runs():
    """A ps moved off a lost host (issue 41 item 3): `status` shows the job record's message."""
    import io

    from rich.console import Console

    from cluster.console.tables import render_status
    from cluster.contracts import JobState
    said = "resized (ps:1 moved from node-3 to node-1 (node-3 lost for over 10 s)): start ps:1@node-1"
    for state, shown in ((JobState.RUNNING, True), (JobState.DONE, False)):
        out = io.StringIO()
        job = JobProgress(id=1, job="mnist", mode="async", state=state, message=said)
        render_status(Console(file=out, width=300), "c", "async", "up", [], job=job)
        assert (said in out.getvalue()) is shown, out.getvalue()


def test_a_ps_that_ends_or_a_ps_host_lost_starts_a_standby_for_the_chiefs_restart(tmp_path, monkeypatch):
    """Issue 41's pause after a ps fault: the chief restarts next, so a standby for it imports
    TensorFlow while the job waits (up to --host-timeout for a lost host), not in the restart's
    pause. Async only, once: not when the chief has a standby already, not for a worker."""
    from cluster.supervision import train_job as train_job_module

    started: list[list[str]] = []

    def fake_start(writer, pool, plan, secrets, tasks):
        started.append(list(tasks))
        return {"chief:0": object()}, []

    monkeypatch.setattr(train_job_module, "start_standbys", fake_start)
    inventory = tmp_path / "two.yaml"
    inventory.write_text(TWO_HOSTS.replace("ps: {hosts: {h1: {ansible_host: 127.0.0.1}}}",
                                           "ps: {hosts: {h2: {ansible_host: 127.0.0.2}}}"))
    sup = idle_supervisor(tmp_path, name="ahead", mode="async", inventory=inventory)

    def ended(name):
        task = sup.plan.task(name)
        return SimpleNamespace(task=task, kind=ProcessKind.SERVER if task.standing else ProcessKind.TRAIN)
    sup.kind.on_exit(sup, ended("worker:0"), 100.0)
    assert started == []
    sup.kind.on_exit(sup, ended("ps:0"), 100.0)
    assert started == [["chief:0"]]
    assert any("ps:0 ended: a standby for chief:0" in e.data.get("text", "") for e in sup.reporter.of("message"))
    # h2 (ps:0's host) stops answering: told once per loss
    sup.links = {"h2": SimpleNamespace(lost_since=95.0)}
    sup.kind.tell_lost(sup)
    sup.kind.tell_lost(sup)
    assert started == [["chief:0"], ["chief:0"]]
    # the chief has a standby already: none started
    monkeypatch.setattr(type(sup.state), "standby", lambda self, name: object())
    sup.kind.on_exit(sup, ended("ps:0"), 100.0)
    assert len(started) == 2


def _refilling(path, name, mode, monkeypatch):
    """An idle supervisor of ``mode`` whose launch took worker:0's standby, on a clock the test
    moves (at 100 s), recording when it would start standbys again."""
    sup = idle_supervisor(path, name=name, mode=mode)
    refilled = []
    monkeypatch.setattr(sup.kind, "refill_standbys", lambda ex: refilled.append(ex.clock()))
    sup.kind.standby_tasks = {"worker:0"}
    clock = [100.0]
    sup.clock = lambda: clock[0]
    return sup, _leader(sup), clock, refilled


def test_a_sync_job_starts_its_standbys_again_only_after_it_trained_a_while(tmp_path, monkeypatch):
    """A sync drain's overlap needs the group's standbys ready (train_resize.WARM_STANDBYS_AFTER):
    a sync job started from its standbys starts new ones once its leader trained that long,
    not at its first step (a short job does not pay for their import); an async job not at all."""
    from cluster.supervision import train_resize
    for mode, refills in (("sync", True), ("async", False)):
        sup, leader, clock, refilled = _refilling(tmp_path / mode, f"warm-{mode}", mode, monkeypatch)
        sup.kind.on_event(sup, leader, {"event": "progress", "step": 10}, now=100.0)
        sup.kind.between_turns(sup)
        assert refilled == []                             # trained, but not for long
        clock[0] = 100.0 + train_resize.WARM_STANDBYS_AFTER - 1
        sup.kind.on_event(sup, leader, {"event": "progress", "step": 200}, now=clock[0])
        sup.kind.between_turns(sup)
        assert refilled == []                             # the clock counts from the first step, not the last
        clock[0] = 100.0 + train_resize.WARM_STANDBYS_AFTER
        sup.kind.between_turns(sup)
        assert refilled == ([clock[0]] if refills else []), mode
        sup.kind.between_turns(sup)
        assert len(refilled) == (1 if refills else 0)     # once


def test_a_sync_job_about_to_end_starts_its_standbys_only_at_the_latest(tmp_path, monkeypatch):
    """train_resize.WARM_STANDBYS_WORTH: a job that, at its rate, ends before a standby could be
    of use gets its refill at WARM_STANDBYS_LATEST (as before the early refill), a long one at
    WARM_STANDBYS_AFTER."""
    from cluster.supervision import train_resize
    after, latest = train_resize.WARM_STANDBYS_AFTER, train_resize.WARM_STANDBYS_LATEST
    for total, refill_at in ((400, latest), (100_000, after)):
        sup, leader, clock, refilled = _refilling(tmp_path / str(total), f"ending-{total}", "sync", monkeypatch)
        sup.kind.on_event(sup, leader, {"event": "progress", "step": 10, "steps_total": total}, now=100.0)
        clock[0] = 100.0 + after
        # 100 steps a second: 400 steps end 0.9 s from here, 100,000 in about 1,000 s
        sup.kind.on_event(sup, leader, {"event": "progress", "step": 310, "steps_total": total}, now=clock[0])
        assert sup.kind.seconds_left(sup) == pytest.approx((total - 310) / 100.0)
        sup.kind.between_turns(sup)
        clock[0] = 100.0 + latest - 0.5
        sup.kind.between_turns(sup)
        clock[0] = 100.0 + latest
        sup.kind.between_turns(sup)
        assert refilled == [100.0 + refill_at], total
