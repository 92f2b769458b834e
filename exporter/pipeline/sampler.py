"""The collection loop: sample -> attribute -> snapshot, on its own thread.

:class:`Pipeline` is one cycle, built from the sources the CLI wires up (real NVML or the
simulated node, /proc or the scenario's cgroups, the pod watcher or the scenario's pods).
:class:`SamplerThread` runs it on an interval and publishes each snapshot to a
:class:`SnapshotHolder`; the HTTP server only ever reads the holder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from prometheus_client.core import Metric

from exporter.attribution.allocations import compute_allocations
from exporter.attribution.attribute import NodeAttribution, PodLookup, attribute
from exporter.attribution.dra_objects import PodClaims
from exporter.attribution.usage_counters import MAX_PERIOD_INTERVALS, UsageCounters, advance
from exporter.exposition.dcgm import dcgm_families
from exporter.exposition.pod_labels import NO_POD_LABELS, PodLabelAllowlist, pod_label_skips
from exporter.exposition.rows import ExporterStats, LabelNames, build_families
from exporter.exposition.snapshot import Snapshot, make_snapshot, with_sample_failures
from exporter.exposition.status import build_status  # the status page's tree, built with the rows
from exporter.model import CgroupRef, NodeSample, PodResources

log = logging.getLogger(__name__)


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


class SnapshotHolder:
    """The last published snapshot and the sampler's heartbeat; replacing a reference is atomic under the GIL."""

    def __init__(self, initial: Snapshot) -> None:
        self._snapshot = initial
        self._ready = threading.Event()
        self._last_cycle_end: float | None = None

    def get(self) -> Snapshot:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        """A successful cycle's snapshot: served from now on, and the exporter is ready."""
        self._snapshot = snapshot
        self._ready.set()

    def replace(self, snapshot: Snapshot) -> None:
        """Serve ``snapshot`` without saying it is a new cycle's (readiness unchanged)."""
        self._snapshot = snapshot

    def beat(self, at: float | None = None) -> None:
        """The sampler finished a cycle (good or bad) at monotonic time ``at`` (default: now)."""
        self._last_cycle_end = time.monotonic() if at is None else at

    @property
    def last_cycle_end(self) -> float | None:
        """Monotonic time the last cycle ended, None before the first: /healthz tells a stuck sampler by it."""
        return self._last_cycle_end

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)


