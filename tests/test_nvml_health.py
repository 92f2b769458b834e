"""Health reads (issue 18) through the real pynvml against the fake libnvidia-ml.so.1.

Each value flows scenario -> fake -> pynvml -> NvmlBackend.sample() -> DeviceSample.health, and the
simulated node of the same scenario is the oracle (except GPM's first cycle, which NVML cannot have).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from exporter.exposition.health_rows import health_families
from exporter.model import DeviceHealth, DeviceSample, GpmSample, NvLinkSample
from exporter.node.scenario_health import HEALTH_KEYS
from exporter.node.simulate import SimulatedBackend, parse_scenario
from tests.fake_nvml.harness import Harness
from tests.fake_nvml.health_config import scalar_values
from tests.test_nvml_backend import GIB, GPU1, counting_wrapper, failing_for, mig_scenario, scenario, uuid_of

pytestmark = pytest.mark.e2e  # every test here builds the fake NVML library (gcc)

KIB = 1024
HEALTH: dict[str, Any] = {
    **scalar_values(1),  # every integer health key; below, the values tests here and test_device_check assert
    "energy_millijoules": 5_000_000, "power_limit_milliwatts": 700_000, "memory_temperature_celsius": 71,
    "memory_reserved_bytes": 600 << 20, "retired_pages_single_bit": 3, "retired_pages_double_bit": 1,
    "retired_pages_pending": 1, "remapped_rows_correctable": 6, "remapped_rows_uncorrectable": 2,
    "remapped_rows_pending": 1, "remapped_rows_failure": 0,
    "power_violation_nanoseconds": 4_500_000_000,  # past 2**32: the call's unsigned long long end to end
    "nvlinks": [
        {"link": 17, "active": 1, "tx_kibibytes": 30, "rx_kibibytes": 40, "crc_errors": 0, "replay_errors": 0,
         "recovery_errors": 0},
        {"link": 0, "active": 1, "tx_kibibytes": 10, "rx_kibibytes": 20, "crc_errors": 5, "replay_errors": 6,
         "recovery_errors": 7},
        {"link": 5, "active": 0, "crc_errors": 1},  # down, and only one counter the driver answers
    ],
    "gpm": {"graphics_active": 0.97, "sm_active": 0.5, "sm_occupancy": 0.25, "tensor_active": 0, "dram_active": 1},
}
H100: dict[str, Any] = {
    "uuid": "GPU-b1000000-0000-4000-8000-000000000000", "name": "NVIDIA H100 80GB HBM3", "minor_number": 0,
    "pci_bus_id": "00000000:18:00.0", "memory_total_bytes": 80 * GIB, "memory_used_bytes": 20 * GIB,
    "utilization_gpu": 90, "utilization_memory": 40, "power_usage_milliwatts": 600_000, "temperature_celsius": 60,
    "processes": [{"pid": 6100, "used_memory_bytes": 19 * GIB, "sm_util": 90}],
    **HEALTH,
}
RATIOS = GpmSample(graphics_active=0.97, sm_active=0.5, sm_occupancy=0.25, tensor_active=0.0, dram_active=1.0)
HEALTH_NODE = Path(__file__).resolve().parent / "scenarios" / "health_node.yaml"
REMAP = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure")


def without_gpm(devices: tuple[DeviceSample, ...]) -> tuple[DeviceSample, ...]:
    """The devices as NVML reads them in the first cycle: no GPM ratios before two samples."""
    return tuple(replace(d, health=replace(d.health, gpm=None)) for d in devices)


def oracle(doc: dict[str, Any]) -> SimulatedBackend:
    return SimulatedBackend(parse_scenario(doc))


def test_every_value_flows_from_the_scenario(nvml: Harness) -> None:
    doc = scenario(H100, GPU1)
    backend, _ = nvml.start(doc)
    simulated = oracle(doc)
    first = backend.sample()
    assert first.devices == without_gpm(simulated.sample().devices)
    second = backend.sample()
    assert second.devices == simulated.sample().devices
    h = second.devices[0].health
    assert h.energy_millijoules == 5_000_000 + 600_000  # one 1 s tick later: rate(energy) is the power
    assert h.gpm == RATIOS
    assert h.nvlinks == (NvLinkSample(0, True, 10 * KIB, 20 * KIB, 5, 6, 7), NvLinkSample(5, False, crc_errors=1),
                         NvLinkSample(17, True, 30 * KIB, 40 * KIB, 0, 0, 0))
    assert (h.retired_pages_single_bit, h.retired_pages_double_bit, h.retired_pages_pending) == (3, 1, 1)
    assert (h.remapped_rows_correctable, h.remapped_rows_pending, h.remapped_rows_failure) == (6, 1, 0)
    d = second.devices[0]  # v2's used leaves reserved out; ours keeps v1's meaning
    assert (d.memory_used_bytes, d.memory_reserved_bytes) == (20 * GIB, 600 << 20)
    assert second.devices[1].health == DeviceHealth()  # a card without any of it: all absent, not zero
    assert dict(second.errors) == {}


def test_the_health_node_reads_as_the_simulated_node(nvml: Harness) -> None:
    doc = yaml.safe_load(HEALTH_NODE.read_text())
    for d in doc["devices"]:
        for handle in (d, *d.get("mig_devices", [])):
            # an absent reserved size reads 0 in the fake, None in the simulated node: give it
            handle.setdefault("memory_reserved_bytes", 0)
            # v1's used (the scenario's) includes reserved: a driver never reports less
            handle["memory_used_bytes"] = max(handle["memory_used_bytes"], handle["memory_reserved_bytes"])
    backend, _ = nvml.start(doc)
    simulated = oracle(doc)
    assert backend.sample().devices == without_gpm(simulated.sample().devices)
    for _ in range(2):
        s = backend.sample()
        assert s.devices == simulated.sample().devices
    assert dict(s.errors) == {}


def with_not_supported(doc: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["devices"][0]["not_supported"] = list(names)
    return out


@pytest.mark.parametrize("key", sorted(HEALTH_KEYS | {"memory_reserved_bytes"}))
def test_not_supported_blanks_that_field_only_and_counts_nothing(nvml: Harness, key: str) -> None:
    doc = scenario(H100)
    # the four remap values come from one NVML call: NotSupported blanks them together
    names = REMAP if key in REMAP else (key,)
    blanked = with_not_supported(doc, names)
    backend, _ = nvml.start(blanked)
    simulated, full = oracle(blanked), oracle(doc)
    full.sample()
    assert backend.sample().devices == without_gpm(simulated.sample().devices)
    d = backend.sample().devices[0]
    assert d == simulated.sample().devices[0]
    everything = full.sample().devices[0]
    if key == "memory_reserved_bytes":  # v2 NotSupported: v1 still has total and used
        assert (d.memory_reserved_bytes, d.memory_used_bytes) == (None, everything.memory_used_bytes)
        assert d.health == everything.health
    else:  # that field blank (absent, not zero), every other one as with the key supported
        assert all(getattr(d.health, f) in (None, ()) for f in names)
        assert replace(d.health, **{f: getattr(everything.health, f) for f in names}) == everything.health
        assert d.memory_reserved_bytes == everything.memory_reserved_bytes
    assert dict(backend.sample().errors) == {}


def _refuse(error: int) -> Any:
    def call(*_: object) -> None:
        raise pynvml.NVMLError(error)
    return call


def test_other_errors_blank_their_field_and_are_counted(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    for call in ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages"):
        monkeypatch.setattr(pynvml, call, _refuse(pynvml.NVML_ERROR_NO_PERMISSION))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieReplayCounter", _refuse(pynvml.NVML_ERROR_UNKNOWN))
    real_fields = pynvml.nvmlDeviceGetFieldValues

    def memory_temperature_refused(handle: Any, ids: list[Any]) -> Any:
        values = real_fields(handle, ids)
        values[0].nvmlReturn = pynvml.NVML_ERROR_NO_PERMISSION  # the field's own status, the call succeeded
        return values

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", memory_temperature_refused)
    doc = scenario(H100)
    backend, _ = nvml.start(doc)
    simulated = oracle(doc)
    backend.sample()
    simulated.sample()
    s = backend.sample()
    blank = dict.fromkeys(("energy_millijoules", "memory_temperature_celsius", "pcie_replay_count",
                           "retired_pages_single_bit", "retired_pages_double_bit", *REMAP))
    want = simulated.sample().devices[0]
    assert s.devices[0] == replace(want, health=replace(want.health, **blank))
    assert s.devices[0].health.nvlinks[0].tx_bytes == 10 * KIB  # the other fields of that call still count
    assert dict(s.errors) == {("nvmlDeviceGetTotalEnergyConsumption", "NVMLError_NoPermission"): 2,
                              ("nvmlDeviceGetRemappedRows", "NVMLError_NoPermission"): 2,
                              ("nvmlDeviceGetRetiredPages", "NVMLError_NoPermission"): 4,  # two causes
                              ("nvmlDeviceGetPcieReplayCounter", "NVMLError_Unknown"): 2,
                              ("nvmlDeviceGetFieldValues", "NVMLError_NoPermission"): 2}


def test_pstate_unknown_reads_as_none(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPerformanceState", lambda _h: pynvml.NVML_PSTATE_UNKNOWN)
    backend, _ = nvml.start(scenario(H100))
    s = backend.sample()
    assert (s.devices[0].health.performance_state, dict(s.errors)) == (None, {})


# ---- a lost device ---------------------------------------------------------------------------

LOST_FROM = {"call": "nvmlDeviceGetTotalEnergyConsumption", "field": "nvmlDeviceGetFieldValues",
             "gpm_metric": "nvmlGpmMetricsGet"}


def lose_the_h100(monkeypatch: pytest.MonkeyPatch, how: str) -> dict[str, bool]:
    """GPU_IS_LOST for the H100 while the returned switch is on: from a call, a field or a GPM metric."""
    lost = {"on": False}
    name = LOST_FROM[how]
    real = getattr(pynvml, name)

    def wrapper(*args: Any) -> Any:
        mine = how == "gpm_metric" or uuid_of(args[0]) == H100["uuid"]  # only the H100 has GPM
        if how == "call" and lost["on"] and mine:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        out = real(*args)
        if lost["on"] and mine:  # the item's own status; the call itself succeeded
            (out[0] if how == "field" else out.metrics[0]).nvmlReturn = pynvml.NVML_ERROR_GPU_IS_LOST
        return out

    monkeypatch.setattr(pynvml, name, wrapper)
    return lost


@pytest.mark.parametrize("how", sorted(LOST_FROM))
def test_gpu_is_lost_from_a_health_read_takes_the_device(nvml: Harness, monkeypatch: pytest.MonkeyPatch,
                                                         how: str) -> None:
    lost = lose_the_h100(monkeypatch, how)
    backend, fake = nvml.start(scenario(H100, GPU1), lost_backoff_s=10.0)
    assert backend.sample().devices[0].health.gpm is None
    assert backend.sample().devices[0].health.gpm == RATIOS
    lost["on"] = True
    s = backend.sample()
    assert s.devices[0].lost and s.devices[0].health == DeviceHealth()
    assert not s.devices[1].lost
    assert dict(s.errors) == {(LOST_FROM[how], "NVMLError_GpuIsLost"): 1}
    assert fake.calls("nvmlGpmSampleFree") == 2  # the lost device's buffers, freed at once
    lost["on"] = False
    nvml.clock.now += 10  # back after the backoff: GPM starts over, with two fresh buffers
    back = backend.sample().devices[0]
    assert not back.lost and back.health.gpm is None
    assert fake.calls("nvmlGpmSampleAlloc") == 4
    assert backend.sample().devices[0].health.gpm == RATIOS


def test_a_gpm_device_lost_and_found_again_does_not_leak_samples(nvml: Harness,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lost = lose_the_h100(monkeypatch, "call")
    backend, fake = nvml.start(scenario(H100), lost_backoff_s=1.0, lost_backoff_max_s=1.0)
    for _ in range(40):  # the fake has 64 sample buffers: two leaked per loss would run out
        lost["on"] = False
        nvml.clock.now += 1
        backend.sample()
        assert backend.sample().devices[0].health.gpm == RATIOS
        lost["on"] = True
        assert backend.sample().devices[0].lost
    assert fake.calls("nvmlGpmSampleAlloc") == fake.calls("nvmlGpmSampleFree") == 80
    assert dict(backend.sample().errors) == {("nvmlDeviceGetTotalEnergyConsumption", "NVMLError_GpuIsLost"): 40}


# ---- old drivers ------------------------------------------------------------------------------

@pytest.mark.parametrize("library", ["old", "current"], ids=["symbols-absent", "function-not-found"])
def test_old_driver_lacks_gpm_and_memory_v2_without_errors(nvml: Harness, monkeypatch: pytest.MonkeyPatch,
                                                           library: str) -> None:
    asked: list[str] = []
    for name in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc"):
        monkeypatch.setattr(pynvml, name, counting_wrapper(getattr(pynvml, name), name, asked))
    real_memory = pynvml.nvmlDeviceGetMemoryInfo

    def memory(handle: Any, version: Any = None) -> Any:
        asked.append(f"nvmlDeviceGetMemoryInfo v{2 if version else 1}")
        return real_memory(handle, version)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    doc = scenario(H100, old_driver=True)
    backend, _ = nvml.start(doc, library=library)
    simulated = oracle(doc)
    for _ in range(3):
        s = backend.sample()
        want = simulated.sample().devices[0]
        # no GPM, no reserved size; everything else as on a new driver
        assert s.devices[0] == replace(want, memory_reserved_bytes=None, health=replace(want.health, gpm=None))
    assert asked == ["nvmlGpmQueryDeviceSupport", "nvmlDeviceGetMemoryInfo v2", "nvmlDeviceGetMemoryInfo v1",
                     "nvmlDeviceGetMemoryInfo v1", "nvmlDeviceGetMemoryInfo v1"]  # each missing symbol tried once
    assert dict(s.errors) == {}


def test_a_missing_health_symbol_is_tried_once_and_not_counted(nvml: Harness,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    for name in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetNvLinkState"):
        monkeypatch.setattr(pynvml, name, counting_wrapper(_refuse(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND), name,
                                                           asked))
    backend, _ = nvml.start(scenario(H100, GPU1))
    for _ in range(3):
        s = backend.sample()
    assert asked == ["nvmlDeviceGetRemappedRows", "nvmlDeviceGetNvLinkState"]  # once for the whole backend
    h = s.devices[0].health
    assert all(getattr(h, f) is None for f in REMAP) and h.nvlinks == ()
    assert h.retired_pages_single_bit == 3 and h.gpm == RATIOS
    assert dict(s.errors) == {}


# ---- MIG ----------------------------------------------------------------------------------------

def test_mig_devices_repeat_their_cards_health_read_once_per_cycle(nvml: Harness) -> None:
    doc = mig_scenario()
    doc["devices"][0].update({k: v for k, v in HEALTH.items() if k not in ("memory_reserved_bytes", "gpm")})
    backend, fake = nvml.start(doc)
    simulated = oracle(doc)
    for cycle in range(1, 4):
        s = backend.sample()
        assert s.devices == simulated.sample().devices
        card = [d.health for d in s.devices if d.parent_uuid == doc["devices"][0]["uuid"]]
        assert len(card) == 3 and card[0].remapped_rows_pending == 1 and card.count(card[0]) == 3
        assert card[0].energy_millijoules == HEALTH["energy_millijoules"] + 212_000 * (cycle - 1)
        # once per card and cycle: card 0 for its three MIG devices, card 1 for itself
        assert fake.calls("nvmlDeviceGetTotalEnergyConsumption") == 2 * cycle
        assert fake.calls("nvmlDeviceGetFieldValues") == 2 * cycle
    assert [d.memory_reserved_bytes for d in s.devices] == [64 << 20, 32 << 20, 0, 600 << 20]  # per handle
    assert dict(s.errors) == {}


def test_a_mig_cards_links_are_read_once_per_cycle_and_rendered_once_on_the_card(nvml: Harness) -> None:
    doc = mig_scenario()
    card = doc["devices"][0]
    card["nvlinks"] = HEALTH["nvlinks"]  # links 0, 5 and 17
    backend, fake = nvml.start(doc)
    simulated = oracle(doc)
    searched = 2 * pynvml.NVML_NVLINK_MAX_LINKS  # both cards once, the MIG handles never
    for cycle in range(1, 3):
        s = backend.sample()
        want = simulated.sample()
        assert s.devices == want.devices
        assert fake.calls("nvmlDeviceGetNvLinkState") == searched + 3 * (cycle - 1)
        assert fake.calls("nvmlDeviceGetNvLinkErrorCounter") == 3 * 3 * cycle  # 3 links x 3 counters, not x 3 MIG
    migs = [d for d in s.devices if d.parent_uuid == card["uuid"]]
    assert len(migs) == 3 and all(len(d.health.nvlinks) == 3 for d in migs)
    # both paths render the card's links once, on the card, with the same values
    rows = nvlink_rows(s.devices)
    assert rows == nvlink_rows(want.devices)
    assert len(rows) == 6 + 6 + 2 and {lbl["uuid"] for lbl, _ in rows} == {card["uuid"]}  # link 5: state, CRC
    assert {(lbl["minor_number"], lbl["name"]) for lbl, _ in rows} == {("0", card["name"])}
    assert dict(s.errors) == {}


def test_no_nvlink_call_without_nvlink_metrics(nvml: Harness) -> None:
    doc = mig_scenario()
    doc["devices"][0]["nvlinks"] = HEALTH["nvlinks"]
    doc["devices"][1].update(HEALTH)
    backend, fake = nvml.start(doc, nvlink=False)
    simulated = SimulatedBackend(parse_scenario(doc), nvlink=False)
    assert backend.sample().devices == without_gpm(simulated.sample().devices)
    s = backend.sample()
    assert s.devices == simulated.sample().devices
    assert all(d.health.nvlinks == () for d in s.devices)
    assert s.devices[-1].health.remapped_rows_pending == 1 and s.devices[-1].health.gpm == RATIOS  # the rest is read
    for call in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter"):
        assert fake.calls(call) == 0, call
    assert nvlink_rows(s.devices) == []
    assert dict(s.errors) == {}


def nvlink_rows(devices: tuple[DeviceSample, ...]) -> list[tuple[dict[str, str], float]]:
    """The NVLink series the rows make of ``devices``, sorted."""
    out = [(dict(smp.labels), smp.value) for fam in health_families(devices, "n1")
           if fam.name.startswith("nvidia_gpu_nvlink_") for smp in fam.samples]
    return sorted(out, key=lambda r: sorted(r[0].items()))


# ---- GPM ----------------------------------------------------------------------------------------

def test_gpm_is_none_first_then_ratios_over_two_buffers(nvml: Harness) -> None:
    partial = dict(H100, gpm={"sm_active": 0.5, "dram_active": 0.25})
    backend, fake = nvml.start(scenario(partial, GPU1))
    assert [d.health.gpm for d in backend.sample().devices] == [None, None]
    for _ in range(3):
        s = backend.sample()
        assert s.devices[0].health.gpm == GpmSample(sm_active=0.5, dram_active=0.25)  # the rest NotSupported
        assert s.devices[1].health.gpm is None  # no GPM on that device: absent, never zeros
    assert fake.calls("nvmlGpmQueryDeviceSupport") == 2  # once per device
    assert fake.calls("nvmlGpmSampleAlloc") == 2  # two buffers, reused every cycle
    assert fake.calls("nvmlGpmSampleGet") == 4
    assert fake.calls("nvmlGpmMetricsGet") == 3
    assert dict(s.errors) == {}
    backend.close()
    assert fake.calls("nvmlGpmSampleFree") == 2  # before nvmlShutdown
    assert fake.calls("nvmlShutdown") == 1


def test_a_failed_gpm_sample_skips_one_cycle(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = nvml.start(scenario(H100))
    backend.sample()
    assert backend.sample().devices[0].health.gpm == RATIOS
    monkeypatch.setattr(pynvml, "nvmlGpmSampleGet", _refuse(pynvml.NVML_ERROR_UNKNOWN))
    s = backend.sample()
    assert s.devices[0].health.gpm is None
    assert dict(s.errors) == {("nvmlGpmSampleGet", "NVMLError_Unknown"): 1}
    monkeypatch.undo()
    assert backend.sample().devices[0].health.gpm == RATIOS  # over the two periods since the last sample


def test_gpm_percentages_become_ratios_held_to_0_1(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pynvml.nvmlGpmMetricsGet

    def skewed(get: Any) -> Any:
        out = real(get)
        out.metrics[0].value, out.metrics[1].value = 100.4, float("nan")  # rounding over 100; no measurement
        out.metrics[2].nvmlReturn = pynvml.NVML_ERROR_NO_PERMISSION
        return out

    monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", skewed)
    backend, _ = nvml.start(scenario(H100))
    backend.sample()
    s = backend.sample()
    assert s.devices[0].health.gpm == GpmSample(1.0, None, None, 0.0, 1.0)
    assert dict(s.errors) == {("nvmlGpmMetricsGet", "NVMLError_NoPermission"): 1}


# ---- NVLink -------------------------------------------------------------------------------------

def test_links_are_found_once_and_only_where_they_exist(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(H100, GPU1))
    s = backend.sample()
    assert [n.link for n in s.devices[0].health.nvlinks] == [0, 5, 17]
    assert s.devices[1].health.nvlinks == ()
    searched = 2 * pynvml.NVML_NVLINK_MAX_LINKS  # every index of both cards, the fake's last ones invalid
    assert fake.calls("nvmlDeviceGetNvLinkState") == searched
    for cycle in range(1, 3):
        s = backend.sample()
        assert [n.link for n in s.devices[0].health.nvlinks] == [0, 5, 17]
        assert fake.calls("nvmlDeviceGetNvLinkState") == searched + 3 * cycle  # the three links; GPU1 none
    assert dict(s.errors) == {}


def test_a_failed_link_search_is_counted_and_made_again(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pynvml.nvmlDeviceGetNvLinkState
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState",
                        lambda h, link: _refuse(pynvml.NVML_ERROR_UNKNOWN)() if link == 5 else real(h, link))
    backend, fake = nvml.start(scenario(H100))
    s = backend.sample()
    assert [n.link for n in s.devices[0].health.nvlinks] == [0, 17]  # link 5 unknown this cycle
    assert dict(s.errors) == {("nvmlDeviceGetNvLinkState", "NVMLError_Unknown"): 1}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", real)
    s = backend.sample()
    assert [n.link for n in s.devices[0].health.nvlinks] == [0, 5, 17]
    assert fake.calls("nvmlDeviceGetNvLinkState") == 2 * pynvml.NVML_NVLINK_MAX_LINKS - 1  # the patched call
    assert dict(s.errors) == {("nvmlDeviceGetNvLinkState", "NVMLError_Unknown"): 1}


def test_a_failing_link_counter_blanks_that_counter(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    refused = pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkErrorCounter",
                        failing_for(pynvml.nvmlDeviceGetNvLinkErrorCounter, H100["uuid"], refused))
    backend, _ = nvml.start(scenario(H100))
    links = backend.sample().devices[0].health.nvlinks
    assert [(n.link, n.active, n.crc_errors, n.replay_errors, n.tx_bytes) for n in links] == [
        (0, True, None, None, 10 * KIB), (5, False, None, None, None), (17, True, None, None, 30 * KIB)]
    assert dict(backend.sample().errors) == {("nvmlDeviceGetNvLinkErrorCounter", "NVMLError_NoPermission"): 18}


# ---- GPM per GPU instance (MIG on Hopper) ----------------------------------------------------

MIG_H100 = Path(__file__).resolve().parent.parent / "examples" / "mig-h100-node.yaml"


def test_mig_devices_on_hopper_carry_their_gpu_instance_gpm(nvml: Harness) -> None:
    """examples/mig-h100-node.yaml through pynvml: nvmlGpmMigSampleGet once per GPU instance and cycle on the card's
    handle, each MIG device its own instance's ratios from the second cycle on, as the simulated node has them."""
    doc = yaml.safe_load(MIG_H100.read_text())
    for d in doc["devices"]:
        for handle in (d, *d.get("mig_devices", [])):
            handle.setdefault("memory_reserved_bytes", 0)  # absent: 0 in the fake, None in the simulated node
    backend, fake = nvml.start(doc)
    simulated = oracle(doc)
    assert backend.sample().devices == without_gpm(simulated.sample().devices)
    for cycle in range(2, 5):
        s = backend.sample()
        assert s.devices == simulated.sample().devices
        assert s.devices[0].health.gpm == GpmSample(0.88, 0.81, 0.34, 0.57, 0.46)
        assert s.devices[2].health.gpm == GpmSample(0.0, 0.0, 0.0, 0.0, 0.0)  # idle, not absent
        assert fake.calls("nvmlGpmMigSampleGet") == 3 * cycle  # three GPU instances
        assert fake.calls("nvmlGpmSampleGet") == cycle  # the whole card only: a MIG card's own is not read
    assert fake.calls("nvmlGpmSampleAlloc") == 2 * 4  # two buffers per instance and per whole card, reused
    assert dict(s.errors) == {}
    assert s.gpm_capable == simulated.sample().gpm_capable == {d["uuid"]: True for d in doc["devices"]}
    backend.close()
    assert fake.calls("nvmlGpmSampleFree") == 8


