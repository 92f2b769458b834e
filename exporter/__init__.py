"""kube-gpu-exporter: per-container GPU metrics for Kubernetes nodes."""

from exporter._version import __version__

__all__ = ["__version__"]
