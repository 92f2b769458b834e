"""The health keys of a scenario (issue 18): parsed into DeviceHealth, blanked by not_supported,
energy advanced per tick, repeated on MIG devices; bad values fail with one-line ScenarioErrors."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.model import DeviceHealth, GpmSample, NvLinkSample
from exporter.node.scenario_health import (
    GPM_KEYS,
    HEALTH_INT_KEYS,
    HEALTH_KEYS,
    NVLINK_KEYS,
    REMAP_KEYS,
    energy_at,
    parse_health,
)
from exporter.node.simulate import ScenarioError, SimulatedBackend, parse_scenario
from tests.fake_nvml.health_config import scalar_values
from tests.test_scenario_properties import documents

KIB = 1024
HEALTH: dict[str, Any] = {
    **scalar_values(2),  # every integer health key (DeviceHealth's own fields), each its own value
    "energy_millijoules": 123_456_789,
    "nvlinks": [
        {"link": 1, "active": 1, "tx_kibibytes": 10, "rx_kibibytes": 20, "crc_errors": 0, "replay_errors": 1,
         "recovery_errors": 2},
        {"link": 0, "active": 0},
    ],
    "gpm": {"graphics_active": 0.5, "sm_active": 0.4, "sm_occupancy": 0.25, "tensor_active": 0, "dram_active": 1},
}
EXPECTED = DeviceHealth(
    **{k: v for k, v in HEALTH.items() if k not in ("nvlinks", "gpm")},
    nvlinks=(NvLinkSample(0, active=False), NvLinkSample(1, True, 10 * KIB, 20 * KIB, 0, 1, 2)),
    gpm=GpmSample(0.5, 0.4, 0.25, 0.0, 1.0),
)
GPU = {"uuid": "GPU-11111111-0000-4000-8000-000000000000", "name": "NVIDIA H100 80GB HBM3",
       "memory_total_bytes": 80 << 30, "memory_used_bytes": 1 << 30, "power_usage_milliwatts": 250_000}


def doc_with(**device: Any) -> dict[str, Any]:
    return {"node": "n", "devices": [{**GPU, **device}]}


def health_of(**device: Any) -> DeviceHealth:
    return parse_scenario(doc_with(**device)).devices[0].sample.health


def test_every_key_reaches_the_model() -> None:
    assert health_of(**HEALTH) == EXPECTED
    assert health_of() == DeviceHealth()  # no key: nothing supported, gpm None (never zeros)
    assert health_of(gpm={"sm_active": 0.5}).gpm == GpmSample(sm_active=0.5)  # a missing ratio: NotSupported


@pytest.mark.parametrize("name", sorted(HEALTH_KEYS))
def test_each_key_as_not_supported_blanks_only_its_field(name: str) -> None:
    got = health_of(**HEALTH, not_supported=[name])
    blank = {"nvlinks": (), "gpm": None}.get(name)
    # one NVML call (nvmlDeviceGetRemappedRows) answers the four remap values: they go together
    names = REMAP_KEYS if name in REMAP_KEYS else {name}
    assert getattr(got, name) == blank
    assert got == DeviceHealth(**{**{f: getattr(EXPECTED, f) for f in HEALTH_KEYS}, **dict.fromkeys(names, blank)})


def test_memory_reserved_is_per_handle_and_blanked_by_memory() -> None:
    dev = parse_scenario(doc_with(memory_reserved_bytes=512 << 20)).devices[0].sample
    assert dev.memory_reserved_bytes == 512 << 20
    for name in ("memory", "memory_reserved_bytes"):
        assert parse_scenario(doc_with(memory_reserved_bytes=1, not_supported=[name])).devices[0].sample \
            .memory_reserved_bytes is None


@pytest.mark.parametrize("device,message", [
    ({"fan_speed_percent": 101}, "devices[0].fan_speed_percent: must be <= 100"),
    ({"performance_state": 16}, "devices[0].performance_state: must be <= 15"),
    ({"remapped_rows_pending": 2}, "devices[0].remapped_rows_pending: must be <= 1"),
    ({"retired_pages_pending": True}, "devices[0].retired_pages_pending: expected an integer"),
    ({"pcie_replay_count": -1}, "devices[0].pcie_replay_count: must be >= 0"),
    ({"energy_millijoules": "lots"}, "devices[0].energy_millijoules: expected an integer"),
    ({"memory_reserved_bytes": (80 << 30) + 1}, "memory_reserved_bytes exceeds memory_total_bytes"),
    ({"gpm": {"sm_active": 1.5}}, "devices[0].gpm.sm_active: must be a number 0..1"),
    ({"gpm": {"sm_active": math.nan}}, "devices[0].gpm.sm_active"),
    ({"gpm": {"dram_active": math.inf}}, "devices[0].gpm.dram_active"),
    ({"gpm": {"tensor_active": True}}, "devices[0].gpm.tensor_active: expected a number"),
    ({"gpm": {"sm_busy": 0.5}}, "devices[0].gpm: unknown key(s) sm_busy"),
    ({"gpm": [0.5]}, "devices[0].gpm: expected a mapping"),
    ({"nvlinks": {"link": 0}}, "devices[0].nvlinks: expected a list"),
    ({"nvlinks": [{"active": 1}]}, "devices[0].nvlinks[0]: 'link' is required"),
    ({"nvlinks": [{"link": 3}]}, "devices[0].nvlinks[0]: 'active' is required"),
    ({"nvlinks": [{"link": 18, "active": 1}]}, "devices[0].nvlinks[0].link: must be <= 17"),
    ({"nvlinks": [{"link": 3, "active": 1}, {"link": 3, "active": 1}]}, "devices[0].nvlinks: duplicate link"),
    ({"nvlinks": [{"link": 0, "active": 2}]}, "devices[0].nvlinks[0].active: must be <= 1"),
    ({"nvlinks": [{"link": 0, "tx_bytes": 1}]}, "devices[0].nvlinks[0]: unknown key(s) tx_bytes"),
    ({"nvlinks": [{"link": 0, "active": 1, "crc_errors": -3}]}, "devices[0].nvlinks[0].crc_errors: must be >= 0"),
    ({"not_supported": ["nvlink"]}, "unknown field(s) nvlink"),
])
def test_bad_values_give_one_line_errors_naming_the_key(device: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)) as e:
        parse_scenario(doc_with(**device))
    assert "\n" not in str(e.value)


def test_not_supported_keys_must_still_hold_valid_values() -> None:
    with pytest.raises(ScenarioError, match=re.escape("devices[0].fan_speed_percent")):
        parse_scenario(doc_with(fan_speed_percent=200, not_supported=["fan_speed_percent"]))


def energies(doc: dict[str, Any], cycles: int = 3) -> list[list[int | None]]:
    backend = SimulatedBackend(parse_scenario(doc))
    return [[d.health.energy_millijoules for d in backend.sample().devices] for _ in range(cycles)]


def test_energy_advances_by_the_configured_power_each_tick() -> None:
    assert energies(doc_with(energy_millijoules=1_000)) == [[1_000], [251_000], [501_000]]
    # without a power value the counter stands still; a blanked energy stays absent
    assert energies(doc_with(energy_millijoules=1_000, not_supported=["power"])) == [[1_000]] * 3
    assert energies(doc_with(energy_millijoules=1_000, power_usage_milliwatts=None)) == [[1_000]] * 3
    assert energies(doc_with(energy_millijoules=1_000, not_supported=["energy_millijoules"])) == [[None]] * 3


CARD_HEALTH = {k: v for k, v in HEALTH.items() if k != "gpm"}  # a MIG card's GPM is on its MIG devices


def test_mig_devices_repeat_the_card_health_and_keep_their_own_reserved_memory() -> None:
    migs = [{"uuid": "MIG-a", "profile": "3g.40gb", "memory_total_bytes": 40 << 30, "memory_reserved_bytes": 1 << 20},
            {"uuid": "MIG-b", "profile": "3g.40gb", "memory_total_bytes": 40 << 30}]
    backend = SimulatedBackend(parse_scenario(doc_with(**CARD_HEALTH, memory_reserved_bytes=1 << 30,
                                                       mig_devices=migs)))
    first, second = backend.sample(), backend.sample()
    assert [d.health for d in first.devices] == [replace(EXPECTED, gpm=None)] * 2
    assert [d.memory_reserved_bytes for d in first.devices] == [1 << 20, 0]  # own, or 0 without the key
    assert [d.health.energy_millijoules for d in second.devices] == [HEALTH["energy_millijoules"] + 250_000] * 2


def _gpm_migs(*ratios: float, gpu_instances: tuple[int, ...] = (1, 2)) -> list[dict[str, Any]]:
    return [{"uuid": f"MIG-{i}", "profile": "3g.40gb", "gpu_instance_id": gi, "gpm": {"sm_active": r}}
            for i, (gi, r) in enumerate(zip(gpu_instances, ratios, strict=True))]


def test_each_mig_device_carries_its_gpu_instance_gpm_and_the_card_health() -> None:
    """GPM per GPU instance (nvmlGpmMigSampleGet), the rest of the health the card's."""
    devices = SimulatedBackend(parse_scenario(doc_with(**CARD_HEALTH, mig_devices=_gpm_migs(0.25, 0.75)))).sample()
    assert [d.health.gpm for d in devices.devices] == [GpmSample(sm_active=0.25), GpmSample(sm_active=0.75)]
    assert {replace(d.health, gpm=None) for d in devices.devices} == {replace(EXPECTED, gpm=None)}


