"""--dcgm-compat: dcgm-exporter's DCGM_FI_* names, types, units and labels (exporter/exposition/dcgm.py).

dcgm-exporter's own default counter set (tests/data/dcgm/default-counters.csv, release 4.5.3-4.8.2)
is the reference for names and types; its render template for the label set (tests/data/dcgm/SOURCE.md).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.attribute import EXCLUSIVE, NONE, SHARE, ContainerUsage, DeviceAttribution, NodeAttribution
from exporter.exposition.dcgm import (
    BASE_LABELS,
    CARD_FIELDS,
    FAMILY_NAMES,
    GPM_FIELDS,
    INSTANCE_FIELDS,
    MIG_LABELS,
    dcgm_families,
)
from exporter.exposition.snapshot import render
from exporter.model import DeviceHealth, DeviceSample, GpmSample, NodeSample, NvLinkSample, PodInfo
from exporter.shell import cli
from exporter.shell.config import load_config
from exporter.xid.events import WriterCounts
from exporter.xid.stats import XidCounters, last_xids
from tests.fake_nvml.health_config import with_every_health_key

DATA = Path(__file__).resolve().parent / "data" / "dcgm"
SCENARIO = Path(__file__).resolve().parent / "scenarios" / "dcgm_node.yaml"
MIB = 2**20
# In dcgm-exporter's default set but not exported: vGPU licensing is not an NVML device query we make.
NOT_EXPORTED = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
Labels = tuple[tuple[str, str], ...]  # in exposition order
Series = dict[tuple[str, Labels], float]


def csv_fields(include_commented: bool) -> dict[str, str]:
    """DCGM field -> Prometheus type in dcgm-exporter's CSV (the commented-out rows too if asked)."""
    out = {}
    for line in (DATA / "default-counters.csv").read_text().splitlines():
        m = re.match(r"^(#\s*)?(DCGM_FI_\w+)\s*,\s*(\w+)\s*,", line)
        if m and (include_commented or not m.group(1)):
            out[m.group(2)] = m.group(3)
    return out


