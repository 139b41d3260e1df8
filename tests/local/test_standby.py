"""Standbys end to end on a local cluster (roles/standby.py): `up` starts one for the chief, the
first `train` runs in it (TensorFlow already imported), `train` leaves a new one for the next job,
a standby that must not run a job (another import-time environment) or does not listen (frozen)
is passed over with a warning and the chief starts afresh, and `down` leaves nothing."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli

pytestmark = pytest.mark.tf


def _state(state_dir, name: str) -> dict:
    return json.loads((state_dir / f"{name}.json").read_text())


def _records(state_dir, name: str, kind: str) -> list[dict]:
    return [r for r in _state(state_dir, name)["processes"] if r["kind"] == kind and r["task"] == "chief:0"]


def _train(name: str, state_dir, env: dict | None = None) -> tuple[dict, str]:
    proc = run_cli(["train", "distributed_mnist", "--name", name, "--steps", 64, "--json"], state_dir=state_dir,
                   env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def _wait_ready(name: str, state_dir, timeout: float = 120.0) -> dict:
    """Until `status` says the chief's standby has imported TensorFlow."""
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads(run_cli(["status", "--name", name, "--json"], state_dir=state_dir, check=True).stdout)
        chief = next(t for t in status["tasks"] if t["role"] == "chief")
        if chief["standby"] and chief["standby"]["ready"]:
            assert "TensorFlow imported, waiting" in chief["detail"]
            return chief
        assert time.monotonic() < deadline, chief
        time.sleep(0.5)


def _wait_listening(record: dict, timeout: float = 120.0) -> None:
    """Until the standby's FIFO exists (it creates it before it forks to import TensorFlow)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(record["log"] + ".fifo"):
        assert time.monotonic() < deadline, open(record["log"]).read()
        time.sleep(0.1)


def test_train_runs_in_the_standby_and_leaves_a_new_one(tmp_path):
    name, state_dir = "local-standby", tmp_path / "state"
    try:
        up = run_cli(["up", REPO / "inventories/local.yaml", "--name", name, "--port-base", port_base()],
                     state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        assert "standby for chief:0@localhost" in up.stderr
        (first,) = _records(state_dir, name, "standby")
        assert not first["stopped"] and first["pid"]
        status = json.loads(run_cli(["status", "--name", name, "--json"], state_dir=state_dir, check=True).stdout)
        chief = next(t for t in status["tasks"] if t["role"] == "chief")
        assert chief["state"] == "not started" and f"standby pid {first['pid']}" in chief["detail"]
        assert chief["standby"]["pid"] == first["pid"]
        _wait_ready(name, state_dir)

        # 1. The first job's chief is the standby's process.
        report, _ = _train(name, state_dir)
        assert report["global_step"] == 64 and report["val_accuracy"] is not None
        (trainer,) = _records(state_dir, name, "train")
        retired, second = _records(state_dir, name, "standby")
        assert trainer["pid"] == first["pid"] and trainer["exit_file"] == first["exit_file"]
        assert retired["stopped"] and not second["stopped"] and second["pid"] != first["pid"]
        log = open(trainer["log"]).read()
        assert f"standby pid {first['pid']}: TensorFlow already imported" in log.splitlines()[0]
        assert "pscluster.standby INFO standby pid" in log and "done: step 64" in log
        assert json.load(open(first["exit_file"]))["exit_code"] == 0

        # 2. A standby whose import-time environment is not the job's declines; the chief starts afresh.
        _wait_listening(second)
        report, stderr = _train(name, state_dir, env={"KMP_BLOCKTIME": "0"})
        assert report["global_step"] == 64
        assert "its standby was not used" in stderr and "KMP_BLOCKTIME" in stderr
        trainer = _records(state_dir, name, "train")[-1]
        assert trainer["pid"] != second["pid"]
        third = _records(state_dir, name, "standby")[-1]
        assert third["key"] == "chief:0#s3" and not third["stopped"]
        assert all(r["stopped"] for r in _records(state_dir, name, "standby")[:-1])

        # 3. A frozen standby (its read of the FIFO interrupted: not listening) is killed and passed over.
        _wait_listening(third)
        os.kill(third["pid"], signal.SIGSTOP)
        report, stderr = _train(name, state_dir)
        assert report["global_step"] == 64 and "not listening" in stderr
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{third['pid']}") and open(f"/proc/{third['pid']}/stat").read().split()[2] != "Z":
            assert time.monotonic() < deadline, "the frozen standby survived"
            time.sleep(0.1)

        down = run_cli(["down", "--name", name], state_dir=state_dir)
        assert down.returncode == 0, down.stderr
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)


@pytest.mark.extended
def test_no_standby_when_the_inventory_says_so(tmp_path):
    name, state_dir = "local-no-standby", tmp_path / "state"
    inventory = tmp_path / "nostandby.yaml"
    inventory.write_text((REPO / "inventories/local.yaml").read_text().replace(
        "    pscluster_mode: async\n", "    pscluster_mode: async\n    pscluster_standby: false\n"))
    try:
        up = run_cli(["up", inventory, "--name", name, "--port-base", port_base()], state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        assert "standby for" not in up.stderr and _records(state_dir, name, "standby") == []
        report, _ = _train(name, state_dir)
        assert report["global_step"] == 64 and _records(state_dir, name, "standby") == []
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)
