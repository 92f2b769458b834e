"""Health reads of one card (issue 18): energy, enforced power limit, fan, P-state, memory
temperature, PCIe, retired pages, row remapping, power-limit violation time, NVLink per link and
GPM (``gpm.py``).

* Each call is wrapped on its own (``errors.py``): NotSupported blanks only its field and is not
  an error; any other failure blanks the field and is counted under (call, error); GPU_IS_LOST
  raises DeviceLost.
* A symbol the driver lacks (FunctionNotFound: an older driver than the call) blanks its field
  without counting and is not asked for again this session, as FieldReader's fallbacks do.
* ``nvmlDeviceGetFieldValues`` answers each field with its own nvmlReturn, handled like a call's
  (counted under ``nvmlDeviceGetFieldValues``): one call per cycle reads the memory temperature and
  every link's NVLink data counters (KiB, scope = link).
* P-state ``NVML_PSTATE_UNKNOWN`` (32) reads as None; retired pages count the addresses
  ``nvmlDeviceGetRetiredPages`` lists; the pending and failure flags read 0/1.
* NVLink: the links are found by asking ``nvmlDeviceGetNvLinkState`` for every index up to
  ``NVML_NVLINK_MAX_LINKS``; NotSupported or InvalidArgument means no such link (not an error). A
  clean search is kept for the session (a card's links do not come and go), so a card without
  NVLink costs that search once; a search with a counted failure is made again next cycle.
  Without ``nvlink`` (``--no-nvlink-metrics``) no NVLink call is made and ``nvlinks`` is empty.
* MIG: the backend reads the card once per cycle and repeats its health on each MIG device, except
  GPM: a card in MIG mode is sampled per GPU instance (``gpm.py``), each MIG device gets its own.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.model import DeviceHealth, NvLinkSample
from exporter.node.nvml.errors import MISSING, CallErrors, FunctionMissing, error_name
from exporter.node.nvml.gpm import GpmReader
from exporter.node.nvml.identity import Device

_NO_LINK = object()  # nvmlDeviceGetNvLinkState: the device has no link at that index
_FIELDS = "nvmlDeviceGetFieldValues"
# c_nvmlFieldValue_t.valueType -> the member of its value union
_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
_LINK_DATA = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
_LINK_ERRORS = (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


def _times(value: int | None, factor: int) -> int | None:
    return None if value is None else value * factor


class HealthReader:
    """Reads a card's DeviceHealth; failures go to ``errors``. Raises only DeviceLost."""

    def __init__(self, errors: CallErrors, gpm: GpmReader | None = None, *, nvlink: bool = True) -> None:
        """Count failed calls in ``errors``; GPM ratios through ``gpm`` (one of its own by default);
        NVLink read only with ``nvlink``."""
        self._errors = errors
        self._nvlink = nvlink
        self.gpm = gpm if gpm is not None else GpmReader(errors)
        self._missing: set[str] = set()  # calls whose symbol the driver lacks
        self._links: dict[int, tuple[int, ...]] = {}  # device index -> its links, once found cleanly

    def read(self, dev: Device, *, card_gpm: bool = True) -> DeviceHealth:
        """The card's health this cycle (``dev`` is a physical GPU, in MIG mode or not); ``card_gpm``
        False (MIG mode: GPM per GPU instance) leaves the card's own GPM unread."""
        h = dev.handle
        pstate = self._call("nvmlDeviceGetPerformanceState", h)
        single, double, retired_pending = self._retired_pages(h)
        remapped = self._call("nvmlDeviceGetRemappedRows", h)  # (correctable, uncorrectable, pending, failure)
        corr, unc, remap_pending, remap_failure = remapped if remapped is not None else (None,) * 4
        links, states = self._find_links(dev.index, h) if self._nvlink else ((), {})
        memory_temperature, *link_data = self._field_values(h, links)
        return DeviceHealth(
            energy_millijoules=self._call("nvmlDeviceGetTotalEnergyConsumption", h),
            power_limit_milliwatts=self._call("nvmlDeviceGetEnforcedPowerLimit", h),
            fan_speed_percent=self._call("nvmlDeviceGetFanSpeed", h),
            performance_state=None if pstate in (None, pynvml.NVML_PSTATE_UNKNOWN) else int(pstate),
            memory_temperature_celsius=memory_temperature,
            # each of the two reads samples the bus for ~20 ms in the driver
            pcie_tx_kilobytes_per_second=self._call("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            pcie_rx_kilobytes_per_second=self._call("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
            pcie_replay_count=self._call("nvmlDeviceGetPcieReplayCounter", h),
            pcie_link_generation=self._call("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_link_width=self._call("nvmlDeviceGetCurrPcieLinkWidth", h),
            retired_pages_single_bit=single,
            retired_pages_double_bit=double,
            retired_pages_pending=retired_pending,
            remapped_rows_correctable=corr,
            remapped_rows_uncorrectable=unc,
            remapped_rows_pending=_flag(remap_pending),
            remapped_rows_failure=_flag(remap_failure),
            power_violation_nanoseconds=self._violation(h, pynvml.NVML_PERF_POLICY_POWER),
            nvlinks=tuple(self._link(h, link, states, link_data[2 * i:2 * i + 2]) for i, link in enumerate(links)),
            gpm=self.gpm.read(dev.index, h) if card_gpm else None,
        )

    def forget(self, index: int) -> None:
        """The device was lost: free its GPM buffers and find its links again when it is back."""
        self._links.pop(index, None)
        self.gpm.forget(index)

    def close(self) -> None:
        """Free what NVML holds for us; call before nvmlShutdown."""
        self.gpm.close()

    # ---- calls ---------------------------------------------------------------------------

    def _call(self, call: str, *args: Any) -> Any:
        """``pynvml.<call>(*args)`` through CallErrors; None for a symbol the driver lacks, remembered."""
        if call in self._missing:
            return None
        try:
            return self._errors.call(call, *args, fallback=True)
        except FunctionMissing:
            self._missing.add(call)  # an older driver: not an error, and not worth a dlsym every cycle
            return None

    def _retired_pages(self, h: Any) -> tuple[int | None, int | None, int | None]:
        """Pages retired for single-bit and for double-bit ECC errors, and whether a retirement is pending."""
        call = "nvmlDeviceGetRetiredPages"
        single = self._call(call, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        double = self._call(call, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = self._call("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return (None if single is None else len(single), None if double is None else len(double),
                None if pending is None else int(pending == pynvml.NVML_FEATURE_ENABLED))

    def _violation(self, h: Any, policy: int) -> int | None:
        """Nanoseconds the ``policy`` (power, thermal, ...) held the clocks down since the driver loaded."""
        violation = self._call("nvmlDeviceGetViolationStatus", h, policy)  # nvmlViolationTime_t
        return None if violation is None else int(violation.violationTime)

    def _field_values(self, h: Any, links: tuple[int, ...]) -> list[int | None]:
        """Memory temperature, then TX and RX KiB of each link; one NVML call for all of them."""
        ids = [(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0), *((f, link) for link in links for f in _LINK_DATA)]
        values = self._call(_FIELDS, h, ids)
        if values is None:
            return [None] * len(ids)
        return [self._field(v) for v in values]

    def _field(self, v: Any) -> int | None:
        """One c_nvmlFieldValue_t: its value, or None with its own nvmlReturn handled like a call's."""
        rc = int(v.nvmlReturn)
        if rc == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        if rc == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise self._errors.lost(_FIELDS)
        if rc != pynvml.NVML_SUCCESS:
            self._errors.count(_FIELDS, error_name(pynvml.NVMLError(rc)))
            return None
        member = _VALUE_MEMBERS.get(int(v.valueType))
        if member is None:
            self._errors.count(_FIELDS, "UnknownValueType")
            return None
        return int(getattr(v.value, member))

    # ---- NVLink ----------------------------------------------------------------------------

    def _find_links(self, index: int, h: Any) -> tuple[tuple[int, ...], dict[int, int | None]]:
        """The card's link indices, and the states read while finding them this cycle (if searched)."""
        if index in self._links:
            return self._links[index], {}
        errors_before = self._errors.events
        states: dict[int, int | None] = {}
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = self._link_state(h, link)
            if isinstance(state, int):
                states[link] = state
            # a link whose state failed (counted) is left out until a search reads it
        if self._errors.events == errors_before:
            self._links[index] = tuple(states)
        return tuple(states), states

    def _link_state(self, h: Any, link: int) -> Any:
        """nvmlDeviceGetNvLinkState: the state, ``_NO_LINK`` for no such link, None on a counted failure."""
        call = "nvmlDeviceGetNvLinkState"
        if call in self._missing:
            return _NO_LINK
        try:
            return int(pynvml.nvmlDeviceGetNvLinkState(h, link))
        except MISSING:
            self._missing.add(call)  # a driver without NVLink calls: no links
            return _NO_LINK
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            return _NO_LINK  # no NVLink on the card, or none at this index
        except pynvml.NVMLError_GpuIsLost:
            raise self._errors.lost(call) from None
        except Exception as e:
            self._errors.count(call, error_name(e))
            return None

    def _link(self, h: Any, link: int, states: dict[int, int | None], data: list[int | None]) -> NvLinkSample:
        """One link's state, data counters (bytes) and error counters."""
        state = states[link] if link in states else self._link_state(h, link)
        crc, replay, recovery = (self._call("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
                                 for counter in _LINK_ERRORS)
        tx, rx = data
        return NvLinkSample(
            link=link,
            # a known link answering "no such link" now is unknown this cycle, not down
            active=None if state is None or state is _NO_LINK else state == pynvml.NVML_FEATURE_ENABLED,
            tx_bytes=_times(tx, 1024),
            rx_bytes=_times(rx, 1024),
            crc_errors=crc,
            replay_errors=replay,
            recovery_errors=recovery,
        )
