"""The health families (exporter/exposition/health_rows.py) as the exporter renders them.

Device samples are built directly and go through the real build_families and renderer; the
exposition is read back with prometheus_client's parser, as Prometheus would.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution.attribute import NONE, DeviceAttribution, NodeAttribution
from exporter.exposition.health_rows import (
    CLOCKS_EVENT_REASONS,
    card_name,
    decode_clocks_event_reasons,
    health_families,
)
from exporter.exposition.rows import ExporterStats, LabelNames, build_families
from exporter.exposition.snapshot import render
from exporter.exposition.status import build_status
from exporter.model import EMPTY, DeviceHealth, DeviceSample, GpmSample, NodeSample, NvLinkSample
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config

NODE = "n1"
CARD = "GPU-11111111-2222-3333-4444-555555555555"
HEALTH = DeviceHealth(
    energy_millijoules=123_456_789, power_limit_milliwatts=700_000, fan_speed_percent=37, performance_state=0,
    memory_temperature_celsius=71, pcie_tx_kilobytes_per_second=2_000, pcie_rx_kilobytes_per_second=3_000,
    pcie_replay_count=5, pcie_link_generation=5, pcie_link_width=16, retired_pages_single_bit=2,
    retired_pages_double_bit=1, retired_pages_pending=0, remapped_rows_correctable=3, remapped_rows_uncorrectable=1,
    remapped_rows_pending=1, remapped_rows_failure=0,
    nvlinks=(NvLinkSample(0, True, 1024 * 10, 1024 * 20, 1, 2, 3), NvLinkSample(1, False, 0, 0, 0, 0, 0)),
    gpm=GpmSample(0.5, 0.25, 0.125, 0.75, 0.0625),
)
DEVICE = DeviceSample(index=0, uuid=CARD, name="NVIDIA H100 80GB HBM3", minor_number=0,
                      memory_total_bytes=80 << 30, memory_used_bytes=1 << 30, memory_reserved_bytes=512 << 20,
                      clocks_event_reasons=0x4 | 0x40, health=HEALTH)
BASE = {"node_name": NODE, "uuid": CARD, "minor_number": "0", "name": DEVICE.name}
ALL_FAMILIES = {
    "nvidia_gpu_energy_consumption_joules": "counter", "nvidia_gpu_power_limit_watts": "gauge",
    "nvidia_gpu_fan_speed_ratio": "gauge", "nvidia_gpu_performance_state": "gauge",
    "nvidia_gpu_memory_temperature_celsius": "gauge", "nvidia_gpu_memory_reserved_bytes": "gauge",
    "nvidia_gpu_pcie_transmit_bytes_per_second": "gauge", "nvidia_gpu_pcie_receive_bytes_per_second": "gauge",
    "nvidia_gpu_pcie_replays": "counter", "nvidia_gpu_pcie_link_generation": "gauge",
    "nvidia_gpu_pcie_link_width": "gauge", "nvidia_gpu_retired_pages": "gauge",
    "nvidia_gpu_retired_pages_pending": "gauge", "nvidia_gpu_remapped_rows": "gauge",
    "nvidia_gpu_remapped_rows_pending": "gauge", "nvidia_gpu_remapped_rows_failure": "gauge",
    "nvidia_gpu_clocks_event_reason": "gauge", "nvidia_gpu_nvlink_up": "gauge",
    "nvidia_gpu_nvlink_transmit_bytes": "counter", "nvidia_gpu_nvlink_receive_bytes": "counter",
    "nvidia_gpu_nvlink_errors": "counter", "nvidia_gpu_graphics_engine_active_ratio": "gauge",
    "nvidia_gpu_sm_active_ratio": "gauge", "nvidia_gpu_sm_occupancy_ratio": "gauge",
    "nvidia_gpu_tensor_pipe_active_ratio": "gauge", "nvidia_gpu_dram_active_ratio": "gauge",
}
EMPTY_ATTR = NodeAttribution(devices=(), allocations=(), pods=(), skips=EMPTY)


def exposition(*devices: DeviceSample) -> str:
    families = build_families(EMPTY_ATTR, NodeSample(1.0, tuple(devices)), NODE, LabelNames(), ExporterStats())
    return render(families).decode()


def parsed(*devices: DeviceSample) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """family -> (type, {sorted labels: value}) for the health families."""
    out = {}
    for fam in text_string_to_metric_families(exposition(*devices)):
        if fam.name in ALL_FAMILIES:
            out[fam.name] = (fam.type, {tuple(sorted(s.labels.items())): s.value for s in fam.samples})
    return out


def value(fams: dict, family: str, **extra: str) -> float | None:
    labels = tuple(sorted({**BASE, **extra}.items()))
    return fams[family][1].get(labels) if family in fams else None


def test_every_family_with_its_type_units_and_labels() -> None:
    fams = parsed(DEVICE)
    assert {name: kind for name, (kind, _) in fams.items()} == ALL_FAMILIES
    assert value(fams, "nvidia_gpu_energy_consumption_joules") == 123_456.789
    assert value(fams, "nvidia_gpu_power_limit_watts") == 700.0
    assert value(fams, "nvidia_gpu_fan_speed_ratio") == 0.37
    assert value(fams, "nvidia_gpu_performance_state") == 0
    assert value(fams, "nvidia_gpu_memory_temperature_celsius") == 71
    assert value(fams, "nvidia_gpu_memory_reserved_bytes") == 512 << 20
    assert value(fams, "nvidia_gpu_pcie_transmit_bytes_per_second") == 2_000 * 1024
    assert value(fams, "nvidia_gpu_pcie_receive_bytes_per_second") == 3_000 * 1024
    assert value(fams, "nvidia_gpu_pcie_replays") == 5
    assert (value(fams, "nvidia_gpu_pcie_link_generation"), value(fams, "nvidia_gpu_pcie_link_width")) == (5, 16)
    assert value(fams, "nvidia_gpu_retired_pages", cause="single_bit_ecc") == 2
    assert value(fams, "nvidia_gpu_retired_pages", cause="double_bit_ecc") == 1
    assert value(fams, "nvidia_gpu_retired_pages_pending") == 0
    assert value(fams, "nvidia_gpu_remapped_rows", type="correctable") == 3
    assert value(fams, "nvidia_gpu_remapped_rows", type="uncorrectable") == 1
    assert (value(fams, "nvidia_gpu_remapped_rows_pending"), value(fams, "nvidia_gpu_remapped_rows_failure")) == (1, 0)
    assert value(fams, "nvidia_gpu_graphics_engine_active_ratio") == 0.5
    assert value(fams, "nvidia_gpu_sm_active_ratio") == 0.25
    assert value(fams, "nvidia_gpu_sm_occupancy_ratio") == 0.125
    assert value(fams, "nvidia_gpu_tensor_pipe_active_ratio") == 0.75
    assert value(fams, "nvidia_gpu_dram_active_ratio") == 0.0625


def test_counters_render_with_total_and_help_names_the_nvml_call() -> None:
    text = exposition(DEVICE)
    for name in ("nvidia_gpu_energy_consumption_joules", "nvidia_gpu_pcie_replays", "nvidia_gpu_nvlink_errors"):
        assert f"# TYPE {name}_total counter\n" in text and f"\n{name}_total{{" in text
    assert "# HELP nvidia_gpu_energy_consumption_joules_total " in text
    assert "nvmlDeviceGetTotalEnergyConsumption" in text and "nvmlDeviceGetRemappedRows" in text
    assert "_created" not in text
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")
             and line.split()[2].removesuffix("_total") in ALL_FAMILIES]
    assert len(helps) == len(ALL_FAMILIES) and all("nvml" in h for h in helps)


def test_nvlink_families_per_link() -> None:
    fams = parsed(DEVICE)
    assert value(fams, "nvidia_gpu_nvlink_up", link="0") == 1 and value(fams, "nvidia_gpu_nvlink_up", link="1") == 0
    assert value(fams, "nvidia_gpu_nvlink_transmit_bytes", link="0") == 10 * 1024
    assert value(fams, "nvidia_gpu_nvlink_receive_bytes", link="0") == 20 * 1024
    errors = {dict(k)["type"]: v for k, v in fams["nvidia_gpu_nvlink_errors"][1].items() if dict(k)["link"] == "0"}
    assert errors == {"crc": 1, "replay": 2, "recovery": 3}
    assert len(fams["nvidia_gpu_nvlink_errors"][1]) == 6 and len(fams["nvidia_gpu_nvlink_up"][1]) == 2
    half = replace(DEVICE, health=replace(HEALTH, nvlinks=(NvLinkSample(3, active=True),)))
    fams = parsed(half)
    assert fams["nvidia_gpu_nvlink_up"][1] == {tuple(sorted({**BASE, "link": "3"}.items())): 1}
    assert not {"nvidia_gpu_nvlink_transmit_bytes", "nvidia_gpu_nvlink_errors"} & set(fams)


# The contract's table (nvml.h nvmlClocksEventReason* bits), written out so the module cannot drift.
REASON_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
               0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
               0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def test_all_nine_reason_bits_and_an_unknown_high_bit_ignored() -> None:
    assert dict(CLOCKS_EVENT_REASONS) == REASON_BITS
    for i, (bit, name) in enumerate(CLOCKS_EVENT_REASONS):
        assert bit == 1 << i
        fams = parsed(replace(DEVICE, clocks_event_reasons=bit | 1 << 31))
        reasons = {dict(k)["reason"]: v for k, v in fams["nvidia_gpu_clocks_event_reason"][1].items()}
        assert reasons == {n: (1.0 if n == name else 0.0) for _, n in CLOCKS_EVENT_REASONS}
    raw = {tuple(sorted(s.labels.items())): s.value for fam in text_string_to_metric_families(
        exposition(replace(DEVICE, clocks_event_reasons=0x1FF | 1 << 40)))
        for s in fam.samples if s.name == "nvidia_gpu_clocks_event_reasons"}
    assert raw == {tuple(sorted(BASE.items())): float(0x1FF | 1 << 40)}  # the raw mask keeps the unknown bit
    assert decode_clocks_event_reasons(0x44) == ("sw_power_cap", "hw_thermal_slowdown")
    assert decode_clocks_event_reasons(1 << 9) == ()
    none = parsed(replace(DEVICE, clocks_event_reasons=0))
    assert set(none["nvidia_gpu_clocks_event_reason"][1].values()) == {0.0}


def test_none_fields_have_no_row() -> None:
    bare = replace(DEVICE, memory_reserved_bytes=None, clocks_event_reasons=None, health=DeviceHealth())
    assert parsed(bare) == {}
    only_rows = replace(bare, health=DeviceHealth(remapped_rows_uncorrectable=0, retired_pages_double_bit=4))
    fams = parsed(only_rows)
    assert set(fams) == {"nvidia_gpu_remapped_rows", "nvidia_gpu_retired_pages"}
    assert list(fams["nvidia_gpu_remapped_rows"][1].values()) == [0.0]  # a real 0 stays
    assert [dict(k)["cause"] for k in fams["nvidia_gpu_retired_pages"][1]] == ["double_bit_ecc"]


def test_gpm_families_only_where_gpm_exists() -> None:
    fams = parsed(replace(DEVICE, health=replace(HEALTH, gpm=None)))
    assert not [n for n in fams if n.endswith("_active_ratio") or n == "nvidia_gpu_sm_occupancy_ratio"]
    partial = parsed(replace(DEVICE, health=replace(HEALTH, gpm=GpmSample(sm_active=0.0))))
    assert value(partial, "nvidia_gpu_sm_active_ratio") == 0.0
    assert "nvidia_gpu_tensor_pipe_active_ratio" not in partial


def test_mig_devices_repeat_the_cards_values_under_their_own_uuid() -> None:
    migs = [replace(DEVICE, index=i, uuid=f"MIG-{i}", name=f"{DEVICE.name} MIG 3g.40gb", parent_uuid=CARD,
                    gpu_instance_id=i + 1, compute_instance_id=0, mig_profile="3g.40gb",
                    memory_reserved_bytes=(i + 1) << 20) for i in range(2)]
    fams = parsed(*migs)
    for name in ALL_FAMILIES:
        uuids = sorted({dict(k)["uuid"] for k in fams[name][1]})
        if name.startswith("nvidia_gpu_nvlink_"):  # the card's links: once, on the card
            assert uuids == [CARD] and {dict(k)["name"] for k in fams[name][1]} == {DEVICE.name}, name
            continue
        assert uuids == ["MIG-0", "MIG-1"], name
        if name == "nvidia_gpu_memory_reserved_bytes":
            continue  # per MIG device, its own
        per_uuid = [sorted((tuple(x for x in k if x[0] not in ("uuid", "name")), v) for k, v in fams[name][1].items()
                           if dict(k)["uuid"] == u) for u in uuids]
        assert per_uuid[0] == per_uuid[1], name
    reserved = {dict(k)["uuid"]: v for k, v in fams["nvidia_gpu_memory_reserved_bytes"][1].items()}
    assert reserved == {"MIG-0": 1 << 20, "MIG-1": 2 << 20}


def test_lost_device_has_no_health_rows() -> None:
    assert parsed(DEVICE.without_values(lost=True)) == {}


def test_status_page_carries_limit_energy_reasons_and_row_remap() -> None:
    attr = NodeAttribution(devices=(DeviceAttribution(DEVICE, NONE, (), (), ()),), allocations=(), pods=(),
                           skips=EMPTY)
    status = build_status(attr, NodeSample(1.0, (DEVICE,)), ExporterStats(), None, NODE, 1.0)
    gpu = status["gpus"][0]
    assert gpu["power_limit_watts"] == 700.0 and gpu["energy_joules"] == 123_456.789
    assert list(gpu["clocks_event_reasons"]) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert dict(gpu["remapped_rows"]) == {"correctable": 3, "uncorrectable": 1, "pending": True, "failure": False}
    bare = replace(DEVICE, clocks_event_reasons=None, health=DeviceHealth())
    attr = replace(attr, devices=(DeviceAttribution(bare, NONE, (), (), ()),))
    gpu = build_status(attr, NodeSample(1.0, (bare,)), ExporterStats(), None, NODE, 1.0)["gpus"][0]
    assert (gpu["power_limit_watts"], gpu["energy_joules"], gpu["clocks_event_reasons"], gpu["remapped_rows"]) == (
        None, None, None, None)


# ------------------------------------------------------------------ NVLink on MIG cards: the card's, once

NVLINK_FAMILIES = ("nvidia_gpu_nvlink_up", "nvidia_gpu_nvlink_transmit_bytes", "nvidia_gpu_nvlink_receive_bytes",
                   "nvidia_gpu_nvlink_errors")
H100_LINKS = tuple(NvLinkSample(n, True, 1024 * n, 2048 * n, 0, n % 2, 0) for n in range(18))


def mig_devices(card: DeviceSample, n: int, profile: str = "1g.10gb") -> tuple[DeviceSample, ...]:
    """``card`` in MIG mode: ``n`` MIG devices repeating its health, as both backends give them."""
    return tuple(replace(card, uuid=f"MIG-{card.minor_number}{j:07d}-0000-5000-8000-000000000000",
                         name=f"{card.name} MIG {profile}", parent_uuid=card.uuid, gpu_instance_id=7 + j,
                         compute_instance_id=0, mig_profile=profile, memory_total_bytes=10 << 30)
                 for j in range(n))


def nvlink_series(*devices: DeviceSample) -> dict[tuple[str, frozenset], float]:
    """(family, labels) -> value of the NVLink series the exporter renders for ``devices``."""
    families = build_families(EMPTY_ATTR, NodeSample(1.0, tuple(devices)), NODE, LabelNames(), ExporterStats())
    return {(smp.name, frozenset(smp.labels.items())): smp.value
            for fam in text_string_to_metric_families(render(families).decode()) for smp in fam.samples
            if fam.name in NVLINK_FAMILIES}


def test_a_mig_card_has_its_nvlink_rows_once_on_the_card() -> None:
    card = replace(DEVICE, health=replace(HEALTH, nvlinks=H100_LINKS))
    migs = mig_devices(card, 7)
    got = nvlink_series(*migs)
    assert len(got) == 18 * 6  # not 7 x 18 x 6 = 756
    for _, lbl in got:  # the card's labels: its GPU uuid, minor number and name (no " MIG 1g.10gb")
        assert {k: v for k, v in lbl if k not in ("link", "type")} == BASE
    assert got[("nvidia_gpu_nvlink_transmit_bytes_total", frozenset({**BASE, "link": "5"}.items()))] == 5 * 1024
    assert got[("nvidia_gpu_nvlink_errors_total", frozenset({**BASE, "link": "3", "type": "replay"}.items()))] == 1
    # the whole card, not in MIG mode, renders the very same series
    assert nvlink_series(card) == got
    # the other health families stay per MIG device
    fams = build_families(EMPTY_ATTR, NodeSample(1.0, migs), NODE, LabelNames(), ExporterStats())
    limits = next(f for f in fams if f.name == "nvidia_gpu_power_limit_watts")
    assert sorted(s.labels["uuid"] for s in limits.samples) == sorted(m.uuid for m in migs)


def test_a_mig_device_without_values_leaves_the_links_to_its_card_mates() -> None:
    card = replace(DEVICE, health=replace(HEALTH, nvlinks=H100_LINKS))
    first, *rest = mig_devices(card, 3)
    blank = first.without_values(lost=False)  # a slot whose handle could not be had this cycle
    got = nvlink_series(blank, *rest)
    assert len(got) == 18 * 6 and {dict(lbl)["uuid"] for _, lbl in got} == {CARD}
    lost = [m.without_values(lost=True) for m in (first, *rest)]
    assert nvlink_series(*lost) == {}  # a lost card: nothing read, no links


def test_two_mig_cards_and_a_whole_gpu() -> None:
    a = replace(DEVICE, health=replace(HEALTH, nvlinks=H100_LINKS))
    b = replace(a, index=1, uuid="GPU-b0000000-0000-4000-8000-000000000001", minor_number=1,
                health=replace(HEALTH, nvlinks=H100_LINKS[:4]))
    c = replace(a, index=2, uuid="GPU-c0000000-0000-4000-8000-000000000002", minor_number=2, name="NVIDIA A30",
                health=replace(HEALTH, nvlinks=()))
    got = nvlink_series(*mig_devices(a, 2, "3g.40gb"), *mig_devices(b, 4, "1g.10gb+me"), c)
    per_card = {}
    for _, lbl in got:
        per_card[dict(lbl)["uuid"]] = per_card.get(dict(lbl)["uuid"], 0) + 1
    assert per_card == {a.uuid: 108, b.uuid: 24}  # the card without NVLink has none


def test_no_nvlink_family_without_nvlink_metrics() -> None:
    """With --no-nvlink-metrics the backends read no links (tests/test_nvml_health.py,
    tests/test_simulate_health.py): the same devices without links render every family but NVLink."""
    card = replace(DEVICE, health=replace(HEALTH, nvlinks=H100_LINKS))
    devices = (*mig_devices(card, 7), replace(card, index=1, uuid="GPU-1", minor_number=1))
    unlinked = tuple(replace(d, health=replace(d.health, nvlinks=())) for d in devices)
    assert nvlink_series(*unlinked) == {}
    fams = {f.name for f in health_families(unlinked, NODE)}
    assert not {f for f in fams if "nvlink" in f}
    assert fams == {f.name for f in health_families(devices, NODE)} - set(NVLINK_FAMILIES)


# any card name, " MIG " inside it included (the profile never holds one)
CARD_NAMES = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40) | st.sampled_from(
    ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "a MIG b", "x MIG", "MIG "])
PROFILES = st.from_regex(r"[1-7]g\.[0-9]{1,3}gb(\+me|\+gfx)?", fullmatch=True)


@given(name=CARD_NAMES, profile=PROFILES)
def test_the_card_name_is_the_mig_device_name_without_its_profile(name: str, profile: str) -> None:
    card = replace(DEVICE, name=name)
    (mig,) = mig_devices(card, 1, profile)
    assert card_name(mig) == name and card_name(card) == name
    # a MIG name without the " MIG " NVML puts in it: the name as it is, rather than a guess
    assert card_name(replace(mig, name=profile)) == profile


@settings(max_examples=60, deadline=None)
@given(cards=st.lists(st.tuples(st.lists(st.integers(0, 17), unique=True, max_size=18), st.integers(0, 7)),
                      min_size=1, max_size=4))
def test_nvlink_rows_are_each_cards_links_once(cards: list[tuple[list[int], int]]) -> None:
    """Any mix of whole GPUs (0 MIG devices) and MIG cards: one set of links per card, on the card."""
    devices: list[DeviceSample] = []
    want: dict[str, set[str]] = {}
    for i, (links, n_migs) in enumerate(cards):
        card = replace(DEVICE, index=i, uuid=f"GPU-{i:08d}-0000-4000-8000-000000000000", minor_number=i,
                       health=replace(HEALTH, nvlinks=tuple(NvLinkSample(n, True, 1, 2, 3, 4, 5) for n in links)))
        devices.extend(mig_devices(card, n_migs) if n_migs else (card,))
        if links:
            want[card.uuid] = {str(n) for n in links}
    got = nvlink_series(*devices)
    assert len(got) == 6 * sum(len(v) for v in want.values())
    for family in ("nvidia_gpu_nvlink_up", "nvidia_gpu_nvlink_transmit_bytes_total"):
        rows = [dict(lbl) for n, lbl in got if n == family]
        assert {(r["uuid"], r["link"]) for r in rows} == {(u, link) for u, ls in want.items() for link in ls}
        assert all(r["name"] == DEVICE.name and r["minor_number"] == str(int(r["uuid"][4:12])) for r in rows)


U64 = st.none() | st.integers(0, 2**64 - 1)
FLAG = st.none() | st.integers(0, 1)
RATIO = st.none() | st.floats(0, 1)
LINKS = st.lists(st.integers(0, 17), unique=True, max_size=18).flatmap(lambda ids: st.tuples(*[
    st.builds(NvLinkSample, st.just(i), st.none() | st.booleans(), U64, U64, U64, U64, U64) for i in ids]))
HEALTHS = st.builds(
    DeviceHealth, energy_millijoules=U64, power_limit_milliwatts=U64, fan_speed_percent=st.none() | st.integers(0, 100),
    performance_state=st.none() | st.integers(0, 15), memory_temperature_celsius=U64,
    pcie_tx_kilobytes_per_second=U64, pcie_rx_kilobytes_per_second=U64, pcie_replay_count=U64,
    pcie_link_generation=U64, pcie_link_width=U64, retired_pages_single_bit=U64, retired_pages_double_bit=U64,
    retired_pages_pending=FLAG, remapped_rows_correctable=U64, remapped_rows_uncorrectable=U64,
    remapped_rows_pending=FLAG, remapped_rows_failure=FLAG, nvlinks=LINKS,
    gpm=st.none() | st.builds(GpmSample, RATIO, RATIO, RATIO, RATIO, RATIO))


@settings(max_examples=60, deadline=None)
@given(health=HEALTHS, reasons=st.none() | st.integers(0, 2**64 - 1), reserved=U64)
def test_any_health_renders_valid_exposition(health: DeviceHealth, reasons: int | None, reserved: int | None) -> None:
    device = replace(DEVICE, health=health, clocks_event_reasons=reasons, memory_reserved_bytes=reserved)
    fams = parsed(device)
    assert set(fams) <= set(ALL_FAMILIES)
    for name, (kind, samples) in fams.items():
        assert kind == ALL_FAMILIES[name] and samples, name
        assert all(v >= 0 for v in samples.values()), name
    links = {str(link.link) for link in health.nvlinks}
    for name in ("nvidia_gpu_nvlink_up", "nvidia_gpu_nvlink_errors", "nvidia_gpu_nvlink_transmit_bytes"):
        assert {dict(k)["link"] for k in fams.get(name, ("", {}))[1]} <= links
    assert ("nvidia_gpu_clocks_event_reason" in fams) == (reasons is not None)
    assert ("nvidia_gpu_sm_active_ratio" in fams) == (health.gpm is not None and health.gpm.sm_active is not None)
    assert ("nvidia_gpu_energy_consumption_joules" in fams) == (health.energy_millijoules is not None)


def test_docs_list_every_health_family_and_reason() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = doc.split("## Health (NVML, no DCGM)", 1)[1].split("\n## ", 1)[0]
    for name, kind in ALL_FAMILIES.items():
        assert f"`{name}{'_total' if kind == 'counter' else ''}`" in section, name
    for bit, reason in CLOCKS_EVENT_REASONS:
        assert f"| `{bit:#x}` | `{reason}` |" in section, reason


# ------------------------------------------------------------------ end to end: scenario -> simulated node

HEALTH_NODE = Path(__file__).resolve().parent / "scenarios" / "health_node.yaml"
# scenario key -> (family, extra labels, NVML units per base unit)
SCENARIO_KEYS: dict[str, tuple[str, dict[str, str], float]] = {
    "power_limit_milliwatts": ("nvidia_gpu_power_limit_watts", {}, 1000),
    "fan_speed_percent": ("nvidia_gpu_fan_speed_ratio", {}, 100),
    "performance_state": ("nvidia_gpu_performance_state", {}, 1),
    "memory_temperature_celsius": ("nvidia_gpu_memory_temperature_celsius", {}, 1),
    "pcie_tx_kilobytes_per_second": ("nvidia_gpu_pcie_transmit_bytes_per_second", {}, 1 / 1024),
    "pcie_rx_kilobytes_per_second": ("nvidia_gpu_pcie_receive_bytes_per_second", {}, 1 / 1024),
    "pcie_replay_count": ("nvidia_gpu_pcie_replays_total", {}, 1),
    "pcie_link_generation": ("nvidia_gpu_pcie_link_generation", {}, 1),
    "pcie_link_width": ("nvidia_gpu_pcie_link_width", {}, 1),
    "retired_pages_single_bit": ("nvidia_gpu_retired_pages", {"cause": "single_bit_ecc"}, 1),
    "retired_pages_double_bit": ("nvidia_gpu_retired_pages", {"cause": "double_bit_ecc"}, 1),
    "retired_pages_pending": ("nvidia_gpu_retired_pages_pending", {}, 1),
    "remapped_rows_correctable": ("nvidia_gpu_remapped_rows", {"type": "correctable"}, 1),
    "remapped_rows_uncorrectable": ("nvidia_gpu_remapped_rows", {"type": "uncorrectable"}, 1),
    "remapped_rows_pending": ("nvidia_gpu_remapped_rows_pending", {}, 1),
    "remapped_rows_failure": ("nvidia_gpu_remapped_rows_failure", {}, 1),
}
GPM_FAMILIES = {"graphics_active": "nvidia_gpu_graphics_engine_active_ratio", "sm_active": "nvidia_gpu_sm_active_ratio",
                "sm_occupancy": "nvidia_gpu_sm_occupancy_ratio", "tensor_active": "nvidia_gpu_tensor_pipe_active_ratio",
                "dram_active": "nvidia_gpu_dram_active_ratio"}


def _node_cycles(n: int) -> list:
    """``n`` snapshots of the simulated health node, through the daemon's real pipeline."""
    daemon = build_daemon(load_config(["--simulate", str(HEALTH_NODE)]))
    try:
        return [daemon.pipeline.step()[0] for _ in range(n)]
    finally:
        daemon.close()