def test_compute_instances_of_one_gpu_instance_share_one_sample(nvml: Harness) -> None:
    doc = yaml.safe_load(MIG_H100.read_text())
    first = doc["devices"][0]["mig_devices"][0]
    first["gpm"] = {"sm_active": 0.5}
    doc["devices"][0]["mig_devices"] = [first, {**first, "uuid": "MIG-b2000000-0000-5000-8000-00000000000a",
                                                "compute_instance_id": 1, "processes": []}]
    backend, fake = nvml.start(doc)
    backend.sample()
    s = backend.sample()
    assert [d.health.gpm for d in s.devices[:2]] == [GpmSample(sm_active=0.5)] * 2
    assert fake.calls("nvmlGpmMigSampleGet") == 2  # one instance, two cycles


def test_a100_mig_devices_have_no_gpm_and_nothing_is_counted(nvml: Harness) -> None:
    backend, fake = nvml.start(mig_scenario())
    for _ in range(3):
        s = backend.sample()
        assert [d.health.gpm for d in s.devices] == [None] * 4
    assert fake.calls("nvmlGpmMigSampleGet") == 0  # the card said isSupportedDevice 0, asked once
    assert fake.calls("nvmlGpmQueryDeviceSupport") == 2
    assert dict(s.errors) == {}
    assert s.gpm_capable == {d["uuid"]: False for d in mig_scenario()["devices"]}  # known at once: the summary's


