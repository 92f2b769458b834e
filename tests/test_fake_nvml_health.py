"""The fake's health calls (issue 18) through the real pynvml: values, protocols, faults, the converter."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fake_nvml import FakeNvml, FakeNvmlError, config_text, fake_nvml_loaded, subprocess_env
from tests.fake_nvml.health_config import GPM_KEYS, HEALTH_INTS, HEALTH_KEYS, NVLINK_VALUES, scalar_values
from tests.fake_nvml.health_readers import NS, READERS, REMAPPED, expected, read_all

REPO = Path(__file__).resolve().parents[1]
FULL = {
    "uuid": "GPU-H", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 1000, "memory_used_bytes": 300,
    "memory_reserved_bytes": 100, "power_usage_milliwatts": 250_000,
    **scalar_values(),  # every integer health key; below, the values these tests assert by number
    "energy_millijoules": 5_000, "power_limit_milliwatts": 700_000, "fan_speed_percent": 40,
    "retired_pages_single_bit": 2, "retired_pages_double_bit": 1, "remapped_rows_correctable": 4,
    "remapped_rows_uncorrectable": 1, "remapped_rows_pending": 0, "remapped_rows_failure": 1,
    "power_violation_nanoseconds": 7_000_000_000,  # beyond an unsigned int: the call's unsigned long long
    "nvlinks": [{"link": 0, "active": 1, "tx_kibibytes": 100, "rx_kibibytes": 200, "crc_errors": 1,
                 "replay_errors": 2, "recovery_errors": 3}, {"link": 3, "active": 0, "crc_errors": 9}],
    "gpm": {"graphics_active": 0.5, "sm_active": 0.25, "sm_occupancy": 0.125, "tensor_active": 0.0, "dram_active": 1},
}
PLAIN = {"uuid": "GPU-P", "name": "Tesla T4", "memory_total_bytes": 100, "memory_used_bytes": 10}


@contextmanager
def initialised(lib: Path, scenario: Mapping[str, Any]) -> Iterator[FakeNvml]:
    """The fake loaded with ``scenario`` (manual clock unless it says otherwise) and initialised."""
    doc = {"nvml": {"clock": "manual"}, **scenario}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "fake.cfg").write_text(config_text(doc))
        with fake_nvml_loaded(lib, Path(tmp) / "fake.cfg") as fake:
            pynvml.nvmlInit()
            try:
                yield fake
            finally:
                pynvml.nvmlShutdown()


def raw(fake: FakeNvml, name: str, *args: Any) -> int:
    """The C return code of one call, bypassing pynvml's wrapper."""
    return int(getattr(fake.lib, name)(*args))


