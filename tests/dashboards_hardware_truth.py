"""The truth of the node board's hardware-health rows (exporter/bundle/dashboards/node_hardware.py),
computed from a scenario's YAML for tests/test_dashboards_truth.py.

Health is the card's: one series per physical GPU (``GPU <minor>``), from the keys on the card's
mapping (a MIG card's devices repeat them). A key that is absent, or listed in ``not_supported``,
gives no series. The simulated counters (PCIe replays, NVLink errors and bytes) stand still, so
their rates are 0; energy grows by the card's power every sampling cycle (one a second here), so
its rate is the power in watts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

REASONS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
           (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
           (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"))  # fmt: skip
# table column header -> scenario key
COLUMNS = {
    "Rows remapped (correctable)": "remapped_rows_correctable",
    "Rows remapped (uncorrectable)": "remapped_rows_uncorrectable",
    "Remap pending": "remapped_rows_pending",
    "Remap failed": "remapped_rows_failure",
    "Retired pages (single-bit)": "retired_pages_single_bit",
    "Retired pages (double-bit)": "retired_pages_double_bit",
    "Retirement pending": "retired_pages_pending",
    "PCIe generation": "pcie_link_generation",
    "PCIe width": "pcie_link_width",
    "PCIe replays": "pcie_replay_count",
}
NVLINK_ERRORS = {"crc": "crc_errors", "replay": "replay_errors", "recovery": "recovery_errors"}


def _reported(card: dict[str, Any]) -> dict[str, Any]:
    """The card's keys that the exporter reports: present, not null, not in ``not_supported``."""
    blank = set(card.get("not_supported") or ())
    return {k: v for k, v in card.items() if v is not None and k not in blank}


def _flag_count(cards: dict[int, dict[str, Any]], key: str) -> dict[str, float]:
    values = [h[key] for h in cards.values() if key in h]
    return {"A": sum(values)} if values else {}


def _per_card(cards: dict[int, dict[str, Any]], key: str, f: Callable[[Any], Any] = lambda v: v,
              suffix: str = "") -> dict[str, Any]:  # fmt: skip
    return {f"GPU {m}{suffix}": f(h[key]) for m, h in cards.items() if key in h}


def _nvlink(cards: dict[int, dict[str, Any]], key: str) -> dict[int, list[Any]]:
    """Per card, the links' values of ``key`` (cards without links, or links without it, left out)."""
    out = {m: [link[key] for link in h.get("nvlinks") or () if link.get(key) is not None] for m, h in cards.items()}
    return {m: v for m, v in out.items() if v}


def _near(watts: float) -> Callable[[float], bool]:
    return lambda v: math.isclose(v, watts, rel_tol=0.25)


def hardware_expected(doc: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """Panel title -> expected series (or, for the table, (labels, row) pairs) of ``doc``'s node.

    ``labels``: the cluster (if any) and node_name labels every table row carries.
    """
    cards = {d["minor_number"]: _reported(d) for d in doc["devices"]}
    uuids = {d["minor_number"]: d["uuid"] for d in doc["devices"]}
    rows = []
    for m, h in cards.items():
        row = {header: h[key] for header, key in COLUMNS.items() if key in h}
        if row:
            rows.append(({**labels, "minor_number": str(m), "card": uuids[m]}, row))
    reasons = {f"GPU {m} {name}": 1 for m, h in cards.items() for bit, name in REASONS
               if name != "gpu_idle" and h.get("clocks_event_reasons", 0) & bit}  # fmt: skip
    up = _nvlink(cards, "active")
    energy = [h["energy_millijoules"] / 1000 for h in cards.values() if "energy_millijoules" in h]
    joules = sum(energy)  # at the first cycle: the counters only grow from there
    return {
        "Row remap pending": _flag_count(cards, "remapped_rows_pending"),
        "Row remap failed": _flag_count(cards, "remapped_rows_failure"),
        "Page retirement pending": _flag_count(cards, "retired_pages_pending"),
        "PCIe replays per GPU": _per_card(cards, "pcie_replay_count", lambda _: 0),
        "PCIe throughput per GPU": {
            **_per_card(cards, "pcie_tx_kilobytes_per_second", lambda v: v * 1024, " TX"),
            **_per_card(cards, "pcie_rx_kilobytes_per_second", lambda v: v * 1024, " RX"),
        },
        "Memory repair and PCIe link per GPU": rows,
        "Clock event reasons": reasons,
        "Power / limit per GPU": {
            f"GPU {m}": h["power_usage_milliwatts"] * 100 / h["power_limit_milliwatts"]
            for m, h in cards.items()
            if "power_limit_milliwatts" in h and "power_usage_milliwatts" in h
        },
        "NVLinks up": {"up": sum(sum(v) for v in up.values()), "links": sum(len(v) for v in up.values())} if up else {},
        "NVLink errors per GPU": {
            f"GPU {m} {kind}": 0 for kind, key in NVLINK_ERRORS.items() for m in _nvlink(cards, key)
        },
        "NVLink throughput per GPU": {
            **{f"GPU {m} TX": 0 for m in _nvlink(cards, "tx_kibibytes")},
            **{f"GPU {m} RX": 0 for m in _nvlink(cards, "rx_kibibytes")},
        },
        "Energy use per GPU": {
            f"GPU {m}": _near(h["power_usage_milliwatts"] / 1000)
            for m, h in cards.items()
            if "energy_millijoules" in h and "power_usage_milliwatts" in h
        },
        "Energy since driver load": {"A": lambda v: v >= joules} if energy else {},
    }
