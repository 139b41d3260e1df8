"""SIGTERM and SIGHUP (a CI timeout, a service manager, a closed terminal) to real ``pscluster``
processes: the same clean-up as Ctrl-C, exit code 128 + signal, nothing left running."""
from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import termios
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base
from testbed.procs import cluster_pids
from tests.local.test_process_control import wait_paused

LOCAL = REPO / "inventories" / "local.yaml"


@pytest.fixture
def reap():
    names: list[str] = []
    yield names.append
    for name in names:          # processes this test started, if a failure left them
        for pid in cluster_pids(name):
            os.kill(pid, 9)


def start_cli(args, state_dir, env=None) -> subprocess.Popen:
    return subprocess.Popen(cli_argv(args), cwd=REPO, env=cli_env(state_dir, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_signal_to_up_mid_start_rolls_back(tmp_path, reap, sig):
    """The servers are running on the host, their pids not yet saved: the signal lands there.
    Before: the default action killed `up` on the spot and the servers ran on, state 'starting'."""
    name, state_dir, flag = f"sig-up-{sig.name.lower()}", tmp_path / "state", tmp_path / "go"
    reap(name)
    up = start_cli(["up", LOCAL, "--name", name, "--port-base", port_base()], state_dir,
                   {"PSCLUSTER_TEST_PAUSE": f"after-start:{flag}"})
    try:
        wait_paused(flag, up)
        up.send_signal(sig)
        flag.touch()
        _, stderr = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 128 + sig, stderr
    state = json.loads((state_dir / f"{name}.json").read_text())
    assert state["phase"] == "failed" and f"terminated by {sig.name}" in state["message"]
    assert state["processes"] and all(record["stopped"] for record in state["processes"])
    assert_no_survivors(name)


def terminate_when(proc: subprocess.Popen, ready, what: str, timeout: float = 300) -> str:
    """Wait until ``ready()`` (the command is mid-job), SIGTERM it, return its stderr."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"never saw {what}"
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_to_run_mid_job_stops_the_program_and_the_cluster(tmp_path, reap):
    name, state_dir = "sig-run", tmp_path / "state"
    reap(name)
    started = tmp_path / "running"
    run = start_cli(["run", LOCAL, "--name", name, "--port-base", port_base(), "--on", "worker", "--", "python", "-c",
                     f"import time; open('{started}-{{task_index}}', 'w').close(); time.sleep(600)"], state_dir)
    stderr = terminate_when(run, lambda: all(os.path.exists(f"{started}-{i}") for i in (0, 1)), "both programs")
    assert run.returncode == 143, stderr
    assert not (state_dir / f"{name}.json").exists()      # a one-shot run always takes its cluster down
    assert_no_survivors(name)


@pytest.mark.tf
@pytest.mark.extended
def test_sigterm_to_train_mid_job_stops_the_job_and_keeps_the_servers(tmp_path, reap):
    name, state_dir = "sig-train", tmp_path / "state"
    reap(name)
    up = subprocess.run(cli_argv(["up", LOCAL, "--name", name, "--port-base", port_base()]), cwd=REPO,
                        env=cli_env(state_dir), capture_output=True, text=True, timeout=600)
    try:
        assert up.returncode == 0, up.stderr
        train = start_cli(["train", "distributed_mnist", "--name", name, "--steps", "100000"], state_dir)

        def training():
            job = json.loads((state_dir / f"{name}.json").read_text()).get("job") or {}
            return job.get("state") == "running" and job.get("step")

        stderr = terminate_when(train, training, "a training step")
        assert train.returncode == 143, stderr
        state = json.loads((state_dir / f"{name}.json").read_text())
        assert state["job"]["state"] == "stopped" and state["phase"] == "up"
        live = [r for r in state["processes"] if not r["stopped"]]
        assert live and all(r["kind"] == "server" for r in live)      # the job's processes are gone
    finally:
        down = subprocess.run(cli_argv(["down", "--name", name, "--grace", "3"]), cwd=REPO, env=cli_env(state_dir),
                              capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, down.stderr
    assert_no_survivors(name)


def test_closed_terminal_mid_up_still_rolls_back(tmp_path, reap):
    """`up` on a real terminal that closes mid-start (an ssh session dropped, a terminal window
    closed): SIGHUP, then every write to the terminal fails with EIO. Before: the rollback's
    first message raised `OSError: [Errno 5] Input/output error`, the servers stayed up and
    the state stayed 'starting'. No output error may stop a clean-up."""
    name, state_dir, flag = "sig-pty", tmp_path / "state", tmp_path / "go"
    reap(name)
    master, slave = os.openpty()
    env = cli_env(state_dir, {"PSCLUSTER_TEST_PAUSE": f"after-start:{flag}", "TERM": "xterm"})
    env.pop("NO_COLOR", None)
    env.pop("COLUMNS", None)
    up = subprocess.Popen(cli_argv(["up", LOCAL, "--name", name, "--port-base", port_base()]), cwd=REPO, env=env,
                          stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                          preexec_fn=lambda: fcntl_ioctl_set_ctty(0))
    os.close(slave)
    try:
        output = bytearray()
        deadline = time.monotonic() + 120
        while not os.path.exists(f"{flag}.waiting"):    # keep the terminal drained until the pause
            assert up.poll() is None and time.monotonic() < deadline, output.decode(errors="replace")
            readable, _, _ = select.select([master], [], [], 0.1)
            if readable:
                output += os.read(master, 65536)
        os.close(master)            # the terminal goes: SIGHUP to its session, EIO on every write
        flag.touch()
        up.wait(timeout=300)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 128 + signal.SIGHUP, output.decode(errors="replace")
    state = json.loads((state_dir / f"{name}.json").read_text())
    assert state["phase"] == "failed" and "terminated by SIGHUP" in state["message"]
    assert state["processes"] and all(record["stopped"] for record in state["processes"])
    assert_no_survivors(name)


def fcntl_ioctl_set_ctty(fd: int) -> None:
    """In the child, after setsid: make the pty on ``fd`` its controlling terminal, so closing
    the terminal sends it SIGHUP as a login shell's children get it."""
    fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
