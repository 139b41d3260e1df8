"""Issue 24 item 3 over real SSH: a program split over two files (examples/byo/custom_loop:
main.py imports mnist_data.py beside it) runs across the 3-host lab, one shot, from a project
folder outside the checkout, on hosts whose workdirs are neither the checkout nor one another's.
`run` copies the script's whole folder there, less what .psclusterignore leaves out."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli

pytestmark = [pytest.mark.lab, pytest.mark.tf]


def test_a_program_that_imports_its_sibling_module_runs_on_three_hosts(tmp_path, lab3, write_lab_inventory):
    name, state_dir = "lab-run-sibling", tmp_path / "state"
    project = tmp_path / "my-project"
    shutil.copytree(REPO / "examples" / "byo" / "custom_loop", project / "trainer")
    (project / "trainer" / ".psclusterignore").write_text("scratch/\n")
    (project / "trainer" / "scratch").mkdir()
    (project / "trainer" / "scratch" / "junk.bin").write_bytes(b"\0" * 4096)
    workdirs = {host: tmp_path / f"work-{host}" for host in ("node-1", "node-2", "node-3")}
    groups = {"worker": {host: {"pscluster_workdir": str(workdir)} for host, workdir in workdirs.items()}}
    inventory = write_lab_inventory(lab3, tmp_path / "sibling.yaml", groups, {
        "pscluster_port_base": port_base(), "pscluster_connect_timeout": 3, "pscluster_mode": "sync",
        "pscluster_env": {"OMP_NUM_THREADS": 1}})
    try:
        proc = run_cli(["run", inventory, "--name", name, "--json", "--", "python", "trainer/main.py",
                        "--steps", "60", "--batch_size", "120"], state_dir=state_dir, cwd=project, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        report = json.loads(proc.stdout)
        assert {f"{t['role']}:{t['index']}": (t["host"], t["exit_code"]) for t in report["tasks"]} == {
            "worker:0": ("node-1", 0), "worker:1": ("node-2", 0), "worker:2": ("node-3", 0)}
        accuracy = [float(m["a"]) for m in re.finditer(r"\[worker:0@node-1\] final test_accuracy=(?P<a>[0-9.]+)",
                                                          proc.stderr)]
        assert accuracy and 0.0 < accuracy[-1] <= 1.0, proc.stderr[-3000:]
        for workdir in workdirs.values():          # the folder travelled, less what .psclusterignore leaves out
            assert (workdir / "trainer" / "mnist_data.py").read_bytes() == \
                (project / "trainer" / "mnist_data.py").read_bytes()
            assert (workdir / "trainer" / ".psclusterignore").exists()
            assert not (workdir / "trainer" / "scratch").exists()
            assert (workdir / "roles" / "hostctl.py").exists()
        assert not (state_dir / f"{name}.json").exists()
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)
