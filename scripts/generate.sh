#!/usr/bin/env bash
# Regenerate every committed generated file, byte for byte: the recording rules, alerts and
# dashboards (rules/, alerts/, dashboards/), the chart's copies (helm/kube-gpu-exporter/files/),
# the table of docs/configuration.md, the option rows of docs/rules.md, alerts.md and dashboards.md
# and the generated tables of docs/metrics.md.
# The list and the arguments of each file are exporter/shell/generate.py's; the freshness tests fail
# until this ran.
# Usage: scripts/generate.sh [INTO]   (default: this checkout; INTO gets the same tree, e.g. to compare)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
exec "$py" -m exporter.shell.generate . "${1:-.}"
