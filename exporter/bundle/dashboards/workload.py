"""GPU / Namespace, workload and pod: usage against requests, down to the containers and their GPUs.

Variables: ``namespace`` (one), ``workload`` (one, by name: two kinds with the same name show
together) and ``pod`` (several, or All: the workload's pods).
"""

from __future__ import annotations

from exporter.bundle.dashboards.board import Board, QueryVariable, Row
from exporter.bundle.dashboards.panels import BarGauge, Column, Panel, Stat, Table, Target, TimeSeries
from exporter.bundle.dashboards.promql import DEVICE_ROWS, Selectors

WORKLOAD_LEGEND = "{{workload_kind}}/{{workload_name}}"


def board(q: Selectors) -> Board:
    """The namespace / workload / pod view."""
    ns, wl = q.this_namespace, q.this_workload
    return Board(
        title="Namespace, workload and pod",
        description="GPU usage against requests for a namespace, a workload and its pods and containers, "
        "and the GPUs they run on.",
        variables=(
            QueryVariable("namespace", "Namespace", f"label_values(k8s_namespace_gpu_used{q.s()}, {q.ns})"),
            QueryVariable("workload", "Workload", f"label_values(k8s_workload_gpu_used{q.s(ns)}, workload_name)"),
            QueryVariable("pod", "Pod", f"label_values(k8s_pod_gpu_used{q.s(ns, wl)}, {q.pod})", multi=True),
        ),
        rows=(
            Row("Namespace $namespace", [*_namespace_stats(q), *_namespace_workloads(q)]),
            Row("Workload $workload", _workload(q)),
            Row("Pods: usage vs request", [*_pods_over_time(q), *_pods_now(q)]),
            Row("Containers", _containers(q)),
            Row("The pods' GPUs", _pods_gpus(q)),
        ),
    )


def _namespace_stats(q: Selectors) -> list[Panel]:
    s, ns = q.s, q.this_namespace
    return [
        Stat(
            "GPU used",
            "The namespace's containers' usage, in GPUs.",
            "short",
            [Target(f"k8s_namespace_gpu_used{s(ns)} / 100")],
            decimals=2,
            w=4,
            h=5,
        ),
        Stat(
            "GPU allocated",
            "Compute allocated to the namespace's containers, in GPUs.",
            "short",
            [Target(f"sum(k8s_pod_gpu_request{s(ns)}) / 100")],
            decimals=2,
            w=4,
            h=5,
        ),
        Stat(
            "Share of the cluster's GPUs",
            "k8s_namespace_rate_gpu_used_cluster.",
            "percent",
            [Target(f"k8s_namespace_rate_gpu_used_cluster{s(ns)}")],
            w=4,
            h=5,
        ),
        Stat(
            "GPU memory used",
            "Memory used by the namespace's containers.",
            "bytes",
            [Target(f"k8s_namespace_gpu_memory_used_bytes{s(ns)}")],
            w=4,
            h=5,
        ),
        Stat(
            "GPU memory allocated",
            "Memory allocated to the namespace's containers.",
            "bytes",
            [Target(f"sum(k8s_pod_gpu_memory_request_bytes{s(ns)})")],
            w=4,
            h=5,
        ),
        Stat(
            "Share of the cluster's GPU memory",
            "k8s_namespace_rate_gpu_memory_used_cluster.",
            "percent",
            [Target(f"k8s_namespace_rate_gpu_memory_used_cluster{s(ns)}")],
            w=4,
            h=5,
        ),
    ]


def _namespace_workloads(q: Selectors) -> list[Panel]:
    s, ns = q.s, q.this_namespace
    return [
        TimeSeries(
            "GPU used by workload",
            "In GPUs, each workload of the namespace.",
            "short",
            [Target(f"k8s_workload_gpu_used{s(ns)} / 100", WORKLOAD_LEGEND)],
            stack=True,
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory used by workload",
            "Each workload of the namespace.",
            "bytes",
            [Target(f"k8s_workload_gpu_memory_used_bytes{s(ns)}", WORKLOAD_LEGEND)],
            stack=True,
            w=12,
            h=8,
        ),
    ]


def _workload(q: Selectors) -> list[Panel]:
    sel = q.s(q.this_namespace, q.this_workload)
    return [
        TimeSeries(
            "GPU used vs allocated",
            "In GPUs: what the workload's pods used and what they were allocated.",
            "short",
            [
                Target(f"sum(k8s_workload_gpu_used{sel}) / 100", "used"),
                Target(f"sum(k8s_pod_gpu_request{sel}) / 100", "allocated"),
            ],
            w=8,
            h=8,
        ),
        TimeSeries(
            "GPU memory used vs allocated",
            "Memory the workload's pods used and were allocated.",
            "bytes",
            [
                Target(f"sum(k8s_workload_gpu_memory_used_bytes{sel})", "used"),
                Target(f"sum(k8s_pod_gpu_memory_request_bytes{sel})", "allocated"),
            ],
            w=8,
            h=8,
        ),
        TimeSeries(
            "Share of the cluster",
            "k8s_workload_rate_gpu_used_cluster and k8s_workload_rate_gpu_memory_used_cluster.",
            "percent",
            [
                Target(f"sum(k8s_workload_rate_gpu_used_cluster{sel})", "GPU"),
                Target(f"sum(k8s_workload_rate_gpu_memory_used_cluster{sel})", "memory"),
            ],
            w=8,
            h=8,
        ),
    ]


def _pods(q: Selectors) -> str:
    """The selector of the chosen pods: of the namespace, the workload and the ``pod`` variable."""
    return q.s(q.this_namespace, q.this_workload, q.these_pods)


