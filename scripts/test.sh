#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit, local (real TensorFlow processes)
# and the SSH lab (network-namespace hosts with real sshd; needs root, else those tests skip).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
export PYTHONDONTWRITEBYTECODE=1
# Lint and type-check first: seconds, not a run of the suite (configuration in pyproject.toml).
.venv/bin/ruff check cluster roles tests testbed benchmarks examples
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -rs --durations=40 "${@:-tests}"
