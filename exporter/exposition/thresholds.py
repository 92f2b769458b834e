"""The judgement thresholds the alerts and the status page's problems share, declared once. Pure constants.

exporter/bundle/alerts/options.py takes its defaults from here (an operator may render the alerts with
others); exporter/exposition/problems.py judges a status tree with the same values, so that the page and
``top`` call a problem what the default alerts call one. No imports: ``top`` and the generators read it.
"""

from __future__ import annotations

# Xids: how far back "recent" reaches (KubeGpuXidCritical, KubeGpuXidApplication), and which catalog
# severities (exporter/xid/parse.py) are critical (the GPU or the node needs an operator) or the pod's.
XID_WINDOW_SECONDS = 600.0
XID_WINDOW = f"{XID_WINDOW_SECONDS / 60:g}m"  # the alerts' Prometheus duration
CRITICAL_XID_SEVERITIES = ("gpu", "node")
APPLICATION_XID_SEVERITIES = ("application",)

TEMPERATURE_CELSIUS = 85.0  # KubeGpuTemperatureHigh fires above it
RETIRED_PAGES_LIMIT = 60  # KubeGpuRetiredPagesLimit: DCGM fails a board at 60 retired pages
IDLE_PERCENT = 1.0  # KubeGpuAllocatedIdle: a grant whose container uses under this SM % is idle
SNAPSHOT_STALE_SECONDS = 60.0  # KubeGpuExporterSnapshotStale

# The clocks event reasons each slowdown alert watches (KubeGpuThermalThrottling, KubeGpuHardwareSlowdown,
# KubeGpuPowerThrottling); any other reason held (gpu_idle, applications_clocks_setting, ...) is no problem.
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
HARDWARE_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
POWER_CAP_REASONS = ("sw_power_cap",)
