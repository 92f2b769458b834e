"""Per-container GPU busy seconds and energy, integrated cycle by cycle (docs/metrics.md).

Pure: :func:`advance` takes the previous :class:`UsageCounters`, one cycle's attribution and its
sample, and returns the next counters; the pipeline keeps the value between cycles. The rules:

1. A period is the time between two samples (``dt``). The first cycle accrues nothing; a period
   that is not positive or is longer than ``max_period`` (a clock step, a stalled sampler) accrues
   nothing either and is counted (``usage_period_backwards`` / ``usage_period_too_long``): usage is
   never invented for time nobody watched.
2. Busy seconds: a device accrues ``utilization / 100 * dt`` (``device_utilization``: NVML's, on a MIG
   device its GPU instance's GPM graphics activity). Its containers split that by the
   SM values the duty-cycle rows carry: the exclusive holder gets the device's; on a shared device
   each user ``sm / 100 * dt``, scaled down together when their sum exceeds the device's utilization.
   The rest goes to the unattributed row (empty namespace, pod, container): rows + unattributed ==
   device. A device without utilization (MIG devices without GPM, NotSupported, lost) has no busy rows.
3. Energy: the card's ``energy_millijoules`` delta since the previous cycle. The exclusive holder
   gets all of it (idle power included: the GPU is its alone); on a shared device each user the
   same SM fraction as in rule 2 and the rest (idle power, unattributed processes) goes to the
   unattributed row; with no users all of it does. An unreadable reading after a readable one
   (``usage_energy_unreadable``) or a decrease (driver reload, GPU reset: ``usage_energy_reset``)
   skips that period and re-baselines.
4. MIG: energy is read per card, and a card's delta is split over its MIG devices in proportion
   to their memory slices (equally if a size is unknown), then within each MIG device by rule 3.
   MIG devices report no per-process utilization, so a shared MIG device's energy stays unattributed.
5. State stays bounded: a row (or device) absent from the attribution keeps its value for
   :data:`RETAIN_CYCLES` cycles (a scrape between still sees its last increase; a blip does not
   reset it) and is then dropped. At most ``(RETAIN_CYCLES + 1) x rows per cycle`` rows are held.
   A restarted exporter starts from zero; ``rate()`` treats that as a counter reset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.attribution.attribute import (
    EXCLUSIVE,
    SHARE,
    ContainerUsage,
    DeviceAttribution,
    NodeAttribution,
)
from exporter.attribution.utilization import device_utilization
from exporter.model import EMPTY, DeviceSample, NodeSample

# (uuid, minor_number, name, namespace, pod, container): one counter row's label values; "" pod
# labels = the device's unattributed remainder.
RowKey = tuple[str, str, str, str, str, str]
DeviceKey = tuple[str, str, str]  # (uuid, minor_number, name)
SeenKey = tuple[str, tuple[str, ...]]  # (table: busy | energy | device, its key)
RETAIN_CYCLES = 120  # two minutes at the default 1 s interval: longer than any sane scrape interval
MAX_PERIOD_INTERVALS = 5  # a period longer than this many sampling intervals is a gap, not usage
DEFAULT_INTERVAL = 1.0  # seconds: the exporter's --interval default


def _none() -> Mapping:
    return EMPTY


@dataclass(frozen=True, slots=True)
class UsageCounters:
    """Cumulative busy seconds and joules per row since the exporter started (immutable)."""

    timestamp: float | None = None  # the last sample's; None before the first cycle
    cycle: int = 0
    busy: Mapping[RowKey, float] = field(default_factory=_none)  # container and unattributed rows, seconds
    energy: Mapping[RowKey, float] = field(default_factory=_none)  # container and unattributed rows, joules
    device_busy: Mapping[DeviceKey, float] = field(default_factory=_none)  # per device, seconds
    energy_mj: Mapping[str, int | None] = field(default_factory=_none)  # card uuid -> last mJ (None: unreadable)
    seen: Mapping[SeenKey, int] = field(default_factory=_none)  # -> the last cycle it was present
    skips: Mapping[str, int] = field(default_factory=_none)  # skipped periods of the last cycle, by reason

    def held(self) -> int:
        """Rows and devices held: what the retention bound limits."""
        return len(self.seen)


def _device_key(d: DeviceSample) -> DeviceKey:
    return d.uuid, "" if d.minor_number is None else str(d.minor_number), d.name


def _row(dk: DeviceKey, u: ContainerUsage | None) -> RowKey:
    return (*dk, "", "", "") if u is None else (*dk, u.pod.namespace, u.pod.name, u.container)


def sm_fractions(da: DeviceAttribution, skips: dict[str, int] | None = None) -> list[tuple[ContainerUsage, float]]:
    """Each share user's fraction of the device's time: ``sm / 100``, scaled so they sum to at most
    the device's utilization (100 when unknown). Exclusive and unheld devices have none."""
    if da.mode != SHARE or not da.users:
        return []
    util = device_utilization(da.device)
    if skips is not None and util is not None and any(u.sm_util is None for u in da.users):
        _count(skips, "usage_sm_unknown")  # unknown is not idle: its part stays unattributed
    raw = [(u, (u.sm_util or 0.0) / 100) for u in da.users]
    total = sum(f for _, f in raw)
    cap = (100.0 if util is None else float(util)) / 100
    scale = cap / total if total > cap else 1.0
    return [(u, f * scale) for u, f in raw]


