"""The Xid watcher: a daemon thread reading kmsg records, counting Xids, emitting Events.

Imperative shell that composes the parts, each testable alone: ``reader`` (history, the reading
loop, record scanning), ``recorder`` (GPU and pod, the NVML handoff, counting, planning),
``dedup`` (fallen-off-the-bus echo, NVML vs kernel-log pairing), ``stats`` (counts, snapshot,
metric families) and ``emitter`` (Event planning and submission).

Restart safety: at :meth:`XidWatcher.start` the records already present (the kernel ring buffer
up to the sequence number current at open, or a file's content at open: never a count of records)
are read as *history*. History only feeds the driver's ``GPU at PCI:...`` map, except the Xids of
the last ``lookback_seconds`` of it (measured from the newest history record, so the same rule
works for the device and for files); everything after start is counted and reported.
``replay_from_start`` treats a file's whole content as new (tests, replaying a captured log).

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
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.model import EMPTY
from exporter.xid.dedup import NVML_DEDUP_WINDOW_SECONDS
from exporter.xid.emitter import EventEmitter
from exporter.xid.events import EventsSink, PlannerConfig
from exporter.xid.kmsg import KmsgReader
from exporter.xid.reader import KmsgFeed, RecordScanner, Replay
from exporter.xid.recorder import BusIdResolver, PidResolver, XidRecorder
from exporter.xid.stats import XidCounters, XidStats

if TYPE_CHECKING:
    from exporter.xid.nvml_events import NvmlXid, NvmlXidSource

log = logging.getLogger(__name__)


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
        self._replay_from_start = replay_from_start
        self._lookback = lookback_seconds
        self._nvml = nvml_source
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # One lock guards the counts, the dedup state and the planner, so stats() is one snapshot.
        self._counters = XidCounters(threading.Lock())
        self._emitter = EventEmitter(events, self._counters.lock, clock,
                                     instance_token=instance_token, config=event_config)
        gpu_from_log: dict[str, str] = {}  # the driver's PCI -> UUID announcements: the scanner writes
        self._recorder = XidRecorder(node_name, resolve_bus_id, resolve_pid, self._counters, self._emitter,
                                     gpu_from_log, clock, nvml=nvml_source is not None,
                                     nvml_window_seconds=nvml_window_seconds)
        scanner = RecordScanner(self._counters, self._recorder.kmsg_xid, gpu_from_log)
        self._feed = KmsgFeed(kmsg_path, scanner, self._counters, self._stop,
                              poll_interval=poll_interval, opener=opener)

    def start(self) -> None:
        """Open the sources, settle what counts as history, start the reading thread.

        Raises OSError when the kmsg path cannot be opened and there is no NVML source; with one,
        the watcher goes on with NVML alone (an unprivileged pod still gets Xids, without pods).
        """
        if self._thread is not None:
            raise RuntimeError("XidWatcher already started")
        if self.kmsg_path is not None:
            try:
                self._feed.open()
            except OSError as e:
                if self._nvml is None:
                    raise
                log.error("cannot read %s (%s): Xids from NVML events only, without pods", self.kmsg_path, e)
                self._counters.skip("read_error")
        if self._nvml is not None:
            self._nvml.start(self.offer_nvml)  # before history: NVML delivers nothing older than this
        replay = Replay()
        if self._feed.reader is not None and not self._replay_from_start:
            try:
                replay = self._feed.read_history(self._lookback)
            except BaseException:
                # the caller gets no watcher to stop: leave nothing running
                if self._nvml is not None:
                    self._nvml.stop()
                self._feed.close()
                raise
        self._thread = threading.Thread(target=self._run, args=(replay,), name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading, count the NVML Xids still held, hand the final series updates to the sink.

        The thread counts the held NVML Xids as it ends. If it has not ended within ``timeout`` (busy
        with a batch, a slow resolver), they are counted here instead: each is taken from the queue
        or the dedup state under the lock, so none is counted twice.
        """
        if self._nvml is not None:
            self._nvml.stop(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._nvml is not None:
                self._drain_nvml()
        self._emitter.flush()
        self._feed.close()

    def stats(self) -> XidStats:
        """Snapshot of the counts (thread-safe)."""
        sink = self._emitter.sink_counts()
        with self._counters.lock:
            return self._counters.snapshot(
                sink=sink,
                rate_limited=self._emitter.rate_limited,
                nvml=self._nvml is not None,
                nvml_held=self._recorder.nvml_held,
                nvml_errors=self._nvml.errors() if self._nvml is not None else EMPTY,
            )

    def offer_nvml(self, xid: NvmlXid) -> None:
        """The NVML source's handoff (its thread): queue ``xid`` for this watcher's thread."""
        self._recorder.offer_nvml(xid)

    def _run(self, replay: Replay) -> None:
        try:
            self._feed.run(replay, self._each_round)
        finally:
            if self._nvml is not None:
                # Nothing can pair with the held NVML Xids any more: they are incidents of their own.
                self._drain_nvml()

    def _drain_nvml(self) -> None:
        try:
            self._recorder.nvml_drain()
        except Exception:  # stop() and the thread's end must not raise
            log.exception("counting the held NVML Xids")
            self._counters.skip("internal_error")

    def _each_round(self) -> None:
        # After each batch (or idle poll): NVML Xids whose window has passed, then due series updates.
        if self._nvml is not None:
            self._recorder.nvml_step()
        self._emitter.tick()