@pytest.mark.e2e
def test_every_call_reads_the_configured_values(lib: Path) -> None:
    with initialised(lib, {"devices": [FULL]}) as fake:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert read_all(h) == expected(FULL, 0)
        assert read_all(h)["nvlinks"] == {0: (1, 100, 200, 1, 2, 3), 3: (0, NS, NS, 9, NS, NS)}
        assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000
        assert pynvml.nvmlDeviceGetFanSpeed_v2(h, 0) == 40
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert (m.total, m.reserved, m.used, m.free) == (1000, 100, 200, 700)  # v1's used = v2's + reserved
        assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 300
        pages = pynvml.nvmlDeviceGetRetiredPages_v2(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        assert len({p["address"] for p in pages}) == 2 and all(p["timestamp"] > 0 for p in pages)
        assert fake.calls("nvmlDeviceGetRemappedRows") == 8  # 4 values, read twice


@pytest.mark.e2e
def test_energy_grows_by_the_power_each_tick(lib: Path) -> None:
    devices = [FULL, dict(FULL, uuid="GPU-2", not_supported=["power"]), dict(FULL, uuid="GPU-3", energy_millijoules=0)]
    with initialised(lib, {"nvml": {"clock": "auto"}, "devices": devices}) as fake:
        h, still, zero = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 5_000
        for tick in (1, 2, 3):  # the utilization probe starts the device's next tick (auto clock)
            with pytest.raises(pynvml.NVMLError_NotFound):
                pynvml.nvmlDeviceGetProcessUtilization(h, 0)
            assert fake.tick(0) == tick
            assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 5_000 + 250_000 * tick
        fake.advance(2)
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(still) == 5_000  # no power reading: stands still
        assert pynvml.nvmlDeviceGetTotalEnergyConsumption(zero) == 2 * 250_000


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(HEALTH_KEYS))
def test_each_not_supported_name_blanks_its_call_only(lib: Path, name: str) -> None:
    device = dict(FULL, not_supported=[name])
    with initialised(lib, {"devices": [device]}):
        got = read_all(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert got == expected(device, 0)
    blanked = {k for k, v in got.items() if v in (NS, None, {})}
    assert blanked == (set(REMAPPED) if name in REMAPPED else {name})


@pytest.mark.e2e
def test_a_device_without_the_keys_answers_not_supported(lib: Path) -> None:
    with initialised(lib, {"devices": [PLAIN]}):
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert read_all(h) == expected(PLAIN, 0)
        assert read_all(h)["memory_reserved_bytes"] == 0  # an absent reserved is none reserved
        assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 0  # before Hopper
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())
        # the other fields of FieldValues still say NotSupported each
        (v,) = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])
        assert v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.e2e
def test_a_lost_gpu_answers_gpu_is_lost_from_every_call(lib: Path) -> None:
    with initialised(lib, {"devices": [dict(FULL, lost_after_ticks=1), PLAIN]}) as fake:
        h, other = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        early, late = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(h, early)
        pynvml.nvmlGpmSampleGet(h, late)
        fake.advance(2)
        before = fake.device_calls(0)
        for name, read in READERS.items():
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                read(h)
            assert fake.device_calls(0) > before, name
            before = fake.device_calls(0)
        get = pynvml.c_nvmlGpmMetricsGet_t(version=1, numMetrics=1, sample1=early, sample2=late)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlGpmMetricsGet(get)
        assert read_all(other) == expected(PLAIN, 2)


@pytest.mark.e2e
def test_calls_before_init_are_uninitialized(lib: Path, tmp_path: Path) -> None:
    (tmp_path / "f.cfg").write_text(config_text({"devices": [FULL]}))
    with fake_nvml_loaded(lib, tmp_path / "f.cfg") as fake:
        for name, read in READERS.items():
            if name not in ("nvlinks", "gpm"):
                with pytest.raises(pynvml.NVMLError_Uninitialized):
                    read(None)
        for call, args in (("nvmlDeviceGetNvLinkState", (0,)), ("nvmlGpmQueryDeviceSupport", ()),
                           ("nvmlGpmSampleGet", (None,))):
            with pytest.raises(pynvml.NVMLError_Uninitialized):
                getattr(pynvml, call)(None, *args)
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlGpmSampleAlloc()
        assert fake.calls("nvmlDeviceGetTotalEnergyConsumption") == 1
        assert fake.calls("nvmlGpmSampleAlloc") == 1


