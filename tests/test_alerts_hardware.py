"""The hardware-health alerts on a real exporter's series.

alerts/tests/gpu-hardware.test.yaml tests their thresholds and ``for:`` on hand-written series;
this runs them on what the exporter really exposes: tests/scenarios/health_node.yaml (a pending
and a failed row remap, a pending page retirement, throttling GPUs, a MIG card repeating its
card's health) scraped by a real Prometheus with the alert bundle loaded, every hardware alert's
``for:`` shortened to 1s. The alerts that fire must be exactly those the scenario's keys call for,
computed from its YAML; its counters stand still, so no PCIe replay or NVLink alert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.bundle.alerts import gpu_hardware
from exporter.bundle.alerts.alert import Labels
from exporter.bundle.alerts.cli import render_alerts
from exporter.bundle.alerts.options import AlertOptions
from tests.prom_support import PROMETHEUS, SCENARIOS, http_get, poll, rule_health, run_prometheus, start_exporter, stop

SCENARIO = SCENARIOS / "health_node.yaml"
_opts = AlertOptions()
HARDWARE = {a.name for a in gpu_hardware.memory_alerts(_opts, Labels.of(_opts))} | {
    a.name for a in gpu_hardware.link_alerts(_opts, Labels.of(_opts))
}
# decoded clocks event reason -> the alert it raises (sync boost, idle, ... raise none)
REASON_ALERTS = {
    **dict.fromkeys(gpu_hardware.THERMAL_REASONS, "KubeGpuThermalThrottling"),
    **dict.fromkeys(gpu_hardware.HARDWARE_REASONS, "KubeGpuHardwareSlowdown"),
    **dict.fromkeys(gpu_hardware.POWER_CAP_REASONS, "KubeGpuPowerThrottling"),
}
BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
        "hw_power_brake_slowdown": 0x80}  # fmt: skip
FLAGS = {"remapped_rows_pending": "KubeGpuRowRemapPending", "remapped_rows_failure": "KubeGpuRowRemapFailure",
         "retired_pages_pending": "KubeGpuPageRetirementPending"}  # fmt: skip


def expected(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(alert, uuid, reason) of every hardware alert the scenario raises; a MIG card's on each MIG device."""
    out = set()
    for card in doc["devices"]:
        keys = {k: v for k, v in card.items() if k not in set(card.get("not_supported") or ())}
        uuids = [m["uuid"] for m in card.get("mig_devices") or ()] or [card["uuid"]]
        found = [(alert, "") for key, alert in FLAGS.items() if keys.get(key)]
        pages = [keys[k] for k in ("retired_pages_single_bit", "retired_pages_double_bit") if k in keys]
        if pages and sum(pages) >= _opts.retired_pages_limit:
            found.append(("KubeGpuRetiredPagesLimit", ""))
        mask = keys.get("clocks_event_reasons") or 0
        found += [(REASON_ALERTS[reason], reason) for reason, bit in BITS.items() if mask & bit]
        out |= {(alert, uuid, reason) for alert, reason in found for uuid in uuids}
    return out


def _alerts_text() -> str:
    doc = yaml.safe_load(render_alerts(_opts))
    for rule in doc["groups"][0]["rules"]:
        if rule["alert"] in HARDWARE:
            rule["for"] = "1s"
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _firing(base: str) -> list[dict[str, Any]]:
    body = json.loads(http_get(f"{base}/api/v1/alerts"))
    return [a for a in body["data"]["alerts"] if a["state"] == "firing" and a["labels"]["alertname"] in HARDWARE]


def test_expected_alerts_follow_the_scenario() -> None:
    """The scenario's truth by hand, so the model computing it is checked too."""
    got = expected(yaml.safe_load(SCENARIO.read_text()))
    gpu = "GPU-a1000000-0000-4000-8000-0000000000{:02d}".format
    assert ("KubeGpuRowRemapPending", gpu(7), "") in got and ("KubeGpuRowRemapFailure", gpu(6), "") in got
    assert ("KubeGpuPageRetirementPending", gpu(10), "") in got
    assert {("KubeGpuThermalThrottling", gpu(2), "sw_thermal_slowdown"),
            ("KubeGpuPowerThrottling", gpu(2), "sw_power_cap")} <= got  # fmt: skip
    assert not {a for a, _, _ in got} & {"KubeGpuPcieReplaysHigh", "KubeGpuNvlinkErrors", "KubeGpuRetiredPagesLimit"}


@pytest.mark.e2e
def test_hardware_alerts_fire_on_the_exporters_series(tmp_path: Path) -> None:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    doc = yaml.safe_load(SCENARIO.read_text())
    want = expected(doc)
    procs = []
    try:
        exporter, address = start_exporter(SCENARIO, doc["node"], tmp_path)
        procs.append(exporter)
        prom, base = run_prometheus(tmp_path, [_alerts_text()], [{"targets": [address]}])
        procs.append(prom)

        def seen() -> set[tuple[str, str, str]]:
            return {(a["labels"]["alertname"], a["labels"]["uuid"], a["labels"].get("reason", ""))
                    for a in _firing(base)}  # fmt: skip

        assert poll(lambda: seen() == want, deadline_s=60), f"missing {want - seen()}, unexpected {seen() - want}"
        for a in _firing(base):
            labels, notes = a["labels"], a["annotations"]
            assert labels["node_name"] == doc["node"] and labels["minor_number"] and labels["name"], labels
            assert "{{" not in notes["description"] and labels["uuid"] in notes["description"], notes
        assert not rule_health(base)
    finally:
        for proc in reversed(procs):
            stop(proc)
