"""Kubernetes Events for Xids: dedup into series, a global write rate limit, event bodies.

No I/O here. :class:`EventPlanner` turns occurrences (and the passing of time) into writes
(:class:`CreateEvent`, :class:`PatchSeries`); an :class:`EventsSink` (``exporter.xid.events_writer``)
performs them. The rules:

- Occurrences with the same (node, GPU, Xid, pod) within ``window_seconds`` of the previous one
  form a series: one Event object, whose ``series.count``/``lastObservedTime`` is patched.
- A series is patched at most every ``patch_interval_seconds``; repeats in between only bump the
  in-memory count, so a storm on one key costs one write per interval.
- Every API write takes a token from one global bucket (``burst``, refilled at ``rate`` per
  second). A create without a token is dropped (counted; the metric still counts the Xid). A patch
  without a token stays pending and goes out with a later tick, carrying the full count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from exporter.xid.parse import XidReport, lookup

REPORTING_CONTROLLER = "kube-gpu-exporter.io/xid-watcher"
ACTION = "GPUError"
EVENT_TYPE = "Warning"
EVENT_NAMESPACE = "default"  # where kubelet and node-problem-detector put Node events
# An Event with eventTime about a cluster-scoped object (a Node) is accepted only in these
# (the API server's legacyValidateEvent, pkg/apis/core/validation/events.go; tests/k8s_double).
NODE_EVENT_NAMESPACES = ("default", "kube-system")
REGARDING_NODE = "node"  # every Event is about the Node; the pod, when known, is its `related`
REGARDING_POD = "pod"  # an Xid of a known pod: an Event about the Pod, in its namespace; others the Node's
REGARDING = (REGARDING_NODE, REGARDING_POD)
NOTE_LIMIT_BYTES = 1024  # the API server checks len() of the Go string: bytes
FIELD_LIMIT = 128


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod (and container) whose process raised the Xid."""

    namespace: str
    name: str
    container: str
    uid: str


@dataclass(frozen=True, slots=True)
class XidOccurrence:
    """One Xid with what the watcher resolved about it."""

    node_name: str
    report: XidReport
    uuid: str  # "" when the PCI address maps to no known GPU
    minor_number: int | None
    pod: PodRef | None
    observed: float  # unix seconds the exporter read the record
    kmsg_seq: int | None = None
    kmsg_ts_usec: int | None = None


SeriesKey = tuple[str, str, int, str]


def series_key(occ: XidOccurrence) -> SeriesKey:
    """(node, GPU, Xid, pod): what makes two occurrences "the same" event."""
    gpu = occ.uuid or (occ.report.pci or "")
    return occ.node_name, gpu, occ.report.xid, occ.pod.uid if occ.pod else ""


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """Token bucket: ``burst`` tokens, refilled at ``rate`` per second."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        """A bucket holding ``burst`` tokens at ``now``."""
        return cls(rate, burst, burst, now)

    def take(self, now: float) -> tuple[TokenBucket, bool]:
        """Refill up to ``now`` and take one token if there is one."""
        # A clock that steps back must not mint tokens or drain them.
        tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        updated = max(now, self.updated)
        if tokens >= 1.0:
            return TokenBucket(self.rate, self.burst, tokens - 1.0, updated), True
        return TokenBucket(self.rate, self.burst, tokens, updated), False


@dataclass(frozen=True, slots=True)
class CreateEvent:
    """POST this Event."""

    name: str
    body: dict[str, Any]  # the Event as the API server receives it (JSON)


@dataclass(frozen=True, slots=True)
class PatchSeries:
    """PATCH (merge) the Event's series; ``recreate`` is the full object if it is gone (404)."""

    name: str
    patch: dict[str, Any]
    recreate: dict[str, Any]


EventWrite = CreateEvent | PatchSeries


@dataclass(frozen=True, slots=True)
class WriterCounts:
    """What an :class:`EventsSink` did with the writes it was given."""

    posted: int = 0
    patched: int = 0
    dropped: int = 0  # refused: queue full or sink closed
    failed: int = 0  # gave up after retries, or rejected by the API server
    retries: int = 0  # attempts repeated after a transient failure


class EventsSink(Protocol):
    """Performs event writes without blocking the caller."""

    def submit(self, write: EventWrite) -> bool:
        """Queue a write; ``False`` when it was dropped."""
        ...

    def counts(self) -> WriterCounts:
        """Cumulative outcome counts."""
        ...


def _truncate_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    # Cut on a character boundary, leaving room for the ellipsis (3 bytes in UTF-8).
    return data[: limit - 3].decode("utf-8", "ignore") + "\u2026"


