"""GPU / Node, its hardware-health rows: memory repair and PCIe, then clocks, power, NVLink and energy.

Every value here is the card's (docs/metrics.md, "Health"): a MIG device repeats its card's, so
each panel shows one series per physical GPU (:func:`per_card`), named ``GPU <minor number>``.
NVLink rows are the card's own: a MIG card's are on its GPU uuid, not on a MIG device (:func:`_links`).
A family the driver does not report (NotSupported: no row remapping before Ampere, no NVLink on
a PCIe card) has no series, and the panel says so instead of showing zeros. The alerts on the
same signals are docs/alerts.md's KubeGpuRowRemapPending to KubeGpuNvlinkErrors.
"""

from __future__ import annotations

from exporter.bundle.dashboards.panels import RED_FROM_ONE, Column, Panel, Stat, Table, Target, TimeSeries
from exporter.bundle.dashboards.promql import Selectors

CARD_LEGEND = "GPU {{minor_number}}"
NO_REMAP = "no GPU here reports row remapping (Ampere and newer do)"
NO_RETIREMENT = "no GPU here reports page retirement (pre-Ampere data-centre GPUs do)"
NO_NVLINK = "no GPU here has NVLink"
NO_PCIE = "no GPU here reports its PCIe link"


def per_card(q: Selectors, inner: str, *labels: str) -> str:
    """``inner`` (series by node, uuid, minor_number and ``labels``) once per physical GPU.

    Like :meth:`Selectors.per_card`, for an inner expression (a rate, a sum over links): the
    devices of a MIG card carry the card's value, their maximum is that value.
    """
    return (
        f"max {q.by(q.node, 'card', 'minor_number', *labels)} (\n"
        f"  {inner}\n"
        f"  * {q.on(*q.device)} group_left (card) {q.cards(q.this_node)}\n"
        ")"
    )


def _device(q: Selectors, expr: str, *labels: str, agg: str = "max") -> str:
    """``expr`` by device (a device scraped twice counted once) and ``labels``."""
    return f"{agg} {q.by(*q.device, 'minor_number', *labels)} ({expr})"


def _sel(q: Selectors, series: str, *matchers: str) -> str:
    return f"{series}{q.s(q.this_node, q.these_gpus, *matchers)}"


def _card_of(q: Selectors, series: str, *matchers: str) -> str:
    """A card gauge (one row per device) per physical GPU."""
    return per_card(q, _device(q, _sel(q, series, *matchers)))


def _rate(q: Selectors, series: str, *matchers: str) -> str:
    return f"rate({_sel(q, series, *matchers)}[$__rate_interval])"


def _link_sel(q: Selectors, series: str) -> str:
    """An NVLink series of the node; the GPUs are picked by :func:`_links` (its uuid is a card's)."""
    return f"{series}{q.s(q.this_node)}"


def _link_rate(q: Selectors, series: str) -> str:
    return f"rate({_link_sel(q, series)}[$__rate_interval])"


def _links(q: Selectors, expr: str, *labels: str, agg: str = "sum") -> str:
    """A per-link ``expr`` summed (or counted) over each card's links, for the cards of the chosen GPUs.

    The exporter puts NVLink rows on the card (a MIG card's on its GPU uuid, which is no device of
    ``$gpu``): each row's uuid is its card, kept when the card or one of its MIG devices is chosen.
    """
    per_card_uuid = _device(q, _device(q, expr, "link", *labels), *labels, agg=agg)
    return (
        f"max {q.by(q.node, 'card', 'minor_number', *labels)} (\n"
        f'  label_replace({per_card_uuid}, "card", "$1", "uuid", "(.+)")\n'
        f"  and {q.on(q.node, 'card')} {q.cards(q.this_node, q.these_gpus)}\n"
        ")"
    )


