"""Reaching hosts over real SSH: a host that vanishes is reported within a bounded time."""
from __future__ import annotations

import threading
import time

import pytest

from cluster.errors import UnreachableHostError
from cluster.plan import HostSpec
from cluster.transport.ssh import SSHTransport
from tests.lab.netlab import venv_python

pytestmark = [pytest.mark.lab]


def _spec(lab, name: str) -> HostSpec:
    return HostSpec(name=name, address=lab.host(name).address, connection="ssh", ssh_port=None, user="root",
                    key_file=str(lab.key_path), python=venv_python(), workdir="/tmp", host_key_policy="strict",
                    known_hosts=str(lab.known_hosts), connect_timeout=10.0)


def test_a_host_that_vanishes_mid_command_is_named_within_seconds(lab3):
    transport = SSHTransport(_spec(lab3, "node-3"))
    try:
        assert transport.run(["true"]).exit_code == 0
        threading.Timer(1.0, lab3.cut, ["node-3"]).start()
        began = time.monotonic()
        with pytest.raises(UnreachableHostError) as caught:
            transport.run(["sleep", "300"], timeout=600)       # only the keepalive watchdog can end this
        elapsed = time.monotonic() - began
    finally:
        transport.close()
    assert elapsed < 30, elapsed
    assert caught.value.host == "node-3" and "lost" in str(caught.value)
