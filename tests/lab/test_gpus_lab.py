"""``worker_gpus: auto`` and busy GPUs on SSH hosts (issue 12 item 6): a fake ``nvidia-smi`` on
each lab host's PATH (their SSH sessions get a PATH that starts with the test's folder), which
answers per host (each lab host has its own ``hostname``) from a JSON file the test rewrites.
Preflight runs it through hostctl over SSH exactly as it would run the real one."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli

pytestmark = [pytest.mark.lab, pytest.mark.tf]

FAKE = textwrap.dedent('''\
    #!/usr/bin/env python3
    # Fake nvidia-smi: {"<hostname>": {"mem": [MiB used per GPU], "apps": [[gpu, pid, MiB], ...]}}
    import json, socket, sys
    gpus = json.load(open(CONFIG)).get(socket.gethostname(), {"mem": [], "apps": []})
    args = " ".join(sys.argv[1:])
    if args == "-L":
        for i in range(len(gpus["mem"])):
            print(f"GPU {i}: Fake GPU (UUID: GPU-{socket.gethostname()}-{i})")
    elif "--query-gpu" in args:
        for i, used in enumerate(gpus["mem"]):
            print(f"{i}, GPU-{socket.gethostname()}-{i}, 16384, {used}, Fake GPU")
    elif "--query-compute-apps" in args:
        for index, pid, used in gpus["apps"]:
            print(f"GPU-{socket.gethostname()}-{index}, {pid}, {used}")
    else:
        sys.exit(f"fake nvidia-smi: unexpected {args}")
''')


def masks_of_running_tasks(name: str, state: dict) -> dict[str, str]:
    """task -> CUDA_VISIBLE_DEVICES as the running process really has it (read from /proc)."""
    found = {}
    for record in state["processes"]:
        if record["kind"] == "standby":     # not a task's process until a `train` takes it over
            continue
        with open(f"/proc/{record['pid']}/environ", "rb") as handle:
            env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        found[f"{record['task']}@{record['host']}"] = env[b"CUDA_VISIBLE_DEVICES"].decode()
    return found


def test_auto_gpus_over_ssh_and_a_busy_gpu_refused_unless_allowed(tmp_path, make_lab, write_lab_inventory):
    bin_dir, config = tmp_path / "bin", tmp_path / "gpus.json"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE.replace("CONFIG", repr(str(config)), 1))
    (bin_dir / "nvidia-smi").chmod(0o755)
    config.write_text(json.dumps({"node-2": {"mem": [5, 7], "apps": []}, "node-3": {"mem": [3], "apps": []}}))
    lab = make_lab(3, session_env={"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    name, state_dir = "lab-gpus-auto", tmp_path / "state"
    groups = {"chief": ["node-1"], "ps": ["node-1"],
              "worker": {"node-2": {"worker_gpus": "auto"}, "node-3": {"worker_gpus": "auto"}}}
    inventory = write_lab_inventory(lab, tmp_path / "gpus.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_mode": "async", "pscluster_gpu_busy_mib": 1024,
        "pscluster_env": {"OMP_NUM_THREADS": 1}, "pscluster_intra_op_threads": 1})

    planned = run_cli(["plan", inventory, "--name", name, "--json"], state_dir=state_dir)
    assert planned.returncode == 0, planned.stderr
    assert [t["cuda_visible_devices"] for t in json.loads(planned.stdout)["tasks"] if t["role"] == "worker"] \
        == ["auto", "auto"]                                      # known only at preflight
    checked = run_cli(["check", inventory, "--name", name, "--json"], state_dir=state_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # node-3's only GPU runs someone's process (this test's own pid, user root).
    me = os.getpid()
    config.write_text(json.dumps({"node-2": {"mem": [5, 7], "apps": []},
                                  "node-3": {"mem": [700], "apps": [[0, me, 690]]}}))
    refused = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"node-3: GPU(s) already in use: GPU 0: 700 MiB used by root/pid {me}" in refused.stderr, refused.stderr
    assert "preflight failed on 1 host(s): node-3; nothing was started" in refused.stderr
    assert not (state_dir / f"{name}.json").exists()             # nothing started, nothing recorded
    assert_no_survivors(name)
    checked = run_cli(["check", inventory, "--name", name, "--json"], state_dir=state_dir)
    failed = [c for c in json.loads(checked.stdout)["checks"] if not c["ok"]]
    assert checked.returncode == 1 and [(c["host"], c["check"]) for c in failed] == [("node-3", "gpus")]
    assert f"GPU 0: 700 MiB used by root/pid {me}" in failed[0]["detail"]
    assert "--allow-busy-gpus" in failed[0]["hint"]

    try:
        up = run_cli(["up", inventory, "--name", name, "--allow-busy-gpus"], state_dir=state_dir, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((state_dir / f"{name}.json").read_text())
        masks = {f"{t['role']}:{t['index']}@{t['host']}": t["cuda_visible_devices"] for t in state["plan"]["tasks"]}
        assert masks == {"chief:0@node-1": None, "ps:0@node-1": "",     # one worker per GPU each host lists
                         "worker:0@node-2": "0", "worker:1@node-2": "1", "worker:2@node-3": "0"}, masks
        assert masks_of_running_tasks(name, state) == {"ps:0@node-1": "", "worker:0@node-2": "0",
                                                       "worker:1@node-2": "1", "worker:2@node-3": "0"}
    finally:
        if (state_dir / f"{name}.json").exists():
            down = run_cli(["down", "--name", name], state_dir=state_dir)
            assert down.returncode == 0, down.stdout + down.stderr
    assert_no_survivors(name)
