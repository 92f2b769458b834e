"""GPU / Namespace, workload and pod: usage against requests, down to the containers and their GPUs.

The busy-time and energy row (the per-container counters) is :mod:`.workload_usage`.

Variables: ``namespace`` (one), ``workload`` (one, by name: two kinds with the same name show
together) and ``pod`` (several, or All: the workload's pods). A pod on a MIG device has memory but
no utilization (NVML gives none): its usage panels say so instead of "No data".
"""

from __future__ import annotations

from exporter.bundle.dashboards.board import Board, QueryVariable, Row
from exporter.bundle.dashboards.panels import BarGauge, Column, Panel, Stat, Table, Target, TimeSeries
from exporter.bundle.dashboards.promql import DEVICE_ROWS, Selectors
from exporter.bundle.dashboards.workload_usage import usage_panels

WORKLOAD_LEGEND = "{{workload_kind}}/{{workload_name}}"
NO_UTILIZATION = "no utilization: MIG devices report none"


def board(q: Selectors) -> Board:
    """The namespace / workload / pod view."""
    ns, wl = q.this_namespace, q.this_workload
    return Board(
        title="Namespace, workload and pod",
        description="GPU usage against requests for a namespace, a workload and its pods and containers, "
        "their busy time and energy, and the GPUs they run on.",
        # from the memory series: a MIG device reports memory but no utilization, so a namespace,
        # workload or pod on MIG devices only has no *_gpu_used series at all
        variables=(
            QueryVariable(
                "namespace", "Namespace", f"label_values(k8s_namespace_gpu_memory_used_bytes{q.s()}, {q.ns})"
            ),
            QueryVariable(
                "workload", "Workload", f"label_values(k8s_workload_gpu_memory_used_bytes{q.s(ns)}, workload_name)"
            ),
            QueryVariable(
                "pod", "Pod", f"label_values(k8s_pod_gpu_memory_used_bytes{q.s(ns, wl)}, {q.pod})", multi=True
            ),
        ),
        rows=(
            Row("Namespace $namespace", [*_namespace_stats(q), *_namespace_workloads(q)]),
            Row("Workload $workload", _workload(q)),
            Row("Pods: usage vs request", [*_pods_over_time(q), *_pods_now(q)]),
            Row("Busy time and energy (window averages; totals over the time range)", usage_panels(q, WORKLOAD_LEGEND)),
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
            [Target(f"sum(k8s_namespace_gpu_used{s(ns)}) / 100")],
            decimals=2,
            no_value=NO_UTILIZATION,
            w=4,
            h=5,
        ),
        Stat(
            "GPU allocated",
            "Compute allocated to the namespace's containers, in GPUs.",
            "short",
            [Target(f"sum(k8s_pod_gpu_request{s(ns)}) / 100")],
            decimals=2,
            no_value="no compute allocated",
            w=4,
            h=5,
        ),
        Stat(
            "Share of the cluster's GPUs",
            "k8s_namespace_rate_gpu_used_cluster (partial with MIG devices: they report no usage).",
            "percent",
            [Target(f"max(k8s_namespace_rate_gpu_used_cluster{s(ns)})")],
            no_value=NO_UTILIZATION,
            w=4,
            h=5,
        ),
        Stat(
            "GPU memory used",
            "Memory used by the namespace's containers.",
            "bytes",
            [Target(f"sum(k8s_namespace_gpu_memory_used_bytes{s(ns)})")],
            w=4,
            h=5,
        ),
        Stat(
            "GPU memory allocated",
            "Memory allocated to the namespace's containers.",
            "bytes",
            [Target(f"sum(k8s_pod_gpu_memory_request_bytes{s(ns)})")],
            no_value="no memory allocated",
            w=4,
            h=5,
        ),
        Stat(
            "Share of the cluster's GPU memory",
            "k8s_namespace_rate_gpu_memory_used_cluster.",
            "percent",
            [Target(f"max(k8s_namespace_rate_gpu_memory_used_cluster{s(ns)})")],
            w=4,
            h=5,
        ),
    ]


def _namespace_workloads(q: Selectors) -> list[Panel]:
    s, ns, by = q.s, q.this_namespace, q.by("workload_kind", "workload_name")
    return [
        TimeSeries(
            "GPU used by workload",
            "In GPUs, each workload of the namespace.",
            "short",
            [Target(f"sum {by} (k8s_workload_gpu_used{s(ns)}) / 100", WORKLOAD_LEGEND)],
            no_value=NO_UTILIZATION,
            stack=True,
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory used by workload",
            "Each workload of the namespace.",
            "bytes",
            [Target(f"sum {by} (k8s_workload_gpu_memory_used_bytes{s(ns)})", WORKLOAD_LEGEND)],
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
                Target(f"max(k8s_workload_rate_gpu_used_cluster{sel})", "GPU"),
                Target(f"max(k8s_workload_rate_gpu_memory_used_cluster{sel})", "memory"),
            ],
            w=8,
            h=8,
        ),
    ]


def _matchers(q: Selectors) -> tuple[str, ...]:
    """The matchers of the chosen pods: of the namespace, the workload and the ``pod`` variable."""
    return q.this_namespace, q.this_workload, q.these_pods


def _pods(q: Selectors) -> str:
    """The selector of the chosen pods."""
    return q.s(*_matchers(q))