def test_destroyed_gpu_instances_free_their_buffers(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """MIG devices come and go: an instance no cycle reads any more gives its two buffers back."""
    backend, fake = nvml.start(yaml.safe_load(MIG_H100.read_text()))
    backend.sample()
    real = pynvml.nvmlDeviceGetMigDeviceHandleByIndex

    def without_slot_3(card: Any, slot: int) -> Any:
        if slot == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # the 1g.10gb instance was destroyed
        return real(card, slot)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", without_slot_3)
    s = backend.sample()
    assert [d.uuid for d in s.devices] == [*(m["uuid"] for m in yaml.safe_load(MIG_H100.read_text())["devices"][0][
        "mig_devices"][:2]), "GPU-b2000000-0000-4000-8000-000000000001"]
    assert fake.calls("nvmlGpmSampleFree") == 2
    assert dict(s.errors) == {}


def test_a_driver_without_gpm_mig_sampling_is_not_an_error(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*_: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlGpmMigSampleGet", missing)
    backend, fake = nvml.start(yaml.safe_load(MIG_H100.read_text()))
    for _ in range(3):
        s = backend.sample()
    assert [d.health.gpm is None for d in s.devices] == [True, True, True, False]  # the whole card keeps its GPM
    assert dict(s.errors) == {}
    assert list(s.gpm_capable.values()) == [False, True]
    assert fake.calls("nvmlGpmSampleFree") == 2  # the first instance's pair, given back at once
