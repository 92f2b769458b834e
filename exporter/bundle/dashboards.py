"""Render the Grafana dashboards (JSON files or Grafana-sidecar ConfigMaps) as code.

Three dashboards read the recording rules (docs/rules.md) and the exporter's own families
(docs/metrics.md): a cluster overview, a node view and a namespace / workload / pod view
(the seed 003 monitoring views). Panels are Grafana 10/11 core panels (timeseries, stat, gauge,
bargauge, table); every query goes to the ``$datasource`` variable. The default rendering is
committed under ``dashboards/``; docs/dashboards.md describes it. Run
``kube-gpu-exporter dashboards --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.bundle.common import (
    LABEL_FLAGS,
    LabelOptions,
    add_label_arguments,
    changed_flags,
    check_namespace,
    command_line,
    dump_yaml,
    fail,
    label_arguments,
    metadata_args,
    parse_key_values,
    write_output,
)
from exporter.bundle.rules import RuleOptionsError

SCHEMA_VERSION = 39  # Grafana 10.4 / 11
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the dashboards use (tests check every panel against this list).
UNITS: frozenset[str] = frozenset({"percent", "bytes", "mwatt", "celsius", "short", "none", "dateTimeFromNow"})
DASHBOARDS: tuple[str, ...] = ("cluster", "node", "workload")

_UID_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,29}$")
_REFRESH_RE = re.compile(r"^[1-9][0-9]*[smhd]$")
_LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class DashboardOptionsError(RuleOptionsError):
    """Raised for option values that would render invalid or misleading dashboards."""


@dataclass(frozen=True)
class DashboardOptions(LabelOptions):
    """What to render. Label names must match the recording rules' (and so the exporter's)."""

    uid_prefix: str = "kube-gpu"
    title_prefix: str = "GPU / "
    tags: tuple[str, ...] = ("kube-gpu-exporter", "gpu")
    refresh: str = "30s"
    time_from: str = "now-6h"

    def validate(self) -> None:
        """Raise :class:`DashboardOptionsError` with a message naming the offending option."""
        self.validate_labels(DashboardOptionsError)
        if not _UID_PREFIX_RE.match(self.uid_prefix):
            raise DashboardOptionsError(
                f"--uid-prefix: {self.uid_prefix!r} must be 1-30 of [a-z0-9-] (dashboard uids are at most 40)"
            )
        if not _REFRESH_RE.match(self.refresh):
            raise DashboardOptionsError(f"--refresh: {self.refresh!r} must look like 30s, 1m or 1h")
        if not re.match(r"^now-[1-9][0-9]*[smhdwMy]$", self.time_from):
            raise DashboardOptionsError(f"--time-from: {self.time_from!r} must look like now-6h")
        if not self.tags or any(not t.strip() for t in self.tags):
            raise DashboardOptionsError("--tag: tags must be non-empty")

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter dashboards`` flags that reproduce these options (defaults omitted)."""
        out = changed_flags(self, _FLAGS)
        if self.tags != DashboardOptions().tags:
            out += [f"--tag={t}" for t in self.tags]
        return out


_FLAGS: tuple[tuple[str, str], ...] = (
    *LABEL_FLAGS,
    ("uid_prefix", "--uid-prefix"),
    ("title_prefix", "--title-prefix"),
    ("refresh", "--refresh"),
    ("time_from", "--time-from"),
)


# ------------------------------------------------------------------ panels


@dataclass
class Target:
    expr: str
    legend: str = ""


def _targets(targets: Sequence[Target], *, instant: bool = False, table: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(targets):
        d: dict[str, Any] = {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": t.expr,
            "legendFormat": t.legend or "__auto",
            "range": not instant,
            "instant": instant,
            "refId": chr(ord("A") + i),
        }
        if table:
            d["format"] = "table"
        out.append(d)
    return out


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


_BASE = [(None, "green")]


def _panel(
    kind: str,
    title: str,
    description: str,
    unit: str,
    targets: list[dict[str, Any]],
    options: dict[str, Any],
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": dict(DATASOURCE),
        "fieldConfig": {"defaults": {"unit": unit, **(defaults or {})}, "overrides": []},
        "options": options,
        "targets": targets,
    }


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    minimum: float | None = 0,
    maximum: float | None = None,
    stack: bool = False,
) -> dict[str, Any]:
    custom: dict[str, Any] = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    defaults: dict[str, Any] = {"custom": custom, "color": {"mode": "palette-classic"}}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    options = {
        "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True, "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return _panel("timeseries", title, description, unit, _targets(targets), options, defaults)


def _reduce() -> dict[str, Any]:
    return {"calcs": ["lastNotNull"], "fields": "", "values": False}


def stat(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    steps: Sequence[tuple[float | None, str]] = _BASE,
    decimals: int | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"thresholds": _thresholds(steps), "color": {"mode": "thresholds"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    options = {
        "reduceOptions": _reduce(),
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": "auto",
    }
    return _panel("stat", title, description, unit, _targets(targets), options, defaults)


def gauge(
    title: str,
    description: str,
    targets: Sequence[Target],
    *,
    steps: Sequence[tuple[float | None, str]] = ((None, "green"), (80, "orange"), (95, "red")),
) -> dict[str, Any]:
    defaults = {"min": 0, "max": 100, "thresholds": _thresholds(steps), "color": {"mode": "thresholds"}}
    options = {"reduceOptions": _reduce(), "showThresholdLabels": False, "showThresholdMarkers": True}
    return _panel("gauge", title, description, "percent", _targets(targets, instant=True), options, defaults)


def bargauge(
    title: str, description: str, unit: str, targets: Sequence[Target], *, maximum: float | None = None
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"min": 0, "thresholds": _thresholds(_BASE), "color": {"mode": "continuous-GrYlRd"}}
    if maximum is not None:
        defaults["max"] = maximum
    options = {
        "reduceOptions": {**_reduce(), "values": False},
        "displayMode": "gradient",
        "orientation": "horizontal",
        "showUnfilled": True,
        "valueMode": "color",
        "namePlacement": "auto",
    }
    return _panel("bargauge", title, description, unit, _targets(targets, instant=True), options, defaults)


def table(
    title: str, description: str, labels: Sequence[tuple[str, str]], columns: Sequence[tuple[str, str, str]]
) -> dict[str, Any]:
    """An instant table: one row per label set, one column per query (merged).

    ``labels``: (label, header) shown first; ``columns``: (expr, header, unit). Every expr must
    return the same label set (aggregate ``by`` exactly ``labels``) so the rows merge.
    """
    targets = _targets([Target(expr) for expr, _, _ in columns], instant=True, table=True)
    rename = {label: header for label, header in labels}
    order = {label: i for i, (label, _) in enumerate(labels)}
    overrides = []
    for i, (_, header, unit) in enumerate(columns):
        value = f"Value #{chr(ord('A') + i)}"
        rename[value] = header
        order[value] = len(labels) + i
        overrides.append({"matcher": {"id": "byName", "options": value}, "properties": [{"id": "unit", "value": unit}]})
    panel = _panel(
        "table",
        title,
        description,
        "short",
        targets,
        {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}},
        {"custom": {"align": "auto", "filterable": True}},
    )
    panel["fieldConfig"]["overrides"] = overrides
    panel["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": order, "renameByName": rename}},
    ]
    return panel


