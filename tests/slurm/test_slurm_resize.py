"""A requeued batch job that gets a different number of nodes resumes at the new size (issue 23,
item 4), on a real 3-node Slurm: the exported script asks for 2 to 3 nodes (`export --max-nodes 3`);
the first run gets 2 (the third node is drained), the time-limit warning stops it with a
checkpoint and requeues it, the third node comes back, the pending job is given 3 nodes
(`scontrol update`: Slurm keeps a requeued job at its first run's size), and the second run lays
the cluster out on 3 nodes and resumes from that checkpoint."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from .test_slurm import REQUEUE_STEPS, _requeued_batch_job, _wait_gone

pytestmark = [pytest.mark.lab, pytest.mark.tf, pytest.mark.slow]


def _node_state(lab, node: str, state: str, *, check: bool = True) -> None:
    subprocess.run(["scontrol", "update", f"NodeName={node}", f"State={state}"]
                   + (["Reason=pscluster-test"] if state == "DRAIN" else []), env=lab.env, check=check,
                   capture_output=True)


def test_a_requeue_from_2_to_3_nodes_resumes_at_the_new_size(slurm_lab3, tmp_path):
    lab, third = slurm_lab3, slurm_lab3.nodes[2]
    name, steps = f"regrow{os.getpid() % 10000}", REQUEUE_STEPS
    _node_state(lab, third, "DRAIN")

    def warn_and_give_the_node_back(job: str) -> None:
        _node_state(lab, third, "RESUME")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=lab.env, check=True)

    def grow(job: str) -> None:
        # Slurm 22.05 keeps a requeued job at the node count (and task count) its first run got,
        # --nodes=2-3 notwithstanding (measured here): the admin gives it 3 while it is pending.
        subprocess.run(["scontrol", "update", f"JobId={job}", "NumNodes=3", "NumTasks=3"], env=lab.env, check=True,
                       capture_output=True)

    try:
        first, second, _ = _requeued_batch_job(lab, tmp_path, name, steps, 100000,
                                               ready=lambda job: (job.step or 0) > 0,
                                               interrupt=warn_and_give_the_node_back,
                                               export_extra=["--max-nodes", 3], requeued=grow)
    finally:        # (already resumed when the test got that far: then scontrol says so and fails)
        _node_state(lab, third, "RESUME", check=False)
    flat_first, flat_second = " ".join(first.split()), " ".join(second.split())
    assert "(async, 2 worker(s))" in flat_first and "(async, 3 worker(s))" in flat_second, (first, second)
    saved = int(re.search(r"checkpoint saved at step (\d+)", first).group(1))
    assert int(re.search(r"resumed from step\W+(\d+)", second).group(1)) == saved, second
    assert int(re.search(r"global step\W+(\d+)", second).group(1)) >= steps, second
    assert _wait_gone(lab, name) == ([], [])
