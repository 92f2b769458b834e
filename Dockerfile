# kube-gpu-exporter image: the wheel built from this source and the locked dependencies installed
# into a virtualenv, copied onto a clean python:3.11-slim runtime stage.
#
#   docker build -t kube-gpu-exporter:dev .
#   docker run --rm -p 9400:9400 -v "$PWD/examples:/examples:ro" kube-gpu-exporter:dev \
#       --simulate /examples/seed-cgpu-t4.yaml
#
# Released images (linux/amd64 and linux/arm64) come from .github/workflows/release.yml;
# scripts/build-image.sh builds this file with buildah, without Docker or a registry (a Debian base
# when the python image cannot be pulled); building your own is docs/deploy.md#build-your-own-image. Reproducible by construction: pip resolves
# nothing. The build tools come from requirements-build.lock and the runtime dependencies from
# requirements.lock (scripts/lock.py writes both), every file checked against its sha256
# (--require-hashes), each installed with --no-deps; the exporter's wheel goes in last, --no-deps.
# tests/test_dockerfile_install.py runs these steps in fresh virtualenvs without a network.
#
# The image runs as an unprivileged user, uid/gid 9400, and so does the Helm chart by default
# (docs/deploy.md#security-context): NVML through the NVIDIA container runtime, the host's /proc
# mounted read-only at /host/proc (NVML reports host PIDs; /proc/<pid>/cgroup and stat are
# world-readable, so no hostPID and no capability), Xids from NVML events. 9400 is not a common
# uid on purpose: a process can read /proc/<pid>/environ of processes of its own uid, so the
# exporter must not share one with workloads (65532 of distroless images, 65534, 1000, ...).
# Only the chart's opt-ins need more: uid 0 for the kubelet's root-owned pod-resources socket
# (podResources.enabled), and a privileged container, uid 0 with CAP_SYSLOG where
# kernel.dmesg_restrict=1, to read the host's /dev/kmsg (xid.kmsg.enabled).
# NVML (libnvidia-ml.so) is not in the image: the NVIDIA container runtime injects the host
# driver's libraries (NVIDIA_DRIVER_CAPABILITIES=utility, set below).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Where pip takes the locked files from: the package index by default (the release workflow);
# scripts/build-image.sh points these at its wheelhouse, mounted for the build, so that a machine
# without network builds the same files (pip checks the same hashes either way).
ARG PIP_NO_INDEX=0
ARG PIP_FIND_LINKS=
WORKDIR /src
COPY requirements-build.lock requirements.lock ./
# The build tools (setuptools, build), hash-checked, in a virtualenv that stays in this stage.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --require-hashes --no-deps -r requirements-build.lock
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
RUN /opt/build/bin/python -m build --wheel --no-isolation --outdir /wheels .
# The runtime virtualenv, without pip or setuptools: the locked dependencies, then the wheel alone
# (both installed by the build venv's pip), then a smoke test of the console script.
RUN python -m venv --without-pip /opt/kube-gpu-exporter \
 && /opt/build/bin/pip --python /opt/kube-gpu-exporter/bin/python install --no-cache-dir \
        --require-hashes --no-deps -r requirements.lock \
 && /opt/build/bin/pip --python /opt/kube-gpu-exporter/bin/python install --no-cache-dir \
        --no-deps /wheels/kube_gpu_exporter-*.whl \
 && /opt/kube-gpu-exporter/bin/kube-gpu-exporter rules > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kube-gpu-exporter" \
      org.opencontainers.image.description="Per-container GPU metrics for Kubernetes nodes, shared GPUs included" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kube-gpu-exporter/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
COPY --from=build /opt/kube-gpu-exporter /opt/kube-gpu-exporter
# Not --system: 9400 is above SYS_UID_MAX, which would only earn a warning. --no-log-init keeps
# lastlog/faillog entries (sparse files sized by the uid) out of the layer. Then the base's own
# installers go: the official image's pip, setuptools and wheel, the wheels ensurepip and Debian's
# python3-venv would install; the exporter's virtualenv has none (tests/test_image.py checks).
RUN groupadd --gid 9400 kube-gpu-exporter \
 && useradd --uid 9400 --gid 9400 --no-log-init --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kube-gpu-exporter \
 && rm -rf /usr/local/bin/pip* /usr/local/bin/wheel /usr/local/lib/python3*/site-packages/* \
        /usr/local/lib/python3*/ensurepip/_bundled /usr/lib/python3*/ensurepip/_bundled /usr/share/python-wheels
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd; the same
# uid/gid as the chart's securityContext (tests/test_dockerfile.py checks both).
USER 9400:9400
EXPOSE 9400
# No HEALTHCHECK, on purpose: Kubernetes ignores it (the Helm chart's liveness and readiness probes
# call /healthz and /readyz instead), the listen address is a run-time setting (--listen or
# KUBE_GPU_EXPORTER_LISTEN) that a check baked in here could not follow, and the same image runs the
# one-shot `rules` and `render` subcommands. With plain Docker, add one at run time, e.g.
#   docker run --health-cmd 'python -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:9400/healthz\")"' ...
ENTRYPOINT ["kube-gpu-exporter"]
