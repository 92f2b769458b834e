"""The last published snapshot and the sampler's heartbeat: all the HTTP server ever reads."""

from __future__ import annotations

import threading
import time

from exporter.exposition.snapshot import Snapshot


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
