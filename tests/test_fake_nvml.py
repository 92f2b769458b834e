"""The fake libnvidia-ml.so.1 itself: NVML protocols, error strings, events, loading, the converter."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

import tests.fake_nvml as fake_nvml
from tests.fake_nvml import (
    TICK_US,
    FakeNvml,
    FakeNvmlError,
    build_fake_nvml,
    config_text,
    fake_nvml_loaded,
    subprocess_env,
    write_config,
)

REPO = Path(__file__).resolve().parents[1]
GPU = {"uuid": "GPU-1", "name": "Fake GPU", "memory_total_bytes": 100, "memory_used_bytes": 10,
       "processes": [{"pid": 7, "used_memory_bytes": 10, "sm_util": 50}]}


@pytest.fixture
def loaded(lib: Path, tmp_path: Path) -> Iterator[tuple[FakeNvml, Path]]:
    config = write_config({"devices": [GPU]}, tmp_path / "fake.cfg")
    with fake_nvml_loaded(lib, config) as fake:
        yield fake, config


def raw_call(fake: FakeNvml, name: str, *args: Any) -> int:
    """The C return code of one call, bypassing pynvml's wrapper."""
    return int(getattr(fake.lib, name)(*args))


@pytest.mark.e2e
def test_calls_before_init_are_uninitialized(loaded: tuple[FakeNvml, Path]) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_error_strings_are_nvmls(loaded: tuple[FakeNvml, Path]) -> None:
    for code, text in pynvml.NVMLError._errcode_to_string.items():
        if code in (pynvml.NVML_ERROR_IN_USE, pynvml.NVML_ERROR_NO_DATA):
            continue  # not in the strings table the fake carries
        assert pynvml.nvmlErrorString(code) == text
    assert pynvml.nvmlErrorString(123456) == "Unknown Error"


@pytest.mark.e2e
def test_init_is_reference_counted_and_reinit_rereads_the_config(loaded: tuple[FakeNvml, Path]) -> None:
    fake, config = loaded
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1  # still initialised: one reference left
    config.write_text(config_text({"devices": [GPU, dict(GPU, uuid="GPU-2")]}))
    pynvml.nvmlShutdown()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 2
    pynvml.nvmlShutdown()
    assert fake.calls("nvmlInitWithFlags") == 3