def parse(text: str) -> Series:
    """{(name, labels): value} straight from the text (no client parser: it renames bare counters)."""
    out: Series = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        assert m, line
        labels = tuple(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def named(series: Series, name: str) -> dict[Labels, float]:
    return {labels: v for (n, labels), v in series.items() if n == name}


def pod(name: str, namespace: str) -> PodInfo:
    return PodInfo(uid=f"uid-{name}", name=name, namespace=namespace, node_name="n1", phase="Running", containers=())


def att(d: DeviceSample, mode: str = NONE, *holders: tuple[str, str, str]) -> DeviceAttribution:
    users = tuple(ContainerUsage(pod(p, ns), c, 10.0, 1, None) for c, ns, p in holders)
    return DeviceAttribution(device=d, mode=mode, users=users, unaccounted=(), processes=())


HEALTH = DeviceHealth(
    energy_millijoules=7_000_000, power_limit_milliwatts=300_000, fan_speed_percent=40, performance_state=2,
    memory_temperature_celsius=70, pcie_tx_kilobytes_per_second=10, pcie_rx_kilobytes_per_second=20,
    pcie_replay_count=3, pcie_link_generation=4, pcie_link_width=16, retired_pages_single_bit=1,
    retired_pages_double_bit=2, retired_pages_pending=1, remapped_rows_correctable=5, remapped_rows_uncorrectable=6,
    remapped_rows_pending=1, remapped_rows_failure=1,
    nvlinks=(NvLinkSample(0, True, 1024, 2048, 1, 2, 3), NvLinkSample(1, True, 4096, None, 10, None, 30)),
    gpm=GpmSample(0.5, 0.4, 0.3, 0.2, 0.1),
)
GPU0 = DeviceSample(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", minor_number=0, pci_bus_id="00000000:07:00.0",
                    memory_total_bytes=80 * 1024 * MIB, memory_used_bytes=10 * 1024 * MIB + 5,
                    memory_reserved_bytes=512 * MIB, utilization_gpu=70, utilization_memory=30, encoder_utilization=1,
                    decoder_utilization=2, power_usage_milliwatts=123_456, temperature_celsius=66, sm_clock_mhz=1980,
                    memory_clock_mhz=2619, ecc_corrected_total=8, ecc_uncorrected_total=9, clocks_event_reasons=4,
                    health=HEALTH)
GPU1 = DeviceSample(index=1, uuid="GPU-1", name="NVIDIA A10", minor_number=1, pci_bus_id="00000000:0F:00.0",
                    memory_total_bytes=24 * 1024 * MIB, memory_used_bytes=MIB, utilization_gpu=40,
                    temperature_celsius=50)
MIG_HEALTH = DeviceHealth(energy_millijoules=1000)


def mig(uuid: str, profile: str, gi: int, used: int) -> DeviceSample:
    return DeviceSample(index=2, uuid=uuid, name=f"NVIDIA A100-SXM4-80GB MIG {profile}", minor_number=2,
                        pci_bus_id="00000000:47:00.0", memory_total_bytes=20 * 1024 * MIB, memory_used_bytes=used,
                        power_usage_milliwatts=200_000, temperature_celsius=40, parent_uuid="GPU-2",
                        gpu_instance_id=gi, compute_instance_id=0, mig_profile=profile, health=MIG_HEALTH)


MIG_A, MIG_B = mig("MIG-a", "3g.40gb", 2, 3 * MIB), mig("MIG-b", "2g.20gb", 3, 0)
SAMPLE = NodeSample(timestamp=1.0, devices=(GPU0, GPU1, MIG_A, MIG_B), driver_version="570.86.15")
ATTR = NodeAttribution(devices=(att(GPU0, EXCLUSIVE, ("trainer", "ml", "train-0")),
                                att(GPU1, SHARE, ("a", "serving", "infer-a"), ("b", "serving", "infer-b")),
                                att(MIG_A, EXCLUSIVE, ("mig", "research", "mig-train")), att(MIG_B)),
                       allocations=(), pods=(), skips={})


def exposition(attr: NodeAttribution = ATTR, sample: NodeSample = SAMPLE,
               xids: dict[str, tuple[float, int]] | None = None) -> Series:
    return parse(render(dcgm_families(attr, sample, "node-1", xids)).decode())


def labels_of(series: Series, name: str, uuid_label: str) -> list[dict[str, str]]:
    return [dict(lbl) for lbl in named(series, name) if dict(lbl)["UUID"] == uuid_label]


# ---------------------------------------------------------------------- names and types


def test_every_default_counter_is_exported_with_dcgm_exporters_type() -> None:
    ours = {f.name: f.kind for f in (*INSTANCE_FIELDS, *CARD_FIELDS, *GPM_FIELDS)} | {"DCGM_FI_DEV_XID_ERRORS": "gauge"}
    default = {n: t for n, t in csv_fields(False).items() if t != "label"}
    assert set(default) - set(ours) == NOT_EXPORTED
    for name, kind in default.items():
        if name not in NOT_EXPORTED:
            assert ours[name] == kind, name
    # The commented-out rows (fields one enables in the CSV) we export keep the CSV's type too.
    for name, kind in csv_fields(True).items():
        if name in ours and kind != "label":
            assert ours[name] == kind, name
    assert len(set(FAMILY_NAMES)) == len(FAMILY_NAMES)


def test_counters_keep_dcgms_bare_names() -> None:
    text = render(dcgm_families(ATTR, SAMPLE, "node-1", {})).decode()
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "_total{" not in text.replace("_VOL_TOTAL{", "").replace("_COUNT_TOTAL{", "").replace(
        "BANDWIDTH_TOTAL{", "")
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in text


# ---------------------------------------------------------------------- units


def test_units_are_dcgms() -> None:
    s = exposition()
    gpu0 = next(lbl for lbl in named(s, "DCGM_FI_DEV_GPU_TEMP") if ("UUID", "GPU-0") in lbl)

    def v(name: str) -> float:
        return named(s, name)[gpu0]

    assert v("DCGM_FI_DEV_FB_USED") == 10 * 1024 - 512  # MiB, whole; DCGM's used excludes the reserved
    assert v("DCGM_FI_DEV_FB_FREE") == 70 * 1024 - 1  # total - used, rounded down
    assert v("DCGM_FI_DEV_FB_RESERVED") == 512 and v("DCGM_FI_DEV_FB_TOTAL") == 80 * 1024
    assert v("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(123.456)  # W
    assert v("DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == 300  # W
    assert v("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 7_000_000  # mJ
    assert (v("DCGM_FI_DEV_SM_CLOCK"), v("DCGM_FI_DEV_MEM_CLOCK")) == (1980, 2619)  # MHz
    assert (v("DCGM_FI_DEV_GPU_TEMP"), v("DCGM_FI_DEV_MEMORY_TEMP")) == (66, 70)  # C
    assert (v("DCGM_FI_DEV_GPU_UTIL"), v("DCGM_FI_DEV_MEM_COPY_UTIL")) == (70, 30)  # %
    assert (v("DCGM_FI_DEV_ENC_UTIL"), v("DCGM_FI_DEV_DEC_UTIL")) == (1, 2)
    assert v("DCGM_FI_PROF_PCIE_TX_BYTES") == 10 * 1024 and v("DCGM_FI_PROF_PCIE_RX_BYTES") == 20 * 1024  # B/s
    assert v("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == 3
    assert (v("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), v("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")) == (5, 6)
    assert (v("DCGM_FI_DEV_ROW_REMAP_FAILURE"), v("DCGM_FI_DEV_ROW_REMAP_PENDING")) == (1, 1)
    assert (v("DCGM_FI_DEV_RETIRED_SBE"), v("DCGM_FI_DEV_RETIRED_DBE"), v("DCGM_FI_DEV_RETIRED_PENDING")) == (1, 2, 1)
    assert (v("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), v("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")) == (8, 9)
    assert v("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 1024 + 2048 + 4096  # bytes, both directions, all links
    assert v("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") == 11
    assert v("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL") == 2
    assert v("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL") == 33
    assert v("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == v("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == 4
    assert (v("DCGM_FI_DEV_FAN_SPEED"), v("DCGM_FI_DEV_PSTATE")) == (40, 2)
    assert (v("DCGM_FI_DEV_PCIE_LINK_GEN"), v("DCGM_FI_DEV_PCIE_LINK_WIDTH")) == (4, 16)
    prof = {n: v(n) for n in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                              "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")}
    assert list(prof.values()) == [0.5, 0.4, 0.3, 0.2, 0.1]  # ratios, not percent


def test_prof_ratios_only_where_gpm_exists() -> None:
    s = exposition()
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        assert [dict(lbl)["UUID"] for lbl in named(s, name)] == ["GPU-0"], name  # not 0 on the A10 or the A100


# ---------------------------------------------------------------------- labels


def test_exclusive_gpu_carries_its_holder_and_dcgm_exporters_labels() -> None:
    (lbl,) = labels_of(exposition(), "DCGM_FI_DEV_GPU_TEMP", "GPU-0")
    assert list(lbl) == list(BASE_LABELS)
    assert lbl == {"gpu": "0", "UUID": "GPU-0", "pci_bus_id": "00000000:07:00.0", "device": "nvidia0",
                   "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-1", "DCGM_FI_DRIVER_VERSION": "570.86.15",
                   "container": "trainer", "namespace": "ml", "pod": "train-0"}


def test_shared_gpu_appears_once_without_pod_labels() -> None:
    s = exposition()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"):
        (lbl,) = labels_of(s, name, "GPU-1")  # once, not once per pod as dcgm-exporter does
        assert (lbl["pod"], lbl["namespace"], lbl["container"]) == ("", "", "")


def test_mig_devices_carry_gpu_instance_labels_and_the_card_appears_once() -> None:
    s = exposition()
    used = {(lbl["GPU_I_PROFILE"], lbl["GPU_I_ID"], lbl["pod"]): v for lbl, v in
            ((dict(k), v) for k, v in named(s, "DCGM_FI_DEV_FB_USED").items()) if lbl["UUID"] == "GPU-2"}
    assert used == {("3g.40gb", "2", "mig-train"): 3, ("2g.20gb", "3", ""): 0}
    for lbl in labels_of(s, "DCGM_FI_DEV_FB_USED", "GPU-2"):
        assert list(lbl) == [*BASE_LABELS[:5], *MIG_LABELS, *BASE_LABELS[5:]]
        assert (lbl["gpu"], lbl["device"], lbl["modelName"]) == ("2", "nvidia2", "NVIDIA A100-SXM4-80GB")
    # The card's own fields once, without GPU_I_*: a sum over series counts the card's power once.
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        (lbl,) = labels_of(s, name, "GPU-2")
        assert "GPU_I_ID" not in lbl and lbl["pod"] == "", name
    assert sum(named(s, "DCGM_FI_DEV_POWER_USAGE").values()) == pytest.approx(123.456 + 200)


def test_absent_values_give_no_series_and_lost_gpus_none() -> None:
    s = exposition()
    assert not labels_of(s, "DCGM_FI_DEV_POWER_USAGE", "GPU-1")  # the A10 reported no power
    assert not labels_of(s, "DCGM_FI_DEV_FB_RESERVED", "GPU-1")
    lost = NodeSample(timestamp=1.0, devices=(GPU0.without_values(lost=True),))
    assert dcgm_families(NodeAttribution((), (), (), {}), lost, "n", {}) == []


# ---------------------------------------------------------------------- Xid


def test_xid_is_the_latest_per_card_and_absent_without_a_watcher() -> None:
    assert not named(exposition(xids=None), "DCGM_FI_DEV_XID_ERRORS")
    none_yet = named(exposition(xids={}), "DCGM_FI_DEV_XID_ERRORS")
    assert sorted(none_yet.values()) == [0, 0, 0] and all(("err_code", "0") in k for k in none_yet)
    got = {dict(k)["UUID"]: (v, dict(k)["err_code"]) for k, v in
           named(exposition(xids={"GPU-0": (5.0, 31), "MIG-a": (7.0, 43), "MIG-b": (6.0, 79)}),
                 "DCGM_FI_DEV_XID_ERRORS").items()}
    assert got == {"GPU-0": (31, "31"), "GPU-1": (0, "0"), "GPU-2": (43, "43")}  # a MIG device's Xid is its card's


def test_last_xids_come_from_the_watchers_counts() -> None:
    counters = XidCounters()
    with counters.lock:
        counters.count_xid(("GPU-0", 0, 31, "ns", "p", "c"), 10.0)
        counters.count_xid(("GPU-0", 0, 79, "", "", ""), 12.0)
        counters.count_xid(("GPU-1", 1, 13, "", "", ""), 11.0)
        counters.count_xid(("GPU-0", 0, 31, "ns", "p", "c"), 13.0)  # an older Xid again is the latest
        stats = counters.snapshot(sink=WriterCounts(), rate_limited=0, nvml=False, nvml_held=0, nvml_errors={})
    assert last_xids(stats) == {"GPU-0": (13.0, 31), "GPU-1": (11.0, 13)}


# ---------------------------------------------------------------------- the flag


def test_off_by_default_and_on_by_flag_or_environment() -> None:
    assert load_config([], environ={}).dcgm_compat is False
    assert load_config([], environ={"KUBE_GPU_EXPORTER_DCGM_COMPAT": "true"}).dcgm_compat is True
    assert load_config(["--no-dcgm-compat"], environ={"KUBE_GPU_EXPORTER_DCGM_COMPAT": "1"}).dcgm_compat is False


def test_render_adds_the_dcgm_series_only_when_asked(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # GPU 0 also gets a value for every health key the scenario leaves out: a new card field is served here
    full = tmp_path / "dcgm_node.yaml"
    full.write_text(yaml.safe_dump(with_every_health_key(yaml.safe_load(SCENARIO.read_text()))))
    assert cli.main(["render", "--simulate", str(full)]) == 0
    assert "DCGM_FI_" not in capsys.readouterr().out
    assert cli.main(["render", "--simulate", str(full), "--dcgm-compat"]) == 0
    out = capsys.readouterr().out
    s = parse("\n".join(line for line in out.splitlines() if line.startswith("DCGM_FI_")))
    assert {n for n, _ in s} >= {f.name for f in CARD_FIELDS}  # every card field served
    assert "nvidia_gpu_duty_cycle{" in out  # the native rows stay
    temps = named(s, "DCGM_FI_DEV_GPU_TEMP")
    assert len(temps) == 4 and {dict(k)["Hostname"] for k in temps} == {"dcgm-node"}


# ---------------------------------------------------------------------- any sample


_opt = st.one_of(st.none(), st.integers(0, 2**40))
_ratio = st.one_of(st.none(), st.floats(0, 1))
_health = st.builds(
    DeviceHealth, energy_millijoules=_opt, power_limit_milliwatts=_opt, memory_temperature_celsius=_opt,
    pcie_replay_count=_opt, remapped_rows_failure=st.one_of(st.none(), st.integers(0, 1)),
    nvlinks=st.lists(st.builds(NvLinkSample, link=st.integers(0, 17), tx_bytes=_opt, rx_bytes=_opt,
                               crc_errors=_opt), max_size=3).map(tuple),
    gpm=st.one_of(st.none(), st.builds(GpmSample, graphics_active=_ratio, tensor_active=_ratio)))


@st.composite
def _node(draw: st.DrawFn) -> tuple[NodeAttribution, NodeSample, dict[str, tuple[float, int]] | None]:
    devices, attrs = [], []
    for i in range(draw(st.integers(0, 4))):
        common = dict(index=i, name="GPU", pci_bus_id=f"0000000{i}:00:00.0", memory_total_bytes=draw(_opt),
                      memory_used_bytes=draw(_opt), memory_reserved_bytes=draw(_opt), utilization_gpu=draw(_opt),
                      power_usage_milliwatts=draw(_opt), temperature_celsius=draw(_opt), lost=draw(st.booleans()),
                      health=draw(_health))
        parts = draw(st.integers(0, 3))
        card = [DeviceSample(uuid=f"GPU-{i}", **common)] if not parts else [
            DeviceSample(uuid=f"MIG-{i}-{j}", parent_uuid=f"GPU-{i}", gpu_instance_id=j, mig_profile="1g.10gb",
                         **common) for j in range(parts)]
        for d in card:
            devices.append(d)
            holder = draw(st.sampled_from([(), (("c", "ns", "p"),)]))
            attrs.append(att(d, EXCLUSIVE if holder else NONE, *holder))
    xids = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from([d.uuid for d in devices] or ["x"]),
                                                      st.tuples(st.floats(0, 1e9), st.integers(0, 200)))))
    return NodeAttribution(tuple(attrs), (), (), {}), NodeSample(1.0, tuple(devices)), xids


@settings(max_examples=150, deadline=None)
@given(_node())
def test_any_sample_renders_finite_series_with_the_label_set(node: tuple) -> None:
    attr, sample, xids = node
    fams = dcgm_families(attr, sample, "h", xids)
    s = parse(render(fams).decode())
    live = [d for d in sample.devices if not d.lost]
    for (name, labels), value in s.items():
        assert name in FAMILY_NAMES and math.isfinite(value) and value >= 0
        keys = [k for k, _ in labels]
        extra = {"err_code"} if name == "DCGM_FI_DEV_XID_ERRORS" else set()
        assert set(keys) - extra in (set(BASE_LABELS), set(BASE_LABELS) | set(MIG_LABELS)), keys
    # A card field appears once per live card that has the value; an instance field once per live handle.
    cards = {d.parent_uuid or d.uuid: d for d in reversed(live)}
    assert len(named(s, "DCGM_FI_DEV_GPU_TEMP")) == sum(d.temperature_celsius is not None for d in cards.values())
    assert len(named(s, "DCGM_FI_DEV_GPU_UTIL")) == sum(d.utilization_gpu is not None for d in live)
    # GPM is each handle's own: a MIG device's is its GPU instance's
    assert len(named(s, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")) == sum(
        d.health.gpm is not None and d.health.gpm.graphics_active is not None for d in live)
    assert len(named(s, "DCGM_FI_DEV_XID_ERRORS")) == (0 if xids is None else len(cards))
    for (name, labels), value in s.items():
        if name == "DCGM_FI_DEV_POWER_USAGE":
            assert value == pytest.approx(cards[dict(labels)["UUID"]].power_usage_milliwatts / 1000)


def test_every_series_is_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = doc.split("## DCGM compatibility (--dcgm-compat)", 1)[1].split("\n## ", 1)[0]
    table = section.split("| series |", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`(DCGM_FI_\w+)`", table)) == set(FAMILY_NAMES)
    assert all(f"`{name}`" in section for name in (*BASE_LABELS, *MIG_LABELS))


def test_compute_instances_of_one_gpu_instance_serve_one_series() -> None:
    """Two MIG devices (compute instances) of one GPU instance, nobody holding them: the same GPU_I_ID, the
    same memory and GPM; served once, as a series twice in one scrape is refused."""
    gpm = DeviceHealth(gpm=GpmSample(sm_active=0.5))
    migs = tuple(DeviceSample(index=0, uuid=f"MIG-{ci}", name="NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb",
                              parent_uuid="GPU-card", gpu_instance_id=2, compute_instance_id=ci,
                              mig_profile="1c.3g.40gb", memory_total_bytes=40 << 30, memory_used_bytes=0,
                              health=gpm) for ci in (0, 1))
    attr = NodeAttribution(tuple(DeviceAttribution(d, NONE, (), (), ()) for d in migs), (), (), {})
    fams = {f.name: f for f in dcgm_families(attr, NodeSample(1.0, migs), "h")}
    for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_TOTAL"):
        assert len(fams[name].samples) == 1, fams[name].samples
    assert fams["DCGM_FI_PROF_SM_ACTIVE"].samples[0].labels["GPU_I_ID"] == "2"
