"""GPU / Node: one node's GPUs, their device values and allocation, and what only this exporter knows.

The seed's node view per GPU, plus the exporter's rows by ``allocate_mode``, each container's
share of a shared GPU, the cards' hardware health (:mod:`.node_hardware`), Xid errors, GPU
processes no container was allocated and the exporter's own health (:mod:`.node_health`).
Variables: ``node`` (one) and ``gpu`` (device uuids: several, or All).

A MIG device is a device of its own with its card's minor number, power and temperature: device
values (memory, duty cycle) are shown per device and named by :meth:`Selectors.gpu_names`, card
values (power, temperature) once per physical GPU (:meth:`Selectors.per_card`).
"""

from __future__ import annotations

from exporter.bundle.dashboards.board import Board, QueryVariable, Row
from exporter.bundle.dashboards.node_hardware import clocks_power_nvlink, memory_and_pcie
from exporter.bundle.dashboards.node_health import errors, exporter_health
from exporter.bundle.dashboards.panels import (
    GREEN,
    BarGauge,
    Column,
    Gauge,
    Panel,
    Stat,
    Table,
    Target,
    TimeSeries,
)
from exporter.bundle.dashboards.promql import DEVICE_ROWS, SHARE_ROWS, Selectors

GPU_LEGEND = "GPU {{gpu}}"  # a device: its minor number, or <minor>/<profile> GI <n> for a MIG device
CARD_LEGEND = "GPU {{minor_number}}"  # a physical GPU
NO_SHARED = "no shared GPU on this node"
NO_UTILIZATION = "no utilization: MIG devices report none"


def board(q: Selectors) -> Board:
    """The node view."""
    return Board(
        title="Node",
        description="One node's GPUs: duty cycle, memory, power, temperature, allocation per card, the "
        "exporter's rows by allocate_mode, per-container usage on shared GPUs, hardware health (memory repair, "
        "PCIe, clock events, power limit, NVLink, energy), Xid errors, the exporter's health.",
        variables=(
            QueryVariable("node", "Node", f"label_values(kube_node_status_capacity_gpu{q.s()}, {q.node})"),
            QueryVariable("gpu", "GPU", f"label_values(nvidia_gpu_info{q.s(q.this_node)}, uuid)", multi=True),
        ),
        rows=(
            Row("Node", [*_node_stats(q), *_node_gauges(q)]),
            Row("Per GPU", _per_gpu(q)),
            Row("Allocation", _allocation(q)),
            Row("Shared GPUs: per-container share", _shared(q)),
            Row("Hardware health: memory repair and PCIe", memory_and_pcie(q)),
            Row("Hardware health: clocks, power, NVLink and energy", clocks_power_nvlink(q)),
            Row("Errors and unaccounted processes", errors(q)),
            Row("Exporter health", exporter_health(q)),
        ),
    )


def _node_stats(q: Selectors) -> list[Panel]:
    s, n, g = q.s, q.this_node, q.these_gpus
    return [
        Stat(
            "GPUs",
            "Devices Kubernetes hands out (whole GPUs and MIG devices), the healthy (not lost) ones, and the "
            "physical GPUs they are on.",
            "short",
            [
                Target(f"max(nvidia_gpu_num_devices{s(n)})", "devices"),
                Target(f"max(nvidia_gpu_node_healthy_devices{s(n)})", "healthy"),
                Target(q.card_count(where=(n,)), "physical"),
            ],
            w=4,
            h=5,
        ),
        Stat(
            "GPUs allocated",
            "Devices with at least one allocation (a MIG device counts as one).",
            "short",
            [Target(f"max(k8s_node_gpu_allocated_devices{s(n)})")],
            w=3,
            h=5,
        ),
        Stat(
            "Compute allocated",
            "Compute allocated on the node, in GPUs (a MIG device counts as one).",
            "short",
            [Target(f"max(k8s_node_gpu_allocated_compute{s(n)}) / 100")],
            decimals=2,
            w=3,
            h=5,
        ),
        Stat(
            "Average temperature",
            "Mean temperature of the selected GPUs, each physical GPU once (MIG devices report their card's).",
            "celsius",
            [Target(f"avg({q.per_card('nvidia_gpu_temperature_celsius', n, g, cards=(n,))})")],
            steps=((None, "green"), (80, "orange"), (85, "red")),
            no_value="no GPU reports its temperature",
            w=3,
            h=5,
        ),
        Stat(
            "Total power",
            "Power drawn by the selected GPUs, each physical GPU once (MIG devices repeat their card's power).",
            "mwatt",
            [Target(f"sum({q.per_card('nvidia_gpu_power_usage_milliwatts', n, g, cards=(n,))})")],
            no_value="no GPU reports its power",
            w=3,
            h=5,
        ),
        Stat(
            "Without utilization",
            "Devices NVML reports no utilization for: MIG devices. GPU used and the duty cycles leave them "
            "out, so with any here they describe the other GPUs only.",
            "short",
            [Target(q.without_utilization(where=(n,)))],
            steps=((None, "green"), (1, "orange")),
            w=2,
            h=5,
        ),
    ]


