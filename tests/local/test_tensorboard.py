"""TensorBoard (issue 14) on real TensorFlow processes: the leader's summaries read back with
TensorBoard's own event reader, and `pscluster tensorboard` answering HTTP on the URL it prints,
stopped by Ctrl-C, and by `down` when the command itself was killed."""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import urllib.request

import pytest

from tests.helpers import REPO, assert_no_survivors, cli_argv, cli_env, port_base, run_cli
from testbed.procs import cluster_pids

LOCAL = REPO / "inventories" / "local.yaml"
NAME = "tb-local"
STEPS, EVERY = 200, 20
TRAIN_TAGS = {"loss", "steps_per_second", "examples_per_second", "learning_rate", "restarts"}

pytestmark = pytest.mark.tf


def read_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``folder``, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


class Served:
    """A running `pscluster tensorboard`, its stdout lines collected by a thread."""

    def __init__(self, state_dir, port: int):
        self.proc = subprocess.Popen(cli_argv(["tensorboard", "--name", NAME, "--port", port]), cwd=REPO,
                                     env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def url(self, timeout: float = 240) -> str:
        try:
            return self.lines.get(timeout=timeout).strip()
        except queue.Empty:
            self.proc.kill()
            raise AssertionError("no URL printed: " + self.proc.stderr.read()[-3000:]) from None


def board_records(state_dir) -> list[dict]:
    state = json.loads((state_dir / f"{NAME}.json").read_text())
    return [record for record in state["processes"] if record["kind"] == "tensorboard"]


@pytest.mark.extended
def test_summaries_and_tensorboard_on_a_local_cluster(tmp_path):
    state_dir, port = tmp_path / "state", port_base() + 15
    shutil.rmtree(REPO / ".pscluster" / NAME / "tensorboard", ignore_errors=True)   # an earlier run's
    up = run_cli(["up", LOCAL, "--name", NAME, "--port-base", port_base()], state_dir=state_dir, timeout=600)
    try:
        assert up.returncode == 0, up.stderr
        early = run_cli(["tensorboard", "--name", NAME, "--port", port], state_dir=state_dir)
        assert early.returncode == 2 and "no TensorBoard summaries yet" in early.stderr, early.stderr

        train = run_cli(["train", "distributed_mnist", "--name", NAME, "--steps", STEPS, "--summary-every", EVERY,
                         "--eval-every", 100, "--json"], state_dir=state_dir, timeout=900, env={"MNIST_MODEL": "mlp"})
        assert train.returncode == 0, train.stderr
        scalars = read_scalars(REPO / ".pscluster" / NAME / "tensorboard" / "distributed_mnist")
        assert TRAIN_TAGS | {"val_loss", "val_accuracy"} <= set(scalars)
        every_interval = list(range(EVERY, STEPS + 1, EVERY))
        for tag in ("loss", "learning_rate", "restarts"):       # one point per interval, on its multiple
            assert [step for step, _ in scalars[tag]] == every_interval, tag
        for tag in ("steps_per_second", "examples_per_second"):
            # the first closure (20 steps here) holds tracing and start-up: no rate for its interval
            assert [step for step, _ in scalars[tag]] == every_interval[1:], tag
        losses = [value for _, value in scalars["loss"]]
        print("loss per interval:", [round(value, 3) for value in losses])
        assert sum(losses[-3:]) < 0.6 * sum(losses[:3])
        assert {value for _, value in scalars["restarts"]} == {0.0}
        assert all(value > 0 for _, value in scalars["examples_per_second"])
        # async evaluates when step 100 is scheduled, at the step the variables have reached by then (<= 100)
        evaluated = [step for step, _ in scalars["val_accuracy"]]
        assert len(evaluated) == 2 and 0 < evaluated[0] <= 100 and evaluated[1] == STEPS
        assert scalars["val_accuracy"][-1][1] > 0.8

        # Served on this machine's loopback until Ctrl-C, which leaves nothing running.
        served = Served(state_dir, port)
        url = served.url()
        assert url == f"http://127.0.0.1:{port}/"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
        with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=30) as response:
            assert "loss" in json.load(response)["distributed_mnist"]
        (record,) = board_records(state_dir)
        assert record["pid"] in board_pids() and not record["stopped"]
        served.proc.send_signal(signal.SIGINT)
        assert served.proc.wait(timeout=60) == 130, served.proc.stderr.read()
        (record,) = board_records(state_dir)
        assert record["stopped"] and board_pids() == []

        # A killed command leaves its TensorBoard running: `down` stops it with the cluster.
        served = Served(state_dir, port)
        assert served.url().startswith("http://127.0.0.1:")
        served.proc.kill()
        served.proc.wait(timeout=30)
        assert [r["key"] for r in board_records(state_dir) if not r["stopped"]] == ["tensorboard#2"]
        assert board_pids()
    finally:
        down = run_cli(["down", "--name", NAME, "--grace", "3"], state_dir=state_dir, timeout=300)
        for pid in cluster_pids(NAME):
            os.kill(pid, signal.SIGKILL)
    assert down.returncode == 0, down.stderr
    assert_no_survivors(NAME)


def board_pids() -> list[int]:
    """This cluster's TensorBoard processes (its data server included), by their command lines."""
    found = []
    for pid in cluster_pids(NAME):
        try:
            if b"tensorboard" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
        except OSError:
            pass
    return found
