"""Deduplicating Xids (pure): the driver's fallen-off-the-bus echo, and NVML vs kernel-log pairing.

Nothing here reads a clock or takes a lock: times are passed in, and the watcher guards the
:class:`XidDedup` it shares between threads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from exporter.model import EMPTY
from exporter.xid.parse import FALLEN_OFF_BUS_XID, XidReport

# The driver prints "GPU ... has fallen off the bus" right after the Xid 79 line of the same GPU;
# within this much kmsg time it is the same incident and is not counted twice.
FALLEN_ECHO_WINDOW_USEC = 10_000_000
# Older drivers print the numberless "GPU at PCI:<bus>: GPU has fallen off the bus." line twice,
# microseconds apart, for one incident. A second numberless report of the same GPU within this much
# kmsg time is that copy; two real incidents (seconds apart) both count.
FALLEN_REPEAT_WINDOW_USEC = 1_000_000
# An NVML Xid and a kernel-log Xid of the same GPU and code this close in time (as the exporter
# received them) are one incident. Both come from the same driver call; 10 s covers the kmsg poll
# interval and a busy exporter with room to spare, and pairing is one-to-one, so a genuine repeat
# inside the window is still counted (see XidDedup).
NVML_DEDUP_WINDOW_SECONDS = 10.0
MAX_DEDUP_ENTRIES = 10_000  # per side: held NVML Xids / unpaired kernel-log sightings

DedupKey = tuple[str, int]  # (PCI address in the log's form, Xid)
T = TypeVar("T")


def _recent(pci: str | None, ts_usec: int, last: Mapping[str | None, int], window: int) -> bool:
    """Whether ``last`` holds a time of this GPU (any GPU when either has no address) within ``window``."""
    if pci is not None:
        times: Sequence[int] = [t for key in (pci, None) if (t := last.get(key)) is not None]
    else:
        times = list(last.values())  # no address: any GPU's fresh report explains it
    return any(0 <= ts_usec - t <= window for t in times)


def is_fallen_echo(report: XidReport, ts_usec: int, last_xid79: Mapping[str | None, int],
                   last_numberless: Mapping[str | None, int] = EMPTY) -> bool:
    """Whether a numberless "fallen off the bus" report repeats one just counted.

    It repeats a numbered Xid 79 of the same GPU within :data:`FALLEN_ECHO_WINDOW_USEC`, or a
    numberless report of the same GPU within :data:`FALLEN_REPEAT_WINDOW_USEC` (the old drivers' copy).
    """
    if report.numbered:
        return False
    return (_recent(report.pci, ts_usec, last_xid79, FALLEN_ECHO_WINDOW_USEC)
            or _recent(report.pci, ts_usec, last_numberless, FALLEN_REPEAT_WINDOW_USEC))


class FallenEchoFilter:
    """Remembers each GPU's latest counted Xid 79 (kmsg time) to recognise its fallen-off-the-bus echo."""

    def __init__(self) -> None:
        self._last_xid79: dict[str | None, int] = {}
        self._last_numberless: dict[str | None, int] = {}  # counted numberless reports, by GPU

    def is_echo(self, report: XidReport, ts_usec: int) -> bool:
        """True when ``report`` only echoes a fresh fall of its GPU; otherwise note it if it is one."""
        if is_fallen_echo(report, ts_usec, self._last_xid79, self._last_numberless):
            return True
        if report.numbered and report.xid == FALLEN_OFF_BUS_XID and report.pci:
            self._last_xid79[report.pci] = ts_usec
        elif not report.numbered:
            self._last_numberless[report.pci] = ts_usec
        return False


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
