"""Containers, measured (issue 27): image sizes and build times, cold and cached, and the time from
``docker-compose up`` to the first training step, against the same cluster on the SSH lab.

Usage (root; nothing else heavy on the machine)::

    python -m benchmarks.containers            # cached builds + start-up comparison
    python -m benchmarks.containers --cold     # also a cold build in a fresh data root (~1.5 min)

Builds: ``cold`` is debootstrap of the base plus every layer of docker/Dockerfile (TensorFlow's pip
install included) into an empty data root; ``cached`` is the same build again; ``code change`` is
a build from a copy of the checkout with one file of cluster/ changed (only the code layers run).

Start-up, one cluster as in inventories/docker.yaml (chief and a ps on node-1, a ps on node-2, a
worker on each of three nodes), measured from nothing running to the job's first step:

* compose: ``docker-compose up -d`` of the three nodes, their sshd healthy, the control container,
  ``pscluster up inventories/docker.yaml``, ``pscluster train`` until the job records step 1;
* SSH lab: three network-namespace hosts with their own sshd (testbed/netlab.py), then the same
  ``up`` and ``train``.

Both use the same machine's CPUs and the same job (distributed_mnist, async).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed import dockerlab  # noqa: E402
from testbed.netlab import Lab, write_inventory  # noqa: E402

PROJECT = "pscbench"
NODES = [f"{PROJECT}_node-{i}_1" for i in (1, 2, 3)]
CONTROL = f"{PROJECT}-control"
GROUPS = {"chief": ["node-1"], "ps": ["node-1", "node-2"], "worker": ["node-1", "node-2", "node-3"]}
STEPS = "400"



def builds(engine: dockerlab.Engine, cold: bool) -> dict:
    found: dict = {}
    if cold:
        with tempfile.TemporaryDirectory(prefix="pscluster-cold-", dir="/var/tmp") as tmp:
            fresh = dockerlab.Engine(Path(tmp) / "state", data_root=Path(tmp) / "data")
            engine.stop()                    # one dockerd per machine
            try:
                fresh.start()
                base = dockerlab.ensure_base_image(fresh)
                node = dockerlab.build_node_image(fresh)
                found["cold"] = {"base_seconds": base, "node_seconds": node["seconds"],
                                 "base_mb": fresh.image_size(dockerlab.BASE_IMAGE) / 1e6,
                                 "node_mb": node["size_bytes"] / 1e6}
            finally:
                fresh.stop()
                engine.start()
    dockerlab.ensure_base_image(engine)
    dockerlab.build_node_image(engine)       # whatever this checkout needs first
    again = dockerlab.build_node_image(engine)
    found["cached"] = {"node_seconds": again["seconds"], "node_mb": again["size_bytes"] / 1e6,
                       "base_mb": engine.image_size(dockerlab.BASE_IMAGE) / 1e6}
    with tempfile.TemporaryDirectory(prefix="pscluster-ctx-") as tmp:
        context = Path(tmp) / "repo"
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        for name in filter(None, files.decode().split("\0")):
            target = context / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if (REPO / name).is_file():
                shutil.copy2(REPO / name, target)
        with open(context / "cluster" / "__init__.py", "a") as handle:
            handle.write(f"\n# benchmark code change {time.time()}\n")
        start = time.monotonic()
        dockerlab.build_node_image(engine, tag="pscluster-node:bench-change", context=context)
        found["code_change"] = {"node_seconds": time.monotonic() - start}
        engine.docker("image", "rm", "pscluster-node:bench-change", check=False)
    return found


def compose_startup(engine: dockerlab.Engine, work: Path) -> dict:
    keys = work / "keys"
    keys.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519")], check=True)
    for name in ("id_ed25519", "id_ed25519.pub"):
        os.chown(keys / name, 1000, 1000)
    env = engine.env() | {"PSCLUSTER_LAB_DIR": str(keys)}
    compose = [dockerlab.COMPOSE, "-p", PROJECT, "-f", str(REPO / "docker" / "compose.yaml")]
    marks: dict = {}
    began = time.monotonic()
    try:
        subprocess.run([*compose, "up", "-d", "--no-build", "node-1", "node-2", "node-3"], env=env, check=True,
                       capture_output=True)
        marks["containers started"] = time.monotonic() - began
        dockerlab.wait_for("healthy nodes", lambda: engine.docker("inspect", "--format", "{{.State.Health.Status}}", *NODES,
                                                     check=False).stdout.decode().split() == ["healthy"] * 3)
        marks["sshd healthy"] = time.monotonic() - began
        subprocess.run([*compose, "run", "-d", "--name", CONTROL, "control", "sleep", "infinity"], env=env,
                       check=True, capture_output=True)
        up = subprocess.run([dockerlab.DOCKER, "exec", CONTROL, "pscluster", "up", "inventories/docker.yaml"], env=env,
                            capture_output=True, text=True)
        if up.returncode != 0:
            raise RuntimeError(up.stderr[-2000:])
        marks["pscluster up"] = time.monotonic() - began
        train = subprocess.Popen([dockerlab.DOCKER, "exec", CONTROL, "pscluster", "train", "distributed_mnist", "--steps",
                                  STEPS, "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def stepped():
            out = engine.docker("exec", CONTROL, "cat", "/home/pscluster/.local/state/pscluster/docker.json",
                                check=False).stdout
            try:
                return ((json.loads(out).get("job") or {}).get("step") or 0) >= 1
            except ValueError:
                return False
        dockerlab.wait_for("the first step", stepped)
        marks["first step"] = time.monotonic() - began
        train.communicate(timeout=600)
        subprocess.run([dockerlab.DOCKER, "exec", CONTROL, "pscluster", "down"], env=env, capture_output=True)
    finally:
        engine.docker("rm", "-f", CONTROL, check=False)
        subprocess.run([*compose, "down", "-v"], env=env, capture_output=True)
    return marks


def lab_startup(work: Path) -> dict:
    marks: dict = {}
    began = time.monotonic()
    with Lab(3, work / "lab", subnet="auto") as lab:
        marks["hosts and sshd"] = time.monotonic() - began
        inventory = write_inventory(lab, work / "lab.yaml", GROUPS, {
            "pscluster_workdir": str(REPO), "pscluster_port_base": 2222, "pscluster_env": {"OMP_NUM_THREADS": 1}})
        env = dict(os.environ, PSCLUSTER_STATE_DIR=str(work / "state"))
        cli = [sys.executable, "-m", "cluster"]
        subprocess.run([*cli, "up", str(inventory), "--name", "docker"], cwd=REPO, env=env, check=True,
                       capture_output=True)
        marks["pscluster up"] = time.monotonic() - began
        train = subprocess.Popen([*cli, "train", "distributed_mnist", "--name", "docker", "--steps", STEPS, "--json"],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def stepped():
            try:
                state = json.loads((work / "state" / "docker.json").read_text())
            except (OSError, ValueError):
                return False
            return ((state.get("job") or {}).get("step") or 0) >= 1
        dockerlab.wait_for("the first step", stepped)
        marks["first step"] = time.monotonic() - began
        train.communicate(timeout=600)
        subprocess.run([*cli, "down", "--name", "docker"], cwd=REPO, env=env, capture_output=True)
    return marks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.containers", description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also build into a fresh, empty data root")
    parser.add_argument("--out", help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="pscluster-bench-dock-") as tmp:
        work = Path(tmp)
        engine = dockerlab.Engine(work / "engine").start()
        try:
            result["builds"] = builds(engine, args.cold)
            result["compose"] = compose_startup(engine, work / "compose")
        finally:
            engine.stop()
        result["ssh_lab"] = lab_startup(work / "lab-run")
    print(json.dumps(result, indent=2))
    b = result["builds"]
    if "cold" in b:
        print(f"cold build: base {b['cold']['base_seconds']:.0f} s ({b['cold']['base_mb']:.0f} MB) + node image "
              f"{b['cold']['node_seconds']:.0f} s ({b['cold']['node_mb']:.0f} MB)")
    print(f"cached build: {b['cached']['node_seconds']:.1f} s; after a code change: {b['code_change']['node_seconds']:.1f} s")
    compose_first, lab_first = result["compose"]["first step"], result["ssh_lab"]["first step"]
    print(f"from nothing to the first training step: compose {compose_first:.1f} s "
          f"(nodes healthy at {result['compose']['sshd healthy']:.1f} s, up at {result['compose']['pscluster up']:.1f} s), "
          f"SSH lab {lab_first:.1f} s (up at {result['ssh_lab']['pscluster up']:.1f} s); "
          f"compose / SSH lab = {compose_first / lab_first:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