@pytest.mark.e2e
def test_process_list_size_probe_protocol(loaded: tuple[FakeNvml, Path]) -> None:
    fake, config = loaded
    config.write_text(config_text({"devices": [dict(GPU, processes=[
        {"pid": 1, "used_memory_bytes": 1}, {"pid": 2, "used_memory_bytes": None}])]}))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fn = "nvmlDeviceGetComputeRunningProcesses_v3"
    count = ctypes.c_uint(0)
    assert raw_call(fake, fn, h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    one = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    count.value = 1
    assert raw_call(fake, fn, h, ctypes.byref(count), one) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    infos = (pynvml.c_nvmlProcessInfo_v3_t * 4)()
    count.value = 4
    assert raw_call(fake, fn, h, ctypes.byref(count), infos) == pynvml.NVML_SUCCESS
    assert count.value == 2
    assert [(i.pid, i.usedGpuMemory, i.gpuInstanceId) for i in infos[:2]] == [
        (1, 1, 0xFFFFFFFF), (2, 0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF)]
    # an empty list answers the probe with SUCCESS and 0
    count.value = 0
    assert raw_call(fake, "nvmlDeviceGetGraphicsRunningProcesses_v3", h, ctypes.byref(count), None) == 0
    assert count.value == 0
    pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_util_not_found_when_nothing_is_newer(loaded: tuple[FakeNvml, Path]) -> None:
    fake, _ = loaded
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    (sample,) = pynvml.nvmlDeviceGetProcessUtilization(h, 0)  # auto clock: this probe is tick 1
    assert (sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil) == (7, TICK_US, 50, 0)
    assert fake.tick(0) == 1
    # the probe of the next call moves to tick 2; nothing is newer than tick 2's sample after it
    assert [s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)] == [TICK_US, 2 * TICK_US]
    count = ctypes.c_uint(4)
    buf = (pynvml.c_nvmlProcessUtilizationSample_t * 4)()
    assert raw_call(fake, "nvmlDeviceGetProcessUtilization", h, buf, ctypes.byref(count),
                    ctypes.c_ulonglong(2 * TICK_US)) == pynvml.NVML_ERROR_NOT_FOUND
    assert raw_call(fake, "nvmlDeviceGetProcessUtilization", h, buf, ctypes.byref(count),
                    ctypes.c_ulonglong(TICK_US)) == pynvml.NVML_SUCCESS
    assert (count.value, buf[0].timeStamp) == (1, 2 * TICK_US)  # the fetch (non-NULL buffer) kept tick 2
    pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_xid_events_are_delivered_once_at_their_tick(lib: Path, tmp_path: Path) -> None:
    doc = {"nvml": {"clock": "manual"},
           "devices": [dict(GPU, xid_events=[{"tick": 2, "xid": 79}, {"tick": 2, "xid": 48}])]}
    with fake_nvml_loaded(lib, write_config(doc, tmp_path / "xid.cfg")) as fake:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        events = pynvml.nvmlEventSetCreate()
        supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError & supported, events)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 5)
        fake.advance(2)
        got = [pynvml.nvmlEventSetWait_v2(events, 5) for _ in range(2)]
        assert [(e.eventType, e.eventData) for e in got] == [(pynvml.nvmlEventTypeXidCriticalError, 79),
                                                              (pynvml.nvmlEventTypeXidCriticalError, 48)]
        assert ctypes.cast(got[0].device, ctypes.c_void_p).value == ctypes.cast(h, ctypes.c_void_p).value
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 5)
        pynvml.nvmlEventSetFree(events)
        pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_a_child_process_loads_the_fake_by_soname(lib: Path, tmp_path: Path) -> None:
    config = write_config({"nvml": {"driver_version": "535.104.05"}, "devices": [GPU]}, tmp_path / "c.cfg")
    child = textwrap.dedent("""
        import json
        from exporter.node.nvml.backend import NvmlBackend
        b = NvmlBackend()
        s = b.sample()
        b.close()
        d = s.devices[0]
        pids = [p.pid for p in d.processes]
        print(json.dumps([s.nvml_up, s.driver_version, d.uuid, d.memory_used_bytes, pids]))
    """)
    out = subprocess.run([sys.executable, "-c", child], env=subprocess_env(lib.parent, config), cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == [True, "535.104.05", "GPU-1", 10, [7]]


def test_converter_rejects_what_the_fake_cannot_mean() -> None:
    with pytest.raises(FakeNvmlError, match=r"devices\[0\]: unknown key\(s\) colour"):
        config_text({"devices": [dict(GPU, colour="red")]})
    with pytest.raises(FakeNvmlError, match="not_supported: unknown field 'fan'"):
        config_text({"devices": [dict(GPU, not_supported=["fan"])]})
    with pytest.raises(FakeNvmlError, match=r"nvml: unknown key\(s\) init_failure\b"):
        config_text({"nvml": {"init_failure": 1}, "devices": []})
    with pytest.raises(FakeNvmlError, match="'uuid' is required"):
        config_text({"devices": [{"name": "x"}]})
    # keys of the other consumers of the scenario are accepted and ignored
    assert "pod" not in config_text({"node": "n", "node_labels": {}, "pods": [], "pod_resources": [],
                                     "devices": []})


@pytest.mark.e2e
def test_cli_converts_a_scenario_file(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("devices:\n  - {uuid: GPU-9, name: Nine, lost_after_ticks: 4}\n")
    subprocess.run([sys.executable, "-m", "tests.fake_nvml", "convert", str(tmp_path / "s.yaml"),
                    str(tmp_path / "s.cfg")], cwd=REPO, check=True, capture_output=True, timeout=60)
    lines = (tmp_path / "s.cfg").read_text().splitlines()
    assert {"device", "uuid GPU-9", "name Nine", "minor_number 0", "pci_bus_id 00000000:01:00.0",
            "lost_after_ticks 4"} <= set(lines)


def test_build_without_a_compiler_says_what_to_install(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_nvml.shutil, "which", lambda _name: None)
    with pytest.raises(FakeNvmlError, match=r"install gcc \(apt-get install gcc\)"):
        build_fake_nvml(tmp_path)


@pytest.mark.e2e
def test_wallclock_timestamps_are_cpu_time_and_each_sample_is_returned_once(loaded: tuple[FakeNvml, Path]) -> None:
    # nvitop asks for samples newer than "one second ago" in epoch microseconds, as the driver stamps them
    fake, config = loaded
    config.write_text(config_text({"nvml": {"timestamps": "wallclock"}, "devices": [GPU]}))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = time.time_ns() // 1000
    (first,) = pynvml.nvmlDeviceGetProcessUtilization(h, before - 1_000_000)  # the probe starts tick 1
    after = time.time_ns() // 1000
    assert before <= first.timeStamp <= after
    # the next call starts tick 2, stamped strictly later; tick 1's sample is not handed out again
    (second,) = pynvml.nvmlDeviceGetProcessUtilization(h, first.timeStamp)
    assert second.timeStamp > first.timeStamp
    assert fake.last_seen(0) == first.timeStamp
    count = ctypes.c_uint(4)
    buf = (pynvml.c_nvmlProcessUtilizationSample_t * 4)()
    assert raw_call(fake, "nvmlDeviceGetProcessUtilization", h, buf, ctypes.byref(count),
                    ctypes.c_ulonglong(second.timeStamp)) == pynvml.NVML_ERROR_NOT_FOUND
    pynvml.nvmlShutdown()


@pytest.mark.e2e
@pytest.mark.parametrize("every_tick", [False, True])
def test_process_growth_rearms_each_tick_only_when_asked(loaded: tuple[FakeNvml, Path], every_tick: bool) -> None:
    fake, config = loaded
    procs = [{"pid": p, "used_memory_bytes": 1} for p in (1, 2, 3)]
    config.write_text(config_text({"nvml": {"clock": "manual", "growth_every_tick": every_tick},
                                   "devices": [dict(GPU, processes=procs, process_growth=2)]}))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fn = "nvmlDeviceGetComputeRunningProcesses_v3"

    def probe() -> int:
        count = ctypes.c_uint(0)
        assert raw_call(fake, fn, h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        return count.value

    assert [probe(), probe()] == [1, 3]  # the first call after init misses the 2 that "just started"
    fake.advance(1)
    assert [probe(), probe()] == ([1, 3] if every_tick else [3, 3])
    pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_cuda_driver_version_default_and_configured(loaded: tuple[FakeNvml, Path]) -> None:
    _, config = loaded
    pynvml.nvmlInit()
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040  # what a 550 driver reports
    pynvml.nvmlShutdown()
    config.write_text(config_text({"nvml": {"cuda_driver_version": 11080}, "devices": [GPU]}))
    pynvml.nvmlInit()
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 11080
    pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_calls_without_scenario_values_are_not_supported(loaded: tuple[FakeNvml, Path]) -> None:
    fake, _ = loaded
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for call, args in (("nvmlDeviceGetFanSpeed", ()), ("nvmlDeviceGetPowerManagementLimit", ()),
                       ("nvmlDeviceGetPcieThroughput", (pynvml.NVML_PCIE_UTIL_TX_BYTES,))):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            getattr(pynvml, call)(h, *args)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPcieThroughput(h, 7)
    # the call itself succeeds; each field carries its own status
    values = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT,
                                                 pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX])
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 2
    assert [v.fieldId for v in values] == [pynvml.NVML_FI_DEV_POWER_INSTANT,
                                           pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX]
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetFanSpeed(h)
    assert fake.calls("nvmlDeviceGetFanSpeed") == 2


@pytest.mark.e2e
def test_idle_after_ticks_stops_the_samples_but_keeps_the_processes(loaded: tuple[FakeNvml, Path]) -> None:
    fake, config = loaded
    config.write_text(config_text({"nvml": {"clock": "manual", "idle_after_ticks": 2}, "devices": [GPU]}))
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fake.advance(4)
    # the buffer still holds ticks 1 and 2; nothing after them
    assert [s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)] == [TICK_US, 2 * TICK_US]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 2 * TICK_US)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [7]
    pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_mig_mode_and_memory_v2_as_nvitop_reads_them(loaded: tuple[FakeNvml, Path]) -> None:
    fake, config = loaded
    config.write_text(config_text({"devices": [GPU, dict(GPU, uuid="GPU-2", memory_used_bytes=None)]}))
    pynvml.nvmlInit()
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlDeviceGetMigMode(h0) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert not pynvml.nvmlDeviceIsMigDeviceHandle(h0)
    m = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
    assert (m.total, m.reserved, m.used, m.free) == (100, 0, 10, 90)
    na = pynvml.nvmlDeviceGetMemoryInfo(h1, version=pynvml.nvmlMemory_v2)
    assert (na.used, na.free) == (2**64 - 1, 2**64 - 1)  # NVML_VALUE_NOT_AVAILABLE
    # a struct of another version is refused, as the driver does
    v1_sized = pynvml.c_nvmlMemory_v2_t()
    v1_sized.version = pynvml.nvmlMemory_v2 & 0xFFFFFF | (1 << 24)
    assert raw_call(fake, "nvmlDeviceGetMemoryInfo_v2", h0, ctypes.byref(v1_sized)) == 25
    assert pynvml.nvmlErrorString(25) == "Argument version mismatch"
    pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_old_driver_build_lacks_memory_info_v2(fake_libs: dict[str, Path], tmp_path: Path) -> None:
    old = fake_libs["old"]
    with fake_nvml_loaded(old, write_config({"devices": [GPU]}, tmp_path / "o.cfg")):
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 10
        pynvml.nvmlShutdown()


