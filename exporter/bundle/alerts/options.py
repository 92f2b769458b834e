"""What the alert bundle is rendered for: :data:`ALERT_OPTIONS`, the table of every option and threshold.

Each entry (an :class:`~exporter.bundle.option_table.Option`) is a field of :class:`AlertOptions` with
its default, its ``kube-gpu-exporter alerts`` flag and ``--help`` (if it has one), its check, its row
of docs/alerts.md's options table (written by scripts/generate.sh) and the alerts that show it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from exporter.bundle.common import (
    K8S_NAME_RE,
    Error,
    LabelOptions,
    is_positive_duration,
    label_options,
    parse_key_values,
)
from exporter.bundle.option_table import Option, check_options, option_args, options_dataclass
from exporter.bundle.rules import RuleOptionsError
from exporter.exposition import thresholds as judge
from exporter.exposition.label_names import label_name_error
from exporter.xid.parse import CATALOG as XID_CATALOG

DEFAULT_RUNBOOK_URL = "https://github.com/kube-gpu-exporter/kube-gpu-exporter/blob/main/docs/alerts.md"

# From the Xid catalog (exporter/xid/parse.py, docs/xid.md). Critical: severity "gpu" or "node", whose
# action is a GPU reset, an ECC or NVLink workflow or a node reboot. Application: "restart the
# application", the pod is at fault, not the GPU. "info" codes (43, 45, 63, 92, 154) need no action.
# The severities are exporter/exposition/thresholds.py's: the status page's problems judge Xids alike.
CRITICAL_XIDS: tuple[int, ...] = tuple(c for c, i in XID_CATALOG.items() if i.severity in judge.CRITICAL_XID_SEVERITIES)
APPLICATION_XIDS: tuple[int, ...] = tuple(c for c, i in XID_CATALOG.items()
                                          if i.severity in judge.APPLICATION_XID_SEVERITIES)

_SELECTOR_RE = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*$')


class AlertOptionsError(RuleOptionsError):
    """Raised for option values that would render an invalid or misleading alert bundle."""


def _split_matchers(selector: str) -> list[str]:
    # Commas inside quoted values must not split a matcher.
    return [m for m in re.findall(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+', selector) if m.strip()]


def _parse_xids(text: str, flag: str, error: Error) -> tuple[int, ...]:
    try:
        codes = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise error(f"{flag}: {text!r} must be comma-separated Xid numbers") from None
    if any(c <= 0 for c in codes):
        raise error(f"{flag}: Xid numbers are positive")
    return codes


def _labels(items: list[str], flag: str, error: Error) -> dict[str, str]:
    return parse_key_values(items, flag, error)


def _above_zero(number: Any) -> bool:
    return number > 0  # NaN is not


_DURATION = {"check": is_positive_duration, "why": "is not a positive Prometheus duration"}
_LIMIT = {"check": _above_zero, "why": "must be above 0"}
_FOR = "`for:`"

# Defaults shared with the status page's problems come from exporter/exposition/thresholds.py.
# Order: the flags' in --help and in a rendering's header (reordering changes the committed files).
ALERT_OPTIONS: tuple[Option, ...] = (
    Option("instance_label", "instance", "scrape-target label kept on every alert, for inhibition (default "
           "%(default)s)", "--instance-label", doc="the scrape-target label every GPU alert keeps, used by the "
           "example's inhibition", check=lambda v: label_name_error("", v) is None,
           why="is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"),
    # The exporter's `up` series (the scrape job's name depends on the install).
    Option("exporter_selector", 'job="kube-gpu-exporter"', "matchers selecting the exporter's `up` series "
           "(default %(default)s)", "--exporter-selector", doc="label matchers selecting the exporter's `up` "
           "series (KubeGpuExporterDown, KubeGpuExporterTargetMissing)",
           check=lambda v: all(_SELECTOR_RE.match(m) for m in _split_matchers(v)),
           why='must be label matchers like job="x"', free_text=True,
           alerts=("KubeGpuExporterDown", "KubeGpuExporterTargetMissing")),
    Option("runbook_url", DEFAULT_RUNBOOK_URL, "URL of docs/alerts.md (default %(default)s)", "--runbook-url",
           doc="base of every `runbook_url`; `#<alertname in lower case>` is appended",
           doc_default="this file on GitHub", check=lambda v: v.startswith(("http://", "https://")),
           why="must be an http(s) URL", free_text=True),
    Option("group_name", "kube-gpu-exporter-alerts", "the rule group's name", check=K8S_NAME_RE.match,
           why="must be a lowercase DNS-style name"),
    Option("xid_window", judge.XID_WINDOW, "Xid alert window (default %(default)s)", "--xid-window",
           doc="how far back the Xid alerts look, and how long they stay after the last Xid", **_DURATION,
           alerts=("KubeGpuXidCritical", "KubeGpuXidApplication")),
    Option("critical_xids", CRITICAL_XIDS, "node/GPU-level Xids, critical (default %(default)s)", "--critical-xids",
           doc="Xids for KubeGpuXidCritical: the catalog's `gpu` and `node` codes", convert=_parse_xids,
           alerts=("KubeGpuXidCritical",)),
    Option("application_xids", APPLICATION_XIDS, "application Xids, warning with the pod (default %(default)s)",
           "--application-xids", doc="Xids for KubeGpuXidApplication: the catalog's `application` codes",
           convert=_parse_xids, alerts=("KubeGpuXidApplication",)),
    Option("temperature_celsius", judge.TEMPERATURE_CELSIUS, "GPU temperature threshold (default %(default)s)",
           "--temperature-celsius",
           doc="KubeGpuTemperatureHigh threshold", argtype=float, alerts=("KubeGpuTemperatureHigh",)),
    Option("temperature_for", "10m", f"KubeGpuTemperatureHigh {_FOR}", **_DURATION, alerts=("KubeGpuTemperatureHigh",)),
    Option("snapshot_stale_seconds", judge.SNAPSHOT_STALE_SECONDS,
           "the snapshot age KubeGpuExporterSnapshotStale fires above", **_LIMIT,
           alerts=("KubeGpuExporterSnapshotStale",)),
    Option("idle_for", "2h", "how long an allocation may sit idle (default %(default)s)", "--idle-for",
           doc=f"KubeGpuAllocatedIdle {_FOR}", **_DURATION, alerts=("KubeGpuAllocatedIdle",)),
    Option("idle_percent", judge.IDLE_PERCENT,
           "the duty cycle (%) under which KubeGpuAllocatedIdle calls an allocation idle",
           **_LIMIT, alerts=("KubeGpuAllocatedIdle",)),
    # Hardware health (gpu_hardware.py; docs/alerts.md has NVIDIA's source for each default).
    # DCGM's health check fails a board at 60 retired pages (newer releases: 63).
    Option("retired_pages_limit", judge.RETIRED_PAGES_LIMIT,
           "retired pages at which a GPU is to be replaced (default %(default)s)",
           "--retired-pages-limit", doc="KubeGpuRetiredPagesLimit: retired pages (both causes) at which a GPU is "
           "to be replaced", argtype=int, **_LIMIT, alerts=("KubeGpuRetiredPagesLimit",)),
    # DCGM: "8 replays per minute is the maximum recommended".
    Option("pcie_replays_per_minute", 8.0, "PCIe replay rate threshold (default %(default)s)",
           "--pcie-replays-per-minute", doc="KubeGpuPcieReplaysHigh: the mean replay rate over 5 minutes it fires "
           "above", argtype=float, **_LIMIT, alerts=("KubeGpuPcieReplaysHigh",)),
    Option("throttling_for", "15m", "how long a thermal or hardware slowdown lasts before it alerts (default "
           "%(default)s)", "--throttling-for", doc=f"KubeGpuThermalThrottling and KubeGpuHardwareSlowdown {_FOR}",
           **_DURATION, alerts=("KubeGpuThermalThrottling", "KubeGpuHardwareSlowdown")),
    Option("power_capped_for", "1h", "how long a GPU stays at its power cap before the info alert (default "
           "%(default)s)", "--power-capped-for", doc=f"KubeGpuPowerThrottling {_FOR}", **_DURATION,
           alerts=("KubeGpuPowerThrottling",)),
    # DCGM: CRC errors only matter at 100+ per second.
    Option("nvlink_crc_errors_per_second", 100.0, "NVLink CRC error rate threshold (default %(default)s)",
           "--nvlink-crc-errors-per-second", doc="KubeGpuNvlinkErrors: the CRC error rate it fires above (replay "
           "and recovery errors: any)", argtype=float, **_LIMIT, alerts=("KubeGpuNvlinkErrors",)),
    Option("exporter_down_for", "5m", f"KubeGpuExporterDown {_FOR}", **_DURATION, alerts=("KubeGpuExporterDown",)),
    Option("target_missing_for", "15m", f"KubeGpuExporterTargetMissing {_FOR}", **_DURATION,
           alerts=("KubeGpuExporterTargetMissing",)),
    Option("nvml_down_for", "5m", f"KubeGpuNvmlDown {_FOR}", **_DURATION, alerts=("KubeGpuNvmlDown",)),
    Option("pod_cache_for", "10m", f"KubeGpuExporterPodCacheNotSynced {_FOR}", **_DURATION,
           alerts=("KubeGpuExporterPodCacheNotSynced",)),
    Option("unaccounted_for", "15m", f"KubeGpuUnaccountedProcesses {_FOR}", **_DURATION,
           alerts=("KubeGpuUnaccountedProcesses",)),
    Option("recording_rules_for", "15m", f"KubeGpuRecordingRulesMissing {_FOR}", **_DURATION,
           alerts=("KubeGpuRecordingRulesMissing",)),
    # KubeGpuRecordingRulesMissing: the dashboards and HPA read the recording rules (rules/).
    Option("recording_rules_alert", True, "omit KubeGpuRecordingRulesMissing (when the recording rules are not "
           "loaded)", "--no-recording-rules-alert", doc="leave out KubeGpuRecordingRulesMissing", doc_default="off",
           store_false=True, alerts=("KubeGpuRecordingRulesMissing",)),
    Option("extra_labels", None, "extra label on every alert, repeatable (e.g. team=ml-platform)", "--alert-label",
           doc="an extra label on every alert (repeatable), e.g. `team=ml-platform` for routing", doc_default="none",
           convert=_labels, repeat=True, metavar="KEY=VALUE", free_text=True, factory=dict),
)  # fmt: skip
# The whole `kube-gpu-exporter alerts` table: the label flags, then the alerts' own.
ALERT_TABLE: tuple[Option, ...] = (
    *label_options("label telling clusters apart (default: none)", "a label that tells clusters apart; every "
                   "aggregation keeps it. It must be on the scraped series (target label, relabeling), as for the "
                   "recording rules"),
    *ALERT_OPTIONS,
)


@options_dataclass(ALERT_OPTIONS)
class AlertOptions(LabelOptions):
    """What to render (one field per :data:`ALERT_OPTIONS` entry). Label names must match the exporter's."""

    def validate(self) -> None:
        """Raise :class:`AlertOptionsError` with a message naming the offending option."""
        self.validate_labels(AlertOptionsError)
        check_options(self, ALERT_OPTIONS, AlertOptionsError)
        overlap = set(self.critical_xids) & set(self.application_xids)
        if overlap:
            raise AlertOptionsError(f"Xid(s) {sorted(overlap)} are both critical and application-level")
        if not self.critical_xids or not self.application_xids:
            raise AlertOptionsError("--critical-xids and --application-xids must not be empty")
        extra: Mapping[str, str] = self.extra_labels
        for key in extra:
            if label_name_error("--alert-label", key) or key in ("severity", "alertname"):
                raise AlertOptionsError(f"--alert-label: {key!r} cannot be an alert label")

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter alerts`` flags that reproduce these options (defaults omitted)."""
        return option_args(self, ALERT_TABLE)
