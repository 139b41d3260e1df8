"""Shared-filesystem detection and the file rules of code sync (pure host-side logic, no SSH)."""
from __future__ import annotations

import os
import pwd
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import dataclasses
import io
import tarfile

import pytest

from cluster.errors import HostError
from cluster.plan import HostSpec
from cluster.transport.base import CommandResult, file_mode, temp_name
from cluster.transport.docker import DockerTransport
from cluster.transport.local import LocalTransport
from cluster.transport.slurm import SlurmTransport
from cluster.transport.ssh import SSHTransport
from roles import hostctl

HOST = HostSpec(name="node-b", address="10.1.1.2", connection="ssh", ssh_port=None, user=None, key_file=None,
                python="/opt/venv/bin/python", workdir="~/pscluster", host_key_policy="reject", known_hosts=None,
                connect_timeout=10.0)
TRANSPORTS = [(LocalTransport, "local"), (SSHTransport, "ssh"), (DockerTransport, "docker"), (SlurmTransport, "slurm")]


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


# ----------------------------------------------------------------------------- issue 42, M2: never outside the workdir

@pytest.mark.parametrize("kind, connection", TRANSPORTS)
@pytest.mark.parametrize("remote", ["{w}/../escaped.py", "/etc/escaped.py", "{w}/a/../../escaped.py", "{w}"])
def test_every_transport_refuses_a_destination_outside_the_workdir(tmp_path, kind, connection, remote):
    """The backstop under progfiles: whatever name reaches put_files, it writes only below the
    workdir; the refusal names the file and nothing is copied (no connection is even opened)."""
    workdir = tmp_path / "w"
    source = tmp_path / "a.py"
    source.write_text("x")
    transport = kind(dataclasses.replace(HOST, connection=connection))
    target = remote.format(w=workdir)
    with pytest.raises(HostError) as caught:
        transport.put_files([(str(source), target)], root=str(workdir))
    assert repr(target) in caught.value.message and "not below the workdir" in caught.value.message
    assert not (tmp_path / "escaped.py").exists()


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../x", ""])
def test_hostctl_hashes_refuses_a_name_outside_the_workdir(tmp_path, rel):
    with pytest.raises(ValueError, match="not below the workdir"):
        hostctl.op_hashes({"root": str(tmp_path), "files": ["ok.py", rel]})
    assert hostctl.op_hashes({"root": str(tmp_path), "files": ["a/./b.py"]})["hashes"] == {"a/./b.py": None}


def test_a_symlink_travels_as_its_content_in_every_transport(tmp_path, monkeypatch):
    """SFTP put and the local copy always followed links; the docker tar sent the link itself."""
    real = tmp_path / "real.txt"
    real.write_text("content")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    LocalTransport(dataclasses.replace(HOST, connection="local")).put_files(
        [(str(link), str(tmp_path / "w" / "l.txt"))], root=str(tmp_path / "w"))
    assert not (tmp_path / "w" / "l.txt").is_symlink() and (tmp_path / "w" / "l.txt").read_text() == "content"
    sent = []
    docker = DockerTransport(dataclasses.replace(HOST, connection="docker"))
    monkeypatch.setattr(docker, "run", lambda argv, stdin=None, timeout=60.0: sent.append(stdin) or
                        CommandResult(docker.host.name, (), 0, "", ""))
    docker.put_files([(str(link), "/w/l.txt")], root="/w")
    member = tarfile.open(fileobj=io.BytesIO(sent[0])).getmembers()[0]
    assert member.isreg() and member.size == len("content")



def test_a_local_stream_of_a_command_that_ends_before_reading_is_a_closed_stream():
    """srun of a Slurm job that has ended exits before it reads the watch program: the write to
    its stdin broke the pipe, and the BrokenPipeError ended the supervisor's reopening thread."""
    stream = LocalTransport(dataclasses.replace(HOST, connection="local")).stream(
        ["true"], stdin=b"x" * (4 << 20))         # more than a pipe holds: the write must meet the end
    deadline = time.monotonic() + 10
    while not stream.closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stream.closed and stream.lines() == []
    stream.close()
