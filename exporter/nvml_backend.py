"""The production sampler: reads every GPU through NVML (pynvml) into a NodeSample.

Rules that shape this module (facts in the NVML reference notes):

* ``sample()`` never raises. Each NVML call is wrapped on its own: NotSupported leaves the
  field ``None`` and is not an error; any other failure leaves it ``None`` and is counted in
  ``NodeSample.errors`` under (pynvml function name, error class name).
* NVML is initialised once. If init fails (no library, driver not loaded, RM version
  mismatch, ...) the sample says ``nvml_up=False`` and later calls retry with exponential
  backoff on an injectable monotonic clock.
* Devices are enumerated once per successful init (count, then a handle per index), and
  their identity (UUID, name, minor number, PCI bus id) is cached: NVML does not hot-plug
  devices within a session, so re-enumerating every cycle would only cost calls.
* ``GPU_IS_LOST`` marks that device lost (``DeviceSample.lost``) for the cycle and the rest
  of its reads are skipped; the other devices keep reporting. A lost device is re-probed
  with exponential backoff, not every cycle.
* Running processes come from the compute, graphics and MPS-compute lists (``_v3`` calls,
  falling back to ``_v2`` for good once a driver older than 510 lacks them). A pid in
  several lists is reported once: its MPS entry wins, then compute, then graphics; the
  tuple is sorted by pid. ``processes_ok`` is False when a list could not be read (or the
  compute list is NotSupported), so attribution never mistakes "unknown" for "idle".
* Process utilization uses ``lastSeenTimeStamp`` = the newest sample timestamp seen on that
  device (0 at first, i.e. the driver's whole buffer). NotFound means "no newer sample":
  the device was idle, which is a valid empty answer, not an error. All samples newer than
  lastSeen are passed on, sorted by (pid, timestamp); combining several samples of one pid
  is left to attribution. NotSupported here sets ``util_samples_ok=False`` (no samples then
  proves nothing) without counting an error.
* An unexpected exception outside NVML's error classes is counted under ``("sample_device",
  name)`` (that device reports no values this cycle) or ``("sample", name)``.

MIG is not handled yet: MIG devices are neither enumerated nor attributed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pynvml

from exporter.model import DeviceSample, NodeSample, ProcessUsage, UtilSample

NVML_VALUE_NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF
# Tries per cycle of a list that keeps growing between pynvml's size probe and its fetch.
_SIZE_RETRIES = 3
# (kind, pynvml base name); MPS first: MPS clients are listed by the compute call too.
_PROCESS_LISTS = (
    ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"),
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
)
_MISSING = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLLibraryMismatchError)


class _DeviceLost(Exception):
    """GPU_IS_LOST from a device: stop reading it this cycle."""


class _FunctionMissing(Exception):
    """The driver lacks a symbol the caller has a fallback for."""


def _error_name(e: BaseException) -> str:
    name = type(e).__name__
    if name == "NVMLError":  # a code pynvml has no subclass for: keep the number
        return f"NVMLError_{getattr(e, 'value', 'unknown')}"
    return name


def _backoff(base: float, cap: float, failures: int) -> float:
    # the exponent is bounded so that a long outage cannot overflow the float
    return min(cap, base * 2 ** min(max(failures - 1, 0), 32))


def _known(value: int) -> int | None:
    return None if value == NVML_VALUE_NOT_AVAILABLE else int(value)


@dataclass
class _Device:
    """What the backend keeps about one device index between cycles."""

    index: int
    handle: Any = None
    uuid: str = ""
    name: str = ""
    minor_number: int | None = None
    pci_bus_id: str = ""
    identity_ok: bool = False
    last_seen_us: int = 0
    lost: bool = False
    lost_failures: int = 0
    next_probe_at: float = 0.0


class NvmlBackend:
    """Samples every GPU on the node through NVML; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        init_backoff_s: float = 1.0,
        init_backoff_max_s: float = 300.0,
        lost_backoff_s: float = 10.0,
        lost_backoff_max_s: float = 600.0,
    ) -> None:
        """``clock`` times backoff and durations; ``wall_clock`` stamps samples."""
        self._clock = clock
        self._wall_clock = wall_clock
        self._init_backoff = (init_backoff_s, init_backoff_max_s)
        self._lost_backoff = (lost_backoff_s, lost_backoff_max_s)
        self._lock = threading.Lock()
        self._initialized = False
        self._closed = False
        self._init_failures = 0
        self._next_init_at = float("-inf")
        self._devices: list[_Device] = []
        self._driver_version = ""
        self._errors: dict[tuple[str, str], int] = {}
        self._error_events = 0  # total counted, to tell whether a group of calls was clean
        self._v2_only: set[str] = set()  # process-list kinds whose _v3 symbol the driver lacks
        self._throttle_reasons_only = False  # driver predates nvmlDeviceGetCurrentClocksEventReasons

    @property
    def nvml_up(self) -> bool:
        """Whether NVML is initialised now."""
        return self._initialized

    def sample(self) -> NodeSample:
        """Read every device once. Never raises; failures show in the sample's fields."""
        with self._lock:
            start = self._clock()
            try:
                devices = self._sample_devices(start)
            except Exception as e:  # the contract is a sample, whatever went wrong
                self._count("sample", _error_name(e))
                devices = ()
            return NodeSample(
                timestamp=self._wall_clock(),
                devices=devices,
                nvml_up=self._initialized,
                duration_seconds=max(0.0, self._clock() - start),
                errors=MappingProxyType(dict(self._errors)),
                driver_version=self._driver_version,
            )

    def close(self) -> None:
        """Shut NVML down; later samples report ``nvml_up=False``. Idempotent."""
        with self._lock:
            self._closed = True
            if self._initialized:
                self._initialized = False
                try:
                    pynvml.nvmlShutdown()
                except Exception as e:
                    self._count("nvmlShutdown", _error_name(e))

    # ---- init ----------------------------------------------------------------------------

    def _sample_devices(self, now: float) -> tuple[DeviceSample, ...]:
        if self._closed:
            return ()
        if not self._initialized and (now < self._next_init_at or not self._init(now)):
            return ()
        return tuple(self._sample_device(dev, now) for dev in self._devices)

    def _init(self, now: float) -> bool:
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_DriverNotLoaded, _LibraryNotFound, _LibRmVersionMismatch, ...
            self._init_failed("nvmlInit", e, now)
            return False
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            self._init_failed("nvmlDeviceGetCount", e, now)
            try:
                pynvml.nvmlShutdown()  # keep NVML's init refcount balanced for the retry
            except Exception as shutdown_error:
                self._count("nvmlShutdown", _error_name(shutdown_error))
            return False
        self._initialized = True
        self._init_failures = 0
        self._devices = [_Device(i) for i in range(count)]
        try:
            self._driver_version = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:
            self._count("nvmlSystemGetDriverVersion", _error_name(e))
            self._driver_version = ""
        return True

    def _init_failed(self, call: str, e: Exception, now: float) -> None:
        self._count(call, _error_name(e))
        self._init_failures += 1
        self._next_init_at = now + _backoff(*self._init_backoff, self._init_failures)

    def _count(self, call: str, code: str) -> None:
        key = (call, code)
        self._errors[key] = self._errors.get(key, 0) + 1
        self._error_events += 1

    # ---- one device ------------------------------------------------------------------------

    def _sample_device(self, dev: _Device, now: float) -> DeviceSample:
        if dev.lost and now < dev.next_probe_at:
            return self._absent(dev, lost=True)
        try:
            sample = self._read_device(dev)
        except _DeviceLost:
            dev.lost = True
            dev.lost_failures += 1
            dev.next_probe_at = now + _backoff(*self._lost_backoff, dev.lost_failures)
            return self._absent(dev, lost=True)
        except Exception as e:  # a surprise on one device must not cost the others their rows
            self._count("sample_device", _error_name(e))
            return self._absent(dev, lost=False)
        dev.lost = False
        dev.lost_failures = 0
        return sample

    @staticmethod
    def _absent(dev: _Device, *, lost: bool) -> DeviceSample:
        return DeviceSample(index=dev.index, uuid=dev.uuid, name=dev.name, minor_number=dev.minor_number,
                            pci_bus_id=dev.pci_bus_id, lost=lost, processes_ok=False, util_samples_ok=False)

    def _call(self, call: str, *args: Any, fallback: bool = False) -> Any:
        """``pynvml.<call>(*args)``; ``None`` when it failed. Raises only _DeviceLost / _FunctionMissing."""
        try:
            return getattr(pynvml, call)(*args)
        except _MISSING as e:
            if fallback:
                raise _FunctionMissing from None
            self._count(call, _error_name(e))
        except pynvml.NVMLError_NotSupported:
            pass
        except pynvml.NVMLError_GpuIsLost:
            self._count(call, "NVMLError_GpuIsLost")
            raise _DeviceLost from None
        except Exception as e:
            self._count(call, _error_name(e))
        return None

    def _read_device(self, dev: _Device) -> DeviceSample:
        if dev.handle is None:
            dev.handle = self._call("nvmlDeviceGetHandleByIndex", dev.index)
            if dev.handle is None:
                return self._absent(dev, lost=False)
        h = dev.handle
        if not dev.identity_ok:
            self._read_identity(dev)

        memory = self._call("nvmlDeviceGetMemoryInfo", h)
        util = self._call("nvmlDeviceGetUtilizationRates", h)
        power = self._call("nvmlDeviceGetPowerUsage", h)
        temperature = self._call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        sm_clock = self._call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        mem_clock = self._call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
        encoder = self._call("nvmlDeviceGetEncoderUtilization", h)
        decoder = self._call("nvmlDeviceGetDecoderUtilization", h)
        ecc_corrected, ecc_uncorrected = (
            self._call("nvmlDeviceGetTotalEccErrors", h, kind, pynvml.NVML_VOLATILE_ECC)
            for kind in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        reasons = self._clocks_event_reasons(h)
        processes, processes_ok = self._processes(dev)
        util_samples, util_samples_ok = self._util_samples(dev)
        return DeviceSample(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            minor_number=dev.minor_number,
            pci_bus_id=dev.pci_bus_id,
            memory_total_bytes=None if memory is None else _known(memory.total),
            memory_used_bytes=None if memory is None else _known(memory.used),
            utilization_gpu=None if util is None else int(util.gpu),
            utilization_memory=None if util is None else int(util.memory),
            power_usage_milliwatts=power,
            temperature_celsius=temperature,
            sm_clock_mhz=sm_clock,
            memory_clock_mhz=mem_clock,
            encoder_utilization=None if encoder is None else int(encoder[0]),
            decoder_utilization=None if decoder is None else int(decoder[0]),
            ecc_corrected_total=ecc_corrected,
            ecc_uncorrected_total=ecc_uncorrected,
            clocks_event_reasons=reasons,
            processes=processes,
            processes_ok=processes_ok,
            util_samples=util_samples,
            util_samples_ok=util_samples_ok,
        )

    def _read_identity(self, dev: _Device) -> None:
        h = dev.handle
        errors_before = self._error_events
        uuid = self._call("nvmlDeviceGetUUID", h)
        name = self._call("nvmlDeviceGetName", h)
        minor = self._call("nvmlDeviceGetMinorNumber", h)
        pci = self._call("nvmlDeviceGetPciInfo", h)
        dev.uuid = uuid or dev.uuid
        dev.name = name or dev.name
        dev.minor_number = minor if minor is not None else dev.minor_number
        dev.pci_bus_id = pci.busId if pci is not None else dev.pci_bus_id
        # identity never changes within a session; read again only after a failed read
        dev.identity_ok = uuid is not None and self._error_events == errors_before

    def _clocks_event_reasons(self, h: Any) -> int | None:
        if not self._throttle_reasons_only:
            try:
                return self._call("nvmlDeviceGetCurrentClocksEventReasons", h, fallback=True)
            except _FunctionMissing:
                self._throttle_reasons_only = True  # driver < 530: the same bits under the old name
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)

    # ---- processes -------------------------------------------------------------------------

    def _processes(self, dev: _Device) -> tuple[tuple[ProcessUsage, ...], bool]:
        merged: dict[int, ProcessUsage] = {}
        complete = True
        for kind, call in _PROCESS_LISTS:
            entries = self._process_list(dev, kind, call)
            if entries is None:
                complete = False
                continue
            for entry in entries:
                memory = entry.usedGpuMemory  # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
                seen = merged.get(entry.pid)
                if seen is None:
                    merged[entry.pid] = ProcessUsage(int(entry.pid), memory, kind)
                elif seen.used_memory_bytes is None and memory is not None:
                    merged[entry.pid] = ProcessUsage(seen.pid, memory, seen.kind)
        return tuple(merged[pid] for pid in sorted(merged)), complete

    def _process_list(self, dev: _Device, kind: str, call: str) -> list[Any] | None:
        """One running-process list; ``None`` when it could not be read completely."""
        tries = 0
        while True:
            v2 = kind in self._v2_only
            fn = getattr(pynvml, f"{call}_v2" if v2 else f"{call}_v3")
            try:
                return list(fn(dev.handle))
            except _MISSING as e:
                if not v2:
                    self._v2_only.add(kind)  # driver < 510; the _v2 entries have the same fields
                    continue
                if kind == "mps":
                    return []  # a driver without the MPS list has no MPS clients to report
                self._count(call, _error_name(e))
                return None
            except pynvml.NVMLError_InsufficientSize:
                # processes started between pynvml's size probe and its fetch: probe again
                tries += 1
                if tries >= _SIZE_RETRIES:
                    self._count(call, "NVMLError_InsufficientSize")
                    return None
            except pynvml.NVMLError_NotSupported:
                # no graphics or MPS list proves nothing about compute; no compute list does
                return None if kind == "compute" else []
            except pynvml.NVMLError_GpuIsLost:
                self._count(call, "NVMLError_GpuIsLost")
                raise _DeviceLost from None
            except Exception as e:
                self._count(call, _error_name(e))
                return None

    def _util_samples(self, dev: _Device) -> tuple[tuple[UtilSample, ...], bool]:
        call = "nvmlDeviceGetProcessUtilization"
        tries = 0
        while True:
            try:
                raw = pynvml.nvmlDeviceGetProcessUtilization(dev.handle, dev.last_seen_us)
                break
            except pynvml.NVMLError_NotFound:
                return (), True  # nothing newer than lastSeen: every process was idle
            except pynvml.NVMLError_NotSupported:
                return (), False  # e.g. MIG: no samples here says nothing about idleness
            except pynvml.NVMLError_InsufficientSize:
                tries += 1
                if tries >= _SIZE_RETRIES:
                    self._count(call, "NVMLError_InsufficientSize")
                    return (), False
            except pynvml.NVMLError_GpuIsLost:
                self._count(call, "NVMLError_GpuIsLost")
                raise _DeviceLost from None
            except Exception as e:
                self._count(call, _error_name(e))
                return (), False
        # only samples newer than lastSeen are news, whatever the driver hands back
        fresh = [s for s in raw if s.timeStamp > dev.last_seen_us]
        if fresh:
            dev.last_seen_us = max(int(s.timeStamp) for s in fresh)
        samples = sorted(
            (UtilSample(pid=int(s.pid), timestamp_us=int(s.timeStamp), sm_util=int(s.smUtil),
                        mem_util=int(s.memUtil), enc_util=int(s.encUtil), dec_util=int(s.decUtil))
             for s in fresh),
            key=lambda u: (u.pid, u.timestamp_us),
        )
        return tuple(samples), True