class _Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping to a new line."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self._x = self._y = self._line_h = 0

    def _newline(self) -> None:
        self._y += self._line_h
        self._x = self._line_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y},
            }
        )
        self._y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self._x + w > 24:
            self._newline()
        panel["gridPos"] = {"h": h, "w": w, "x": self._x, "y": self._y}
        self.panels.append(panel)
        self._x += w
        self._line_h = max(self._line_h, h)

    def numbered(self) -> list[dict[str, Any]]:
        out = []
        for i, p in enumerate(self.panels, start=1):
            out.append({"id": i, **p})
        return out


# ------------------------------------------------------------------ queries


class _Q:
    """Label names, selectors and ``by`` lists for one set of options."""

    def __init__(self, opts: DashboardOptions) -> None:
        self.cl = [opts.cluster_label] if opts.cluster_label else []
        self.node, self.ns, self.pod, self.ctr = (
            opts.node_label,
            opts.namespace_label,
            opts.pod_label,
            opts.container_label,
        )
        self.NODE = f'{self.node}="$node"'
        self.NS = f'{self.ns}="$namespace"'
        self.WL = 'workload_name="$workload"'
        self.POD = f'{self.pod}=~"$pod"'
        self.GPU = 'minor_number=~"$gpu"'
        self.DEVICE = 'allocate_mode=~"exclusive|None"'  # exactly one row per GPU: the device values
        self.SHARE = 'allocate_mode="share"'

    def s(self, *matchers: str) -> str:
        """A label selector with the cluster matcher first; empty string when there is none."""
        ms = [*(f'{c}="$cluster"' for c in self.cl), *matchers]
        return "{" + ", ".join(ms) + "}" if ms else ""

    def by(self, *labels: str) -> str:
        return f"by ({', '.join([*self.cl, *labels])})"

    def on(self, *labels: str) -> str:
        return f"on ({', '.join([*self.cl, *labels])})"

    def labels(self, *pairs: tuple[str, str]) -> list[tuple[str, str]]:
        return [*((c, "Cluster") for c in self.cl), *pairs]


def _variables(opts: DashboardOptions, q: _Q, wanted: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "includeAll": False,
            "multi": False,
            "options": [],
            "refresh": 1,
            "regex": "",
        }
    ]

    def var(name: str, label: str, query: str, *, multi: bool = False) -> dict[str, Any]:
        return {
            "type": "query",
            "name": name,
            "label": label,
            "datasource": dict(DATASOURCE),
            "definition": query,
            "query": query,
            "current": {},
            "hide": 0,
            "includeAll": multi,
            "multi": multi,
            "options": [],
            "refresh": 2,
            "regex": "",
            "sort": 1,
        }

    if opts.cluster_label:
        out.append(var("cluster", "Cluster", f"label_values(k8s_cluster_gpu_total, {opts.cluster_label})"))
    queries = {
        "node": ("Node", f"label_values(kube_node_status_capacity_gpu{q.s()}, {q.node})", False),
        "gpu": ("GPU", f"label_values(nvidia_gpu_info{q.s(q.NODE)}, minor_number)", True),
        "namespace": ("Namespace", f"label_values(k8s_namespace_gpu_used{q.s()}, {q.ns})", False),
        "workload": ("Workload", f"label_values(k8s_workload_gpu_used{q.s(q.NS)}, workload_name)", False),
        "pod": ("Pod", f"label_values(k8s_pod_gpu_used{q.s(q.NS, q.WL)}, {q.pod})", True),
    }
    for name in wanted:
        label, query, multi = queries[name]
        out.append(var(name, label, query, multi=multi))
    return out