def memory_and_pcie(q: Selectors) -> list[Panel]:
    """Row remapping and page retirement (reset or replace the GPU), the PCIe link."""

    def flag_count(title: str, series: str, description: str, no_value: str) -> Stat:
        return Stat(title, description, "short", [Target(f"sum({_card_of(q, series)})")],
                    steps=RED_FROM_ONE, no_value=no_value, w=4, h=8)  # fmt: skip

    def column(series: str, header: str, *matchers: str, unit: str = "short") -> Column:
        return Column(_card_of(q, series, *matchers), header, unit)

    return [
        flag_count(
            "Row remap pending",
            "nvidia_gpu_remapped_rows_pending",
            "GPUs with a memory row remap waiting for a GPU reset (KubeGpuRowRemapPending): drain and reset them.",
            NO_REMAP,
        ),
        flag_count(
            "Row remap failed",
            "nvidia_gpu_remapped_rows_failure",
            "GPUs that failed to remap a row, NVIDIA's RMA criterion (KubeGpuRowRemapFailure): replace them.",
            NO_REMAP,
        ),
        flag_count(
            "Page retirement pending",
            "nvidia_gpu_retired_pages_pending",
            "GPUs with memory pages waiting for a GPU reset to be retired (KubeGpuPageRetirementPending).",
            NO_RETIREMENT,
        ),
        TimeSeries(
            "PCIe replays per GPU",
            "PCIe packets each GPU had to resend (nvidia_gpu_pcie_replays_total), per second; a steady rate "
            "means a degraded link (KubeGpuPcieReplaysHigh: over 8 a minute).",
            "cps",
            [Target(per_card(q, _device(q, _rate(q, "nvidia_gpu_pcie_replays_total"))), CARD_LEGEND)],
            no_value=NO_PCIE,
            w=6,
            h=8,
        ),
        TimeSeries(
            "PCIe throughput per GPU",
            "PCIe transmit and receive throughput of each GPU (nvmlDeviceGetPcieThroughput).",
            "Bps",
            [
                Target(_card_of(q, "nvidia_gpu_pcie_transmit_bytes_per_second"), f"{CARD_LEGEND} TX"),
                Target(_card_of(q, "nvidia_gpu_pcie_receive_bytes_per_second"), f"{CARD_LEGEND} RX"),
            ],
            no_value=NO_PCIE,
            w=6,
            h=8,
        ),
        Table(
            "Memory repair and PCIe link per GPU",
            "Per physical GPU: rows remapped and pages retired since manufacture (kept in the InfoROM), "
            "whether a remap or retirement waits for a reset, whether a remap failed, and the PCIe link "
            "it trained to with the replays it counted. An empty cell: the GPU does not report it.",
            q.labels(("minor_number", "GPU"), ("card", "UUID"), (q.node, "Node")),
            [
                column("nvidia_gpu_remapped_rows", "Rows remapped (correctable)", 'type="correctable"'),
                column("nvidia_gpu_remapped_rows", "Rows remapped (uncorrectable)", 'type="uncorrectable"'),
                column("nvidia_gpu_remapped_rows_pending", "Remap pending"),
                column("nvidia_gpu_remapped_rows_failure", "Remap failed"),
                column("nvidia_gpu_retired_pages", "Retired pages (single-bit)", 'cause="single_bit_ecc"'),
                column("nvidia_gpu_retired_pages", "Retired pages (double-bit)", 'cause="double_bit_ecc"'),
                column("nvidia_gpu_retired_pages_pending", "Retirement pending"),
                column("nvidia_gpu_pcie_link_generation", "PCIe generation", unit="none"),
                column("nvidia_gpu_pcie_link_width", "PCIe width", unit="none"),
                column("nvidia_gpu_pcie_replays_total", "PCIe replays"),
            ],
            no_value="no GPU here reports memory repair or its PCIe link",
            w=24,
            h=8,
        ),
    ]


def clocks_power_nvlink(q: Selectors) -> list[Panel]:
    """Clock event (throttle) reasons, power against its limit, NVLink errors and traffic, energy."""
    return [*_clocks_and_power(q), *_nvlink_and_energy(q)]


