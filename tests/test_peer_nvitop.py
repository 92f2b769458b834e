"""The peer: ``nvitop-exporter`` from PyPI, run unchanged on the fake libnvidia-ml.so.1.

nvitop reads NVML through its own wrappers over pynvml, with calls the exporter does not make
(MemoryInfo_v2, MIG mode, field values, fan speed, power limit, PCIe throughput) and its own
utilization protocol (samples newer than one second ago, in epoch microseconds). Its gauges
must equal the scenario: the fake serves a third-party consumer, not only our backend.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.integration_support import (
    EXAMPLES,
    Key,
    load_scenario_dict,
    nvitop_exporter,
    scenario_pids,
    select,
)

pytestmark = pytest.mark.e2e  # every test here builds the fake NVML library (gcc)

READY_S = 30.0  # startup of a Python process on a loaded 2-core CI box
SETTLE_S = 20.0
MIB = 1 << 20

# nvitop gauge -> (scenario device key, scale); None: no scenario value, NotSupported in the fake
DEVICE_GAUGES: dict[str, tuple[str | None, float]] = {
    "gpu_memory_total_MiB": ("memory_total_bytes", 1 / MIB),
    "gpu_memory_used_MiB": ("memory_used_bytes", 1 / MIB),
    "gpu_utilization_Percentage": ("utilization_gpu", 1),
    "gpu_memory_utilization_Percentage": ("utilization_memory", 1),
    "gpu_power_usage_W": ("power_usage_milliwatts", 1 / 1000),
    "gpu_temperature_C": ("temperature_celsius", 1),
    "gpu_clock_sm_MHz": ("sm_clock_mhz", 1),
    "gpu_clock_memory_MHz": ("memory_clock_mhz", 1),
    "gpu_fan_speed_Percentage": (None, 1),
    "gpu_power_limit_W": (None, 1),
    "gpu_pcie_tx_throughput_MiBps": (None, 1),
}


def _clean(v: float) -> float | None:
    return None if math.isnan(v) else v


def expected(scenario: dict[str, Any]) -> dict[tuple[str, str, str], float | None]:
    """{(gauge, uuid, pid or ""): value} nvitop should serve; None where it serves NaN."""
    want: dict[tuple[str, str, str], float | None] = {}
    for d in scenario["devices"]:
        blank = set(d.get("not_supported") or [])
        for gauge, (key, scale) in DEVICE_GAUGES.items():
            field = {"power_usage_milliwatts": "power", "temperature_celsius": "temperature"}.get(key or "")
            raw = None if key is None or field in blank else d.get(key)
            want[gauge, d["uuid"], ""] = None if raw is None else raw * scale
        for p in d.get("processes") or []:
            mem = p.get("used_memory_bytes")
            want["process_gpu_memory_MiB", d["uuid"], str(p["pid"])] = None if mem is None else mem / MIB
            want["process_gpu_sm_utilization_Percentage", d["uuid"], str(p["pid"])] = float(p.get("sm_util", 0))
    return want


def observed(samples: dict[Key, float], want: dict[tuple[str, str, str], Any]) -> dict[tuple[str, str, str], Any]:
    """The served values at ``want``'s keys (missing rows read as the string "missing")."""
    got: dict[tuple[str, str, str], Any] = {}
    for gauge, uuid, pid in want:
        labels = {"uuid": uuid, "pid": pid} if pid else {"uuid": uuid}
        rows = select(samples, gauge, **labels)
        got[gauge, uuid, pid] = _clean(next(iter(rows.values()))) if len(rows) == 1 else "missing"
    return got


def test_nvitop_exporter_serves_the_scenario_from_the_fake(tmp_path: Path) -> None:
    scenario = load_scenario_dict(EXAMPLES / "mixed-4gpu-node.yaml")
    scenario["devices"][1]["not_supported"] = ["power"]  # nvitop must show NaN, not 0
    want = expected(scenario)
    assert any(v is None for v in want.values()) and any(v for v in want.values())
    with nvitop_exporter(scenario, tmp_path) as nvitop:
        nvitop.wait_ready(READY_S)
        # the gauges are set one by one while a scrape may come in: wait for a settled page
        samples = nvitop.wait_for(lambda s: observed(s, want) == want, SETTLE_S, "nvitop's gauges equal the scenario")
        processes = {dict(k[1])["pid"] for k in select(samples, "process_gpu_memory_MiB")}
        assert processes == {str(p) for p in scenario_pids(scenario)}
        (info,) = select(samples, "nvitop_info")
        assert {"driver_version": "550.54.15", "cuda_driver_version": "12.4",
                "device_count": str(len(scenario["devices"]))}.items() <= dict(info[1]).items()
        assert nvitop.alive()


def test_nvitop_exporter_on_an_old_driver_and_unknown_process_memory(tmp_path: Path) -> None:
    # no _v3 process lists, no MemoryInfo_v2: nvitop falls back on its own; memory N/A is NaN
    scenario = load_scenario_dict(EXAMPLES / "mixed-4gpu-node.yaml")
    scenario["nvml"] = {"old_driver": True}
    scenario["devices"][2]["processes"][0]["used_memory_bytes"] = None
    want = expected(scenario)
    with nvitop_exporter(scenario, tmp_path) as nvitop:
        nvitop.wait_ready(READY_S)
        nvitop.wait_for(lambda s: observed(s, want) == want, SETTLE_S, "nvitop's gauges equal the scenario")
