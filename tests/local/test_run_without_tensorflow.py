"""A one-shot ``run`` where the tasks' interpreter has no TensorFlow (a GPU box with only PyTorch
or JAX): preflight warns and the program runs; ``check`` (and so ``up``) still refuses. The
interpreter is a fresh virtual environment without TensorFlow."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import assert_no_survivors, port_base, run_cli

INVENTORY = textwrap.dedent('''\
    all:
      vars:
        ansible_connection: local
        pscluster_mode: sync
        pscluster_python: PYTHON
      children:
        worker:
          hosts:
            localhost: {worker_tasks: 2}
''')


def test_run_warns_and_goes_on_where_check_refuses(tmp_path):
    venv = tmp_path / "no-tf"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    inventory = tmp_path / "no-tf.yaml"
    inventory.write_text(INVENTORY.replace("PYTHON", str(venv / "bin" / "python")))
    state_dir = tmp_path / "state"
    checked = run_cli(["check", str(inventory), "--json"], state_dir=state_dir)
    assert checked.returncode == 1
    failed = [(c["check"], c["detail"]) for c in json.loads(checked.stdout)["checks"] if not c["ok"]]
    assert failed == [("tensorflow", f"TensorFlow is not installed for {venv / 'bin' / 'python'}")]
    ran = run_cli(["run", str(inventory), "--name", "no-tf", "--port-base", port_base(), "--json", "--",
                   "python", "-c", "import os, sys; print('index', os.environ['PSCLUSTER_TASK_INDEX'], sys.prefix)"],
                  state_dir=state_dir, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "tensorflow: TensorFlow is not installed" in ran.stderr and "run goes on" in ran.stderr
    assert sorted(line.split("] ", 1)[1] for line in ran.stderr.splitlines() if "] index " in line) == [
        f"index 0 {venv}", f"index 1 {venv}"]
    assert [task["exit_code"] for task in json.loads(ran.stdout)["tasks"]] == [0, 0]
    assert_no_survivors("no-tf")
