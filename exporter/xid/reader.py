"""Reading the kernel log: history at start (and the lookback to replay), the batch loop, record scanning.

At start the records already present (the kernel ring buffer, or a file's current content) are
*history*: the reader tells them by sequence number (the device) or by the file's size at open,
never by how many there are. History only feeds the driver's ``GPU at PCI:...`` map, except the
Xids of the last ``lookback_seconds`` of it (``exporter.xid.history``). It is read in batches and
only those Xids are kept, so a history of any length is read in bounded memory. Everything read
after that is live.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.model import EMPTY
from exporter.xid.history import LookbackWindow
from exporter.xid.kmsg import MAX_FILE_HISTORY_BYTES, KmsgReader, KmsgRecord, parse_record
from exporter.xid.parse import GpuAnnouncement, ScanState, XidReport, normalize_pci, scan_line, xid_in_range
from exporter.xid.stats import XidCounters

# The watcher's logger: the split into modules leaves its log lines (and filters on them) as they were.
log = logging.getLogger("exporter.xid.watcher")

BATCH_RECORDS = 500
# The driver announces each GPU once per load; a node has a few dozen PCI addresses at most. More
# distinct ones are not a real node's: the oldest announcement is forgotten.
MAX_GPU_ANNOUNCEMENTS = 1024

ParsedRecord = tuple[bytes, KmsgRecord | None]  # the raw record and its parse (None: malformed)
HistoryXid = tuple[XidReport, KmsgRecord]  # a history Xid to replay, with its record (text dropped)
XidHandler = Callable[[XidReport, KmsgRecord], None]


@dataclass(frozen=True, slots=True)
class Replay:
    """What :meth:`KmsgFeed.read_history` leaves for the watcher's thread."""

    xids: list[HistoryXid] = field(default_factory=list)  # history Xids within the lookback
    live: list[ParsedRecord] = field(default_factory=list)  # new records read with the last history


def device_pci(rec: KmsgRecord) -> str | None:
    """The record's ``DEVICE=+pci:<addr>`` continuation field, normalised."""
    dev = rec.fields.get("DEVICE", "")
    return normalize_pci(dev[5:]) if dev.startswith("+pci:") else None


class RecordScanner:
    """Turns kmsg records into Xid reports for ``on_xid``; keeps the driver's PCI -> UUID announcements.

    Stateful across records (the parser's :class:`ScanState`), so one scanner sees every record in
    order, history first. Used by one thread at a time (``start()``, then the watcher's thread).
    """

    def __init__(self, counters: XidCounters, on_xid: XidHandler, gpu_from_log: dict[str, str]) -> None:
        self._counters = counters
        self._on_xid = on_xid
        self.gpu_from_log = gpu_from_log  # filled here, read by whoever resolves GPUs
        self._scan = ScanState()

    def scan(self, raw: bytes, rec: KmsgRecord | None, *, live: bool) -> list[XidReport]:
        """Count the record and return its Xids; pass them on when ``live`` (history only feeds the GPU map)."""
        self._counters.add(records=1)
        if rec is None:
            if raw.strip():
                self._counters.skip("malformed_record")
            return []
        if rec.truncated:
            self._counters.skip("record_truncated")  # parsed as far as the cap
        if not rec.is_kernel:
            if "NVRM" in rec.text:
                self._counters.skip("not_from_kernel")  # user space can write /dev/kmsg: never trust it
            return []
        dev = device_pci(rec)
        xids: list[XidReport] = []
        for line in rec.text.split("\n"):
            self._scan, found = scan_line(self._scan, line, dev)
            if found is None:
                if "NVRM: Xid" in line:
                    self._counters.skip("malformed_xid_line")
            elif isinstance(found, GpuAnnouncement):
                self._announce(found)
            elif not xid_in_range(found.xid):
                self._counters.skip("xid_out_of_range")  # no series, no Event: the label stays bounded
            elif live:
                self._on_xid(found, rec)
            else:
                xids.append(found)
        return xids

    def scan_live(self, raw: bytes, rec: KmsgRecord | None) -> None:
        """:meth:`scan` a new record; an exception is logged and counted, never raised."""
        try:
            self.scan(raw, rec, live=True)
        except Exception:  # a bug on one record must not end the watcher
            log.exception("handling kmsg record %r", raw[:200])
            self._counters.skip("internal_error")

    def scan_history(self, raw: bytes, rec: KmsgRecord | None) -> list[XidReport]:
        """:meth:`scan` a history record; an exception is logged and counted, never raised."""
        try:
            return self.scan(raw, rec, live=False)
        except Exception:  # a bug on one record must not fail the start
            log.exception("handling kmsg record %r", raw[:200])
            self._counters.skip("internal_error")
            return []

    def replay_xid(self, report: XidReport, rec: KmsgRecord) -> None:
        """Hand on a history Xid within the lookback; an exception is logged and counted, never raised."""
        try:
            self._on_xid(report, rec)
        except Exception:
            log.exception("handling replayed Xid %r", report)
            self._counters.skip("internal_error")

    def _announce(self, found: GpuAnnouncement) -> None:
        self.gpu_from_log.pop(found.pci, None)  # re-announced: now the newest
        self.gpu_from_log[found.pci] = found.uuid
        while len(self.gpu_from_log) > MAX_GPU_ANNOUNCEMENTS:
            del self.gpu_from_log[next(iter(self.gpu_from_log))]


