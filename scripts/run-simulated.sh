#!/usr/bin/env bash
# Install the exporter in .venv and serve the embedded simulated node (no GPU, no cluster).
# Usage: scripts/run-simulated.sh [SCENARIO.yaml] [extra exporter flags]
# Reinstalls only when pyproject.toml or a file of the package changed since the last install
# (a hash of them is kept in .venv/.kube-gpu-exporter.stamp).
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-examples/seed-cgpu-t4.yaml}
shift || true
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.kube-gpu-exporter.stamp
hash=$(find pyproject.toml exporter -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z \
  | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/kube-gpu-exporter ] || [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ]; then
  .venv/bin/python -m pip install -q .
  echo "$hash" > "$stamp"
fi
exec .venv/bin/kube-gpu-exporter --simulate "$scenario" --listen "${LISTEN:-127.0.0.1:9400}" "$@"
