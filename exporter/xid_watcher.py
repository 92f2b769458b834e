"""The Xid watcher: a daemon thread reading kmsg records, counting Xids, emitting Events.

Imperative shell around the pure parts (``kmsg``, ``xid``, ``xid_events``). Restart safety: at
:meth:`XidWatcher.start` the records already present (the kernel ring buffer, or a file's current
content) are read as *history*. History only feeds the driver's ``GPU at PCI:...`` map, except the
last ``lookback_seconds`` of it (measured from the newest history record, so the same rule works for
the device and for files); everything after start is counted and reported. ``replay_from_start``
treats a file's whole content as new (tests, replaying a captured log).

Timestamps in the metrics and events are when the exporter read the record (kmsg only carries
time since boot); the kmsg sequence number and boot-relative time are kept in the event note.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.kmsg import KmsgReader, KmsgRecord, parse_record
from exporter.model import EMPTY
from exporter.xid import FALLEN_OFF_BUS_XID, GpuAnnouncement, ScanState, XidReport, normalize_pci, scan_line
from exporter.xid_events import (
    EventPlanner,
    EventsSink,
    EventWrite,
    PlannerConfig,
    PodRef,
    WriterCounts,
    XidOccurrence,
)

log = logging.getLogger(__name__)

BusIdResolver = Callable[[str], "tuple[str, int | None] | None"]
PidResolver = Callable[[int], "tuple[str, str, str, str] | None"]
# (uuid, minor_number, xid, namespace, pod, container); "" / None where unknown.
XidCountKey = tuple[str, int | None, int, str, str, str]

# The driver prints "GPU ... has fallen off the bus" right after the Xid 79 line of the same GPU;
# within this much kmsg time it is the same incident and is not counted twice.
FALLEN_ECHO_WINDOW_USEC = 10_000_000
MAX_HISTORY_RECORDS = 200_000  # a storm while we drain history must not keep start() busy forever
BATCH_RECORDS = 500


@dataclass(frozen=True, slots=True)
class XidStats:
    """What the watcher has seen since it started (immutable snapshot)."""

    xid_counts: Mapping[XidCountKey, int] = field(default_factory=lambda: EMPTY)
    last_xid_time: Mapping[tuple[str, int | None], float] = field(default_factory=lambda: EMPTY)
    records_read: int = 0
    history_skipped: int = 0  # records present at start and not replayed
    skips: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # by reason
    epipe: int = 0
    events_posted: int = 0
    events_patched: int = 0
    events_dropped: int = 0  # rate limited, or the writer's queue was full
    events_failed: int = 0


def is_fallen_echo(report: XidReport, ts_usec: int, last_xid79: Mapping[str, int]) -> bool:
    """Whether a numberless "fallen off the bus" report repeats an Xid 79 just counted."""
    if report.numbered:
        return False
    if report.pci is not None:
        times: Sequence[int] = [last_xid79[report.pci]] if report.pci in last_xid79 else []
    else:
        times = list(last_xid79.values())  # no address: any GPU's fresh Xid 79 explains it
    return any(0 <= ts_usec - t <= FALLEN_ECHO_WINDOW_USEC for t in times)


def replay_start(history: Sequence[KmsgRecord | None], lookback_seconds: float) -> int:
    """Index of the first history record to treat as new: within the lookback of the newest one."""
    if lookback_seconds <= 0:
        return len(history)
    stamps = [r.ts_usec for r in history if r is not None]
    if not stamps:
        return len(history)
    cutoff = max(stamps) - int(lookback_seconds * 1_000_000)
    for i, rec in enumerate(history):
        if rec is not None and rec.ts_usec >= cutoff:
            return i
    return len(history)


def device_pci(rec: KmsgRecord) -> str | None:
    """The record's ``DEVICE=+pci:<addr>`` continuation field, normalised."""
    dev = rec.fields.get("DEVICE", "")
    return normalize_pci(dev[5:]) if dev.startswith("+pci:") else None


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
    return [errors, last, records, skips, epipe, events]


def _minor(minor: int | None) -> str:
    return "" if minor is None else str(minor)


