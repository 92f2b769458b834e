"""The status page's data: built once per sampling cycle, served as JSON (``/status.json``) and HTML (``/``).

:func:`build_status` turns one cycle's attribution, sample, exporter counters and the Xid watcher's
counts into an immutable tree (mappings are read-only, lists are tuples) stored on the
:class:`~exporter.exposition.snapshot.Snapshot`. :func:`status_view` makes a plain copy with the
two values that change between cycles (the snapshot's age, the failure count a failed cycle sets on
the served snapshot), each Xid's meaning given a catalog, and the problems: the sampler renders it
once per cycle into the stored page (exporter/exposition/status_page.py), so a request only fills in
the age. Nothing here reads a source; docs/status.md describes the fields.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from exporter.attribution.attribute import (
    ContainerUsage,
    DeviceAttribution,
    NodeAttribution,
    PlacedAllocation,
    ProcessAttribution,
)
from exporter.attribution.utilization import device_utilization, utilization_source
from exporter.exposition.device_fields import DEVICE_FIELDS, ordered, status_value, value
from exporter.exposition.health_rows import decode_clocks_event_reasons
from exporter.exposition.problems import find_problems
from exporter.exposition.rows import ExporterStats
from exporter.model import DeviceHealth, DeviceSample, NodeSample, XidSummary

Status = Mapping[str, Any]


def freeze(value: Any) -> Any:
    """``value`` with every dict read-only and every list a tuple, recursively."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain ``dict``/``list`` copy of a frozen tree."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
    return value


# The keys' order before the device field table (kept: /status.json stays byte for byte); a key the
# table adds follows these, in table order.
_STATUS_ORDER = ("utilization_percent", "memory_utilization_percent", "memory_used_bytes", "memory_total_bytes",
                 "power_watts", "power_limit_watts", "temperature_celsius", "energy_joules")
_STATUS_FIELDS = {f.status: f for f in DEVICE_FIELDS if f.status}
STATUS_KEYS = tuple(ordered(_STATUS_FIELDS, _STATUS_ORDER))
# The card's values (power, temperature, energy, the power limit and capping): once per card, on its entry,
# never repeated on its MIG instances (NVML reads them on the card's handle); the health below likewise.
CARD_KEYS = tuple(k for k in STATUS_KEYS if _STATUS_FIELDS[k].dcgm and all(d.card for d in _STATUS_FIELDS[k].dcgm))
CARD_HEALTH_KEYS = ("clocks_event_reasons", "remapped_rows", "retired_pages", "ecc_errors")


def _device_values(d: DeviceSample) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uuid": d.uuid,
        "model": d.name,
        "minor": d.minor_number,
        "index": d.index,
        "pci_bus_id": d.pci_bus_id,
        "state": "lost" if d.lost else "up",
    }
    for key in STATUS_KEYS:
        f = _STATUS_FIELDS[key]
        out[key] = status_value(f, value(f, d))
    out["clocks_event_reasons"] = None if d.clocks_event_reasons is None else list(
        decode_clocks_event_reasons(d.clocks_event_reasons))
    out["remapped_rows"] = _remapped_rows(d.health)
    out["retired_pages"] = _retired_pages(d.health)
    out["ecc_errors"] = None if d.ecc_corrected_total is None and d.ecc_uncorrected_total is None else {
        "corrected": d.ecc_corrected_total, "uncorrected": d.ecc_uncorrected_total}
    return out


def _retired_pages(h: DeviceHealth) -> dict[str, Any] | None:
    """Retired pages by cause and whether one waits for a reset; ``None`` where NVML has no page retirement."""
    values = (h.retired_pages_single_bit, h.retired_pages_double_bit, h.retired_pages_pending)
    if all(v is None for v in values):
        return None
    return {"single_bit": values[0], "double_bit": values[1], "pending": None if values[2] is None else bool(values[2])}


