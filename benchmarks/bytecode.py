"""A `pscluster` command's start with and without cached bytecode, alternated: this machine's
environment sets ``PYTHONDONTWRITEBYTECODE=1`` (and scripts/test.sh exported it until the
twenty-first session), so every ``pscluster`` process compiled the modules of ``cluster/`` it
imports from source. CPU seconds (the child's own getrusage) and wall seconds of
``python -m cluster status --help``, medians of N.

    python -m benchmarks.bytecode --runs 10

Each run is a fresh interpreter in a copy of ``cluster/`` (this checkout is left as it is): one
copy never has a ``__pycache__`` (``PYTHONDONTWRITEBYTECODE=1``), the other keeps the one its
first, untimed run wrote.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import REPO, print_columns

COMMAND = ["-m", "cluster", "status", "--help"]
SETTINGS = {"source": "compiled from source (PYTHONDONTWRITEBYTECODE=1)", "cached": "bytecode cached (__pycache__)"}


def _copy(root: str) -> str:
    shutil.copytree(REPO / "cluster", os.path.join(root, "cluster"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def one(folder: str, setting: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    if setting == "source":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([sys.executable, *COMMAND], cwd=folder, env=env, stdout=subprocess.DEVNULL, check=True,
                   timeout=120)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, "wall": wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bytecode", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="alternated runs per setting (default 10)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pscluster-bytecode-") as root:
        folders = {setting: _copy(os.path.join(root, setting)) for setting in SETTINGS}
        one(folders["cached"], "cached")            # writes its __pycache__, untimed
        runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
        for i in range(args.runs):
            for setting in (list(SETTINGS) if i % 2 == 0 else list(SETTINGS)[::-1]):
                runs[setting].append(one(folders[setting], setting))
        assert not os.path.exists(os.path.join(folders["source"], "cluster", "__pycache__"))    # never cached
    median = {s: {key: statistics.median(r[key] for r in runs[s]) for key in ("cpu", "wall")} for s in SETTINGS}
    print_columns(["`pscluster status --help`", "CPU s (median)", "wall s (median)"],
                  [[SETTINGS[s], f"{median[s]['cpu']:.3f}", f"{median[s]['wall']:.3f}"] for s in SETTINGS])
    print(f"cached / from source: CPU {median['cached']['cpu'] / median['source']['cpu']:.2f}, "
          f"wall {median['cached']['wall'] / median['source']['wall']:.2f} ({args.runs} alternated runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