@pytest.mark.e2e
def test_invalid_arguments_are_refused(lib: Path) -> None:
    with initialised(lib, {"devices": [FULL]}) as fake:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        stranger = ctypes.c_void_p(0x1000)  # not a handle the fake handed out
        invalid = [
            ("nvmlDeviceGetTotalEnergyConsumption", (stranger, ctypes.byref(ctypes.c_ulonglong()))),
            ("nvmlDeviceGetEnforcedPowerLimit", (h, None)), ("nvmlDeviceGetPerformanceState", (h, None)),
            ("nvmlDeviceGetFanSpeed_v2", (h, 1, ctypes.byref(ctypes.c_uint()))),  # the card has one fan
            ("nvmlDeviceGetPcieThroughput", (h, 2, ctypes.byref(ctypes.c_uint()))),
            ("nvmlDeviceGetRetiredPages", (h, 2, ctypes.byref(ctypes.c_uint()), None)),
            ("nvmlDeviceGetRemappedRows", (h, None, None, None, None)),
            ("nvmlDeviceGetNvLinkState", (h, 18, ctypes.byref(ctypes.c_uint()))),  # past NVML_NVLINK_MAX_LINKS
            ("nvmlDeviceGetNvLinkErrorCounter", (h, 0, 5, ctypes.byref(ctypes.c_ulonglong()))),
            ("nvmlGpmSampleFree", (ctypes.c_void_p(0x1000),)), ("nvmlGpmMetricsGet", (None,)),
        ]
        for call, args in invalid:
            assert raw(fake, call, *args) == pynvml.NVML_ERROR_INVALID_ARGUMENT, call
        # a link the GPU does not have, below the maximum, is NotSupported (the caller skips it)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(h, 17)
        assert pynvml.nvmlDeviceGetFieldValues(h, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 18)])[0].nvmlReturn \
            == pynvml.NVML_ERROR_INVALID_ARGUMENT
        support = pynvml.c_nvmlGpmSupport_t(version=2)
        assert raw(fake, "nvmlGpmQueryDeviceSupport", h, ctypes.byref(support)) \
            == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


@pytest.mark.e2e
def test_mig_handles_answer_reserved_memory_only(lib: Path) -> None:
    card = {**{k: v for k, v in FULL.items() if k != "gpm"},  # a MIG card's GPM is its instances'
            "mig_devices": [{"uuid": "MIG-A", "profile": "3g.40gb", "memory_total_bytes": 40,
                             "memory_used_bytes": 20, "memory_reserved_bytes": 5}]}
    with initialised(lib, {"devices": [card]}):
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
        got = read_all(mig)
        assert got.pop("memory_reserved_bytes") == 5
        assert got == {**dict.fromkeys(got, NS), "nvlinks": {}}  # the card's health is read on the card
        assert [v.nvmlReturn for v in pynvml.nvmlDeviceGetFieldValues(mig, [pynvml.NVML_FI_DEV_MEMORY_TEMP])] \
            == [pynvml.NVML_ERROR_NOT_SUPPORTED]
        with pytest.raises(pynvml.NVMLError_NoPermission):  # the card's memory is the MIG devices' aggregate
            pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        want = expected(card, 0)
        del want["memory_reserved_bytes"]
        assert read_all(h, skip=frozenset({"memory_reserved_bytes"})) == want


@pytest.mark.e2e
def test_gpm_metrics_need_two_samples_of_one_card_in_order(lib: Path) -> None:
    with initialised(lib, {"devices": [FULL, dict(FULL, uuid="GPU-2")]}) as fake:
        h, other = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        a, b, c, unused = (pynvml.nvmlGpmSampleAlloc() for _ in range(4))
        pynvml.nvmlGpmSampleGet(h, a)
        fake.advance(1)
        pynvml.nvmlGpmSampleGet(h, b)
        pynvml.nvmlGpmSampleGet(other, c)

        def get(s1: Any, s2: Any, version: int = 1) -> int:
            req = pynvml.c_nvmlGpmMetricsGet_t(version=version, numMetrics=2, sample1=s1, sample2=s2)
            req.metrics[0].metricId, req.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL, 200
            rc = raw(fake, "nvmlGpmMetricsGet", ctypes.byref(req))
            return rc if rc else (req.metrics[0].nvmlReturn, req.metrics[0].value, req.metrics[1].nvmlReturn)

        assert get(a, b) == (pynvml.NVML_SUCCESS, 25.0, pynvml.NVML_ERROR_NOT_SUPPORTED)
        for s1, s2 in ((b, a), (a, a), (a, c), (unused, b), (a, None)):  # reversed, same, two GPUs, never taken
            assert get(s1, s2) == pynvml.NVML_ERROR_INVALID_ARGUMENT
        assert get(a, b, version=2) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        pynvml.nvmlGpmSampleFree(a)
        assert get(a, b) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # freed
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmSampleFree(a)
        held = [pynvml.nvmlGpmSampleAlloc() for _ in range(253)]  # the pool holds 256
        with pytest.raises(pynvml.NVMLError_Memory):
            pynvml.nvmlGpmSampleAlloc()
        for s in (b, c, unused, *held):
            pynvml.nvmlGpmSampleFree(s)


