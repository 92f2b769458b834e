"""Render the GPU alerting rules (plain rule file or PrometheusRule) as code.

Alerts are built in Python rather than jinja2 because their annotations are Go templates
(``{{ $labels.x }}``), which would need escaping in every jinja2 line. The rendered default
is committed as ``alerts/kube-gpu-exporter.alerts.yaml``; the runbook is docs/alerts.md.
Run ``kube-gpu-exporter alerts --help`` for the options.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.bundle.common import (
    K8S_NAME_RE,
    LABEL_FLAGS,
    LABEL_RE,
    LabelOptions,
    add_label_arguments,
    add_prometheusrule_arguments,
    changed_flags,
    command_line,
    dump_yaml,
    duration_seconds,
    is_positive_duration,
    label_arguments,
    metadata_args,
    object_metadata,
    parse_key_values,
    rule_file_main,
)
from exporter.bundle.rules import RuleOptionsError
from exporter.xid.parse import CATALOG as XID_CATALOG

DEFAULT_RUNBOOK_URL = "https://github.com/kube-gpu-exporter/kube-gpu-exporter/blob/main/docs/alerts.md"

# From the Xid catalog (exporter/xid/parse.py, docs/xid.md). Critical: severity "gpu" or "node", whose
# action is a GPU reset, an ECC or NVLink workflow or a node reboot. Application: "restart the
# application", the pod is at fault, not the GPU. "info" codes (43, 45, 63, 92, 154) need no action.
CRITICAL_XIDS: tuple[int, ...] = tuple(c for c, i in XID_CATALOG.items() if i.severity in ("gpu", "node"))
APPLICATION_XIDS: tuple[int, ...] = tuple(c for c, i in XID_CATALOG.items() if i.severity == "application")

SEVERITIES: frozenset[str] = frozenset({"critical", "warning", "info"})
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
    # KubeGpuRecordingRulesMissing: the dashboards and HPA read the recording rules (rules/).
    recording_rules_alert: bool = True
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise :class:`AlertOptionsError` with a message naming the offending option."""
        self.validate_labels(AlertOptionsError)
        if not LABEL_RE.match(self.instance_label):
            raise AlertOptionsError(f"--instance-label: {self.instance_label!r} is not a valid label name")
        if not all(_SELECTOR_RE.match(m) for m in _split_matchers(self.exporter_selector)):
            raise AlertOptionsError(
                f'--exporter-selector: {self.exporter_selector!r} must be label matchers like job="x"'
            )
        if not self.runbook_url.startswith(("http://", "https://")):
            raise AlertOptionsError(f"--runbook-url: {self.runbook_url!r} must be an http(s) URL")
        for flag, value in (("--xid-window", self.xid_window), ("--idle-for", self.idle_for)):
            if not is_positive_duration(value):
                raise AlertOptionsError(f"{flag}: {value!r} is not a positive Prometheus duration")
        overlap = set(self.critical_xids) & set(self.application_xids)
        if overlap:
            raise AlertOptionsError(f"Xid(s) {sorted(overlap)} are both critical and application-level")
        if not self.critical_xids or not self.application_xids:
            raise AlertOptionsError("--critical-xids and --application-xids must not be empty")
        for key in self.extra_labels:
            if not LABEL_RE.match(key) or key in ("severity", "alertname"):
                raise AlertOptionsError(f"--alert-label: {key!r} cannot be an alert label")
        if not K8S_NAME_RE.match(self.group_name):
            raise AlertOptionsError(f"group name {self.group_name!r} must be a lowercase DNS-style name")

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter alerts`` flags that reproduce these options (defaults omitted)."""
        out = changed_flags(self, _FLAGS)
        out += [f"--alert-label={k}={v}" for k, v in self.extra_labels.items()]
        return out


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
    ("recording_rules_alert", "--no-recording-rules-alert"),
)


def _split_matchers(selector: str) -> list[str]:
    # Commas inside quoted values must not split a matcher.
    return [m for m in re.findall(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+', selector) if m.strip()]


@dataclass(frozen=True)
class Alert:
    """One alerting rule; ``anchor`` is its section in docs/alerts.md."""

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str  # every alert waits a little: one bad scrape or evaluation never pages

    @property
    def anchor(self) -> str:
        return self.name.lower()


def _by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(dict.fromkeys(labels))})"


def _on(labels: Sequence[str]) -> str:
    return f"on ({', '.join(labels)})"


def build_alerts(opts: AlertOptions) -> list[Alert]:
    """The alert list for ``opts`` (validated by the caller)."""
    cl = [opts.cluster_label] if opts.cluster_label else []
    node, ns, pod, ctr, inst = (
        opts.node_label, opts.namespace_label, opts.pod_label, opts.container_label, opts.instance_label,
    )  # fmt: skip
    gpu = [*cl, inst, node, "uuid", "minor_number"]  # one GPU as reported by one exporter
    gpu_named = [*gpu, "name"]
    ctr_keys = [*cl, inst, node, ns, pod, ctr]
    where = f"{{{{ $labels.{node} }}}}"
    gpu_desc = f"GPU {{{{ $labels.minor_number }}}} ({{{{ $labels.uuid }}}}) on node {where}"
    who = f"{{{{ $labels.{ns} }}}}/{{{{ $labels.{pod} }}}}"
    target = f"{{{{ $labels.{inst} }}}}"
    # Processes outside any pod carry empty pod labels, which Prometheus drops.
    in_pod = (
        f"{{{{ if $labels.{pod} }}}}pod {who} (container {{{{ $labels.{ctr} }}}})"
        "{{ else }}a process outside any pod{{ end }}"
    )
    owner = (
        f"{{{{ if $labels.{pod} }}}}of pod {who} (container {{{{ $labels.{ctr} }}}})"
        "{{ else }}outside any pod{{ end }}"
    )
    window = opts.xid_window
    window_s = f"{duration_seconds(window):g}"

    def xid_expr(codes: Sequence[int], keys: list[str]) -> str:
        sel = f'nvidia_gpu_xid_errors_total{{xid=~"{"|".join(map(str, codes))}"}}'
        card = [*cl, node, "uuid", "minor_number"]
        # increase() cannot see a series' first sample, and an Xid counter is born at 1: a
        # series that did not exist one window ago is new too, if its GPU's last Xid is recent
        # (that guard keeps a restarted Prometheus from treating every old series as new).
        return (
            f"sum {_by(keys)} (\n"
            f"  max {_by([*keys, ns, pod, ctr])} (\n"
            f"    (increase({sel}[{window}]) > 0)\n"
            f"    or\n"
            f"    (\n"
            f"      ({sel} unless {sel} offset {window})\n"
            f"      and {_on(card)}\n"
            f"      (time() - max {_by(card)} (nvidia_gpu_last_xid_timestamp_seconds) < {window_s})\n"
            f"    )\n"
            f"  )\n"
            f")"
        )

    alerts = [
        Alert(
            "KubeGpuExporterDown",
            f"up{{{opts.exporter_selector}}} == 0",
            "warning",
            "A kube-gpu-exporter target is down.",
            f"Prometheus has failed to scrape kube-gpu-exporter at {target} for 5 minutes; "
            "GPU usage of that node is not being recorded.",
            "5m",
        ),
        Alert(
            "KubeGpuExporterTargetMissing",
            f"absent(up{{{opts.exporter_selector}}})",
            "warning",
            "No kube-gpu-exporter target is being scraped.",
            f"Prometheus has discovered no target matching {{{opts.exporter_selector}}} for 15 minutes; "
            "no GPU metrics are being collected.",
            "15m",
        ),
        Alert(
            "KubeGpuNvmlDown",
            "kube_gpu_exporter_nvml_up == 0",
            "critical",
            "kube-gpu-exporter cannot initialise NVML.",
            f"kube-gpu-exporter at {target} has not been able to initialise NVML for 5 minutes; "
            "the NVIDIA driver on that node is probably unloaded or broken.",
            "5m",
        ),
        Alert(
            "KubeGpuLost",
            f"min {_by(gpu_named)} (nvidia_gpu_up) == 0",
            "critical",
            "A GPU is lost (NVML reports GPU_IS_LOST).",
            f"{gpu_desc} ({{{{ $labels.name }}}}) is lost; workloads on it fail and it needs a reset "
            "or a node reboot.",
            "1m",
        ),
        Alert(
            "KubeGpuXidCritical",
            xid_expr(opts.critical_xids, [*gpu, "xid"]),
            "critical",
            "A GPU reported a node- or GPU-level Xid error.",
            f"{gpu_desc} reported Xid {{{{ $labels.xid }}}} {{{{ $value | printf \"%.0f\" }}}} time(s) "
            f"in the last {window}; the GPU needs a reset, an ECC/NVLink workflow or a node reboot.",
            "1m",
        ),
        Alert(
            "KubeGpuXidApplication",
            xid_expr(opts.application_xids, [*gpu, ns, pod, ctr, "xid"]),
            "warning",
            "A GPU application triggered an Xid error.",
            f"Xid {{{{ $labels.xid }}}} on {gpu_desc}, {{{{ $value | printf \"%.0f\" }}}} time(s) in the "
            f"last {window}, raised by {in_pod}; the application should be restarted.",
            "1m",
        ),
        Alert(
            "KubeGpuTemperatureHigh",
            f"max {_by(gpu_named)} (nvidia_gpu_temperature_celsius) > {opts.temperature_celsius:g}",
            "warning",
            "A GPU is running hot.",
            f"{gpu_desc} ({{{{ $labels.name }}}}) has been above {opts.temperature_celsius:g} °C for "
            "10 minutes (now {{ $value }} °C); expect clock throttling.",
            "10m",
        ),
        Alert(
            "KubeGpuEccUncorrectedErrors",
            f'max {_by(gpu_named)} (nvidia_gpu_ecc_errors{{type="uncorrected"}}) > 0',
            "critical",
            "A GPU has uncorrected ECC errors.",
            f"{gpu_desc} has counted {{{{ $value }}}} uncorrected ECC error(s) since the driver "
            "loaded; data on it may be corrupt. Drain the node and reset the GPU.",
            "1m",
        ),
        Alert(
            "KubeGpuExporterSnapshotStale",
            f"kube_gpu_exporter_snapshot_age_seconds > {opts.snapshot_stale_seconds:g}\n"
            f"or\nincrease(kube_gpu_exporter_samples_total[5m]) == 0",
            "warning",
            "kube-gpu-exporter serves stale GPU metrics.",
            f"kube-gpu-exporter at {target} has not completed a sampling cycle for over 5 minutes; "
            "the values it serves are old.",
            "5m",
        ),
        Alert(
            "KubeGpuExporterPodCacheNotSynced",
            "kube_gpu_exporter_pod_cache_synced == 0",
            "warning",
            "kube-gpu-exporter has no pod view from the API server.",
            f"kube-gpu-exporter at {target} has not synced its pod cache for 10 minutes; GPU usage "
            "cannot be attributed to pods.",
            "10m",
        ),
        Alert(
            "KubeGpuExporterPodSyncErrors",
            "increase(kube_gpu_exporter_pod_sync_errors_total[15m]) > 0",
            "warning",
            "kube-gpu-exporter keeps failing to list or watch pods.",
            f"kube-gpu-exporter at {target} has had pod list/watch errors for 15 minutes "
            "({{ $value | printf \"%.0f\" }} in the last 15 minutes); pod attribution may be out of date.",
            "15m",
        ),
        Alert(
            "KubeGpuUnaccountedProcesses",
            f"count {_by([*gpu, ns, pod, ctr])} (\n"
            "  nvidia_gpu_unaccounted_process_memory_used_bytes\n"
            "  or nvidia_gpu_unaccounted_process_duty_cycle\n"
            ")",
            "warning",
            "Processes use a GPU without an allocation.",
            f"{{{{ $value }}}} process(es) {owner} have used {gpu_desc} for 15 minutes without "
            "being allocated it; they compete with the pods that were.",
            "15m",
        ),
        Alert(
            "KubeGpuContainerOverMemoryGrant",
            f"max {_by([*ctr_keys, 'uuid', 'minor_number'])} "
            f'(nvidia_gpu_memory_used_bytes{{allocate_mode="share"}})\n'
            f"* 100 /\n"
            f"(max {_by([*ctr_keys, 'uuid', 'minor_number'])} (nvidia_gpu_gpu_sharing_memory) > 0)\n"
            f"> 100",
            "warning",
            "A container on a shared GPU uses more memory than it was granted.",
            f"Container {{{{ $labels.{ctr} }}}} of pod {who} uses {{{{ $value | printf \"%.0f\" }}}}% of the "
            f"GPU memory it was granted on {gpu_desc}; it can starve the other containers on that GPU.",
            "5m",
        ),
        Alert(
            "KubeGpuAllocatedIdle",
            f"sum {_by(ctr_keys)} (nvidia_gpu_allocated_compute_percent) / 100\n"
            f"and {_on(ctr_keys)}\n"
            f'(sum {_by(ctr_keys)} (nvidia_gpu_duty_cycle{{allocate_mode=~"exclusive|share"}}) '
            f"< {opts.idle_percent:g})\n"
            f"and {_on(ctr_keys)}\n"
            f"(sum {_by(ctr_keys)} (nvidia_gpu_allocated_compute_percent) > 0)",
            "info",
            "GPUs are allocated to a container that does not use them.",
            f"Container {{{{ $labels.{ctr} }}}} of pod {who} on node {where} holds {{{{ $value }}}} GPU(s) "
            f"and has used less than {opts.idle_percent:g}% of them for {opts.idle_for}; the allocation "
            "could go to someone else.",
            opts.idle_for,
        ),
    ]
    if opts.recording_rules_alert:
        node_keys = [*cl, inst, node]
        alerts.append(
            Alert(
                "KubeGpuRecordingRulesMissing",
                f"count {_by(node_keys)} (nvidia_gpu_num_devices)\n"
                f"unless {_on([*cl, node])}\n"
                "kube_node_status_capacity_gpu",
                "warning",
                "GPU metrics are scraped but the GPU recording rules produce nothing.",
                f"Node {where} exports GPU metrics, but the recording rules of kube-gpu-exporter have not "
                "recorded kube_node_status_capacity_gpu for it for 15 minutes; the GPU dashboards and the "
                "HPA metrics built on the k8s_* series are empty or incomplete.",
                "15m",
            )
        )
    return alerts


def _rule(alert: Alert, opts: AlertOptions) -> dict[str, object]:
    rule: dict[str, object] = {"alert": alert.name, "expr": alert.expr, "for": alert.for_}
    rule["labels"] = {"severity": alert.severity, **dict(opts.extra_labels)}
    rule["annotations"] = {
        "summary": alert.summary,
        "description": alert.description,
        "runbook_url": f"{opts.runbook_url}#{alert.anchor}",
    }
    return rule


def _groups(opts: AlertOptions) -> list[dict[str, object]]:
    opts.validate()
    return [{"name": opts.group_name, "rules": [_rule(a, opts) for a in build_alerts(opts)]}]


def _header(args: Sequence[str]) -> str:
    return (
        f"# Generated by `{command_line('alerts', args)}`: do not edit by hand.\n"
        "# GPU alerts for kube-gpu-exporter; the runbook is docs/alerts.md.\n"
    )


def render_alerts(opts: AlertOptions) -> str:
    """Return the plain Prometheus rule file (``groups:``) with the alerts for ``opts``."""
    groups = _groups(opts)
    return _header(opts.to_args()) + dump_yaml({"groups": groups})


def render_prometheusrule(
    opts: AlertOptions,
    name: str = "kube-gpu-exporter-alerts",
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Return the alerts wrapped in a ``monitoring.coreos.com/v1`` PrometheusRule object."""
    groups = _groups(opts)
    meta = object_metadata(name, namespace, labels, AlertOptionsError)
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta,
           "spec": {"groups": groups}}  # fmt: skip
    args = ["--format=prometheusrule", *opts.to_args()]
    if name != "kube-gpu-exporter-alerts":
        args.append(f"--name={name}")
    args += metadata_args(namespace, labels)
    return _header(args) + dump_yaml(doc)