# ---- MIG ----------------------------------------------------------------------------------

MIG_CARD = {"uuid": "GPU-M", "name": "NVIDIA A100-SXM4-80GB", "minor_number": 4, "power_usage_milliwatts": 90_000,
            "utilization_gpu": 10, "utilization_memory": 5, "encoder_utilization": 1, "decoder_utilization": 2,
            "memory_total_bytes": 80, "memory_used_bytes": 30,
            "mig_devices": [
                {"uuid": "MIG-A", "profile": "3g.40gb", "gpu_instance_id": 2, "compute_instance_id": 0,
                 "memory_total_bytes": 40, "memory_used_bytes": 20,
                 "processes": [{"pid": 71, "used_memory_bytes": 20, "sm_util": 30}]},
                {"uuid": "MIG-B", "profile": "1g.10gb", "memory_total_bytes": 10},
            ]}


@pytest.fixture
def mig(lib: Path, tmp_path: Path) -> Iterator[tuple[FakeNvml, Any, Any, list[Any]]]:
    """The fake with a card in MIG mode (index 0) and a plain GPU (index 1), initialised:
    (fake, card handle, other handle, MIG handles by slot 1 and 2)."""
    doc = {"nvml": {"clock": "manual"}, "devices": [MIG_CARD, dict(GPU, lost_after_ticks=5)]}
    with fake_nvml_loaded(lib, write_config(doc, tmp_path / "mig.cfg")) as fake:
        pynvml.nvmlInit()
        card, other = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, i) for i in (1, 2)]
        try:
            yield fake, card, other, migs
        finally:
            pynvml.nvmlShutdown()


