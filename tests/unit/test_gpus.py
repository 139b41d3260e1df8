"""cluster.gpus: nvidia-smi output parsing and the busy rule, on canned outputs."""
from __future__ import annotations

import pytest

from cluster.gpus import GpuQueryError, busy_gpus, busy_message, parse

GPUS = """0, GPU-aaaa, 3
1, GPU-bbbb, 15000
2, GPU-cccc, 2
"""
APPS = """GPU-bbbb, 4242, 14990
GPU-cccc, 77, [N/A]
"""


def test_gpus_with_their_processes_and_users():
    gpus = parse("gpu-1", GPUS, APPS, {4242: "alice"})
    assert [gpu.index for gpu in gpus] == [0, 1, 2]
    assert gpus[1].apps[0].pid == 4242 and gpus[1].apps[0].user == "alice"
    assert gpus[2].apps[0].used_mib == 0


def test_busy_when_used_by_a_process_or_above_the_threshold():
    gpus = parse("gpu-1", GPUS, "")
    assert [gpu.index for gpu in busy_gpus(gpus, 1024)] == [1]          # 15000 MiB, no process listed
    gpus = parse("gpu-1", GPUS, APPS, {4242: "alice"})
    busy = busy_gpus(gpus, 1024)
    assert [gpu.index for gpu in busy] == [1, 2]
    message = busy_message("gpu-1", busy)
    assert "gpu-1" in message and "GPU 1" in message and "alice/pid 4242" in message and "GPU 2" in message
    assert busy_gpus(parse("gpu-1", "0, GPU-aaaa, 2000\n", ""), 4096) == ()


@pytest.mark.parametrize("gpus, apps, expected", [
    ("0, GPU-aaaa\n", "", "gpu-1: nvidia-smi --query-gpu line 1 has 2 field(s)"),
    ("zero, GPU-aaaa, 3\n", "", "gpu-1: nvidia-smi gave 'zero' for index"),
    ("0, GPU-aaaa, 3\n", "GPU-aaaa, x, 1\n", "gpu-1: nvidia-smi gave 'x' for a pid"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n", "",
     "gpu-1: nvidia-smi --query-gpu line 1 has 1 field(s)"),
])
def test_malformed_output_is_an_error_naming_the_host(gpus, apps, expected):
    with pytest.raises(GpuQueryError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        parse("gpu-1", gpus, apps)