def _sort_key(item: tuple[tuple, object]) -> tuple:
    return tuple("" if v is None else (f"{v:012d}" if isinstance(v, int) else v) for v in item[0])


class XidWatcher:
    """Reads ``kmsg_path`` on a daemon thread; see the module docstring for the restart policy."""

    def __init__(
        self,
        kmsg_path: str,
        node_name: str,
        resolve_bus_id: BusIdResolver,
        resolve_pid: PidResolver,
        events: EventsSink | None,
        *,
        replay_from_start: bool = False,
        lookback_seconds: float = 0,
        clock: Callable[[], float] = time.time,
        event_config: PlannerConfig | None = None,
        poll_interval: float = 0.5,
        opener: Callable[[str], KmsgReader] = KmsgReader.open,
        instance_token: str | None = None,
    ) -> None:
        self.kmsg_path = kmsg_path
        self.node_name = node_name
        self._resolve_bus_id = resolve_bus_id
        self._resolve_pid = resolve_pid
        self._events = events
        self._replay_from_start = replay_from_start
        self._lookback = lookback_seconds
        self._clock = clock
        self._poll_interval = poll_interval
        self._opener = opener
        self._planner = (
            EventPlanner(instance_token or secrets.token_hex(4), clock(), event_config)
            if events is not None
            else None
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader: KmsgReader | None = None
        # Touched by the reading thread (or start() before it runs); counters are guarded by _lock.
        self._scan = ScanState()
        self._gpu_from_log: dict[str, str] = {}
        self._last_xid79: dict[str, int] = {}
        self._counts: Counter[XidCountKey] = Counter()
        self._last_time: dict[tuple[str, int | None], float] = {}
        self._skips: Counter[str] = Counter()
        self._records = 0
        self._history_skipped = 0
        self._epipe = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the source, settle what counts as history, start the reading thread."""
        if self._thread is not None:
            raise RuntimeError("XidWatcher already started")
        self._reader = self._opener(self.kmsg_path)
        replay: list[tuple[bytes, KmsgRecord | None]] = []
        if not self._replay_from_start:
            replay = self._read_history()
        self._thread = threading.Thread(target=self._run, args=(replay,), name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading, hand the final series updates to the sink, close the source."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._planner is not None:
            with self._lock:  # the thread may outlive a join timeout
                writes = self._planner.flush(self._clock())
            self._submit(writes)
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def stats(self) -> XidStats:
        """Snapshot of the counts (thread-safe)."""
        sink = self._events.counts() if self._events is not None else WriterCounts()
        with self._lock:
            rate_limited = self._planner.rate_limited if self._planner is not None else 0
            return XidStats(
                xid_counts=MappingProxyType(dict(self._counts)),
                last_xid_time=MappingProxyType(dict(self._last_time)),
                records_read=self._records,
                history_skipped=self._history_skipped,
                skips=MappingProxyType(dict(self._skips)),
                epipe=self._epipe,
                events_posted=sink.posted,
                events_patched=sink.patched,
                events_dropped=sink.dropped + rate_limited,
                events_failed=sink.failed,
            )

    # ------------------------------------------------------------------ reading

    def _read_history(self) -> list[tuple[bytes, KmsgRecord | None]]:
        """Read what is there now; keep the GPU map from it, return the lookback part to replay."""
        assert self._reader is not None
        raws: list[bytes] = []
        while len(raws) < MAX_HISTORY_RECORDS:
            batch = self._reader.read_available(max_records=MAX_HISTORY_RECORDS - len(raws))
            raws.extend(batch.records)
            self._add(epipe=batch.epipe)
            if batch.drained:
                break
        parsed = [parse_record(raw) for raw in raws]
        first_new = replay_start(parsed, self._lookback)
        for raw, rec in zip(raws[:first_new], parsed[:first_new], strict=True):
            self._handle(raw, rec, live=False)
        self._add(history_skipped=first_new)
        # Replayed on the thread: start() must not wait on the resolvers.
        return list(zip(raws[first_new:], parsed[first_new:], strict=True))

    def _run(self, replay: list[tuple[bytes, KmsgRecord | None]]) -> None:
        assert self._reader is not None
        for raw, rec in replay:
            self._handle_safely(raw, rec)
        while not self._stop.is_set():
            try:
                batch = self._reader.read_available(max_records=BATCH_RECORDS)
            except OSError as err:
                log.warning("reading %s: %s", self.kmsg_path, err)
                self._skip("read_error")
                self._stop.wait(self._poll_interval)
                continue
            self._add(epipe=batch.epipe)
            for raw in batch.records:
                self._handle_safely(raw, parse_record(raw))
            if self._planner is not None:
                with self._lock:
                    writes = self._planner.tick(self._clock())
                self._submit(writes)
            if batch.drained:
                self._idle_wait(self._reader)

    def _idle_wait(self, reader: KmsgReader) -> None:
        # The device can be polled for the next record; a file is re-read after a pause.
        if reader.pollable:
            reader.wait_readable(self._poll_interval)
        else:
            self._stop.wait(self._poll_interval)

    def _handle_safely(self, raw: bytes, rec: KmsgRecord | None) -> None:
        try:
            self._handle(raw, rec, live=True)
        except Exception:  # a bug on one record must not end the watcher
            log.exception("handling kmsg record %r", raw[:200])
            self._skip("internal_error")

    def _handle(self, raw: bytes, rec: KmsgRecord | None, *, live: bool) -> None:
        self._add(records=1)
        if rec is None:
            if raw.strip():
                self._skip("malformed_record")
            return
        if not rec.is_kernel:
            if "NVRM" in rec.text:
                self._skip("not_from_kernel")  # user space can write /dev/kmsg: never trust it
            return
        dev = device_pci(rec)
        for line in rec.text.split("\n"):
            self._scan, found = scan_line(self._scan, line, dev)
            if found is None:
                if "NVRM: Xid" in line:
                    self._skip("malformed_xid_line")
            elif isinstance(found, GpuAnnouncement):
                self._gpu_from_log[found.pci] = found.uuid
            elif live:
                self._on_xid(found, rec)

    # ------------------------------------------------------------------ one Xid

    def _on_xid(self, report: XidReport, rec: KmsgRecord) -> None:
        if is_fallen_echo(report, rec.ts_usec, self._last_xid79):
            self._skip("fallen_off_bus_echo")
            return
        if report.numbered and report.xid == FALLEN_OFF_BUS_XID and report.pci:
            self._last_xid79[report.pci] = rec.ts_usec
        uuid, minor = self._gpu(report.pci)
        pod = self._pod(report.pid)
        now = self._clock()
        key: XidCountKey = (
            uuid, minor, report.xid,
            pod.namespace if pod else "", pod.name if pod else "", pod.container if pod else "",
        )
        writes: list[EventWrite] = []
        with self._lock:
            self._counts[key] += 1
            self._last_time[(uuid, minor)] = now
            if self._planner is not None:
                occ = XidOccurrence(self.node_name, report, uuid, minor, pod, now, rec.seq, rec.ts_usec)
                writes = self._planner.observe(occ, now)
        self._submit(writes)

    def _gpu(self, pci: str | None) -> tuple[str, int | None]:
        if pci is None:
            return "", None
        try:
            found = self._resolve_bus_id(pci)
        except Exception:
            log.exception("resolve_bus_id(%r)", pci)
            self._skip("resolver_error")
            found = None
        if found:
            return found
        return self._gpu_from_log.get(pci, ""), None

    def _pod(self, pid: int | None) -> PodRef | None:
        if not pid or pid <= 0:
            return None  # pid 0 / unknown: the driver had no user process to blame
        try:
            found = self._resolve_pid(pid)
        except Exception:
            log.exception("resolve_pid(%r)", pid)
            self._skip("resolver_error")
            return None
        return PodRef(*found) if found else None

    # ------------------------------------------------------------------ helpers

    def _submit(self, writes: list[EventWrite]) -> None:
        if self._events is None:
            return
        for write in writes:
            self._events.submit(write)  # a refusal is counted by the sink

    def _skip(self, reason: str) -> None:
        with self._lock:
            self._skips[reason] += 1

    def _add(self, *, records: int = 0, epipe: int = 0, history_skipped: int = 0) -> None:
        with self._lock:
            self._records += records
            self._epipe += epipe
            self._history_skipped += history_skipped
