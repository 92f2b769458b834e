# shellcheck shell=bash
# Sourced by scripts/run-simulated.sh and scripts/run-demo.sh (from the repository root):
# make .venv and install the exporter into it, again only when pyproject.toml or a file of the
# package changed since the last install (a hash of them is kept in .venv/.kube-gpu-exporter.stamp).
ensure_exporter_venv() {
  local py=${PYTHON:-python3} stamp=.venv/.kube-gpu-exporter.stamp hash
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  hash=$(find pyproject.toml exporter -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z \
    | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [ ! -x .venv/bin/kube-gpu-exporter ] || [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ]; then
    .venv/bin/python -m pip install -q .
    echo "$hash" >"$stamp"
  fi
}
