"""Alerts on the GPUs: lost, Xid errors (GPU-level and application-level), heat, uncorrected ECC.

Runbook: docs/alerts.md, KubeGpuLost to KubeGpuEccUncorrectedErrors. Which Xids are which comes
from the options (default: the Xid catalog, see :mod:`exporter.bundle.alerts.options`).
"""

from __future__ import annotations

from collections.abc import Sequence

from exporter.bundle.alerts.alert import Alert, Labels, by, on, spelled
from exporter.bundle.alerts.options import AlertOptions
from exporter.bundle.common import duration_seconds


def xid_expr(codes: Sequence[int], keys: list[str], window: str, lb: Labels) -> str:
    """Xid errors among ``codes`` in the last ``window``, counted per ``keys``."""
    sel = f'nvidia_gpu_xid_errors_total{{xid=~"{"|".join(map(str, codes))}"}}'
    card = [*lb.cluster, lb.node, "uuid", "minor_number"]
    window_s = f"{duration_seconds(window):g}"
    # increase() cannot see a series' first sample, and an Xid counter is born at 1: a
    # series that did not exist one window ago is new too, if its GPU's last Xid is recent
    # (that guard keeps a restarted Prometheus from treating every old series as new).
    return (
        f"sum {by(keys)} (\n"
        f"  max {by([*keys, lb.namespace, lb.pod, lb.container])} (\n"
        f"    (increase({sel}[{window}]) > 0)\n"
        f"    or\n"
        f"    (\n"
        f"      ({sel} unless {sel} offset {window})\n"
        f"      and {on(card)}\n"
        f"      (time() - max {by(card)} (nvidia_gpu_last_xid_timestamp_seconds) < {window_s})\n"
        f"    )\n"
        f"  )\n"
        f")"
    )


def gpu_alerts(opts: AlertOptions, lb: Labels) -> list[Alert]:
    """One alert per GPU (and, for application Xids, per pod) that is broken or at risk."""
    gpu, gpu_desc, window = lb.gpu, lb.gpu_desc, opts.xid_window
    return [
        Alert(
            "KubeGpuLost",
            f"min {by(lb.gpu_named)} (nvidia_gpu_up) == 0",
            "critical",
            "A GPU is lost (NVML reports GPU_IS_LOST).",
            f"{gpu_desc} ({{{{ $labels.name }}}}) is lost; workloads on it fail and it needs a reset "
            "or a node reboot.",
            "1m",
        ),
        Alert(
            "KubeGpuXidCritical",
            xid_expr(opts.critical_xids, [*gpu, "xid"], window, lb),
            "critical",
            "A GPU reported a node- or GPU-level Xid error.",
            f"{gpu_desc} reported Xid {{{{ $labels.xid }}}} {{{{ $value | printf \"%.0f\" }}}} time(s) "
            f"in the last {window}; the GPU needs a reset, an ECC/NVLink workflow or a node reboot.",
            "1m",
        ),
        Alert(
            "KubeGpuXidApplication",
            # Kept per pod: the runbook's action is restarting the application that raised it.
            lb.for_container(
                xid_expr(opts.application_xids, [*gpu, lb.namespace, lb.pod, lb.container, "xid"], window, lb)
            ),
            "warning",
            "A GPU application triggered an Xid error.",
            f"Xid {{{{ $labels.xid }}}} on {gpu_desc}, {{{{ $value | printf \"%.0f\" }}}} time(s) in the "
            f"last {window}, raised by {lb.in_pod}; the application should be restarted.",
            "1m",
        ),
        Alert(
            "KubeGpuTemperatureHigh",
            f"max {by(lb.gpu_named)} (nvidia_gpu_temperature_celsius) > {opts.temperature_celsius:g}",
            "warning",
            "A GPU is running hot.",
            f"{gpu_desc} ({{{{ $labels.name }}}}) has been above {opts.temperature_celsius:g} °C for "
            f"{spelled(opts.temperature_for)} (now {{{{ $value }}}} °C); expect clock throttling.",
            opts.temperature_for,
        ),
        Alert(
            "KubeGpuEccUncorrectedErrors",
            f'max {by(lb.gpu_named)} (nvidia_gpu_ecc_errors{{type="uncorrected"}}) > 0',
            "critical",
            "A GPU has uncorrected ECC errors.",
            f"{gpu_desc} has counted {{{{ $value }}}} uncorrected ECC error(s) since the driver "
            "loaded; data on it may be corrupt. Drain the node and reset the GPU.",
            "1m",
        ),
    ]
