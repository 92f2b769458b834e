#!/usr/bin/env bash
# Build the image from the Dockerfile with buildah, without a Docker daemon or a registry, smoke-test
# it, and print its reference and size.
# Usage: scripts/build-image.sh
#
#   1. installs buildah and mmdebstrap (Debian packages) where missing, as scripts/test.sh does its own;
#   2. the base: the Dockerfile's default (the official python image) when it is in local storage or
#      can be pulled within PULL_TIMEOUT seconds; otherwise a Debian bookworm base with Debian's
#      Python 3.11, made by mmdebstrap once and cached in .cache/image-base/ (and in buildah's storage);
#      BASE_IMAGE=<reference> picks one that is already in local storage; REFRESH_BASE=1 makes the
#      Debian base anew (Debian's updates since the cached one);
#   3. builds offline: pip reads the locked wheels from .wheelhouse/ (the files scripts/test.sh
#      downloads, checked against requirements.lock and requirements-build.lock here), mounted for
#      the build; the Dockerfile still installs with --require-hashes --no-deps, so nothing resolves;
#   4. tags localhost/kube-gpu-exporter:<version> (IMAGE_NAME changes the name);
#   5. smoke test: --version, then the simulated node (examples/seed-cgpu-t4.yaml) served from
#      inside the image as uid 9400 and scraped from this machine.
# The release workflow builds the same Dockerfile from the default base (docs/deploy.md); the only
# build argument that changes what the image holds is PYTHON_IMAGE. Storage: buildah's default
# (/var/lib/containers/storage), vfs driver; `buildah --storage-driver vfs images` lists the result.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PULL_TIMEOUT=${PULL_TIMEOUT:-20}
IMAGE_NAME=${IMAGE_NAME:-localhost/kube-gpu-exporter}
BUILDAH=(buildah --storage-driver vfs)
started=$SECONDS

say() { printf 'build-image: %s\n' "$*" >&2; }

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "installing apt packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' exporter/_version.py)
[ -n "$version" ] || { say "no __version__ in exporter/_version.py"; exit 1; }
ref="$IMAGE_NAME:$version"

# --- the locked wheels, hash-checked: offline when .wheelhouse/ has them, else from the index
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  say "$PY has no pip to check and fetch the locked wheels: set PYTHON, or run scripts/test.sh once (it makes .venv)"
  exit 1
fi
download=("$PY" -m pip download -q --require-hashes --no-deps --only-binary=:all: -d .wheelhouse
          -r requirements.lock -r requirements-build.lock)
if ! "${download[@]}" --no-index --find-links .wheelhouse 2>/dev/null; then
  say "downloading the locked wheels into .wheelhouse/"
  "${download[@]}"
fi

# --- the base image
image_exists() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }
official="docker.io/library/$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)"
# The Debian base's recipe; its hash names the cached tarball and the tag, so a change rebuilds it.
# essential + passwd (groupadd/useradd), Python 3.11 with venv (ensurepip for the build stage's
# venv), python-is-python3 (`python`), CA certificates; no apt, no perl beyond perl-base, no docs.
MM_ARGS=(--variant=essential --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
         --include=passwd --include=python3 --include=python3-venv --include=python-is-python3
         --include=ca-certificates --include=usr-is-merged
         --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
         --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
         --dpkgopt='path-exclude=/usr/share/info/*' bookworm)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
recipe=$(printf '%s\n' "${MM_ARGS[@]}" | sha256sum | cut -c1-12)
debian="localhost/kube-gpu-exporter-base:bookworm-$recipe"
cache="$ROOT/.cache/image-base/bookworm-$recipe.tar"

if [ -n "${BASE_IMAGE:-}" ]; then
  base=$BASE_IMAGE
  image_exists "$base" || { say "BASE_IMAGE $base is not in local storage"; exit 1; }
elif image_exists "$official"; then
  base=$official
elif timeout "$PULL_TIMEOUT" "${BUILDAH[@]}" pull -q "$official" >/dev/null 2>&1; then
  base=$official
elif [ -z "${REFRESH_BASE:-}" ] && image_exists "$debian"; then
  say "no $official (no registry within ${PULL_TIMEOUT}s): the Debian base made before"
  base=$debian