def test_a_mig_card_without_gpm_blanks_its_instances_gpm() -> None:
    doc = doc_with(**CARD_HEALTH, not_supported=["gpm"], mig_devices=_gpm_migs(0.25, 0.75))
    assert [d.sample.health.gpm for d in parse_scenario(doc).devices] == [None, None]


@pytest.mark.parametrize(("card", "migs", "message"), [
    ({"gpm": {"sm_active": 0.5}}, _gpm_migs(0.1, 0.2), "devices[0]: a GPU with mig_devices has its GPM on them"),
    ({}, [*_gpm_migs(0.1, gpu_instances=(1,)), {"uuid": "MIG-x", "profile": "1g.10gb", "gpu_instance_id": 9}],
     "devices[0].mig_devices: gpm on every MIG device or on none"),
    ({}, [{"uuid": "MIG-x", "profile": "1g.10gb", "gpm": {}}], "devices[0].mig_devices[0]: gpm needs gpu_instance_id"),
    ({}, _gpm_migs(0.1, 0.2, gpu_instances=(3, 3)), "devices[0].mig_devices[1]: MIG devices of one GPU instance share"),
])
def test_mig_gpm_rules_are_one_line_errors(card: dict[str, Any], migs: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)) as e:
        parse_scenario(doc_with(**card, mig_devices=migs))
    assert "\n" not in str(e.value)