def _series(body: bytes) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _rows(scenario: dict) -> list[tuple[dict, dict, str]]:
    """(card mapping, device mapping, uuid) of every device row: a MIG card's rows are its MIG devices'."""
    out = []
    for card in scenario["devices"]:
        for dev in card.get("mig_devices") or [card]:
            out.append((card, dev, dev["uuid"]))
    return out


def test_health_node_end_to_end() -> None:
    scenario = yaml.safe_load(HEALTH_NODE.read_text())
    first, second = _node_cycles(2)
    text = second.body.decode()
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family is rendered twice"
    got, before = _series(second.body), _series(first.body)

    def at(family: str, uuid: str, **extra: str) -> float | None:
        return next((v for (n, lbl), v in got.items() if n == family and dict(lbl).get("uuid") == uuid
                     and all(dict(lbl).get(k) == e for k, e in extra.items())), None)

    for card, dev, uuid in _rows(scenario):
        blank = set(card.get("not_supported") or ())
        for key, (family, extra, per_unit) in SCENARIO_KEYS.items():
            want = None if key in blank or card.get(key) is None else card[key] / per_unit
            assert at(family, uuid, **extra) == want, (uuid, key)
        # per MIG device, not the card's; no key reads 0 wherever memory info answers (drivers >= 515)
        reserved = dev.get("memory_reserved_bytes", 0 if dev.get("memory_total_bytes") is not None else None)
        assert at("nvidia_gpu_memory_reserved_bytes", uuid) == reserved, uuid
        # energy: the configured counter, then one 1 s tick at the configured power (rate = power)
        e0 = next(v for (n, lbl), v in before.items()
                  if n == "nvidia_gpu_energy_consumption_joules_total" and dict(lbl)["uuid"] == uuid)
        assert e0 == card["energy_millijoules"] / 1000
        assert at("nvidia_gpu_energy_consumption_joules_total", uuid) - e0 == card["power_usage_milliwatts"] / 1000
        mask = card["clocks_event_reasons"]
        assert {r: at("nvidia_gpu_clocks_event_reason", uuid, reason=r) for _, r in CLOCKS_EVENT_REASONS} == {
            r: float(bool(mask & bit)) for bit, r in CLOCKS_EVENT_REASONS}
        gpm = None if "gpm" in blank else card.get("gpm")
        for key, family in GPM_FAMILIES.items():
            assert at(family, uuid) == (None if gpm is None else gpm.get(key)), (uuid, family)
    # NVLink is the card's: once per physical card, on the card's labels, none under a MIG uuid
    for card in scenario["devices"]:
        blank = set(card.get("not_supported") or ())
        links = [] if "nvlinks" in blank else card.get("nvlinks") or []
        uuid, labels = card["uuid"], {"minor_number": str(card["minor_number"]), "name": card["name"]}
        assert {dict(lbl)["link"] for (n, lbl), v in got.items()
                if n == "nvidia_gpu_nvlink_up" and dict(lbl)["uuid"] == uuid} == {str(x["link"]) for x in links}
        for x in links:
            link = str(x["link"])
            assert at("nvidia_gpu_nvlink_up", uuid, link=link, **labels) == x["active"]
            assert at("nvidia_gpu_nvlink_transmit_bytes_total", uuid, link=link, **labels) == x["tx_kibibytes"] * 1024
            assert at("nvidia_gpu_nvlink_receive_bytes_total", uuid, link=link, **labels) == x["rx_kibibytes"] * 1024
            for kind in ("crc", "replay", "recovery"):
                assert at("nvidia_gpu_nvlink_errors_total", uuid, link=link, type=kind, **labels) == x[f"{kind}_errors"]
    nvlink_uuids = {dict(lbl)["uuid"] for n, lbl in got if n.startswith("nvidia_gpu_nvlink_")}
    assert not {u for u in nvlink_uuids if u.startswith("MIG-")}
    mig_card = next(d for d in scenario["devices"] if d.get("mig_devices"))
    assert mig_card.get("nvlinks") and mig_card["uuid"] in nvlink_uuids  # the MIG card's links, on the card