def _mig_card(uuid: str, name: str, *ratios: float | None) -> dict[str, Any]:
    """A card in MIG mode, GPU instances 1, 2, ...; a ratio gives its instance gpm (sm_active), None none."""
    return {"uuid": uuid, "name": name, "mig_devices": [
        {"uuid": f"MIG-{uuid}-{gi}", "profile": "1g.10gb", "gpu_instance_id": gi,
         **({} if r is None else {"gpm": {"sm_active": r}})} for gi, r in enumerate(ratios, 1)]}


@pytest.mark.e2e
def test_gpm_mig_sample_get_samples_a_gpu_instance_on_its_card(lib: Path) -> None:
    """nvmlGpmMigSampleGet(card, gpuInstanceId, sample) through pynvml: each GPU instance its own ratios;
    NOT_SUPPORTED on a card without GPM (A100), INVALID_ARGUMENT for an unknown instance, a MIG handle or MIG off."""
    doc = {"devices": [_mig_card("GPU-H", "NVIDIA H100 80GB HBM3", 0.25, 0.75),
                       _mig_card("GPU-A", "NVIDIA A100-SXM4-80GB", None), PLAIN]}
    with initialised(lib, doc) as fake:
        h100, a100, t4 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(3))
        assert pynvml.nvmlGpmQueryDeviceSupport(h100).isSupportedDevice == 1  # asked on the card
        assert pynvml.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
        buffers = [pynvml.nvmlGpmSampleAlloc() for _ in range(4)]

        def ratio(first: Any, second: Any) -> float:
            req = pynvml.c_nvmlGpmMetricsGet_t(version=pynvml.NVML_GPM_METRICS_GET_VERSION, numMetrics=1,
                                               sample1=first, sample2=second)
            req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
            assert raw(fake, "nvmlGpmMetricsGet", ctypes.byref(req)) == pynvml.NVML_SUCCESS
            return req.metrics[0].value

        for gi, (a, b) in zip((1, 2), (buffers[:2], buffers[2:]), strict=True):
            pynvml.nvmlGpmMigSampleGet(h100, gi, a)
            pynvml.nvmlGpmMigSampleGet(h100, gi, b)
        assert (ratio(*buffers[:2]), ratio(*buffers[2:])) == (25.0, 75.0)  # percent, as NVML
        req = pynvml.c_nvmlGpmMetricsGet_t(version=1, numMetrics=1, sample1=buffers[1], sample2=buffers[3])
        assert raw(fake, "nvmlGpmMetricsGet", ctypes.byref(req)) == pynvml.NVML_ERROR_INVALID_ARGUMENT  # two GIs
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmMigSampleGet(a100, 1, buffers[0])
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, 1)
        for handle, gi in ((h100, 3), (h100, 0), (mig, 1), (t4, 1)):
            with pytest.raises((pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported)) as e:
                pynvml.nvmlGpmMigSampleGet(handle, gi, buffers[0])
            assert e.value.value == (pynvml.NVML_ERROR_NOT_SUPPORTED if handle is t4 else
                                     pynvml.NVML_ERROR_INVALID_ARGUMENT)  # the T4: no GPM at all
        for b in buffers:
            pynvml.nvmlGpmSampleFree(b)


@pytest.mark.parametrize(("card", "message"), [
    ({**_mig_card("GPU-H", "H100", 0.5), "gpm": {}}, "devices[0]: a GPU with mig_devices has its GPM on them"),
    (_mig_card("GPU-H", "H100", 0.5, None), "devices[0].mig_devices: gpm on every MIG device or on none"),
])
def test_converter_refuses_gpm_on_a_mig_card_itself_or_on_some_instances(card: dict[str, Any], message: str) -> None:
    with pytest.raises(FakeNvmlError, match=re.escape(message)):
        config_text({"devices": [card]})


