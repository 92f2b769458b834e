"""GPU health end to end on the real NVML path: scenario -> fake libnvidia-ml.so.1 -> real pynvml ->
the exporter process -> a real Prometheus.

The oracle is the simulated node rendering the same scenario file: both backends feed one
pipeline, so every health family must carry the same series with the same values. Energy moves
with the fake's tick and GPM needs two samples, so those are compared by shape and by rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration_support import exporter_node, parse_exposition, render_simulated, select
from tests.prom_support import poll, query, run_prometheus, stop

pytestmark = pytest.mark.e2e  # every test here starts python

SCENARIO = Path(__file__).parent / "scenarios" / "health_node.yaml"
READY_S = 30.0
SETTLE_S = 20.0
# the families whose values stand still in the scenario (no tick dependence)
STATIC = (
    "nvidia_gpu_power_limit_watts", "nvidia_gpu_fan_speed_ratio", "nvidia_gpu_performance_state",
    "nvidia_gpu_memory_temperature_celsius", "nvidia_gpu_memory_reserved_bytes",
    "nvidia_gpu_pcie_transmit_bytes_per_second", "nvidia_gpu_pcie_receive_bytes_per_second",
    "nvidia_gpu_pcie_replays_total", "nvidia_gpu_pcie_link_generation", "nvidia_gpu_pcie_link_width",
    "nvidia_gpu_retired_pages", "nvidia_gpu_retired_pages_pending", "nvidia_gpu_remapped_rows",
    "nvidia_gpu_remapped_rows_pending", "nvidia_gpu_remapped_rows_failure", "nvidia_gpu_clocks_event_reason",
    "nvidia_gpu_nvlink_up", "nvidia_gpu_nvlink_transmit_bytes_total", "nvidia_gpu_nvlink_receive_bytes_total",
    "nvidia_gpu_nvlink_errors_total",
)
GPM = ("nvidia_gpu_graphics_engine_active_ratio", "nvidia_gpu_sm_active_ratio", "nvidia_gpu_sm_occupancy_ratio",
       "nvidia_gpu_tensor_pipe_active_ratio", "nvidia_gpu_dram_active_ratio")


def _health(samples: dict, families: tuple[str, ...]) -> dict:
    return {k: v for k, v in samples.items() if k[0] in families}


def test_health_series_from_the_fake_nvml_equal_the_simulated_node_and_reach_prometheus(tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    oracle = parse_exposition(render_simulated(SCENARIO))
    want = _health(oracle, STATIC)
    assert len({k[0] for k in want}) == len(STATIC), "the scenario no longer exercises every health family"
    with exporter_node(scenario, tmp_path / "node") as node:
        node.exporter.wait_ready(READY_S)
        # GPM needs the second cycle; then every static family must equal the oracle's
        got = node.exporter.wait_for(
            lambda s: _health(s, STATIC) == want and _health(s, GPM).keys() == _health(oracle, GPM).keys(),
            SETTLE_S, "health series equal to the simulated node's")
        # NVLink is the card's on both paths: a MIG card's links once, on its GPU uuid, minor and name
        mig_card = next(d for d in scenario["devices"] if d.get("mig_devices") and d.get("nvlinks"))
        card_labels = {"uuid": mig_card["uuid"], "minor_number": str(mig_card["minor_number"]),
                       "name": mig_card["name"]}
        assert len(select(got, "nvidia_gpu_nvlink_up", **card_labels)) == len(mig_card["nvlinks"])
        assert not [k for k in _health(got, STATIC) if k[0].startswith("nvidia_gpu_nvlink_")
                    and dict(k[1])["uuid"].startswith("MIG-")]
        # it really was the NVML path, with no call failing
        assert sum(select(got, "kube_gpu_exporter_nvml_errors_total").values()) == 0
        assert select(got, "nvidia_gpu_info") and all(
            ("driver_version", "simulated") not in k[1] for k in select(got, "nvidia_gpu_info"))
        for key, ratio in _health(got, GPM).items():
            assert abs(ratio - oracle[key]) < 1e-9, key  # fake: percent from the ratio; reader: / 100
        energy = select(got, "nvidia_gpu_energy_consumption_joules_total")
        assert energy.keys() == select(oracle, "nvidia_gpu_energy_consumption_joules_total").keys()

        target = f"127.0.0.1:{node.exporter.port}"
        (tmp_path / "prom").mkdir()
        prom, base = run_prometheus(tmp_path / "prom", [], [{"targets": [target]}])
        try:
            # a node that must be reset and one that must be replaced, as Prometheus sees them
            pending = poll(lambda: query(base, "nvidia_gpu_remapped_rows_pending == 1"), 30.0)
            assert {dict(k)["uuid"] for k in pending} == {
                d["uuid"] for d in scenario["devices"] if d.get("remapped_rows_pending") == 1}
            failed = poll(lambda: query(base, "nvidia_gpu_remapped_rows_failure == 1"), 30.0)
            assert {dict(k)["uuid"] for k in failed} == {
                d["uuid"] for d in scenario["devices"] if d.get("remapped_rows_failure") == 1}
            # the energy counter grows at the configured power: the fake's tick is one sampling cycle
            rising = poll(lambda: query(base, "rate(nvidia_gpu_energy_consumption_joules_total[5s]) > 0"), 30.0)
            powered = {u for d in scenario["devices"]  # a MIG device repeats its card's counter
                       if d.get("energy_millijoules") is not None and d.get("power_usage_milliwatts")
                       and "energy_millijoules" not in (d.get("not_supported") or ())
                       for u in [d["uuid"], *(m["uuid"] for m in d.get("mig_devices") or ())]}
            assert {dict(k)["uuid"] for k in rising} <= powered and rising
        finally:
            stop(prom)
