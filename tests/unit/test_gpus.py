"""cluster.hosts.gpus: nvidia-smi output parsing and the busy rule, on canned outputs."""
from __future__ import annotations

import pytest

from cluster.hosts.gpus import QUERY_APPS, QUERY_GPUS, GpuQueryError, busy_gpus, busy_message, parse
from roles import hostctl

GPUS = """0, GPU-aaaa, 16384, 3, Tesla V100-SXM2-16GB
1, GPU-bbbb, 16384, 15000, Tesla V100-SXM2-16GB
2, GPU-cccc, 16384, 2, Tesla V100-SXM2-16GB
"""
APPS = """GPU-bbbb, 4242, 14990
GPU-cccc, 77, [N/A]
"""


def test_gpus_with_their_processes_and_users():
    gpus = parse("gpu-1", GPUS, APPS, {4242: "alice"})
    assert [gpu.index for gpu in gpus] == [0, 1, 2]
    assert gpus[1].apps[0].pid == 4242 and gpus[1].apps[0].user == "alice"
    assert gpus[2].apps[0].used_mib is None
    assert (gpus[0].name, gpus[0].total_mib, gpus[0].used_mib) == ("Tesla V100-SXM2-16GB", 16384, 3)


def test_busy_when_used_by_a_process_or_above_the_threshold():
    gpus = parse("gpu-1", GPUS, "")
    assert [gpu.index for gpu in busy_gpus(gpus, 1024)] == [1]          # 15000 MiB, no process listed
    gpus = parse("gpu-1", GPUS, APPS, {4242: "alice"})
    busy = busy_gpus(gpus, 1024)
    assert [gpu.index for gpu in busy] == [1, 2]
    message = busy_message("gpu-1", busy)
    assert "gpu-1" in message and "GPU 1" in message and "alice/pid 4242" in message and "GPU 2" in message
    assert busy_gpus(parse("gpu-1", "0, GPU-aaaa, 8000, 2000, X\n", ""), 4096) == ()


# What 580-series drivers print (shapes from public reports: an H100 box, a DGX Spark whose GB10
# has no framebuffer of its own, a MIG-enabled A100, a GPU in trouble).
H100 = "0, GPU-5d0a9a1e-8a4e-6d2c-4b59-3f3c2d1e0a11, 81559, 0, NVIDIA H100 80GB HBM3\n"
GB10 = "0, GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5, [N/A], [N/A], NVIDIA GB10\n"
GB10_APPS = "GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5, 3121, 43\n"
A100_MIG = "0, GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16, 81920, 5, NVIDIA A100-SXM4-80GB\n"
A100_MIG_APPS = "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16, 23824, [N/A]\n"


def test_an_h100_with_nothing_running():
    (gpu,) = parse("h", H100, "")
    assert (gpu.index, gpu.name, gpu.total_mib, gpu.used_mib, gpu.apps) == (0, "NVIDIA H100 80GB HBM3", 81559, 0, ())
    assert not gpu.busy(1024)


def test_unified_memory_reports_no_memory_and_is_busy_only_by_its_processes():
    (idle,) = parse("spark", GB10, "")
    assert (idle.total_mib, idle.used_mib, idle.busy(1024)) == (None, None, False)
    assert idle.describe() == "GPU 0: memory use not reported"
    (used,) = parse("spark", GB10, GB10_APPS, {3121: "bob"})
    assert used.busy(1024) and used.describe() == "GPU 0: memory use not reported by bob/pid 3121"


def test_mig_processes_without_their_memory_still_make_the_gpu_busy():
    (gpu,) = parse("a100", A100_MIG, A100_MIG_APPS)
    assert gpu.apps[0].pid == 23824 and gpu.apps[0].used_mib is None and gpu.busy(1024)


@pytest.mark.parametrize("value", ["[Not Supported]", "[Unknown Error]", "[GPU requires reset]", "N/A"])
def test_any_bracketed_value_is_not_reported_rather_than_an_error(value):
    (gpu,) = parse("h", f"0, GPU-a, {value}, {value}, NVIDIA L4\n", f"GPU-a, 9, {value}\n")
    assert gpu.total_mib is None and gpu.used_mib is None and gpu.apps[0].used_mib is None


def test_extra_spaces_units_commas_in_names_and_no_process_lines():
    gpus = parse("h", "  1 ,GPU-b ,  24576 MiB ,  17 MiB ,  NVIDIA RTX 6000, Ada Generation  \n\n"
                      "0,GPU-a,24576,12,NVIDIA L4\n", "No running processes found\n")
    assert [(gpu.index, gpu.name, gpu.total_mib, gpu.used_mib) for gpu in gpus] == [
        (0, "NVIDIA L4", 24576, 12), (1, "NVIDIA RTX 6000, Ada Generation", 24576, 17)]


def test_hostctl_runs_the_queries_this_module_parses():
    assert QUERY_GPUS == ("nvidia-smi", hostctl.GPU_QUERY, "--format=csv,noheader,nounits")
    assert QUERY_APPS == ("nvidia-smi", hostctl.APPS_QUERY, "--format=csv,noheader,nounits")


@pytest.mark.parametrize("gpus, apps, expected", [
    ("0, GPU-aaaa, 3\n", "", "gpu-1: nvidia-smi --query-gpu line 1 has 3 field(s)"),
    ("zero, GPU-aaaa, 100, 3, X\n", "", "gpu-1: nvidia-smi gave 'zero' for index"),
    ("0, GPU-aaaa, 100, lots, X\n", "", "gpu-1: nvidia-smi gave 'lots' for memory.used"),
    ("0, GPU-aaaa, 100, 3, X\n", "GPU-aaaa, x, 1\n", "gpu-1: nvidia-smi gave 'x' for a pid"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n", "",
     "gpu-1: nvidia-smi --query-gpu line 1 has 1 field(s)"),
])
def test_malformed_output_is_an_error_naming_the_host(gpus, apps, expected):
    with pytest.raises(GpuQueryError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        parse("gpu-1", gpus, apps)
