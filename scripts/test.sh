#!/usr/bin/env bash
# Install everything the test suite needs (apt packages included) and run the whole suite.
# Usage: scripts/test.sh [--fast] [pytest args]
#   --fast: the same installs and ruff, then only the tests not marked e2e (no server, process or
#           Prometheus; tests/e2e_guard.py fails a test that starts one unmarked). docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=()
if [ "${1:-}" = "--fast" ]; then
  shift
  lane=(-m "not e2e")
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v vmalert >/dev/null 2>&1 || need+=(victoria-metrics)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)  # actionlint checks the workflows' run: scripts with it
# tests/test_image.py builds the image with scripts/build-image.sh: buildah, and mmdebstrap for its Debian base
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing apt packages: ${need[*]}"
  # Keep Debian's init scripts from starting Prometheus/Alertmanager/VictoriaMetrics on their default ports.
  created_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ -z "$created_policy" ] || $SUDO rm -f /usr/sbin/policy-rc.d
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The image's dependencies exactly (requirements.lock), the kubeconfig extra's (requirements-kubeconfig.lock,
# not in the image: the suite reads kubeconfigs with the real kubernetes client) and the build tools
# (requirements-build.lock), hash-checked, through .wheelhouse/, which the Dockerfile and wheel tests
# install from offline; then the test extra around them, the package built by the locked setuptools.
.venv/bin/python -m pip download -q --require-hashes --no-deps -d .wheelhouse \
  -r requirements.lock -r requirements-kubeconfig.lock -r requirements-build.lock
.venv/bin/python -m pip install -q --require-hashes --no-deps --no-index --find-links .wheelhouse \
  -r requirements.lock -r requirements-kubeconfig.lock -r requirements-build.lock
.venv/bin/python -m pip install -q --no-build-isolation -e '.[test]'
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider ${lane[@]+"${lane[@]}"} "$@"
