#!/usr/bin/env bash
# Install the exporter in .venv and serve the embedded simulated node (no GPU, no cluster).
# Usage: scripts/run-simulated.sh [SCENARIO.yaml] [extra exporter flags]
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-examples/seed-cgpu-t4.yaml}
shift || true
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q .
exec .venv/bin/kube-gpu-exporter --simulate "$scenario" --listen "${LISTEN:-127.0.0.1:9400}" "$@"
