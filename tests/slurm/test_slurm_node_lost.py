"""A node of the allocation stops answering mid-training (issue 41, item 5), on a real Slurm.

Slurm's own rule comes first: a node silent for ``SlurmdTimeout`` (30 s in the lab) is DOWN.

- A job allocated the default way ends with it (NODE_FAIL): Slurm ends every step, on every
  node, and pscluster's tasks with them. Before, the supervisor heard only its watches end and a
  drain it started for the notice, then failed on "srun: error: Slurm job 1 has expired" from
  every host, and ``down`` exited 1 naming each host with a hint to wait for it (or silently:
  click exits 1 without a word on a BrokenPipeError, srun's stdin closed by its end). Now the
  job fails at once, saying that Slurm ended the job, how, and what to do (``--no-kill``,
  ``train --resume``); ``down`` finishes.
- A job allocated with ``--no-kill`` goes on, and Slurm takes the node out of it. The async job
  goes on in place without the node's worker as soon as the node is out (not after
  ``--host-timeout``); before, ``down`` then failed on the node ("Requested node configuration is
  not available"), now it finishes.

Either way Slurm ends the cut node's steps once it answers again (slurmctld: "Killing JobId=1 on
failed node", "Registered JobId=1 StepId=1.4 on wrong node"), so nothing is left.
"""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.slurm.test_slurm import _cli, _up_and_train, _wait_gone

pytestmark = [pytest.mark.lab, pytest.mark.tf, pytest.mark.slow]


def _record(state_dir, name) -> dict:
    try:
        return json.loads((state_dir / f"{name}.json").read_text()).get("job") or {}
    except (FileNotFoundError, ValueError):
        return {}


def _wait(train, err, state_dir, name, ok, what: str, seconds: float = 300) -> dict:
    """The job record once ``ok(record)`` (a state to wait for, never a time)."""
    deadline = time.monotonic() + seconds
    while True:
        record = _record(state_dir, name)
        if ok(record):
            return record
        assert train.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, f"never {what}: {record}"
        time.sleep(0.5)


@pytest.mark.parametrize("no_kill", [False, pytest.param(True, marks=pytest.mark.extended)],
                         ids=["default", "no-kill"])
def test_a_node_that_stops_answering(slurm_lab, tmp_path, no_kill):
    job = slurm_lab.salloc("-N2", "--ntasks-per-node=1", *(["--no-kill"] if no_kill else []))
    name, state_dir, inventory = "slurm-node-lost", tmp_path / "state", tmp_path / "slurm.yaml"
    node2 = slurm_lab.expand(job["SLURM_JOB_NODELIST"])[1]
    train = None
    try:
        err = tmp_path / "train.err"
        train = _up_and_train(slurm_lab, job, name, state_dir, inventory, err)
        _wait(train, err, state_dir, name, lambda r: (r.get("step") or 0) >= 50 and node2 in (r.get("watch_pids") or {}),
              f"trained with {node2}'s watch heard")
        slurm_lab.cut(node2)
        try:
            if no_kill:
                # Out of the allocation after SlurmdTimeout: the job goes on in place, before the
                # 60 s host timeout would have said so.
                record = _wait(train, err, state_dir, name,
                               lambda r: "out of the Slurm job's allocation" in (r.get("message") or ""),
                               f"{node2} out of the allocation")
                step = record["step"]
                record = _wait(train, err, state_dir, name, lambda r: (r.get("step") or 0) >= step + 200,
                               "training on without it")
                assert record["state"] == "running" and not record.get("restarts"), record
            else:
                rc = train.wait(timeout=300)     # Slurm ends the job after SlurmdTimeout; the job fails then
        finally:
            slurm_lab.heal(node2)
        text = err.read_text()
        if no_kill:
            assert f"{node2} is out of the Slurm job's allocation (a failed node): training goes on in place" in text, \
                text[-3000:]
        else:
            # 1, the job failed. Slurm's SIGTERM to every step reached the watches too: not a drain
            # (before, the chief's host's drain stopped the CLI, exit 143, before it said why).
            assert rc == 1, text[-3000:]
            assert f"Slurm job {job['SLURM_JOB_ID']} has ended (" in text and "NodeDown" in text, text[-3000:]
            assert "--no-kill" in text and "--resume" in text, text[-3000:]
            record = _record(state_dir, name)
            assert record["state"] == "failed" and "has ended" in (record.get("message") or ""), record
        assert "Traceback" not in text, text[-3000:]
        down = _cli(slurm_lab, job, ["--traceback", "down", "--name", name], state_dir)
        drains = state_dir / f"{name}.drains.log"
        said = down.stdout + down.stderr
        assert down.returncode == 0, said + (drains.read_text() if drains.exists() else "")
        assert ("is not in Slurm job" if no_kill else "has ended") in said and "Traceback" not in said, said
    finally:
        if train is not None and train.poll() is None:
            train.terminate()
            train.wait(timeout=120)
        subprocess.run(["scancel", job["SLURM_JOB_ID"]], env=slurm_lab.env, capture_output=True)
    # node2's steps end once it answers again and registers (up to ~2 min after the heal, measured).
    assert _wait_gone(slurm_lab, name, seconds=240) == ([], [])
