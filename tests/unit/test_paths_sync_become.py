"""Shared-filesystem detection and the file rules of code sync (pure host-side logic, no SSH)."""
from __future__ import annotations

import os
import pwd
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
    answer = hostctl.op_fsid({"root": f"~{user.pw_name}/.cache/pscluster-fsid-test"})
    assert answer["root"] == os.path.join(user.pw_dir, ".cache", "pscluster-fsid-test")   # not a "~root" folder


def test_synced_files_get_0755_or_0644_whatever_the_local_bits(tmp_path):
    script, data = tmp_path / "run.sh", tmp_path / "data.txt"
    script.write_text("#!/bin/sh\n")
    data.write_text("x")
    script.chmod(0o700)
    data.chmod(0o600)
    assert (file_mode(str(script)), file_mode(str(data))) == (0o755, 0o644)


def test_temporary_names_differ_per_writer():
    assert len({temp_name("/w/roles/hostctl.py") for _ in range(100)}) == 100
