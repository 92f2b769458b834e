#!/usr/bin/env bash
# Copy the generated bundles into the Helm chart, whose templates read them with .Files.Get:
#   files/recording-rules.yaml   the recording rules (same text as rules/kube-gpu-exporter.rules.yaml)
#   files/alerts.yaml            the alerts (same text as alerts/kube-gpu-exporter.alerts.yaml)
#   files/dashboards/*.json      the Grafana dashboards (same text as dashboards/*.json)
# Run after changing a generator; tests/test_helm.py and tests/test_helm_monitoring.py fail while
# the chart's copies are stale.
# Usage: scripts/sync-chart-rules.sh [FILES_DIR]   (default helm/kube-gpu-exporter/files)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-helm/kube-gpu-exporter/files}
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
mkdir -p "$out/dashboards"
"$py" -m exporter rules --format plain -o "$out/recording-rules.yaml"
"$py" -m exporter alerts --format plain -o "$out/alerts.yaml"
# replace the whole set, so a dashboard the generator dropped does not linger in the chart
rm -f "$out"/dashboards/*.json
"$py" -m exporter dashboards -o "$out/dashboards"
echo "wrote $out/recording-rules.yaml $out/alerts.yaml $out/dashboards/"
