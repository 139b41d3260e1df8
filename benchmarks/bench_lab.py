"""``pscluster bench`` on the multi-host SSH lab (issue 5): builds three fake hosts (network
namespaces with their own sshd, see testbed/netlab.py), writes an inventory for them (chief
and ps on node-1; two worker slots on node-2 and node-3 each) and runs the study against it,
then removes the lab. Every argument after the script's own is passed to ``pscluster bench``.

Usage: ``python -m benchmarks.bench_lab [--keep-inventory FILE] -- --workers 1,2 --mode async,sync
--placement spread,pack --steps 400 --repeat 2 --out lab.json --plot lab.png`` (root).

The fake hosts share this machine's CPUs, so scaling out here measures the protocol and
orchestration cost, not extra compute: efficiency well below 1 is expected.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.netlab import Lab, write_inventory  # noqa: E402

GROUPS = {"chief": ["node-1"], "ps": ["node-1"],
          "worker": {"node-2": {"worker_tasks": 2}, "node-3": {"worker_tasks": 2}}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, bench_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lab", description=__doc__.splitlines()[0])
    parser.add_argument("--keep-inventory", help="copy the generated inventory here (it names the lab's "
                        "addresses, so it is only good while a lab with them runs)")
    args = parser.parse_args(own)
    with tempfile.TemporaryDirectory(prefix="pscluster-bench-lab-") as tmp:
        work = Path(tmp)
        with Lab(3, work / "lab", subnet="auto") as lab:
            inventory = write_inventory(lab, work / "lab.yaml", GROUPS, {
                "pscluster_workdir": str(REPO), "pscluster_port_base": 38000,
                "pscluster_env": {"OMP_NUM_THREADS": 1}})
            if args.keep_inventory:
                shutil.copy(inventory, args.keep_inventory)
            env = dict(os.environ, PSCLUSTER_STATE_DIR=str(work / "state"))
            return subprocess.run([sys.executable, "-m", "cluster", "bench", "distributed_mnist", str(inventory),
                                   *bench_args], cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
