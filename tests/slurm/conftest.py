"""Fixture: a real Slurm (munged, slurmctld, two slurmd in network namespaces, fake GPUs as GRES).

Skips with the reason when not root or when Debian's slurmctld/slurmd/slurm-client/munge are
missing (scripts/bootstrap.sh installs them). Every daemon is stopped by PID at the end.
"""
from __future__ import annotations

import os

import pytest

from testbed.slurmlab import SlurmLab, missing_tools


def running_slurm_lab(nodes: int):
    """A started SlurmLab of ``nodes`` nodes (skips without root or the tools); stopped after."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm lab needs root (network namespaces, mounts, slurmd)")
    missing = missing_tools()
    if missing:
        pytest.skip(f"Slurm lab tools missing: {', '.join(missing)} (run scripts/bootstrap.sh)")
    if not os.path.isdir("/sys/fs/cgroup/freezer"):
        pytest.skip("proctrack/cgroup needs the cgroup v1 freezer at /sys/fs/cgroup/freezer")
    lab = SlurmLab(nodes=nodes, gpus=2)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="module")
def slurm_lab():
    yield from running_slurm_lab(2)


@pytest.fixture(scope="module")
def slurm_lab3():
    yield from running_slurm_lab(3)
