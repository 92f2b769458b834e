"""kube-gpu-exporter: per-container GPU metrics for Kubernetes nodes."""

__version__ = "0.1.0"
