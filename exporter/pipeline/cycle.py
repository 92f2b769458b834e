"""One sampling cycle: the sources' answers -> allocations and attribution -> every output -> a snapshot.

:class:`Sources` names what a cycle reads (each source keeps its own last good answer and is never
asked by anything downstream); :class:`Settings` what it is told; :class:`Pipeline` runs a cycle.
Each output (the metric rows, the usage counters, the Xid families, the DCGM series, the status
tree) is built in isolation by :class:`~exporter.pipeline.outputs.OutputGuard`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client.core import Metric

from exporter.attribution import infrastructure
from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.attribute import NodeAttribution, PodLookup, attribute
from exporter.attribution.dra_objects import PodClaims
from exporter.attribution.usage_counters import MAX_PERIOD_INTERVALS, UsageCounters, advance
from exporter.exposition.dcgm import dcgm_families
from exporter.exposition.pod_labels import NO_POD_LABELS, PodLabelAllowlist, pod_label_skips
from exporter.exposition.rows import ExporterStats, LabelNames, self_families, workload_families
from exporter.exposition.snapshot import Snapshot, make_snapshot, with_sample_failures
from exporter.exposition.status import Status, XidCatalog, build_status
from exporter.exposition.status_page import StatusPage, build_page
from exporter.exposition.usage_rows import usage_families
from exporter.model import EMPTY, CgroupRef, NodeSample, PodResources, XidSummary
from exporter.pipeline.outputs import OutputGuard
from exporter.pipeline.source_guard import SourceGuard


class Backend(Protocol):
    def sample(self) -> NodeSample: ...


class ProcSource(Protocol):
    def resolve(self, pids: Iterable[int]) -> dict[int, CgroupRef | None]: ...

    def skips(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class PodState:
    """The pod source's answer for one cycle."""

    view: PodLookup
    synced: bool
    last_sync: float | None
    sync_errors: int = 0
    skips: Mapping[str, int] = field(default_factory=dict)


def _no_pod_resources() -> tuple[PodResources, ...] | None:
    return None


def _no_xids() -> XidSummary | None:
    return None


@dataclass(frozen=True, slots=True)
class Sources:
    """What a cycle reads. A new input is one field here and one line where the shell wires it."""

    backend: Backend  # NVML or the simulated node
    proc: ProcSource  # /proc/<pid>/cgroup, or the scenario's
    pods: Callable[[], PodState]
    node_labels: Callable[[], Mapping[str, str]] = dict
    node_capacity: Callable[[], Mapping[str, str]] = dict
    pod_resources: Callable[[], tuple[PodResources, ...] | None] = _no_pod_resources  # None: no kubelet answer
    # DRA: this node's ResourceSlices and its pods' ResourceClaims (raw API objects), the pods' claim references
    resource_slices: Callable[[], Sequence[Any]] = tuple
    resource_claims: Callable[[], Sequence[Any]] = tuple
    pod_claims: Callable[[], Mapping[str, PodClaims]] = dict
    xid_families: Callable[[], list[Metric]] = list  # the Xid watcher's own families
    xids: Callable[[], XidSummary | None] = _no_xids  # its counts, None without a watcher
    comms: Callable[[], Mapping[int, str]] = dict  # /proc/<pid>/comm of the PIDs proc last resolved
    # subsystem -> (state, ok: None when not in use) of the sources the status page judges (pod-resources, kernel log)
    states: Callable[[], Mapping[str, tuple[str, bool | None]]] = dict


@dataclass(frozen=True, slots=True)
class Settings:
    """What a cycle is told: names and switches from the configuration."""

    node_name: str
    names: LabelNames = field(default_factory=LabelNames)
    per_process: bool = False
    pod_labels: PodLabelAllowlist = NO_POD_LABELS
    dcgm_compat: bool = False  # dcgm-exporter's DCGM_FI_* series too
    clock: Callable[[], float] = time.time
    xid_catalog: XidCatalog | None = None  # each Xid's meaning on the status page (the shell wires the catalog)
    # Namespaces whose MPS daemons are the GPUs' infrastructure, not tenants (attribution rule 9).
    infrastructure_namespaces: frozenset[str] = frozenset(infrastructure.DEFAULT_NAMESPACES)


@dataclass(frozen=True, slots=True)
class _NoPodView:
    """The pod view before the pod source's first good answer."""

    pods: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    by_container_id: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


_NO_PODS = PodState(_NoPodView(), synced=False, last_sync=None)