def _pods_over_time(q: Selectors) -> list[Panel]:
    sel, pod, by = _pods(q), q.legend(q.pod), q.by(q.node, q.pod)
    return [
        TimeSeries(
            "GPU used / requested",
            "k8s_pod_rate_gpu_used_request: usage of the containers with a "
            "request / their requests. Pods without a request (time-slicing) have no line.",
            "percent",
            [Target(f"max {by} (k8s_pod_rate_gpu_used_request{sel})", pod)],
            no_value="no pod with a GPU request, or no utilization (MIG)",
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory used / requested",
            "k8s_pod_rate_gpu_memory_used_request.",
            "percent",
            [Target(f"max {by} (k8s_pod_rate_gpu_memory_used_request{sel})", pod)],
            no_value="no pod with a GPU memory request",
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU used and requested",
            "In GPUs, per pod.",
            "short",
            [
                Target(f"sum {by} (k8s_pod_gpu_used{sel}) / 100", f"{pod} used"),
                Target(f"sum {by} (k8s_pod_gpu_request{sel}) / 100", f"{pod} request"),
            ],
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU memory used and requested",
            "Per pod.",
            "bytes",
            [
                Target(f"sum {by} (k8s_pod_gpu_memory_used_bytes{sel})", f"{pod} used"),
                Target(f"sum {by} (k8s_pod_gpu_memory_request_bytes{sel})", f"{pod} request"),
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
                Column(f"max {by} (k8s_pod_rate_gpu_used_request{sel})", "Used / requested", "percent"),
                Column(f"max {by} (k8s_pod_rate_gpu_used_node{sel})", "% of node GPUs", "percent"),
                Column(f"sum {by} (k8s_pod_gpu_memory_used_bytes{sel})", "Memory used", "bytes"),
                Column(f"sum {by} (k8s_pod_gpu_memory_request_bytes{sel})", "Memory requested", "bytes"),
                Column(f"max {by} (k8s_pod_rate_gpu_memory_used_request{sel})", "Memory used / requested", "percent"),
                Column(f"max {by} (k8s_pod_rate_gpu_memory_used_node{sel})", "% of node GPU memory", "percent"),
            ],
            w=24,
            h=7,
        ),
        BarGauge(
            "Compute allocated per pod and GPU",
            "k8s_pod_gpu_allocated_compute: % of one GPU allocated to each pod on each GPU or MIG device.",
            "percent",
            [Target(q.allocated_per_device("k8s_pod_gpu_allocated_compute", q.pod, where=_matchers(q)), _pod_gpu(q))],
            maximum=100,
            no_value="no compute allocated (time-slicing, memory-only sharing)",
            w=8,
            h=8,
        ),
    ]


def _pod_gpu(q: Selectors) -> str:
    """The legend of a (pod, GPU) series: ``<pod> GPU <gpu name>`` (see :meth:`Selectors.gpu_names`)."""
    return f"{q.legend(q.pod)} GPU {{{{gpu}}}}"


def _containers(q: Selectors) -> list[Panel]:
    sel, ctr, by = _pods(q), q.legend(q.pod, q.ctr), q.by(q.node, q.pod, q.ctr)
    return [
        TimeSeries(
            "GPU used per container",
            "In GPUs.",
            "short",
            [Target(f"sum {by} (k8s_container_gpu_used{sel}) / 100", ctr)],
            no_value=NO_UTILIZATION,
            w=8,
            h=8,
        ),
        TimeSeries(
            "GPU used / requested per container",
            "k8s_container_rate_gpu_used_request.",
            "percent",
            [Target(f"max {by} (k8s_container_rate_gpu_used_request{sel})", ctr)],
            no_value="no container with a GPU request, or no utilization (MIG)",
            w=8,
            h=8,
        ),
        TimeSeries(
            "GPU memory used per container",
            "k8s_container_gpu_memory_used_bytes.",
            "bytes",
            [Target(f"sum {by} (k8s_container_gpu_memory_used_bytes{sel})", ctr)],
            w=8,
            h=8,
        ),
    ]


def _on_pods_gpus(q: Selectors, series: str) -> str:
    """The device values of each GPU a chosen pod runs on, once per (pod, GPU).

    The pods' GPUs are the devices (node, uuid) of the rows that name the pod; their device series
    join on the device, so a GPU two chosen pods share shows once for each. A MIG device shows its
    card's power and temperature (the exporter repeats them on each MIG device).
    """
    pods_on = f"group {q.by(*q.device, q.pod)} (nvidia_gpu_memory_total_bytes{q.s(q.this_namespace, q.these_pods)})"
    device = q.named(f"max {q.by(*q.device)} ({series})")
    return f"(\n{device}\n)\n* {q.on(*q.device)} group_right (gpu)\n{pods_on}"


def _pods_gpus(q: Selectors) -> list[Panel]:
    s = q.s
    return [
        TimeSeries(
            "Device duty cycle",
            "Utilisation of the GPUs the pods run on (the whole device, all its users); MIG devices have none.",
            "percent",
            [Target(_on_pods_gpus(q, f"nvidia_gpu_duty_cycle{s(DEVICE_ROWS)}"), _pod_gpu(q))],
            maximum=100,
            no_value=NO_UTILIZATION,
            w=8,
            h=8,
        ),
        TimeSeries(
            "Device power",
            "Power draw of the GPUs the pods run on; on a MIG device, its whole card's (shared by its MIG devices).",
            "mwatt",
            [Target(_on_pods_gpus(q, f"nvidia_gpu_power_usage_milliwatts{s()}"), _pod_gpu(q))],
            w=8,
            h=8,
        ),
        TimeSeries(
            "Device temperature",
            "Temperature of the GPUs the pods run on; on a MIG device, its card's.",
            "celsius",
            [Target(_on_pods_gpus(q, f"nvidia_gpu_temperature_celsius{s()}"), _pod_gpu(q))],
            w=8,
            h=8,
        ),
    ]
