"""A standing server's start with Keras left out of its TensorFlow import (roles/server.py) vs
with it (what every server paid before), alternated: CPU seconds and wall seconds from the
process's start until its gRPC server serves, medians of N.

    python -m benchmarks.server_start --runs 5

Each run is a fresh ``python`` that imports TensorFlow through roles.tfruntime exactly as
roles.server does (``keras=False``) or as a trainer does (``keras=True``) and starts a
one-task ``tf.distribute.Server`` on a free 127.0.0.1 port; its own getrusage gives the CPU.
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
import json, resource, sys, time
from roles.tfconfig import ThreadConfig
from roles.tfruntime import import_tensorflow
tf = import_tensorflow(ThreadConfig(), keras=sys.argv[1] == "1")
spec = tf.train.ClusterSpec({"worker": ["127.0.0.1:" + sys.argv[2]]})
tf.distribute.Server(spec, job_name="worker", task_index=0, protocol="grpc", start=True)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "keras": "keras" in sys.modules}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(keras: bool) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if keras else "0", str(_free_port())], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.splitlines()[-1])
    result["wall"] = time.perf_counter() - began
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.server_start", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="alternated runs per setting (default 5)")
    args = p.parse_args(argv)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(args.runs):
        for keras in ((False, True) if i % 2 else (True, False)):
            runs[keras].append(one(keras))
    assert not any(r["keras"] for r in runs[False]) and all(r["keras"] for r in runs[True])
    median = {keras: {key: statistics.median(r[key] for r in runs[keras]) for key in ("cpu", "wall")}
              for keras in (True, False)}
    print_columns(["server import", "CPU s (median)", "wall s (median)"],
                  [["with Keras (before)" if keras else "without Keras (roles.server)",
                    f"{median[keras]['cpu']:.2f}", f"{median[keras]['wall']:.2f}"] for keras in (True, False)])
    print(f"without / with Keras: CPU {median[False]['cpu'] / median[True]['cpu']:.2f}, "
          f"wall {median[False]['wall'] / median[True]['wall']:.2f} ({args.runs} alternated runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
