"""What the alert bundle is rendered for: :class:`AlertOptions`, their defaults and validation."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.bundle.common import (
    K8S_NAME_RE,
    LABEL_FLAGS,
    LabelOptions,
    changed_flags,
    is_positive_duration,
)
from exporter.bundle.rules import RuleOptionsError
from exporter.exposition.label_names import label_name_error
from exporter.xid.parse import CATALOG as XID_CATALOG

DEFAULT_RUNBOOK_URL = "https://github.com/kube-gpu-exporter/kube-gpu-exporter/blob/main/docs/alerts.md"

# From the Xid catalog (exporter/xid/parse.py, docs/xid.md). Critical: severity "gpu" or "node", whose
# action is a GPU reset, an ECC or NVLink workflow or a node reboot. Application: "restart the
# application", the pod is at fault, not the GPU. "info" codes (43, 45, 63, 92, 154) need no action.
CRITICAL_XIDS: tuple[int, ...] = tuple(c for c, i in XID_CATALOG.items() if i.severity in ("gpu", "node"))
APPLICATION_XIDS: tuple[int, ...] = tuple(c for c, i in XID_CATALOG.items() if i.severity == "application")

_SELECTOR_RE = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*$')


class AlertOptionsError(RuleOptionsError):
    """Raised for option values that would render an invalid or misleading alert bundle."""


@dataclass(frozen=True)
class AlertOptions(LabelOptions):
    """What to render. Label names must match what the exporter was started with."""

    # Target label kept on every alert so Alertmanager can inhibit by scrape target.
    instance_label: str = "instance"
    # Matchers for the exporter's `up` series (the scrape job's name depends on the install).
    exporter_selector: str = 'job="kube-gpu-exporter"'
    runbook_url: str = DEFAULT_RUNBOOK_URL
    group_name: str = "kube-gpu-exporter-alerts"
    xid_window: str = "10m"
    critical_xids: tuple[int, ...] = CRITICAL_XIDS
    application_xids: tuple[int, ...] = APPLICATION_XIDS
    temperature_celsius: float = 85.0
    snapshot_stale_seconds: float = 60.0
    idle_for: str = "2h"
    idle_percent: float = 1.0
    # Hardware health (gpu_hardware.py; docs/alerts.md has NVIDIA's source for each default).
    retired_pages_limit: int = 60  # DCGM's health check fails a board at 60 (newer releases: 63)
    pcie_replays_per_minute: float = 8.0  # DCGM: "8 replays per minute is the maximum recommended"
    throttling_for: str = "15m"
    power_capped_for: str = "1h"
    nvlink_crc_errors_per_second: float = 100.0  # DCGM: CRC errors only matter at 100+ per second
    # KubeGpuRecordingRulesMissing: the dashboards and HPA read the recording rules (rules/).
    recording_rules_alert: bool = True
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise :class:`AlertOptionsError` with a message naming the offending option."""
        self.validate_labels(AlertOptionsError)
        problem = label_name_error("--instance-label", self.instance_label)
        if problem:
            raise AlertOptionsError(problem)
        if not all(_SELECTOR_RE.match(m) for m in _split_matchers(self.exporter_selector)):
            raise AlertOptionsError(
                f'--exporter-selector: {self.exporter_selector!r} must be label matchers like job="x"'
            )
        if not self.runbook_url.startswith(("http://", "https://")):
            raise AlertOptionsError(f"--runbook-url: {self.runbook_url!r} must be an http(s) URL")
        durations = (("--xid-window", self.xid_window), ("--idle-for", self.idle_for),
                     ("--throttling-for", self.throttling_for), ("--power-capped-for", self.power_capped_for))
        for flag, value in durations:
            if not is_positive_duration(value):
                raise AlertOptionsError(f"{flag}: {value!r} is not a positive Prometheus duration")
        limits = (("--retired-pages-limit", self.retired_pages_limit),
                  ("--pcie-replays-per-minute", self.pcie_replays_per_minute),
                  ("--nvlink-crc-errors-per-second", self.nvlink_crc_errors_per_second))
        for flag, number in limits:
            if not number > 0:
                raise AlertOptionsError(f"{flag}: {number!r} must be above 0")
        overlap = set(self.critical_xids) & set(self.application_xids)
        if overlap:
            raise AlertOptionsError(f"Xid(s) {sorted(overlap)} are both critical and application-level")
        if not self.critical_xids or not self.application_xids:
            raise AlertOptionsError("--critical-xids and --application-xids must not be empty")
        for key in self.extra_labels:
            if label_name_error("--alert-label", key) or key in ("severity", "alertname"):
                raise AlertOptionsError(f"--alert-label: {key!r} cannot be an alert label")
        if not K8S_NAME_RE.match(self.group_name):
            raise AlertOptionsError(f"group name {self.group_name!r} must be a lowercase DNS-style name")

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter alerts`` flags that reproduce these options (defaults omitted)."""
        out = changed_flags(self, _FLAGS)
        out += [f"--alert-label={k}={v}" for k, v in self.extra_labels.items()]
        return out


# Field -> flag, in the order the rendered header's command line lists them.
_FLAGS: tuple[tuple[str, str], ...] = (
    *LABEL_FLAGS,
    ("instance_label", "--instance-label"),
    ("exporter_selector", "--exporter-selector"),
    ("runbook_url", "--runbook-url"),
    ("xid_window", "--xid-window"),
    ("critical_xids", "--critical-xids"),
    ("application_xids", "--application-xids"),
    ("temperature_celsius", "--temperature-celsius"),
    ("idle_for", "--idle-for"),
    ("retired_pages_limit", "--retired-pages-limit"),
    ("pcie_replays_per_minute", "--pcie-replays-per-minute"),
    ("throttling_for", "--throttling-for"),
    ("power_capped_for", "--power-capped-for"),
    ("nvlink_crc_errors_per_second", "--nvlink-crc-errors-per-second"),
    ("recording_rules_alert", "--no-recording-rules-alert"),
)


def _split_matchers(selector: str) -> list[str]:
    # Commas inside quoted values must not split a matcher.
    return [m for m in re.findall(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+', selector) if m.strip()]
