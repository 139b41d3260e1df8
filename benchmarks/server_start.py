"""A standing server's start three ways, alternated: the whole API with Keras (what every server
paid two rounds ago), the whole API without Keras (the last round), and TensorFlow's server modules
alone (``roles.tfruntime.import_server_runtime``, what roles.server does now). CPU seconds and
wall seconds from the process's start until its gRPC server serves, medians of N.

    python -m benchmarks.server_start --runs 5

Each run is a fresh ``python`` that loads TensorFlow through roles.tfruntime as the setting says
and starts a one-task gRPC server on a free 127.0.0.1 port; its own getrusage gives the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from benchmarks.common import REPO, print_columns

PROBE = """
import json, resource, sys
from roles.tfconfig import ThreadConfig
from roles.tfruntime import import_server_runtime, import_tensorflow
if sys.argv[1] == "light":
    rt = import_server_runtime(ThreadConfig())
    assert rt.light
    Server, ClusterSpec = rt.Server, rt.ClusterSpec
else:
    tf = import_tensorflow(ThreadConfig(), keras=sys.argv[1] == "keras")
    Server, ClusterSpec = tf.distribute.Server, tf.train.ClusterSpec
Server(ClusterSpec({"worker": ["127.0.0.1:" + sys.argv[2]]}), job_name="worker", task_index=0, protocol="grpc",
       start=True)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "modules": len(sys.modules)}))
"""

SETTINGS = {"keras": "whole API with Keras (two rounds ago)", "api": "whole API without Keras (last round)",
            "light": "server modules only (roles.server now)"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(setting: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    env.pop("PSCLUSTER_TF_FULL_IMPORT", None)
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROBE, setting, str(_free_port())], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.splitlines()[-1])
    result["wall"] = time.perf_counter() - began
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.server_start", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="alternated runs per setting (default 5)")
    args = p.parse_args(argv)
    order = list(SETTINGS)
    runs: dict[str, list[dict]] = {s: [] for s in order}
    for i in range(args.runs):
        for setting in order[i % 3:] + order[:i % 3]:       # rotate, so no setting always goes first
            runs[setting].append(one(setting))
    median = {s: {key: statistics.median(r[key] for r in runs[s]) for key in ("cpu", "wall", "modules")}
              for s in order}
    print_columns(["server start", "CPU s (median)", "wall s (median)", "modules"],
                  [[SETTINGS[s], f"{median[s]['cpu']:.2f}", f"{median[s]['wall']:.2f}", f"{median[s]['modules']:.0f}"]
                   for s in order])
    for base in ("keras", "api"):
        print(f"server modules only / {SETTINGS[base]}: CPU {median['light']['cpu'] / median[base]['cpu']:.2f}, "
              f"wall {median['light']['wall'] / median[base]['wall']:.2f} ({args.runs} rotated runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
