"""NvmlBackend through the real pynvml against the fake libnvidia-ml.so.1 (tests/fake_nvml).

The fake is loaded into this process (pynvml.nvmlLib is swapped and restored per test); its
test hooks count calls and move its clock, so backoff and lastSeen are asserted exactly.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from exporter.model import DeviceSample, ProcessUsage, UtilSample
from exporter.node.nvml.backend import NvmlBackend
from exporter.node.simulate import SimulatedBackend, parse_scenario
from tests.fake_nvml import TICK_US
from tests.fake_nvml.harness import Harness

pytestmark = pytest.mark.e2e  # every test here builds the fake NVML library (gcc)

GIB = 1 << 30

GPU0: dict[str, Any] = {
    "uuid": "GPU-0a1b2c3d-0000-1111-2222-333344445555",
    "name": "NVIDIA A100-SXM4-80GB",
    "minor_number": 3,
    "pci_bus_id": "00000000:3B:00.0",
    "memory_total_bytes": 80 * GIB,
    "memory_used_bytes": 30 * GIB,
    # given, not left out: an absent one reads 0 in the fake and None in the simulated node
    "memory_reserved_bytes": 600 << 20,
    "utilization_gpu": 87,
    "utilization_memory": 41,
    "power_usage_milliwatts": 312_500,
    "temperature_celsius": 64,
    "sm_clock_mhz": 1410,
    "memory_clock_mhz": 1593,
    "encoder_utilization": 5,
    "decoder_utilization": 7,
    "ecc_corrected": 12,
    "ecc_uncorrected": 1,
    "clocks_event_reasons": 0x4,
    "processes": [
        {"pid": 4100, "used_memory_bytes": 20 * GIB, "sm_util": 60, "cgroup": "0::/\n"},
        {"pid": 4200, "used_memory_bytes": 10 * GIB, "sm_util": 25, "type": "graphics"},
    ],
}
GPU1: dict[str, Any] = {
    "uuid": "GPU-ffffeeee-dddd-cccc-bbbb-aaaa99998888",
    "name": "NVIDIA H100 80GB HBM3",
    "minor_number": 0,
    "pci_bus_id": "00000000:86:00.0",
    "memory_total_bytes": 80 * GIB,
    "memory_used_bytes": 2 * GIB,
    "memory_reserved_bytes": 500 << 20,
    "utilization_gpu": 10,
    "utilization_memory": 3,
    "power_usage_milliwatts": 95_000,
    "temperature_celsius": 40,
    "processes": [{"pid": 5100, "used_memory_bytes": 2 * GIB, "sm_util": 10}],
}


def scenario(*devices: dict[str, Any], **nvml: Any) -> dict[str, Any]:
    """A scenario document (deep-copied devices, so tests may edit them)."""
    doc: dict[str, Any] = {"node": "node-a", "devices": [copy.deepcopy(d) for d in devices]}
    if nvml:
        doc["nvml"] = nvml
    return doc


def expected_device(index: int, d: dict[str, Any]) -> DeviceSample:
    """What a clean first cycle must read for scenario device ``d`` (auto clock, tick 1)."""
    procs = sorted(d.get("processes", []), key=lambda p: p["pid"])
    return DeviceSample(
        index=index, uuid=d["uuid"], name=d["name"], minor_number=d["minor_number"],
        pci_bus_id=d["pci_bus_id"],
        memory_total_bytes=d["memory_total_bytes"], memory_used_bytes=d["memory_used_bytes"],
        memory_reserved_bytes=d.get("memory_reserved_bytes"),
        utilization_gpu=d["utilization_gpu"], utilization_memory=d["utilization_memory"],
        power_usage_milliwatts=d["power_usage_milliwatts"], temperature_celsius=d["temperature_celsius"],
        sm_clock_mhz=d.get("sm_clock_mhz"), memory_clock_mhz=d.get("memory_clock_mhz"),
        encoder_utilization=d.get("encoder_utilization"), decoder_utilization=d.get("decoder_utilization"),
        ecc_corrected_total=d.get("ecc_corrected"), ecc_uncorrected_total=d.get("ecc_uncorrected"),
        clocks_event_reasons=d.get("clocks_event_reasons"),
        processes=tuple(ProcessUsage(p["pid"], p["used_memory_bytes"], p.get("type", "compute"))
                        for p in procs),
        util_samples=tuple(UtilSample(p["pid"], TICK_US, p["sm_util"]) for p in procs if p["sm_util"]),
    )


def gpu0_util(tick: int) -> tuple[UtilSample, ...]:
    """GPU0's util samples of one tick."""
    return (UtilSample(4100, tick * TICK_US, 60), UtilSample(4200, tick * TICK_US, 25))


