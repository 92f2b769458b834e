"""The GPU health families (issue 18): energy, power limit, PCIe, retired pages, row remapping,
decoded clocks event reasons, NVLink and GPM, read from NVML without DCGM (docs/metrics.md,
"Health (NVML, no DCGM)").

Pure: device samples in, ``prometheus_client`` families out, in base units. A field that is
``None`` (NotSupported, not read, lost GPU) has no row, never a 0; GPM families exist only where
the device has GPM. A MIG device has rows under its own uuid carrying its card's values, as the
backend repeats them on every MIG device, GPM aside (its GPU instance's own), except NVLink: the
links belong to the physical card, so a MIG card's NVLink rows appear once, labelled as the card
(its GPU uuid, minor number and name), taken from the first of its MIG devices that carries links
(both backends give all of them the card's one reading).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.exposition.device_fields import in_group, native, value
from exporter.model import DeviceHealth, DeviceSample

BASE = ("node_name", "uuid", "minor_number", "name")
HEALTH_FIELDS = in_group("health")
GPM_FIELDS = in_group("gpm")

# nvmlClocksEventReasons bits (nvml.h); the raw mask stays in nvidia_gpu_clocks_event_reasons,
# so a bit a newer driver adds is visible there even though it is not decoded here.
CLOCKS_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

_NVLINK_ERRORS = (("crc", "crc_errors"), ("replay", "replay_errors"), ("recovery", "recovery_errors"))


def decode_clocks_event_reasons(mask: int) -> tuple[str, ...]:
    """The known reasons set in an nvmlClocksEventReasons mask, in bit order (unknown bits ignored)."""
    return tuple(name for bit, name in CLOCKS_EVENT_REASONS if mask & bit)


class _Builder:
    """Families in a fixed order whatever the data; empty ones are dropped at the end."""

    def __init__(self) -> None:
        self._fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        if name not in self._fams:
            self._fams[name] = GaugeMetricFamily(name, doc, labels=[*BASE, *extra])
        return self._fams[name]  # type: ignore[return-value]

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
        if name not in self._fams:
            self._fams[name] = CounterMetricFamily(name, doc, labels=[*BASE, *extra])
        return self._fams[name]  # type: ignore[return-value]

    def result(self) -> list[Metric]:
        return [f for f in self._fams.values() if f.samples]


def _put(fam: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None,
         per_unit: float = 1) -> None:
    if value is not None:
        fam.add_metric(labels, value / per_unit)  # 1 / 1024 is exact: KB/s * 1024 stays whole


def card_name(d: DeviceSample) -> str:
    """The physical card's name: a MIG device's name is ``<card name> MIG <profile>`` (NVML's naming)."""
    if d.parent_uuid is None:
        return d.name
    head, sep, _ = d.name.rpartition(" MIG ")
    return head if sep and head else d.name


def health_families(devices: Iterable[DeviceSample], node: str) -> list[Metric]:
    """The health families of every device (MIG devices under their own uuid), in a stable order.

    NVLink rows are the physical card's: once per MIG card, under the card's uuid. With
    ``--no-nvlink-metrics`` the backends read no links, so there are none to render.
    """
    b = _Builder()
    linked: set[str] = set()  # MIG cards whose NVLink rows are out
    for d in devices:
        minor = "" if d.minor_number is None else str(d.minor_number)
        lbl = [node, d.uuid, minor, d.name]
        _scalars(b, d, lbl)
        _reasons(b, d.clocks_event_reasons, lbl)
        if d.parent_uuid is None:
            _nvlinks(b, d.health, lbl)
        elif d.parent_uuid not in linked:
            _nvlinks(b, d.health, [node, d.parent_uuid, minor, card_name(d)])
            if d.health.nvlinks:  # a MIG device read without values leaves the links to the next
                linked.add(d.parent_uuid)
        _gpm(b, d.health, lbl)
    return b.result()


def _scalars(b: _Builder, d: DeviceSample, lbl: list[str]) -> None:
    h = d.health
    for f in HEALTH_FIELDS:  # the device field table's health families, in its order
        fam = b.counter(f.family, f.help) if f.kind == "counter" else b.gauge(f.family, f.help)
        if (v := value(f, d)) is not None:
            fam.add_metric(lbl, native(f, v))
    pages = b.gauge("nvidia_gpu_retired_pages",
                    "Device memory pages retired, by cause (nvmlDeviceGetRetiredPages)", ("cause",))
    _put(pages, [*lbl, "single_bit_ecc"], h.retired_pages_single_bit)
    _put(pages, [*lbl, "double_bit_ecc"], h.retired_pages_double_bit)
    rows = b.gauge("nvidia_gpu_remapped_rows",
                   "Device memory rows remapped, by error type (nvmlDeviceGetRemappedRows)", ("type",))
    _put(rows, [*lbl, "correctable"], h.remapped_rows_correctable)
    _put(rows, [*lbl, "uncorrectable"], h.remapped_rows_uncorrectable)


def _reasons(b: _Builder, mask: int | None, lbl: list[str]) -> None:
    fam = b.gauge("nvidia_gpu_clocks_event_reason",
                  "1 while this clocks event (throttle) reason is active, decoded from "
                  "nvmlDeviceGetCurrentClocksEventReasons", ("reason",))
    if mask is None:
        return
    for bit, name in CLOCKS_EVENT_REASONS:
        fam.add_metric([*lbl, name], 1.0 if mask & bit else 0.0)


def _nvlinks(b: _Builder, h: DeviceHealth, lbl: list[str]) -> None:
    up = b.gauge("nvidia_gpu_nvlink_up", "1 while the NVLink is active (nvmlDeviceGetNvLinkState)", ("link",))
    tx = b.counter("nvidia_gpu_nvlink_transmit_bytes",
                   "Data bytes sent over the NVLink since the driver loaded "
                   "(nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)", ("link",))
    rx = b.counter("nvidia_gpu_nvlink_receive_bytes",
                   "Data bytes received over the NVLink since the driver loaded "
                   "(nvmlDeviceGetFieldValues NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)", ("link",))
    errors = b.counter("nvidia_gpu_nvlink_errors",
                       "NVLink data-link errors since the driver loaded, by type (nvmlDeviceGetNvLinkErrorCounter)",
                       ("link", "type"))
    for link in h.nvlinks:
        at = [*lbl, str(link.link)]
        _put(up, at, None if link.active is None else int(link.active))
        _put(tx, at, link.tx_bytes)
        _put(rx, at, link.rx_bytes)
        for kind, attr in _NVLINK_ERRORS:
            _put(errors, [*at, kind], getattr(link, attr))


def _gpm(b: _Builder, h: DeviceHealth, lbl: list[str]) -> None:
    for f in GPM_FIELDS:
        fam = b.gauge(f.family, f.help)
        if h.gpm is not None and (v := getattr(h.gpm, f.attr.removeprefix("gpm."))) is not None:
            fam.add_metric(lbl, native(f, v))
