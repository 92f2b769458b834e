"""Metric families from one attributed sample: the rows documented in docs/metrics.md.

Pure: takes the attribution, the sample and the exporter's own counters, returns
``prometheus_client`` metric families. Absent values (NotSupported, lost GPU, unknown
memory) produce no row rather than a made-up 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from exporter import __version__
from exporter.attribution.attribute import (
    NONE,
    SHARE,
    DeviceAttribution,
    NodeAttribution,
    granted_memory,
)
from exporter.attribution.usage_counters import UsageCounters
from exporter.attribution.utilization import device_utilization
from exporter.exposition.device_fields import in_group, native, value
from exporter.exposition.health_rows import health_families
from exporter.exposition.label_names import LabelNames  # also imported from here by callers
from exporter.exposition.pod_labels import NO_POD_LABELS, PodLabelAllowlist, select_pod_labels
from exporter.exposition.usage_rows import usage_families
from exporter.model import EMPTY, DeviceSample, NodeSample, PodInfo


@dataclass(frozen=True, slots=True)
class ExporterStats:
    """The exporter's own state at snapshot time."""

    samples_total: int = 0
    sample_failures_total: int = 0
    pod_sync_errors_total: int = 0
    pod_cache_age_seconds: float | None = None
    pod_cache_synced: bool = False
    skips: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    snapshot_timestamp: float = 0.0
    output_failures: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # by output name
    source_errors: Mapping[tuple[str, str], int] = field(default_factory=lambda: EMPTY)  # by (source, kind)


DEVICE_GAUGES = in_group("device")
HELP = {
    "nvidia_gpu_duty_cycle": "Percent of time over the past sample period during which one or more kernels "
    "were executing on the GPU device",
    "nvidia_gpu_gpu_sharing_memory": "GPU allocated memory when GPU sharing",
    "nvidia_gpu_memory_total_bytes": "Total memory of the GPU device",
    "nvidia_gpu_memory_used_bytes": "Memory used by the GPU device",
    "nvidia_gpu_num_devices": "Number of GPU devices",
    "nvidia_gpu_power_usage_milliwatts": "Power usage of the GPU device in milliwatts",
    "nvidia_gpu_temperature_celsius": "Temperature of the GPU device in celsius",
}


