"""Sharing configured in a DRA claim: NVIDIA's GpuConfig / MigDeviceConfig -> what each holder is granted. Pure.

NVIDIA's driver (``gpu.nvidia.com``) takes an opaque config per request, ``resource.nvidia.com/v1beta1``
``GpuConfig`` (full GPUs) or ``MigDeviceConfig`` (MIG devices), with ``sharing.strategy`` ``TimeSlicing``
(``timeSlicingConfig.interval``: Default|Short|Medium|Long; GpuConfig only) or ``MPS`` (``mpsConfig``:
``defaultActiveThreadPercentage`` 0-100, ``defaultPinnedDeviceMemoryLimit``, and
``defaultPerDevicePinnedMemoryLimit`` keyed by uuid or by index in the sorted uuids of the config's devices).

Which config a device gets follows the driver's prepare: the configs of ``status.allocation.devices.config``
(the class's first, then the claim's; a later one wins) are searched from the last: the first that names
the result's request applies, else the first without ``requests`` whose kind fits the device. The request
is matched exactly, as the driver does (``<request>/<subrequest>`` results match no config naming the main
request only). MPS limits are the grant of every client of the claim's MPS daemon: each container holding
the device gets the thread percentage and the pinned memory (whole MiB, as the driver writes ``<n>M``).
Time-slicing is a share with no grant.

A claim is written by its author: every list and number is bounded, and a config the driver would refuse
(unknown kind or strategy, a percentage out of 0-100, a limit under 1 MiB, a key naming no device of the
config, a config naming a request of the other device kind) is counted as ``dra_sharing_config_invalid`` and
gives no sharing grant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.attribution.schemes.base import MIB, parse_quantity

DRIVER = "gpu.nvidia.com"
API_VERSION = "resource.nvidia.com/v1beta1"
CONFIG_KINDS = {"GpuConfig": "gpu", "MigDeviceConfig": "mig", "VfioDeviceConfig": "vfio"}  # -> the device type
INTERVALS = frozenset({"Default", "Short", "Medium", "Long"})
MPS, TIME_SLICING = "MPS", "TimeSlicing"
MAX_CONFIGS = 64  # per claim status: DeviceConfigMaxSize (32) of the claim plus its classes' configs
MAX_REQUESTS = 32  # names per config: DeviceRequestsMaxSize
MAX_PER_DEVICE = 32  # per-device limits: no config has more devices than AllocationResultsMaxSize
MAX_KEY = 253
INVALID = "dra_sharing_config_invalid"

Skip = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Sharing:
    """A config's sharing: the strategy and (MPS) its limits; memory in bytes, whole MiB."""

    strategy: str  # MPS | TimeSlicing
    interval: str = ""
    thread_percent: int | None = None
    pinned_default: int | None = None
    pinned_per_device: tuple[tuple[str, int], ...] = ()  # (uuid or index, bytes)


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """One of the driver's configs: the requests it names (none: all), the device type it fits, its sharing."""

    requests: tuple[str, ...]
    kind: str  # gpu | mig | vfio
    sharing: Sharing | None  # None: no sharing set, or one the driver would refuse (counted)


@dataclass(frozen=True, slots=True)
class Grant:
    """What one holder of a device under a sharing config gets: MPS limits, or nothing fixed (time-slicing)."""

    strategy: str
    compute_percent: float | None = None
    memory_bytes: int | None = None


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any, limit: int, skip: Skip) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        skip(INVALID)
    return value[:limit] if isinstance(value, list) else []


def _mib(value: Any) -> int | None:
    """A pinned-memory limit in bytes, cut to whole MiB as the driver does; None when it would refuse it."""
    q = parse_quantity(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    mib = int(q) // MIB if q is not None else 0
    return mib * MIB if mib > 0 else None


def _mps(raw: Any, skip: Skip) -> Sharing | None:
    if raw is None:
        return Sharing(MPS)  # MPS without limits: clients share the device unbounded
    raw = _obj(raw)
    threads = raw.get("defaultActiveThreadPercentage")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= 100):
        return None
    default = raw.get("defaultPinnedDeviceMemoryLimit")
    pinned = _mib(default) if default is not None else None
    if default is not None and pinned is None:
        return None
    per_device = _obj(raw.get("defaultPerDevicePinnedMemoryLimit"))
    if len(per_device) > MAX_PER_DEVICE:
        return None
    limits = []
    for key, value in per_device.items():
        limit = _mib(value)
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY or limit is None:
            return None
        limits.append((key, limit))
    return Sharing(MPS, thread_percent=threads, pinned_default=pinned, pinned_per_device=tuple(sorted(limits)))