class Pipeline:
    """One sampling cycle from the configured sources to an immutable snapshot."""

    def __init__(
        self,
        backend: Backend,
        proc: ProcSource,
        pods: Callable[[], PodState],
        node_name: str,
        names: LabelNames | None = None,
        node_labels: Callable[[], Mapping[str, str]] = dict,
        pod_resources: Callable[[], tuple[PodResources, ...] | None] = lambda: None,
        extra_families: Callable[[], list[Metric]] = list,
        per_process: bool = False,
        clock: Callable[[], float] = time.time,
        node_capacity: Callable[[], Mapping[str, str]] = dict,
        pod_labels: PodLabelAllowlist = NO_POD_LABELS,
        resource_slices: Callable[[], Sequence[Any]] = tuple,
        resource_claims: Callable[[], Sequence[Any]] = tuple,
        pod_claims: Callable[[], Mapping[str, PodClaims]] = dict,
        dcgm_compat: bool = False,
        last_xid: Callable[[], Mapping[str, tuple[float, int]] | None] = lambda: None,
    ) -> None:
        self.backend = backend
        self.proc = proc
        self.pods = pods
        self.node_name = node_name
        self.names = names or LabelNames()
        self.node_labels = node_labels
        self.pod_resources = pod_resources
        self.extra_families = extra_families
        self.per_process = per_process
        self.clock = clock
        self.node_capacity = node_capacity
        self.pod_labels = pod_labels
        # DRA: this node's ResourceSlices, the claims of its pods (raw objects), the pods' claim references
        self.resource_slices = resource_slices
        self.resource_claims = resource_claims
        self.pod_claims = pod_claims
        # --dcgm-compat: dcgm-exporter's DCGM_FI_* series too; last_xid: uuid -> (time, Xid), None without a watcher
        self.dcgm_compat = dcgm_compat
        self.last_xid = last_xid
        self.samples_total = 0
        self.failures_total = 0
        self._skips: dict[str, int] = {}
        self.last_sample: NodeSample | None = None  # the last cycle's, for readiness and the start-up summary
        # Busy seconds and energy per container, carried from cycle to cycle; ``interval`` (set by
        # SamplerThread) bounds the period a cycle may integrate over.
        self.usage = UsageCounters()
        self.interval = 1.0

    def step(self) -> tuple[Snapshot, NodeAttribution]:
        """Run one cycle; raises only on programming errors (the thread counts those)."""
        started = time.monotonic()
        sample = self.backend.sample()
        self.last_sample = sample
        pids = {p.pid for d in sample.devices for p in d.processes}
        placement = self.proc.resolve(pids)
        state = self.pods()
        allocations = compute_allocations(state.view.pods.values(), sample.devices, self.node_labels(),
                                          self.pod_resources(), self.node_capacity(), self.resource_slices(),
                                          self.resource_claims(), self.pod_claims(), self.node_name)
        attr = attribute(sample, placement, state.view, allocations.allocations)
        self.usage = advance(self.usage, attr, sample, MAX_PERIOD_INTERVALS * self.interval)
        for source in (allocations.skips, attr.skips, pod_label_skips(attr.pods, self.pod_labels), self.usage.skips):
            for reason, n in source.items():
                self._skips[reason] = self._skips.get(reason, 0) + n
        self.samples_total += 1
        now = self.clock()
        skips = dict(self._skips)
        for source in (self.proc.skips(), state.skips):
            for reason, n in source.items():
                skips[reason] = skips.get(reason, 0) + n
        stats = ExporterStats(
            samples_total=self.samples_total,
            sample_failures_total=self.failures_total,
            pod_sync_errors_total=state.sync_errors,
            pod_cache_age_seconds=None if state.last_sync is None else max(0.0, now - state.last_sync),
            pod_cache_synced=state.synced,
            skips=skips,
            snapshot_timestamp=now,
        )
        if sample.duration_seconds == 0.0:
            sample = replace(sample, duration_seconds=time.monotonic() - started)
        families = build_families(attr, sample, self.node_name, self.names, stats, self.per_process,
                                  self.pod_labels, usage=self.usage)
        families += self.extra_families()
        if self.dcgm_compat:
            families += dcgm_families(attr, sample, self.node_name, self.last_xid())
        owners = {p.pid: (p.pod.namespace, p.pod.name, p.container or "", p.pod.uid)
                  for d in attr.devices for p in d.processes if p.pod is not None}
        status = build_status(attr, sample, stats, families, self.node_name, now)
        return replace(make_snapshot(families, now, sample.devices, owners), status=status), attr


class SamplerThread(threading.Thread):
    """Runs the pipeline every ``interval`` seconds; nothing in a cycle can kill it."""

    def __init__(self, pipeline: Pipeline, holder: SnapshotHolder, interval: float,
                 on_cycle: Callable[[], None] | None = None) -> None:
        """``on_cycle`` runs after each cycle (readiness and state logging); its failures are logged."""
        super().__init__(name="gpu-sampler", daemon=True)
        self.pipeline = pipeline
        self.holder = holder
        self.interval = interval
        pipeline.interval = interval  # the usage counters' longest period follows the real one
        self.on_cycle = on_cycle
        # not ``_stop``: threading.Thread has a method of that name, which join() and is_alive() call
        self._stopping = threading.Event()

    def run_once(self) -> None:
        """One cycle: publish its snapshot, or after a failure the previous one with the new failure count."""
        try:
            snapshot: Snapshot | None = self.pipeline.step()[0]
        except Exception:  # the daemon must survive any bad cycle
            self.pipeline.failures_total += 1
            log.exception("sampling cycle failed; serving the previous snapshot")
            snapshot = None
        try:
            if snapshot is not None:
                self.holder.publish(snapshot)
            else:
                self.holder.replace(with_sample_failures(self.holder.get(), self.pipeline.failures_total))
        except Exception:
            log.exception("cannot update the served snapshot's failure count")
        finally:
            self.holder.beat()  # failed or not, the sampler is alive
        if self.on_cycle is not None:
            try:
                self.on_cycle()
            except Exception:
                log.exception("cannot report the cycle's state")

    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.run_once()
            self._stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stopping.set()