def _parse_xids(text: str, flag: str) -> tuple[int, ...]:
    try:
        codes = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise AlertOptionsError(f"{flag}: {text!r} must be comma-separated Xid numbers") from None
    if any(c <= 0 for c in codes):
        raise AlertOptionsError(f"{flag}: Xid numbers are positive")
    return codes


def build_parser() -> argparse.ArgumentParser:
    """The ``kube-gpu-exporter alerts`` argument parser."""
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter alerts",
        description="Render the GPU alerting rules (runbook: docs/alerts.md).",
    )
    d = AlertOptions()
    add_label_arguments(p, "label telling clusters apart (default: none)")
    p.add_argument("--instance-label", default=d.instance_label,
                   help="scrape-target label kept on every alert, for inhibition (default %(default)s)")
    p.add_argument("--exporter-selector", default=d.exporter_selector,
                   help="matchers selecting the exporter's `up` series (default %(default)s)")
    p.add_argument("--runbook-url", default=d.runbook_url, help="URL of docs/alerts.md (default %(default)s)")
    p.add_argument("--xid-window", default=d.xid_window, help="Xid alert window (default %(default)s)")
    p.add_argument("--critical-xids", default=",".join(map(str, d.critical_xids)),
                   help="node/GPU-level Xids, critical (default %(default)s)")
    p.add_argument("--application-xids", default=",".join(map(str, d.application_xids)),
                   help="application Xids, warning with the pod (default %(default)s)")
    p.add_argument("--temperature-celsius", type=float, default=d.temperature_celsius,
                   help="GPU temperature threshold (default %(default)s)")
    p.add_argument("--idle-for", default=d.idle_for, help="how long an allocation may sit idle (default %(default)s)")
    p.add_argument("--no-recording-rules-alert", dest="recording_rules_alert", action="store_false",
                   help="omit KubeGpuRecordingRulesMissing (when the recording rules are not loaded)")
    add_prometheusrule_arguments(p, "kube-gpu-exporter-alerts", "PrometheusRule metadata label, repeatable")
    p.add_argument("--alert-label", action="append", default=[], metavar="KEY=VALUE",
                   help="extra label on every alert, repeatable (e.g. team=ml-platform)")
    p.add_argument("-o", "--output", default="-", help="output file (default stdout)")
    return p  # fmt: skip


def options_from_args(args: argparse.Namespace) -> AlertOptions:
    """Translate parsed CLI arguments into :class:`AlertOptions` (not yet validated)."""
    return AlertOptions(
        **label_arguments(args),
        instance_label=args.instance_label,
        exporter_selector=args.exporter_selector,
        runbook_url=args.runbook_url,
        xid_window=args.xid_window,
        critical_xids=_parse_xids(args.critical_xids, "--critical-xids"),
        application_xids=_parse_xids(args.application_xids, "--application-xids"),
        temperature_celsius=args.temperature_celsius,
        idle_for=args.idle_for,
        recording_rules_alert=args.recording_rules_alert,
        extra_labels=parse_key_values(args.alert_label, "--alert-label", AlertOptionsError),
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; ``argv`` are the arguments after ``alerts``. Returns the exit status."""
    args = build_parser().parse_args(argv)
    return rule_file_main("alerts", AlertOptionsError, args, options_from_args, render_alerts, render_prometheusrule)


if __name__ == "__main__":
    sys.exit(main())
