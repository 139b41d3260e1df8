"""Notices from where they come (issue 44, item 2) on real TensorFlow processes, local cluster.

test_drain.py's three-host layout with one worker host more (127.0.0.2-5, ``ansible_connection:
local``): the chief and the ps on ``main``, a worker on each of w1-w3. One async job, two notices:

* ``--notices-from`` runs examples/notices/spot_notices.py (AWS) against a stand-in metadata
  endpoint on 127.0.0.1, which starts to report an instance-action for w2 once the job trained
  some steps: w2 is drained in place;
* SIGTERM to w1's watch process (the pid the job record keeps, a child of the supervisor we
  started): w1 is drained in place, and the job goes on.

The job finishes its step budget with w3, with nothing restored or restarted; the ``resized``
events (also to --notify-cmd) say ``drain w2`` and ``drain w1``.
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

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env
from tests.local.test_drain import async_inventory, notify_command
from tests.local.test_resize import cli, state_of, wait_for_steps
from testbed.procs import cluster_pids

pytestmark = pytest.mark.tf
STEPS = 5000     # ~30 s at the MLP's pace here: both drains (from step 100 on) land well before the end


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


def test_a_spot_notice_and_a_hosts_own_sigterm_each_drain_that_host_in_place(tmp_path):
    name = f"notices-{os.getpid()}"
    state_dir = tmp_path / "state"
    inventory = async_inventory(tmp_path / "four-hosts.yaml", ("w1", "w2", "w3"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.notice_for, server.tokens = set(), set()     # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/{{host}}"
    notices = shlex.join([sys.executable, str(REPO / "examples" / "notices" / "spot_notices.py"), "--aws",
                          "--endpoint", endpoint, "w1", "w2", "w3"])
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
            server.notice_for.add("w2")                 # type: ignore[attr-defined]
            # w2 drained, and the watch streams pointed at what is left (w2's closed): w1's watch pid
            # is then the one of its current stream (an earlier one is closed by us, and its
            # notice rightly ignored).
            state = wait_state(state_dir, name, train, "w2 drained", lambda s: s.get("drained") == {"w2": "drained"}
                               and set((s["job"].get("watch_pids") or {})) == {"main", "w1", "w3"})
            watch = state["job"]["watch_pids"]["w1"]
            with open(f"/proc/{watch}/stat") as handle:        # w1's watch: a child of our supervisor
                assert int(handle.read().rsplit(")", 1)[1].split()[1]) == train.pid
            os.kill(watch, signal.SIGTERM)
            wait_state(state_dir, name, train, "w1 drained",
                       lambda s: s.get("drained") == {"w2": "drained", "w1": "drained"})
            out, _ = train.communicate(timeout=300)
        finally:
            if train.poll() is None:
                train.kill()
                train.wait()
        err = err_path.read_text()
        assert train.returncode == 0, err[-4000:]
        report = json.loads(out)
        state = state_of(state_dir, name)
        assert not state["job"].get("restored_step") and not state["job"].get("restarts"), state["job"]
        assert report["global_step"] >= STEPS, report
        assert not [r for r in state["processes"] if r["host"] in ("w1", "w2") and not r.get("stopped")]
        assert server.tokens == {"token-1"}             # type: ignore[attr-defined]  (IMDSv2: asked with the token)
        documents = [json.loads(line) for line in notified.read_text().splitlines() if line.strip()]
        resized = [d["report"] for d in documents if d["event"] == "resized"]
        assert [r["reason"] for r in resized] == ["drain w2", "drain w1"], (documents, err[-3000:])
        assert all(r["in_place"] for r in resized) and resized[-1]["workers"] == 1
        log = (state_dir / f"{name}.drains.log").read_text()
        assert log.count("--- ") == 2 and "drain w2 (--notices-from: by " in log and \
            "drain w1 (w1's watch got SIGTERM: within 30 s)" in log, log
        ended = [line for line in err.splitlines() if "ended with exit code 0 (drained)" in line]
        assert len(ended) == 2, err[-3000:]
    finally:
        server.shutdown()
        cli(state_dir, "down", "--name", name, "--now", "--grace", "2", timeout=300)
        for pid in cluster_pids(name):
            os.kill(pid, signal.SIGKILL)
        assert_no_survivors(name)