def _sharing(raw: Any, kind: str, skip: Skip) -> Sharing | None:
    """A config's ``sharing``; None for none, or (counted) for one the driver would refuse."""
    if raw is None or kind == "vfio":
        return None
    raw = _obj(raw)
    strategy, ts, mps = raw.get("strategy"), raw.get("timeSlicingConfig"), raw.get("mpsConfig")
    out: Sharing | None = None
    if strategy == TIME_SLICING and mps is None and (ts is None or kind == "gpu"):
        interval = _obj(ts).get("interval", "Default")
        out = Sharing(TIME_SLICING, interval=interval) if interval in INTERVALS else None
    elif strategy == MPS and ts is None:
        out = _mps(mps, skip)
    if out is None:
        skip(INVALID)
    return out


def parse_configs(allocated: Any, spec: Any, skip: Skip) -> tuple[DeviceConfig, ...]:
    """The driver's configs of one claim, lowest precedence first.

    ``allocated`` is ``status.allocation.devices.config`` (what the driver reads: the class's and the claim's,
    with their ``source``); ``spec`` is ``spec.devices.config``, read as the claim's own when the status
    copies none (an object from an older writer).
    """
    raw = allocated if isinstance(allocated, list) and allocated else spec
    by_source: dict[str, list[DeviceConfig]] = {"FromClass": [], "FromClaim": []}
    for entry in _list(raw, MAX_CONFIGS, skip):
        entry = _obj(entry)
        opaque = _obj(entry.get("opaque"))
        if opaque.get("driver") != DRIVER:
            continue  # another driver's config (a claim may mix drivers): not ours to judge
        source = entry.get("source", "FromClaim") if raw is allocated else "FromClaim"
        params = _obj(opaque.get("parameters"))
        kind = CONFIG_KINDS.get(params.get("kind", "")) if params.get("apiVersion") == API_VERSION else None
        requests = _list(entry.get("requests"), MAX_REQUESTS, skip)
        if kind is None or source not in by_source or not all(isinstance(r, str) for r in requests):
            skip(INVALID)
            continue
        by_source[source].append(DeviceConfig(tuple(requests), kind, _sharing(params.get("sharing"), kind, skip)))
    return (*by_source["FromClass"], *by_source["FromClaim"])


def select(configs: Sequence[DeviceConfig], request: str, kind: str, skip: Skip) -> int | None:
    """The index of the config the driver applies to one result of ``request`` on a ``kind`` device."""
    for i in range(len(configs) - 1, -1, -1):
        c = configs[i]
        if c.requests:
            if request in c.requests:
                if kind and c.kind != kind:
                    skip(INVALID)  # the driver refuses to prepare the claim
                    return None
                return i
        elif not kind or c.kind == kind:
            return i
    return None


def mps_limits(sharing: Sharing, uuids: Sequence[str], skip: Skip) -> dict[str, int | None]:
    """Each device's pinned-memory limit under one MPS config over ``uuids`` (its devices)."""
    ordered = sorted(uuids)
    limits: dict[str, int | None] = dict.fromkeys(ordered, sharing.pinned_default)
    for key, limit in sharing.pinned_per_device:
        if key in limits:
            limits[key] = limit
        elif key.isdecimal() and len(key) <= 4 and int(key) < len(ordered):
            limits[ordered[int(key)]] = limit
        else:
            skip(INVALID)  # names no device of this config: the driver refuses it
    return limits


def grants(sharing: Sharing, uuids: Sequence[str], memory: Mapping[str, int], skip: Skip) -> dict[str, Grant]:
    """The grant of every holder of each of ``uuids`` (the devices under one config of one claim)."""
    if sharing.strategy != MPS:
        return {u: Grant(TIME_SLICING) for u in uuids}
    compute = float(sharing.thread_percent) if sharing.thread_percent is not None else None
    out = {}
    for uuid, limit in mps_limits(sharing, uuids, skip).items():
        total = memory.get(uuid)
        out[uuid] = Grant(MPS, compute, min(limit, total) if limit is not None and total else limit)
    return out
