"""`pscluster drain HOST` and notices to drains (issue 44, items 1-3) on real TensorFlow
processes, local cluster: one async job proves both roads.

Five local "hosts" (127.0.0.2-6, ``ansible_connection: local``, a port base each): the chief and
the ps on ``main``, a worker on each of w1-w4. While the job trains:

* ``pscluster drain w1`` (worker:0, the first of the list: a drop-out no renumbering could do in
  place) drains it in place; a bad deadline is refused with exit 2;
* ``--notices-from`` runs examples/notices/spot_notices.py (AWS) against a stand-in metadata
  endpoint on 127.0.0.1, which starts to report an instance-action for w2: w2 is drained in place;
* SIGTERM to w3's watch process (the pid the job record keeps, a child of the supervisor we
  started): w3 is drained in place;
* draining w4, the last worker left, is refused (exit 2).

The job trains on with w4, with nothing restored or restarted (then `stop-job`); the ``resized``
events (also to --notify-cmd) say ``drain w1``, ``drain w2``, ``drain w3``, and status shows the
hosts drained. (One job for both: each test of its own brought up TensorFlow for ~70 s.)
"""
from __future__ import annotations

import datetime
import http.server
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base
from tests.local.test_resize import cli, state_of, wait_for_steps
from testbed.procs import cluster_pids

pytestmark = pytest.mark.tf
STEPS = 1000000   # never reached: the job is stopped by state once w4 trained on alone (issue 47)


def async_inventory(path, workers):
    """Local "hosts" for an async MLP job: the chief and the ps on ``main``, a worker on each of
    ``workers`` (127.0.0.2 and up, ``main`` after them), a port base each."""
    def host(name: str, number: int) -> str:
        return "%s: {ansible_host: 127.0.0.%d, pscluster_port_base: %d}" % (name, number, port_base())
    lines = ["all:", "  vars:", "    ansible_connection: local", "    pscluster_mode: async",
             "    pscluster_env: {OMP_NUM_THREADS: 1, MNIST_MODEL: mlp}", "  children:",
             "    chief: {hosts: {%s}}" % host("main", 2 + len(workers)), "    ps: {hosts: {main: {}}}",
             "    worker:", "      hosts:"]
    lines += [f"        {host(name, 2 + i)}" for i, name in enumerate(workers)]
    path.write_text("\n".join(lines) + "\n")
    return path


def notify_command(notified) -> str:
    """A --notify-cmd that appends each event document to ``notified``."""
    return shlex.join([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')",
                       str(notified)])


