"""The truth of the workload board's busy-time and energy row (exporter/bundle/dashboards/workload_usage.py),
computed from a scenario's YAML for tests/test_dashboards_truth.py.

By docs/metrics.md ("Per-container counters"): an exclusive holder is busy as its device and gets
its device's whole power; a share user its SM fraction of both (scaled down together when the
users' SM adds up to more than the device's utilization). A device without utilization (MIG) has
no busy counters; a card without ``energy_millijoules`` no energy counters, and a MIG card's
power is split over its MIG devices by memory. The simulated energy grows by the card's power
each 1 s cycle, so energy rates are watts. Rates come from counters read once a second: values
are compared within 5 % (the staircase of a few seconds of samples), totals only for sign.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

REL = 0.05


def _near(want: float) -> Callable[[float], bool]:
    return lambda got: math.isclose(got, want, rel_tol=REL, abs_tol=1e-6)


def _positive_if(want: float) -> Callable[[float], bool]:
    return (lambda got: got > 0) if want > 0 else (lambda got: got == 0)


def _card_watts(t: Any) -> dict[str, float]:
    """Device uuid -> the energy rate its rows share (W), for cards with an energy counter."""
    out: dict[str, float] = {}
    for card in t.doc["devices"]:
        blank = set(card.get("not_supported") or ())
        if card.get("energy_millijoules") is None or {"energy_millijoules", "power"} & blank:
            continue
        watts = (card.get("power_usage_milliwatts") or 0) / 1000
        migs = card.get("mig_devices") or ()
        if not migs:
            out[card["uuid"]] = watts
            continue
        sizes = [m.get("memory_total_bytes") for m in migs]
        for m, size in zip(migs, sizes, strict=True):
            share = size / sum(sizes) if all(sizes) else 1 / len(migs)
            out[m["uuid"]] = watts * share
    return out


def container_rates(t: Any) -> tuple[dict[int, float], dict[int, float]]:
    """Per container (by id): busy in % of one GPU and power in W, only where it has such counters."""
    watts = _card_watts(t)
    busy: dict[int, float] = {}
    power: dict[int, float] = {}
    for d in t.devices:
        rows = [r for r in t.rows if r.device == d and r.ctr is not None]
        shared = [r for r in rows if r.mode == "share"]
        total = sum(r.duty or 0 for r in shared)
        cap = 100.0 if d.utilization is None else d.utilization
        scale = cap / total if total > cap else 1.0
        for r in rows:
            key = id(r.ctr)
            f = 0.0 if d.utilization is None and r.mode == "share" else (r.duty or 0) * scale / 100
            if d.utilization is not None:
                busy[key] = busy.get(key, 0.0) + (d.utilization if r.mode == "exclusive" else f * 100)
            if d.uuid in watts:
                power[key] = power.get(key, 0.0) + watts[d.uuid] * (1.0 if r.mode == "exclusive" else f)
    return busy, power


def usage_expected(t: Any, cl: dict[str, str], namespace: str, pods: list[Any]) -> dict[str, Any]:
    """The expectations of the row's panels for ``namespace`` and the chosen ``pods`` (the workload's)."""
    busy, power = container_rates(t)
    workloads: dict[str, dict[str, float]] = {"busy": {}, "power": {}}
    for p in t.pods.values():
        if p.ns != namespace:
            continue
        name = f"{p.workload[0]}/{p.workload[1]}"
        for what, rates in (("busy", busy), ("power", power)):
            mine = [rates[id(c)] for c in p.containers if id(c) in rates]
            if mine:
                workloads[what][name] = workloads[what].get(name, 0.0) + sum(mine)

    def per_pod(rates: dict[int, float], scale: float) -> dict[str, float]:
        out = {}
        for p in pods:
            mine = [rates[id(c)] for c in p.containers if id(c) in rates]
            if mine:
                out[p.name] = sum(mine) / scale
        return out

    pod_busy, pod_power = per_pod(busy, 100), per_pod(power, 1)
    rows = []
    for p in pods:
        cols = {}
        if p.name in pod_busy:
            cols["Busy GPU time"] = _positive_if(pod_busy[p.name])
        if p.name in pod_power:
            cols["Energy"] = _positive_if(pod_power[p.name])
        if cols:
            rows.append(({**cl, "node_name": t.node, "pod_name": p.name}, cols))
    return {
        "Busy GPUs by workload": {k: _near(v / 100) for k, v in workloads["busy"].items()},
        "GPU power by workload": {k: _near(v) for k, v in workloads["power"].items()},
        "Busy GPUs by pod": {k: _near(v) for k, v in pod_busy.items()},
        "GPU power by pod": {k: _near(v) for k, v in pod_power.items()},
        "Busy GPU time and energy over the time range": rows,
    }
