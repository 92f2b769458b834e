"""A device's busy percent and where it comes from (rule 3's device value). Pure.

NVML gives a whole GPU's utilization; a MIG device has none, and on Hopper and newer its GPU
instance's GPM graphics activity is the same measure. The status tree names the source
(``utilization_source``) so the page and ``top`` can say "utilisation not available from NVML on
this GPU" instead of a silent dash.
"""

from __future__ import annotations

from exporter.model import DeviceSample


def device_utilization(d: DeviceSample) -> float | None:
    """The device's busy percent: NVML's utilization, or on a MIG device (which NVML gives none) its GPU
    instance's graphics engine activity (GPM, Hopper and newer), the same measure; None where neither is."""
    if d.utilization_gpu is not None:
        return float(d.utilization_gpu)
    gpm = d.health.gpm
    if d.parent_uuid is not None and gpm is not None and gpm.graphics_active is not None:
        return gpm.graphics_active * 100
    return None


# Where a device's busy percent comes from: the values of the status tree's utilization_source.
UTILIZATION_NVML = "nvml"  # nvmlDeviceGetUtilizationRates
UTILIZATION_GPM = "gpm"  # a MIG device's GPU instance's GPM (GRAPHICS_UTIL), Hopper and newer
UTILIZATION_UNAVAILABLE = "unavailable"  # neither: a MIG device before Hopper (A100, A30), NotSupported


def utilization_source(d: DeviceSample) -> str:
    """Which of the three :func:`device_utilization` reads on ``d`` this cycle (a lost GPU: unavailable)."""
    if d.utilization_gpu is not None:
        return UTILIZATION_NVML
    return UTILIZATION_UNAVAILABLE if device_utilization(d) is None else UTILIZATION_GPM
