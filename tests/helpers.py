"""Helpers shared by the local, lab and fault tests (real processes, real hosts); the process
views they share with the benchmarks (``cluster_pids``, ``netns_of``) are in testbed/procs.py."""
from __future__ import annotations

import itertools
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from testbed import procs

REPO = pathlib.Path(__file__).resolve().parent.parent
_PORTS = itertools.count(0)


def port_base() -> int:
    """A distinct port range per test in this session (20 ports each), away from 2222 and below
    Linux's ephemeral range (32768 and up): a port there may be taken at any moment by an
    outgoing connection (seen: ps:1's port held, preflight refused the run). Each lane of
    scripts/test.sh (``PSCLUSTER_TEST_LANE``) and each pytest-xdist worker (``gw0``, ``gw1``, ...)
    has a range of its own, so tests running at once never share a port; another session takes
    a lane from its pid."""
    return 20000 + LANE_PORTS * _lane() + 20 * next(_PORTS) % LANE_PORTS


LANE_PORTS = 2400      # 5 lanes of 120 tests' ports in 20000-31999


def _lane() -> int:
    lane = os.environ.get("PSCLUSTER_TEST_LANE", "")
    if lane.isdigit():
        return int(lane) % 5
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]) % 5
    return os.getpid() % 5


def cli_env(state_dir, env: dict | None = None) -> dict:
    """The environment of a ``pscluster`` process in tests (this checkout's packages first)."""
    full_env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), COLUMNS="200", NO_COLOR="1",
                    PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    full_env.update({key: str(value) for key, value in (env or {}).items()})
    return full_env


FINAL_ACCURACY = re.compile(r"final test_accuracy=(?P<accuracy>[0-9.]+) ")


def accuracy_in(output: str, task: str) -> float:
    """The accuracy a program printed on its own (``final test_accuracy=...``, as the programs
    of examples/byo/ end), read from `run`'s output prefixed ``[task@host]``."""
    found = [FINAL_ACCURACY.search(line) for line in output.splitlines() if line.startswith(f"[{task}@")]
    found = [match for match in found if match]
    assert found, f"{task} printed no final accuracy:\n{output[-3000:]}"
    return float(found[-1]["accuracy"])


def cli_argv(args) -> list[str]:
    return [sys.executable, "-m", "cluster", *map(str, args)]


def run_cli(args, *, state_dir, timeout: float = 300, env: dict | None = None,
            check: bool = False, cwd=None) -> subprocess.CompletedProcess:
    """Run ``pscluster ARGS`` as a real process, as a user would (from ``cwd``, default the
    checkout)."""
    proc = subprocess.run(cli_argv(args), cwd=cwd or REPO, env=cli_env(state_dir, env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"pscluster {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def run_json(args, *, state_dir, **kw) -> dict:
    proc = run_cli([*args, "--json"], state_dir=state_dir, check=True, **kw)
    return json.loads(proc.stdout)


def assert_no_survivors(name: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pids = procs.cluster_pids(name)
        if not pids:
            return
        if time.monotonic() > deadline:
            details = []
            for pid in pids:
                try:
                    details.append(f"{pid}: {open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' ')[:120]}")
                except OSError:
                    pass
            raise AssertionError(f"processes of cluster {name!r} survive:\n" + "\n".join(details))
        time.sleep(0.2)


class RecordingServer:
    """An HTTP server on 127.0.0.1 for notification tests: ``/ok...`` records each POSTed JSON body
    with its arrival time, ``/fail...`` answers 500, ``/hang...`` holds the request until
    ``release`` (or ``hang_seconds``)."""

    def __init__(self, hang_seconds: float = 60.0):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.received: list[tuple[float, dict]] = []
        self.release = threading.Event()
        self.arrived = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.startswith("/hang"):
                    outer.release.wait(hang_seconds)
                if self.path.startswith("/ok"):
                    with outer.arrived:
                        outer.received.append((time.monotonic(), json.loads(body)))
                        outer.arrived.notify_all()
                self.send_response(500 if self.path.startswith("/fail") else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def bodies(self) -> list[dict]:
        return [body for _, body in self.received]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.received) >= count, timeout)
        return self.bodies

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def module_cluster(tmp_path_factory, prefix: str, mode: str | None = None):
    """A local cluster `up` for the tests of one module that only train or run on it (a generator
    for a module-scoped fixture: ``yield from module_cluster(...)``): one ``up`` instead of one per
    test. Yields ``(name, state_dir)``; down at the end if left up, and nothing left."""
    name = f"{prefix}-{os.getpid()}"
    state_dir = tmp_path_factory.mktemp(prefix) / "state"
    try:
        up = run_cli(["up", REPO / "inventories/local.yaml", "--name", name, *(["--mode", mode] if mode else []),
                      "--port-base", port_base()], state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        yield name, state_dir
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir)
    assert_no_survivors(name)
