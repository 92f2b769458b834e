"""Alerts on the exporter itself: it is scraped, has NVML, keeps sampling and sees the pods.

Runbook: docs/alerts.md, KubeGpuExporterDown to KubeGpuNvmlDown and KubeGpuExporterSnapshotStale to
KubeGpuExporterPodSyncErrors. Two functions, because the bundle and the runbook list the GPU
alerts between these two sets.
"""

from __future__ import annotations

from exporter.bundle.alerts.alert import Alert, Labels, spelled
from exporter.bundle.alerts.options import AlertOptions


def scrape_alerts(opts: AlertOptions, lb: Labels) -> list[Alert]:
    """No GPU metrics at all: the target is down or missing, or NVML does not work."""
    return [
        Alert(
            "KubeGpuExporterDown",
            f"up{{{opts.exporter_selector}}} == 0",
            "warning",
            "A kube-gpu-exporter target is down.",
            f"Prometheus has failed to scrape kube-gpu-exporter at {lb.target} for "
            f"{spelled(opts.exporter_down_for)}; GPU usage of that node is not being recorded.",
            opts.exporter_down_for,
        ),
        Alert(
            "KubeGpuExporterTargetMissing",
            # `up == 0` cannot fire without a target: absent() covers a broken service discovery.
            f"absent(up{{{opts.exporter_selector}}})",
            "warning",
            "No kube-gpu-exporter target is being scraped.",
            f"Prometheus has discovered no target matching {{{opts.exporter_selector}}} for "
            f"{spelled(opts.target_missing_for)}; no GPU metrics are being collected.",
            opts.target_missing_for,
        ),
        Alert(
            "KubeGpuNvmlDown",
            "kube_gpu_exporter_nvml_up == 0",
            "critical",
            "kube-gpu-exporter cannot initialise NVML.",
            f"kube-gpu-exporter at {lb.target} has not been able to initialise NVML for "
            f"{spelled(opts.nvml_down_for)}; the NVIDIA driver on that node is probably unloaded or broken.",
            opts.nvml_down_for,
        ),
    ]


def collection_alerts(opts: AlertOptions, lb: Labels) -> list[Alert]:
    """GPU metrics that are there but wrong: stale samples, or usage not attributed to pods."""
    return [
        Alert(
            "KubeGpuExporterSnapshotStale",
            f"kube_gpu_exporter_snapshot_age_seconds > {opts.snapshot_stale_seconds:g}\n"
            f"or\nincrease(kube_gpu_exporter_samples_total[5m]) == 0",
            "warning",
            "kube-gpu-exporter serves stale GPU metrics.",
            f"kube-gpu-exporter at {lb.target} has not completed a sampling cycle for over 5 minutes; "
            "the values it serves are old.",
            "5m",
        ),
        Alert(
            "KubeGpuExporterPodCacheNotSynced",
            "kube_gpu_exporter_pod_cache_synced == 0",
            "warning",
            "kube-gpu-exporter has no pod view from the API server.",
            f"kube-gpu-exporter at {lb.target} has not synced its pod cache for {spelled(opts.pod_cache_for)}; "
            "GPU usage cannot be attributed to pods.",
            opts.pod_cache_for,
        ),
        Alert(
            "KubeGpuExporterPodSyncErrors",
            "increase(kube_gpu_exporter_pod_sync_errors_total[15m]) > 0",
            "warning",
            "kube-gpu-exporter keeps failing to list or watch pods.",
            f"kube-gpu-exporter at {lb.target} has had pod list/watch errors for 15 minutes "
            "({{ $value | printf \"%.0f\" }} in the last 15 minutes); pod attribution may be out of date.",
            "15m",
        ),
    ]