def _cluster_board(opts: DashboardOptions, q: _Q) -> tuple[list[dict[str, Any]], list[str]]:
    L = _Layout()
    s, by = q.s, q.by
    L.row("Capacity and allocation")
    L.add(
        stat(
            "GPUs",
            "GPUs in the cluster: all of them (nvidia_gpu_num_devices) and the healthy ones, "
            "which the cluster ratios divide by.",
            "short",
            [
                Target(f"sum(kube_node_status_capacity_gpu{s()}) / 100", "all"),
                Target(f"k8s_cluster_gpu_total{s()} / 100", "healthy"),
            ],
        ),
        4,
        5,
    )
    L.add(
        stat(
            "Lost GPUs",
            "GPUs NVML reports lost (GPU_IS_LOST): not allocatable until reset.",
            "short",
            [Target(f"sum(kube_node_status_capacity_gpu{s()} - kube_node_status_allocatable_gpu{s()}) / 100")],
            steps=((None, "green"), (1, "red")),
        ),
        3,
        5,
    )
    L.add(
        stat(
            "GPUs allocated",
            "GPUs with at least one allocation (whole or shared).",
            "short",
            [Target(f"sum(k8s_node_gpu_allocated_devices{s()})")],
        ),
        3,
        5,
    )
    L.add(
        stat(
            "GPU memory", "Memory of the healthy GPUs.", "bytes", [Target(f"k8s_cluster_gpu_memory_total_bytes{s()}")]
        ),
        3,
        5,
    )
    L.add(
        gauge(
            "Compute allocated",
            "Compute allocated to containers / healthy GPUs (k8s_cluster_rate_gpu_request_cluster).",
            [Target(f"k8s_cluster_rate_gpu_request_cluster{s()}")],
        ),
        3,
        5,
    )
    L.add(
        gauge(
            "Memory allocated",
            "GPU memory allocated to containers / memory of the healthy GPUs.",
            [Target(f"k8s_cluster_rate_gpu_memory_request_cluster{s()}")],
        ),
        3,
        5,
    )
    L.add(
        gauge(
            "GPU used",
            "Device duty cycle of all GPUs / healthy GPUs (k8s_cluster_rate_gpu_used_cluster).",
            [Target(f"k8s_cluster_rate_gpu_used_cluster{s()}")],
            steps=_BASE,
        ),
        3,
        5,
    )
    L.add(
        gauge(
            "Memory used",
            "GPU memory in use / memory of the healthy GPUs.",
            [Target(f"k8s_cluster_rate_gpu_memory_used_cluster{s()}")],
        ),
        2,
        5,
    )
    L.row("Over time")
    L.add(
        timeseries(
            "GPUs: healthy, allocated, used",
            "In GPUs (1 = one whole GPU). Used = the devices' duty cycles, each GPU counted once.",
            "short",
            [
                Target(f"k8s_cluster_gpu_total{s()} / 100", "healthy"),
                Target(f"sum(k8s_node_gpu_allocated_compute{s()}) / 100", "allocated"),
                Target(f"k8s_cluster_gpu_used{s()} / 100", "used"),
            ],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "GPU memory: healthy, allocated, used",
            "Memory of the healthy GPUs, memory allocated to containers, and device memory in use.",
            "bytes",
            [
                Target(f"k8s_cluster_gpu_memory_total_bytes{s()}", "healthy"),
                Target(f"sum(k8s_node_gpu_allocated_memory_bytes{s()})", "allocated"),
                Target(f"k8s_cluster_gpu_memory_used_bytes{s()}", "used"),
            ],
        ),
        12,
        8,
    )
    L.row("By namespace")
    L.add(
        timeseries(
            "GPU used by namespace",
            "In GPUs: the namespace's containers' own usage (share containers their processes' SM utilisation).",
            "short",
            [Target(f"k8s_namespace_gpu_used{s()} / 100", f"{{{{{q.ns}}}}}")],
            stack=True,
        ),
        12,
        8,
    )
    L.add(
        bargauge(
            "Share of the cluster's GPUs used",
            "k8s_namespace_rate_gpu_used_cluster: namespace usage / healthy GPUs of the cluster.",
            "percent",
            [Target(f"k8s_namespace_rate_gpu_used_cluster{s()}", f"{{{{{q.ns}}}}}")],
            maximum=100,
        ),
        6,
        8,
    )
    L.add(
        bargauge(
            "GPUs allocated by namespace",
            "Compute allocated to the namespace's containers, in GPUs.",
            "short",
            [Target(f"sum {by(q.ns)} (k8s_pod_gpu_request{s()}) / 100", f"{{{{{q.ns}}}}}")],
        ),
        6,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used by namespace",
            "Memory used by the namespace's containers.",
            "bytes",
            [Target(f"k8s_namespace_gpu_memory_used_bytes{s()}", f"{{{{{q.ns}}}}}")],
            stack=True,
        ),
        12,
        8,
    )
    L.add(
        table(
            "Namespaces",
            "Usage, allocation and share of the cluster per namespace (GPUs, bytes, %).",
            q.labels((q.ns, "Namespace")),
            [
                (f"sum {by(q.ns)} (k8s_namespace_gpu_used{s()}) / 100", "GPU used", "short"),
                (f"sum {by(q.ns)} (k8s_pod_gpu_request{s()}) / 100", "GPU allocated", "short"),
                (f"sum {by(q.ns)} (k8s_namespace_rate_gpu_used_cluster{s()})", "% of cluster GPUs", "percent"),
                (f"sum {by(q.ns)} (k8s_namespace_gpu_memory_used_bytes{s()})", "Memory used", "bytes"),
                (f"sum {by(q.ns)} (k8s_pod_gpu_memory_request_bytes{s()})", "Memory allocated", "bytes"),
                (f"sum {by(q.ns)} (k8s_namespace_rate_gpu_memory_used_cluster{s()})", "% of cluster memory", "percent"),
            ],
        ),
        12,
        8,
    )
    L.row("By workload")
    wl = (q.ns, "workload_kind", "workload_name")
    L.add(
        timeseries(
            "GPU used by workload (top 10)",
            "In GPUs, all pods of the workload on every node.",
            "short",
            [
                Target(
                    f"topk(10, k8s_workload_gpu_used{s()}) / 100",
                    f"{{{{{q.ns}}}}}/{{{{workload_kind}}}}/{{{{workload_name}}}}",
                )
            ],
        ),
        12,
        9,
    )
    L.add(
        table(
            "Workloads",
            "Usage, allocation and share of the cluster per workload (GPUs, bytes, %).",
            q.labels((q.ns, "Namespace"), ("workload_kind", "Kind"), ("workload_name", "Workload")),
            [
                (f"sum {by(*wl)} (k8s_workload_gpu_used{s()}) / 100", "GPU used", "short"),
                (f"sum {by(*wl)} (k8s_pod_gpu_request{s()}) / 100", "GPU allocated", "short"),
                (f"sum {by(*wl)} (k8s_workload_rate_gpu_used_cluster{s()})", "% of cluster GPUs", "percent"),
                (f"sum {by(*wl)} (k8s_workload_gpu_memory_used_bytes{s()})", "Memory used", "bytes"),
                (f"sum {by(*wl)} (k8s_pod_gpu_memory_request_bytes{s()})", "Memory allocated", "bytes"),
                (f"sum {by(*wl)} (k8s_workload_rate_gpu_memory_used_cluster{s()})", "% of cluster memory", "percent"),
            ],
        ),
        12,
        9,
    )
    L.row("Nodes")
    L.add(
        table(
            "Nodes",
            "Per node: GPUs, allocation and usage (GPUs and % of the node's capacity).",
            q.labels((q.node, "Node")),
            [
                (f"max {by(q.node)} (kube_node_status_capacity_gpu{s()}) / 100", "GPUs", "short"),
                (f"max {by(q.node)} (kube_node_status_allocatable_gpu{s()}) / 100", "Healthy", "short"),
                (f"max {by(q.node)} (k8s_node_gpu_allocated_devices{s()})", "GPUs allocated", "short"),
                (f"max {by(q.node)} (k8s_node_gpu_allocated_compute{s()}) / 100", "Compute allocated", "short"),
                (f"max {by(q.node)} (k8s_node_rate_gpu_used{s()})", "GPU used %", "percent"),
                (f"max {by(q.node)} (k8s_node_rate_gpu_memory_used{s()})", "Memory used %", "percent"),
                (f"max {by(q.node)} (k8s_node_rate_gpu_memory_allocated{s()})", "Memory allocated %", "percent"),
            ],
        ),
        24,
        8,
    )
    return L.numbered(), []