else
  say "no $official (no registry within ${PULL_TIMEOUT}s): a Debian bookworm base with Debian's Python 3.11"
  [ -z "${REFRESH_BASE:-}" ] || rm -f "$cache"
  old_base=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$debian" 2>/dev/null || true)
  if [ ! -s "$cache" ]; then
    mkdir -p "$(dirname "$cache")"
    if ! mmdebstrap --format=tar "${MM_ARGS[@]}" "$cache.part" "$MIRROR" >"$cache.log" 2>&1; then
      tail -n 30 "$cache.log" >&2
      exit 1
    fi
    mv "$cache.part" "$cache"
  fi
  ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" add "$ctr" "$cache" / >/dev/null
  "${BUILDAH[@]}" config --env LANG=C.UTF-8 --cmd '["python3"]' \
    --label org.opencontainers.image.description="Debian bookworm with Debian's Python 3.11 (scripts/build-image.sh)" \
    "$ctr"
  "${BUILDAH[@]}" commit -q "$ctr" "$debian" >/dev/null
  "${BUILDAH[@]}" rm "$ctr" >/dev/null
  base=$debian
fi
say "base: $base"

# --- the build: pip reads the wheelhouse, mounted read-only at /mnt (which every Debian base has,
# so no mount point is left in a layer)
build_started=$SECONDS
mkdir -p .cache
previous=$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$ref" 2>/dev/null || true)
if ! "${BUILDAH[@]}" bud --isolation chroot --pull=never \
    --build-arg "PYTHON_IMAGE=$base" \
    --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/mnt \
    --volume "$ROOT/.wheelhouse:/mnt:ro" \
    --label "org.opencontainers.image.version=$version" \
    --tag "$ref" . >.cache/build-image.log 2>&1; then
  tail -n 40 .cache/build-image.log >&2
  exit 1
fi
say "built $ref in $((SECONDS - build_started)) s"
# the image this tag named before is left untagged: remove it, so reruns do not fill the storage
if [ -n "$previous" ] && [ "$previous" != "$("${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$ref")" ]; then
  "${BUILDAH[@]}" rmi "$previous" >/dev/null 2>&1 || true
fi
# and the Debian base REFRESH_BASE replaced, now that no image of this tag is built on it
[ -z "${old_base:-}" ] || "${BUILDAH[@]}" rmi "$old_base" >/dev/null 2>&1 || true

# --- smoke test
ctr=$("${BUILDAH[@]}" from --pull=never "$ref")
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  "${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
got=$("${BUILDAH[@]}" run --isolation chroot "$ctr" -- kube-gpu-exporter --version)
[ "$got" = "kube-gpu-exporter $version" ] || { say "--version says '$got', not $version"; exit 1; }
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
# buildah run runs as the image's USER; the check below reads the listening socket's owner
"${BUILDAH[@]}" run --isolation chroot --volume "$ROOT/examples:/examples:ro" "$ctr" -- \
  kube-gpu-exporter --simulate /examples/seed-cgpu-t4.yaml --listen "127.0.0.1:$port" >"$log" 2>&1 &
server=$!
if ! "$PY" - "$port" "$server" <<'EOF'; then
"""Poll until the exporter in the image answers, then scrape it and check who owns its socket."""
import os
import sys
import time
import urllib.request

port, pid = int(sys.argv[1]), int(sys.argv[2])
deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
            break
    except OSError:
        if not os.path.exists(f"/proc/{pid}") or time.monotonic() > deadline:
            sys.exit("the exporter in the image did not become ready")
        time.sleep(0.1)
with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
    body = r.read().decode()
want = ('nvidia_gpu_duty_cycle{allocate_mode="share"', 'pod_name="app-3g-v1-0"')
missing = [w for w in want if w not in body]
if missing:
    sys.exit(f"/metrics lacks {missing}")
owners = {line.split()[7] for line in open("/proc/net/tcp").read().splitlines()[1:]
          if line.split()[1] == f"0100007F:{port:04X}" and line.split()[3] == "0A"}
if owners != {"9400"}:
    sys.exit(f"the listening socket belongs to uid {owners or 'nobody'}, not 9400")
print(f"build-image: scraped {len(body.splitlines())} lines from the image as uid 9400", file=sys.stderr)
EOF
  cat "$log" >&2
  exit 1
fi
rm -f "$log"

bytes=$("${BUILDAH[@]}" inspect --type image --format '{{.Manifest}}' "$ref" |
  "$PY" -c 'import json, sys; print(sum(layer["size"] for layer in json.load(sys.stdin)["layers"]))')
say "done in $((SECONDS - started)) s"
echo "image: $ref"
echo "size: $(((bytes + 500000) / 1000000)) MB (uncompressed layers, base $base)"
