"""The health keys of a scenario device (issue 18) as config lines of the fake library.

The keys are the ones exporter/node/scenario_health.py reads (DeviceHealth's field names, plus
``memory_reserved_bytes``); docs/testing.md ("The scenario keys it reads") says what the fake
answers for each. Every key is also a ``not_supported`` name. Bounds are what the NVML call can
carry (an ``unsigned int`` for most), so a value the fake would truncate is refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.exposition.device_fields import DEVICE_FIELDS
from exporter.node.scenario_health import HEALTH_INT_KEYS
from tests.fake_nvml.checks import FakeNvmlError, as_int, as_ratio, as_seq, check_keys

U32 = 2**32 - 1
U64 = 2**64 - 1
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of a 550 driver: links 0..17
MAX_RETIRED_PAGES = 65_535  # the fake hands out one address per page; pynvml allocates 2n + 5

# integer key -> the largest value the fake reports faithfully: every scalar DeviceHealth field, by default
# an unsigned int (NVML's usual out type) or the scenario's own bound (percent, P-state, 0/1 flags)
# where smaller; the entries below differ from that.
OWN_BOUNDS: dict[str, int] = {
    "energy_millijoules": 2**62,  # unsigned long long, room for power x ticks on top
    "retired_pages_single_bit": MAX_RETIRED_PAGES,
    "retired_pages_double_bit": MAX_RETIRED_PAGES,
    "power_violation_nanoseconds": U64,  # nvmlViolationTime_t.violationTime: unsigned long long
}
HEALTH_INTS: dict[str, int] = {
    key: OWN_BOUNDS.get(key, U32 if top is None else min(top, U32)) for key, top in HEALTH_INT_KEYS.items()
}
# the config line's columns after the link index, in order
NVLINK_VALUES = ("active", "tx_kibibytes", "rx_kibibytes", "crc_errors", "replay_errors", "recovery_errors")
NVLINK_KEYS = frozenset({"link", *NVLINK_VALUES})
GPM_KEYS = ("graphics_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active")
# device keys, every one a not_supported name as well; memory_reserved_bytes is per handle (MIG too)
HEALTH_KEYS = frozenset(HEALTH_INTS) | {"memory_reserved_bytes", "nvlinks", "gpm"}



def scalar_values(seed: int = 0) -> dict[str, int]:
    """A value for every integer health key within its bound, distinct where the bound leaves room (a read
    answering its neighbour's value shows): the health fixtures of the tests start from these, so a new
    DeviceHealth field is exercised end to end without a fixture edit, and set by hand only what they assert."""
    values = {}
    for i, (key, top) in enumerate(HEALTH_INTS.items()):
        wide = seed + 10 * (i + 1)
        values[key] = wide if wide <= top else (seed + i) % (top + 1)
    return values



def with_every_health_key(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario ``doc`` with its first device given every integer health key it leaves out (scalar_values):
    what serves a new device field's families (the golden list, the DCGM card fields) with no scenario edit."""
    first, *rest = doc["devices"]
    return {**doc, "devices": [{**scalar_values(), **first}, *rest]}



def _bound(top: int) -> str:
    named = {U32: "2³² \N{MINUS SIGN} 1", U64: "2⁶⁴ \N{MINUS SIGN} 1", 2**62: "2⁶²"}  # as the docs write them
    return named.get(top, f"{top:,}".replace(",", " "))


def keys_markdown() -> str:
    """docs/testing.md's generated table: every integer health key, its bound and the pynvml read answering it."""
    reads = {f.attr.rpartition(".")[2]: f.read for f in DEVICE_FIELDS if f.read}
    rows = [f"| `{key}` | {_bound(top)} | " + (f"`{reads[key]}`" if key in reads else "by hand, below") + " |\n"
            for key, top in HEALTH_INTS.items()]
    return "| key | at most | read through pynvml (`DeviceField.read`) |\n| --- | --- | --- |\n" + "".join(rows)


def health_lines(d: Mapping[str, Any], where: str) -> list[str]:
    """The card-level health lines of device mapping ``d`` (null keys are absent)."""
    lines = [f"{key} {as_int(d[key], f'{where}.{key}', top)}" for key, top in HEALTH_INTS.items()
             if d.get(key) is not None]
    lines.extend(_nvlink_lines(d.get("nvlinks"), f"{where}.nvlinks"))
    lines.extend(gpm_lines(d.get("gpm"), f"{where}.gpm"))
    return lines


def gpm_lines(raw: object, where: str) -> list[str]:
    """A card's (or a MIG device's GPU instance's) ``gpm`` mapping as lines; none for null."""
    if raw is None:
        return []
    gpm = check_keys(raw, frozenset(GPM_KEYS), where)
    # "gpm": GPM-capable, even with no metric given
    return ["gpm", *(f"gpm_metric {key} {as_ratio(gpm[key], f'{where}.{key}')!r}" for key in GPM_KEYS
                     if gpm.get(key) is not None)]


def reserved_lines(d: Mapping[str, Any], where: str) -> list[str]:
    """``memory_reserved_bytes`` of a card or MIG device: at most its ``memory_total_bytes``."""
    if d.get("memory_reserved_bytes") is None:
        return []
    reserved = as_int(d["memory_reserved_bytes"], f"{where}.memory_reserved_bytes", U64)
    total = d.get("memory_total_bytes")
    if isinstance(total, int) and reserved > total:
        raise FakeNvmlError(f"{where}: memory_reserved_bytes exceeds memory_total_bytes")
    used = d.get("memory_used_bytes")
    if isinstance(used, int) and used < reserved:  # v1 'used' includes reserved: v2 would go negative
        raise FakeNvmlError(f"{where}: memory_used_bytes is below memory_reserved_bytes (used includes reserved)")
    return [f"memory_reserved_bytes {reserved}"]


def _nvlink_lines(raw: object, where: str) -> list[str]:
    lines, seen = [], set()
    for i, item in enumerate(as_seq(raw, where)):
        lw = f"{where}[{i}]"
        m = check_keys(item, NVLINK_KEYS, lw)
        for key in ("link", "active"):  # NVML lists a link only through its state: no state, no link
            if m.get(key) is None:
                raise FakeNvmlError(f"{lw}: '{key}' is required")
        link = as_int(m["link"], f"{lw}.link", NVLINK_MAX_LINKS - 1)
        if link in seen:
            raise FakeNvmlError(f"{where}: duplicate link {link}")
        seen.add(link)
        cols = ["NA" if m.get(k) is None else str(as_int(m[k], f"{lw}.{k}", 1 if k == "active" else U64))
                for k in NVLINK_VALUES]
        lines.append(f"nvlink {link} {' '.join(cols)}")
    return lines