def counting_wrapper(real: Any, name: str, log: list[str]) -> Any:
    """``real`` that appends ``name`` to ``log`` on each call."""
    def wrapper(*args: Any) -> Any:
        log.append(name)
        return real(*args)
    return wrapper


def test_device_fields_equal_the_scenario(nvml: Harness) -> None:
    backend, _ = nvml.start(scenario(GPU0, GPU1, driver_version="550.54.15"))
    s = backend.sample()
    assert s.nvml_up
    assert s.driver_version == "550.54.15"
    assert s.timestamp == 1_700_000_000.0
    assert s.duration_seconds >= 0.0
    assert s.devices == (expected_device(0, GPU0), expected_device(1, GPU1))
    assert dict(s.errors) == {}


def test_the_simulated_node_reads_the_same_scenario_alike(nvml: Harness) -> None:
    doc = scenario(GPU0, GPU1)
    backend, _ = nvml.start(doc)
    simulated = SimulatedBackend(parse_scenario(doc))
    for _ in range(3):  # the util sample timestamps advance alike too
        assert backend.sample().devices == simulated.sample().devices


def test_process_memory_not_available_is_none_and_mps_clients_count_once(nvml: Harness) -> None:
    gpu = dict(GPU0, memory_used_bytes=None, processes=[
        {"pid": 10, "used_memory_bytes": None, "sm_util": 0},
        {"pid": 20, "used_memory_bytes": 5 * GIB, "sm_util": 0, "type": "mps"},
        {"pid": 30, "used_memory_bytes": None, "sm_util": 0, "type": "graphics"},
    ])
    backend, _ = nvml.start(scenario(gpu))
    d = backend.sample().devices[0]
    assert d.memory_used_bytes is None  # NVML_VALUE_NOT_AVAILABLE in nvmlMemory_t.used
    assert d.memory_total_bytes == 80 * GIB
    # pid 20 is listed by both the compute and the MPS call (nvidia-smi "M+C"): one entry, kind mps
    assert d.processes == (ProcessUsage(10, None, "compute"), ProcessUsage(20, 5 * GIB, "mps"),
                           ProcessUsage(30, None, "graphics"))
    assert d.processes_ok


def test_util_samples_are_returned_once_then_not_found_means_idle(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(GPU0, clock="manual"))
    start = backend.sample().devices[0]  # tick 0: the driver has measured nothing yet
    assert (start.util_samples, start.util_samples_ok) == ((), True)
    fake.advance(1)
    first = backend.sample().devices[0]
    assert first.util_samples == gpu0_util(tick=1)
    assert fake.last_seen(0) == 0  # the whole buffer until a sample was seen

    idle = backend.sample().devices[0]  # the fake's clock did not move: nothing newer
    assert fake.last_seen(0) == TICK_US
    assert idle.util_samples == ()
    assert idle.util_samples_ok  # NotFound is an answer ("idle"), not a failure
    assert backend.sample().errors == {}

    fake.advance(2)  # two periods: two samples per process, none of the first one again
    later = backend.sample().devices[0]
    assert fake.last_seen(0) == TICK_US
    assert [(u.pid, u.timestamp_us) for u in later.util_samples] == [
        (4100, 2 * TICK_US), (4100, 3 * TICK_US), (4200, 2 * TICK_US), (4200, 3 * TICK_US)]
    backend.sample()
    assert fake.last_seen(0) == 3 * TICK_US


def test_last_seen_is_tracked_per_device(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(GPU0, GPU1))
    for cycle in range(1, 4):
        s = backend.sample()
        assert [fake.last_seen(i) for i in (0, 1)] == [(cycle - 1) * TICK_US] * 2
        for d in s.devices:
            assert {u.timestamp_us for u in d.util_samples} == {cycle * TICK_US}


