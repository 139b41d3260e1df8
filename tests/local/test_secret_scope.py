"""Secret scope end to end (issue 16 item 7) with real TensorFlow servers on this machine.

A standing server's environment is readable by anyone who reaches its port, so `up` gives the
inventory's secrets to no standing server unless pscluster_secret_env_roles names its role, while
a `run` program on the chief (and a `train` trainer) gets them. Local tasks inherit the control
process's environment, so the CLI also drops the secrets from it. Read from /proc/<pid>/environ of
the recorded server pids, and from the program's own output."""
from __future__ import annotations

import os

import pytest

from tests.helpers import assert_no_survivors, port_base, run_cli, run_json

pytestmark = pytest.mark.tf

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    pscluster_port_base: {base}
    pscluster_env:
      OMP_NUM_THREADS: 1
    pscluster_secret_env: [SCOPE_TEST_SECRET]
    pscluster_secret_env_roles: [ps]
  children:
    chief: {{hosts: {{localhost: }}}}
    ps: {{hosts: {{localhost: }}}}
    worker: {{hosts: {{localhost: }}}}
"""
PROGRAM = "import os; print('secret=' + os.environ.get('SCOPE_TEST_SECRET', 'ABSENT'))"


def environ_of(pid: int) -> list[bytes]:
    return open(f"/proc/{pid}/environ", "rb").read().split(b"\0")


def test_standing_servers_get_secrets_only_when_asked_and_programs_get_them(tmp_path):
    name, state_dir = "secret-scope", tmp_path / "state"
    secret = "s3cr3t-" + os.urandom(6).hex()
    env = {"SCOPE_TEST_SECRET": secret}
    inventory = tmp_path / "scope.yaml"
    inventory.write_text(INVENTORY.format(base=port_base()))
    try:
        up = run_cli(["up", inventory, "--name", name], state_dir=state_dir, env=env)
        assert up.returncode == 0, up.stderr
        status = run_json(["status", "--name", name], state_dir=state_dir)
        pids = {f"{t['role']}:{t['index']}": t["pid"] for t in status["tasks"] if t["pid"]}
        assert sorted(pids) == ["ps:0", "worker:0"]
        ps_env, worker_env = environ_of(pids["ps:0"]), environ_of(pids["worker:0"])
        assert f"PSCLUSTER_CLUSTER={name}".encode() in worker_env          # the right processes
        assert not any(secret.encode() in item for item in worker_env)    # a standing worker: not asked
        assert f"SCOPE_TEST_SECRET={secret}".encode() in ps_env            # pscluster_secret_env_roles: [ps]

        program = run_cli(["run", "--name", name, "--on", "chief", "--", "python", "-c", PROGRAM],
                          state_dir=state_dir, env=env, timeout=300)
        assert program.returncode == 0, program.stderr
        assert f"[chief:0@localhost] secret={secret}" in program.stdout

        down = run_cli(["down", "--name", name], state_dir=state_dir)
        assert down.returncode == 0, down.stderr
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)