def _micro(ts: float) -> str:
    """MicroTime as the ``kubernetes`` client sent it (``isoformat``, always with microseconds).

    The API server parses MicroTime with a fixed ``.000000`` layout: the fraction is never left out.
    """
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


def micro_time(ts: float) -> str:
    """Kubernetes MicroTime (RFC 3339, microseconds, UTC) for unix seconds ``ts``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_note(occ: XidOccurrence) -> str:
    """Human text: meaning and recommended action first, so truncation only cuts driver text."""
    rep = occ.report
    info = lookup(rep.xid)
    where = [f"PCI {rep.pci}" if rep.pci else "PCI unknown"]
    if occ.minor_number is not None:
        where.insert(0, f"minor {occ.minor_number}")
    if rep.gpu_instance is not None:
        mig = f"MIG GPU-I {rep.gpu_instance}"
        where.append(mig + (f" GPU-CI {rep.compute_instance}" if rep.compute_instance is not None else ""))
    gpu = occ.uuid or "(unknown GPU)"
    parts = [
        f"Xid {rep.xid} ({info.meaning}; severity {info.severity}) on GPU {gpu} ({', '.join(where)}).",
        f"Recommended action: {info.action}.",
    ]
    if rep.recovery_action:
        parts.append(f"Driver recovery action: {rep.recovery_action}.")
    if not rep.numbered:
        parts.append("Reported without an Xid number; counted as Xid 79.")
    if rep.pid:
        proc = f"Process pid {rep.pid}" + (f" ({rep.process_name})" if rep.process_name else "")
        if occ.pod:
            proc += f" in pod {occ.pod.namespace}/{occ.pod.name} container {occ.pod.container}"
        parts.append(proc + ".")
    if rep.message:
        parts.append(f"Driver: {rep.message}")
    if occ.kmsg_seq is not None and occ.kmsg_ts_usec is not None:
        parts.append(f"[kmsg seq {occ.kmsg_seq}, {occ.kmsg_ts_usec / 1e6:.6f} s after boot]")
    return _truncate_bytes(" ".join(parts), NOTE_LIMIT_BYTES)


def event_reason(xid: int) -> str:
    """``NvidiaXid79``: the reason names the code (and matches node-problem-detector rules)."""
    return f"NvidiaXid{xid}"


def reporting_instance(node_name: str) -> str:
    """``kube-gpu-exporter-<node>``, within the API's 128-character limit."""
    return f"kube-gpu-exporter-{node_name}"[:FIELD_LIMIT]


def event_name(node_name: str, xid: int, instance_token: str, serial: int) -> str:
    """A DNS-subdomain name unique per exporter run (``instance_token``) and series (``serial``)."""
    suffix = f".xid{xid}.{instance_token}.{serial:x}"
    return node_name[: 253 - len(suffix)].rstrip(".-") + suffix


def build_event(
    occ: XidOccurrence,
    name: str,
    *,
    first_seen: float,
    series: tuple[int, float] | None = None,
    namespace: str = EVENT_NAMESPACE,
    regarding: str = REGARDING_NODE,
) -> dict[str, Any]:
    """The events.k8s.io/v1 Event (its JSON) for a series that started with ``occ`` at ``first_seen``.

    ``namespace`` holds the Events about the Node; with ``regarding`` "pod" an Xid of a known pod is
    an Event about that Pod, in the pod's namespace (where ``kubectl describe pod`` finds it).
    """
    # Kubelet's convention: a Node's UID in event references is its name.
    node = {"apiVersion": "v1", "kind": "Node", "name": occ.node_name, "uid": occ.node_name}
    pod: dict[str, Any] | None = None
    if occ.pod:
        pod = {"apiVersion": "v1", "kind": "Pod", "namespace": occ.pod.namespace, "name": occ.pod.name,
               "uid": occ.pod.uid}
        if occ.pod.container:
            pod["fieldPath"] = f"spec.containers{{{occ.pod.container}}}"
    about_pod = regarding == REGARDING_POD and pod is not None
    event: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": pod["namespace"] if about_pod and pod else namespace},
        "eventTime": _micro(first_seen),
        "type": EVENT_TYPE,
        "reason": event_reason(occ.report.xid),
        "action": ACTION,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": reporting_instance(occ.node_name),
        "regarding": pod if about_pod else node,
        "note": build_note(occ),
    }
    if pod is not None:
        event["related"] = node if about_pod else pod
    if series:
        event["series"] = {"count": series[0], "lastObservedTime": _micro(series[1])}
    return event


def series_patch(count: int, last_observed: float) -> dict[str, Any]:
    """Merge-patch body refreshing an Event's series."""
    return {"series": {"count": count, "lastObservedTime": micro_time(last_observed)}}


