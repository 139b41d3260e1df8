"""Notifications and the plain live view (issue 14) with real TensorFlow processes:
``pscluster_notify`` in the inventory, ``--notify`` on the command line and ``--notify-cmd``,
against HTTP servers this test starts on 127.0.0.1 (one records what is POSTed, the other never
answers until the test lets it); train's stderr is a pipe, so its progress comes as plain lines.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.helpers import REPO, RecordingServer, assert_no_survivors, cli_argv, cli_env, port_base
from testbed.procs import cluster_pids

NAME = f"notify-e2e-{os.getpid()}"
SECRET = "s3cretT0kenAbcdefgh"       # a token-like path segment: masked wherever the URL is shown

pytestmark = pytest.mark.tf


@pytest.fixture
def endpoint():
    item = RecordingServer(hang_seconds=600)
    yield item
    item.close()


def test_notify_events_in_order_and_a_hanging_endpoint_does_not_hold_train(endpoint, tmp_path):
    """Also: train's plain progress lines (not a terminal) with one-decimal epochs and an eval line."""
    state_dir = tmp_path / "state"
    inventory = yaml.safe_load((REPO / "inventories" / "local.yaml").read_text())
    inventory["all"]["vars"]["pscluster_notify"] = endpoint.url("/ok/inventory")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(inventory))
    hanging = endpoint.url(f"/hang/hooks/{SECRET}")
    events_file = tmp_path / "cmd-events.jsonl"
    command = shlex.join([sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')",
                          str(events_file)])
    up = subprocess.run(cli_argv(["up", tmp_path / "local.yaml", "--name", NAME, "--port-base", port_base()]),
                        cwd=REPO, env=cli_env(state_dir), capture_output=True, text=True, timeout=600)
    try:
        assert up.returncode == 0, up.stderr
        train = subprocess.run(cli_argv(["train", "distributed_mnist", "--name", NAME, "--steps", "64",
                                         "--eval-every", "32", "--notify", hanging, "--notify-cmd", command]),
                               cwd=REPO, env=cli_env(state_dir), capture_output=True, text=True, timeout=600)
        ended = time.monotonic()
        assert train.returncode == 0, train.stderr
        state_text = (state_dir / f"{NAME}.json").read_text()
    finally:
        subprocess.run(cli_argv(["down", "--name", NAME, "--grace", "3"]), cwd=REPO, env=cli_env(state_dir),
                       capture_output=True, text=True, timeout=300)
        for pid in cluster_pids(NAME):
            os.kill(pid, signal.SIGKILL)
    assert_no_survivors(NAME)

    # The inventory's endpoint: every state change, in order, with the fields of the contract.
    bodies = [body for _, body in endpoint.received]
    assert [body["event"] for body in bodies] == ["started", "finished"], bodies
    for body in bodies:
        assert set(body) == {"cluster", "job", "event", "time", "report"}
        assert (body["cluster"], body["job"]) == (NAME, "distributed_mnist")
        assert body["time"].endswith("Z") and body["time"][:4].isdigit()
    assert bodies[0]["report"]["mode"] == "async" and bodies[0]["report"]["workers"] == 2
    assert bodies[1]["report"]["global_step"] >= 64 and bodies[1]["report"]["val_accuracy"] > 0.1

    # The command got the same documents on stdin.
    documents = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    assert documents == bodies

    # The hanging endpoint never answered while train ran, yet train ended: it waited at most the
    # notifier's flush budget (8 s) after the last event, far from the endpoint's 600 s.
    assert not endpoint.release.is_set()
    finished_at = endpoint.received[-1][0]
    assert ended - finished_at < 60, ended - finished_at
    assert "gave up waiting for notifications to" in train.stderr
    # The hanging URL's token is masked wherever it is shown; CLI URLs are not stored in the state.
    assert SECRET not in train.stderr + train.stdout and "/hang/hooks/****" in train.stderr
    assert SECRET not in state_text

    # The live view in a pipe: plain progress lines and one line per evaluation, no escape codes.
    lines = train.stderr.splitlines()
    progress = [line for line in lines if re.match(r"step \d+/64 \(\d+%\)", line)]
    assert progress and all(re.search(r"epoch \d+\.\d  ", line) for line in progress), train.stderr
    assert progress[-1].startswith("step 64/64 (100%)") and "elapsed " in progress[-1], train.stderr
    assert any(re.match(r"eval at step \d+ \(epoch \d+\.\d\):  val_loss \d\.\d{4}  val_accuracy", line)
               for line in lines), train.stderr
    assert "\x1b" not in train.stderr
