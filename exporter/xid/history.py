"""Which history records a lookback replays, decided while history streams past (pure).

History is what the kernel log held when the watcher opened it (``KmsgReader`` decides that by
sequence number or file size, never by how many records there are). Of it, only the Xids of the last
``lookback_seconds`` are replayed, measured back from the newest history record on kmsg's own
boot-relative clock: :func:`replay_start` states the rule on a whole list, and :class:`LookbackWindow`
applies the same rule to a stream while keeping only those Xids, so a history of any length is read
in bounded memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")

# At most this many history Xids are replayed: the newest ones of the lookback (a storm inside the
# lookback must not hold the exporter's memory); older ones stay history.
MAX_LOOKBACK_XIDS = 10_000
# Candidate starts of the lookback kept while streaming (records newer than all before them).
# Beyond this the oldest are dropped: the lookback then starts later, never earlier.
MAX_LOOKBACK_STARTS = 100_000


class Stamped(Protocol):
    """Anything with kmsg's boot-relative time (a ``KmsgRecord``)."""

    @property
    def ts_usec(self) -> int: ...


def replay_start(history: Sequence[Stamped | None], lookback_seconds: float) -> int:
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


class LookbackWindow(Generic[T]):
    """:func:`replay_start` on a stream: feed every history record in order with :meth:`add`.

    Keeps the candidate starts (records newer than every record before them, within the lookback of
    the newest so far) and the Xids from the current start on; everything older is dropped as soon
    as the newest record moves the lookback past it.
    """

    def __init__(self, lookback_seconds: float, *, max_xids: int = MAX_LOOKBACK_XIDS,
                 max_starts: int = MAX_LOOKBACK_STARTS) -> None:
        self._span = int(lookback_seconds * 1_000_000) if lookback_seconds > 0 else None
        self._max_xids = max_xids
        self._max_starts = max_starts
        self._count = 0
        self._starts: deque[tuple[int, int]] = deque()  # (index, ts_usec), ts strictly increasing
        self._xids: deque[tuple[int, T]] = deque()  # (index of the record, xid)

    @property
    def active(self) -> bool:
        """Whether there is a lookback at all (without one, no Xid is kept)."""
        return self._span is not None

    @property
    def first_new(self) -> int:
        """Index of the first record the lookback replays (the number of records before it)."""
        return self._starts[0][0] if self._starts else self._count

    def add(self, ts_usec: int | None, xids: Sequence[T] = ()) -> None:
        """The next history record (``None``: unparseable) and the Xids it reported."""
        index = self._count
        self._count += 1
        if self._span is None:
            return  # no lookback: all history stays history
        if ts_usec is not None:
            if not self._starts or self._starts[-1][1] < ts_usec:
                self._starts.append((index, ts_usec))
                if len(self._starts) > self._max_starts:
                    self._starts.popleft()
            cutoff = self._starts[-1][1] - self._span
            while self._starts[0][1] < cutoff:  # the newest start is never below the cutoff
                self._starts.popleft()
        if not self._starts:
            return  # nothing parseable yet: unparseable records before the first one are never new
        first = self._starts[0][0]
        while self._xids and self._xids[0][0] < first:
            self._xids.popleft()
        self._xids.extend((index, x) for x in xids)
        while len(self._xids) > self._max_xids:
            self._xids.popleft()

    def replay(self) -> list[T]:
        """The Xids to treat as new, oldest first."""
        first = self.first_new
        return [x for i, x in self._xids if i >= first]