class Pipeline:
    """One sampling cycle from the configured sources to an immutable snapshot."""

    def __init__(self, sources: Sources, settings: Settings) -> None:
        self.sources = sources
        self.settings = settings
        self.samples_total = 0
        self.failures_total = 0
        self.outputs = OutputGuard()
        self.reads = SourceGuard()  # every source read through it: one that raises keeps its last good answer
        self._skips: dict[str, int] = {}
        self.last_sample: NodeSample | None = None  # the last cycle's, for readiness and the start-up summary
        self._status: Status = EMPTY  # the last good status tree, kept while the status output fails
        self._page: StatusPage | None = None  # its /status.json and page, rendered once
        # Busy seconds and energy per container, carried from cycle to cycle; ``interval`` (set by
        # SamplerThread) bounds the period a cycle may integrate over.
        self.usage = UsageCounters()
        self.interval = 1.0

    @property
    def node_name(self) -> str:
        return self.settings.node_name

    def allocation_inputs(self, pods: PodState, sample: NodeSample | None) -> AllocationInputs:
        """This cycle's inputs to the sharing schemes, read from the sources."""
        src, read = self.sources, self.reads.read
        return AllocationInputs(tuple(pods.view.pods.values()), sample.devices if sample else (),
                                read("node", "labels", src.node_labels, EMPTY),
                                read("pod_resources", "list", src.pod_resources, None),
                                read("node", "capacity", src.node_capacity, EMPTY),
                                read("dra", "slices", src.resource_slices, ()),
                                read("dra", "claims", src.resource_claims, ()),
                                read("dra", "pod_claims", src.pod_claims, EMPTY), self.node_name)

    def step(self) -> tuple[Snapshot, NodeAttribution]:
        """Run one cycle; raises only when sampling or attribution fails (the sampler counts those)."""
        started, src, read = time.monotonic(), self.sources, self.reads.read
        # NVML raising (counted) fails the cycle: its values are the measurement, and old ones are never
        # served under a newer timestamp; the previous snapshot stays, its age telling.
        sample = self.last_sample = read("nvml", "sample", src.backend.sample, keep_last=False)
        pids = {p.pid for d in sample.devices for p in d.processes}
        placement = read("proc", "resolve", lambda: src.proc.resolve(pids), {})
        state = read("pods", "view", src.pods, _NO_PODS)
        allocations = compute_allocations(self.allocation_inputs(state, sample))
        comms = src.comms()  # the command names of the PIDs just resolved: attribution's and the status page's
        attr = attribute(sample, placement, state.view, allocations.allocations, comms,
                         self.settings.infrastructure_namespaces)
        if sample.duration_seconds == 0.0:
            sample = replace(sample, duration_seconds=time.monotonic() - started)
        self.samples_total += 1
        self._count_skips(allocations.skips, attr.skips, pod_label_skips(attr.pods, self.settings.pod_labels))
        xids = read("xid", "summary", src.xids, None)
        families = self._outputs(attr, sample, xids)
        now = self.settings.clock()
        stats = self._stats(state, now)
        self._status, self._page = self.outputs.run("status", lambda: self._status_output(
            attr, sample, stats, xids, now, comms), (self._status, self._page))
        stats = replace(stats, output_failures=self._output_failures())  # this cycle's status included
        families.insert(2, self_families(sample, stats, self.node_name))  # after rows and usage, as always
        owners = {p.pid: (p.pod.namespace, p.pod.name, p.container or "", p.pod.uid)
                  for d in attr.devices for p in d.processes if p.pod is not None}
        snapshot = make_snapshot([f for part in families for f in part], now, sample.devices, owners)
        return replace(snapshot, status=self._status, page=self._page), attr

    def _status_output(self, attr: NodeAttribution, sample: NodeSample, stats: ExporterStats,
                       xids: XidSummary | None, now: float, comms: Mapping[int, str]
                       ) -> tuple[Status, StatusPage | None]:
        """The status tree and its page: the per-pod work of /status.json and /, done here once a cycle."""
        status = build_status(attr, sample, stats, xids, self.node_name, now, comms, self.sources.states())
        return status, build_page(status, None, self.settings.xid_catalog)

    def failed(self, served: Snapshot) -> Snapshot:
        """``served`` after a failed cycle: its failure count set, in the metrics and the stored page."""
        snapshot = with_sample_failures(served, self.failures_total)
        return replace(snapshot, page=build_page(snapshot.status, self.failures_total, self.settings.xid_catalog))

    def _outputs(self, attr: NodeAttribution, sample: NodeSample, xids: XidSummary | None) -> list[list[Metric]]:
        """The metric outputs of one cycle, in render order (the exporter's own families go in at index 2)."""
        s, run = self.settings, self.outputs.run
        rows = run("rows", lambda: workload_families(attr, sample, s.node_name, s.names, s.per_process,
                                                     s.pod_labels), [])
        usage = run("usage", lambda: self._advance_usage(attr, sample), [])
        xid = run("xid", self.sources.xid_families, [])
        dcgm = run("dcgm", lambda: dcgm_families(attr, sample, s.node_name, _latest(xids)),
                   []) if s.dcgm_compat else []
        return [rows, usage, xid, dcgm]

    def _advance_usage(self, attr: NodeAttribution, sample: NodeSample) -> list[Metric]:
        usage = advance(self.usage, attr, sample, MAX_PERIOD_INTERVALS * self.interval)
        families = [f for f in usage_families(usage, self.node_name, self.settings.names) if f.samples]
        self.usage = usage  # only once its rows are built: a failed output leaves the counters as they were
        self._count_skips(usage.skips)
        return families

    def _count_skips(self, *sources: Mapping[str, int]) -> None:
        for source in sources:
            for reason, n in source.items():
                self._skips[reason] = self._skips.get(reason, 0) + n

    def _stats(self, state: PodState, now: float) -> ExporterStats:
        skips = dict(self._skips)
        for source in (self.reads.read("proc", "skips", self.sources.proc.skips, EMPTY), state.skips):
            for reason, n in source.items():
                skips[reason] = skips.get(reason, 0) + n
        return ExporterStats(
            samples_total=self.samples_total,
            sample_failures_total=self.failures_total,
            pod_sync_errors_total=state.sync_errors,
            pod_cache_age_seconds=None if state.last_sync is None else max(0.0, now - state.last_sync),
            pod_cache_synced=state.synced,
            skips=skips,
            snapshot_timestamp=now,
            output_failures=self._output_failures(),
            source_errors=self.reads.errors(),
        )

    def _output_failures(self) -> dict[str, int]:
        """Failed cycles by output, dcgm only when it is built."""
        return {k: v for k, v in self.outputs.failures().items() if k != "dcgm" or self.settings.dcgm_compat}


def _latest(xids: XidSummary | None) -> Mapping[str, tuple[float, int]] | None:
    return None if xids is None else xids.latest
