"""The collection loop: the pipeline's cycle on its own thread, every ``interval`` seconds.

:class:`SamplerThread` publishes each cycle's snapshot to a
:class:`~exporter.pipeline.holder.SnapshotHolder`; the HTTP server only ever reads the holder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from exporter.exposition.snapshot import Snapshot
from exporter.pipeline.cycle import Pipeline
from exporter.pipeline.holder import SnapshotHolder

log = logging.getLogger(__name__)


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
        self._failing: str | None = None  # the kind of the failing cycles now: logged once, not per cycle
        self.cycle_started: float | None = None  # monotonic start of the cycle running now, None between cycles
        self.first_done = threading.Event()  # the first cycle ended (good or bad)
        self.after_first: Callable[[], None] | None = None  # run once on this thread after the first cycle
        self.settled = threading.Event()  # the first cycle and after_first ended: the start-up is logged

    def run_once(self) -> None:
        """One cycle: publish its snapshot, or after a failure the previous one with the new failure count."""
        self.cycle_started = time.monotonic()
        try:
            self._cycle()
        finally:
            self.cycle_started = None
            self.first_done.set()

    def starting(self) -> str | None:
        """Why there is no snapshot yet while the first cycle runs (NVML's init is in it), else None."""
        started = self.cycle_started
        if self.first_done.is_set() or started is None:
            return None
        return f"NVML initialising: the first sampling cycle has run for {time.monotonic() - started:.1f}s"

    def _cycle(self) -> None:
        try:
            snapshot: Snapshot | None = self.pipeline.step()[0]
        except Exception as exc:  # the daemon must survive any bad cycle
            self.pipeline.failures_total += 1
            if type(exc).__name__ != self._failing:
                self._failing = type(exc).__name__
                log.exception("sampling cycle failed; serving the previous snapshot until a cycle succeeds")
            snapshot = None
        else:
            if self._failing is not None:
                self._failing = None
                log.info("sampling cycles succeed again (%d failed in all)", self.pipeline.failures_total)
        try:
            if snapshot is not None:
                self.holder.publish(snapshot)
            else:
                self.holder.replace(self.pipeline.failed(self.holder.get()))
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
            if self.after_first is not None:
                after, self.after_first = self.after_first, None
                try:
                    after()
                except Exception:
                    log.exception("starting what follows the first cycle")
            self.settled.set()
            self._stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stopping.set()
