"""What the benchmark scripts share: running the real ``pscluster`` CLI and timing it, and
printing a plain text table."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent


def cli(args, state_dir: Path, *, timeout: float = 1200, check: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``pscluster ARGS`` as a user would; returns (wall seconds, completed process)."""
    env = dict(os.environ, PSCLUSTER_STATE_DIR=str(state_dir), NO_COLOR="1")
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cluster", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - began
    if check and proc.returncode != 0:
        raise RuntimeError(f"pscluster {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return elapsed, proc


def print_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` under ``header`` in left-aligned columns, with a dashed rule under the header."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def env_pair(text: str) -> tuple[str, str]:
    """argparse type for ``--env KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value