class KmsgFeed:
    """The kernel log source: opens it, splits history from new records, runs the reading loop.

    Without an open reader (no kmsg path, or it could not be opened) the loop still runs its
    per-round work, pausing ``poll_interval`` between rounds.
    """

    def __init__(
        self,
        path: str | None,
        scanner: RecordScanner,
        counters: XidCounters,
        stop: threading.Event,
        *,
        poll_interval: float,
        opener: Callable[[str], KmsgReader],
    ) -> None:
        self.path = path
        self.reader: KmsgReader | None = None
        self._scanner = scanner
        self._counters = counters
        self._stop = stop
        self._poll_interval = poll_interval
        self._opener = opener
        self._truncations = 0  # the reader's, when last logged

    def open(self) -> None:
        """Open ``path`` (raises OSError)."""
        assert self.path is not None
        self.reader = self._opener(self.path)
        self._truncations = 0
        if skipped := getattr(self.reader, "skipped_bytes", 0):
            log.warning("kernel log file %s: its first %d MiB skipped, only the last %d MiB read as history",
                        self.path, skipped >> 20, MAX_FILE_HISTORY_BYTES >> 20)

    def close(self) -> None:
        """Close the reader, if open."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def read_history(self, lookback_seconds: float) -> Replay:
        """Read the records there at open; keep the GPU map from them, return the lookback's Xids to replay.

        Reads until the reader says history is over (not a count of records), batch by batch, and
        keeps only what is replayed: a ring buffer or file of any size is read in bounded memory.
        """
        reader = self.reader
        assert reader is not None
        window: LookbackWindow[HistoryXid] = LookbackWindow(lookback_seconds)
        live: list[ParsedRecord] = []
        while not reader.history_done:
            batch = reader.read_available(max_records=BATCH_RECORDS)
            self._counters.add(epipe=batch.epipe)
            for raw in batch.records[: batch.history]:
                rec = parse_record(raw)
                xids = self._scanner.scan_history(raw, rec)
                if rec is None:
                    window.add(None)
                elif xids and window.active:
                    slim = dataclasses.replace(rec, text="", fields=EMPTY)  # only seq and time are used
                    window.add(rec.ts_usec, [(x, slim) for x in xids])
                else:
                    window.add(rec.ts_usec)
            live.extend((raw, parse_record(raw)) for raw in batch.records[batch.history :])
        self._counters.add(history_skipped=window.first_new)
        # Replayed on the thread: start() must not wait on the resolvers.
        return Replay(window.replay(), live)

    def run(self, replay: Replay, each_round: Callable[[], None]) -> None:
        """The reading thread's body: ``replay``, then batches and ``each_round`` until stopped."""
        for report, rec in replay.xids:
            self._scanner.replay_xid(report, rec)
        for raw, rec in replay.live:
            self._scanner.scan_live(raw, rec)
        while not self._stop.is_set():
            drained, failed = True, False
            reader = self.reader  # stop() may close and clear it from another thread
            if reader is not None:
                try:
                    batch = reader.read_available(max_records=BATCH_RECORDS)
                except (OSError, ValueError) as err:  # ValueError: closed under us by stop()
                    log.warning("reading %s: %s", self.path, err)
                    self._counters.skip("read_error")
                    failed = True
                else:
                    self._counters.add(epipe=batch.epipe)
                    for raw in batch.records:
                        self._scanner.scan_live(raw, parse_record(raw))
                    drained = batch.drained
                    self._check_truncated(reader)
            # A failing kernel log must not stall the NVML source or the Event series updates.
            each_round()
            if failed:
                self._stop.wait(self._poll_interval)
            elif drained:
                self._idle_wait()

    def _check_truncated(self, reader: KmsgReader) -> None:
        truncations = getattr(reader, "truncations", 0)
        if truncations > self._truncations:
            self._truncations = truncations
            log.warning("kernel log file %s was truncated in place (copytruncate): reading it from its new start",
                        self.path)

    def _idle_wait(self) -> None:
        # The device can be polled for the next record; a file is re-read after a pause.
        # NVML Xids wait for the next round too: they are held for seconds anyway.
        if self.reader is not None and self.reader.pollable:
            self.reader.wait_readable(self._poll_interval)
        else:
            self._stop.wait(self._poll_interval)
