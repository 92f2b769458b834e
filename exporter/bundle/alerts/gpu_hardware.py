"""Alerts on a GPU's hardware health: memory repair (row remapping, page retirement), the PCIe
link, clock slowdowns and NVLink errors.

Runbook: docs/alerts.md, KubeGpuRowRemapPending to KubeGpuNvlinkErrors, with NVIDIA's sources
for each threshold. Every alert reads the card-level health families (docs/metrics.md), which a
MIG device repeats from its card; a GPU whose driver does not report a family (NotSupported) has
no such series, and its alert stays silent.
"""

from __future__ import annotations

from exporter.bundle.alerts.alert import Alert, Labels, by
from exporter.bundle.alerts.options import AlertOptions
from exporter.bundle.common import duration_seconds

# The clock event reasons (nvidia_gpu_clocks_event_reason{reason}) each slowdown alert watches: the status
# page's problems judge the same ones.
from exporter.exposition.thresholds import HARDWARE_REASONS, POWER_CAP_REASONS, THERMAL_REASONS

NVLINK_WINDOW = "5m"  # the NVLink and PCIe rates' window


def _reason(reasons: tuple[str, ...]) -> str:
    return f'nvidia_gpu_clocks_event_reason{{reason=~"{"|".join(reasons)}"}}'


def _gpu_desc(lb: Labels) -> str:
    """``GPU <minor> (<uuid>) on node <node> (<product>)``."""
    return f"{lb.gpu_desc} ({{{{ $labels.name }}}})"


def memory_alerts(opts: AlertOptions, lb: Labels) -> list[Alert]:
    """Memory repair: what needs a GPU reset, and what means the GPU must be replaced."""
    gpu, gpu_desc = by(lb.gpu_named), _gpu_desc(lb)
    return [
        Alert(
            "KubeGpuRowRemapPending",
            f"max {gpu} (nvidia_gpu_remapped_rows_pending) > 0",
            "warning",
            "A GPU has memory row remappings waiting for a GPU reset.",
            f"{gpu_desc} has memory rows marked for remapping after memory errors; the spare rows "
            "are only used after a GPU reset. Drain the GPU and reset it (nvidia-smi -r) or reboot the node.",
            "5m",
        ),
        Alert(
            "KubeGpuRowRemapFailure",
            f"max {gpu} (nvidia_gpu_remapped_rows_failure) > 0",
            "critical",
            "A GPU failed to remap a memory row (NVIDIA's RMA criterion).",
            f"{gpu_desc} could not remap a memory row with uncorrectable errors: it meets NVIDIA's RMA "
            "criterion for memory. Drain it, run the field diagnostic and have it replaced.",
            "1m",
        ),
        Alert(
            "KubeGpuPageRetirementPending",
            f"max {gpu} (nvidia_gpu_retired_pages_pending) > 0",
            "warning",
            "A GPU has memory pages waiting to be retired.",
            f"{gpu_desc} has memory pages marked for retirement after ECC errors; they are only taken out "
            "of use when the GPU is reset or the driver reloads. Drain the GPU and reset it or reboot the node.",
            "5m",
        ),
        Alert(
            "KubeGpuRetiredPagesLimit",
            # per cause first: a GPU scraped by two jobs must not count its pages twice
            f"sum {gpu} (max {by([*lb.gpu_named, 'cause'])} (nvidia_gpu_retired_pages)) "
            f">= {opts.retired_pages_limit}",
            "critical",
            "A GPU has retired as many memory pages as a board may before replacement.",
            f"{gpu_desc} has retired {{{{ $value }}}} memory pages (single- and double-bit ECC), at or over "
            f"the limit of {opts.retired_pages_limit}; drain it and have it replaced.",
            "1m",
        ),
    ]


def link_alerts(opts: AlertOptions, lb: Labels) -> list[Alert]:
    """The PCIe link, clock slowdowns held for long, NVLink errors."""
    gpu, gpu_desc, w = lb.gpu_named, _gpu_desc(lb), NVLINK_WINDOW
    per_minute = f"{opts.pcie_replays_per_minute:g}"
    held = opts.throttling_for
    crc_limit = opts.nvlink_crc_errors_per_second * duration_seconds(w)
    nvlink = [*gpu, "link", "type"]
    return [
        Alert(
            "KubeGpuPcieReplaysHigh",
            f"max {by(gpu)} (rate(nvidia_gpu_pcie_replays_total[{w}])) * 60 > {per_minute}",
            "warning",
            "A GPU's PCIe link keeps retransmitting packets.",
            f"{gpu_desc} replayed {{{{ $value | printf \"%.1f\" }}}} PCIe packets per minute over the last "
            f"{w} (limit {per_minute}/min); its PCIe link is degraded: reseat the card or check the riser and slot.",
            "5m",
        ),
        Alert(
            "KubeGpuThermalThrottling",
            f"max {by([*gpu, 'reason'])} ({_reason(THERMAL_REASONS)}) > 0",
            "warning",
            "A GPU has been slowing its clocks because of heat.",
            f"{gpu_desc} has slowed its clocks for heat ({{{{ $labels.reason }}}}) for {held}; the jobs on "
            "it run slower. Check its fans, airflow and the node's cooling.",
            held,
        ),
        Alert(
            "KubeGpuHardwareSlowdown",
            f"max {by([*gpu, 'reason'])} ({_reason(HARDWARE_REASONS)}) > 0",
            "warning",
            "A GPU's hardware protection has been cutting its clocks.",
            f"{gpu_desc} has had its clocks cut by half or more by the hardware ({{{{ $labels.reason }}}}) "
            f"for {held}: overheating, the power supply's brake signal or power spikes. Check the node's "
            "power supply and cooling.",
            held,
        ),
        Alert(
            "KubeGpuPowerThrottling",
            f"max {by([*gpu, 'reason'])} ({_reason(POWER_CAP_REASONS)}) > 0",
            "info",
            "A GPU has been held back by its power limit for long.",
            f"{gpu_desc} has kept its clocks down to stay under its power limit for {opts.power_capped_for}; "
            "its jobs are power-bound. Check that the limit (nvidia_gpu_power_limit_watts) was not lowered.",
            opts.power_capped_for,
        ),
        Alert(
            "KubeGpuNvlinkErrors",
            # errors in the window: CRC errors over the per-second limit, any replay or recovery
            f'max {by(nvlink)} (increase(nvidia_gpu_nvlink_errors_total{{type="crc"}}[{w}])) > {crc_limit:g}\n'
            f"or\n"
            f'max {by(nvlink)} (increase(nvidia_gpu_nvlink_errors_total{{type=~"replay|recovery"}}[{w}])) > 0',
            "warning",
            "A GPU's NVLink reports transmission errors.",
            f"NVLink {{{{ $labels.link }}}} of {gpu_desc} counted {{{{ $value | printf \"%.0f\" }}}} "
            f"{{{{ $labels.type }}}} errors in the last {w} (limits: any replay or recovery error, CRC errors "
            f"over {opts.nvlink_crc_errors_per_second:g}/s); check the link with nvidia-smi nvlink and run the "
            "field diagnostic.",
            "1m",
        ),
    ]
