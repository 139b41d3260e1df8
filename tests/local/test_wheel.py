"""A wheel that works: ``pip install`` of pscluster's wheel (not editable) into a fresh venv, run
from another directory with no checkout on any path: plan, up, train distributed_mnist, down.

The fresh venv gets the heavy dependencies (TensorFlow, Fabric, ...) by a .pth line pointing at
this checkout's venv, so the test needs no network for them; pscluster itself comes only from
the wheel (checked: ``cluster.__file__`` is inside the fresh venv)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.helpers import REPO, assert_no_survivors, port_base

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_the_installed_wheel_trains_from_another_directory(tmp_path):
    dist, venv, home, elsewhere = (tmp_path / d for d in ("dist", "venv", "home", "elsewhere"))
    for folder in (home, elsewhere):
        folder.mkdir()
    # Built as a user's `pip wheel .` builds it (an isolated build env: pyproject.toml's setuptools);
    # this venv's pip installs it into a venv made without one (0.2 s against 6.5 with ensurepip).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
                   check=True, timeout=600, cwd=tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # Dependencies from this venv; the editable pscluster of this venv is not visible from there
    # (.pth files of a folder added by a .pth line are not read).
    (tmp_path / site).mkdir(parents=True, exist_ok=True)
    with open(os.path.join(site, "zz_deps.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(dist.glob("pscluster-*.whl"))
    # only the two packages: the test beds (testbed/), tests and benchmarks stay in the checkout
    with zipfile.ZipFile(wheel) as archive:
        packages = {name.split("/")[0] for name in archive.namelist() if not name.startswith("pscluster-")}
    assert packages == {"cluster", "roles"}, packages
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300)

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PSCLUSTER_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1", COLUMNS="200")

    def pscluster(*args, timeout=600):
        return subprocess.run([str(venv / "bin" / "pscluster"), *map(str, args)], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([str(python), "-c", "import cluster, roles; print(cluster.__file__, roles.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(venv)) for path in where), where
    inventory = tmp_path / "local.yaml"
    inventory.write_text((REPO / "inventories" / "local.yaml").read_text())
    name = "wheel-check"
    planned = pscluster("plan", inventory, "--name", name, "--port-base", port_base())
    assert planned.returncode == 0, planned.stderr
    try:
        up = pscluster("up", inventory, "--name", name, "--port-base", port_base())
        assert up.returncode == 0, up.stderr
        train = pscluster("train", "distributed_mnist", "--name", name, "--steps", 60, "--json")
        assert train.returncode == 0, train.stderr[-3000:]
        report = json.loads(train.stdout)
        assert report["global_step"] == 60 and report["val_accuracy"] > 0.5
        # Local tasks ran in ~/pscluster with the shipped roles/ and examples/ synced there.
        assert (home / "pscluster" / "roles" / "train.py").is_file()
        assert (home / "pscluster" / "examples" / "distributed_mnist" / "data" / "mnist.npz").is_file()
        assert report["checkpoint"].startswith(str(home / "pscluster"))
    finally:
        down = pscluster("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert_no_survivors(name)
