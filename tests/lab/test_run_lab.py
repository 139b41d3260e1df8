"""``pscluster run`` over real SSH: the classic TF1 flags script across the 3-host lab, one
shot, from a project folder outside the checkout, synced to the hosts that do not share it."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli

pytestmark = [pytest.mark.lab, pytest.mark.tf]


def test_tf1_flags_script_across_three_hosts_one_shot(tmp_path, lab3, write_lab_inventory):
    name, state_dir = "lab-run-tf1", tmp_path / "state"
    project = tmp_path / "my-project"                     # where the user keeps their script and data
    (project / "data").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "byo" / "tf1_flags.py", project / "tf1_flags.py")
    shutil.copy(REPO / "examples" / "distributed_mnist" / "data" / "mnist.npz", project / "data" / "mnist.npz")
    (project / "notes.txt").write_text("synced with --sync\n")
    workdirs = {host: tmp_path / f"work-{host}" for host in ("node-2", "node-3")}
    groups = {"ps": {"node-1": {}, "node-2": {"pscluster_workdir": str(workdirs["node-2"])}},
              "worker": {"node-1": {}, "node-2": {"pscluster_workdir": str(workdirs["node-2"])},
                         "node-3": {"pscluster_workdir": str(workdirs["node-3"])}}}
    inventory = write_lab_inventory(lab3, tmp_path / "tf1.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_workdir": str(REPO), "pscluster_connect_timeout": 3,
        "pscluster_env": {"OMP_NUM_THREADS": 1}})
    try:
        proc = run_cli(["run", inventory, "--name", name, "--json", "--sync", "notes.txt", "--",
                        "python", "tf1_flags.py", "--ps_hosts={ps_hosts}", "--worker_hosts={worker_hosts}",
                        "--job_name={job_name}", "--task_index={task_index}", "--data", "data/mnist.npz",
                        "--steps", "300"], state_dir=state_dir, cwd=project, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        report = json.loads(proc.stdout)
        tasks = {f"{t['role']}:{t['index']}": t for t in report["tasks"]}
        assert {task: t["host"] for task, t in tasks.items()} == {
            "ps:0": "node-1", "ps:1": "node-2", "worker:0": "node-1", "worker:1": "node-2", "worker:2": "node-3"}
        assert all(tasks[f"worker:{i}"]["exit_code"] == 0 for i in range(3))
        assert tasks["ps:0"]["state"] == tasks["ps:1"]["state"] == "stopped"
        accuracy = [float(m["a"]) for m in re.finditer(r"\[worker:0@node-1\] final test_accuracy=(?P<a>[0-9.]+)",
                                                          proc.stderr)]
        assert accuracy and accuracy[-1] >= 0.85, proc.stderr[-3000:]
        assert "[worker:2@node-3]" in proc.stderr and "[ps:1@node-2]" in proc.stderr
        # node-1 shares the checkout: it ran in the project folder itself; the others got copies.
        for workdir in workdirs.values():
            assert (workdir / "tf1_flags.py").read_bytes() == (project / "tf1_flags.py").read_bytes()
            assert (workdir / "data" / "mnist.npz").stat().st_size == (project / "data" / "mnist.npz").stat().st_size
            assert (workdir / "notes.txt").read_text() == "synced with --sync\n"
            assert (workdir / "roles" / "hostctl.py").exists()          # code sync as for `up`
        assert not (state_dir / f"{name}.json").exists()
        # Its logs stay readable over SSH after the cluster is gone (the run history names the hosts).
        shown = run_cli(["logs", "--name", name, "--run", "1", "worker:2"], state_dir=state_dir, check=True)
        assert "worker 2: done after" in shown.stdout, shown.stdout[-2000:]
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)


def test_program_missing_on_a_host_is_named_before_anything_starts(tmp_path, lab3, write_lab_inventory):
    name, state_dir = "lab-run-missing", tmp_path / "state"
    groups = {"worker": {"node-1": {}, "node-2": {"pscluster_workdir": str(tmp_path / "work-node-2")}}}
    inventory = write_lab_inventory(lab3, tmp_path / "missing.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_workdir": str(REPO), "pscluster_connect_timeout": 3})
    proc = run_cli(["run", inventory, "--name", name, "--", "python", "/opt/nowhere/train.py"],
                   state_dir=state_dir, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "node-1: /opt/nowhere/train.py does not exist" in proc.stderr
    assert "node-2: /opt/nowhere/train.py does not exist" in proc.stderr
    assert not (state_dir / f"{name}.json").exists()
    assert_no_survivors(name)
