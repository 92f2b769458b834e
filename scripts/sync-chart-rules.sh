#!/usr/bin/env bash
# Copy the generated recording-rule bundle (the same text as rules/kube-gpu-exporter.rules.yaml)
# into the Helm chart, whose PrometheusRule template reads it with .Files.Get.
# Run after changing the rule templates; tests/test_helm.py fails while the chart's copy is stale.
# Usage: scripts/sync-chart-rules.sh [OUTPUT]   (default helm/kube-gpu-exporter/files/recording-rules.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-helm/kube-gpu-exporter/files/recording-rules.yaml}
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
"$py" -m exporter rules --format plain -o "$out"
echo "wrote $out"