def _node_board(opts: DashboardOptions, q: _Q) -> tuple[list[dict[str, Any]], list[str]]:
    L = _Layout()
    s, by = q.s, q.by
    n, g = q.NODE, q.GPU
    card = ("uuid", "minor_number")
    gpu_legend = "GPU {{minor_number}}"

    def per_gpu(series: str, *matchers: str) -> str:
        # one series per selected GPU of the node, a GPU scraped twice counted once
        return f"max {by(q.node, *card)} ({series}{s(n, g, *matchers)})"

    L.row("Node")
    L.add(
        stat(
            "GPUs",
            "GPUs on the node, and the healthy (not lost) ones.",
            "short",
            [
                Target(f"max(nvidia_gpu_num_devices{s(n)})", "all"),
                Target(f"max(nvidia_gpu_node_healthy_devices{s(n)})", "healthy"),
            ],
        ),
        4,
        5,
    )
    L.add(
        stat(
            "GPUs allocated",
            "GPUs with at least one allocation.",
            "short",
            [Target(f"k8s_node_gpu_allocated_devices{s(n)}")],
        ),
        3,
        5,
    )
    L.add(
        stat(
            "Compute allocated",
            "Compute allocated on the node, in GPUs.",
            "short",
            [Target(f"k8s_node_gpu_allocated_compute{s(n)} / 100")],
            decimals=2,
        ),
        3,
        5,
    )
    L.add(
        stat(
            "Average temperature",
            "Mean temperature of the selected GPUs.",
            "celsius",
            [Target(f"avg({per_gpu('nvidia_gpu_temperature_celsius')})")],
            steps=((None, "green"), (80, "orange"), (85, "red")),
        ),
        4,
        5,
    )
    L.add(
        stat(
            "Total power",
            "Power drawn by the selected GPUs.",
            "mwatt",
            [Target(f"sum({per_gpu('nvidia_gpu_power_usage_milliwatts')})")],
        ),
        4,
        5,
    )
    L.add(
        gauge(
            "GPU used",
            "Device duty cycle / node capacity (k8s_node_rate_gpu_used).",
            [Target(f"k8s_node_rate_gpu_used{s(n)}")],
            steps=_BASE,
        ),
        2,
        5,
    )
    L.add(
        gauge(
            "Memory used",
            "GPU memory in use / the node's GPU memory (k8s_node_rate_gpu_memory_used).",
            [Target(f"k8s_node_rate_gpu_memory_used{s(n)}")],
        ),
        2,
        5,
    )
    L.add(
        gauge(
            "Memory allocated",
            "GPU memory allocated / the node's GPU memory (k8s_node_rate_gpu_memory_allocated).",
            [Target(f"k8s_node_rate_gpu_memory_allocated{s(n)}")],
        ),
        2,
        5,
    )
    L.row("Per GPU")
    L.add(
        timeseries(
            "Duty cycle per GPU",
            "Device utilisation (nvmlDeviceGetUtilizationRates().gpu) of each GPU.",
            "percent",
            [Target(per_gpu("nvidia_gpu_duty_cycle", q.DEVICE), gpu_legend)],
            maximum=100,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Memory used per GPU",
            "Device memory in use on each GPU.",
            "bytes",
            [Target(per_gpu("nvidia_gpu_memory_used_bytes", q.DEVICE), gpu_legend)],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "Power per GPU",
            "Power draw of each GPU.",
            "mwatt",
            [Target(per_gpu("nvidia_gpu_power_usage_milliwatts"), gpu_legend)],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Temperature per GPU",
            "Temperature of each GPU.",
            "celsius",
            [Target(per_gpu("nvidia_gpu_temperature_celsius"), gpu_legend)],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Memory controller busy per GPU",
            "Share of time device memory was read or written (nvmlDeviceGetUtilizationRates().memory).",
            "percent",
            [Target(per_gpu("nvidia_gpu_memory_utilization"), gpu_legend)],
            maximum=100,
        ),
        8,
        8,
    )
    L.row("Allocation")
    L.add(
        bargauge(
            "Compute allocated per GPU",
            "Compute allocated on each GPU, % of one GPU (k8s_card_gpu_allocated_compute; 100 = the whole card).",
            "percent",
            [Target(f"k8s_card_gpu_allocated_compute{s(n, g)}", gpu_legend)],
            maximum=100,
        ),
        8,
        8,
    )
    L.add(
        bargauge(
            "Memory allocated per GPU",
            "Memory allocated on each GPU / its memory (k8s_card_rate_gpu_memory_allocated).",
            "percent",
            [Target(f"k8s_card_rate_gpu_memory_allocated{s(n, g)}", gpu_legend)],
            maximum=100,
        ),
        8,
        8,
    )
    L.add(
        bargauge(
            "Rows by allocate_mode",
            "The exporter's rows per allocate_mode: exclusive (one container "
            "holds the GPU), share (one row per container on a shared GPU), None (device totals of a "
            "shared or unheld GPU).",
            "short",
            [Target(f"count by (allocate_mode) (nvidia_gpu_memory_total_bytes{s(n, g)})", "{{allocate_mode}}")],
        ),
        8,
        8,
    )
    row = (q.node, "minor_number", "allocate_mode", q.ns, q.pod, q.ctr)
    L.add(
        table(
            "GPU rows",
            "Every row the exporter reports for the selected GPUs: exclusive and share rows carry "
            "the container; share rows its own processes' SM utilisation and memory.",
            q.labels(
                (q.node, "Node"),
                ("minor_number", "GPU"),
                ("allocate_mode", "allocate_mode"),
                (q.ns, "Namespace"),
                (q.pod, "Pod"),
                (q.ctr, "Container"),
            ),
            [
                (f"max {by(*row)} (nvidia_gpu_duty_cycle{s(n, g)})", "Duty cycle", "percent"),
                (f"max {by(*row)} (nvidia_gpu_memory_used_bytes{s(n, g)})", "Memory used", "bytes"),
                (f"max {by(*row)} (nvidia_gpu_memory_total_bytes{s(n, g)})", "Memory total", "bytes"),
            ],
        ),
        24,
        8,
    )
    L.row("Shared GPUs: per-container share")
    who = f"GPU {{{{minor_number}}}} {{{{{q.ns}}}}}/{{{{{q.pod}}}}}/{{{{{q.ctr}}}}}"
    L.add(
        timeseries(
            "SM utilisation per container",
            "On shared GPUs: each container's processes' SM utilisation (allocate_mode=\"share\" rows).",
            "percent",
            [Target(f"nvidia_gpu_duty_cycle{s(n, g, q.SHARE)}", who)],
            maximum=100,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Memory used per container",
            "On shared GPUs: memory used by each container's processes.",
            "bytes",
            [Target(f"nvidia_gpu_memory_used_bytes{s(n, g, q.SHARE)}", who)],
        ),
        8,
        8,
    )
    share_key = (q.node, "minor_number", q.ns, q.pod, q.ctr)
    L.add(
        bargauge(
            "Memory used / granted per container",
            "On shared GPUs: memory used / memory the scheme "
            "granted (nvidia_gpu_gpu_sharing_memory). Over 100 % the container eats into its "
            "neighbours' memory.",
            "percent",
            [
                Target(
                    f"max {by(*share_key)} (nvidia_gpu_memory_used_bytes{s(n, g, q.SHARE)}) * 100\n"
                    f"/ (max {by(*share_key)} (nvidia_gpu_gpu_sharing_memory{s(n, g)}) > 0)",
                    who,
                )
            ],
            maximum=100,
        ),
        8,
        8,
    )
    L.add(
        table(
            "Compute allocated per pod and GPU",
            "k8s_pod_gpu_allocated_compute: compute allocated to each pod on each GPU, % of one GPU.",
            q.labels((q.ns, "Namespace"), (q.pod, "Pod"), ("minor_number", "GPU"), ("uuid", "UUID")),
            [
                (
                    f"max {by(q.ns, q.pod, 'minor_number', 'uuid')} (k8s_pod_gpu_allocated_compute{s(n)})",
                    "Compute allocated",
                    "percent",
                ),
            ],
        ),
        24,
        7,
    )
    L.row("Errors and unaccounted processes")
    xid_key = ("minor_number", "xid", q.ns, q.pod, q.ctr)
    L.add(
        table(
            "Xid errors",
            "Xid errors the driver reported since the exporter started, by GPU, code and the pod "
            "of the faulting process (docs/xid.md has the catalog).",
            q.labels(
                ("minor_number", "GPU"), ("xid", "Xid"), (q.ns, "Namespace"), (q.pod, "Pod"), (q.ctr, "Container")
            ),
            [
                (f"sum {by(*xid_key)} (nvidia_gpu_xid_errors_total{s(n)})", "Errors", "short"),
            ],
        ),
        10,
        8,
    )
    L.add(
        timeseries(
            "Xid errors over time",
            "New Xid errors per GPU and code.",
            "short",
            [
                Target(
                    f"sum {by('minor_number', 'xid')} (increase(nvidia_gpu_xid_errors_total{s(n)}[$__rate_interval]))",
                    "GPU {{minor_number}} Xid {{xid}}",
                )
            ],
        ),
        8,
        8,
    )
    L.add(
        stat(
            "Last Xid",
            "When the exporter read the node's latest Xid.",
            "dateTimeFromNow",
            [Target(f"max(nvidia_gpu_last_xid_timestamp_seconds{s(n)}) * 1000")],
        ),
        3,
        4,
    )
    L.add(
        stat(
            "GPUs lost",
            "GPUs NVML reports lost (GPU_IS_LOST).",
            "short",
            [Target(f"sum(1 - nvidia_gpu_up{s(n)})")],
            steps=((None, "green"), (1, "red")),
        ),
        3,
        4,
    )
    proc_key = ("minor_number", "pid", q.ns, q.pod, q.ctr)
    L.add(
        table(
            "Unaccounted GPU processes",
            "Processes using a GPU that no container was allocated: host "
            "processes (empty pod) or pods that see every GPU.",
            q.labels(
                ("minor_number", "GPU"), ("pid", "PID"), (q.ns, "Namespace"), (q.pod, "Pod"), (q.ctr, "Container")
            ),
            [
                (
                    f"max {by(*proc_key)} (nvidia_gpu_unaccounted_process_memory_used_bytes{s(n)})",
                    "Memory used",
                    "bytes",
                ),
                (f"max {by(*proc_key)} (nvidia_gpu_unaccounted_process_duty_cycle{s(n)})", "SM utilisation", "percent"),
            ],
        ),
        24,
        7,
    )
    return L.numbered(), ["node", "gpu"]


