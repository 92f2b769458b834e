"""Counting Xids (the stats): the running counts, their immutable snapshot (:class:`XidStats`), the metric families."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.model import EMPTY, XidSummary
from exporter.xid.events import WriterCounts

# (uuid, minor_number, xid, namespace, pod, container); "" / None where unknown.
XidCountKey = tuple[str, int | None, int, str, str, str]
NVML_RESULTS = ("counted", "duplicate", "dropped")


@dataclass(frozen=True, slots=True)
class XidStats:
    """What the watcher has seen since it started (immutable snapshot)."""

    xid_counts: Mapping[XidCountKey, int] = field(default_factory=lambda: EMPTY)
    last_xid_time: Mapping[tuple[str, int | None], float] = field(default_factory=lambda: EMPTY)
    last_xid: Mapping[tuple[str, int | None], int] = field(default_factory=lambda: EMPTY)  # the Xid of last_xid_time
    # (uuid, minor, xid) -> the MIG GPU instance the last such Xid named (None: the whole card, or not said)
    gpu_instances: Mapping[tuple[str, int | None, int], int | None] = field(default_factory=lambda: EMPTY)
    last_seen: Mapping[XidCountKey, float] = field(default_factory=lambda: EMPTY)  # each count's latest Xid
    records_read: int = 0
    history_skipped: int = 0  # records present at start and not replayed
    skips: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # by reason
    epipe: int = 0
    events_posted: int = 0
    events_patched: int = 0
    events_dropped: int = 0  # rate limited, or the writer's queue was full
    events_failed: int = 0
    nvml: bool = False  # the NVML source is configured
    nvml_events: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # by result: counted, duplicate, ...
    nvml_held: int = 0  # NVML Xids waiting for a kernel-log record or the end of their window
    nvml_errors: Mapping[tuple[str, str], int] = field(default_factory=lambda: EMPTY)  # (call, error)


class XidCounters:
    """The watcher's running counts, guarded by ``lock`` (shared with the dedup state and the planner).

    :meth:`skip`, :meth:`add` and :meth:`nvml_result` take the lock; :meth:`count_xid` and
    :meth:`snapshot` expect the caller to hold it, so that a count and its Event plan, or a snapshot
    and the dedup and planner figures next to it, are one consistent step.
    """

    def __init__(self, lock: threading.Lock | None = None) -> None:
        self.lock = lock if lock is not None else threading.Lock()
        self._counts: Counter[XidCountKey] = Counter()
        self._last_time: dict[tuple[str, int | None], float] = {}
        self._last_xid: dict[tuple[str, int | None], int] = {}
        self._instances: dict[tuple[str, int | None, int], int | None] = {}
        self._last_seen: dict[XidCountKey, float] = {}
        self._skips: Counter[str] = Counter()
        self._records = 0
        self._history_skipped = 0
        self._epipe = 0
        self._nvml_results: Counter[str] = Counter()

    def skip(self, reason: str) -> None:
        """Count input skipped for ``reason`` (a ``kube_gpu_exporter_xid_skips`` label)."""
        with self.lock:
            self._skips[reason] += 1

    def add(self, *, records: int = 0, epipe: int = 0, history_skipped: int = 0) -> None:
        """Add to the reading counters."""
        with self.lock:
            self._records += records
            self._epipe += epipe
            self._history_skipped += history_skipped

    def nvml_result(self, result: str) -> None:
        """Count one NVML Xid by what became of it (one of :data:`NVML_RESULTS`)."""
        with self.lock:
            self._nvml_results[result] += 1

    def count_xid(self, key: XidCountKey, observed: float, gpu_instance: int | None = None) -> None:
        """Count one Xid seen at ``observed`` on MIG GPU instance ``gpu_instance`` (caller holds :attr:`lock`)."""
        self._counts[key] += 1
        self._instances[key[:3]] = gpu_instance
        self._last_time[(key[0], key[1])] = observed
        self._last_xid[(key[0], key[1])] = key[2]
        self._last_seen[key] = observed

    def snapshot(
        self,
        *,
        sink: WriterCounts,
        rate_limited: int,
        nvml: bool,
        nvml_held: int,
        nvml_errors: Mapping[tuple[str, str], int],
    ) -> XidStats:
        """The counts with the Event and NVML figures given (caller holds :attr:`lock`)."""
        return XidStats(
            xid_counts=MappingProxyType(dict(self._counts)),
            last_xid_time=MappingProxyType(dict(self._last_time)),
            last_xid=MappingProxyType(dict(self._last_xid)),
            gpu_instances=MappingProxyType(dict(self._instances)),
            last_seen=MappingProxyType(dict(self._last_seen)),
            records_read=self._records,
            history_skipped=self._history_skipped,
            skips=MappingProxyType(dict(self._skips)),
            epipe=self._epipe,
            events_posted=sink.posted,
            events_patched=sink.patched,
            events_dropped=sink.dropped + rate_limited,
            events_failed=sink.failed,
            nvml=nvml,
            nvml_events=MappingProxyType(dict(self._nvml_results)),
            nvml_held=nvml_held,
            nvml_errors=nvml_errors,
        )


def last_xids(stats: XidStats) -> dict[str, tuple[float, int]]:
    """uuid -> (unix time, Xid) of each GPU's latest Xid (``DCGM_FI_DEV_XID_ERRORS`` under --dcgm-compat)."""
    out: dict[str, tuple[float, int]] = {}
    for (uuid, minor), xid in stats.last_xid.items():
        seen = (stats.last_xid_time.get((uuid, minor), 0.0), xid)
        out[uuid] = max(out.get(uuid, seen), seen)
    return out