@dataclass(frozen=True, slots=True)
class Series:
    """One Event object and the occurrences folded into it."""

    name: str
    first: XidOccurrence
    first_seen: float
    last_seen: float
    count: int
    written_count: int  # the count the API server has been sent
    last_write: float

    @property
    def dirty(self) -> bool:
        """Occurrences the API server has not been told about."""
        return self.count > self.written_count


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Knobs of the event planner."""

    window_seconds: float = 300.0
    patch_interval_seconds: float = 10.0
    rate: float = 0.1  # writes per second, all series together
    burst: int = 25
    max_series: int = 4096
    namespace: str = EVENT_NAMESPACE  # of the Events about the Node (NODE_EVENT_NAMESPACES)
    regarding: str = REGARDING_NODE  # REGARDING: what an Xid of a known pod is an Event about


def continues(series: Series | None, now: float, cfg: PlannerConfig) -> bool:
    """Whether an occurrence at ``now`` joins ``series`` rather than starting a new Event."""
    return series is not None and now - series.last_seen <= cfg.window_seconds


def patch_due(series: Series, now: float, cfg: PlannerConfig) -> bool:
    """Whether ``series`` has news for the API server and its patch interval has passed."""
    return series.dirty and now - series.last_write >= cfg.patch_interval_seconds


def _patch(series: Series, cfg: PlannerConfig) -> PatchSeries:
    recreate = build_event(
        series.first, series.name, first_seen=series.first_seen,
        series=(series.count, series.last_seen), namespace=cfg.namespace, regarding=cfg.regarding,
    )
    return PatchSeries(series.name, series_patch(series.count, series.last_seen), recreate)


class EventPlanner:
    """Decides event writes; deterministic (time is passed in), no I/O, not thread-safe."""

    def __init__(self, instance_token: str, now: float, cfg: PlannerConfig | None = None) -> None:
        self.cfg = cfg or PlannerConfig()
        self._token = instance_token
        self._bucket = TokenBucket.full(self.cfg.rate, self.cfg.burst, now)
        self._series: dict[SeriesKey, Series] = {}
        self._serial = 0
        self.rate_limited = 0  # writes dropped for want of a token

    def _take(self, now: float) -> bool:
        self._bucket, ok = self._bucket.take(now)
        return ok

    def _finish(self, key: SeriesKey, now: float) -> list[EventWrite]:
        """Close a series: one last patch if it has unsent occurrences."""
        series = self._series.pop(key)
        if not series.dirty:
            return []
        if self._take(now):
            return [_patch(series, self.cfg)]
        self.rate_limited += 1
        return []

    def observe(self, occ: XidOccurrence, now: float) -> list[EventWrite]:
        """Fold one occurrence in; return the writes to perform now."""
        key = series_key(occ)
        series = self._series.get(key)
        writes: list[EventWrite] = []
        if series is not None and not continues(series, now, self.cfg):
            writes += self._finish(key, now)
            series = None
        if series is None:
            if not self._take(now):
                self.rate_limited += 1
                return writes
            if len(self._series) >= self.cfg.max_series:
                oldest = min(self._series, key=lambda k: self._series[k].last_seen)
                writes += self._finish(oldest, now)
            self._serial += 1
            name = event_name(occ.node_name, occ.report.xid, self._token, self._serial)
            self._series[key] = Series(name, occ, now, now, 1, 1, now)
            body = build_event(occ, name, first_seen=now, namespace=self.cfg.namespace,
                               regarding=self.cfg.regarding)
            return [*writes, CreateEvent(name, body)]
        series = dataclasses.replace(series, count=series.count + 1, last_seen=now)
        self._series[key] = series
        if patch_due(series, now, self.cfg) and self._take(now):
            writes.append(_patch(series, self.cfg))
            self._series[key] = dataclasses.replace(series, written_count=series.count, last_write=now)
        return writes

    def tick(self, now: float) -> list[EventWrite]:
        """Send due patches; forget series whose window has passed."""
        writes: list[EventWrite] = []
        for key, series in list(self._series.items()):
            if not continues(series, now, self.cfg):
                writes += self._finish(key, now)
            elif patch_due(series, now, self.cfg) and self._take(now):
                writes.append(_patch(series, self.cfg))
                self._series[key] = dataclasses.replace(series, written_count=series.count, last_write=now)
        return writes

    def flush(self, now: float) -> list[EventWrite]:
        """On shutdown: patch every series with unsent occurrences (still rate limited)."""
        writes: list[EventWrite] = []
        for key in list(self._series):
            writes += self._finish(key, now)
        return writes

    @property
    def open_series(self) -> int:
        """Series currently tracked."""
        return len(self._series)
