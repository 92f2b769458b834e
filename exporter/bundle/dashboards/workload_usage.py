"""The workload board's busy-time and energy row: the per-container counters (docs/metrics.md).

Lines are the recording rules' window averages (``k8s_*_gpu_busy``, ``k8s_*_gpu_power_watts``:
``rate()`` over the bundle's ``--rate-window``), so a bursty job reads its true average, not the
last point sample. The table totals the raw counters over the dashboard's time range with
``increase()``: busy GPU time and energy per pod, what chargeback bills.
"""

from __future__ import annotations

from exporter.bundle.dashboards.panels import Column, Panel, Table, Target, TimeSeries
from exporter.bundle.dashboards.promql import Selectors

NO_BUSY = "no busy time: MIG devices report no utilization"
NO_ENERGY = "no energy counter (GPUs before Volta), or none read yet"


def usage_panels(q: Selectors, workload_legend: str) -> list[Panel]:
    """Busy GPUs and power per workload of the namespace and per chosen pod, then the range totals."""
    ns = q.s(q.this_namespace)
    pods = q.s(q.this_namespace, q.this_workload, q.these_pods)
    wl, pod = q.by("workload_kind", "workload_name"), q.by(q.node, q.pod)
    legend = q.legend(q.pod)
    return [
        TimeSeries(
            "Busy GPUs by workload",
            "k8s_workload_gpu_busy / 100: each workload's GPU busy time averaged over the rules' rate window, "
            "in GPUs (1 = one GPU busy all the time).",
            "short",
            [Target(f"sum {wl} (k8s_workload_gpu_busy{ns}) / 100", workload_legend)],
            no_value=NO_BUSY,
            stack=True,
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU power by workload",
            "k8s_workload_gpu_power_watts: the energy attributed to each workload per second (its SM share of "
            "each shared GPU, all of an exclusive one), averaged over the rules' rate window.",
            "watt",
            [Target(f"sum {wl} (k8s_workload_gpu_power_watts{ns})", workload_legend)],
            no_value=NO_ENERGY,
            stack=True,
            w=12,
            h=8,
        ),
        TimeSeries(
            "Busy GPUs by pod",
            "k8s_pod_gpu_busy / 100, in GPUs: the window average (compare the point sample of GPU used).",
            "short",
            [Target(f"sum {pod} (k8s_pod_gpu_busy{pods}) / 100", legend)],
            no_value=NO_BUSY,
            w=12,
            h=8,
        ),
        TimeSeries(
            "GPU power by pod",
            "k8s_pod_gpu_power_watts: power attributed to each pod.",
            "watt",
            [Target(f"sum {pod} (k8s_pod_gpu_power_watts{pods})", legend)],
            no_value=NO_ENERGY,
            w=12,
            h=8,
        ),
        _totals(q),
    ]


def _totals(q: Selectors) -> Table:
    raw = q.s(q.this_namespace, q.these_pods)  # the counters carry no workload labels: the pods do
    by = q.by(q.node, q.pod)
    return Table(
        "Busy GPU time and energy over the time range",
        "Per pod, increase() of its counters over the dashboard's time range: busy GPU time "
        "(nvidia_gpu_container_busy_seconds_total, GPU-seconds) and energy "
        "(nvidia_gpu_container_energy_joules_total). Idle power of shared GPUs is not in any pod's.",
        q.labels((q.node, "Node"), (q.pod, "Pod")),
        [
            Column(f"sum {by} (increase(nvidia_gpu_container_busy_seconds_total{raw}[$__range]))",
                   "Busy GPU time", "s"),
            Column(f"sum {by} (increase(nvidia_gpu_container_energy_joules_total{raw}[$__range]))", "Energy",
                   "joule"),
        ],
        no_value="no counters here: MIG devices without an energy counter",
        w=24,
        h=7,
    )