def _node_gauges(q: Selectors) -> list[Panel]:
    s, n = q.s, q.this_node
    return [
        # usage is not a warning sign, unlike allocation near full: no orange or red
        Gauge(
            "GPU used",
            "Mean duty cycle of the node's GPUs that report one. MIG devices report none and are left out "
            "(see Without utilization), not counted as idle.",
            [Target(f"avg({q.utilization(n)})")],
            steps=GREEN,
            no_value=NO_UTILIZATION,
            w=2,
            h=5,
        ),
        Gauge(
            "Memory used",
            "GPU memory in use / the node's GPU memory (k8s_node_rate_gpu_memory_used).",
            [Target(f"max(k8s_node_rate_gpu_memory_used{s(n)})")],
            w=2,
            h=5,
        ),
        Gauge(
            "Memory allocated",
            "GPU memory allocated / the node's GPU memory (k8s_node_rate_gpu_memory_allocated).",
            [Target(f"max(k8s_node_rate_gpu_memory_allocated{s(n)})")],
            w=2,
            h=5,
        ),
    ]


def _per_gpu(q: Selectors) -> list[Panel]:
    n, g = q.this_node, q.these_gpus

    def per_device(series: str, *matchers: str) -> list[Target]:
        return [Target(q.per_device(series, n, g, *matchers, names=(n,)), GPU_LEGEND)]

    def per_card(series: str) -> list[Target]:
        return [Target(q.per_card(series, n, g, cards=(n,)), CARD_LEGEND)]

    return [
        TimeSeries(
            "Duty cycle per GPU",
            "Device utilisation (nvmlDeviceGetUtilizationRates().gpu) of each GPU; MIG devices have none.",
            "percent",
            per_device("nvidia_gpu_duty_cycle", DEVICE_ROWS),  # a share row's duty cycle is its container's
            maximum=100,
            no_value=NO_UTILIZATION,
            w=12,
            h=8,
        ),
        TimeSeries(
            "Memory used per GPU",
            "Device memory in use on each GPU and MIG device.",
            "bytes",
            per_device("nvidia_gpu_memory_used_bytes", DEVICE_ROWS),
            w=12,
            h=8,
        ),
        TimeSeries(
            "Power per GPU",
            "Power draw of each physical GPU (a MIG card's power is shared by its MIG devices).",
            "mwatt",
            per_card("nvidia_gpu_power_usage_milliwatts"),
            no_value="no GPU reports its power",
            w=8,
            h=8,
        ),
        TimeSeries(
            "Temperature per GPU",
            "Temperature of each physical GPU.",
            "celsius",
            per_card("nvidia_gpu_temperature_celsius"),
            no_value="no GPU reports its temperature",
            w=8,
            h=8,
        ),
        TimeSeries(
            "Memory controller busy per GPU",
            "Share of time device memory was read or written (nvmlDeviceGetUtilizationRates().memory); "
            "MIG devices have none.",
            "percent",
            per_device("nvidia_gpu_memory_utilization"),
            maximum=100,
            no_value=NO_UTILIZATION,
            w=8,
            h=8,
        ),
    ]