def _remapped_rows(h: DeviceHealth) -> dict[str, Any] | None:
    """Row-remap state (pending: reset the GPU; failure: replace it); ``None`` when NVML gave none."""
    values = (h.remapped_rows_correctable, h.remapped_rows_uncorrectable, h.remapped_rows_pending,
              h.remapped_rows_failure)
    if all(v is None for v in values):
        return None
    flag = [None if v is None else bool(v) for v in values[2:]]
    return {"correctable": values[0], "uncorrectable": values[1], "pending": flag[0], "failure": flag[1]}


def _container_key(namespace: str, pod: str, container: str) -> tuple[str, str, str]:
    return namespace, pod, container


def _grant_row(a: PlacedAllocation) -> dict[str, Any]:
    return {
        "namespace": a.pod.namespace, "pod": a.pod.name, "container": a.container,
        "allocate_mode": a.allocate_mode, "scheme": a.scheme,
        "grant": {"compute_percent": a.compute_percent, "memory_bytes": a.memory_bytes},
        "use": None,
    }


def _use(u: ContainerUsage) -> dict[str, Any]:
    return {"sm_percent": u.sm_util, "memory_bytes": u.memory_used_bytes}


def _containers(dev: DeviceAttribution, placed: Sequence[PlacedAllocation]) -> list[dict[str, Any]]:
    """The containers holding or using ``dev``: allocations placed on it, with what each one uses."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for a in placed:
        if a.uuid == dev.device.uuid:
            rows.setdefault(_container_key(a.pod.namespace, a.pod.name, a.container), _grant_row(a))
    for u in dev.users:
        key = _container_key(u.pod.namespace, u.pod.name, u.container)
        row = rows.get(key)
        if row is None:
            alloc = u.allocation
            row = rows[key] = {
                "namespace": u.pod.namespace, "pod": u.pod.name, "container": u.container,
                "allocate_mode": dev.mode, "scheme": alloc.scheme if alloc is not None else None,
                "grant": None if alloc is None else {"compute_percent": alloc.compute_percent,
                                                     "memory_bytes": alloc.memory_bytes},
            }
        row["use"] = _use(u)
    return [rows[k] for k in sorted(rows)]


def _process(p: ProcessAttribution, comms: Mapping[int, str]) -> dict[str, Any]:
    return {
        "pid": p.pid, "comm": comms.get(p.pid), "memory_bytes": p.used_memory_bytes, "sm_percent": p.sm_util,
        "namespace": p.pod.namespace if p.pod is not None else None,
        "pod": p.pod.name if p.pod is not None else None,
        "container": p.container,
    }


def _device_entry(dev: DeviceAttribution, placed: Sequence[PlacedAllocation],
                  comms: Mapping[int, str]) -> dict[str, Any]:
    entry = _device_values(dev.device)
    # Where the utilization comes from: NVML's device utilization, a MIG instance's GPM (Hopper and later:
    # its graphics activity), or nowhere (a MIG instance before Hopper): unknown then, never idle.
    entry["utilization_source"] = source = utilization_source(dev.device)
    if entry["utilization_percent"] is None and source == "gpm":
        entry["utilization_percent"] = status_value(_STATUS_FIELDS["utilization_percent"],
                                                    device_utilization(dev.device))
    entry["allocate_mode"] = dev.mode
    entry["containers"] = _containers(dev, placed)
    entry["unaccounted"] = [_process(p, comms) for p in sorted(dev.unaccounted, key=lambda p: p.pid)]
    entry["infrastructure"] = [_process(p, comms) for p in sorted(dev.infrastructure, key=lambda p: p.pid)]
    entry["xids"], entry["last_xid_at"] = [], None
    if dev.device.parent_uuid is not None:
        entry["mig"] = {"profile": dev.device.mig_profile, "gpu_instance_id": dev.device.gpu_instance_id,
                        "compute_instance_id": dev.device.compute_instance_id}
        entry.update(dict.fromkeys((*CARD_KEYS, *CARD_HEALTH_KEYS)))  # the card's: on its entry, once
    return entry


def _parent_entry(child: DeviceSample) -> dict[str, Any]:
    """A MIG card, known only through its instances (which carry the card's values: power, temperature,
    energy, health, its memory total)."""
    entry = _device_values(child)
    model = child.name.split(" MIG ")[0]
    entry.update(uuid=child.parent_uuid, model=model, utilization_percent=None, memory_utilization_percent=None,
                 memory_used_bytes=None, memory_total_bytes=child.card_memory_total_bytes, allocate_mode=None,
                 utilization_source=None,  # a card in MIG mode: its instances carry their own
                 containers=[], unaccounted=[], infrastructure=[], xids=[], last_xid_at=None)
    return entry


def _gpus(attr: NodeAttribution, comms: Mapping[int, str]) -> list[dict[str, Any]]:
    """One entry per physical GPU, its MIG instances in ``instances``."""
    gpus: list[dict[str, Any]] = []
    by_uuid: dict[str, dict[str, Any]] = {}
    cards: set[int] = set()
    for dev in attr.devices:
        d = dev.device
        entry = _device_entry(dev, attr.allocations, comms)
        if d.parent_uuid is None:
            entry.setdefault("instances", [])
            if d.uuid in by_uuid:  # its instances came first
                entry["instances"] = by_uuid[d.uuid]["instances"]
                gpus[gpus.index(by_uuid[d.uuid])] = entry
            else:
                gpus.append(entry)
            by_uuid[d.uuid] = entry
            continue
        parent = by_uuid.get(d.parent_uuid)
        if parent is None:
            parent = by_uuid[d.parent_uuid] = _parent_entry(d) | {"instances": []}
            gpus.append(parent)
            cards.add(id(parent))
        parent["instances"].append(entry)
    for g in gpus:
        if id(g) in cards:  # a card known through its instances (not one NVML listed itself)
            _sum_memory(g)
    return gpus


def _sum_memory(card: dict[str, Any]) -> None:
    """A MIG card's memory in use: its instances' (when each one's is known); ``instances_memory_total_bytes``
    what they were given. Its ``memory_total_bytes`` is the card's own (memory no instance holds included)."""
    used, given = ([i[key] for i in card["instances"]] for key in ("memory_used_bytes", "memory_total_bytes"))
    card["memory_used_bytes"] = None if None in used else sum(used)
    card["instances_memory_total_bytes"] = None if None in given else sum(given)


def _attach_xids(gpus: list[dict[str, Any]], xids: XidSummary) -> list[dict[str, Any]]:
    """Put each Xid count on its GPU (or MIG instance); returns those of no GPU on this page.

    Each entry has its latest time and the pods that raised it (the kernel log names the process)."""
    counts, last = xids.counts, {uuid: at for uuid, (at, _xid) in xids.latest.items()}
    entries = {g["uuid"]: g for g in gpus}
    entries.update({i["uuid"]: i for g in gpus for i in g["instances"]})
    culprits: dict[tuple[str, int], list[dict[str, Any]]] = {}
    seen: dict[tuple[str, int], float] = {}
    for (uuid, xid, ns, pod, ctr), (n, at) in sorted(xids.by_pod.items()):
        seen[(uuid, xid)] = max(seen.get((uuid, xid), at), at)
        if pod:
            culprits.setdefault((uuid, xid), []).append({"namespace": ns, "pod": pod, "container": ctr or None,
                                                         "count": int(n), "last_at": at})
    other: list[dict[str, Any]] = []
    for (uuid, xid), n in sorted(counts.items()):
        target = entries.get(uuid)
        row = {"xid": xid, "count": int(n), "last_at": seen.get((uuid, xid)), "pods": culprits.get((uuid, xid), [])}
        if target is None:
            other.append({"uuid": uuid, **row})
        else:
            target["xids"].append(row)
    for uuid, ts in last.items():
        if uuid in entries:
            entries[uuid]["last_xid_at"] = ts
    return other


def _state(states: Mapping[str, tuple[str, bool | None]], name: str) -> dict[str, Any]:
    text, ok = states.get(name, (None, None))
    return {"state": text, "ok": ok}


def _subsystems(sample: NodeSample, stats: ExporterStats, states: Mapping[str, tuple[str, bool | None]]
                ) -> dict[str, Any]:
    errors = [{"call": call, "error": err, "count": n} for (call, err), n in sorted(sample.errors.items())]
    return {
        "nvml": {"up": sample.nvml_up, "driver_version": sample.driver_version, "errors": errors},
        "pod_cache": {"synced": stats.pod_cache_synced, "age_seconds": stats.pod_cache_age_seconds,
                      "sync_errors": stats.pod_sync_errors_total},
        "sampler": {"samples_total": stats.samples_total, "sample_failures_total": stats.sample_failures_total,
                    "cycle_seconds": sample.duration_seconds},
        "skips": dict(sorted(stats.skips.items())),
        "pod_resources": _state(states, "pod_resources"),
        "kernel_log": _state(states, "kernel_log"),
        "output_failures": dict(sorted(stats.output_failures.items())),
    }


def build_status(attr: NodeAttribution, sample: NodeSample, stats: ExporterStats, xids: XidSummary | None,
                 node_name: str, built_at: float, comms: Mapping[int, str] | None = None,
                 states: Mapping[str, tuple[str, bool | None]] | None = None) -> Status:
    """The status tree of one cycle (immutable); ``xids`` the watcher's counts, None without one.

    ``comms``: the command names /proc gave this cycle's PIDs; ``states``: the pod-resources and kernel
    log sources' (state, ok)."""
    gpus = _gpus(attr, comms or {})
    other_xids = _attach_xids(gpus, xids or XidSummary())
    unplaced = [_grant_row(a) for a in sorted(attr.allocations, key=lambda a: (a.pod.namespace, a.pod.name,
                                                                            a.container)) if not a.uuid]
    return freeze({
        "node": node_name,
        "built_at": built_at,
        "snapshot_age_seconds": 0.0,
        "subsystems": _subsystems(sample, stats, states or {}),
        "gpus": gpus,
        "unplaced": unplaced,
        "other_xids": other_xids,
        "disagreements": dict(sorted(attr.disagreements.items())),
    })


XidCatalog = Callable[[int], Mapping[str, str]]


def status_view(status: Status, failures: int | None, now: float, ready: bool,
                xid_catalog: XidCatalog | None = None) -> dict[str, Any]:
    """What the page shows (rendered once per cycle, status_page.py): a plain copy of ``status`` with its
    age, failure count, Xid meanings and the problems judged at ``now`` (exporter/exposition/problems.py).

    ``failures`` is the served snapshot's count (a failed cycle updates the snapshot, not its status tree).
    """
    if not status:
        return {"ready": False, "node": None, "built_at": None, "snapshot_age_seconds": None, "subsystems": None,
                "gpus": [], "unplaced": [], "other_xids": [], "disagreements": {}, "problems": []}
    view = thaw(status)
    view["ready"] = ready
    view["snapshot_age_seconds"] = max(0.0, now - view["built_at"])
    if failures is not None:
        view["subsystems"]["sampler"]["sample_failures_total"] = failures
    if xid_catalog is not None:
        entries = view["other_xids"] + [x for g in view["gpus"] for x in g["xids"]]
        entries += [x for g in view["gpus"] for i in g["instances"] for x in i["xids"]]
        for x in entries:
            x.update(xid_catalog(x["xid"]))
    # First in the JSON as on the page; judged with the age and the Xid meanings filled in.
    return {"problems": find_problems(view, now), **view}


def status_json(view: Mapping[str, Any]) -> bytes:
    return json.dumps(view, indent=1, sort_keys=False, allow_nan=False, default=_json_default).encode()


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

