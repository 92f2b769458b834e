"""GPU / Cluster overview: capacity, allocation and usage of the cluster, by namespace, workload and node.

No variables besides ``datasource`` (and ``cluster``). Usage, requests and allocations are in
GPUs: the recorded "% of one GPU" divided by 100. A MIG device counts as a GPU where Kubernetes
hands it out (capacity, allocation); NVML gives it no utilization, so the utilization ratios
here are over the GPUs that report one (``Without utilization`` counts the others).
"""

from __future__ import annotations

from exporter.bundle.dashboards.board import Board, Row
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
from exporter.bundle.dashboards.promql import Selectors


def board(q: Selectors) -> Board:
    """The cluster overview."""
    return Board(
        title="Cluster overview",
        description="GPU capacity, allocation and usage of the cluster, by namespace, workload and node.",
        variables=(),
        rows=(
            Row("Capacity and allocation", [*_capacity_stats(q), *_capacity_gauges(q)]),
            Row("Over time", _over_time(q)),
            Row("By namespace", _by_namespace(q)),
            Row("By workload", _by_workload(q)),
            Row("Nodes", _nodes(q)),
        ),
    )


def _capacity_stats(q: Selectors) -> list[Panel]:
    s = q.s
    return [
        Stat(
            "GPUs",
            "Devices in the cluster (whole GPUs and MIG devices: nvidia_gpu_num_devices), the healthy ones, "
            "which the cluster ratios divide by, and the physical GPUs they are on.",
            "short",
            [
                Target(f"sum(kube_node_status_capacity_gpu{s()}) / 100", "devices"),
                Target(f"k8s_cluster_gpu_total{s()} / 100", "healthy"),
                Target(q.card_count(), "physical"),
            ],
            w=4,
            h=5,
        ),
        Stat(
            "Lost GPUs",
            "GPUs NVML reports lost (GPU_IS_LOST): not allocatable until reset.",
            "short",
            [Target(f"sum(kube_node_status_capacity_gpu{s()} - kube_node_status_allocatable_gpu{s()}) / 100")],
            steps=RED_FROM_ONE,
            w=2,
            h=5,
        ),
        Stat(
            "GPUs allocated",
            "Devices with at least one allocation (whole or shared; a MIG device counts as one).",
            "short",
            [Target(f"sum(k8s_node_gpu_allocated_devices{s()})")],
            w=3,
            h=5,
        ),
        Stat(
            "GPU memory",
            "Memory of the healthy GPUs.",
            "bytes",
            [Target(f"k8s_cluster_gpu_memory_total_bytes{s()}")],
            w=3,
            h=5,
        ),
        Stat(
            "Without utilization",
            "Devices NVML reports no utilization for: MIG devices. GPU used and the usage ratios leave them "
            "out, so with any here those describe the other GPUs only.",
            "short",
            [Target(q.without_utilization())],
            steps=((None, "green"), (1, "orange")),
            w=2,
            h=5,
        ),
    ]


def _capacity_gauges(q: Selectors) -> list[Panel]:
    s = q.s
    return [
        Gauge(
            "Compute allocated",
            "Compute allocated to containers / healthy GPUs (k8s_cluster_rate_gpu_request_cluster).",
            [Target(f"k8s_cluster_rate_gpu_request_cluster{s()}")],
            w=3,
            h=5,
        ),
        Gauge(
            "Memory allocated",
            "GPU memory allocated to containers / memory of the healthy GPUs.",
            [Target(f"k8s_cluster_rate_gpu_memory_request_cluster{s()}")],
            w=3,
            h=5,
        ),
        # usage is not a warning sign, unlike allocation near full: no orange or red
        Gauge(
            "GPU used",
            "Mean duty cycle of the GPUs that report one. MIG devices report none and are left out (see "
            "Without utilization), not counted as idle as k8s_cluster_rate_gpu_used_cluster does.",
            [Target(f"avg({q.utilization()})")],
            steps=GREEN,
            no_value="no utilization: MIG devices report none",
            w=2,
            h=5,
        ),
        Gauge(
            "Memory used",
            "GPU memory in use / memory of the healthy GPUs.",
            [Target(f"k8s_cluster_rate_gpu_memory_used_cluster{s()}")],
            w=2,
            h=5,
        ),
    ]