@pytest.mark.e2e
def test_retired_pages_answer_the_size_probe(lib: Path) -> None:
    with initialised(lib, {"devices": [dict(FULL, retired_pages_single_bit=3, retired_pages_double_bit=0)]}) as fake:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        count, pages = ctypes.c_uint(0), (ctypes.c_ulonglong * 8)()
        fn, sbe, dbe = "nvmlDeviceGetRetiredPages", 0, 1
        assert raw(fake, fn, h, sbe, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        assert count.value == 3
        count.value = 2
        assert raw(fake, fn, h, sbe, ctypes.byref(count), pages) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        count.value = 8
        assert raw(fake, fn, h, sbe, ctypes.byref(count), pages) == pynvml.NVML_SUCCESS
        assert count.value == 3 and len(set(pages[:3])) == 3 and 0 not in pages[:3]
        count.value = 0
        assert raw(fake, fn, h, dbe, ctypes.byref(count), None) == pynvml.NVML_SUCCESS  # none retired
        assert count.value == 0


@pytest.mark.e2e
def test_old_driver_lacks_gpm_but_has_the_rest(fake_libs: dict[str, Path], tmp_path: Path) -> None:
    lib, old = fake_libs["current"], fake_libs["old"]
    for library in (old, lib):  # the old build, and the normal one told old_driver
        with initialised(library, {"nvml": {"clock": "manual", "old_driver": True}, "devices": [FULL]}):
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            newer = ("gpm", "memory_reserved_bytes")  # nvmlGpm*, nvmlDeviceGetMemoryInfo_v2
            for name in newer:
                with pytest.raises(pynvml.NVMLError_FunctionNotFound):
                    READERS[name](h)
            with pytest.raises(pynvml.NVMLError_FunctionNotFound):
                pynvml.nvmlGpmSampleAlloc()
            want = {k: v for k, v in expected(FULL, 0).items() if k not in newer}
            assert read_all(h, skip=frozenset(newer)) == want


@pytest.mark.e2e
def test_a_child_process_reads_health_through_the_soname(lib: Path, tmp_path: Path) -> None:
    (tmp_path / "c.cfg").write_text(config_text({"devices": [FULL]}))
    child = textwrap.dedent("""
        import json, pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps([pynvml.nvmlDeviceGetTotalEnergyConsumption(h), list(pynvml.nvmlDeviceGetRemappedRows(h)),
                          pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice]))
    """)
    out = subprocess.run([sys.executable, "-c", child], env=subprocess_env(lib.parent, tmp_path / "c.cfg"),
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == [5_000, [4, 1, 0, 1], 1]


# ---- the converter --------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "message"), [
    ({"fan_speed_percent": 101}, r"fan_speed_percent: must be <= 100"),
    ({"performance_state": 16}, r"performance_state: must be <= 15"),
    ({"remapped_rows_pending": 2}, r"remapped_rows_pending: must be <= 1"),
    ({"pcie_replay_count": -1}, r"pcie_replay_count: expected a non-negative integer"),
    ({"power_limit_milliwatts": 2**32}, r"power_limit_milliwatts: must be <= 4294967295"),
    ({"retired_pages_double_bit": True}, r"retired_pages_double_bit: expected a non-negative integer"),
    ({"memory_reserved_bytes": 1001}, r"memory_reserved_bytes exceeds memory_total_bytes"),
    ({"nvlinks": {"link": 0}}, r"nvlinks: expected a list"),
    ({"nvlinks": [{"active": 1}]}, r"nvlinks\[0\]: 'link' is required"),
    ({"nvlinks": [{"link": 18, "active": 1}]}, r"nvlinks\[0\]\.link: must be <= 17"),
    ({"nvlinks": [{"link": 1, "active": 1}, {"link": 1, "active": 1}]}, r"nvlinks: duplicate link 1"),
    ({"nvlinks": [{"link": 1, "active": 2}]}, r"nvlinks\[0\]\.active: must be <= 1"),
    ({"nvlinks": [{"link": 1, "speed": 2}]}, r"nvlinks\[0\]: unknown key\(s\) speed"),
    ({"gpm": {"sm_active": 1.5}}, r"gpm\.sm_active: expected a number 0\.\.1"),
    ({"gpm": {"sm_active": float("nan")}}, r"gpm\.sm_active: expected a number 0\.\.1"),
    ({"gpm": {"sm_util": 0.5}}, r"gpm: unknown key\(s\) sm_util"),
    ({"gpm": [0.5]}, r"gpm: expected a mapping"),
    ({"not_supported": ["nvlink"]}, r"not_supported: unknown field 'nvlink'"),
])
def test_converter_refuses_bad_health_values_in_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(FakeNvmlError, match=message) as info:
        config_text({"devices": [dict(FULL, **change)]})
    assert "\n" not in str(info.value)