def address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


@pytest.mark.e2e
def test_mig_devices_are_enumerated_by_slot_with_slot_0_empty(mig: tuple[FakeNvml, Any, Any, list[Any]]) -> None:
    _, card, other, (a, b) = mig
    assert pynvml.nvmlDeviceGetCount() == 2  # physical GPUs only
    assert pynvml.nvmlDeviceGetMigMode(card) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert pynvml.nvmlDeviceGetMigMode(other) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert (pynvml.nvmlDeviceGetMaxMigDeviceCount(card), pynvml.nvmlDeviceGetMaxMigDeviceCount(other)) == (7, 0)
    for empty in (0, 3, 6):
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, empty)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, 7)  # past GetMaxMigDeviceCount
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(other, 1)  # MIG mode off
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a, 1)  # a MIG device has no MIG devices
    # the same handle each time, as NVML's index round trip promises
    assert address(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, 1)) == address(a)
    assert [pynvml.nvmlDeviceGetIndex(m) for m in (a, b)] == [1, 2]
    assert address(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(b)) == address(card)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(card)
    assert [pynvml.nvmlDeviceIsMigDeviceHandle(h).value for h in (card, other, a)] == [0, 0, 1]


@pytest.mark.e2e
def test_mig_handles_answer_identity_memory_processes_and_instance_ids(
        mig: tuple[FakeNvml, Any, Any, list[Any]]) -> None:
    _, card, _, (a, b) = mig
    assert [pynvml.nvmlDeviceGetUUID(m) for m in (a, b)] == ["MIG-A", "MIG-B"]
    assert [pynvml.nvmlDeviceGetName(m) for m in (a, b)] == ["NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                                                             "NVIDIA A100-SXM4-80GB MIG 1g.10gb"]
    assert (pynvml.nvmlDeviceGetGpuInstanceId(a), pynvml.nvmlDeviceGetComputeInstanceId(a)) == (2, 0)
    for call in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
        for h in (b, card):  # none in the scenario; a card has none
            with pytest.raises(pynvml.NVMLError_NotSupported):
                getattr(pynvml, call)(h)
    m = pynvml.nvmlDeviceGetMemoryInfo(a)
    assert (m.total, m.used, m.free) == (40, 20, 20)
    assert pynvml.nvmlDeviceGetMemoryInfo(b, version=pynvml.nvmlMemory_v2).used == 2**64 - 1  # not available
    (p,) = pynvml.nvmlDeviceGetComputeRunningProcesses(a)
    assert (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) == (71, 20, 2, 0)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(b) == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(a) == []


@pytest.mark.e2e
def test_calls_nvml_refuses_in_mig_mode_return_its_codes(mig: tuple[FakeNvml, Any, Any, list[Any]]) -> None:
    fake, card, other, (a, _) = mig
    fake.advance(1)
    not_supported = [
        (a, "nvmlDeviceGetUtilizationRates", ()), (card, "nvmlDeviceGetUtilizationRates", ()),
        (a, "nvmlDeviceGetProcessUtilization", (0,)), (card, "nvmlDeviceGetProcessUtilization", (0,)),
        (a, "nvmlDeviceGetEncoderUtilization", ()), (card, "nvmlDeviceGetDecoderUtilization", ()),
        # the card's values are the card's: the fake does not answer them on a MIG handle
        (a, "nvmlDeviceGetPowerUsage", ()), (a, "nvmlDeviceGetTemperature", (pynvml.NVML_TEMPERATURE_GPU,)),
        (a, "nvmlDeviceGetMinorNumber", ()), (a, "nvmlDeviceGetPciInfo", ()), (a, "nvmlDeviceGetMigMode", ()),
        (a, "nvmlDeviceGetSupportedEventTypes", ()),
    ]
    for handle, call, args in not_supported:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            getattr(pynvml, call)(handle, *args)
    # the aggregate over the MIG devices needs privileges the fake's caller does not have
    for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
                 "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMemoryInfo"):
        with pytest.raises(pynvml.NVMLError_NoPermission):
            getattr(pynvml, call)(card)
    assert pynvml.nvmlDeviceGetPowerUsage(card) == 90_000
    assert pynvml.nvmlDeviceGetMinorNumber(card) == 4
    assert [s.pid for s in pynvml.nvmlDeviceGetProcessUtilization(other, 0)] == [7]  # MIG mode off


