"""What one control process keeps between its SSH connections (issue 46: a connection's CPU at
many hosts): the private key read once per file version, the ssh config's answer per address."""
from __future__ import annotations

import os
import shutil
import subprocess

import fabric
import pytest

from cluster.transport import ssh

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")


def _keygen(path, passphrase=""):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True)


def test_a_key_is_read_once_per_version_of_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr(ssh, "_KEYS", {})
    path = tmp_path / "id_ed25519"
    _keygen(path)
    first = ssh._private_key(str(path))
    assert first is not None and ssh._private_key(str(path)) is first
    os.unlink(path)
    _keygen(path)                                   # another key under the same name
    os.utime(path, ns=(1, 1))                       # a different version, whatever the clock's grain
    second = ssh._private_key(str(path))
    assert second is not None and second is not first and second.fingerprint != first.fingerprint


def test_a_key_with_a_passphrase_or_no_file_is_left_to_paramiko(tmp_path, monkeypatch):
    monkeypatch.setattr(ssh, "_KEYS", {})
    locked = tmp_path / "locked"
    _keygen(locked, passphrase="secret words")
    assert ssh._private_key(str(locked)) is None
    assert ssh._private_key(str(tmp_path / "missing")) is None


def test_the_loaded_ssh_config_is_asked_once_per_address(tmp_path, monkeypatch):
    config = tmp_path / "config"
    config.write_text("Host bastioned-*\n    ProxyJump gate.example:2222\n")
    monkeypatch.setattr(ssh, "_SSH_CONFIG", fabric.Config(runtime_ssh_path=str(config)).base_ssh_config)
    monkeypatch.setattr(ssh, "_LOOKUPS", {})
    asked = []
    real = ssh._SSH_CONFIG.lookup
    monkeypatch.setattr(ssh._SSH_CONFIG, "lookup", lambda address: asked.append(address) or real(address))
    assert ssh.config_jumps("bastioned-1") == ("gate.example:2222",)
    assert ssh.config_jumps("bastioned-1") == ("gate.example:2222",) and ssh.config_jumps("plain") == ()
    assert asked == ["bastioned-1", "plain"]
    # a config given by path is read as it is now, every time
    other = tmp_path / "other"
    other.write_text("Host plain\n    ProxyJump one\n")
    assert ssh.config_jumps("plain", str(other)) == ("one",)
    other.write_text("Host plain\n    ProxyJump two\n")
    assert ssh.config_jumps("plain", str(other)) == ("two",)
