"""The per-device health keys of a scenario (issue 18): parsed into :class:`DeviceHealth`.

The keys are DeviceHealth's own field names, so a scenario reads like the model; ``nvlinks``
and ``gpm`` are a list and a mapping. The same keys drive the fake libnvidia-ml.so.1
(tests/fake_nvml) and every one is also a ``not_supported`` name that blanks only its field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from exporter.model import DeviceHealth, GpmSample, NvLinkSample
from exporter.node.scenario_parse import ScenarioError, as_int, as_list, as_mapping, as_ratio, reject_unknown

# Integer keys and their upper bound (None = any count): percent, P-state, 0/1 flags.
HEALTH_INT_KEYS: dict[str, int | None] = {
    f.name: None for f in fields(DeviceHealth) if f.name not in ("nvlinks", "gpm")
} | {"fan_speed_percent": 100, "performance_state": 15, "retired_pages_pending": 1,
     "remapped_rows_pending": 1, "remapped_rows_failure": 1}
HEALTH_KEYS = frozenset(HEALTH_INT_KEYS) | {"nvlinks", "gpm"}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS: a link index is 0..17
_NVLINK_COUNTERS = ("crc_errors", "replay_errors", "recovery_errors")
NVLINK_KEYS = frozenset({"link", "active", "tx_kibibytes", "rx_kibibytes", *_NVLINK_COUNTERS})
GPM_KEYS = frozenset(f.name for f in fields(GpmSample))
REMAP_KEYS = frozenset({"remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                        "remapped_rows_failure"})


def parse_health(d: Mapping[str, Any], where: str, not_supported: frozenset[str]) -> DeviceHealth:
    """The health keys of device mapping ``d``; an absent (null) key or a not_supported name is None."""
    ints = {k: as_int(d[k], f"{where}.{k}", 0, top) for k, top in HEALTH_INT_KEYS.items() if d.get(k) is not None}
    nvlinks = parse_nvlinks(d.get("nvlinks"), f"{where}.nvlinks")
    gpm = None if d.get("gpm") is None else parse_gpm(d["gpm"], f"{where}.gpm")
    # Validate first, blank after: a not_supported key must still hold a valid value.
    blanked = not_supported & HEALTH_KEYS
    if blanked & REMAP_KEYS:
        blanked |= REMAP_KEYS  # one NVML call (nvmlDeviceGetRemappedRows) answers all four
    for name in blanked:
        if name == "nvlinks":
            nvlinks = ()
        elif name == "gpm":
            gpm = None
        else:
            ints.pop(name, None)
    if ints.keys() & REMAP_KEYS:  # the call answers all four: one left out reads 0, as in the fake
        ints = {**dict.fromkeys(REMAP_KEYS, 0), **ints}
    return DeviceHealth(**ints, nvlinks=nvlinks, gpm=gpm)


def parse_nvlinks(raw: object, where: str) -> tuple[NvLinkSample, ...]:
    """Links in index order, as the backend reads them (0..17, skipping absent links)."""
    links = []
    for i, item in enumerate(as_list(raw, where)):
        lw = f"{where}[{i}]"
        m = as_mapping(item, lw)
        reject_unknown(m, NVLINK_KEYS, lw)
        for key in ("link", "active"):  # NVML lists a link only through its state: no state, no link
            if m.get(key) is None:
                raise ScenarioError(f"{lw}: '{key}' is required")
        v = {k: as_int(m[k], f"{lw}.{k}") for k in NVLINK_KEYS - {"link", "active"} if m.get(k) is not None}
        active = as_int(m["active"], f"{lw}.active", 0, 1)
        links.append(NvLinkSample(
            link=as_int(m["link"], f"{lw}.link", 0, NVLINK_MAX_LINKS - 1),
            active=bool(active),
            tx_bytes=None if "tx_kibibytes" not in v else v["tx_kibibytes"] * 1024,
            rx_bytes=None if "rx_kibibytes" not in v else v["rx_kibibytes"] * 1024,
            **{k: v.get(k) for k in _NVLINK_COUNTERS},
        ))
    numbers = [n.link for n in links]
    if len(set(numbers)) != len(numbers):
        raise ScenarioError(f"{where}: duplicate link")
    return tuple(sorted(links, key=lambda n: n.link))


def parse_gpm(raw: object, where: str) -> GpmSample:
    """GPM ratios 0..1; a metric left out is one the device does not support."""
    m = as_mapping(raw, where)
    reject_unknown(m, GPM_KEYS, where)
    return GpmSample(**{k: as_ratio(m[k], f"{where}.{k}") for k in GPM_KEYS if m.get(k) is not None})


def check_mig_gpm(card: Mapping[str, Any], migs: list[Mapping[str, Any]], where: str) -> None:
    """GPM is the card's capability and each GPU instance's sample: on all MIG devices or none, one per
    instance, none on the MIG card itself (the same rules as the fake NVML's config)."""
    if card.get("gpm") is not None:
        raise ScenarioError(f"{where}: a GPU with mig_devices has its GPM on them (gpm: per MIG device)")
    where = f"{where}.mig_devices"
    given = [m.get("gpm") is not None for m in migs]
    if any(given) and not all(given):
        raise ScenarioError(f"{where}: gpm on every MIG device or on none (GPM is the card's)")
    by_instance: dict[object, object] = {}
    for j, m in enumerate(migs):
        if m.get("gpm") is None:
            continue
        if m.get("gpu_instance_id") is None:
            raise ScenarioError(f"{where}[{j}]: gpm needs gpu_instance_id (GPM is per GPU instance)")
        if by_instance.setdefault(m["gpu_instance_id"], m["gpm"]) != m["gpm"]:
            raise ScenarioError(f"{where}[{j}]: MIG devices of one GPU instance share its gpm")


def energy_at(health: DeviceHealth, power_milliwatts: int | None, elapsed_ticks: int) -> DeviceHealth:
    """The health after ``elapsed_ticks`` 1 s ticks at the configured power (mW x s = mJ).

    ``rate(energy)`` thus equals the configured power; without a power value the counter stands still.
    """
    if health.energy_millijoules is None or not power_milliwatts or elapsed_ticks <= 0:
        return health
    return replace(health, energy_millijoules=health.energy_millijoules + power_milliwatts * elapsed_ticks)