class StandIn(http.server.BaseHTTPRequestHandler):
    """AWS's instance metadata for each host under /HOST/: IMDSv2's token, and instance-action
    404 until the test names a host in ``server.notice_for``."""

    def do_PUT(self):       # noqa: N802 (http.server's names)
        self._answer(200, "token-1") if self.path.endswith("/latest/api/token") else self._answer(404, "")

    def do_GET(self):       # noqa: N802
        host, _, rest = self.path.lstrip("/").partition("/")
        if rest != "latest/meta-data/spot/instance-action" or host not in self.server.notice_for:
            return self._answer(404, "")
        self.server.tokens.add(self.headers.get("X-aws-ec2-metadata-token"))
        when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=120)
        self._answer(200, json.dumps({"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}))

    def _answer(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def wait_state(state_dir, name, train, what: str, ok) -> dict:
    end = time.monotonic() + 300
    while True:
        assert train.poll() is None, f"the job ended before {what}"
        state = state_of(state_dir, name)
        if ok(state):
            return state
        assert time.monotonic() < end, f"never {what}: {state.get('drained')} {state.get('job', {}).get('message')}"
        time.sleep(0.3)


def test_drain_and_notices_each_take_one_host_out_in_place_and_lose_no_step(tmp_path):
    name = f"drain-{os.getpid()}"
    state_dir = tmp_path / "state"
    inventory = async_inventory(tmp_path / "five-hosts.yaml", ("w1", "w2", "w3", "w4"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.notice_for, server.tokens = set(), set()     # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/{{host}}"
    notices = shlex.join([sys.executable, str(REPO / "examples" / "notices" / "spot_notices.py"), "--aws",
                          "--endpoint", endpoint, "w1", "w2", "w3", "w4"])
    notified = tmp_path / "notified.jsonl"
    command = notify_command(notified)
    up = cli(state_dir, "up", inventory, "--name", name)
    try:
        assert up.returncode == 0, up.stderr
        err_path = tmp_path / "train.err"
        with open(err_path, "w") as err_file:
            train = subprocess.Popen(cli_argv(["train", "distributed_mnist", "--name", name, "--steps", str(STEPS),
                                               "--checkpoint-dir", str(tmp_path / "ckpt"), "--json",
                                               "--notices-from", notices, "--notices-every", "1",
                                               "--notify-cmd", command]),
                                     cwd=REPO, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=err_file,
                                     text=True)
        try:
            wait_for_steps(state_dir, name, train, 100)
            drain = cli(state_dir, "drain", "w1", "--name", name, "--deadline", "30s")
            assert drain.returncode == 0, drain.stderr
            assert "resized (drain w1) in place: worker:0 left after their closures ended" in drain.stderr, \
                drain.stderr        # the chief held worker:0 back first: no closure of it is cut and run again
            bad = cli(state_dir, "drain", "w2", "--name", name, "--deadline", "0")
            assert bad.returncode == 2 and "--deadline '0'" in bad.stderr, bad.stderr
            server.notice_for.add("w2")                 # type: ignore[attr-defined]
            # w2 drained, and the watch streams pointed at what is left (w2's closed): w3's watch pid
            # is then the one of its current stream (an earlier one is closed by us, and its
            # notice rightly ignored).
            state = wait_state(state_dir, name, train, "w2 drained",
                               lambda s: s.get("drained") == {"w1": "drained", "w2": "drained"}
                               and set((s["job"].get("watch_pids") or {})) == {"main", "w3", "w4"})
            watch = state["job"]["watch_pids"]["w3"]
            with open(f"/proc/{watch}/stat") as handle:        # w3's watch: a child of our supervisor
                assert int(handle.read().rsplit(")", 1)[1].split()[1]) == train.pid
            os.kill(watch, signal.SIGTERM)
            wait_state(state_dir, name, train, "w3 drained",
                       lambda s: s.get("drained") == {"w1": "drained", "w2": "drained", "w3": "drained"})
            last = cli(state_dir, "drain", "w4", "--name", name)        # the last worker left: refused
            assert last.returncode == 2 and "no worker" in last.stderr, last.stderr
            alone = wait_state(state_dir, name, train, "w4 training alone",
                               lambda s: set((s["job"].get("watch_pids") or {})) == {"main", "w4"})
            wait_for_steps(state_dir, name, train, alone["job"]["step"] + 200)
            stop = cli(state_dir, "stop-job", "--name", name)
            assert stop.returncode == 0, stop.stderr
            train.communicate(timeout=300)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait()
        err = err_path.read_text()
        assert train.returncode == 143, err[-4000:]      # stop-job SIGTERMs an attached train
        state = state_of(state_dir, name)
        assert state["job"]["state"] == "stopped", state["job"]
        drained = {"w1": "drained", "w2": "drained", "w3": "drained"}
        assert state["drained"] == drained, state["drained"]
        assert not state["job"].get("restored_step") and not state["job"].get("restarts"), state["job"]
        assert state["job"]["step"] >= alone["job"]["step"] + 200, state["job"]
        assert not [r for r in state["processes"] if r["host"] in drained and not r.get("stopped")]
        status = json.loads(cli(state_dir, "status", "--name", name, "--json").stdout)
        assert status["drained"] == drained
        assert server.tokens == {"token-1"}             # type: ignore[attr-defined]  (IMDSv2: asked with the token)
        documents = [json.loads(line) for line in notified.read_text().splitlines() if line.strip()]
        resized = [d["report"] for d in documents if d["event"] == "resized"]
        assert [r["reason"] for r in resized] == ["drain w1", "drain w2", "drain w3"], (documents, err[-3000:])
        assert all(r["in_place"] for r in resized) and resized[-1]["workers"] == 1
        log = (state_dir / f"{name}.drains.log").read_text()
        assert log.count("--- ") == 2 and "drain w2 (--notices-from: by " in log and \
            "drain w3 (w3's watch got SIGTERM: within 30 s)" in log, log
        # each drained worker was held back by the chief (roles/workerloss.py), not cut
        assert all(f"worker:{i}@w{i + 1} takes no new closure (drained" in err for i in range(3)), err[-3000:]
        ended = [line for line in err.splitlines() if "ended with exit code 0 (drained)" in line]
        assert len(ended) == 2, err[-3000:]
        print("drain:", " ".join(drain.stderr.split())[-300:])     # its timing, for the record (-s)
    finally:
        server.shutdown()
        cli(state_dir, "down", "--name", name, "--now", "--grace", "2", timeout=300)
        for pid in cluster_pids(name):
            os.kill(pid, signal.SIGKILL)
        assert_no_survivors(name)
