"""The alert on the recording rules (rules/), which the GPU dashboards and the HPA metrics read.

Runbook: docs/alerts.md, KubeGpuRecordingRulesMissing. Optional (``--no-recording-rules-alert``)
because an install may deliberately run without the recording rules.
"""

from __future__ import annotations

from exporter.bundle.alerts.alert import Alert, Labels, by, on, spelled
from exporter.bundle.alerts.options import AlertOptions


def recording_rules_missing(opts: AlertOptions, lb: Labels) -> Alert:
    """A node exports GPU metrics, but the recording rules record nothing for it."""
    return Alert(
        "KubeGpuRecordingRulesMissing",
        f"count {by([*lb.cluster, lb.instance, lb.node])} (nvidia_gpu_num_devices)\n"
        f"unless {on([*lb.cluster, lb.node])}\n"
        "kube_node_status_capacity_gpu",
        "warning",
        "GPU metrics are scraped but the GPU recording rules produce nothing.",
        f"Node {lb.where} exports GPU metrics, but the recording rules of kube-gpu-exporter have not "
        f"recorded kube_node_status_capacity_gpu for it for {spelled(opts.recording_rules_for)}; the GPU "
        "dashboards and the HPA metrics built on the k8s_* series are empty or incomplete.",
        opts.recording_rules_for,
    )
