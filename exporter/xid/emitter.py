"""Event planning and submission glue: :class:`~exporter.xid.events.EventPlanner` in, sink writes out."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable

from exporter.xid.events import EventPlanner, EventsSink, EventWrite, PlannerConfig, WriterCounts, XidOccurrence


class EventEmitter:
    """Plans the Events of counted Xids and hands the writes to ``events``; inert when that is None.

    The planner is guarded by ``lock`` (the watcher's, shared with the counters) because the reading
    thread ticks it while ``stop()`` may flush it after a join timeout. Writes are submitted outside
    the lock: the sink never blocks, but it has its own lock.
    """

    def __init__(
        self,
        events: EventsSink | None,
        lock: threading.Lock,
        clock: Callable[[], float],
        *,
        instance_token: str | None = None,
        config: PlannerConfig | None = None,
    ) -> None:
        self._events = events
        self._lock = lock
        self._clock = clock
        self._planner = (
            EventPlanner(instance_token or secrets.token_hex(4), clock(), config) if events is not None else None
        )

    @property
    def enabled(self) -> bool:
        """Whether Events are planned at all (there is a sink)."""
        return self._planner is not None

    @property
    def rate_limited(self) -> int:
        """Writes the planner dropped for want of a token (caller holds the lock)."""
        return self._planner.rate_limited if self._planner is not None else 0

    def observe(self, occ: XidOccurrence) -> list[EventWrite]:
        """Plan the writes for one counted Xid, now (caller holds the lock; only when :attr:`enabled`)."""
        assert self._planner is not None
        # Planned when counted: for an NVML Xid that is after its dedup window, not when it was seen.
        return self._planner.observe(occ, self._clock())

    def tick(self) -> None:
        """Submit the writes that have come due (series updates after a quiet spell)."""
        if self._planner is not None:
            with self._lock:
                writes = self._planner.tick(self._clock())
            self.submit(writes)

    def flush(self) -> None:
        """Submit every pending series update (at shutdown)."""
        if self._planner is not None:
            with self._lock:  # the thread may outlive a join timeout
                writes = self._planner.flush(self._clock())
            self.submit(writes)

    def submit(self, writes: list[EventWrite]) -> None:
        """Hand ``writes`` to the sink."""
        if self._events is None:
            return
        for write in writes:
            self._events.submit(write)  # a refusal is counted by the sink

    def sink_counts(self) -> WriterCounts:
        """What the sink did with the writes (zeros without a sink)."""
        return self._events.counts() if self._events is not None else WriterCounts()