def test_compute_instances_of_one_gpu_instance_share_its_gpm() -> None:
    migs = _gpm_migs(0.5, 0.5, gpu_instances=(3, 3))
    assert [d.sample.health.gpm for d in parse_scenario(doc_with(mig_devices=migs)).devices] == [
        GpmSample(sm_active=0.5)] * 2


@pytest.mark.parametrize("key", sorted(HEALTH_KEYS - {"gpm"}))
def test_a_mig_device_cannot_carry_health_of_its_own(key: str) -> None:
    """Health (NVLink among it) is the card's, GPM aside (its GPU instance's): on a MIG device it is refused,
    so a card's MIG devices cannot disagree about its links and the rows can take them from any of them."""
    mig = {"uuid": "MIG-a", "profile": "3g.40gb", key: HEALTH[key]}
    with pytest.raises(ScenarioError, match=re.escape(f"devices[0].mig_devices[0]: unknown key(s) {key};")) as e:
        parse_scenario(doc_with(**CARD_HEALTH, mig_devices=[mig]))
    assert "\n" not in str(e.value)


def test_without_nvlink_the_simulated_node_reports_no_links() -> None:
    migs = [{"uuid": "MIG-a", "profile": "3g.40gb"}, {"uuid": "MIG-b", "profile": "3g.40gb"}]
    for doc in (doc_with(**HEALTH), doc_with(**CARD_HEALTH, mig_devices=migs)):
        on, off = SimulatedBackend(parse_scenario(doc)), SimulatedBackend(parse_scenario(doc), nvlink=False)
        for _ in range(2):
            want, got = on.sample().devices, off.sample().devices
            assert all(d.health.nvlinks == EXPECTED.nvlinks for d in want)
            assert [replace(d.health, nvlinks=()) for d in want] == [d.health for d in got]


