"""Notices to drains (cluster/supervision/notices.py, issue 44 item 2): the line parser, the
notice command's rules (those of --hosts-from), each host drained once and one drain at a time,
the drain child (a real process), and train's exit 2 on bad options."""
from __future__ import annotations

import datetime
import http.server
import json
import threading
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.errors import UsageError
from cluster.events import RecordingReporter
from cluster.supervision.notices import (DrainChild, Notice, NoticeBoard, NoticeDrains, NoticeSource, drain_argv,
                                         parse_notices)

from .test_cli_plan import Captured
from .test_discovery import alive, script, warnings

REPO = Path(__file__).resolve().parents[2]


def _utc(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc).timestamp()


def test_notice_lines_read_durations_times_and_bare_hosts():
    text = ("# host  deadline\n\nw1 30s\nw2 2m   # GCE's 30 s would be short\nw3 45\n"
            "w4 2026-12-02T19:00:00Z\nw5\nw6 2026-12-02T19:00:00+01:00\nw7 1.5m\n")
    notices = {n.host: n for n in parse_notices(text)}
    assert [notices[h].seconds for h in ("w1", "w2", "w3", "w7")] == [30.0, 120.0, 45.0, 90.0]
    assert notices["w4"].at == _utc("2026-12-02T19:00:00") and notices["w4"].seconds is None
    assert notices["w6"].at == _utc("2026-12-02T18:00:00")
    assert notices["w5"] == Notice("w5")
    assert notices["w4"].remaining(wall=_utc("2026-12-02T18:58:30"), default=30) == 90.0
    assert notices["w5"].remaining(wall=0, default=30) == 30.0
    assert parse_notices("") == () and parse_notices("# nothing\n\n") == ()


def test_a_host_named_twice_keeps_its_earliest_deadline():
    assert parse_notices("w1 60s\nw1 10s\nw1 30s\n") == (Notice("w1", seconds=10.0),)


@pytest.mark.parametrize("line", ["w1 30s extra", "w1 soon", "w1 0", "w1 -5", "w1 nan", "w1 2026-13-45T99:00:00Z",
                                  "--name other", "w1 25h", "w\x07 30s"])
def test_garbage_is_refused_as_a_whole_naming_the_line(line):
    with pytest.raises(UsageError) as caught:
        parse_notices(f"ok 30s\n{line}\n")
    assert "--notices-from, line 2: expected 'HOST' or 'HOST DEADLINE'" in caught.value.message


def test_each_host_is_drained_once_the_earliest_deadline_first():
    board = NoticeBoard(default_deadline=30.0)
    hosts, drained = {"w1", "w2", "w3", "main"}, {"w3"}
    said = board.take([Notice("w2", seconds=60), Notice("w1"), Notice("w3"), Notice("nope"), Notice("nope")],
                      now=100.0, wall=0.0, hosts=hosts, drained=drained)
    assert len(said) == 1 and "nope is not a host of this cluster" in said[0]
    assert board.take([Notice("nope"), Notice("w1", seconds=5)], now=101.0, wall=0.0, hosts=hosts,
                      drained=drained) == []     # warned once; w1 is queued already
    first, second = board.next_due(), board.next_due()
    assert (first.host, first.due) == ("w1", 130.0) and (second.host, second.due) == ("w2", 160.0)
    assert board.next_due() is None
    board.take([Notice("w1"), Notice("w2")], now=200.0, wall=0.0, hosts=hosts, drained=set())
    assert board.next_due() is None             # noticed before: never drained again


class FakeChild:
    def __init__(self, host, why, argv, log):
        self.host, self.why, self.argv, self.code = host, why, argv, None
        self.stopped = False

    def poll(self):
        return self.code

    def last_line(self):
        return f"{self.host} drained in 1.0 s"

    def stop(self, grace):
        self.stopped = True