def test_not_supported_fields_are_none_and_not_errors(nvml: Harness) -> None:
    every = ["power", "temperature", "utilization", "clocks", "ecc", "encoder", "decoder",
             "clocks_event_reasons", "process_utilization", "memory"]
    sparse = {k: v for k, v in GPU1.items() if k in ("uuid", "name", "processes")}  # optional values absent
    backend, _ = nvml.start(scenario(dict(GPU0, not_supported=every), sparse))
    s = backend.sample()
    assert dict(s.errors) == {}
    blank = dict.fromkeys(
        ("memory_total_bytes", "memory_used_bytes", "memory_reserved_bytes", "utilization_gpu", "utilization_memory",
         "power_usage_milliwatts", "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz",
         "encoder_utilization", "decoder_utilization", "ecc_corrected_total", "ecc_uncorrected_total",
         "clocks_event_reasons"))
    d0, d1 = s.devices
    assert d0 == replace(expected_device(0, GPU0), **blank, util_samples=(), util_samples_ok=False)
    # absent values read as NotSupported too; identity falls back to the simulated node's defaults
    assert d1 == DeviceSample(index=1, uuid=GPU1["uuid"], name=GPU1["name"], minor_number=1,
                              pci_bus_id="00000000:02:00.0", processes=(ProcessUsage(5100, 2 * GIB),),
                              util_samples=(UtilSample(5100, TICK_US, 10),))