def _count(skips: dict[str, int], reason: str) -> None:
    skips[reason] = skips.get(reason, 0) + 1


def _period(before: float | None, now: float, max_period: float, skips: dict[str, int]) -> float | None:
    """The period to accrue, or None (first cycle, or a skipped period: rule 1)."""
    if before is None:
        return None
    dt = now - before
    if dt <= 0:
        _count(skips, "usage_period_backwards")
        return None
    if dt > max_period:
        _count(skips, "usage_period_too_long")
        return None
    return dt


def _card(d: DeviceSample) -> str:
    return d.parent_uuid or d.uuid


def energy_deltas(prev: Mapping[str, int | None], devices: Iterable[DeviceSample], accrue: bool,
                  skips: dict[str, int]) -> tuple[dict[str, float], dict[str, int | None]]:
    """Joules per device uuid this period (0.0 where only a baseline was taken), and the new readings.

    Devices absent from the result have no readable energy this cycle (rule 3); a card's delta is
    split over its MIG devices by memory slice (rule 4).
    """
    cards: dict[str, list[DeviceSample]] = {}
    for d in devices:
        cards.setdefault(_card(d), []).append(d)
    out: dict[str, float] = {}
    readings: dict[str, int | None] = {}
    for card, devs in cards.items():
        now = next((d.health.energy_millijoules for d in devs if d.health.energy_millijoules is not None), None)
        before = prev.get(card)
        readings[card] = now
        if now is None:
            if before is not None:
                _count(skips, "usage_energy_unreadable")
            continue
        delta = 0.0
        if before is not None and accrue:
            if now < before:
                _count(skips, "usage_energy_reset")
            else:
                delta = (now - before) / 1000  # mJ -> J
        for d, w in zip(devs, _slices(devs), strict=True):
            out[d.uuid] = delta * w
    return out, readings


def _slices(devs: list[DeviceSample]) -> list[float]:
    """Each MIG device's part of its card (memory slice), or 1.0 for a whole GPU."""
    if len(devs) == 1:
        return [1.0]
    sizes = [d.memory_total_bytes for d in devs]
    if any(s is None or s <= 0 for s in sizes):
        return [1.0 / len(devs)] * len(devs)
    total = float(sum(s for s in sizes if s is not None))
    return [(s or 0) / total for s in sizes]


def advance(prev: UsageCounters, attr: NodeAttribution, sample: NodeSample,
            max_period: float = MAX_PERIOD_INTERVALS * DEFAULT_INTERVAL) -> UsageCounters:
    """The counters after one more cycle (rules in the module docstring); ``max_period`` in seconds."""
    cycle = prev.cycle + 1
    skips: dict[str, int] = {}
    dt = _period(prev.timestamp, sample.timestamp, max_period, skips)
    joules, readings = energy_deltas(prev.energy_mj, (da.device for da in attr.devices), dt is not None, skips)
    busy, energy, device_busy = dict(prev.busy), dict(prev.energy), dict(prev.device_busy)
    seen = dict(prev.seen)
    for da in attr.devices:
        d = da.device
        dk = _device_key(d)
        fractions = sm_fractions(da, skips)
        if (util := device_utilization(d)) is not None:
            total = util / 100 * (dt or 0.0)
            device_busy[dk] = device_busy.get(dk, 0.0) + total
            seen[("device", dk)] = cycle
            if da.mode == EXCLUSIVE:
                parts = [(u, total) for u in da.users]
            else:
                parts = [(u, f * (dt or 0.0)) for u, f in fractions]
            _split(busy, seen, "busy", dk, parts, total, cycle)
        if d.uuid in joules:
            delta = joules[d.uuid]
            parts = [(u, delta) for u in da.users] if da.mode == EXCLUSIVE else [(u, f * delta) for u, f in fractions]
            _split(energy, seen, "energy", dk, parts, delta, cycle)
    stale = {k for k, last in seen.items() if cycle - last > RETAIN_CYCLES}
    tables: dict[str, dict] = {"busy": busy, "energy": energy, "device": device_busy}
    for table, key in stale:
        del seen[(table, key)]
        tables[table].pop(key, None)
    return UsageCounters(sample.timestamp, cycle, MappingProxyType(busy), MappingProxyType(energy),
                         MappingProxyType(device_busy), MappingProxyType(readings), MappingProxyType(seen),
                         MappingProxyType(skips))


def _split(rows: dict[RowKey, float], seen: dict[SeenKey, int], table: str, dk: DeviceKey,
           parts: list[tuple[ContainerUsage, float]], total: float, cycle: int) -> None:
    """Add each user's part to its row and the rest of ``total`` to the unattributed row (never negative)."""
    given = 0.0
    for u, amount in parts:
        key = _row(dk, u)
        rows[key] = rows.get(key, 0.0) + amount
        seen[(table, key)] = cycle
        given += amount
    rest = _row(dk, None)
    rows[rest] = rows.get(rest, 0.0) + max(0.0, total - given)
    seen[(table, rest)] = cycle