def _allocation(q: Selectors) -> list[Panel]:
    s, n, g = q.s, q.this_node, q.these_gpus
    row = q.by(*q.device, "allocate_mode", q.ns, q.pod, q.ctr)

    def rows_of(series: str) -> str:  # every row of the selected GPUs, a row scraped twice once
        return f"max {row} ({series}{s(n, g)})"

    def rows(series: str) -> str:
        return q.named(rows_of(series), n)

    return [
        BarGauge(
            "Compute allocated per GPU",
            "Compute allocated on each GPU, % of one GPU (k8s_card_gpu_allocated_compute; 100 = the whole card).",
            "percent",
            [Target(q.named(f"max {q.by(*q.device)} (k8s_card_gpu_allocated_compute{s(n, g)})", n), GPU_LEGEND)],
            maximum=100,
            w=8,
            h=8,
        ),
        BarGauge(
            "Memory allocated per GPU",
            "Memory allocated on each GPU / its memory (k8s_card_rate_gpu_memory_allocated).",
            "percent",
            [Target(q.named(f"max {q.by(*q.device)} (k8s_card_rate_gpu_memory_allocated{s(n, g)})", n), GPU_LEGEND)],
            maximum=100,
            w=8,
            h=8,
        ),
        BarGauge(
            "Rows by allocate_mode",
            "The exporter's rows per allocate_mode: exclusive (one container "
            "holds the GPU), share (one row per container on a shared GPU), None (device totals of a "
            "shared or unheld GPU).",
            "short",
            [Target(f"count by (allocate_mode) ({rows_of('nvidia_gpu_memory_total_bytes')})", "{{allocate_mode}}")],
            w=8,
            h=8,
        ),
        Table(
            "GPU rows",
            "Every row the exporter reports for the selected GPUs: exclusive and share rows carry "
            "the container; share rows its own processes' SM utilisation and memory.",
            q.labels(
                (q.node, "Node"),
                ("gpu", "GPU"),
                ("allocate_mode", "allocate_mode"),
                (q.ns, "Namespace"),
                (q.pod, "Pod"),
                (q.ctr, "Container"),
                ("uuid", "UUID"),
            ),
            [
                Column(rows("nvidia_gpu_duty_cycle"), "Duty cycle", "percent"),
                Column(rows("nvidia_gpu_memory_used_bytes"), "Memory used", "bytes"),
                Column(rows("nvidia_gpu_memory_total_bytes"), "Memory total", "bytes"),
            ],
            w=24,
            h=8,
        ),
    ]


def _shared(q: Selectors) -> list[Panel]:
    s, n, g = q.s, q.this_node, q.these_gpus
    who = f"{GPU_LEGEND} {q.legend(q.ns, q.pod, q.ctr)}"
    share = q.by(*q.device, q.ns, q.pod, q.ctr)

    def per_container(series: str, *matchers: str) -> str:
        return f"max {share} ({series}{s(n, g, *matchers)})"

    return [
        TimeSeries(
            "SM utilisation per container",
            "On shared GPUs: each container's processes' SM utilisation (allocate_mode=\"share\" rows).",
            "percent",
            [Target(q.named(per_container("nvidia_gpu_duty_cycle", SHARE_ROWS), n), who)],
            maximum=100,
            no_value=NO_SHARED,
            w=8,
            h=8,
        ),
        TimeSeries(
            "Memory used per container",
            "On shared GPUs: memory used by each container's processes.",
            "bytes",
            [Target(q.named(per_container("nvidia_gpu_memory_used_bytes", SHARE_ROWS), n), who)],
            no_value=NO_SHARED,
            w=8,
            h=8,
        ),
        BarGauge(
            "Memory used / granted per container",
            "On shared GPUs: memory used / memory the scheme "
            "granted (nvidia_gpu_gpu_sharing_memory). Over 100 % the container eats into its "
            "neighbours' memory.",
            "percent",
            [
                Target(
                    # "> 0": no ratio for a container the scheme granted no memory limit
                    q.named(
                        f"{per_container('nvidia_gpu_memory_used_bytes', SHARE_ROWS)} * 100\n"
                        f"/ ({per_container('nvidia_gpu_gpu_sharing_memory')} > 0)",
                        n,
                    ),
                    who,
                )
            ],
            maximum=100,
            no_value="no shared GPU with a memory grant on this node",
            w=8,
            h=8,
        ),
        Table(
            "Compute allocated per pod and GPU",
            "k8s_pod_gpu_allocated_compute: compute allocated to each pod on each GPU, % of one GPU.",
            q.labels((q.ns, "Namespace"), (q.pod, "Pod"), ("gpu", "GPU"), ("uuid", "UUID"), (q.node, "Node")),
            [
                Column(
                    q.allocated_per_device("k8s_pod_gpu_allocated_compute", q.ns, q.pod, where=(n,), names=(n,)),
                    "Compute allocated",
                    "percent",
                ),
            ],
            no_value="no compute allocated to a pod on this node",
            w=24,
            h=7,
        ),
    ]