class _Families:
    """Ordered family builders keyed by name; empty families are dropped at the end."""

    def __init__(self) -> None:
        self._fams: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: Iterable[str]) -> GaugeMetricFamily:
        if name not in self._fams:
            self._fams[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        return self._fams[name]  # type: ignore[return-value]

    def counter(self, name: str, doc: str, labels: Iterable[str]) -> CounterMetricFamily:
        if name not in self._fams:
            self._fams[name] = CounterMetricFamily(name, doc, labels=list(labels))
        return self._fams[name]  # type: ignore[return-value]

    def extend(self, families: Iterable[Metric]) -> None:
        """Families built elsewhere (health_rows), kept in their order."""
        for fam in families:
            self._fams.setdefault(fam.name, fam)

    def result(self) -> list[Metric]:
        return [f for f in self._fams.values() if f.samples]


def _add(fam: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        fam.add_metric(labels, float(value))


def build_families(attr: NodeAttribution, sample: NodeSample, node: str, names: LabelNames,
                   stats: ExporterStats, per_process: bool = False,
                   pod_labels: PodLabelAllowlist = NO_POD_LABELS, usage: UsageCounters | None = None) -> list[Metric]:
    """All families for one snapshot, in a stable order; ``pod_labels`` picks the pod labels on pod_info,
    ``usage`` the per-container counters carried across cycles (none: no counter rows).

    The pipeline builds the same three parts as separate outputs (one failing leaves the others served).
    """
    families = workload_families(attr, sample, node, names, per_process, pod_labels)
    if usage is not None:
        families += [fam for fam in usage_families(usage, node, names) if fam.samples]
    return families + self_families(sample, stats, node)


def workload_families(attr: NodeAttribution, sample: NodeSample, node: str, names: LabelNames,
                      per_process: bool = False, pod_labels: PodLabelAllowlist = NO_POD_LABELS) -> list[Metric]:
    """The GPU rows, allocations, node capacity, pod info, device health and per-process rows."""
    f = _Families()
    row_labels = ["allocate_mode", names.container, "minor_number", "name", names.namespace,
                  "node_name", names.pod, "uuid"]
    duty = f.gauge("nvidia_gpu_duty_cycle", HELP["nvidia_gpu_duty_cycle"], row_labels)
    sharing = f.gauge("nvidia_gpu_gpu_sharing_memory", HELP["nvidia_gpu_gpu_sharing_memory"], row_labels)
    mtotal = f.gauge("nvidia_gpu_memory_total_bytes", HELP["nvidia_gpu_memory_total_bytes"], row_labels)
    mused = f.gauge("nvidia_gpu_memory_used_bytes", HELP["nvidia_gpu_memory_used_bytes"], row_labels)
    ndev = f.gauge("nvidia_gpu_num_devices", HELP["nvidia_gpu_num_devices"], ["node_name"])
    power = f.gauge("nvidia_gpu_power_usage_milliwatts", HELP["nvidia_gpu_power_usage_milliwatts"],
                    row_labels)
    temp = f.gauge("nvidia_gpu_temperature_celsius", HELP["nvidia_gpu_temperature_celsius"], row_labels)

    def row(d: DeviceSample, mode: str, pod: PodInfo | None, container: str) -> list[str]:
        return [mode, container, _minor(d), d.name, pod.namespace if pod else "", node,
                pod.name if pod else "", d.uuid]

    for da in attr.devices:
        d = da.device
        if da.mode == NONE or da.mode == SHARE:
            lbl = row(d, NONE, None, "")
            _add(duty, lbl, device_utilization(d))
            _add(mtotal, lbl, d.memory_total_bytes)
            _add(mused, lbl, d.memory_used_bytes)
            _add(power, lbl, d.power_usage_milliwatts)
            _add(temp, lbl, d.temperature_celsius)
        for u in da.users:
            lbl = row(d, da.mode, u.pod, u.container)
            _add(duty, lbl, u.sm_util)
            if da.mode == SHARE and u.allocation is not None:
                _add(sharing, lbl, granted_memory(u.allocation, d))
            _add(mtotal, lbl, d.memory_total_bytes)
            _add(mused, lbl, u.memory_used_bytes)
            _add(power, lbl, d.power_usage_milliwatts)
            _add(temp, lbl, d.temperature_celsius)
    if sample.nvml_up:
        # While NVML cannot even start the device count is unknown, not 0: a 0 would read as
        # lost capacity in every roll-up. kube_gpu_exporter_nvml_up says why it is missing.
        ndev.add_metric([node], len(sample.devices))

    _allocation_families(f, attr, node, names)
    if sample.nvml_up:
        _node_families(f, sample, node)
    _pod_info(f, attr.pods, node, names, pod_labels)
    _device_families(f, sample, node)
    _process_families(f, attr.devices, node, names, per_process)
    return f.result()


def _minor(d: DeviceSample) -> str:
    return _opt(d.minor_number)


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)



def _allocation_families(f: _Families, attr: NodeAttribution, node: str, names: LabelNames) -> None:
    labels = ["node_name", names.namespace, names.pod, names.container, "uuid", "minor_number",
              "allocate_mode", "scheme"]
    compute = f.gauge("nvidia_gpu_allocated_compute_percent",
                      "Compute a container was allocated on a GPU, in percent of one GPU", labels)
    memory = f.gauge("nvidia_gpu_allocated_memory_bytes",
                     "Memory a container was allocated on a GPU, in bytes", labels)
    # Several unplaced allocations of one container share a label set: sum them.
    totals: dict[tuple[str, ...], list[float | None]] = {}
    for a in attr.allocations:
        key = (node, a.pod.namespace, a.pod.name, a.container, a.uuid,
               "" if a.minor_number is None else str(a.minor_number), a.allocate_mode, a.scheme)
        acc = totals.setdefault(key, [None, None])
        if a.compute_percent is not None:
            acc[0] = (acc[0] or 0.0) + a.compute_percent
        if a.memory_bytes is not None:
            acc[1] = (acc[1] or 0.0) + a.memory_bytes
    for key, (c, m) in totals.items():
        _add(compute, list(key), c)
        _add(memory, list(key), m)
    lies = f.gauge("kube_gpu_exporter_allocation_disagreements",
                   "Annotations not believed, by scheme: containers running on a GPU other than the one their "
                   "annotation claims, and annotation allocations refused on a GPU another container holds whole",
                   ["scheme"])
    for scheme, n in sorted(attr.disagreements.items()):
        lies.add_metric([scheme], n)


def _node_families(f: _Families, sample: NodeSample, node: str) -> None:
    known = [d.memory_total_bytes for d in sample.devices if d.memory_total_bytes is not None]
    healthy = [d for d in sample.devices if not d.lost]
    f.gauge("nvidia_gpu_node_memory_total_bytes", "Memory of all GPUs on the node, in bytes",
            ["node_name"]).add_metric([node], float(sum(known)))
    f.gauge("nvidia_gpu_node_healthy_devices", "GPUs on the node not reported lost",
            ["node_name"]).add_metric([node], len(healthy))
    f.gauge("nvidia_gpu_node_healthy_memory_bytes", "Memory of the GPUs not reported lost, in bytes",
            ["node_name"]).add_metric([node], float(sum(d.memory_total_bytes or 0 for d in healthy)))


def _pod_info(f: _Families, pods: Iterable[PodInfo], node: str, names: LabelNames,
              allowlist: PodLabelAllowlist) -> None:
    base = ["node_name", names.namespace, names.pod, "workload_kind", "workload_name", "pod_uid"]
    fam = f.gauge("nvidia_gpu_pod_info", "Pods holding or using a GPU on this node, with their workload", base)
    for p in pods:
        values = [node, p.namespace, p.name, p.workload_kind, p.workload_name or p.name, p.uid]
        copied = select_pod_labels(p.labels, allowlist, base).labels
        if copied:  # label_<key> for the allowlisted pod labels: each pod its own set
            fam.samples.append(Sample(fam.name, {**dict(zip(base, values, strict=True)), **dict(copied)}, 1.0))
        else:
            fam.add_metric(values, 1)


def _device_families(f: _Families, sample: NodeSample, node: str) -> None:
    base = ["node_name", "uuid", "minor_number", "name"]
    info = f.gauge("nvidia_gpu_info", "GPU device information", [*base, "pci_bus_id", "driver_version"])
    up = f.gauge("nvidia_gpu_up", "1 unless NVML reported the GPU lost", base)
    ecc = f.gauge("nvidia_gpu_ecc_errors", "Volatile ECC error count since the driver loaded",
                  [*base, "type"])
    for d in sample.devices:
        lbl = [node, d.uuid, _minor(d), d.name]
        info.add_metric([*lbl, d.pci_bus_id, sample.driver_version], 1)
        if d.parent_uuid is not None:
            f.gauge("nvidia_gpu_mig_device_info",
                    "A MIG device, listed in place of the physical GPU it partitions (parent_uuid)",
                    [*base, "parent_uuid", "profile", "gpu_instance_id", "compute_instance_id"]).add_metric(
                [*lbl, d.parent_uuid, d.mig_profile, _opt(d.gpu_instance_id), _opt(d.compute_instance_id)], 1)
        up.add_metric(lbl, 0 if d.lost else 1)
        for spec in DEVICE_GAUGES:  # the device field table's device families, in its order
            if (v := value(spec, d)) is not None:
                f.gauge(spec.family, spec.help, base).add_metric(lbl, native(spec, v))
        _add(ecc, [*lbl, "corrected"], d.ecc_corrected_total)
        _add(ecc, [*lbl, "uncorrected"], d.ecc_uncorrected_total)
    f.extend(health_families(sample.devices, node))


def _process_families(f: _Families, devices: Iterable[DeviceAttribution], node: str, names: LabelNames,
                      per_process: bool) -> None:
    labels = ["node_name", "uuid", "minor_number", "name", names.namespace, names.pod, names.container,
              "pid"]
    umem = f.gauge("nvidia_gpu_unaccounted_process_memory_used_bytes",
                   "Memory of GPU processes that belong to no container allocated that GPU", labels)
    uduty = f.gauge("nvidia_gpu_unaccounted_process_duty_cycle",
                    "SM utilization of GPU processes that belong to no container allocated that GPU",
                    labels)
    pmem = f.gauge("nvidia_gpu_process_memory_used_bytes", "Memory used by a GPU process", labels)
    pduty = f.gauge("nvidia_gpu_process_duty_cycle", "SM utilization of a GPU process", labels)
    for da in devices:
        d = da.device
        groups = [(da.unaccounted, umem, uduty)] + ([(da.processes, pmem, pduty)] if per_process else [])
        for procs, mem, duty in groups:
            for p in procs:
                lbl = [node, d.uuid, _minor(d), d.name, p.pod.namespace if p.pod else "",
                       p.pod.name if p.pod else "", p.container or "", str(p.pid)]
                _add(mem, lbl, p.used_memory_bytes)
                _add(duty, lbl, p.sm_util)


def self_families(sample: NodeSample, stats: ExporterStats, node: str) -> list[Metric]:
    """The exporter's own state: version, NVML, cycles and their failures, pod cache, skips."""
    f = _Families()
    f.gauge("kube_gpu_exporter_build_info", "kube-gpu-exporter version", ["version"]).add_metric(
        [__version__], 1)
    f.gauge("kube_gpu_exporter_nvml_up", "1 when NVML is initialised", []).add_metric(
        [], 1 if sample.nvml_up else 0)
    f.gauge("kube_gpu_exporter_sample_duration_seconds", "Duration of the last sampling cycle",
            []).add_metric([], sample.duration_seconds)
    f.counter("kube_gpu_exporter_samples", "Sampling cycles completed", []).add_metric(
        [], stats.samples_total)
    f.counter("kube_gpu_exporter_sample_failures", "Sampling cycles that failed unexpectedly",
              []).add_metric([], stats.sample_failures_total)
    errs = f.counter("kube_gpu_exporter_nvml_errors", "NVML call failures by call and error",
                     ["call", "code"])
    for (call, code), n in sorted(sample.errors.items()):
        errs.add_metric([call, code], n)
    f.gauge("kube_gpu_exporter_snapshot_timestamp_seconds", "Unix time the served snapshot was built",
            []).add_metric([], stats.snapshot_timestamp)
    f.counter("kube_gpu_exporter_pod_sync_errors", "Pod list/watch failures", []).add_metric(
        [], stats.pod_sync_errors_total)
    f.gauge("kube_gpu_exporter_pod_cache_synced", "1 when the pod cache has synced with the API",
            []).add_metric([], 1 if stats.pod_cache_synced else 0)
    _add(f.gauge("kube_gpu_exporter_pod_cache_age_seconds",
                 "Seconds since the pod cache was last in sync with the API", []), [],
         stats.pod_cache_age_seconds)
    skips = f.counter("kube_gpu_exporter_skips", "Inputs skipped, by reason", ["reason"])
    for reason, n in sorted(stats.skips.items()):
        skips.add_metric([reason], n)
    if stats.output_failures:  # only from the pipeline, which names every output it builds
        outputs = f.counter("kube_gpu_exporter_output_failures",
                            "Cycles in which building one output (rows, usage, dcgm, xid, status) raised; "
                            "the other outputs were still published", ["output"])
        for output, n in sorted(stats.output_failures.items()):
            outputs.add_metric([output], n)
    sources = f.counter("kube_gpu_exporter_source_errors",
                        "Source reads that raised, by source and exception kind; the cycle used that "
                        "source's last good answer", ["source", "kind"])
    for (source, kind), n in sorted(stats.source_errors.items()):
        sources.add_metric([source, kind], n)
    return f.result()