def _workload_board(opts: DashboardOptions, q: _Q) -> tuple[list[dict[str, Any]], list[str]]:
    L = _Layout()
    s, by, on = q.s, q.by, q.on
    ns, wl, pod = q.NS, q.WL, q.POD
    pod_legend = f"{{{{{q.pod}}}}}"
    L.row("Namespace $namespace")
    L.add(
        stat(
            "GPU used",
            "The namespace's containers' usage, in GPUs.",
            "short",
            [Target(f"k8s_namespace_gpu_used{s(ns)} / 100")],
            decimals=2,
        ),
        4,
        5,
    )
    L.add(
        stat(
            "GPU allocated",
            "Compute allocated to the namespace's containers, in GPUs.",
            "short",
            [Target(f"sum(k8s_pod_gpu_request{s(ns)}) / 100")],
            decimals=2,
        ),
        4,
        5,
    )
    L.add(
        stat(
            "Share of the cluster's GPUs",
            "k8s_namespace_rate_gpu_used_cluster.",
            "percent",
            [Target(f"k8s_namespace_rate_gpu_used_cluster{s(ns)}")],
        ),
        4,
        5,
    )
    L.add(
        stat(
            "GPU memory used",
            "Memory used by the namespace's containers.",
            "bytes",
            [Target(f"k8s_namespace_gpu_memory_used_bytes{s(ns)}")],
        ),
        4,
        5,
    )
    L.add(
        stat(
            "GPU memory allocated",
            "Memory allocated to the namespace's containers.",
            "bytes",
            [Target(f"sum(k8s_pod_gpu_memory_request_bytes{s(ns)})")],
        ),
        4,
        5,
    )
    L.add(
        stat(
            "Share of the cluster's GPU memory",
            "k8s_namespace_rate_gpu_memory_used_cluster.",
            "percent",
            [Target(f"k8s_namespace_rate_gpu_memory_used_cluster{s(ns)}")],
        ),
        4,
        5,
    )
    L.add(
        timeseries(
            "GPU used by workload",
            "In GPUs, each workload of the namespace.",
            "short",
            [Target(f"k8s_workload_gpu_used{s(ns)} / 100", "{{workload_kind}}/{{workload_name}}")],
            stack=True,
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used by workload",
            "Each workload of the namespace.",
            "bytes",
            [Target(f"k8s_workload_gpu_memory_used_bytes{s(ns)}", "{{workload_kind}}/{{workload_name}}")],
            stack=True,
        ),
        12,
        8,
    )
    L.row("Workload $workload")
    L.add(
        timeseries(
            "GPU used vs allocated",
            "In GPUs: what the workload's pods used and what they were allocated.",
            "short",
            [
                Target(f"sum(k8s_workload_gpu_used{s(ns, wl)}) / 100", "used"),
                Target(f"sum(k8s_pod_gpu_request{s(ns, wl)}) / 100", "allocated"),
            ],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used vs allocated",
            "Memory the workload's pods used and were allocated.",
            "bytes",
            [
                Target(f"sum(k8s_workload_gpu_memory_used_bytes{s(ns, wl)})", "used"),
                Target(f"sum(k8s_pod_gpu_memory_request_bytes{s(ns, wl)})", "allocated"),
            ],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Share of the cluster",
            "k8s_workload_rate_gpu_used_cluster and k8s_workload_rate_gpu_memory_used_cluster.",
            "percent",
            [
                Target(f"sum(k8s_workload_rate_gpu_used_cluster{s(ns, wl)})", "GPU"),
                Target(f"sum(k8s_workload_rate_gpu_memory_used_cluster{s(ns, wl)})", "memory"),
            ],
        ),
        8,
        8,
    )
    L.row("Pods: usage vs request")
    sel = s(ns, wl, pod)
    L.add(
        timeseries(
            "GPU used / requested",
            "k8s_pod_rate_gpu_used_request: usage of the containers with a "
            "request / their requests. Pods without a request (time-slicing) have no line.",
            "percent",
            [Target(f"k8s_pod_rate_gpu_used_request{sel}", pod_legend)],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used / requested",
            "k8s_pod_rate_gpu_memory_used_request.",
            "percent",
            [Target(f"k8s_pod_rate_gpu_memory_used_request{sel}", pod_legend)],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "GPU used and requested",
            "In GPUs, per pod.",
            "short",
            [
                Target(f"k8s_pod_gpu_used{sel} / 100", f"{pod_legend} used"),
                Target(f"k8s_pod_gpu_request{sel} / 100", f"{pod_legend} request"),
            ],
        ),
        12,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used and requested",
            "Per pod.",
            "bytes",
            [
                Target(f"k8s_pod_gpu_memory_used_bytes{sel}", f"{pod_legend} used"),
                Target(f"k8s_pod_gpu_memory_request_bytes{sel}", f"{pod_legend} request"),
            ],
        ),
        12,
        8,
    )
    pk = (q.node, q.pod)
    L.add(
        table(
            "Pods",
            "Per pod: usage and requests (GPUs, bytes) and their ratios.",
            q.labels((q.node, "Node"), (q.pod, "Pod")),
            [
                (f"sum {by(*pk)} (k8s_pod_gpu_used{sel}) / 100", "GPU used", "short"),
                (f"sum {by(*pk)} (k8s_pod_gpu_request{sel}) / 100", "GPU requested", "short"),
                (f"sum {by(*pk)} (k8s_pod_rate_gpu_used_request{sel})", "Used / requested", "percent"),
                (f"sum {by(*pk)} (k8s_pod_rate_gpu_used_node{sel})", "% of node GPUs", "percent"),
                (f"sum {by(*pk)} (k8s_pod_gpu_memory_used_bytes{sel})", "Memory used", "bytes"),
                (f"sum {by(*pk)} (k8s_pod_gpu_memory_request_bytes{sel})", "Memory requested", "bytes"),
                (f"sum {by(*pk)} (k8s_pod_rate_gpu_memory_used_request{sel})", "Memory used / requested", "percent"),
                (f"sum {by(*pk)} (k8s_pod_rate_gpu_memory_used_node{sel})", "% of node GPU memory", "percent"),
            ],
        ),
        24,
        7,
    )
    L.add(
        bargauge(
            "Compute allocated per pod and GPU",
            "k8s_pod_gpu_allocated_compute: % of one GPU allocated to each pod on each card.",
            "percent",
            [Target(f"k8s_pod_gpu_allocated_compute{sel}", f"{pod_legend} GPU {{{{minor_number}}}}")],
            maximum=100,
        ),
        8,
        8,
    )
    L.row("Containers")
    ctr_legend = f"{{{{{q.pod}}}}}/{{{{{q.ctr}}}}}"
    L.add(
        timeseries(
            "GPU used per container", "In GPUs.", "short", [Target(f"k8s_container_gpu_used{sel} / 100", ctr_legend)]
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "GPU used / requested per container",
            "k8s_container_rate_gpu_used_request.",
            "percent",
            [Target(f"k8s_container_rate_gpu_used_request{sel}", ctr_legend)],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "GPU memory used per container",
            "k8s_container_gpu_memory_used_bytes.",
            "bytes",
            [Target(f"k8s_container_gpu_memory_used_bytes{sel}", ctr_legend)],
        ),
        8,
        8,
    )
    L.row("The pods' GPUs")
    card = (q.node, "uuid")
    pods_on = f"group {by(q.node, 'uuid', q.pod)} (nvidia_gpu_memory_total_bytes{s(ns, pod)})"

    def on_pods_gpus(expr: str) -> str:
        # device value of each GPU a selected pod runs on, once per (pod, GPU)
        return f"max {by(*card, 'minor_number')} ({expr})\n* {on(*card)} group_right (minor_number)\n{pods_on}"

    gpu_legend = f"{pod_legend} GPU {{{{minor_number}}}}"
    L.add(
        timeseries(
            "Device duty cycle",
            "Utilisation of the GPUs the pods run on (the whole device, all its users).",
            "percent",
            [Target(on_pods_gpus(f"nvidia_gpu_duty_cycle{s(q.DEVICE)}"), gpu_legend)],
            maximum=100,
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Device power",
            "Power draw of the GPUs the pods run on.",
            "mwatt",
            [Target(on_pods_gpus(f"nvidia_gpu_power_usage_milliwatts{s()}"), gpu_legend)],
        ),
        8,
        8,
    )
    L.add(
        timeseries(
            "Device temperature",
            "Temperature of the GPUs the pods run on.",
            "celsius",
            [Target(on_pods_gpus(f"nvidia_gpu_temperature_celsius{s()}"), gpu_legend)],
        ),
        8,
        8,
    )
    return L.numbered(), ["namespace", "workload", "pod"]