def test_one_drain_at_a_time_and_the_next_deadline_counts_from_its_notice(tmp_path):
    started: list[FakeChild] = []

    def start(host, why, argv, log):
        started.append(FakeChild(host, why, argv, log))
        return started[-1]
    drains = NoticeDrains(state_dir=tmp_path, name="c1", default_deadline=30.0, start=start)
    reporter = RecordingReporter()

    def turn(now, **watch):
        drains.turn(now=now, wall=1000.0 + now, reporter=reporter, hosts={"w1", "w2"}, drained=(),
                    watch_notices=watch)
    turn(0.0, w1={"signal": "SIGTERM"}, w2={"signal": "SIGUSR1"})
    assert [c.host for c in started] == ["w1"]
    assert started[0].argv[1:] == ["-m", "cluster", "--state-dir", str(tmp_path), "drain", "w1", "--deadline",
                                   "30.0s", "--name", "c1"]
    turn(10.0, w1={"signal": "SIGTERM"})        # w1 again, while its drain runs: nothing new
    assert len(started) == 1
    started[0].code = 0
    turn(12.0)
    assert [c.host for c in started] == ["w1", "w2"]
    assert started[1].argv[started[1].argv.index("--deadline") + 1] == "18.0s"    # noticed at 0 with 30 s
    ended = [e.data["text"] for e in reporter.of("message") if "ended with exit code" in e.data["text"]]
    assert ended == [f"drain w1 (w1's watch got SIGTERM: within 30 s) ended with exit code 0 (drained): "
                     f"w1 drained in 1.0 s (log: {tmp_path / 'c1.drains.log'})"]
    drains.close()                              # the job ends: w2's drain is stopped
    assert started[1].stopped


def test_the_notice_command_follows_the_hosts_from_rules(tmp_path):
    reporter = RecordingReporter()
    drains = NoticeDrains(state_dir=tmp_path, name="c1", default_deadline=30.0, start=lambda *a: FakeChild(*a),
                          source=NoticeSource(script(tmp_path, "echo 'w1 oops-not-a-deadline'\n"), every=1))
    for _ in range(200):
        drains.turn(now=0.0, wall=0.0, reporter=reporter, hosts={"w1"}, drained=(), watch_notices={})
        if warnings(reporter):
            break
        time.sleep(0.02)
    assert warnings(reporter) == ["--notices-from, line 1: expected 'HOST' or 'HOST DEADLINE' (a duration such as "
                                  "30s, or an ISO-8601 time such as 2026-12-02T19:00:00Z), got 'w1 oops-not-a-deadline'"
                                  "; no host drained"]
    assert drains.child is None
    hang = NoticeSource(f"{sys.executable} -c 'import time; time.sleep(300)'", every=10, timeout=5)
    hang.poll(0.0, reporter)
    pid = hang.proc.pid
    assert hang.poll(6.0, reporter) is None and hang.proc is None and not alive(pid)
    assert warnings(reporter)[-1] == ("--notices-from: still running after 5 s: stopped, with what it started; "
                                      "no host drained")
    flood = NoticeSource(f"{sys.executable} -c 'print(\"w1 30s\\n\" * 400000)'", every=10, limit=1 << 20)
    flood.poll(0.0, reporter)
    while flood.proc is not None:
        flood.poll(1.0, reporter)
    assert warnings(reporter)[-1] == "--notices-from printed more than 1 MiB: stopped; no host drained"


def test_the_drain_child_is_what_a_user_types_and_stops_with_its_group(tmp_path):
    # The very argv the supervisor starts: the CLI reads it (and refuses an unknown cluster, exit 2).
    argv = drain_argv(state_dir=tmp_path / "state", name="nope", host="w1", seconds=12.34)
    child = DrainChild("w1", "test", argv, tmp_path / "nope.drains.log")
    deadline = time.monotonic() + 60
    while child.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert child.poll() == 2 and "no cluster named 'nope'" in child.last_line(), child.log.read_text()
    assert argv[argv.index("--deadline") + 1] == "12.3s"
    # A drain still running when the job ends: its group is stopped (what it started too).
    marker = tmp_path / "grandchild"
    slow = DrainChild("w2", "test", ["sh", "-c", f"sleep 300 & echo $! > {marker}; echo started; wait"],
                      tmp_path / "nope.drains.log")
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    slow.stop(grace=0.2)
    assert slow.poll() is not None
    until_gone = time.monotonic() + 10          # SIGKILLed: gone once the kernel has torn it down
    while alive(grandchild) and time.monotonic() < until_gone:
        time.sleep(0.02)
    assert not alive(grandchild)
    assert slow.last_line() == "started"
    log = (tmp_path / "nope.drains.log").read_text()
    assert log.count("--- ") == 2 and "drain w1 (test): -m cluster --state-dir" in log


