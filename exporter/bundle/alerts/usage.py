"""Alerts on how the GPUs are used: processes nobody allocated a GPU to, containers over their
memory grant on a shared GPU, allocations left idle.

Runbook: docs/alerts.md, KubeGpuUnaccountedProcesses to KubeGpuAllocatedIdle.
"""

from __future__ import annotations

from exporter.bundle.alerts.alert import Alert, Labels, by, on, spelled, var
from exporter.bundle.alerts.options import AlertOptions


def usage_alerts(opts: AlertOptions, lb: Labels) -> list[Alert]:
    """One alert per container (or process outside any pod) that misuses a GPU."""
    ctr_keys, who = lb.container_keys, lb.who
    ctr_gpu = [*ctr_keys, "uuid", "minor_number"]
    return [
        Alert(
            "KubeGpuUnaccountedProcesses",
            lb.for_container(
                f"count {by([*lb.gpu, lb.namespace, lb.pod, lb.container])} (\n"
                "  nvidia_gpu_unaccounted_process_memory_used_bytes\n"
                "  or nvidia_gpu_unaccounted_process_duty_cycle\n"
                ")"
            ),
            "warning",
            "Processes use a GPU without an allocation.",
            f"{{{{ $value }}}} process(es) {lb.owner} have used {lb.gpu_desc} for "
            f"{spelled(opts.unaccounted_for)} without being allocated it; they compete with the pods that were.",
            opts.unaccounted_for,
        ),
        Alert(
            "KubeGpuContainerOverMemoryGrant",
            lb.for_container(
                f"max {by(ctr_gpu)} "
                f'(nvidia_gpu_memory_used_bytes{{allocate_mode="share"}})\n'
                f"* 100 /\n"
                # `> 0`: a container without a grant has no percentage to exceed (and no division by 0).
                f"(max {by(ctr_gpu)} (nvidia_gpu_gpu_sharing_memory) > 0)\n"
                f"> 100"
            ),
            "warning",
            "A container on a shared GPU uses more memory than it was granted.",
            f"Container {var(lb.container)} of pod {who} uses {{{{ $value | printf \"%.0f\" }}}}% of the "
            f"GPU memory it was granted on {lb.gpu_desc}; it can starve the other containers on that GPU.",
            "5m",
        ),
        Alert(
            "KubeGpuAllocatedIdle",
            # The value is the GPUs held; the two `and` clauses only filter (idle, and holding some).
            lb.for_container(
                f"sum {by(ctr_keys)} (nvidia_gpu_allocated_compute_percent) / 100\n"
                f"and {on(ctr_keys)}\n"
                f'(sum {by(ctr_keys)} (nvidia_gpu_duty_cycle{{allocate_mode=~"exclusive|share"}}) '
                f"< {opts.idle_percent:g})\n"
                f"and {on(ctr_keys)}\n"
                f"(sum {by(ctr_keys)} (nvidia_gpu_allocated_compute_percent) > 0)"
            ),
            "info",
            "GPUs are allocated to a container that does not use them.",
            f"Container {var(lb.container)} of pod {who} on node {lb.where} holds {{{{ $value }}}} GPU(s) "
            f"and has used less than {opts.idle_percent:g}% of them for {opts.idle_for}; the allocation "
            "could go to someone else.",
            opts.idle_for,
        ),
    ]