_BOARDS: dict[str, tuple[str, str, Callable[[DashboardOptions, _Q], tuple[list[dict[str, Any]], list[str]]]]] = {
    "cluster": (
        "Cluster overview",
        "GPU capacity, allocation and usage of the cluster, by namespace, workload and node.",
        _cluster_board,
    ),
    "node": (
        "Node",
        "One node's GPUs: duty cycle, memory, power, temperature, allocation per card, the "
        "exporter's rows by allocate_mode, per-container usage on shared GPUs, Xid errors.",
        _node_board,
    ),
    "workload": (
        "Namespace, workload and pod",
        "GPU usage against requests for a namespace, a workload and its pods and containers, and the GPUs they run on.",
        _workload_board,
    ),
}


def dashboard_uid(opts: DashboardOptions, name: str) -> str:
    return f"{opts.uid_prefix}-{name}"


def build_dashboard(opts: DashboardOptions, name: str) -> dict[str, Any]:
    """The dashboard model of ``name`` (one of :data:`DASHBOARDS`) for validated ``opts``."""
    title, what, builder = _BOARDS[name]
    q = _Q(opts)
    panels, wanted = builder(opts, q)
    cmd = command_line("dashboards", opts.to_args())
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": f"{what} Generated by `{cmd}` (kube-gpu-exporter, docs/dashboards.md): edit the "
        "generator, not this JSON.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "title": "GPU dashboards",
                "type": "dashboards",
                "tags": [opts.tags[0]],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "panels": panels,
        "refresh": opts.refresh,
        "schemaVersion": SCHEMA_VERSION,
        "tags": list(opts.tags),
        "templating": {"list": _variables(opts, q, wanted)},
        "time": {"from": opts.time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": f"{opts.title_prefix}{title}",
        "uid": dashboard_uid(opts, name),
        "version": 1,
        "weekStart": "",
    }


