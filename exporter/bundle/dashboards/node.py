"""GPU / Node: one node's GPUs, their device values and allocation, and what only this exporter knows.

The seed's node view per GPU, plus the exporter's rows by ``allocate_mode``, each container's
share of a shared GPU, Xid errors and GPU processes no container was allocated. Variables:
``node`` (one) and ``gpu`` (several, or All).
"""

from __future__ import annotations

from exporter.bundle.dashboards.board import Board, QueryVariable, Row
from exporter.bundle.dashboards.panels import (
    GREEN,
    RED_FROM_ONE,
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

GPU_LEGEND = "GPU {{minor_number}}"


def board(q: Selectors) -> Board:
    """The node view."""
    return Board(
        title="Node",
        description="One node's GPUs: duty cycle, memory, power, temperature, allocation per card, the "
        "exporter's rows by allocate_mode, per-container usage on shared GPUs, Xid errors.",
        variables=(
            QueryVariable("node", "Node", f"label_values(kube_node_status_capacity_gpu{q.s()}, {q.node})"),
            QueryVariable("gpu", "GPU", f"label_values(nvidia_gpu_info{q.s(q.this_node)}, minor_number)", multi=True),
        ),
        rows=(
            Row("Node", [*_node_stats(q), *_node_gauges(q)]),
            Row("Per GPU", _per_gpu(q)),
            Row("Allocation", _allocation(q)),
            Row("Shared GPUs: per-container share", _shared(q)),
            Row("Errors and unaccounted processes", _errors(q)),
        ),
    )


def _per_gpu_query(q: Selectors, series: str, *matchers: str) -> str:
    # one series per selected GPU of the node, a GPU scraped twice counted once
    return f"max {q.by(q.node, 'uuid', 'minor_number')} ({series}{q.s(q.this_node, q.these_gpus, *matchers)})"


def _node_stats(q: Selectors) -> list[Panel]:
    s, n = q.s, q.this_node
    return [
        Stat(
            "GPUs",
            "GPUs on the node, and the healthy (not lost) ones.",
            "short",
            [
                Target(f"max(nvidia_gpu_num_devices{s(n)})", "all"),
                Target(f"max(nvidia_gpu_node_healthy_devices{s(n)})", "healthy"),
            ],
            w=4,
            h=5,
        ),
        Stat(
            "GPUs allocated",
            "GPUs with at least one allocation.",
            "short",
            [Target(f"k8s_node_gpu_allocated_devices{s(n)}")],
            w=3,
            h=5,
        ),
        Stat(
            "Compute allocated",
            "Compute allocated on the node, in GPUs.",
            "short",
            [Target(f"k8s_node_gpu_allocated_compute{s(n)} / 100")],
            decimals=2,
            w=3,
            h=5,
        ),
        Stat(
            "Average temperature",
            "Mean temperature of the selected GPUs.",
            "celsius",
            [Target(f"avg({_per_gpu_query(q, 'nvidia_gpu_temperature_celsius')})")],
            steps=((None, "green"), (80, "orange"), (85, "red")),
            w=4,
            h=5,
        ),
        Stat(
            "Total power",
            "Power drawn by the selected GPUs.",
            "mwatt",
            [Target(f"sum({_per_gpu_query(q, 'nvidia_gpu_power_usage_milliwatts')})")],
            w=4,
            h=5,
        ),
    ]


def _node_gauges(q: Selectors) -> list[Panel]:
    s, n = q.s, q.this_node
    return [
        # usage is not a warning sign, unlike allocation near full: no orange or red
        Gauge(
            "GPU used",
            "Device duty cycle / node capacity (k8s_node_rate_gpu_used).",
            [Target(f"k8s_node_rate_gpu_used{s(n)}")],
            steps=GREEN,
            w=2,
            h=5,
        ),
        Gauge(
            "Memory used",
            "GPU memory in use / the node's GPU memory (k8s_node_rate_gpu_memory_used).",
            [Target(f"k8s_node_rate_gpu_memory_used{s(n)}")],
            w=2,
            h=5,
        ),
        Gauge(
            "Memory allocated",
            "GPU memory allocated / the node's GPU memory (k8s_node_rate_gpu_memory_allocated).",
            [Target(f"k8s_node_rate_gpu_memory_allocated{s(n)}")],
            w=2,
            h=5,
        ),
    ]


def _per_gpu(q: Selectors) -> list[Panel]:
    def per_gpu(series: str, *matchers: str) -> list[Target]:
        return [Target(_per_gpu_query(q, series, *matchers), GPU_LEGEND)]

    return [
        TimeSeries(
            "Duty cycle per GPU",
            "Device utilisation (nvmlDeviceGetUtilizationRates().gpu) of each GPU.",
            "percent",
            per_gpu("nvidia_gpu_duty_cycle", DEVICE_ROWS),  # a share row's duty cycle is its container's
            maximum=100,
            w=12,
            h=8,
        ),
        TimeSeries(
            "Memory used per GPU",
            "Device memory in use on each GPU.",
            "bytes",
            per_gpu("nvidia_gpu_memory_used_bytes", DEVICE_ROWS),
            w=12,
            h=8,
        ),
        TimeSeries(
            "Power per GPU",
            "Power draw of each GPU.",
            "mwatt",
            per_gpu("nvidia_gpu_power_usage_milliwatts"),
            w=8,
            h=8,
        ),
        TimeSeries(
            "Temperature per GPU",
            "Temperature of each GPU.",
            "celsius",
            per_gpu("nvidia_gpu_temperature_celsius"),
            w=8,
            h=8,
        ),
        TimeSeries(
            "Memory controller busy per GPU",
            "Share of time device memory was read or written (nvmlDeviceGetUtilizationRates().memory).",
            "percent",
            per_gpu("nvidia_gpu_memory_utilization"),
            maximum=100,
            w=8,
            h=8,
        ),
    ]


def _allocation(q: Selectors) -> list[Panel]:
    s, n, g = q.s, q.this_node, q.these_gpus
    row = q.by(q.node, "minor_number", "allocate_mode", q.ns, q.pod, q.ctr)
    return [
        BarGauge(
            "Compute allocated per GPU",
            "Compute allocated on each GPU, % of one GPU (k8s_card_gpu_allocated_compute; 100 = the whole card).",
            "percent",
            [Target(f"k8s_card_gpu_allocated_compute{s(n, g)}", GPU_LEGEND)],
            maximum=100,
            w=8,
            h=8,
        ),
        BarGauge(
            "Memory allocated per GPU",
            "Memory allocated on each GPU / its memory (k8s_card_rate_gpu_memory_allocated).",
            "percent",
            [Target(f"k8s_card_rate_gpu_memory_allocated{s(n, g)}", GPU_LEGEND)],
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
            [Target(f"count by (allocate_mode) (nvidia_gpu_memory_total_bytes{s(n, g)})", "{{allocate_mode}}")],
            w=8,
            h=8,
        ),
        Table(
            "GPU rows",
            "Every row the exporter reports for the selected GPUs: exclusive and share rows carry "
            "the container; share rows its own processes' SM utilisation and memory.",
            q.labels(
                (q.node, "Node"),
                ("minor_number", "GPU"),
                ("allocate_mode", "allocate_mode"),
                (q.ns, "Namespace"),
                (q.pod, "Pod"),
                (q.ctr, "Container"),
            ),
            [
                Column(f"max {row} (nvidia_gpu_duty_cycle{s(n, g)})", "Duty cycle", "percent"),
                Column(f"max {row} (nvidia_gpu_memory_used_bytes{s(n, g)})", "Memory used", "bytes"),
                Column(f"max {row} (nvidia_gpu_memory_total_bytes{s(n, g)})", "Memory total", "bytes"),
            ],
            w=24,
            h=8,
        ),
    ]


def _shared(q: Selectors) -> list[Panel]:
    s, n, g = q.s, q.this_node, q.these_gpus
    who = f"{GPU_LEGEND} {q.legend(q.ns, q.pod, q.ctr)}"
    share = q.by(q.node, "minor_number", q.ns, q.pod, q.ctr)
    return [
        TimeSeries(
            "SM utilisation per container",
            "On shared GPUs: each container's processes' SM utilisation (allocate_mode=\"share\" rows).",
            "percent",
            [Target(f"nvidia_gpu_duty_cycle{s(n, g, SHARE_ROWS)}", who)],
            maximum=100,
            w=8,
            h=8,
        ),
        TimeSeries(
            "Memory used per container",
            "On shared GPUs: memory used by each container's processes.",
            "bytes",
            [Target(f"nvidia_gpu_memory_used_bytes{s(n, g, SHARE_ROWS)}", who)],
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
                    f"max {share} (nvidia_gpu_memory_used_bytes{s(n, g, SHARE_ROWS)}) * 100\n"
                    f"/ (max {share} (nvidia_gpu_gpu_sharing_memory{s(n, g)}) > 0)",
                    who,
                )
            ],
            maximum=100,
            w=8,
            h=8,
        ),
        Table(
            "Compute allocated per pod and GPU",
            "k8s_pod_gpu_allocated_compute: compute allocated to each pod on each GPU, % of one GPU.",
            q.labels((q.ns, "Namespace"), (q.pod, "Pod"), ("minor_number", "GPU"), ("uuid", "UUID")),
            [
                Column(
                    f"max {q.by(q.ns, q.pod, 'minor_number', 'uuid')} (k8s_pod_gpu_allocated_compute{s(n)})",
                    "Compute allocated",
                    "percent",
                ),
            ],
            w=24,
            h=7,
        ),
    ]


