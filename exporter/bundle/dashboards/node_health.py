"""GPU / Node, its last two rows: what went wrong on the node's GPUs, and how the exporter itself is doing.

"Errors and unaccounted processes": Xid errors, lost GPUs, GPU processes no container was
allocated. "Exporter health": NVML, the pod cache, the sampling cycle, the served snapshot's age
and skipped inputs by reason. The exporter's own families (``kube_gpu_exporter_*``) carry no node
label: :func:`_of_node` finds the node's exporter by its scrape target (``instance``, ``job``).
"""

from __future__ import annotations

from exporter.bundle.dashboards.panels import RED_FROM_ONE, Column, Panel, Stat, Table, Target, TimeSeries
from exporter.bundle.dashboards.promql import Selectors

NO_XID = "no Xid since the exporter started"


def errors(q: Selectors) -> list[Panel]:
    """Xid errors, lost GPUs and unaccounted GPU processes."""
    s, n = q.s, q.this_node
    xid = q.by("minor_number", "xid", q.ns, q.pod, q.ctr)
    process = q.by(*q.device, "pid", q.ns, q.pod, q.ctr)
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
            no_value=NO_XID,
            w=10,
            h=8,
        ),
        TimeSeries(
            "Xid errors over time",
            "New Xid errors per GPU and code.",
            "short",
            [Target(f"sum {q.by('minor_number', 'xid')} ({new_xids})", "GPU {{minor_number}} Xid {{xid}}")],
            no_value=NO_XID,
            w=8,
            h=8,
        ),
        Stat(
            "Last Xid",
            "When the exporter read the node's latest Xid.",
            "dateTimeFromNow",
            [Target(f"max(nvidia_gpu_last_xid_timestamp_seconds{s(n)}) * 1000")],  # Grafana wants milliseconds
            no_value=NO_XID,
            w=3,
            h=4,
        ),
        Stat(
            "GPUs lost",
            "Devices NVML reports lost (GPU_IS_LOST); a lost MIG card loses all its MIG devices.",
            "short",
            [Target(f"sum(1 - max {q.by(*q.device)} (nvidia_gpu_up{s(n)}))")],
            steps=RED_FROM_ONE,
            w=3,
            h=4,
        ),
        Table(
            "Unaccounted GPU processes",
            "Processes using a GPU that no container was allocated: host "
            "processes (empty pod) or pods that see every GPU.",
            q.labels(
                ("gpu", "GPU"),
                ("pid", "PID"),
                (q.ns, "Namespace"),
                (q.pod, "Pod"),
                (q.ctr, "Container"),
                ("uuid", "UUID"),
                (q.node, "Node"),
            ),
            [
                Column(
                    q.named(f"max {process} (nvidia_gpu_unaccounted_process_memory_used_bytes{s(n)})", n),
                    "Memory used",
                    "bytes",
                ),
                Column(
                    q.named(f"max {process} (nvidia_gpu_unaccounted_process_duty_cycle{s(n)})", n),
                    "SM utilisation",
                    "percent",
                ),
            ],
            no_value="no unaccounted GPU process",
            w=24,
            h=7,
        ),
    ]


def _of_node(q: Selectors, expr: str) -> str:
    """``expr`` (an exporter family) of the node's exporter, matched by scrape target.

    The target is the one that served the node's ``nvidia_gpu_num_devices`` during the time range
    (so a node whose NVML just went down still finds its exporter).
    """
    target = ("instance", "job")
    scraped = f"last_over_time(nvidia_gpu_num_devices{q.s(q.this_node)}[$__range])"
    return f"{expr}\n* {q.on(*target)} group_left () group {q.by(*target)} ({scraped})"


def exporter_health(q: Selectors) -> list[Panel]:
    """NVML up, pod cache synced, snapshot age, sampling duration, skips by reason."""
    s = q.s
    no_exporter = "no exporter scraped for this node"
    return [
        Stat(
            "NVML",
            "Whether the exporter initialised NVML (kube_gpu_exporter_nvml_up). While down no device is "
            "read: the GPU panels are empty, not zero.",
            "none",
            [Target(f"min({_of_node(q, f'kube_gpu_exporter_nvml_up{s()}')})")],
            steps=((None, "red"), (1, "green")),
            texts=((0, "down"), (1, "up")),
            no_value=no_exporter,
            w=4,
            h=6,
        ),
        Stat(
            "Pod cache",
            "Whether the exporter's pod cache has synced with the API (kube_gpu_exporter_pod_cache_synced); "
            "until then processes are not attributed to pods.",
            "none",
            [Target(f"min({_of_node(q, f'kube_gpu_exporter_pod_cache_synced{s()}')})")],
            steps=((None, "red"), (1, "green")),
            texts=((0, "not synced"), (1, "synced")),
            no_value=no_exporter,
            w=4,
            h=6,
        ),
        Stat(
            "Snapshot age",
            "Age of the snapshot a scrape served (kube_gpu_exporter_snapshot_age_seconds): it grows while "
            "sampling is stuck; KubeGpuExporterSnapshotStale fires over 60 s.",
            "s",
            [Target(f"max({_of_node(q, f'kube_gpu_exporter_snapshot_age_seconds{s()}')})")],
            steps=((None, "green"), (60, "red")),
            no_value=no_exporter,
            w=4,
            h=6,
        ),
        TimeSeries(
            "Sample duration",
            "How long the last sampling cycle took (kube_gpu_exporter_sample_duration_seconds).",
            "s",
            [Target(f"max({_of_node(q, f'kube_gpu_exporter_sample_duration_seconds{s()}')})", "sampling cycle")],
            no_value=no_exporter,
            w=6,
            h=6,
        ),
        TimeSeries(
            "Skips by reason",
            "Inputs the exporter skipped, by reason (kube_gpu_exporter_skips_total; docs/metrics.md lists "
            "the reasons): processes gone before /proc was read, pods not in the cache, malformed annotations.",
            "short",
            [
                Target(
                    f"sum {q.by('reason')} (\n"
                    f"{_of_node(q, f'increase(kube_gpu_exporter_skips_total{s()}[$__rate_interval])')}\n)",
                    "{{reason}}",
                )
            ],
            no_value="no input skipped",
            w=6,
            h=6,
        ),
    ]
