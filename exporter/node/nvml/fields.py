"""Per-field reads of one handle: memory, utilization, power, temperature, clocks, ECC, clocks
event reasons, running processes and per-process utilization samples. The card's health signals
(energy, PCIe, row remapping, NVLink, GPM, ...) are read by ``health.py``.

* Memory comes from ``nvmlDeviceGetMemoryInfo_v2`` (``nvmlMemory_v2``), whose ``reserved`` is
  ``memory_reserved_bytes``; ``memory_used_bytes`` keeps v1's meaning (reserved included: v1 used =
  v2 used + reserved), so the series does not change under a newer driver. Where v2 answers
  NotSupported, v1 is asked that cycle (reserved None); a driver without the v2 symbol is read
  through v1 for good, uncounted.
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
* Per MIG device, on its own handle: memory, running processes (the card's lists are an
  aggregate that needs privileges), and device, codec and process utilization, which current
  drivers answer NotSupported on MIG devices (so MIG rows carry none, and ``util_samples_ok`` is
  False). Power, temperature, clocks, ECC and clocks event reasons are read on the card only.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.model import ProcessUsage, UtilSample
from exporter.node.nvml.errors import MISSING, CallErrors, FunctionMissing, error_name
from exporter.node.nvml.identity import Device, Mig

NVML_VALUE_NOT_AVAILABLE = 0xFFFF_FFFF_FFFF_FFFF
# Tries per cycle of a list that keeps growing between pynvml's size probe and its fetch.
_SIZE_RETRIES = 3
# (kind, pynvml base name); MPS first: MPS clients are listed by the compute call too.
_PROCESS_LISTS = (
    ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"),
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
)


def _known(value: int) -> int | None:
    return None if value == NVML_VALUE_NOT_AVAILABLE else int(value)


class FieldReader:
    """Reads the value fields of GPU and MIG handles; failures go to ``errors``. Raises only DeviceLost."""

    def __init__(self, errors: CallErrors) -> None:
        """Count failed calls in ``errors``."""
        self._errors = errors
        self._v2_only: set[str] = set()  # process-list kinds whose _v3 symbol the driver lacks
        self._throttle_reasons_only = False  # driver predates nvmlDeviceGetCurrentClocksEventReasons
        self._memory_v1_only = False  # driver predates nvmlDeviceGetMemoryInfo_v2

    def handle_values(self, dev: Device | Mig) -> dict[str, Any]:
        """What a GPU or MIG handle answers for itself: memory, utilization, processes."""
        h = dev.handle
        memory_total, memory_used, memory_reserved = self.memory(h)
        # On MIG devices current drivers say NotSupported here; a driver that answers is believed.
        util = self._errors.call("nvmlDeviceGetUtilizationRates", h)
        encoder = self._errors.call("nvmlDeviceGetEncoderUtilization", h)
        decoder = self._errors.call("nvmlDeviceGetDecoderUtilization", h)
        processes, processes_ok = self.processes(h)
        util_samples, util_samples_ok = self.util_samples(dev)
        return {
            "memory_total_bytes": memory_total,
            "memory_used_bytes": memory_used,
            "memory_reserved_bytes": memory_reserved,
            "utilization_gpu": None if util is None else int(util.gpu),
            "utilization_memory": None if util is None else int(util.memory),
            "encoder_utilization": None if encoder is None else int(encoder[0]),
            "decoder_utilization": None if decoder is None else int(decoder[0]),
            "processes": processes,
            "processes_ok": processes_ok,
            "util_samples": util_samples,
            "util_samples_ok": util_samples_ok,
        }

    def memory(self, h: Any) -> tuple[int | None, int | None, int | None]:
        """Total, used (reserved included, as in v1) and reserved bytes of a GPU or MIG handle."""
        call = "nvmlDeviceGetMemoryInfo"
        if not self._memory_v1_only:
            errors_before = self._errors.events
            try:
                memory = self._errors.call(call, h, pynvml.nvmlMemory_v2, fallback=True)
            except FunctionMissing:
                self._memory_v1_only = True  # an older driver: v1 has total and used, no reserved
                memory = None
            if memory is not None:
                used, reserved = _known(memory.used), _known(memory.reserved)
                # a reserved size the driver cannot tell adds nothing to used
                return _known(memory.total), None if used is None else used + (reserved or 0), reserved
            if self._errors.events != errors_before:
                return None, None, None  # failed (counted): v1 would most likely fail alike
            # NotSupported or no v2 symbol: v1 may still know total and used
        memory = self._errors.call(call, h)
        if memory is None:
            return None, None, None
        return _known(memory.total), _known(memory.used), None

    def card_values(self, h: Any) -> dict[str, int | None]:
        """Power, temperature, clocks, ECC, clocks event reasons: what NVML answers for the card only."""
        power = self._errors.call("nvmlDeviceGetPowerUsage", h)
        temperature = self._errors.call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        sm_clock = self._errors.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        mem_clock = self._errors.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
        ecc_corrected, ecc_uncorrected = (
            self._errors.call("nvmlDeviceGetTotalEccErrors", h, kind, pynvml.NVML_VOLATILE_ECC)
            for kind in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        return {
            "power_usage_milliwatts": power,
            "temperature_celsius": temperature,
            "sm_clock_mhz": sm_clock,
            "memory_clock_mhz": mem_clock,
            "ecc_corrected_total": ecc_corrected,
            "ecc_uncorrected_total": ecc_uncorrected,
            "clocks_event_reasons": self.clocks_event_reasons(h),
        }

    def clocks_event_reasons(self, h: Any) -> int | None:
        """The clocks event (throttle) reason bits, under whichever name the driver has."""
        if not self._throttle_reasons_only:
            try:
                return self._errors.call("nvmlDeviceGetCurrentClocksEventReasons", h, fallback=True)
            except FunctionMissing:
                self._throttle_reasons_only = True  # driver < 530: the same bits under the old name
        return self._errors.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)

    def processes(self, handle: Any) -> tuple[tuple[ProcessUsage, ...], bool]:
        """The handle's running processes, one per pid sorted by pid, and whether every list was read."""
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
            except MISSING as e:
                if not v2:
                    self._v2_only.add(kind)  # driver < 510; the _v2 entries have the same fields
                    continue
                if kind == "mps":
                    return []  # a driver without the MPS list has no MPS clients to report
                self._errors.count(call, error_name(e))
                return None
            except pynvml.NVMLError_InsufficientSize:
                # processes started between pynvml's size probe and its fetch: probe again
                tries += 1
                if tries >= _SIZE_RETRIES:
                    self._errors.count(call, "NVMLError_InsufficientSize")
                    return None
            except pynvml.NVMLError_NotSupported:
                # no graphics or MPS list proves nothing about compute; no compute list does
                return None if kind == "compute" else []
            except pynvml.NVMLError_GpuIsLost:
                raise self._errors.lost(call) from None
            except Exception as e:
                self._errors.count(call, error_name(e))
                return None

    def util_samples(self, dev: Device | Mig) -> tuple[tuple[UtilSample, ...], bool]:
        """Per-process utilization samples newer than ``dev.last_seen_us`` (advanced), and whether they count."""
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
                    self._errors.count(call, "NVMLError_InsufficientSize")
                    return (), False
            except pynvml.NVMLError_GpuIsLost:
                raise self._errors.lost(call) from None
            except Exception as e:
                self._errors.count(call, error_name(e))
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
