#!/usr/bin/env bash
# Set up (idempotent) and run the test suite.
#
#   bash scripts/test.sh            the whole suite: unit, local (real TensorFlow processes), the SSH
#                                   lab, faults, Slurm and Docker (the last four need root, else skip)
#   bash scripts/test.sh --quick    ruff, mypy and the unit tests only (a few minutes): for development
#   bash scripts/test.sh tests/unit -x    extra arguments go to pytest
#
# The suite runs on two pytest-xdist workers (PSCLUSTER_TEST_WORKERS, 0 for one process): the
# local-cluster tests on one, the tests that build hosts (lab, faults, Slurm, Docker) on the other,
# unit tests on whichever is free, so that at most two TensorFlow jobs share the machine's cores
# (tests/conftest.py, docs/testing.md). Each full run writes runs/suite.xml and ends with the time
# per area against its budget (scripts/suite_times.py).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bash scripts/bootstrap.sh test
export PYTHONDONTWRITEBYTECODE=1
# Lint and type-check first: seconds, not a run of the suite (configuration in pyproject.toml).
.venv/bin/ruff check cluster roles tests testbed benchmarks examples scripts
.venv/bin/mypy
workers=${PSCLUSTER_TEST_WORKERS:-2}
parallel=()
[ "$workers" = 0 ] || parallel=(-n "$workers" --dist loadgroup)
if [ "$quick" = 1 ]; then
  exec .venv/bin/python -m pytest -q "${parallel[@]}" --durations=10 "${@:-tests/unit}"
fi
mkdir -p runs
status=0
.venv/bin/python -m pytest -q -rs "${parallel[@]}" --durations=40 --junitxml=runs/suite.xml "${@:-tests}" || status=$?
.venv/bin/python scripts/suite_times.py runs/suite.xml || true
exit "$status"
