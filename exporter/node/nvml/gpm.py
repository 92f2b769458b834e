"""GPM (GPU performance monitoring, Hopper and newer): five profiling ratios per device and cycle.

A GPM metric is computed from two samples, so each device keeps two sample buffers:

* ``nvmlGpmQueryDeviceSupport`` is asked once per device: a device without GPM (``isSupportedDevice``
  0, or NotSupported) reports ``gpm=None`` and is not asked again; a failure is counted and the
  question is asked again next cycle. A driver without the GPM calls (FunctionNotFound) has no GPM
  on any device, which is not an error and is not asked again.
* A supported device gets two buffers (``nvmlGpmSampleAlloc``); each cycle fills one
  (``nvmlGpmSampleGet``) and, from the second cycle on, ``nvmlGpmMetricsGet`` computes the ratios over
  previous -> current; then the buffers swap roles. The first cycle and a cycle whose sample failed
  report ``gpm=None``, never zeros.
* Each metric carries its own nvmlReturn: NotSupported blanks that ratio only; another code is counted
  under ``nvmlGpmMetricsGet``; GPU_IS_LOST raises DeviceLost. Values are percent: ratio = value/100,
  held to 0..1.
* The buffers are freed (``nvmlGpmSampleFree``) when the device is lost (:meth:`GpmReader.forget`) and
  on close, before nvmlShutdown; a lost device starts over when it is back.

MIG (Hopper and newer): a card in MIG mode is sampled per GPU instance, ``nvmlGpmMigSampleGet(card,
gpuInstanceId, buffer)`` on the card's handle, each instance with its own two buffers; support is the
card's (``nvmlGpmQueryDeviceSupport`` asked on the card: it refuses a MIG handle). The compute
instances of one GPU instance share its sample. :meth:`GpmReader.retain` frees the buffers of instances
(or of the whole card) a cycle no longer reads: MIG devices come and go, and MIG mode can change. A
driver without ``nvmlGpmMigSampleGet`` has no MIG GPM, which is not an error and is not asked again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pynvml

from exporter.model import GpmSample
from exporter.node.nvml.errors import CallErrors, FunctionMissing, error_name

# GpmSample field -> NVML metric id (each in percent, 0.0 - 100.0)
METRICS = (
    ("graphics_active", pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL),
    ("sm_active", pynvml.NVML_GPM_METRIC_SM_UTIL),
    ("sm_occupancy", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY),
    ("tensor_active", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("dram_active", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL),
)


@dataclass
class _DeviceGpm:
    """GPM state of one device between cycles."""

    previous: Any = None  # the buffer holding last cycle's sample
    current: Any = None  # the buffer this cycle fills
    have_previous: bool = False  # ``previous`` holds a sample


Key = tuple[int, int | None]  # (device index, GPU instance id; None: the whole card)


class GpmReader:
    """GPM ratios per device index (and GPU instance); failures go to ``errors``. Raises only DeviceLost."""

    def __init__(self, errors: CallErrors) -> None:
        """Count failed calls in ``errors``."""
        self._errors = errors
        self._devices: dict[Key, _DeviceGpm] = {}
        self._support: dict[int, bool] = {}  # device index -> whether its card has GPM (absent: not known yet)
        self._no_gpm = False  # the driver predates the GPM calls
        self._no_mig_gpm = False  # the driver lacks nvmlGpmMigSampleGet

    def read(self, index: int, handle: Any, gpu_instance: int | None = None) -> GpmSample | None:
        """This cycle's ratios over the period since the last cycle; None without two samples.

        ``handle`` is always the card's; ``gpu_instance`` names one of its GPU instances (MIG mode).
        """
        if self._no_gpm or (gpu_instance is not None and self._no_mig_gpm):
            return None
        state = self._devices.setdefault((index, gpu_instance), _DeviceGpm())
        try:
            if not self._ready(index, state, handle):
                return None
            if gpu_instance is None:
                got = self._call("nvmlGpmSampleGet", handle, state.current)
            else:
                got = self._mig_sample(handle, gpu_instance, state.current)
            if got is None:
                return None  # the previous sample stays the base of the next period
            gpm = self._metrics(state) if state.have_previous else None
        except FunctionMissing:
            if gpu_instance is None:
                self._no_gpm = True
                self.close()
            return None
        state.previous, state.current = state.current, state.previous
        state.have_previous = True
        return gpm

    def supported(self, index: int, *, mig: bool = False) -> bool | None:
        """Whether the card at ``index`` has GPM (``mig``: per GPU instance too); None: not known yet."""
        if self._no_gpm or (mig and self._no_mig_gpm):
            return False
        return self._support.get(index)

    def retain(self, index: int, gpu_instances: set[int | None]) -> None:
        """Free the buffers of the card's instances (None: the card itself) not in ``gpu_instances``."""
        for key in [k for k in self._devices if k[0] == index and k[1] not in gpu_instances]:
            self._free(self._devices.pop(key))

    def forget(self, index: int) -> None:
        """Free the device's buffers, its instances' too (it was lost); it starts over when it is back."""
        self._support.pop(index, None)
        self.retain(index, set())

    def close(self) -> None:
        """Free every buffer; call before nvmlShutdown."""
        for index in {k[0] for k in self._devices} | set(self._support):
            self.forget(index)

    def _call(self, call: str, *args: Any) -> Any:
        return self._errors.call(call, *args, fallback=True)

    def _mig_sample(self, handle: Any, gpu_instance: int, buffer: Any) -> Any:
        """``nvmlGpmMigSampleGet``; a driver without it has no MIG GPM (not an error): every instance freed."""
        try:
            return self._call("nvmlGpmMigSampleGet", handle, gpu_instance, buffer)
        except FunctionMissing:
            self._no_mig_gpm = True
            for key in [k for k in self._devices if k[1] is not None]:
                self._free(self._devices.pop(key))
            raise

    def _ready(self, index: int, state: _DeviceGpm, handle: Any) -> bool:
        """Whether the card has GPM and ``state`` its two buffers. Raises FunctionMissing."""
        if index not in self._support:
            errors_before = self._errors.events
            answer = self._call("nvmlGpmQueryDeviceSupport", handle)
            if answer is None:
                if self._errors.events == errors_before:
                    self._support[index] = False  # NotSupported: a definite answer
                return False  # a failed answer (counted) is asked again next cycle
            self._support[index] = bool(answer.isSupportedDevice)
        if not self._support[index]:
            return False
        if state.current is None:
            state.current = self._call("nvmlGpmSampleAlloc")
        if state.previous is None:
            state.previous = self._call("nvmlGpmSampleAlloc")
        # a failed allocation (counted) is tried again next cycle; the one that worked is kept
        return state.current is not None and state.previous is not None

    def _metrics(self, state: _DeviceGpm) -> GpmSample | None:
        """The ratios from ``previous`` to ``current``; None when the call failed."""
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(METRICS)
        get.sample1 = state.previous
        get.sample2 = state.current
        for i, (_, metric_id) in enumerate(METRICS):
            get.metrics[i].metricId = metric_id
        answer = self._call("nvmlGpmMetricsGet", get)
        if answer is None:
            return None
        return GpmSample(**{name: self._ratio(answer.metrics[i]) for i, (name, _) in enumerate(METRICS)})

    def _ratio(self, metric: Any) -> float | None:
        """One metric's ratio 0..1, or None; its own nvmlReturn handled like a call's."""
        call = "nvmlGpmMetricsGet"
        rc = int(metric.nvmlReturn)
        if rc == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        if rc == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise self._errors.lost(call)
        if rc != pynvml.NVML_SUCCESS:
            self._errors.count(call, error_name(pynvml.NVMLError(rc)))
            return None
        value = float(metric.value)
        if not math.isfinite(value):
            return None  # no measurement (e.g. an empty period), not a zero
        # the driver's percentages can overshoot 100 by rounding; a ratio is 0..1
        return min(1.0, max(0.0, value / 100.0))

    def _free(self, state: _DeviceGpm) -> None:
        for buffer in (state.previous, state.current):
            if buffer is None:
                continue
            try:
                pynvml.nvmlGpmSampleFree(buffer)
            except Exception as e:  # nothing to do about it but count: the buffer is dropped either way
                self._errors.count("nvmlGpmSampleFree", error_name(e))
        state.previous = state.current = None
        state.have_previous = False