def _clocks_and_power(q: Selectors) -> list[Panel]:
    reasons = _device(q, _sel(q, "nvidia_gpu_clocks_event_reason", 'reason!="gpu_idle"'), "reason")
    return [
        TimeSeries(
            "Clock event reasons",
            "Why each GPU runs below its maximum clocks, 1 while a reason is active "
            "(nvidia_gpu_clocks_event_reason; idle left out): sw_power_cap at the power limit, thermal "
            "slowdowns (KubeGpuThermalThrottling), hw_slowdown and the power brake (KubeGpuHardwareSlowdown).",
            "short",
            [Target(f"{per_card(q, reasons, 'reason')} > 0", f"{CARD_LEGEND} {{{{reason}}}}")],
            maximum=1,
            no_value="no clock event: every GPU may run at full clocks",
            w=12,
            h=8,
        ),
        TimeSeries(
            "Power / limit per GPU",
            "Power draw of each GPU as a share of its enforced power limit (nvidia_gpu_power_limit_watts); "
            "near 100 % the GPU lowers its clocks to stay under it (sw_power_cap).",
            "percent",
            [
                Target(
                    f"{_card_of(q, 'nvidia_gpu_power_usage_milliwatts')}\n"
                    f"/ {_card_of(q, 'nvidia_gpu_power_limit_watts')} / 10",  # mW / (W * 1000) * 100
                    CARD_LEGEND,
                )
            ],
            maximum=100,
            no_value="no GPU here reports its power limit",
            w=12,
            h=8,
        ),
    ]


def _nvlink_and_energy(q: Selectors) -> list[Panel]:
    errors = _link_rate(q, "nvidia_gpu_nvlink_errors_total")
    up = _link_sel(q, "nvidia_gpu_nvlink_up")
    return [
        Stat(
            "NVLinks up",
            "Active NVLinks of the node's GPUs (nvidia_gpu_nvlink_up) and the links they have; a link "
            "down on an NVLink board is a fabric fault.",
            "short",
            [Target(f"sum({_links(q, up)})", "up"), Target(f"sum({_links(q, up, agg='count')})", "links")],
            no_value=NO_NVLINK,
            w=4,
            h=8,
        ),
        TimeSeries(
            "NVLink errors per GPU",
            "NVLink CRC, replay and recovery errors per second, summed over each GPU's links "
            "(nvidia_gpu_nvlink_errors_total); KubeGpuNvlinkErrors fires on any replay or recovery error "
            "and on CRC errors over 100/s.",
            "cps",
            [Target(_links(q, errors, "type"), f"{CARD_LEGEND} {{{{type}}}}")],
            no_value=NO_NVLINK,
            w=10,
            h=8,
        ),
        TimeSeries(
            "NVLink throughput per GPU",
            "Data sent and received over each GPU's NVLinks, summed over its links.",
            "Bps",
            [
                Target(_links(q, _link_rate(q, "nvidia_gpu_nvlink_transmit_bytes_total")), f"{CARD_LEGEND} TX"),
                Target(_links(q, _link_rate(q, "nvidia_gpu_nvlink_receive_bytes_total")), f"{CARD_LEGEND} RX"),
            ],
            no_value=NO_NVLINK,
            w=10,
            h=8,
        ),
        TimeSeries(
            "Energy use per GPU",
            "Energy each GPU consumed per second (rate of nvidia_gpu_energy_consumption_joules_total): its "
            "mean power over the interval, where the power panel shows one reading per scrape.",
            "watt",
            [Target(per_card(q, _device(q, _rate(q, "nvidia_gpu_energy_consumption_joules_total"))), CARD_LEGEND)],
            no_value="no GPU here reports its energy (Volta and newer do)",
            w=18,
            h=8,
        ),
        Stat(
            "Energy since driver load",
            "Energy the node's GPUs consumed since their driver loaded (nvmlDeviceGetTotalEnergyConsumption).",
            "joule",
            [Target(f"sum({_card_of(q, 'nvidia_gpu_energy_consumption_joules_total')})")],
            no_value="no GPU here reports its energy (Volta and newer do)",
            w=6,
            h=8,
        ),
    ]