def test_a_lost_device_reports_no_health() -> None:
    dev = SimulatedBackend(parse_scenario(doc_with(**HEALTH, lost_after_ticks=0))).sample().devices[0]
    assert dev.lost and dev.health == DeviceHealth()


# --- properties -------------------------------------------------------------------------------

counts = st.integers(0, 2**64 - 1)
ratios = st.one_of(st.floats(0, 1), st.integers(0, 1))
nvlink = st.fixed_dictionaries({"link": st.integers(0, 17), "active": st.integers(0, 1)}, optional={
    k: counts for k in sorted(NVLINK_KEYS - {"link", "active"})})  # sorted: set order follows the hash seed
valid_health = st.fixed_dictionaries({}, optional={
    **{k: st.integers(0, top if top is not None else 2**64 - 1) for k, top in HEALTH_INT_KEYS.items()},
    "nvlinks": st.lists(nvlink, max_size=18, unique_by=lambda n: n["link"]),
    "gpm": st.fixed_dictionaries({}, optional={k: ratios for k in sorted(GPM_KEYS)}),
})


def expected_health(d: dict[str, Any]) -> DeviceHealth:
    """DeviceHealth built from a valid mapping by hand, independent of the parser."""
    links = sorted(d.get("nvlinks", []), key=lambda n: n["link"])
    ints = {k: d[k] for k in HEALTH_INT_KEYS if k in d}
    if ints.keys() & REMAP_KEYS:  # one call: the others read 0
        ints = {**dict.fromkeys(REMAP_KEYS, 0), **ints}
    return DeviceHealth(
        **ints,
        nvlinks=tuple(NvLinkSample(
            n["link"], n["active"] == 1,
            n["tx_kibibytes"] * KIB if "tx_kibibytes" in n else None,
            n["rx_kibibytes"] * KIB if "rx_kibibytes" in n else None,
            n.get("crc_errors"), n.get("replay_errors"), n.get("recovery_errors")) for n in links),
        gpm=None if "gpm" not in d else GpmSample(**{k: float(v) for k, v in d["gpm"].items()}),
    )


@given(valid_health, st.sets(st.sampled_from(sorted(HEALTH_KEYS))))
@settings(max_examples=200)
def test_valid_mappings_round_trip(health: dict[str, Any], blanked: set[str]) -> None:
    assert parse_health(health, "d", frozenset()) == expected_health(health)
    if blanked & REMAP_KEYS:
        blanked = blanked | REMAP_KEYS  # one call answers all four
    kept = {k: v for k, v in health.items() if k not in blanked}
    assert parse_health(health, "d", frozenset(blanked)) == expected_health(kept)


def valid_int(key: str, value: object) -> bool:
    top = HEALTH_INT_KEYS[key]
    return (isinstance(value, int) and not isinstance(value, bool) and value >= 0
            and (top is None or value <= top))


@given(st.sampled_from(sorted(HEALTH_INT_KEYS)), documents)
@settings(max_examples=300)
def test_an_integer_key_loads_exactly_when_valid(key: str, value: object) -> None:
    try:
        got = parse_health({key: value}, "d", frozenset())
    except ScenarioError as e:
        assert key in str(e) and "\n" not in str(e)
        assert not valid_int(key, value)
        return
    assert value is None or (valid_int(key, value) and getattr(got, key) == value)