def test_other_errors_are_counted_per_call_and_code(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_permission(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    def broken(*_: object) -> None:
        raise RuntimeError("not an NVMLError")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", no_permission)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", broken)
    backend, _ = nvml.start(scenario(GPU0))
    backend.sample()
    s = backend.sample()
    assert s.devices[0] == replace(expected_device(0, GPU0), temperature_celsius=None,
                                   power_usage_milliwatts=None, util_samples=gpu0_util(tick=2))
    assert dict(s.errors) == {("nvmlDeviceGetTemperature", "NVMLError_NoPermission"): 2,
                              ("nvmlDeviceGetPowerUsage", "RuntimeError"): 2}


def test_failed_process_list_is_not_reported_as_complete(nvml: Harness,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v3", unknown)
    backend, _ = nvml.start(scenario(GPU0))
    d = backend.sample().devices[0]
    assert not d.processes_ok  # attribution must not conclude "idle"
    assert d.processes == (ProcessUsage(4200, 10 * GIB, "graphics"),)  # the lists that were read
    assert d.util_samples_ok and d.util_samples
    assert dict(backend.sample().errors) == {("nvmlDeviceGetComputeRunningProcesses", "NVMLError_Unknown"): 2}


def test_lost_gpu_is_marked_and_reprobed_with_backoff(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(GPU0, dict(GPU1, lost_after_ticks=1)),
                               lost_backoff_s=10.0, lost_backoff_max_s=15.0)
    first = backend.sample()
    assert first.devices[1] == expected_device(1, GPU1)

    nvml.clock.now += 1
    s = backend.sample()  # cycle 2: the device falls off the bus
    assert s.devices[0] == replace(expected_device(0, GPU0), util_samples=gpu0_util(tick=2))
    assert s.devices[1] == DeviceSample(index=1, uuid=GPU1["uuid"], name=GPU1["name"], minor_number=0,
                                        pci_bus_id=GPU1["pci_bus_id"], lost=True, processes_ok=False,
                                        util_samples_ok=False)
    lost_key = ("nvmlDeviceGetProcessUtilization", "NVMLError_GpuIsLost")
    assert dict(s.errors) == {lost_key: 1}

    calls = fake.device_calls(1)
    nvml.clock.now += 9.9  # inside the 10 s backoff: the lost device is not touched
    s = backend.sample()
    assert s.devices[1].lost and s.devices[0].util_samples
    assert fake.device_calls(1) == calls

    nvml.clock.now += 0.1  # backoff over: one probe, which fails on its first call
    s = backend.sample()
    assert s.devices[1].lost
    assert fake.device_calls(1) == calls + 1
    assert s.errors[("nvmlDeviceGetMigMode", "NVMLError_GpuIsLost")] == 1  # a cycle's first call

    nvml.clock.now += 14.9  # the next wait doubled, capped at 15 s
    backend.sample()
    assert fake.device_calls(1) == calls + 1
    nvml.clock.now += 0.1
    backend.sample()
    assert fake.device_calls(1) == calls + 2


def test_gpu_lost_before_its_handle_was_read(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(GPU0, dict(GPU1, lost_after_ticks=0), clock="manual"))
    # another NVML user in the process initialised first; the GPU is lost before the backend starts
    pynvml.nvmlInit()
    fake.advance(1)
    s = backend.sample()
    pynvml.nvmlShutdown()
    assert s.devices[1] == DeviceSample(index=1, uuid="", name="", lost=True, processes_ok=False,
                                        util_samples_ok=False)
    assert not s.devices[0].lost and s.devices[0].uuid == GPU0["uuid"]
    assert dict(s.errors) == {("nvmlDeviceGetHandleByIndex", "NVMLError_GpuIsLost"): 1}


@pytest.mark.parametrize(("nprocs", "growth", "calls"), [
    (8, 7, 4),  # probe says 1, pynvml allocates 2*1+5=7 < 8: INSUFFICIENT_SIZE on the fetch, retried
    (3, 1, 2),  # probe says 2, pynvml allocates 9: the fetch itself finds all 3
])
def test_processes_growing_between_probe_and_fetch_are_all_read(nvml: Harness, nprocs: int, growth: int,
                                                                 calls: int) -> None:
    procs = [{"pid": 100 + i, "used_memory_bytes": GIB, "sm_util": 0} for i in range(nprocs)]
    backend, fake = nvml.start(scenario(dict(GPU1, processes=procs, process_growth=growth)))
    d = backend.sample().devices[0]
    assert fake.calls("nvmlDeviceGetComputeRunningProcesses_v3") == calls  # the fault did fire
    assert d.processes_ok
    assert [p.pid for p in d.processes] == [100 + i for i in range(nprocs)]
    assert dict(backend.sample().errors) == {}


def test_init_failing_recovers_with_exponential_backoff(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(GPU0, init_failures=3), init_backoff_s=1.0, init_backoff_max_s=3.0)
    clock = nvml.clock
    start = clock.now

    def at(offset: float) -> bool:
        clock.now = start + offset
        return backend.sample().nvml_up

    attempts_at = []
    for offset in (0, 0.5, 0.99, 1.0, 2.9, 2.99, 3.0, 5.0, 5.99, 6.0):  # due at 0, 1, 3 (+2), 6 (+3, capped)
        before = fake.calls("nvmlInitWithFlags")
        up = at(offset)
        if fake.calls("nvmlInitWithFlags") != before:
            attempts_at.append(offset)
        assert up == (offset >= 6.0)
    assert attempts_at == [0, 1.0, 3.0, 6.0]

    s = backend.sample()
    assert s.devices[0].uuid == GPU0["uuid"]
    assert s.errors[("nvmlInit", "NVMLError_DriverNotLoaded")] == 3
    assert fake.calls("nvmlInitWithFlags") == 4  # initialised once, never per sample


def test_down_nvml_still_yields_a_sample(nvml: Harness) -> None:
    backend, _ = nvml.start(scenario(GPU0, init_failures=1))
    s = backend.sample()
    assert not s.nvml_up and s.devices == ()
    assert dict(s.errors) == {("nvmlInit", "NVMLError_DriverNotLoaded"): 1}


def test_missing_library_is_reported_not_raised(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(*_: object, **__: object) -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nvml.start(scenario(GPU0))
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    backend = NvmlBackend(clock=nvml.clock)
    s = backend.sample()
    assert not s.nvml_up
    assert dict(s.errors) == {("nvmlInit", "NVMLError_LibraryNotFound"): 1}


@pytest.mark.parametrize("library", ["old", "current"], ids=["symbols-absent", "function-not-found"])
def test_old_driver_falls_back_to_v2_process_calls_once(nvml: Harness, monkeypatch: pytest.MonkeyPatch,
                                                        library: str) -> None:
    v3_calls: list[str] = []
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
                 "nvmlDeviceGetMPSComputeRunningProcesses_v3"):
        monkeypatch.setattr(pynvml, name, counting_wrapper(getattr(pynvml, name), name, v3_calls))

    gpu = dict(GPU0, processes=[*GPU0["processes"], {"pid": 4300, "used_memory_bytes": None, "type": "mps"}])
    backend, fake = nvml.start(scenario(gpu, old_driver=True), library=library)
    first = backend.sample()
    assert len(v3_calls) == 3  # tried once per list
    again = backend.sample()
    assert len(v3_calls) == 3  # and remembered
    assert fake.calls("nvmlDeviceGetComputeRunningProcesses_v2") == 4  # probe + fetch, twice
    for s in (first, again):
        d = s.devices[0]
        assert d.processes_ok
        assert d.processes == (ProcessUsage(4100, 20 * GIB, "compute"),
                               ProcessUsage(4200, 10 * GIB, "graphics"), ProcessUsage(4300, None, "mps"))
        assert d.clocks_event_reasons == GPU0["clocks_event_reasons"]  # via the pre-530 name
    assert dict(again.errors) == {}


def test_close_shuts_nvml_down_once(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(GPU0))
    assert backend.sample().nvml_up
    backend.close()
    backend.close()
    assert fake.calls("nvmlShutdown") == 1
    s = backend.sample()
    assert not s.nvml_up and s.devices == ()
    assert fake.calls("nvmlInitWithFlags") == 1


# ---- MIG ----------------------------------------------------------------------------------

MIG_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mig-a100-node.yaml"
MIG_3G, MIG_2G_A, MIG_2G_B = (f"MIG-{x}" for x in ("3a1b2c3d-0000-5000-8000-000000000001",
                                                     "2a1b2c3d-0000-5000-8000-000000000002",
                                                     "2a1b2c3d-0000-5000-8000-000000000003"))


def mig_scenario(**nvml: Any) -> dict[str, Any]:
    """examples/mig-a100-node.yaml: card 0 in MIG mode (3 MIG devices), card 1 whole."""
    doc = yaml.safe_load(MIG_EXAMPLE.read_text())
    doc["devices"][0].update(sm_clock_mhz=1410, memory_clock_mhz=1593, ecc_corrected=3, ecc_uncorrected=0,
                             clocks_event_reasons=0x1, encoder_utilization=4, decoder_utilization=5)
    # per handle, at most the used memory (v1's used includes it); given, as for GPU0
    for m, reserved in zip(doc["devices"][0]["mig_devices"], (64 << 20, 32 << 20, 0), strict=True):
        m["memory_reserved_bytes"] = reserved
    doc["devices"][1]["memory_reserved_bytes"] = 600 << 20
    if nvml:
        doc["nvml"] = nvml
    return doc


def uuid_of(handle: Any) -> str:
    return pynvml.nvmlDeviceGetUUID(handle)


def failing_for(real: Any, uuid: str, error: BaseException) -> Any:
    """``real``, except that it raises ``error`` for the device ``uuid``."""
    def wrapper(handle: Any, *args: Any, **kwargs: Any) -> Any:
        if uuid_of(handle) == uuid:
            raise error
        return real(handle, *args, **kwargs)
    return wrapper


def test_mig_devices_stand_in_for_their_card_as_in_the_simulated_node(nvml: Harness) -> None:
    doc = mig_scenario()
    backend, fake = nvml.start(doc)
    simulated = SimulatedBackend(parse_scenario(doc))
    for _ in range(3):
        s = backend.sample()
        assert s.devices == simulated.sample().devices
    assert [d.uuid for d in s.devices] == [MIG_3G, MIG_2G_A, MIG_2G_B, doc["devices"][1]["uuid"]]
    mig = s.devices[0]
    # the fields that make a MIG device: read from the MIG handle, the card's values repeated
    assert (mig.parent_uuid, mig.mig_profile, mig.gpu_instance_id, mig.compute_instance_id) == (
        doc["devices"][0]["uuid"], "3g.40gb", 2, 0)
    assert (mig.name, mig.minor_number, mig.pci_bus_id) == ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 0, "00000000:07:00.0")
    assert (mig.power_usage_milliwatts, mig.ecc_corrected_total, mig.clocks_event_reasons) == (212_000, 3, 1)
    assert (mig.utilization_gpu, mig.encoder_utilization, mig.util_samples_ok) == (None, None, False)
    assert mig.processes == (ProcessUsage(7001, 20 * GIB),) and mig.processes_ok
    assert dict(s.errors) == {}  # NotSupported (utilization) is no error; the card's lists were not asked
    # per cycle: probe + fetch on the two MIG devices with a process and on card 1, a probe on the empty one
    assert fake.calls("nvmlDeviceGetComputeRunningProcesses_v3") == 3 * (2 + 2 + 1 + 2)
    assert fake.calls("nvmlDeviceGetMigMode") == 3 * 2  # asked every cycle
    assert fake.calls("nvmlDeviceGetName") == 2 + 3  # identity once per card and per MIG device
    assert fake.calls("nvmlDeviceGetMigDeviceHandleByIndex") == 3 * 7  # every slot, every cycle


def test_a_gpu_without_mig_is_asked_for_its_mode_once(nvml: Harness) -> None:
    backend, fake = nvml.start(scenario(dict(GPU0, not_supported=["mig"]), GPU1))
    for _ in range(3):
        s = backend.sample()
    assert fake.calls("nvmlDeviceGetMigMode") == 1 + 3  # NotSupported once; GPU1 (MIG off) each cycle
    assert s.devices[0] == replace(expected_device(0, GPU0), util_samples=gpu0_util(tick=3))
    assert dict(s.errors) == {}


def test_a_driver_without_mig_calls_has_no_mig(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def missing(*_: object) -> None:
        asked.append("nvmlDeviceGetMigMode")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", missing)
    backend, _ = nvml.start(scenario(GPU0, GPU1))
    backend.sample()
    s = backend.sample()
    assert asked == ["nvmlDeviceGetMigMode"]  # once for the whole backend
    assert s.devices[1] == replace(expected_device(1, GPU1), util_samples=(UtilSample(5100, 2 * TICK_US, 10),))
    assert dict(s.errors) == {}


def test_a_failing_mig_call_costs_that_field_only(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = mig_scenario()
    no_permission = pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo",
                        failing_for(pynvml.nvmlDeviceGetMemoryInfo, MIG_2G_A, no_permission))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuInstanceId",
                        failing_for(pynvml.nvmlDeviceGetGpuInstanceId, MIG_2G_B, no_permission))
    backend, _ = nvml.start(doc)
    simulated = SimulatedBackend(parse_scenario(doc))
    backend.sample()
    simulated.sample()
    s = backend.sample()
    want = simulated.sample().devices
    assert s.devices[0] == want[0] and s.devices[3] == want[3]
    assert s.devices[1] == replace(want[1], memory_total_bytes=None, memory_used_bytes=None, memory_reserved_bytes=None)
    assert s.devices[2] == replace(want[2], gpu_instance_id=None)
    assert dict(s.errors) == {("nvmlDeviceGetMemoryInfo", "NVMLError_NoPermission"): 2,
                              # identity not complete: asked again until it is
                              ("nvmlDeviceGetGpuInstanceId", "NVMLError_NoPermission"): 2}


def test_a_mig_device_that_cannot_be_read_keeps_its_row(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = mig_scenario()
    backend, _ = nvml.start(doc)
    simulated = SimulatedBackend(parse_scenario(doc))
    assert backend.sample().devices == simulated.sample().devices
    want = simulated.sample().devices
    real = pynvml.nvmlDeviceGetMigDeviceHandleByIndex

    def slot_2_unknown(handle: Any, slot: int) -> Any:
        if slot == 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle, slot)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", slot_2_unknown)
    real_memory = pynvml.nvmlDeviceGetMemoryInfo
    # a value no NVML error handler expects: an exception outside the per-call handling
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo",
                        lambda h, *a, **k: object() if uuid_of(h) == MIG_3G else real_memory(h, *a, **k))
    s = backend.sample()
    absent = {"lost": False, "processes_ok": False, "util_samples_ok": False, "processes": ()}
    blank = dict.fromkeys(("memory_total_bytes", "memory_used_bytes", "memory_reserved_bytes", "power_usage_milliwatts",
                           "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz", "ecc_corrected_total",
                           "ecc_uncorrected_total", "clocks_event_reasons"))
    # the slot without a handle: the MIG device found there before, without values
    assert s.devices[1] == replace(want[1], **absent, **blank)
    # an unexpected exception on one MIG device: that device without values
    assert s.devices[0] == replace(want[0], **absent, **blank)
    assert s.devices[2:] == want[2:]
    assert dict(s.errors) == {("nvmlDeviceGetMigDeviceHandleByIndex", "NVMLError_Unknown"): 1,
                              ("sample_device", "AttributeError"): 1}


