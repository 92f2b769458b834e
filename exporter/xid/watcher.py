"""The Xid watcher: a daemon thread reading kmsg records, counting Xids, emitting Events.

Imperative shell around the pure parts (``kmsg``, ``xid``, ``xid_events``). Restart safety: at
:meth:`XidWatcher.start` the records already present (the kernel ring buffer, or a file's current
content) are read as *history*. History only feeds the driver's ``GPU at PCI:...`` map, except the
last ``lookback_seconds`` of it (measured from the newest history record, so the same rule works for
the device and for files); everything after start is counted and reported. ``replay_from_start``
treats a file's whole content as new (tests, replaying a captured log).

Timestamps in the metrics and events are when the exporter read the record (kmsg only carries
time since boot); the kmsg sequence number and boot-relative time are kept in the event note.

Optional second source (``nvml_source``, ``exporter.xid.nvml_events``): Xids from NVML events, handed over
through a bounded queue and deduplicated against the kernel log by :class:`XidDedup` on this thread.
The kernel log is the richer source (pid, process -> pod), so it wins: an NVML Xid is held for
``nvml_window_seconds`` and counted (without pod) only if no kernel-log record of the same GPU and
Xid matched it. Without a kmsg path, or when it cannot be opened, NVML alone is counted.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter.model import EMPTY
from exporter.xid.events import (
    EventPlanner,
    EventsSink,
    EventWrite,
    PlannerConfig,
    PodRef,
    WriterCounts,
    XidOccurrence,
)
from exporter.xid.kmsg import KmsgReader, KmsgRecord, parse_record
from exporter.xid.parse import FALLEN_OFF_BUS_XID, GpuAnnouncement, ScanState, XidReport, normalize_pci, scan_line

if TYPE_CHECKING:
    from exporter.xid.nvml_events import NvmlXid, NvmlXidSource

log = logging.getLogger(__name__)

# (log-form PCI address, MIG GPU instance or None) -> (uuid, minor number), None when unknown.
BusIdResolver = Callable[[str, "int | None"], "tuple[str, int | None] | None"]
PidResolver = Callable[[int], "tuple[str, str, str, str] | None"]
# (uuid, minor_number, xid, namespace, pod, container); "" / None where unknown.
XidCountKey = tuple[str, int | None, int, str, str, str]

# The driver prints "GPU ... has fallen off the bus" right after the Xid 79 line of the same GPU;
# within this much kmsg time it is the same incident and is not counted twice.
FALLEN_ECHO_WINDOW_USEC = 10_000_000
# An NVML Xid and a kernel-log Xid of the same GPU and code this close in time (as the exporter
# received them) are one incident. Both come from the same driver call; 10 s covers the kmsg poll
# interval and a busy exporter with room to spare, and pairing is one-to-one, so a genuine repeat
# inside the window is still counted (see XidDedup).
NVML_DEDUP_WINDOW_SECONDS = 10.0
NVML_ONLY_MESSAGE = "(reported by NVML Xid event; no matching kernel log record, so no process or pod)"
NVML_RESULTS = ("counted", "duplicate", "dropped")
MAX_NVML_QUEUE = 10_000  # NVML Xids waiting for the watcher thread; more are dropped (counted)
MAX_DEDUP_ENTRIES = 10_000  # per side: held NVML Xids / unpaired kernel-log sightings
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
    nvml: bool = False  # the NVML source is configured
    nvml_events: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # by result: counted, duplicate, ...
    nvml_held: int = 0  # NVML Xids waiting for a kernel-log record or the end of their window
    nvml_errors: Mapping[tuple[str, str], int] = field(default_factory=lambda: EMPTY)  # (call, error)


def is_fallen_echo(report: XidReport, ts_usec: int, last_xid79: Mapping[str, int]) -> bool:
    """Whether a numberless "fallen off the bus" report repeats an Xid 79 just counted."""
    if report.numbered:
        return False
    if report.pci is not None:
        times: Sequence[int] = [last_xid79[report.pci]] if report.pci in last_xid79 else []
    else:
        times = list(last_xid79.values())  # no address: any GPU's fresh Xid 79 explains it
    return any(0 <= ts_usec - t <= FALLEN_ECHO_WINDOW_USEC for t in times)


DedupKey = tuple[str, int]  # (PCI address in the log's form, Xid)
T = TypeVar("T")


class XidDedup(Generic[T]):
    """Pairs NVML Xids with kernel-log Xids of the same incident (pure; time is passed in).

    An NVML Xid and a kernel-log Xid with the same key whose times differ by at most ``window``
    are one incident. Pairing is one-to-one: each kernel-log record stands for at most one NVML Xid,
    so in a burst that both sources see, the count stays right. The kernel-log record is always
    counted (it has the pod); the NVML Xid is then a duplicate. Either may come first:

    * :meth:`nvml` holds an unpaired NVML Xid; :meth:`due` releases it for counting once its
      window has passed without a kernel-log record;
    * :meth:`kmsg` takes a held NVML Xid it pairs with, or keeps the sighting for a later NVML Xid.

    An NVML Xid without a key (no PCI address) is held and released like any other, unpaired.
    ``max_entries`` bounds each side: beyond it the oldest held Xid is released early and the
    oldest sighting forgotten (a storm then counts some duplicates rather than growing unbounded).
    """

    def __init__(self, window: float = NVML_DEDUP_WINDOW_SECONDS, max_entries: int = MAX_DEDUP_ENTRIES) -> None:
        self.window = window
        self._max = max_entries
        # Per key, in arrival order: held NVML Xids (time, item) and unpaired kernel-log sightings.
        self._held: dict[DedupKey | None, deque[tuple[float, T]]] = {}
        self._seen: dict[DedupKey, deque[float]] = {}
        self._held_count = 0
        self._seen_count = 0

    @property
    def held(self) -> int:
        """NVML Xids waiting for a kernel-log record or the end of their window."""
        return self._held_count

    def kmsg(self, key: DedupKey | None, now: float) -> T | None:
        """A counted kernel-log Xid at ``now``; returns the held NVML Xid it replaces, if any."""
        if key is None:
            return None  # no address: nothing to pair with
        held = self._held.get(key)
        if held:
            for i, (t, item) in enumerate(held):
                if abs(now - t) <= self.window:
                    del held[i]
                    self._held_count -= 1
                    if not held:
                        del self._held[key]
                    return item
        self._seen.setdefault(key, deque()).append(now)
        self._seen_count += 1
        if self._seen_count > self._max:
            oldest = min(self._seen, key=lambda k: self._seen[k][0])
            self._pop_seen(oldest)
        return None

    def nvml(self, key: DedupKey | None, observed: float, item: T) -> bool:
        """An NVML Xid received at ``observed``: False when it pairs with a kernel-log sighting
        (a duplicate, not to be counted), True when it is held."""
        if key is not None:
            while (seen := self._seen.get(key)) and observed - seen[0] > self.window:
                self._pop_seen(key)  # too old to pair with this or any later NVML Xid
            if seen and abs(seen[0] - observed) <= self.window:
                self._pop_seen(key)
                return False
        self._held.setdefault(key, deque()).append((observed, item))
        self._held_count += 1
        return True

    def due(self, now: float) -> list[T]:
        """Held NVML Xids whose window has passed (to count now), oldest first; forgets stale sightings."""
        out: list[tuple[float, T]] = []
        for key in list(self._held):
            held = self._held[key]
            while held and now - held[0][0] > self.window:
                out.append(held.popleft())
            if not held:
                del self._held[key]
        while self._held_count - len(out) > self._max:
            key = min(self._held, key=lambda k: self._held[k][0][0])
            out.append(self._held[key].popleft())
            if not self._held[key]:
                del self._held[key]
        self._held_count -= len(out)
        for key in list(self._seen):
            while key in self._seen and now - self._seen[key][0] > self.window:
                self._pop_seen(key)
        return [item for _, item in sorted(out, key=lambda p: p[0])]

    def drain(self) -> list[T]:
        """Every held NVML Xid, oldest first (at shutdown: nothing can pair with them any more)."""
        out = sorted((p for held in self._held.values() for p in held), key=lambda p: p[0])
        self._held.clear()
        self._held_count = 0
        return [item for _, item in out]

    def _pop_seen(self, key: DedupKey) -> None:
        seen = self._seen[key]
        seen.popleft()
        self._seen_count -= 1
        if not seen:
            del self._seen[key]


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
    families: list[Metric] = [errors, last, records, skips, epipe, events]
    if stats.nvml:
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
        families += [nvml, nvml_errors]
    return families


def _minor(minor: int | None) -> str:
    return "" if minor is None else str(minor)


def _sort_key(item: tuple[tuple, object]) -> tuple:
    return tuple("" if v is None else (f"{v:012d}" if isinstance(v, int) else v) for v in item[0])


class XidWatcher:
    """Reads ``kmsg_path`` (and ``nvml_source``'s Xids) on a daemon thread; see the module docstring."""

    def __init__(
        self,
        kmsg_path: str | None,
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
        nvml_source: NvmlXidSource | None = None,
        nvml_window_seconds: float = NVML_DEDUP_WINDOW_SECONDS,
    ) -> None:
        """``kmsg_path`` None: no kernel log (``nvml_source`` alone). ``nvml_source`` is started and
        stopped with the watcher; give it the same ``clock``."""
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
        self._nvml = nvml_source
        self._nvml_queue: queue.Queue[NvmlXid] = queue.Queue(maxsize=MAX_NVML_QUEUE)
        self._dedup: XidDedup[NvmlXid] = XidDedup(nvml_window_seconds)  # guarded by _lock
        self._nvml_results: Counter[str] = Counter()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the sources, settle what counts as history, start the reading thread.

        Raises OSError when the kmsg path cannot be opened and there is no NVML source; with one,
        the watcher goes on with NVML alone (an unprivileged pod still gets Xids, without pods).
        """
        if self._thread is not None:
            raise RuntimeError("XidWatcher already started")
        if self.kmsg_path is not None:
            try:
                self._reader = self._opener(self.kmsg_path)
            except OSError as e:
                if self._nvml is None:
                    raise
                log.error("cannot read %s (%s): Xids from NVML events only, without pods", self.kmsg_path, e)
                self._skip("read_error")
        if self._nvml is not None:
            self._nvml.start(self.offer_nvml)  # before history: NVML delivers nothing older than this
        replay: list[tuple[bytes, KmsgRecord | None]] = []
        if self._reader is not None and not self._replay_from_start:
            try:
                replay = self._read_history()
            except BaseException:
                # the caller gets no watcher to stop: leave nothing running
                if self._nvml is not None:
                    self._nvml.stop()
                self._reader.close()
                self._reader = None
                raise
        self._thread = threading.Thread(target=self._run, args=(replay,), name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading, count the NVML Xids still held, hand the final series updates to the sink."""
        if self._nvml is not None:
            self._nvml.stop(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                # Nothing can pair with the held NVML Xids any more: they are incidents of their own.
                self._take_nvml()
                with self._lock:
                    held = self._dedup.drain()
                for xid in held:
                    self._count_nvml(xid)
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
                nvml=self._nvml is not None,
                nvml_events=MappingProxyType(dict(self._nvml_results)),
                nvml_held=self._dedup.held,
                nvml_errors=self._nvml.errors() if self._nvml is not None else EMPTY,
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
        for raw, rec in replay:
            self._handle_safely(raw, rec)
        while not self._stop.is_set():
            drained = True
            if self._reader is not None:
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
                drained = batch.drained
            if self._nvml is not None:
                self._nvml_step()
            if self._planner is not None:
                with self._lock:
                    writes = self._planner.tick(self._clock())
                self._submit(writes)
            if drained:
                self._idle_wait(self._reader)

    def _idle_wait(self, reader: KmsgReader | None) -> None:
        # The device can be polled for the next record; a file is re-read after a pause.
        # NVML Xids wait for the next round too: they are held for seconds anyway.
        if reader is not None and reader.pollable:
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
        uuid, minor = self._gpu(report.pci, report.gpu_instance)
        pod = self._pod(report.pid)
        now = self._clock()
        if self._nvml is not None:
            with self._lock:
                replaced = self._dedup.kmsg((report.pci, report.xid) if report.pci else None, now)
            if replaced is not None:
                self._nvml_result("duplicate")  # this record is the same incident, with the pod
        self._record(report, uuid, minor, pod, now, rec.seq, rec.ts_usec)

    def _record(self, report: XidReport, uuid: str, minor: int | None, pod: PodRef | None, observed: float,
                kmsg_seq: int | None = None, kmsg_ts_usec: int | None = None) -> None:
        """Count one Xid and plan its Event."""
        key: XidCountKey = (
            uuid, minor, report.xid,
            pod.namespace if pod else "", pod.name if pod else "", pod.container if pod else "",
        )
        writes: list[EventWrite] = []
        with self._lock:
            self._counts[key] += 1
            self._last_time[(uuid, minor)] = observed
            if self._planner is not None:
                now = self._clock()  # an NVML Xid is planned when counted, after its window
                occ = XidOccurrence(self.node_name, report, uuid, minor, pod, observed, kmsg_seq, kmsg_ts_usec)
                writes = self._planner.observe(occ, now)
        self._submit(writes)

    # ------------------------------------------------------------------ NVML Xids

    def offer_nvml(self, xid: NvmlXid) -> None:
        """The NVML source's handoff (its thread): queue ``xid`` for this watcher's thread."""
        try:
            self._nvml_queue.put_nowait(xid)
        except queue.Full:
            self._nvml_result("dropped")  # the watcher is far behind; never block NVML's thread

    def _nvml_step(self) -> None:
        """Pair queued NVML Xids with kernel-log records; count those whose window has passed."""
        try:
            self._take_nvml()
            with self._lock:
                due = self._dedup.due(self._clock())
            for xid in due:
                self._count_nvml(xid)
        except Exception:  # a bug here must not end the watcher
            log.exception("handling NVML Xids")
            self._skip("internal_error")

    def _take_nvml(self) -> None:
        while True:
            try:
                xid = self._nvml_queue.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                held = self._dedup.nvml((xid.pci, xid.xid) if xid.pci else None, xid.observed, xid)
            if not held:
                self._nvml_result("duplicate")

    def _count_nvml(self, xid: NvmlXid) -> None:
        """An NVML Xid no kernel-log record matched: counted on its own, without pod."""
        self._nvml_result("counted")
        report = XidReport(xid=xid.xid, pci=xid.pci, gpu_instance=xid.gpu_instance,
                           compute_instance=xid.compute_instance, message=NVML_ONLY_MESSAGE)
        uuid, minor = self._gpu(xid.pci, xid.gpu_instance) if xid.pci else ("", None)
        if not uuid:  # the snapshot does not know the address (yet): NVML's own identity
            uuid, minor = xid.uuid, xid.minor_number
        self._record(report, uuid, minor, None, xid.observed)

    def _nvml_result(self, result: str) -> None:
        with self._lock:
            self._nvml_results[result] += 1

    def _gpu(self, pci: str | None, gpu_instance: int | None) -> tuple[str, int | None]:
        if pci is None:
            return "", None
        try:
            found = self._resolve_bus_id(pci, gpu_instance)
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
