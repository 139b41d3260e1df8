"""Shared-filesystem detection and the file rules of code sync (pure host-side logic, no SSH)."""
from __future__ import annotations

import os
import pwd
import shutil
from concurrent.futures import ThreadPoolExecutor

from cluster.transport.base import file_mode, temp_name
from roles import hostctl


def test_fsid_is_one_id_per_folder_even_when_hosts_race(tmp_path):
    shared, other = tmp_path / "shared", tmp_path / "other"
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: hostctl.op_fsid({"root": str(shared)})["fsid"], range(16)))
    assert len(ids) == 1
    assert hostctl.op_fsid({"root": str(other)})["fsid"] not in ids
    assert sorted(os.listdir(shared / ".pscluster")) == ["fsid"]          # no temporary left


def test_fsid_expands_a_user_home_on_the_host():
    user = pwd.getpwuid(os.getuid())
    folder = f"pscluster-fsid-test-{os.getpid()}"
    try:
        answer = hostctl.op_fsid({"root": f"~{user.pw_name}/{folder}"})
    finally:
        shutil.rmtree(os.path.join(user.pw_dir, folder), ignore_errors=True)
    assert answer["root"] == os.path.join(user.pw_dir, folder)              # not a literal "~root" folder


def test_synced_files_get_0755_or_0644_whatever_the_local_bits(tmp_path):
    script, data = tmp_path / "run.sh", tmp_path / "data.txt"
    script.write_text("#!/bin/sh\n")
    data.write_text("x")
    script.chmod(0o700)
    data.chmod(0o600)
    assert (file_mode(str(script)), file_mode(str(data))) == (0o755, 0o644)


def test_temporary_names_differ_per_writer():
    assert len({temp_name("/w/roles/hostctl.py") for _ in range(100)}) == 100


def test_plan_shows_the_task_user_and_the_jump_host(tmp_path):
    from tests.helpers import run_cli
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("""\
all:
  vars:
    pscluster_port_base: 2300
  children:
    worker:
      hosts:
        gpu-1: {ansible_host: 198.51.100.20, ansible_become: true, ansible_become_user: alice,
                ansible_ssh_common_args: "-o ProxyJump=bob@login.example.org:2202"}
        gpu-2: {ansible_host: 198.51.100.21}
""")
    shown = run_cli(["plan", str(inventory), "--mode", "sync"], state_dir=tmp_path / "state")
    assert shown.returncode == 0, shown.stderr
    assert "on gpu-1 as alice via bob@login.example.org:2202" in shown.stdout
    assert "on gpu-2  " in shown.stdout