@pytest.mark.parametrize("args, said", [(["--notices-every", "0"], "--notices-every"),
                                        (["--notices-every", "nan"], "--notices-every"),
                                        (["--notices-from", "'unclosed"], "cannot split the command"),
                                        (["--notices-from", ""], "the command is empty"),
                                        (["--notice-deadline", "0"], "the deadline must be more than 0"),
                                        (["--notice-deadline", "soon"], "not a duration")])
def test_train_exits_2_on_bad_notice_options(tmp_path, capsys, args, said):
    captured = Captured(tmp_path / "state")
    assert captured.run("train", "distributed_mnist", "--name", "nope", *args) == 2, captured.stderr.getvalue()
    text = " ".join((capsys.readouterr().err + captured.stderr.getvalue()).split())
    assert said in text and "Traceback" not in text, text
    assert not (tmp_path / "state").exists()        # refused before anything was looked up


def test_the_notice_options_reach_the_supervisor_unchanged():
    from cluster.supervision.train_spec import JobOptions, TrainRequest
    request = TrainRequest(job="j", name="c", options=JobOptions(), notices_from="./n.sh", notices_every=2.0,
                           notice_deadline=90.0)
    again = TrainRequest.from_json(request.to_json())
    assert (again.notices_from, again.notices_every, again.notice_deadline) == ("./n.sh", 2.0, 90.0)


class MetadataStandIn(http.server.BaseHTTPRequestHandler):
    """Each host's metadata under /HOST/: AWS (404 = no notice, IMDSv2 token) and GCE (TRUE/FALSE,
    only with Metadata-Flavor: Google)."""

    answers = {"/a1/latest/meta-data/spot/instance-action": json.dumps({"action": "terminate",
                                                                        "time": "2026-12-02T19:00:00Z"}),
               "/a3/latest/meta-data/spot/instance-action": "<html>not json</html>",
               "/g1/computeMetadata/v1/instance/preempted": "TRUE",
               "/g2/computeMetadata/v1/instance/preempted": "FALSE"}

    def do_PUT(self):       # noqa: N802
        self._answer(200, "tok") if self.path.endswith("/latest/api/token") else self._answer(404, "")

    def do_GET(self):       # noqa: N802
        if "computeMetadata" in self.path and self.headers.get("Metadata-Flavor") != "Google":
            return self._answer(403, "")
        if "meta-data" in self.path and self.headers.get("X-aws-ec2-metadata-token") != "tok":
            return self._answer(401, "")
        body = self.answers.get(self.path)
        self._answer(200, body) if body is not None else self._answer(404, "")

    def _answer(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_the_example_reads_aws_and_gce_answers_into_notice_lines():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetadataStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/{{host}}"
    script_path = REPO / "examples" / "notices" / "spot_notices.py"
    try:
        def run(*args):
            return subprocess.run([sys.executable, str(script_path), *args], capture_output=True, text=True,
                                  timeout=60)
        aws = run("--aws", "--endpoint", endpoint, "a1", "a2", "a3")
        gce = run("--gce", "--endpoint", endpoint, "g1", "g2", "g3")
        bad = run("--aws", "--timeout", "0", "a1")
    finally:
        server.shutdown()
    assert aws.returncode == 0 and aws.stdout == "a1 2026-12-02T19:00:00Z\n", aws.stderr      # a2: 404, none
    assert "a3: instance-action is not the JSON AWS documents" in aws.stderr
    assert gce.returncode == 0 and gce.stdout == "g1 30s\n" and "g3: preempted answered HTTP 404" in gce.stderr
    assert parse_notices(aws.stdout + gce.stdout) == (Notice("a1", at=_utc("2026-12-02T19:00:00")),
                                                     Notice("g1", seconds=30.0))
    assert bad.returncode == 2 and "--timeout" in bad.stderr
