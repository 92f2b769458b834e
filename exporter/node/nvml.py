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

MIG (docs/metrics.md, "MIG"): a GPU in MIG mode is not reported itself; its MIG devices take its
place, with the same fields as the simulated node gives them.

* ``nvmlDeviceGetMigMode`` is asked every cycle (a GPU's MIG mode can change within a session).
  NotSupported means the GPU is not MIG-capable and it is not asked again this session; a driver
  without the MIG calls (FunctionNotFound, before R450) means no GPU is in MIG mode. Neither is an
  error. Any other failure is counted and the mode last read is kept.
* MIG devices are enumerated every cycle (MIG devices can be created and destroyed at any time):
  ``nvmlDeviceGetMaxMigDeviceCount``, then ``nvmlDeviceGetMigDeviceHandleByIndex`` for each slot,
  where NotFound is an empty slot. The UUID of each handle is read every cycle; name, GPU and
  compute instance ids once per UUID. The profile is the name's suffix after " MIG "
  (``NVIDIA A100-SXM4-80GB MIG 3g.40gb``). A slot whose handle cannot be had this cycle keeps the
  MIG device found there before, without values; a failed count keeps the last enumeration.
* Per MIG device, on its own handle: memory, running processes (the card's lists are an
  aggregate that needs privileges), and device, codec and process utilization, which current
  drivers answer NotSupported on MIG devices (so MIG rows carry none, and ``util_samples_ok`` is
  False). Minor number and PCI bus id are the card's; power, temperature, clocks, ECC and clocks
  event reasons are read once per cycle on the card and repeated on each of its MIG devices.
* A failing MIG call costs that field, or that MIG device when unexpected; ``GPU_IS_LOST`` from
  the card or any of its MIG devices marks the card lost, reported as its last known MIG devices,
  all lost (or as the card when none was ever found), re-probed with the card's backoff.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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


def error_name(e: BaseException) -> str:
    """The label an NVML error is counted under (the pynvml exception class name)."""
    name = type(e).__name__
    if name == "NVMLError":  # a code pynvml has no subclass for: keep the number
        return f"NVMLError_{getattr(e, 'value', 'unknown')}"
    return name


def capped_backoff(base: float, cap: float, failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive failures: base, doubling, at most cap."""
    # the exponent is bounded so that a long outage cannot overflow the float
    return min(cap, base * 2 ** min(max(failures - 1, 0), 32))


def _known(value: int) -> int | None:
    return None if value == NVML_VALUE_NOT_AVAILABLE else int(value)


def _mig_profile(name: str) -> str:
    """``3g.40gb`` of ``NVIDIA A100-SXM4-80GB MIG 3g.40gb``; "" for a name without " MIG "."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() if sep else ""


@dataclass
class _Mig:
    """A MIG device of a card, as the latest enumeration found it."""

    slot: int
    handle: Any = None  # None: the slot's handle could not be had this cycle
    uuid: str = ""
    name: str = ""
    profile: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    identity_ok: bool = False
    last_seen_us: int = 0


@dataclass
class _Device:
    """What the backend keeps about one device index (a physical GPU) between cycles."""

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
    mig_capable: bool = True  # False once nvmlDeviceGetMigMode said NotSupported
    mig_mode: bool = False  # as last read
    migs: list[_Mig] = field(default_factory=list)  # in MIG mode: its MIG devices, by slot


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
        self._no_mig = False  # driver predates the MIG calls

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
                self._count("sample", error_name(e))
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
                    self._count("nvmlShutdown", error_name(e))

    # ---- init ----------------------------------------------------------------------------

    def _sample_devices(self, now: float) -> tuple[DeviceSample, ...]:
        if self._closed:
            return ()
        if not self._initialized and (now < self._next_init_at or not self._init(now)):
            return ()
        return tuple(s for dev in self._devices for s in self._sample_device(dev, now))

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
                self._count("nvmlShutdown", error_name(shutdown_error))
            return False
        self._initialized = True
        self._init_failures = 0
        self._devices = [_Device(i) for i in range(count)]
        try:
            self._driver_version = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:
            self._count("nvmlSystemGetDriverVersion", error_name(e))
            self._driver_version = ""
        return True

    def _init_failed(self, call: str, e: Exception, now: float) -> None:
        self._count(call, error_name(e))
        self._init_failures += 1
        self._next_init_at = now + capped_backoff(*self._init_backoff, self._init_failures)

    def _count(self, call: str, code: str) -> None:
        key = (call, code)
        self._errors[key] = self._errors.get(key, 0) + 1
        self._error_events += 1

    # ---- one device ------------------------------------------------------------------------

    def _sample_device(self, dev: _Device, now: float) -> tuple[DeviceSample, ...]:
        """The GPU's sample, or its MIG devices' samples when it is in MIG mode."""
        if dev.lost and now < dev.next_probe_at:
            return self._absent(dev, lost=True)
        try:
            samples = self._read_device(dev)
        except _DeviceLost:
            dev.lost = True
            dev.lost_failures += 1
            dev.next_probe_at = now + capped_backoff(*self._lost_backoff, dev.lost_failures)
            return self._absent(dev, lost=True)
        except Exception as e:  # a surprise on one device must not cost the others their rows
            self._count("sample_device", error_name(e))
            return self._absent(dev, lost=False)
        dev.lost = False
        dev.lost_failures = 0
        return samples

    def _absent(self, dev: _Device, *, lost: bool) -> tuple[DeviceSample, ...]:
        """Rows without values: the MIG devices last found on a card in MIG mode, else the card."""
        if dev.mig_mode and dev.migs:
            return tuple(self._absent_mig(dev, m, lost=lost) for m in dev.migs)
        return (DeviceSample(index=dev.index, uuid=dev.uuid, name=dev.name, minor_number=dev.minor_number,
                             pci_bus_id=dev.pci_bus_id, lost=lost, processes_ok=False, util_samples_ok=False),)

    @staticmethod
    def _absent_mig(dev: _Device, m: _Mig, *, lost: bool) -> DeviceSample:
        return DeviceSample(index=dev.index, uuid=m.uuid, name=m.name, minor_number=dev.minor_number,
                            pci_bus_id=dev.pci_bus_id, lost=lost, processes_ok=False, util_samples_ok=False,
                            parent_uuid=dev.uuid, gpu_instance_id=m.gpu_instance_id,
                            compute_instance_id=m.compute_instance_id, mig_profile=m.profile)

    def _call(self, call: str, *args: Any, fallback: bool = False) -> Any:
        """``pynvml.<call>(*args)``; ``None`` when it failed. Raises only _DeviceLost / _FunctionMissing."""
        try:
            return getattr(pynvml, call)(*args)
        except _MISSING as e:
            if fallback:
                raise _FunctionMissing from None
            self._count(call, error_name(e))
        except pynvml.NVMLError_NotSupported:
            pass
        except pynvml.NVMLError_GpuIsLost:
            self._count(call, "NVMLError_GpuIsLost")
            raise _DeviceLost from None
        except Exception as e:
            self._count(call, error_name(e))
        return None

    def _read_device(self, dev: _Device) -> tuple[DeviceSample, ...]:
        if dev.handle is None:
            dev.handle = self._call("nvmlDeviceGetHandleByIndex", dev.index)
            if dev.handle is None:
                return self._absent(dev, lost=False)
        if not dev.identity_ok:
            self._read_identity(dev)
        if self._in_mig_mode(dev):
            return self._read_mig_card(dev)
        dev.migs = []
        return (self._read_gpu(dev),)

    def _read_gpu(self, dev: _Device) -> DeviceSample:
        return DeviceSample(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            minor_number=dev.minor_number,
            pci_bus_id=dev.pci_bus_id,
            **self._handle_values(dev),
            **self._card_values(dev.handle),
        )

    def _handle_values(self, dev: _Device | _Mig) -> dict[str, Any]:
        """What a GPU or MIG handle answers for itself: memory, utilization, processes."""
        h = dev.handle
        memory = self._call("nvmlDeviceGetMemoryInfo", h)
        # On MIG devices current drivers say NotSupported here; a driver that answers is believed.
        util = self._call("nvmlDeviceGetUtilizationRates", h)
        encoder = self._call("nvmlDeviceGetEncoderUtilization", h)
        decoder = self._call("nvmlDeviceGetDecoderUtilization", h)
        processes, processes_ok = self._processes(h)
        util_samples, util_samples_ok = self._util_samples(dev)
        return {
            "memory_total_bytes": None if memory is None else _known(memory.total),
            "memory_used_bytes": None if memory is None else _known(memory.used),
            "utilization_gpu": None if util is None else int(util.gpu),
            "utilization_memory": None if util is None else int(util.memory),
            "encoder_utilization": None if encoder is None else int(encoder[0]),
            "decoder_utilization": None if decoder is None else int(decoder[0]),
            "processes": processes,
            "processes_ok": processes_ok,
            "util_samples": util_samples,
            "util_samples_ok": util_samples_ok,
        }

    def _card_values(self, h: Any) -> dict[str, int | None]:
        """Power, temperature, clocks, ECC, clocks event reasons: what NVML answers for the card only."""
        power = self._call("nvmlDeviceGetPowerUsage", h)
        temperature = self._call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        sm_clock = self._call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        mem_clock = self._call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
        ecc_corrected, ecc_uncorrected = (
            self._call("nvmlDeviceGetTotalEccErrors", h, kind, pynvml.NVML_VOLATILE_ECC)
            for kind in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        return {
            "power_usage_milliwatts": power,
            "temperature_celsius": temperature,
            "sm_clock_mhz": sm_clock,
            "memory_clock_mhz": mem_clock,
            "ecc_corrected_total": ecc_corrected,
            "ecc_uncorrected_total": ecc_uncorrected,
            "clocks_event_reasons": self._clocks_event_reasons(h),
        }

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

    # ---- MIG -------------------------------------------------------------------------------

    def _in_mig_mode(self, dev: _Device) -> bool:
        if self._no_mig or not dev.mig_capable:
            return False
        errors_before = self._error_events
        try:
            mode = self._call("nvmlDeviceGetMigMode", dev.handle, fallback=True)
        except _FunctionMissing:
            self._no_mig = True  # a driver before MIG: every GPU is whole
            return False
        if mode is None:
            if self._error_events == errors_before:
                dev.mig_capable = False  # NotSupported: not a MIG-capable GPU, no need to ask again
                return False
            return dev.mig_mode  # unknown this cycle (counted): keep what was last read
        dev.mig_mode = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE  # (current, pending)
        return dev.mig_mode

    def _read_mig_card(self, dev: _Device) -> tuple[DeviceSample, ...]:
        card = self._card_values(dev.handle)
        dev.migs = self._enumerate_migs(dev)
        samples = []
        for m in dev.migs:
            try:
                samples.append(self._read_mig(dev, m, card))
            except _DeviceLost:
                raise  # the whole card
            except Exception as e:  # a surprise on one MIG device costs only its values
                self._count("sample_device", error_name(e))
                samples.append(self._absent_mig(dev, m, lost=False))
        return tuple(samples)

    def _enumerate_migs(self, dev: _Device) -> list[_Mig]:
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", dev.handle)
        if count is None:
            return dev.migs  # not this cycle (counted): the MIG devices found last time
        known = {m.slot: m for m in dev.migs}
        found: list[_Mig] = []
        call = "nvmlDeviceGetMigDeviceHandleByIndex"
        for slot in range(count):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot
            except pynvml.NVMLError_NotSupported:
                return []  # MIG mode went off since it was read: no MIG device
            except pynvml.NVMLError_GpuIsLost:
                self._count(call, "NVMLError_GpuIsLost")
                raise _DeviceLost from None
            except Exception as e:
                self._count(call, error_name(e))
                if slot in known:  # still there, as far as anyone knows: reported without values
                    known[slot].handle = None
                    found.append(known[slot])
                continue
            found.append(self._mig_at(known.get(slot), slot, handle))
        return found

    def _mig_at(self, before: _Mig | None, slot: int, handle: Any) -> _Mig:
        """The MIG device behind ``handle``: the one found in that slot before, unless its UUID changed."""
        uuid = self._call("nvmlDeviceGetUUID", handle)
        if before is not None and (uuid is None or uuid == before.uuid):
            before.handle = handle
            return before
        return _Mig(slot, handle, uuid or "")

    def _read_mig_identity(self, m: _Mig) -> None:
        errors_before = self._error_events
        name = self._call("nvmlDeviceGetName", m.handle)
        gpu_instance = self._call("nvmlDeviceGetGpuInstanceId", m.handle)
        compute_instance = self._call("nvmlDeviceGetComputeInstanceId", m.handle)
        m.name = name or m.name
        m.profile = _mig_profile(m.name)
        m.gpu_instance_id = gpu_instance if gpu_instance is not None else m.gpu_instance_id
        m.compute_instance_id = compute_instance if compute_instance is not None else m.compute_instance_id
        m.identity_ok = bool(m.uuid) and self._error_events == errors_before

    def _read_mig(self, dev: _Device, m: _Mig, card: dict[str, int | None]) -> DeviceSample:
        if m.handle is None:
            return self._absent_mig(dev, m, lost=False)
        if not m.identity_ok:
            self._read_mig_identity(m)
        return DeviceSample(
            index=dev.index,
            uuid=m.uuid,
            name=m.name,
            minor_number=dev.minor_number,
            pci_bus_id=dev.pci_bus_id,
            **self._handle_values(m),
            parent_uuid=dev.uuid,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            mig_profile=m.profile,
            **card,
        )

    # ---- shared reads ------------------------------------------------------------------------

    def _clocks_event_reasons(self, h: Any) -> int | None:
        if not self._throttle_reasons_only:
            try:
                return self._call("nvmlDeviceGetCurrentClocksEventReasons", h, fallback=True)
            except _FunctionMissing:
                self._throttle_reasons_only = True  # driver < 530: the same bits under the old name
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)

    # ---- processes -------------------------------------------------------------------------

    def _processes(self, handle: Any) -> tuple[tuple[ProcessUsage, ...], bool]:
        merged: dict[int, ProcessUsage] = {}
        complete = True
        for kind, call in _PROCESS_LISTS:
            entries = self._process_list(handle, kind, call)
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

    def _process_list(self, handle: Any, kind: str, call: str) -> list[Any] | None:
        """One running-process list; ``None`` when it could not be read completely."""
        tries = 0
        while True:
            v2 = kind in self._v2_only
            fn = getattr(pynvml, f"{call}_v2" if v2 else f"{call}_v3")
            try:
                return list(fn(handle))
            except _MISSING as e:
                if not v2:
                    self._v2_only.add(kind)  # driver < 510; the _v2 entries have the same fields
                    continue
                if kind == "mps":
                    return []  # a driver without the MPS list has no MPS clients to report
                self._count(call, error_name(e))
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
                self._count(call, error_name(e))
                return None

    def _util_samples(self, dev: _Device | _Mig) -> tuple[tuple[UtilSample, ...], bool]:
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
                self._count(call, error_name(e))
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