@given(st.sampled_from(sorted(HEALTH_KEYS)), documents, valid_health, st.data())
@settings(max_examples=300, deadline=None)
def test_garbage_anywhere_gives_a_scenario_error_and_nothing_else(key: str, garbage: object,
                                                                  health: dict[str, Any], data: st.DataObject) -> None:
    doc = doc_with(**copy.deepcopy(health))
    target = doc["devices"][0]
    # Put the garbage inside a link or the gpm mapping when there is one, else at the key itself.
    if key == "nvlinks" and target.get("nvlinks"):
        target, key = target["nvlinks"][0], data.draw(st.sampled_from(sorted(NVLINK_KEYS)))
    elif key == "gpm" and "gpm" in target:
        target, key = target["gpm"], data.draw(st.sampled_from(sorted(GPM_KEYS)))
    target[key] = garbage
    try:
        scenario = parse_scenario(doc)
    except ScenarioError as e:
        assert str(e) and "\n" not in str(e)
        return
    SimulatedBackend(scenario).sample()  # what loads also samples


@given(counts, st.one_of(st.none(), st.integers(0, 2**32)), st.integers(0, 10**6))
def test_energy_is_base_plus_power_times_ticks(base: int, power: int | None, ticks: int) -> None:
    got = energy_at(DeviceHealth(energy_millijoules=base), power, ticks).energy_millijoules
    assert got == base + (power or 0) * ticks
    assert energy_at(DeviceHealth(), power, ticks) == DeviceHealth()


def test_the_health_node_scenario_has_what_its_header_promises() -> None:
    devices = [d.sample for d in parse_scenario(yaml.safe_load(
        (Path(__file__).parent / "scenarios" / "health_node.yaml").read_text())).devices]
    h100 = [d for d in devices if d.name == "NVIDIA H100 80GB HBM3"]
    assert len(h100) == 8 and all(len(d.health.nvlinks) == 18 and d.health.gpm for d in h100)
    by_minor = {d.minor_number: d for d in devices if d.parent_uuid is None}
    assert by_minor[7].health.remapped_rows_pending == 1 and by_minor[6].health.remapped_rows_failure == 1
    assert by_minor[3].health.pcie_replay_count > 0 and by_minor[2].clocks_event_reasons == 0x24
    a100 = by_minor[8].health
    assert (a100.gpm, a100.fan_speed_percent, a100.nvlinks) == (None, None, ())
    migs = [d for d in devices if d.parent_uuid]
    assert len(migs) == 2 and migs[0].health == migs[1].health and migs[0].health.energy_millijoules
    assert by_minor[10].health.retired_pages_pending == 1


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.lists(st.tuples(st.booleans(), st.sampled_from([None, 1, 2]), st.sampled_from([0.25, 0.5])),
                               min_size=1, max_size=4))
def test_the_simulated_node_and_the_fake_agree_on_mig_gpm(card_gpm: bool, migs: list[tuple[bool, int | None, float]]
                                                          ) -> None:
    """Any placement of gpm on a MIG card: both parsers accept it, or both refuse it with the same one line."""
    from tests.fake_nvml import FakeNvmlError, config_text

    entries = [{"uuid": f"MIG-{j}", "profile": "1g.10gb", **({} if gi is None else {"gpu_instance_id": gi}),
                **({"gpm": {"sm_active": r}} if has else {})} for j, (has, gi, r) in enumerate(migs)]
    doc = doc_with(**({"gpm": {"sm_active": 0.5}} if card_gpm else {}), mig_devices=entries)
    simulated = fake = None
    try:
        parse_scenario(copy.deepcopy(doc))
    except ScenarioError as e:
        simulated = str(e)
    try:
        config_text(copy.deepcopy(doc))
    except FakeNvmlError as e:
        fake = str(e)
    assert simulated == fake