def test_mig_mode_unreadable_keeps_the_mode_last_read(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = nvml.start(mig_scenario())
    first = backend.sample()

    def unknown(*_: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", unknown)
    s = backend.sample()
    assert [d.uuid for d in s.devices] == [d.uuid for d in first.devices]
    assert s.errors == {("nvmlDeviceGetMigMode", "NVMLError_Unknown"): 2}


def test_a_mig_device_is_identified_once_per_uuid(nvml: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, fake = nvml.start(mig_scenario())
    backend.sample()
    backend.sample()
    assert fake.calls("nvmlDeviceGetName") == 2 + 3
    # slot 1 now holds another MIG device (destroyed and created again under a new UUID)
    real = pynvml.nvmlDeviceGetUUID
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID",
                        lambda h: "MIG-new" if real(h) == MIG_3G else real(h))
    s = backend.sample()
    assert fake.calls("nvmlDeviceGetName") == 2 + 3 + 1
    assert s.devices[0].uuid == "MIG-new" and s.devices[0].mig_profile == "3g.40gb"
    assert dict(s.errors) == {}


def test_lost_mig_card_reports_its_mig_devices_lost_and_is_reprobed_with_backoff(nvml: Harness) -> None:
    doc = mig_scenario(clock="manual")
    doc["devices"][0]["lost_after_ticks"] = 1
    backend, fake = nvml.start(doc, lost_backoff_s=10.0)
    assert [d.lost for d in backend.sample().devices] == [False] * 4  # initialises NVML: tick 0
    fake.advance(1)
    assert [d.lost for d in backend.sample().devices] == [False] * 4
    fake.advance(1)
    s = backend.sample()
    lost_doc = copy.deepcopy(doc)
    lost_doc["devices"][0]["lost_after_ticks"] = 0
    want = SimulatedBackend(parse_scenario(lost_doc)).sample().devices
    assert s.devices[:3] == want[:3]  # lost, MIG identity kept
    assert all(d.lost and d.parent_uuid == doc["devices"][0]["uuid"] for d in s.devices[:3])
    assert not s.devices[3].lost and s.devices[3].memory_used_bytes == 12 * GIB
    assert dict(s.errors) == {("nvmlDeviceGetMigMode", "NVMLError_GpuIsLost"): 1}
    calls = fake.device_calls(0)
    nvml.clock.now += 9.9
    assert backend.sample().devices[:3] == want[:3]
    assert fake.device_calls(0) == calls  # not touched inside the backoff
    nvml.clock.now += 0.1
    assert backend.sample().devices[:3] == want[:3]
    assert fake.device_calls(0) == calls + 1


def test_gpu_is_lost_from_one_mig_device_takes_the_whole_card(nvml: Harness) -> None:
    doc = mig_scenario()  # auto clock: the card is lost at the first MIG device's utilization probe of cycle 2
    doc["devices"][0]["lost_after_ticks"] = 1
    backend, fake = nvml.start(doc)
    backend.sample()
    s = backend.sample()
    assert [(d.uuid, d.lost) for d in s.devices[:3]] == [(MIG_3G, True), (MIG_2G_A, True), (MIG_2G_B, True)]
    assert not s.devices[3].lost
    # counted once, and the other MIG devices were not asked after it
    assert dict(s.errors) == {("nvmlDeviceGetProcessUtilization", "NVMLError_GpuIsLost"): 1}
    # one memory read per handle starts with v2 (v1 follows where v2 is NotSupported)
    assert fake.calls("nvmlDeviceGetMemoryInfo_v2") == (3 + 1) + (1 + 1)  # cycle 2 stopped at the first MIG device


def test_mig_card_lost_before_its_mig_devices_were_found(nvml: Harness) -> None:
    doc = mig_scenario(clock="manual")
    doc["devices"][0]["lost_after_ticks"] = 0
    backend, fake = nvml.start(doc)
    pynvml.nvmlInit()  # another NVML user initialised first; the card is lost before the backend starts
    fake.advance(1)
    s = backend.sample()
    pynvml.nvmlShutdown()
    assert s.devices[0] == DeviceSample(index=0, uuid="", name="", lost=True, processes_ok=False,
                                        util_samples_ok=False)
    assert [d.uuid for d in s.devices[1:]] == [doc["devices"][1]["uuid"]]
