"""``up`` / ``status`` / ``down`` of local clusters (no SSH) with real TensorFlow servers."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base, run_cli, run_json

pytestmark = pytest.mark.tf


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_local_inventory_up_status_down(tmp_path):
    name = "local-lifecycle"
    state_dir = tmp_path / "state"
    base = port_base()
    try:
        up = run_cli(["up", REPO / "inventories/local.yaml", "--name", name, "--port-base", base],
                     state_dir=state_dir)
        assert up.returncode == 0, up.stderr
        status = run_json(["status", "--name", name], state_dir=state_dir)
        rows = {f"{t['role']}:{t['index']}": t for t in status["tasks"]}
        assert sorted(rows) == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
        assert [rows[t]["port"] for t in sorted(rows)] == [base, base + 1, base + 2, base + 3, base + 4]
        for task in ("ps:0", "ps:1", "worker:0", "worker:1"):
            role, index = task.split(":")
            assert rows[task]["state"] == "ready"
            assert rows[task]["devices"] == [f"/job:{role}/replica:0/task:{index}/device:CPU:0"]
            environ = open(f"/proc/{rows[task]['pid']}/environ", "rb").read().split(b"\0")
            mask = [item for item in environ if item.startswith(b"CUDA_VISIBLE_DEVICES=")]
            # ps are CPU-only by default (an empty mask); workers get no mask at all.
            assert mask == ([b"CUDA_VISIBLE_DEVICES="] if role == "ps" else [])
            assert b"GRPC_FAIL_FAST=use_caller" in environ
            assert b"OMP_NUM_THREADS=1" in environ       # pscluster_env of local.yaml
            tf_config = json.loads(next(i for i in environ if i.startswith(b"TF_CONFIG="))[10:])
            assert tf_config["task"] == {"type": role, "index": int(index)}
        assert rows["chief:0"]["state"] == "not started"
        assert _port_open(base + 1)

        second = run_cli(["up", REPO / "inventories/local.yaml", "--name", name, "--port-base", base],
                         state_dir=state_dir)
        assert second.returncode == 2 and "already up" in second.stderr

        down = run_cli(["down", "--name", name], state_dir=state_dir)
        assert down.returncode == 0, down.stderr
        assert "5 process(es) stopped" in down.stderr      # 4 servers and the chief's standby
    finally:
        if (state_dir / f"{name}.json").exists():
            run_cli(["down", "--name", name], state_dir=state_dir)
    assert_no_survivors(name)
    assert not any(_port_open(base + i) for i in range(5))
    assert list(state_dir.glob("*.json")) == []


def test_failed_start_rolls_back_and_names_the_task(tmp_path):
    """Workers on a 'host' whose TensorFlow is broken: preflight passes (the package metadata
    is fine), the servers die on import; ``up`` must name them with their log and stop the ps."""
    broken = tmp_path / "broken"
    (broken / "tensorflow").mkdir(parents=True)
    (broken / "tensorflow" / "__init__.py").write_text("raise ImportError('libtensorflow_framework.so.2: "
                                                      "cannot open shared object file')\n")
    inventory = tmp_path / "split.yaml"
    inventory.write_text(f"""
all:
  vars:
    ansible_connection: local
    pscluster_port_base: {port_base()}
  children:
    chief: {{hosts: {{good: {{ansible_host: 127.0.0.2}}}}}}
    ps: {{hosts: {{good: {{ansible_host: 127.0.0.2}}}}}}
    worker:
      hosts:
        bad:
          ansible_host: 127.0.0.3
          pscluster_port_base: {port_base()}
          pscluster_env: {{PYTHONPATH: "{broken}"}}
""")
    name = "local-rollback"
    state_dir = tmp_path / "state"
    began = time.monotonic()
    up = run_cli(["up", inventory, "--name", name], state_dir=state_dir)
    assert up.returncode == 1
    assert time.monotonic() - began < 60
    first = next(line for line in up.stderr.splitlines() if line.startswith("error:"))
    assert first.startswith("error: worker:0@bad: exited before it was ready (exited with code 1)"), up.stderr
    assert "cannot open shared object file" in up.stderr                 # the log tail
    state = json.loads((state_dir / f"{name}.json").read_text())
    assert state["phase"] == "failed" and "worker:0@bad" in state["message"]
    assert all(p["stopped"] for p in state["processes"])
    assert {p["task"] for p in state["processes"]} == {"ps:0", "worker:0"}
    assert_no_survivors(name)
    status = run_json(["status", "--name", name], state_dir=state_dir)
    assert status["phase"] == "failed"
    down = run_cli(["down", "--name", name], state_dir=state_dir)
    assert down.returncode == 0
    assert list(state_dir.glob("*.json")) == []
