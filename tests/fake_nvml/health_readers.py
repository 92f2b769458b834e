"""How a consumer reads the fake's health calls through pynvml, and what it should read.

:data:`READERS` maps each health scenario key to the pynvml calls that read it (the device
fields' own ``read``, exporter/node/nvml/direct.py, where one call answers the value); :func:`expected`
is the oracle: what those readers return for a scenario device at a tick, NotSupported included.
tests/test_fake_nvml_health.py holds them against each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from exporter.exposition.device_fields import DEVICE_FIELDS
from exporter.node.nvml.direct import direct_read, field_value
from tests.fake_nvml.health_config import GPM_KEYS, HEALTH_INTS, NVLINK_VALUES

NS = "NotSupported"  # what a reader yields for a call, field or metric that NVML does not support
GPM_IDS = dict(zip(GPM_KEYS, (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, pynvml.NVML_GPM_METRIC_SM_UTIL,
                              pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                              pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL), strict=True))
REMAPPED = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
            "remapped_rows_failure")


def or_ns(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except pynvml.NVMLError_NotSupported:
        return NS


def field(h: Any, field_id: int, scope: int = 0) -> int:
    return field_value(pynvml, h, field_id, scope)


def read_links(h: Any) -> dict[int, tuple[Any, ...]]:
    """Every link 0.. until InvalidArgument: (active, tx KiB, rx KiB, crc, replay, recovery), NS per value."""
    links = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = or_ns(lambda: pynvml.nvmlDeviceGetNvLinkState(h, link))  # noqa: B023
        except pynvml.NVMLError_InvalidArgument:
            break
        values = (active,
                  or_ns(lambda: field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)),  # noqa: B023
                  or_ns(lambda: field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)),  # noqa: B023
                  *(or_ns(lambda c=c: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, c))  # noqa: B023
                    for c in (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                              pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)))
        if any(v != NS for v in values):
            links[link] = values
    return links


def gpm_metrics(h: Any, ids: list[int]) -> list[tuple[int, float]]:
    """(nvmlReturn, value) per metric id, from two samples taken one tick apart."""
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(h, s1)
        pynvml.nvmlGpmSampleGet(h, s2)
        get = pynvml.c_nvmlGpmMetricsGet_t(version=pynvml.NVML_GPM_METRICS_GET_VERSION, numMetrics=len(ids),
                                           sample1=s1, sample2=s2)
        for i, metric in enumerate(ids):
            get.metrics[i].metricId = metric
        pynvml.nvmlGpmMetricsGet(get)
        return [(get.metrics[i].nvmlReturn, get.metrics[i].value) for i in range(len(ids))]
    finally:
        pynvml.nvmlGpmSampleFree(s1)
        pynvml.nvmlGpmSampleFree(s2)


def read_gpm(h: Any) -> dict[str, Any] | None:
    if not pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
        return None
    got = gpm_metrics(h, list(GPM_IDS.values()))
    return {k: value if rc == pynvml.NVML_SUCCESS else NS for k, (rc, value) in zip(GPM_IDS, got, strict=True)}


# scenario key -> how a consumer reads it through pynvml: each device field's own direct read
# (DeviceField.read, keyed by its model field), and by hand the keys whose read is not one value of one call
READERS: dict[str, Callable[[Any], Any]] = {
    **{f.attr.rpartition(".")[2]: (lambda h, read=f.read: direct_read(pynvml, h, read))
       for f in DEVICE_FIELDS if f.read},
    "memory_reserved_bytes": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).reserved,
    "retired_pages_single_bit": lambda h: len(pynvml.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
    "retired_pages_double_bit": lambda h: len(pynvml.nvmlDeviceGetRetiredPages(
        h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
    "nvlinks": read_links,
    "gpm": read_gpm,
}


def read_all(h: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {k: or_ns(lambda r=r: r(h)) for k, r in READERS.items() if k not in skip}


def expected(d: Mapping[str, Any], ticks: int) -> dict[str, Any]:
    """What READERS should read from device ``d`` at tick ``ticks``: the oracle of these tests."""
    ns = set(d.get("not_supported", ()))
    want: dict[str, Any] = {k: NS if k in ns or d.get(k) is None else d[k] for k in HEALTH_INTS}
    power = 0 if "power" in ns else d.get("power_usage_milliwatts") or 0
    if want["energy_millijoules"] != NS:
        want["energy_millijoules"] += power * ticks
    # one NVML call answers all four: any of them blanked, or none given, blanks the call
    if ns & set(REMAPPED) or all(d.get(k) is None for k in REMAPPED):
        want.update(dict.fromkeys(REMAPPED, NS))
    else:
        want.update({k: d.get(k) or 0 for k in REMAPPED})
    blank = {"memory", "memory_reserved_bytes"} & ns or d.get("memory_total_bytes") is None
    want["memory_reserved_bytes"] = NS if blank else d.get("memory_reserved_bytes") or 0
    want["nvlinks"] = {} if "nvlinks" in ns else {
        m["link"]: tuple(NS if m.get(k) is None else m[k] for k in NVLINK_VALUES)
        for m in d.get("nvlinks") or () if any(m.get(k) is not None for k in NVLINK_VALUES)}
    gpm = d.get("gpm")
    want["gpm"] = None if gpm is None or "gpm" in ns else {
        k: NS if gpm.get(k) is None else gpm[k] * 100.0 for k in GPM_KEYS}
    return want
