"""Readiness at many hosts (issue 46): a host's watch says when a task's port listens
(hostctl ``_listening_ports``, from /proc/net/tcp{,6}), and above PROBE_EVERY_ROUND pending
servers ``wait_ready`` probes a server only once its port listens (or every PROBE_UNHEARD s)."""
from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest

from cluster.errors import TaskError
from cluster.hosts import hostops
from cluster.hosts.probe import ProbeResult
from cluster.lifecycle import tasks
from roles import hostctl


def test_a_port_that_listens_is_seen_and_one_that_does_not_is_not():
    with socket.socket(socket.AF_INET6) as sock:       # as TF binds: [::], dual-stack
        sock.bind(("::", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert port in hostctl._listening_ports()
        heard: set = set()
        states = [{"key": "a", "state": "running"}, {"key": "b", "state": "running"}, {"key": "c", "state": "running"}]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            idle_port = closed.getsockname()[1]        # bound, never listening
            hostctl._mark_listening(states, {"a": port, "b": idle_port}, heard)
    assert [s.get("listening") for s in states] == [True, False, None]
    assert heard == {"a"}


def test_a_watch_line_carries_the_flag_and_an_old_line_has_none():
    line = {"ts": 1.0, "reads": [], "tasks": [{"key": "k1", "state": "running", "listening": True},
                                              {"key": "k2", "state": "running"}]}
    update = hostops.parse_watch_line(json.dumps(line))
    assert update.states["k1"].listening is True and update.states["k2"].listening is None


class _Stream:
    def __init__(self):
        self.queue: list[str] = []
        self.closed = False

    def lines(self):
        found, self.queue = self.queue, []
        return found

    def close(self):
        self.closed = True


def _cluster(count, monkeypatch):
    """``count`` servers, one a host, with fake streams and a fake prober that answers a server
    once its port is 'open' (the test opens them)."""
    names = [f"ps:{i}" for i in range(count)]
    plan = SimpleNamespace(
        task=lambda name: SimpleNamespace(name=name, host=f"h{name[3:]}", port=5000 + int(name[3:]),
                                          target=f"h{name[3:]}:{5000 + int(name[3:])}"),
        host=lambda host: host)
    records = {name: SimpleNamespace(key=f"key-{name}", task=name, host=f"h{name[3:]}", log=f"/l/{name}")
               for name in names}
    streams: dict[str, _Stream] = {}
    asked_ports: dict[str, dict] = {}

    def watch(transport, host_records, files, *, interval, ports):
        host = host_records[0].host
        asked_ports[host] = dict(ports)
        return streams.setdefault(host, _Stream())

    monkeypatch.setattr(tasks, "records_by_host", lambda recs: {r.host: [r] for r in recs})
    monkeypatch.setattr(tasks.hostops, "watch", watch)
    monkeypatch.setattr(tasks.time, "sleep", lambda seconds: None)
    opened: set[str] = set()
    probes: list[str] = []

    class Prober:
        def probe(self, target, *, timeout, via):
            probes.append(target)
            return ProbeResult(target, target in opened)

    pool = SimpleNamespace(get=lambda host: host)
    return plan, records, streams, asked_ports, opened, probes, Prober(), pool


def _say(stream, key, **status):
    stream.queue.append(json.dumps({"ts": 0, "reads": [], "tasks": [dict({"key": key, "state": "running"}, **status)]}))


def test_above_the_threshold_a_server_is_probed_once_its_host_says_it_listens(monkeypatch):
    count = tasks.PROBE_EVERY_ROUND + 4
    plan, records, streams, asked, opened, probes, prober, pool = _cluster(count, monkeypatch)
    rounds = {"n": 0}

    def idle():
        rounds["n"] += 1
        if rounds["n"] == 3:          # every server opens its port and says so, after two idle rounds
            for name, record in records.items():
                target = plan.task(name).target
                opened.add(target)
                _say(streams[record.host], record.key, listening=True)

    devices = tasks.wait_ready(plan, records, pool, prober, tasks.Reporter(), timeout=3600, idle=idle)
    assert sorted(devices) == sorted(records)
    assert asked["h0"] == {"key-ps:0": 5000}
    # one probe each at the start, none in the rounds while nothing listened, one each once heard
    assert len(probes) == 2 * count


def test_up_to_the_threshold_every_pending_server_is_probed_every_round(monkeypatch):
    plan, records, streams, asked, opened, probes, prober, pool = _cluster(2, monkeypatch)
    rounds = {"n": 0}

    def idle():
        rounds["n"] += 1
        if rounds["n"] == 3:
            opened.update(plan.task(name).target for name in records)

    tasks.wait_ready(plan, records, pool, prober, tasks.Reporter(), timeout=3600, idle=idle)
    assert len(probes) == 2 * 4       # rounds 1-3 failed, round 4 answered: nobody said "listening"


def test_a_server_that_exits_before_it_answers_fails_the_wait_with_its_log(monkeypatch):
    plan, records, streams, asked, opened, probes, prober, pool = _cluster(tasks.PROBE_EVERY_ROUND + 1, monkeypatch)
    monkeypatch.setattr(tasks.hostops, "log_tail", lambda transport, path: "Traceback: boom")
    _say(streams.setdefault("h3", _Stream()), "key-ps:3", state="exited", exit_code=1)
    with pytest.raises(TaskError, match="exited before it was ready"):
        tasks.wait_ready(plan, records, pool, prober, tasks.Reporter(), timeout=3600)


def test_the_schedule_backs_off_a_listening_server_that_does_not_answer_yet():
    schedule = tasks._ProbeSchedule(["a", "b"])
    assert schedule.now("a", 100)                      # at once, the first time
    schedule.failed("a")
    assert not schedule.now("a", 100) and schedule.now("a", tasks.PROBE_EVERY_ROUND)
    schedule.heard("a")
    assert schedule.now("a", 100)                      # heard: probed in the next round
    for want in (0.1, 0.2, 0.4, 0.8, 1.0, 1.0):
        before = schedule.due["a"]
        schedule.failed("a")
        assert schedule.backoff["a"] == min(want * 2, tasks.PROBE_BACKOFF[1]) and schedule.due["a"] > before


def test_rounds_space_out_with_the_hosts_up_to_half_a_second():
    """Issue 46: a round reads every host's watch stream; 0.1 s apart for up to 100 hosts, then
    a thousandth of a second a host, at most 0.5 s (1,000 hosts say they are ready within it)."""
    from cluster.lifecycle.tasks import round_pause
    assert [round_pause(n) for n in (1, 16, 100)] == [0.1, 0.1, 0.1]
    assert round_pause(256) == pytest.approx(0.256)
    assert round_pause(1000) == round_pause(10000) == 0.5
