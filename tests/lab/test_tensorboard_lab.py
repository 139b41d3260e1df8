"""`pscluster tensorboard` over real SSH: sync training on two lab hosts, TensorBoard on worker 0's
host bound to that host's loopback (its own network namespace), answering on the local port
forwarded over the SSH connection; SIGTERM stops it there.

Extended (issue 47): the suite serves TensorBoard through the forward from the async chief's host
on tests/lab/test_training_lab.py's job; which task writes the summaries in each mode is
tests/unit's."""
from __future__ import annotations

import json

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli
from tests.lab.test_training_lab import tensorboard_through_the_forward
from tests.local.test_tensorboard import read_scalars

pytestmark = [pytest.mark.lab, pytest.mark.tf]


@pytest.mark.extended
def test_tensorboard_on_worker_0s_host_through_the_ssh_forward(tmp_path, make_lab, write_lab_inventory):
    lab = make_lab(2)
    name, state_dir = "lab-tb", tmp_path / "state"
    workdirs = {host: tmp_path / f"work-{host}" for host in ("node-1", "node-2")}
    inventory = write_lab_inventory(lab, tmp_path / "tb.yaml", {
        "worker": {host: {"pscluster_workdir": str(folder)} for host, folder in workdirs.items()}}, {
        "pscluster_port_base": port_base(), "pscluster_mode": "sync",
        "pscluster_env": {"OMP_NUM_THREADS": 1, "MNIST_MODEL": "mlp"}})
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, timeout=600)
        assert up.returncode == 0, up.stderr
        train = run_cli(["train", "distributed_mnist", "--name", name, "--steps", 100, "--summary-every", 20,
                         "--json"], state_dir=state_dir, timeout=900)
        assert train.returncode == 0, train.stderr
        state = json.loads((state_dir / f"{name}.json").read_text())
        leader_host = next(task["host"] for task in state["plan"]["tasks"] if (task["role"], task["index"]) == ("worker", 0))
        # worker 0 wrote the summaries, on its own host, under its own workdir
        scalars = read_scalars(workdirs[leader_host] / ".pscluster" / name / "tensorboard" / "distributed_mnist")
        assert [step for step, _ in scalars["loss"]] == [20, 40, 60, 80, 100]
        other = next(host for host in workdirs if host != leader_host)
        assert not (workdirs[other] / ".pscluster" / name / "tensorboard").exists()

        tensorboard_through_the_forward(name, state_dir, leader_host)
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name, "--grace", "3"], state_dir=state_dir, timeout=300)
    assert_no_survivors(name)
