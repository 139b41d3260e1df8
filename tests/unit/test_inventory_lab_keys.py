"""Inventory keys for real labs: become, ProxyJump hops, auto GPUs, the busy-GPU threshold."""
from __future__ import annotations

import textwrap

import pytest

from cluster.errors import InventoryError
from cluster.inventory import load_inventory


def load(tmp_path, text: str):
    path = tmp_path / "lab.yaml"
    path.write_text(textwrap.dedent(text))
    return load_inventory(str(path))


def test_become_proxyjump_and_busy_threshold(tmp_path):
    inventory = load(tmp_path, """\
        all:
          vars:
            ansible_ssh_common_args: "-o ProxyJump=alice@login.example:2222 -o ServerAliveInterval=5"
          children:
            worker:
              hosts:
                gpu-a: {ansible_become: yes, ansible_become_user: trainer, pscluster_gpu_busy_mib: 300}
                gpu-b: {ansible_become: true, ansible_ssh_extra_args: "-J hop1,hop2"}
                gpu-c: {ansible_ssh_common_args: "-oProxyJump=none"}
        """)
    a, b, c = inventory.hosts
    assert (a.become_user, a.jump, a.gpu_busy_mib) == ("trainer", ("alice@login.example:2222",), 300)
    assert (b.become_user, b.jump, b.gpu_busy_mib) == ("root", ("alice@login.example:2222", "hop1", "hop2"), 1024)
    assert (c.become_user, c.jump) == (None, ("none",))      # said outright: not ~/.ssh/config's hops either (N10)


def test_auto_gpus_is_one_placeholder_task_until_preflight(tmp_path):
    inventory = load(tmp_path, """\
        worker:
          hosts:
            gpu-a: {worker_gpus: auto}
            gpu-b: {worker_gpus: [[0], [1]]}
        """)
    a, b = (host.slots_for("worker") for host in inventory.hosts)
    assert (a.auto_gpus, a.count, a.gpus) == (True, 1, None)
    assert (b.auto_gpus, b.count, b.gpus) == (False, 2, ("0", "1"))


@pytest.mark.parametrize("host_vars, key, words", [
    ("{worker_gpus: auto, worker_tasks: 2}", "worker_gpus", "worker_tasks is set too"),
    ("{ansible_become: maybe}", "ansible_become", "true or false"),
    ("{ansible_become_method: su}", "ansible_become_method", "sudo"),
    ("{ansible_ssh_common_args: '-o \"ProxyJump'}", "ansible_ssh_common_args", "cannot split"),
    ("{pscluster_gpu_busy_mib: -1}", "pscluster_gpu_busy_mib", "MiB"),
])
def test_bad_lab_keys_name_the_key(tmp_path, host_vars, key, words):
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, f"worker:\n  hosts:\n    gpu-a: {host_vars}\n")
    assert key in caught.value.key_path and words in str(caught.value)