def _dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_dashboards(opts: DashboardOptions) -> dict[str, str]:
    """``{file name: JSON text}`` of every dashboard."""
    opts.validate()
    return {f"{dashboard_uid(opts, name)}.json": _dumps(build_dashboard(opts, name)) for name in DASHBOARDS}


def render_configmaps(
    opts: DashboardOptions,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """One ConfigMap per dashboard (multi-document YAML) for Grafana's dashboard sidecar."""
    files = render_dashboards(opts)
    check_namespace(namespace, DashboardOptionsError)
    meta_labels = {"grafana_dashboard": "1", **dict(labels or {})}
    for key in meta_labels:
        if not _LABEL_KEY_RE.match(key):
            raise DashboardOptionsError(f"--label: {key!r} is not a valid Kubernetes label key")
    docs = []
    for file_name, text in files.items():
        meta: dict[str, Any] = {"name": file_name.removesuffix(".json") + "-dashboard"}
        if namespace:
            meta["namespace"] = namespace
        meta["labels"] = meta_labels
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {file_name: text}})
    args = ["--format=configmap", *opts.to_args(), *metadata_args(namespace, labels)]
    header = (
        f"# Generated by `{command_line('dashboards', args)}`: do not edit by hand.\n"
        '# Grafana dashboards of kube-gpu-exporter for the Grafana sidecar (label grafana_dashboard: "1");\n'
        "# see docs/dashboards.md. Apply with `kubectl apply --server-side -f`.\n"
    )
    return header + "".join("---\n" + dump_yaml(d) for d in docs)


