"""Recording Xids from both sources: resolve GPU and pod, pair NVML with the kernel log, count, plan Events.

The kernel log is the richer source (pid, process -> pod), so it wins: an NVML Xid is held for the
dedup window and counted (without pod) only if no kernel-log record of the same GPU and Xid
matched it. NVML Xids arrive on the NVML thread and are handed over through a bounded queue, so
that all pairing happens on the watcher's thread.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from exporter.xid.dedup import NVML_DEDUP_WINDOW_SECONDS, FallenEchoFilter, XidDedup
from exporter.xid.emitter import EventEmitter
from exporter.xid.events import EventWrite, PodRef, XidOccurrence
from exporter.xid.kmsg import KmsgRecord
from exporter.xid.parse import XidReport, xid_in_range
from exporter.xid.stats import XidCounters, XidCountKey

if TYPE_CHECKING:
    from exporter.xid.nvml_events import NvmlXid

# The watcher's logger: the split into modules leaves its log lines (and filters on them) as they were.
log = logging.getLogger("exporter.xid.watcher")

# (log-form PCI address, MIG GPU instance or None) -> (uuid, minor number), None when unknown.
BusIdResolver = Callable[[str, "int | None"], "tuple[str, int | None] | None"]
PidResolver = Callable[[int], "tuple[str, str, str, str] | None"]

NVML_ONLY_MESSAGE = "(reported by NVML Xid event; no matching kernel log record, so no process or pod)"
MAX_NVML_QUEUE = 10_000  # NVML Xids waiting for the watcher thread; more are dropped (counted)


class XidRecorder:
    """Turns Xid reports into counts and Events; runs on the watcher's thread except :meth:`offer_nvml`.

    ``gpu_from_log`` is the driver's own PCI -> UUID map from the kernel log, the fallback when
    ``resolve_bus_id`` does not know an address. With ``nvml`` False no NVML Xids are expected and
    kernel-log Xids are not kept for pairing.
    """

    def __init__(
        self,
        node_name: str,
        resolve_bus_id: BusIdResolver,
        resolve_pid: PidResolver,
        counters: XidCounters,
        emitter: EventEmitter,
        gpu_from_log: Mapping[str, str],
        clock: Callable[[], float],
        *,
        nvml: bool = False,
        nvml_window_seconds: float = NVML_DEDUP_WINDOW_SECONDS,
    ) -> None:
        self.node_name = node_name
        self._resolve_bus_id = resolve_bus_id
        self._resolve_pid = resolve_pid
        self._counters = counters
        self._lock = counters.lock  # one lock for the counts, the dedup state and the planner
        self._emitter = emitter
        self._gpu_from_log = gpu_from_log
        self._clock = clock
        self._echo = FallenEchoFilter()
        self._nvml = nvml
        self._nvml_queue: queue.Queue[NvmlXid] = queue.Queue(maxsize=MAX_NVML_QUEUE)
        self._dedup: XidDedup[NvmlXid] = XidDedup(nvml_window_seconds)  # guarded by _lock

    @property
    def nvml_held(self) -> int:
        """NVML Xids waiting for a kernel-log record or the end of their window (caller holds the lock)."""
        return self._dedup.held

    # ------------------------------------------------------------------ kernel log

    def kmsg_xid(self, report: XidReport, rec: KmsgRecord) -> None:
        """A live kernel-log Xid: counted unless it echoes an Xid 79; absorbs a held NVML Xid it pairs with."""
        if self._echo.is_echo(report, rec.ts_usec):
            self._counters.skip("fallen_off_bus_echo")
            return
        uuid, minor = self._gpu(report.pci, report.gpu_instance)
        pod = self._pod(report.pid)
        now = self._clock()
        if self._nvml:
            with self._lock:
                replaced = self._dedup.kmsg((report.pci, report.xid) if report.pci else None, now)
            if replaced is not None:
                self._counters.nvml_result("duplicate")  # this record is the same incident, with the pod
        self._record(report, uuid, minor, pod, now, rec.seq, rec.ts_usec)

    # ------------------------------------------------------------------ NVML

    def offer_nvml(self, xid: NvmlXid) -> None:
        """The NVML source's handoff (its thread): queue ``xid`` for the watcher's thread."""
        if not xid_in_range(xid.xid):
            self._counters.skip("xid_out_of_range")  # NVML's event data is any 64-bit number
            return
        try:
            self._nvml_queue.put_nowait(xid)
        except queue.Full:
            self._counters.nvml_result("dropped")  # the watcher is far behind; never block NVML's thread

    def nvml_step(self) -> None:
        """Pair queued NVML Xids with kernel-log records; count those whose window has passed."""
        try:
            self._take_nvml()
            with self._lock:
                due = self._dedup.due(self._clock())
            for xid in due:
                self._count_nvml(xid)
        except Exception:  # a bug here must not end the watcher
            log.exception("handling NVML Xids")
            self._counters.skip("internal_error")

    def nvml_drain(self) -> None:
        """Count every queued and held NVML Xid (at shutdown: nothing can pair with them any more)."""
        self._take_nvml()
        with self._lock:
            held = self._dedup.drain()
        for xid in held:
            self._count_nvml(xid)

    def _take_nvml(self) -> None:
        while True:
            try:
                xid = self._nvml_queue.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                held = self._dedup.nvml((xid.pci, xid.xid) if xid.pci else None, xid.observed, xid)
            if not held:
                self._counters.nvml_result("duplicate")

    def _count_nvml(self, xid: NvmlXid) -> None:
        """An NVML Xid no kernel-log record matched: counted on its own, without pod."""
        self._counters.nvml_result("counted")
        report = XidReport(xid=xid.xid, pci=xid.pci, gpu_instance=xid.gpu_instance,
                           compute_instance=xid.compute_instance, message=NVML_ONLY_MESSAGE)
        uuid, minor = self._gpu(xid.pci, xid.gpu_instance) if xid.pci else ("", None)
        if not uuid:  # the snapshot does not know the address (yet): NVML's own identity
            uuid, minor = xid.uuid, xid.minor_number
        self._record(report, uuid, minor, None, xid.observed)

    # ------------------------------------------------------------------ both sources

    def _record(self, report: XidReport, uuid: str, minor: int | None, pod: PodRef | None, observed: float,
                kmsg_seq: int | None = None, kmsg_ts_usec: int | None = None) -> None:
        """Count one Xid and plan its Event."""
        key: XidCountKey = (
            uuid, minor, report.xid,
            pod.namespace if pod else "", pod.name if pod else "", pod.container if pod else "",
        )
        writes: list[EventWrite] = []
        with self._lock:  # the count and its plan in one step, so a snapshot never sees one without the other
            self._counters.count_xid(key, observed, report.gpu_instance)
            if self._emitter.enabled:
                occ = XidOccurrence(self.node_name, report, uuid, minor, pod, observed, kmsg_seq, kmsg_ts_usec)
                writes = self._emitter.observe(occ)
        self._emitter.submit(writes)

    def _gpu(self, pci: str | None, gpu_instance: int | None) -> tuple[str, int | None]:
        if pci is None:
            return "", None
        try:
            found = self._resolve_bus_id(pci, gpu_instance)
        except Exception:
            log.exception("resolve_bus_id(%r)", pci)
            self._counters.skip("resolver_error")
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
            self._counters.skip("resolver_error")
            return None
        return PodRef(*found) if found else None