@pytest.mark.e2e
def test_a_board_without_mig_says_not_supported(lib: Path, tmp_path: Path) -> None:
    doc = {"devices": [dict(GPU, not_supported=["mig"])]}
    with fake_nvml_loaded(lib, write_config(doc, tmp_path / "t4.cfg")):
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(h)
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0  # "zero if MIG is not supported or enabled"
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_a_lost_card_takes_its_mig_handles_with_it(lib: Path, tmp_path: Path) -> None:
    doc = {"nvml": {"clock": "manual"}, "devices": [dict(MIG_CARD, lost_after_ticks=1), GPU]}
    with fake_nvml_loaded(lib, write_config(doc, tmp_path / "lost.cfg")) as fake:
        pynvml.nvmlInit()
        card, other = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        a = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, 1)
        fake.advance(1)
        assert pynvml.nvmlDeviceGetMemoryInfo(a).used == 20
        calls = fake.device_calls(0)
        fake.advance(1)
        for call, handle in (("nvmlDeviceGetMemoryInfo", a), ("nvmlDeviceGetUUID", a),
                             ("nvmlDeviceGetComputeRunningProcesses", a), ("nvmlDeviceGetPowerUsage", card)):
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                getattr(pynvml, call)(handle)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, 1)
        assert fake.device_calls(0) == calls + 5  # calls on MIG handles count as the card's
        assert pynvml.nvmlDeviceGetUUID(other) == "GPU-1"
        pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_auto_clock_moves_a_mig_card_once_per_round_of_its_mig_devices(lib: Path, tmp_path: Path) -> None:
    with fake_nvml_loaded(lib, write_config({"devices": [MIG_CARD]}, tmp_path / "auto.cfg")) as fake:
        pynvml.nvmlInit()
        card = pynvml.nvmlDeviceGetHandleByIndex(0)
        migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card, i) for i in (1, 2)]
        for round_ in (1, 2, 3):
            for m in migs:
                with pytest.raises(pynvml.NVMLError_NotSupported):  # the probe is made all the same
                    pynvml.nvmlDeviceGetProcessUtilization(m, 0)
                assert fake.tick(0) == round_
        pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_events_not_supported_on_one_device(lib: Path, tmp_path: Path) -> None:
    doc = {"devices": [GPU, dict(GPU, uuid="GPU-2", not_supported=["events"])]}
    with fake_nvml_loaded(lib, write_config(doc, tmp_path / "ev.cfg")) as fake:
        pynvml.nvmlInit()
        events = pynvml.nvmlEventSetCreate()
        h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h0) & pynvml.nvmlEventTypeXidCriticalError
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h1) & pynvml.nvmlEventTypeXidCriticalError == 0
        pynvml.nvmlDeviceRegisterEvents(h0, pynvml.nvmlEventTypeXidCriticalError, events)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceRegisterEvents(h1, pynvml.nvmlEventTypeXidCriticalError, events)
        assert fake.calls("nvmlDeviceRegisterEvents") == 2
        pynvml.nvmlEventSetFree(events)
        pynvml.nvmlShutdown()


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(processes=[{"pid": 9}]), "processes on them, not on itself"),
    (lambda d: d.update(mig_devices=[]), "MIG mode with no MIG device"),
    (lambda d: d.update(not_supported=["mig"]), "not_supported mig contradicts mig_devices"),
    (lambda d: d["mig_devices"][0].update(uuid="GPU-X"), "starts with MIG-"),
    (lambda d: d["mig_devices"][0].pop("profile"), "'profile' is required"),
    (lambda d: d["mig_devices"][0].update(power_usage_milliwatts=1), r"unknown key\(s\) power_usage_milliwatts"),
])
def test_converter_rejects_broken_mig_devices(change: Any, message: str) -> None:
    card = json.loads(json.dumps(MIG_CARD))
    change(card)
    with pytest.raises(FakeNvmlError, match=message):
        config_text({"devices": [card]})


@pytest.mark.e2e
def test_library_rejects_card_values_on_a_mig_device(lib: Path, tmp_path: Path) -> None:
    # the converter never writes these; a hand-written config that does is refused at init
    text = config_text({"devices": [MIG_CARD]}) + "power_usage_milliwatts 5\n"
    (tmp_path / "bad.cfg").write_text(text)
    with fake_nvml_loaded(lib, tmp_path / "bad.cfg"), pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
