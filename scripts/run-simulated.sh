#!/usr/bin/env bash
# Install the exporter in .venv and serve the embedded simulated node (no GPU, no cluster).
# Usage: scripts/run-simulated.sh [SCENARIO.yaml] [extra exporter flags]
# Reinstalls only when pyproject.toml or a file of the package changed since the last install
# (a hash of them is kept in .venv/.kube-gpu-exporter.stamp).
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-examples/seed-cgpu-t4.yaml}
shift || true
# shellcheck source=scripts/lib/ensure-venv.sh
. scripts/lib/ensure-venv.sh
ensure_exporter_venv
exec .venv/bin/kube-gpu-exporter --simulate "$scenario" --listen "${LISTEN:-127.0.0.1:9400}" "$@"