# ------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    """The ``kube-gpu-exporter dashboards`` argument parser."""
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter dashboards",
        description="Render the Grafana dashboards (docs/dashboards.md): one JSON file per dashboard, "
        "or Grafana-sidecar ConfigMaps.",
    )
    d = DashboardOptions()
    add_label_arguments(p, "label telling clusters apart: adds a cluster variable (default: none)")
    p.add_argument("--uid-prefix", default=d.uid_prefix, help="dashboard uid prefix (default %(default)s)")
    p.add_argument("--title-prefix", default=d.title_prefix, help="dashboard title prefix (default %(default)r)")
    p.add_argument(
        "--tag",
        action="append",
        default=None,
        metavar="TAG",
        help="dashboard tag, repeatable (default: kube-gpu-exporter, gpu); the first links the dashboards",
    )
    p.add_argument("--refresh", default=d.refresh, help="auto-refresh interval (default %(default)s)")
    p.add_argument("--time-from", default=d.time_from, help="default time range start (default %(default)s)")
    p.add_argument("--format", choices=("json", "configmap"), default="json")
    p.add_argument("--only", choices=DASHBOARDS, default=None, help="json: render this dashboard only")
    p.add_argument("--namespace", default=None, help="configmap: metadata.namespace")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="configmap: extra metadata label, repeatable (grafana_dashboard=1 is always set)",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="json: output directory (default: current directory; '-' with --only for stdout); "
        "configmap: output file (default stdout)",
    )
    return p


def options_from_args(args: argparse.Namespace) -> DashboardOptions:
    """Translate parsed CLI arguments into :class:`DashboardOptions` (not yet validated)."""
    return DashboardOptions(
        **label_arguments(args),
        uid_prefix=args.uid_prefix,
        title_prefix=args.title_prefix,
        tags=tuple(args.tag) if args.tag else DashboardOptions().tags,
        refresh=args.refresh,
        time_from=args.time_from,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; ``argv`` are the arguments after ``dashboards``. Returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        opts = options_from_args(args)
        if args.format == "configmap":
            if args.only:
                raise DashboardOptionsError("--only applies to --format json")
            text = render_configmaps(
                opts, args.namespace, parse_key_values(args.label, "--label", DashboardOptionsError)
            )
            write_output(text, args.output)
            return 0
        if args.namespace or args.label:
            raise DashboardOptionsError("--namespace and --label apply to --format configmap")
        files = render_dashboards(opts)
        if args.only:
            files = {k: v for k, v in files.items() if k == f"{dashboard_uid(opts, args.only)}.json"}
        if args.output == "-":
            if len(files) != 1:
                raise DashboardOptionsError("-o -: choose one dashboard with --only")
            sys.stdout.write(next(iter(files.values())))
            return 0
        out_dir = Path(args.output or ".")
        if not out_dir.is_dir():
            raise DashboardOptionsError(f"-o: {str(out_dir)!r} is not a directory")
        for file_name, text in files.items():
            (out_dir / file_name).write_text(text, encoding="utf-8")
    except DashboardOptionsError as exc:
        return fail("dashboards", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