def _over_time(q: Selectors) -> list[Panel]:
    s = q.s
    return [
        TimeSeries(
            "GPUs: healthy, allocated, used",
            "In GPUs (1 = one whole GPU or MIG device). Used = the devices' duty cycles, each GPU counted "
            "once; MIG devices report none, so used leaves them out.",
            "short",
            [
                Target(f"k8s_cluster_gpu_total{s()} / 100", "healthy"),
                Target(f"sum(k8s_node_gpu_allocated_compute{s()}) / 100", "allocated"),
                Target(f"k8s_cluster_gpu_used{s()} / 100", "used"),
            ],
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory: healthy, allocated, used",
            "Memory of the healthy GPUs, memory allocated to containers, and device memory in use.",
            "bytes",
            [
                Target(f"k8s_cluster_gpu_memory_total_bytes{s()}", "healthy"),
                Target(f"sum(k8s_node_gpu_allocated_memory_bytes{s()})", "allocated"),
                Target(f"k8s_cluster_gpu_memory_used_bytes{s()}", "used"),
            ],
            w=12,
            h=8,
        ),
    ]


def _by_namespace(q: Selectors) -> list[Panel]:
    s, by, ns = q.s, q.by(q.ns), q.legend(q.ns)
    return [
        TimeSeries(
            "GPU used by namespace",
            "In GPUs: the namespace's containers' own usage (share containers their processes' SM utilisation; "
            "MIG devices report none).",
            "short",
            [Target(f"sum {by} (k8s_namespace_gpu_used{s()}) / 100", ns)],
            no_value="no container uses a GPU",
            stack=True,
            w=12,
            h=8,
        ),
        BarGauge(
            "Share of the cluster's GPUs used",
            "k8s_namespace_rate_gpu_used_cluster: namespace usage / healthy GPUs of the cluster. Partial with "
            "MIG devices (see Without utilization): they count as GPUs but report no usage.",
            "percent",
            [Target(f"max {by} (k8s_namespace_rate_gpu_used_cluster{s()})", ns)],
            no_value="no container uses a GPU",
            maximum=100,
            w=6,
            h=8,
        ),
        BarGauge(
            "GPUs allocated by namespace",
            "Compute allocated to the namespace's containers, in GPUs.",
            "short",
            [Target(f"sum {by} (k8s_pod_gpu_request{s()}) / 100", ns)],
            no_value="no compute allocated",
            w=6,
            h=8,
        ),
        TimeSeries(
            "GPU memory used by namespace",
            "Memory used by the namespace's containers.",
            "bytes",
            [Target(f"sum {by} (k8s_namespace_gpu_memory_used_bytes{s()})", ns)],
            no_value="no container uses GPU memory",
            stack=True,
            w=12,
            h=8,
        ),
        Table(
            "Namespaces",
            "Usage, allocation and share of the cluster per namespace (GPUs, bytes, %).",
            q.labels((q.ns, "Namespace")),
            [
                Column(f"sum {by} (k8s_namespace_gpu_used{s()}) / 100", "GPU used", "short"),
                Column(f"sum {by} (k8s_pod_gpu_request{s()}) / 100", "GPU allocated", "short"),
                Column(f"sum {by} (k8s_namespace_rate_gpu_used_cluster{s()})", "% of cluster GPUs", "percent"),
                Column(f"sum {by} (k8s_namespace_gpu_memory_used_bytes{s()})", "Memory used", "bytes"),
                Column(f"sum {by} (k8s_pod_gpu_memory_request_bytes{s()})", "Memory allocated", "bytes"),
                Column(f"sum {by} (k8s_namespace_rate_gpu_memory_used_cluster{s()})", "% of cluster memory", "percent"),
            ],
            w=12,
            h=8,
        ),
    ]


