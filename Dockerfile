# kube-gpu-exporter image: the Python package installed into a virtualenv, copied onto a clean
# python:3.11-slim runtime stage.
#
#   docker build -t kube-gpu-exporter:0.1.0 .
#   docker run --rm -p 9400:9400 -v "$PWD/examples:/examples:ro" kube-gpu-exporter:0.1.0 \
#       --simulate /examples/seed-cgpu-t4.yaml
#
# The image runs as an unprivileged user (uid 65532) by default, which is enough for --simulate,
# `kube-gpu-exporter rules` and `render`. On a GPU node the Helm chart decides the privileges
# (docs/deploy.md): it mounts the host's /proc at /host/proc (NVML reports host PIDs; no hostPID
# needed), and runs the container as uid 0 with every capability dropped so it can connect to the
# kubelet's root-owned pod-resources socket; reading the host's /dev/kmsg for Xid errors
# additionally needs a privileged container (the device cgroup only admits /dev/kmsg then) and
# CAP_SYSLOG when kernel.dmesg_restrict=1.
# NVML (libnvidia-ml.so) is not in the image: the NVIDIA container runtime injects the host
# driver's libraries (NVIDIA_DRIVER_CAPABILITIES=utility, set below).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/kube-gpu-exporter
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN /opt/kube-gpu-exporter/bin/pip install --no-cache-dir . \
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
RUN groupadd --system --gid 65532 kube-gpu-exporter \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kube-gpu-exporter
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
EXPOSE 9400
# No HEALTHCHECK, on purpose: Kubernetes ignores it (the Helm chart's liveness and readiness probes
# call /healthz and /readyz instead), the listen address is a run-time setting (--listen or
# KUBE_GPU_EXPORTER_LISTEN) that a check baked in here could not follow, and the same image runs the
# one-shot `rules` and `render` subcommands. With plain Docker, add one at run time, e.g.
#   docker run --health-cmd 'python -c "import urllib.request as u; u.urlopen(\"http://127.0.0.1:9400/healthz\")"' ...
ENTRYPOINT ["kube-gpu-exporter"]
