#!/usr/bin/env bash
# The newcomer's first run: set up, bring up a local cluster (1 chief, 2 ps, 2 workers on this
# machine, inventories/local.yaml), train distributed_mnist on it, and take it down again.
# MODE=sync or MODE=sync-ps picks another training mode; extra arguments go to `pscluster train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh demo
mode=${MODE:-async}
name=demo-$mode
pscluster=.venv/bin/pscluster
trap '$pscluster down --name "$name" >/dev/null 2>&1 || true' EXIT
$pscluster up inventories/local.yaml --name "$name" --mode "$mode"
$pscluster train distributed_mnist --name "$name" "$@"
$pscluster down --name "$name"
trap - EXIT
