"""``worker_gpus: auto`` and busy GPUs, end to end through the CLI on this machine with a fake
``nvidia-smi`` first on PATH (there is no GPU here). Local hosts run hostctl with the CLI's own
environment, so the fake answers exactly as a real one would on a lab box: ``-L``, the
per-GPU memory query and the compute-apps query."""
from __future__ import annotations

import json
import os
import textwrap

from tests.helpers import port_base, run_cli

FAKE = textwrap.dedent('''\
    #!/usr/bin/env python3
    # Fake nvidia-smi: FAKE_GPU_MEM="10,2000,10" (MiB used per GPU), FAKE_GPU_APPS="1:4242:500;..."
    import os, sys
    mem = [int(m) for m in os.environ.get("FAKE_GPU_MEM", "").split(",") if m]
    args = " ".join(sys.argv[1:])
    if args == "-L":
        for i in range(len(mem)):
            print(f"GPU {i}: Fake GPU (UUID: GPU-fake-{i})")
    elif "--query-gpu" in args:
        for i, used in enumerate(mem):
            print(f"{i}, GPU-fake-{i}, 16384, {used}, Fake GPU")
    elif "--query-compute-apps" in args:
        for app in filter(None, os.environ.get("FAKE_GPU_APPS", "").split(";")):
            index, pid, used = app.split(":")
            print(f"GPU-fake-{index}, {pid}, {used}")
    else:
        sys.exit(f"fake nvidia-smi: unexpected {args}")
''')

INVENTORY = textwrap.dedent('''\
    all:
      vars:
        ansible_connection: local
        pscluster_mode: sync
        pscluster_gpu_busy_mib: 1024
        pscluster_env: {OMP_NUM_THREADS: 1}
      children:
        worker:
          hosts:
            localhost: {worker_gpus: auto}
''')

PROGRAM = ["python", "-c", "import os; print('mask=' + os.environ['CUDA_VISIBLE_DEVICES'])"]


def setup(tmp_path, **fake) -> tuple[str, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE)
    (bin_dir / "nvidia-smi").chmod(0o755)
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text(INVENTORY)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **fake}
    return str(inventory), env


def test_auto_is_one_task_per_gpu_found(tmp_path):
    inventory, env = setup(tmp_path, FAKE_GPU_MEM="10,20,30")
    state_dir = tmp_path / "state"
    planned = run_cli(["plan", inventory, "--json"], state_dir=state_dir, env=env)
    assert planned.returncode == 0, planned.stderr
    assert [t["cuda_visible_devices"] for t in json.loads(planned.stdout)["tasks"]] == ["auto"]
    ran = run_cli(["run", inventory, "--name", "gpus-auto", "--port-base", port_base(), "--json", "--", *PROGRAM],
                  state_dir=state_dir, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert sorted(f"{t['role']}:{t['index']}" for t in report["tasks"]) == ["worker:0", "worker:1", "worker:2"]
    masks = sorted(line.split("] ", 1)[1] for line in ran.stderr.splitlines() if "] mask=" in line)
    assert masks == ["mask=0", "mask=1", "mask=2"]


def test_no_gpu_found_names_the_key(tmp_path):
    inventory, env = setup(tmp_path, FAKE_GPU_MEM="")
    checked = run_cli(["check", inventory], state_dir=tmp_path / "state", env=env)
    assert checked.returncode == 2
    assert "worker_gpus: auto, but nvidia-smi lists no GPU on localhost" in checked.stderr
    assert "gpus.yaml" in checked.stderr


def test_a_busy_gpu_is_refused_naming_who_uses_it_unless_allowed(tmp_path):
    me = os.getpid()
    inventory, env = setup(tmp_path, FAKE_GPU_MEM="10,600,1500", FAKE_GPU_APPS=f"1:{me}:500")
    state_dir = tmp_path / "state"
    checked = run_cli(["check", inventory, "--json"], state_dir=state_dir, env=env)
    assert checked.returncode == 1
    failed = [c for c in json.loads(checked.stdout)["checks"] if not c["ok"]]
    assert [c["check"] for c in failed] == ["gpus"]
    detail = failed[0]["detail"]
    # GPU 1 runs someone's process; GPU 2 has 1500 MiB in use (above 1024); GPU 0 is free.
    assert f"GPU 1: 600 MiB used by root/pid {me}" in detail and "GPU 2: 1500 MiB used" in detail
    assert "GPU 0" not in detail
    assert "--allow-busy-gpus" in failed[0]["hint"]
    allowed = run_cli(["check", inventory, "--json", "--allow-busy-gpus"], state_dir=state_dir, env=env)
    assert allowed.returncode == 0, allowed.stdout
