"""Reading the kernel log: history at start (and the lookback to replay), the batch loop, record scanning.

At start the records already present (the kernel ring buffer, or a file's current content) are
*history*: they only feed the driver's ``GPU at PCI:...`` map, except the last ``lookback_seconds``
of it, measured from the newest history record so that the same rule works for the device and for
files. Everything read after that is live.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from exporter.xid.kmsg import KmsgReader, KmsgRecord, parse_record
from exporter.xid.parse import GpuAnnouncement, ScanState, XidReport, normalize_pci, scan_line
from exporter.xid.stats import XidCounters

# The watcher's logger: the split into modules leaves its log lines (and filters on them) as they were.
log = logging.getLogger("exporter.xid.watcher")

MAX_HISTORY_RECORDS = 200_000  # a storm while we drain history must not keep start() busy forever
BATCH_RECORDS = 500

ParsedRecord = tuple[bytes, KmsgRecord | None]  # the raw record and its parse (None: malformed)
XidHandler = Callable[[XidReport, KmsgRecord], None]


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

    def scan(self, raw: bytes, rec: KmsgRecord | None, *, live: bool) -> None:
        """Count the record; pass its Xids on when ``live`` (history only feeds the GPU map)."""
        self._counters.add(records=1)
        if rec is None:
            if raw.strip():
                self._counters.skip("malformed_record")
            return
        if not rec.is_kernel:
            if "NVRM" in rec.text:
                self._counters.skip("not_from_kernel")  # user space can write /dev/kmsg: never trust it
            return
        dev = device_pci(rec)
        for line in rec.text.split("\n"):
            self._scan, found = scan_line(self._scan, line, dev)
            if found is None:
                if "NVRM: Xid" in line:
                    self._counters.skip("malformed_xid_line")
            elif isinstance(found, GpuAnnouncement):
                self.gpu_from_log[found.pci] = found.uuid
            elif live:
                self._on_xid(found, rec)

    def scan_live(self, raw: bytes, rec: KmsgRecord | None) -> None:
        """:meth:`scan` a new record; an exception is logged and counted, never raised."""
        try:
            self.scan(raw, rec, live=True)
        except Exception:  # a bug on one record must not end the watcher
            log.exception("handling kmsg record %r", raw[:200])
            self._counters.skip("internal_error")


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

    def open(self) -> None:
        """Open ``path`` (raises OSError)."""
        assert self.path is not None
        self.reader = self._opener(self.path)

    def close(self) -> None:
        """Close the reader, if open."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def read_history(self, lookback_seconds: float) -> list[ParsedRecord]:
        """Read what is there now; keep the GPU map from it, return the lookback part to replay."""
        assert self.reader is not None
        raws: list[bytes] = []
        while len(raws) < MAX_HISTORY_RECORDS:
            batch = self.reader.read_available(max_records=MAX_HISTORY_RECORDS - len(raws))
            raws.extend(batch.records)
            self._counters.add(epipe=batch.epipe)
            if batch.drained:
                break
        parsed = [parse_record(raw) for raw in raws]
        first_new = replay_start(parsed, lookback_seconds)
        for raw, rec in zip(raws[:first_new], parsed[:first_new], strict=True):
            self._scanner.scan(raw, rec, live=False)
        self._counters.add(history_skipped=first_new)
        # Replayed on the thread: start() must not wait on the resolvers.
        return list(zip(raws[first_new:], parsed[first_new:], strict=True))

    def run(self, replay: list[ParsedRecord], each_round: Callable[[], None]) -> None:
        """The reading thread's body: ``replay``, then batches and ``each_round`` until stopped."""
        for raw, rec in replay:
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
            # A failing kernel log must not stall the NVML source or the Event series updates.
            each_round()
            if failed:
                self._stop.wait(self._poll_interval)
            elif drained:
                self._idle_wait()

    def _idle_wait(self) -> None:
        # The device can be polled for the next record; a file is re-read after a pause.
        # NVML Xids wait for the next round too: they are held for seconds anyway.
        if self.reader is not None and self.reader.pollable:
            self.reader.wait_readable(self._poll_interval)
        else:
            self._stop.wait(self._poll_interval)