def _pods_over_time(q: Selectors) -> list[Panel]:
    sel, pod = _pods(q), q.legend(q.pod)
    return [
        TimeSeries(
            "GPU used / requested",
            "k8s_pod_rate_gpu_used_request: usage of the containers with a "
            "request / their requests. Pods without a request (time-slicing) have no line.",
            "percent",
            [Target(f"k8s_pod_rate_gpu_used_request{sel}", pod)],
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory used / requested",
            "k8s_pod_rate_gpu_memory_used_request.",
            "percent",
            [Target(f"k8s_pod_rate_gpu_memory_used_request{sel}", pod)],
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU used and requested",
            "In GPUs, per pod.",
            "short",
            [
                Target(f"k8s_pod_gpu_used{sel} / 100", f"{pod} used"),
                Target(f"k8s_pod_gpu_request{sel} / 100", f"{pod} request"),
            ],
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory used and requested",
            "Per pod.",
            "bytes",
            [
                Target(f"k8s_pod_gpu_memory_used_bytes{sel}", f"{pod} used"),
                Target(f"k8s_pod_gpu_memory_request_bytes{sel}", f"{pod} request"),
            ],
            w=12,
            h=8,
        ),
    ]


def _pods_now(q: Selectors) -> list[Panel]:
    sel, by = _pods(q), q.by(q.node, q.pod)
    return [
        Table(
            "Pods",
            "Per pod: usage and requests (GPUs, bytes) and their ratios.",
            q.labels((q.node, "Node"), (q.pod, "Pod")),
            [
                Column(f"sum {by} (k8s_pod_gpu_used{sel}) / 100", "GPU used", "short"),
                Column(f"sum {by} (k8s_pod_gpu_request{sel}) / 100", "GPU requested", "short"),
                Column(f"sum {by} (k8s_pod_rate_gpu_used_request{sel})", "Used / requested", "percent"),
                Column(f"sum {by} (k8s_pod_rate_gpu_used_node{sel})", "% of node GPUs", "percent"),
                Column(f"sum {by} (k8s_pod_gpu_memory_used_bytes{sel})", "Memory used", "bytes"),
                Column(f"sum {by} (k8s_pod_gpu_memory_request_bytes{sel})", "Memory requested", "bytes"),
                Column(f"sum {by} (k8s_pod_rate_gpu_memory_used_request{sel})", "Memory used / requested", "percent"),
                Column(f"sum {by} (k8s_pod_rate_gpu_memory_used_node{sel})", "% of node GPU memory", "percent"),
            ],
            w=24,
            h=7,
        ),
        BarGauge(
            "Compute allocated per pod and GPU",
            "k8s_pod_gpu_allocated_compute: % of one GPU allocated to each pod on each card.",
            "percent",
            [Target(f"k8s_pod_gpu_allocated_compute{sel}", f"{q.legend(q.pod)} GPU {{{{minor_number}}}}")],
            maximum=100,
            w=8,
            h=8,
        ),
    ]


def _containers(q: Selectors) -> list[Panel]:
    sel, ctr = _pods(q), q.legend(q.pod, q.ctr)
    return [
        TimeSeries(
            "GPU used per container",
            "In GPUs.",
            "short",
            [Target(f"k8s_container_gpu_used{sel} / 100", ctr)],
            w=8,
            h=8,
        ),
        TimeSeries(
            "GPU used / requested per container",
            "k8s_container_rate_gpu_used_request.",
            "percent",
            [Target(f"k8s_container_rate_gpu_used_request{sel}", ctr)],
            w=8,
            h=8,
        ),
        TimeSeries(
            "GPU memory used per container",
            "k8s_container_gpu_memory_used_bytes.",
            "bytes",
            [Target(f"k8s_container_gpu_memory_used_bytes{sel}", ctr)],
            w=8,
            h=8,
        ),
    ]


def _on_pods_gpus(q: Selectors, series: str) -> str:
    """The device values of each GPU a chosen pod runs on, once per (pod, GPU).

    The pods' GPUs are the cards (node, uuid) of the rows that name the pod; their device series
    join on the card, so a GPU two chosen pods share shows once for each.
    """
    card = (q.node, "uuid")
    pods_on = f"group {q.by(*card, q.pod)} (nvidia_gpu_memory_total_bytes{q.s(q.this_namespace, q.these_pods)})"
    return f"max {q.by(*card, 'minor_number')} ({series})\n* {q.on(*card)} group_right (minor_number)\n{pods_on}"


def _pods_gpus(q: Selectors) -> list[Panel]:
    s, legend = q.s, f"{q.legend(q.pod)} GPU {{{{minor_number}}}}"
    return [
        TimeSeries(
            "Device duty cycle",
            "Utilisation of the GPUs the pods run on (the whole device, all its users).",
            "percent",
            [Target(_on_pods_gpus(q, f"nvidia_gpu_duty_cycle{s(DEVICE_ROWS)}"), legend)],
            maximum=100,
            w=8,
            h=8,
        ),
        TimeSeries(
            "Device power",
            "Power draw of the GPUs the pods run on.",
            "mwatt",
            [Target(_on_pods_gpus(q, f"nvidia_gpu_power_usage_milliwatts{s()}"), legend)],
            w=8,
            h=8,
        ),
        TimeSeries(
            "Device temperature",
            "Temperature of the GPUs the pods run on.",
            "celsius",
            [Target(_on_pods_gpus(q, f"nvidia_gpu_temperature_celsius{s()}"), legend)],
            w=8,
            h=8,
        ),
    ]