def test_health_node_signals_an_operator_acts_on() -> None:
    """The scenario's story, read back: throttling, a bad link, reset and replace, NotSupported, MIG."""
    snap = _node_cycles(1)[0]
    got = _series(snap.body)

    def at(name: str, minor: str, **extra: str) -> list[float]:
        return [v for (n, lbl), v in got.items() if n == name and dict(lbl).get("minor_number") == minor
                and all(dict(lbl).get(k) == e for k, e in extra.items())]

    assert at("nvidia_gpu_clocks_event_reason", "2", reason="sw_power_cap") == [1.0]
    assert at("nvidia_gpu_clocks_event_reason", "2", reason="sw_thermal_slowdown") == [1.0]
    assert at("nvidia_gpu_clocks_event_reason", "2", reason="hw_slowdown") == [0.0]
    assert at("nvidia_gpu_nvlink_errors_total", "3", link="5", type="crc") == [37.0]
    assert at("nvidia_gpu_pcie_link_generation", "3") == [4.0]
    assert at("nvidia_gpu_remapped_rows_failure", "6") == [1.0] and at("nvidia_gpu_nvlink_up", "6", link="11") == [0]
    assert at("nvidia_gpu_remapped_rows_pending", "7") == [1.0]
    assert at("nvidia_gpu_fan_speed_ratio", "8") == [] and at("nvidia_gpu_sm_active_ratio", "8") == []
    assert at("nvidia_gpu_nvlink_up", "8") == [] and at("nvidia_gpu_retired_pages", "8") == []
    assert sorted(at("nvidia_gpu_power_limit_watts", "9")) == [165.0, 165.0]  # two MIG devices repeat the card
    assert len(at("nvidia_gpu_nvlink_up", "9")) == 4  # its four links once, on the card, not per MIG device
    assert at("nvidia_gpu_nvlink_errors_total", "9", link="3", type="crc") == [1.0]
    assert at("nvidia_gpu_retired_pages_pending", "10") == [1.0]
    gpus = {g["minor"]: g for g in snap.status["gpus"]}
    assert gpus[2]["power_limit_watts"] == 700.0
    assert list(gpus[2]["clocks_event_reasons"]) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert dict(gpus[6]["remapped_rows"])["failure"] is True and dict(gpus[7]["remapped_rows"])["pending"] is True
    assert gpus[10]["remapped_rows"] is None and gpus[9]["power_limit_watts"] == 165.0
    assert gpus[9]["energy_joules"] == 18_500_000.0


@pytest.mark.e2e
def test_health_node_passes_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/test.sh (installs Debian's prometheus)"
    body = _node_cycles(1)[0].body.decode()
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