def _top_workloads(q: Selectors, n: int) -> str:
    """The ``n`` workloads that used the most GPU over the dashboard's time range, in GPUs.

    A ``topk`` over a range query is evaluated at every step: it would show more than ``n`` lines,
    a workload entering and leaving as the ranking changes. So the ranking is one instant vector,
    the mean over the range evaluated at the range's end (``@ end()``, Prometheus 2.25+), and every
    step keeps the workloads in it (``and on``).
    """
    s, wl = q.s, (q.ns, "workload_kind", "workload_name")
    used = f"sum {q.by(*wl)} (k8s_workload_gpu_used{s()})"
    ranked = f"topk({n}, sum {q.by(*wl)} (avg_over_time(k8s_workload_gpu_used{s()}[$__range] @ end())))"
    return f"{used} / 100\nand {q.on(*wl)}\n{ranked}"


def _by_workload(q: Selectors) -> list[Panel]:
    s, by = q.s, q.by(q.ns, "workload_kind", "workload_name")
    return [
        TimeSeries(
            "GPU used by workload (top 10)",
            "In GPUs, all pods of the workload on every node: the 10 that used the most over the time range.",
            "short",
            [Target(_top_workloads(q, 10), q.legend(q.ns, "workload_kind", "workload_name"))],
            no_value="no workload used a GPU",
            w=12,
            h=9,
        ),
        Table(
            "Workloads",
            "Usage, allocation and share of the cluster per workload (GPUs, bytes, %).",
            q.labels((q.ns, "Namespace"), ("workload_kind", "Kind"), ("workload_name", "Workload")),
            [
                Column(f"sum {by} (k8s_workload_gpu_used{s()}) / 100", "GPU used", "short"),
                Column(f"sum {by} (k8s_pod_gpu_request{s()}) / 100", "GPU allocated", "short"),
                Column(f"sum {by} (k8s_workload_rate_gpu_used_cluster{s()})", "% of cluster GPUs", "percent"),
                Column(f"sum {by} (k8s_workload_gpu_memory_used_bytes{s()})", "Memory used", "bytes"),
                Column(f"sum {by} (k8s_pod_gpu_memory_request_bytes{s()})", "Memory allocated", "bytes"),
                Column(f"sum {by} (k8s_workload_rate_gpu_memory_used_cluster{s()})", "% of cluster memory", "percent"),
            ],
            w=12,
            h=9,
        ),
    ]


def _nodes(q: Selectors) -> list[Panel]:
    s, by = q.s, q.by(q.node)
    return [
        Table(
            "Nodes",
            "Per node: devices (whole GPUs and MIG devices), physical GPUs, allocation and usage (GPUs and % of "
            "the node's capacity). GPU used % is the mean duty cycle of the node's GPUs that report one.",
            q.labels((q.node, "Node")),
            [
                Column(f"max {by} (kube_node_status_capacity_gpu{s()}) / 100", "Devices", "short"),
                Column(q.card_count(q.node), "Physical GPUs", "short"),
                Column(f"max {by} (kube_node_status_allocatable_gpu{s()}) / 100", "Healthy", "short"),
                Column(f"max {by} (k8s_node_gpu_allocated_devices{s()})", "GPUs allocated", "short"),
                Column(f"max {by} (k8s_node_gpu_allocated_compute{s()}) / 100", "Compute allocated", "short"),
                Column(f"avg {by} ({q.utilization()})", "GPU used %", "percent"),
                Column(q.without_utilization(q.node), "Without utilization", "short"),
                Column(f"max {by} (k8s_node_rate_gpu_memory_used{s()})", "Memory used %", "percent"),
                Column(f"max {by} (k8s_node_rate_gpu_memory_allocated{s()})", "Memory allocated %", "percent"),
            ],
            w=24,
            h=8,
        ),
    ]
