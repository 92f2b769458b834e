"""The per-container counters (docs/metrics.md, "Per-container counters: busy seconds and energy").

Pure: :class:`UsageCounters` in, ``prometheus_client`` counter families out, rows sorted by their
labels. The row with empty namespace, pod and container is the device's unattributed remainder;
container rows plus that row add up to the device's busy seconds and energy.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.attribution.usage_counters import UsageCounters
from exporter.exposition.label_names import LabelNames

BASE = ["node_name", "uuid", "minor_number", "name"]


def usage_families(usage: UsageCounters, node: str, names: LabelNames) -> list[Metric]:
    """nvidia_gpu_container_busy_seconds_total, ..._container_energy_joules_total, nvidia_gpu_busy_seconds_total."""
    labels = [*BASE, names.namespace, names.pod, names.container]
    busy = CounterMetricFamily(
        "nvidia_gpu_container_busy_seconds",
        "Seconds a GPU was busy for a container, its utilization integrated over each sampling period "
        "(empty namespace/pod/container: the rest of the device's busy time)", labels=labels)
    energy = CounterMetricFamily(
        "nvidia_gpu_container_energy_joules",
        "Energy of a GPU attributed to a container by its SM share each sampling period, in joules "
        "(empty namespace/pod/container: the idle and unattributed remainder)", labels=labels)
    device = CounterMetricFamily(
        "nvidia_gpu_busy_seconds",
        "Seconds the GPU was busy since the exporter started, its utilization integrated over each sampling period",
        labels=BASE)
    for fam, rows in ((busy, usage.busy), (energy, usage.energy)):
        for key in sorted(rows):
            fam.add_metric([node, *key], rows[key])
    for dk in sorted(usage.device_busy):
        device.add_metric([node, *dk], usage.device_busy[dk])
    return [f for f in (busy, energy, device) if f.samples]