def _links() -> st.SearchStrategy[list[dict[str, Any]]]:
    link = st.fixed_dictionaries({"link": st.integers(0, 17), "active": st.integers(0, 1)}, optional={
        k: st.integers(0, 2**64 - 1) for k in NVLINK_VALUES if k != "active"})
    return st.lists(link, max_size=6, unique_by=lambda m: m["link"])


health_devices = st.fixed_dictionaries(
    {"uuid": st.just("GPU-R"), "name": st.just("R"), "memory_total_bytes": st.integers(0, 2**40)},
    optional={**{k: st.integers(0, top) for k, top in HEALTH_INTS.items()},
              "power_usage_milliwatts": st.integers(0, 2**32 - 1), "nvlinks": _links(),
              "gpm": st.fixed_dictionaries({}, optional={k: st.floats(0, 1) for k in sorted(GPM_KEYS)}),
              "not_supported": st.lists(st.sampled_from(sorted(HEALTH_KEYS | {"power", "memory"})), unique=True)},
).flatmap(lambda d: st.fixed_dictionaries(
    {k: st.just(v) for k, v in d.items()},
    optional={"memory_reserved_bytes": st.integers(0, d["memory_total_bytes"])}))


@pytest.mark.e2e
@settings(max_examples=40, deadline=None)
@given(device=health_devices, ticks=st.integers(0, 4))
def test_valid_health_mappings_read_back_through_pynvml(lib: Path, device: dict[str, Any], ticks: int) -> None:
    with initialised(lib, {"devices": [device]}) as fake:
        fake.advance(ticks)
        assert read_all(pynvml.nvmlDeviceGetHandleByIndex(0)) == expected(device, ticks)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(HEALTH_INTS)), data=st.data())
def test_an_integer_out_of_range_names_its_key(key: str, data: st.DataObject) -> None:
    bad = data.draw(st.integers(HEALTH_INTS[key] + 1, 2**80) | st.integers(-2**80, -1)
                    | st.sampled_from([True, 1.0, "1", [1]]))
    with pytest.raises(FakeNvmlError, match=rf"devices\[0\]\.{key}: ") as info:
        config_text({"devices": [dict(PLAIN, **{key: bad})]})
    assert "\n" not in str(info.value)


junk = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8)
link_junk = st.lists(st.dictionaries(st.sampled_from(sorted(["link", *NVLINK_VALUES, "x"])), junk, max_size=4),
                     max_size=3)


@settings(max_examples=300, deadline=None)
@given(values=st.dictionaries(st.sampled_from(sorted(HEALTH_KEYS | {"not_supported"})),
                              junk | link_junk | st.dictionaries(st.sampled_from([*GPM_KEYS, "x"]), junk), max_size=4))
def test_any_health_value_converts_or_fails_with_fake_nvml_error(values: dict[str, Any]) -> None:
    try:
        text = config_text({"devices": [dict(PLAIN, **values)]})
    except FakeNvmlError as e:
        assert "\n" not in str(e)
    else:
        assert text.endswith("\n")