def _errors(q: Selectors) -> list[Panel]:
    s, n = q.s, q.this_node
    xid = q.by("minor_number", "xid", q.ns, q.pod, q.ctr)
    process = q.by("minor_number", "pid", q.ns, q.pod, q.ctr)
    new_xids = f"increase(nvidia_gpu_xid_errors_total{s(n)}[$__rate_interval])"
    return [
        Table(
            "Xid errors",
            "Xid errors the driver reported since the exporter started, by GPU, code and the pod "
            "of the faulting process (docs/xid.md has the catalog).",
            q.labels(
                ("minor_number", "GPU"), ("xid", "Xid"), (q.ns, "Namespace"), (q.pod, "Pod"), (q.ctr, "Container")
            ),
            [Column(f"sum {xid} (nvidia_gpu_xid_errors_total{s(n)})", "Errors", "short")],
            w=10,
            h=8,
        ),
        TimeSeries(
            "Xid errors over time",
            "New Xid errors per GPU and code.",
            "short",
            [
                Target(
                    f"sum {q.by('minor_number', 'xid')} ({new_xids})",
                    "GPU {{minor_number}} Xid {{xid}}",
                )
            ],
            w=8,
            h=8,
        ),
        Stat(
            "Last Xid",
            "When the exporter read the node's latest Xid.",
            "dateTimeFromNow",
            [Target(f"max(nvidia_gpu_last_xid_timestamp_seconds{s(n)}) * 1000")],  # Grafana wants milliseconds
            w=3,
            h=4,
        ),
        Stat(
            "GPUs lost",
            "GPUs NVML reports lost (GPU_IS_LOST).",
            "short",
            [Target(f"sum(1 - nvidia_gpu_up{s(n)})")],
            steps=RED_FROM_ONE,
            w=3,
            h=4,
        ),
        Table(
            "Unaccounted GPU processes",
            "Processes using a GPU that no container was allocated: host "
            "processes (empty pod) or pods that see every GPU.",
            q.labels(
                ("minor_number", "GPU"), ("pid", "PID"), (q.ns, "Namespace"), (q.pod, "Pod"), (q.ctr, "Container")
            ),
            [
                Column(
                    f"max {process} (nvidia_gpu_unaccounted_process_memory_used_bytes{s(n)})", "Memory used", "bytes"
                ),
                Column(f"max {process} (nvidia_gpu_unaccounted_process_duty_cycle{s(n)})", "SM utilisation", "percent"),
            ],
            w=24,
            h=7,
        ),
    ]