def xid_summary(stats: XidStats) -> XidSummary:
    """What a sampling cycle reads of ``stats``: counts by GPU and Xid (summed over pods), each GPU's latest,
    and the counts by GPU, Xid and pod with the latest time of each (the status page's culprits)."""
    counts: dict[tuple[str, int], int] = {}
    by_pod: dict[tuple[str, int, str, str, str], tuple[int, float]] = {}
    for key, n in stats.xid_counts.items():
        uuid, _minor, xid, ns, pod, ctr = key
        counts[(uuid, xid)] = counts.get((uuid, xid), 0) + n
        seen = stats.last_seen.get(key, 0.0)
        before = by_pod.get((uuid, xid, ns, pod, ctr), (0, 0.0))
        by_pod[(uuid, xid, ns, pod, ctr)] = (before[0] + n, max(before[1], seen))  # summed over minor numbers
    return XidSummary(MappingProxyType(counts), MappingProxyType(last_xids(stats)), MappingProxyType(by_pod))


def xid_metric_families(
    stats: XidStats,
    node_name: str,
    pod_label: str = "pod_name",
    namespace_label: str = "namespace_name",
    container_label: str = "container_name",
) -> list[Metric]:
    """Prometheus families for ``stats`` (see docs/xid.md)."""
    errors = CounterMetricFamily(
        "nvidia_gpu_xid_errors",
        "Xid errors the NVIDIA driver reported in the kernel log (fallen-off-the-bus reports count as 79)",
        labels=["node_name", "uuid", "minor_number", "xid", namespace_label, pod_label, container_label],
    )
    for (uuid, minor, xid, ns, pod, ctr), n in sorted(stats.xid_counts.items(), key=_sort_key):
        errors.add_metric([node_name, uuid, _minor(minor), str(xid), ns, pod, ctr], n)
    last = GaugeMetricFamily(
        "nvidia_gpu_last_xid_timestamp_seconds",
        "Unix time the exporter read the GPU's latest Xid",
        labels=["node_name", "uuid", "minor_number"],
    )
    for (uuid, minor), ts in sorted(stats.last_xid_time.items(), key=_sort_key):
        last.add_metric([node_name, uuid, _minor(minor)], ts)
    return [errors, last, *_reading_families(stats, node_name), *_nvml_families(stats, node_name)]


def _reading_families(stats: XidStats, node_name: str) -> list[Metric]:
    """The watcher's own health: records read, skips, overruns, Event writes."""
    records = CounterMetricFamily(
        "kube_gpu_exporter_xid_records", "Kernel log records the Xid watcher read", labels=["node_name"]
    )
    records.add_metric([node_name], stats.records_read)
    skips = CounterMetricFamily(
        "kube_gpu_exporter_xid_skips",
        "Kernel log input the Xid watcher skipped, by reason",
        labels=["node_name", "reason"],
    )
    for reason, n in sorted(stats.skips.items()):
        skips.add_metric([node_name, reason], n)
    epipe = CounterMetricFamily(
        "kube_gpu_exporter_xid_kmsg_overruns",
        "EPIPE reads: kernel log records overwritten before the watcher read them",
        labels=["node_name"],
    )
    epipe.add_metric([node_name], stats.epipe)
    events = CounterMetricFamily(
        "kube_gpu_exporter_xid_events",
        "Kubernetes Event writes for Xids, by result (posted, patched, dropped, failed)",
        labels=["node_name", "result"],
    )
    for result, n in (
        ("posted", stats.events_posted),
        ("patched", stats.events_patched),
        ("dropped", stats.events_dropped),
        ("failed", stats.events_failed),
    ):
        events.add_metric([node_name, result], n)
    return [records, skips, epipe, events]


def _nvml_families(stats: XidStats, node_name: str) -> list[Metric]:
    """The NVML source's results and errors; none when it is not configured."""
    if not stats.nvml:
        return []
    nvml = CounterMetricFamily(
        "kube_gpu_exporter_xid_nvml_events",
        "Xids from NVML events, by result: counted (no kernel log record of the same incident), "
        "duplicate (the kernel log's record was counted), dropped (queue full)",
        labels=["node_name", "result"],
    )
    for result in NVML_RESULTS:
        nvml.add_metric([node_name, result], stats.nvml_events.get(result, 0))
    nvml_errors = CounterMetricFamily(
        "kube_gpu_exporter_xid_nvml_errors",
        "NVML failures of the Xid event source, by call and error",
        labels=["node_name", "call", "code"],
    )
    for (call, code), n in sorted(stats.nvml_errors.items()):
        nvml_errors.add_metric([node_name, call, code], n)
    return [nvml, nvml_errors]


def _minor(minor: int | None) -> str:
    return "" if minor is None else str(minor)


def _sort_key(item: tuple[tuple, object]) -> tuple:
    # Ints zero-padded so that minor numbers and Xids sort numerically within the string sort.
    return tuple("" if v is None else (f"{v:012d}" if isinstance(v, int) else v) for v in item[0])
