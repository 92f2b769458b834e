"""Render the recording-rule bundle (plain rule file or PrometheusRule) from jinja2 templates.

The templates ship inside the package (``exporter/bundle/templates/rules``, also reachable as
``rules/templates`` in the repository) so that ``kube-gpu-exporter rules`` works from a
non-editable install. Run ``kube-gpu-exporter rules --help`` for the options.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import yaml

from exporter.bundle.common import FIXED_LABELS as FIXED_LABELS  # public here too (tests, callers)
from exporter.bundle.common import (
    K8S_LEVELS,
    K8S_NAME_RE,
    Error,
    LabelOptions,
    is_positive_duration,
    label_options,
    metadata_args,
    object_metadata,
    with_k8s_labels,
)
from exporter.bundle.option_table import Option, check_options, option_args, options_dataclass

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "rules"

LEVELS: tuple[str, ...] = ("container", "pod", "node", "workload", "namespace", "cluster")
DEVICE_ROWS = 'allocate_mode=~"exclusive|None"'  # exactly one row per GPU: the device totals
# The families with one row per attributed container (and GPU): where the helpers find every pod.
POD_ROWS = (
    "nvidia_gpu_duty_cycle",
    "nvidia_gpu_allocated_compute_percent",
    "nvidia_gpu_allocated_memory_bytes",
    "nvidia_gpu_container_busy_seconds_total",
    "nvidia_gpu_container_energy_joules_total",
)
# The helper series: per container, the inputs of the container, pod, workload and namespace rules.
HELPERS = {
    "info": "namespace_workload_pod:nvidia_gpu_pod_info:dedup",
    "duty": "node_namespace_pod_container:nvidia_gpu_duty_cycle:sum",
    "mem": "node_namespace_pod_container:nvidia_gpu_memory_used_bytes:sum",
    "req": "node_namespace_pod_container:nvidia_gpu_allocated_compute_percent:sum",
    "mreq": "node_namespace_pod_container:nvidia_gpu_allocated_memory_bytes:sum",
    "busy": "node_namespace_pod_container:nvidia_gpu_container_busy_seconds_total:sum_rate",
    "energy": "node_namespace_pod_container:nvidia_gpu_container_energy_joules_total:sum_rate",
}


class RuleOptionsError(ValueError):
    """Raised for option values that would render an invalid or misleading bundle."""


def _parse_levels(text: str, flag: str, error: Error) -> tuple[str, ...]:
    return tuple(dict.fromkeys(lv.strip() for lv in text.split(",") if lv.strip()))


def _refuse_levels(levels: tuple[str, ...]) -> str | None:
    if not levels:
        return "at least one level is required"
    unknown = [lv for lv in levels if lv not in LEVELS]
    return f"unknown level(s) {', '.join(unknown)}; choose from {', '.join(LEVELS)}" if unknown else None


def _duration(example: str) -> dict[str, Any]:
    return {"check": is_positive_duration, "why": f"is not a positive Prometheus duration (e.g. {example})"}


# Order: the flags' in --help and in a rendering's header (reordering changes the committed files).
RULE_OPTIONS: tuple[Option, ...] = (
    Option("interval", "30s", "rule group evaluation interval (default %(default)s)", "--interval",
           doc="the group's evaluation interval", **_duration("30s, 1m")),
    Option("rate_window", "5m", "rate() window of the busy-seconds and energy series; at least 4 scrape intervals "
           "(default %(default)s)", "--rate-window", doc="the `rate()` window of the busy-seconds and energy series "
           "(`*_gpu_busy`, `*_gpu_power_watts`); make it at least 4 scrape intervals",
           **_duration("5m")),
    Option("levels", LEVELS, "comma-separated levels to emit (default %(default)s)", "--levels",
           doc="which levels to emit; any subset renders a self-contained group with the same numbers (the helpers "
           "a level needs come along; [below](#how-the-rules-are-evaluated))", convert=_parse_levels,
           refuse=_refuse_levels),
    Option("group_name", "k8s-gpu", "the rule group's name", check=K8S_NAME_RE.match,
           why="must be a lowercase DNS-style name"),
)  # fmt: skip
# The whole `kube-gpu-exporter rules` table: the label flags, then the rules' own.
RULE_TABLE: tuple[Option, ...] = (
    *label_options("label telling clusters apart (e.g. cluster); every aggregation keeps it. Default: none",
                   "a label that tells clusters apart (`cluster`, `k8s_cluster`, ...). Every aggregation keeps it "
                   "and every cluster ratio divides by its own cluster's total (`on(cluster) group_left`). The "
                   "label must be **on the scraped series** (target label, relabeling, federation, remote-write "
                   "into Thanos/Mimir): Prometheus' `external_labels` are not visible to its own rule evaluation"),
    *RULE_OPTIONS,
)


@options_dataclass(RULE_OPTIONS)
class RuleOptions(LabelOptions):
    """What to render (one field per :data:`RULE_OPTIONS` entry). Label names must match the exporter's."""

    def validate(self) -> None:
        """Raise :class:`RuleOptionsError` with a message naming the offending option."""
        self.validate_labels(RuleOptionsError)
        check_options(self, RULE_OPTIONS, RuleOptionsError)

    def to_args(self) -> list[str]:
        """The ``kube-gpu-exporter rules`` flags that reproduce these options (defaults omitted)."""
        return option_args(self, RULE_TABLE)


def _by(labels: Sequence[str]) -> str:
    """``by (a, b)``; empty string for no labels so ``sum(x)`` stays readable."""
    return f"by ({', '.join(labels)}) " if labels else ""


def _context(opts: RuleOptions) -> dict[str, object]:
    cl = [opts.cluster_label] if opts.cluster_label else []
    node, ns, pod, ctr = opts.node_label, opts.namespace_label, opts.pod_label, opts.container_label
    wl = ["workload_kind", "workload_name"]
    keys = {
        "CL": cl,
        "N": [*cl, node],
        "NS": [*cl, ns],
        "PI": [*cl, ns, pod],  # identifies a pod in a cluster: the workload-join key
        "PIW": [*cl, ns, pod, *wl],
        "P": [*cl, node, ns, pod],
        "PW": [*cl, node, ns, pod, *wl],  # a pod series' labels (before the namespace/pod copies)
        "C": [*cl, node, ns, pod, ctr],
        "W": [*cl, ns, *wl],
        "NU": [*cl, node, "uuid"],
        "NUC": [*cl, node, "uuid", ns, pod, ctr],  # one counter row
        "CARD": [*cl, node, "uuid", "minor_number"],
        "PCARD": [*cl, node, ns, pod, "uuid", "minor_number"],
    }
    k8s = {level: opts.k8s_labels(level) for level in K8S_LEVELS}
    # A sum of recorded series that carry the copies keeps them by grouping by them (cheaper
    # than copying again: a label_replace costs about what the sum does).
    keys["PWK"] = [*keys["PW"], *(name for name, _ in k8s["pod"])]
    keys["WK"] = [*keys["W"], *(name for name, _ in k8s["namespace"])]
    # what a join with the pod-info helper brings: the owner and the pod's copies
    keys["JOINED"] = ["workload_kind", "workload_name", *(name for name, _ in k8s["pod"])]
    L = {k: ", ".join(v) for k, v in keys.items()}
    by = {k: _by(v) for k, v in keys.items()}
    levels = set(opts.levels)
    exprs = _shared_exprs(by, L, levels, opts.rate_window)
    # As divisors: parenthesised and without zeros, so no ratio is ever +Inf or NaN.
    divisors = {k: f"({v} > 0)" for k, v in exprs.items()}
    return {
        "opts": opts,
        "cli_args": " ".join(opts.to_args()),
        "levels": levels,
        "L": L,
        "by": by,
        "on_cl": f"on ({L['CL']})",
        "H": HELPERS,
        "X": exprs,
        "D": divisors,
        "SEL": {"container": 'allocate_mode=~"exclusive|share"', "device": DEVICE_ROWS, "attributed": f'{pod}!=""'},
        "RW": opts.rate_window,
        "POD_ROWS": POD_ROWS,
        # namespace/pod/container copied from the exporter's labels at the end of each rule of a level
        # that computes them; a rule reading recorded series of the bundle keeps theirs instead
        "K8S": k8s,
        # the pod-info helper carries the pod's copies, which a join with it brings along
        "K8S_JOIN": tuple(pair for pair in k8s["container"] if pair not in k8s["pod"]),
        # the copies a workload sum makes: none when it sums the recorded series below it
        "K8S_WORKLOAD_SUM": () if levels & {"pod", "container"} else k8s["namespace"],
        # helper series are emitted only when a selected level reads them
        "need_info": bool(levels & {"container", "pod", "workload"}),
        "need_usage": bool(levels & {"container", "pod", "workload", "namespace"}),
        "need_counters": bool(levels & {"container", "pod", "workload", "namespace"}),
        "need_alloc": bool(levels & {"container", "pod"}),
    }


def _shared_exprs(by: Mapping[str, str], L: Mapping[str, str], levels: set[str], rate_window: str) -> dict[str, str]:
    """Sub-expressions several rules reuse (capacities, usage, totals), by name.

    ``max`` de-duplicates a node scraped by two jobs; an inner ``max by (..., uuid)`` counts each GPU once.
    """
    exprs = {
        "cap_gpu": f"max {by['N']}(nvidia_gpu_num_devices) * 100",
        "cap_mem": f"max {by['N']}(nvidia_gpu_node_memory_total_bytes)",
        "alloc_gpu": f"max {by['N']}(nvidia_gpu_node_healthy_devices) * 100",
        "alloc_mem": f"max {by['N']}(nvidia_gpu_node_healthy_memory_bytes)",
        "node_used": f"sum {by['N']}(max {by['NU']}(nvidia_gpu_duty_cycle{{{DEVICE_ROWS}}}))",
        "node_mem": f"sum {by['N']}(max {by['NU']}(nvidia_gpu_memory_used_bytes{{{DEVICE_ROWS}}}))",
        # every GPU the exporter reports, one series per card (value: its memory)
        "cards": f"max {by['CARD']}(nvidia_gpu_memory_total_bytes)",
        "cluster_total": f"sum {by['CL']}(max {by['N']}(nvidia_gpu_node_healthy_devices)) * 100",
        "cluster_mem_total": f"sum {by['CL']}(max {by['N']}(nvidia_gpu_node_healthy_memory_bytes))",
        "cluster_used": f"sum {by['CL']}(max {by['NU']}(nvidia_gpu_duty_cycle{{{DEVICE_ROWS}}}))",
        "cluster_mem": f"sum {by['CL']}(max {by['NU']}(nvidia_gpu_memory_used_bytes{{{DEVICE_ROWS}}}))",
        "workload_used": _workload_sum(by["W"], L["PI"], HELPERS["duty"], HELPERS["info"]),
        "workload_mem": _workload_sum(by["W"], L["PI"], HELPERS["mem"], HELPERS["info"]),
        **_counter_exprs(by, L["PI"], HELPERS, rate_window),
    }
    if "node" in levels:
        # The node series count each GPU once already: the cluster sums them instead of re-reading
        # every per-GPU row (the node section comes before the workload, namespace and cluster ones).
        exprs |= {
            "cluster_total": f"sum {by['CL']}(kube_node_status_allocatable_gpu)",
            "cluster_mem_total": f"sum {by['CL']}(kube_node_status_allocatable_gpu_memory_bytes)",
            "cluster_used": f"sum {by['CL']}(k8s_node_gpu_used)",
            "cluster_mem": f"sum {by['CL']}(k8s_node_gpu_memory_used_bytes)",
        }
    return exprs


def _counter_exprs(by: Mapping[str, str], pod_key: str, helpers: Mapping[str, str], w: str) -> dict[str, str]:
    """The busy-seconds and energy roll-ups above the container helpers (docs/rules.md).

    rate first, then sum (a sum of counters breaks when one of them goes away); ``max``
    de-duplicates a node scraped twice; the energy rows include the unattributed ones: together,
    the devices' energy.
    """
    dev_busy = f"max {by['NU']}(rate(nvidia_gpu_busy_seconds_total[{w}]))"
    dev_power = f"max {by['NUC']}(rate(nvidia_gpu_container_energy_joules_total[{w}]))"
    return {
        "workload_busy": _workload_sum(by["W"], pod_key, helpers["busy"], helpers["info"]) + "\n* 100",
        "workload_power": _workload_sum(by["W"], pod_key, helpers["energy"], helpers["info"]),
        "node_busy": f"sum {by['N']}({dev_busy}) * 100",
        "node_power": f"sum {by['N']}({dev_power})",
        "cluster_busy": f"sum {by['CL']}({dev_busy}) * 100",
        "cluster_power": f"sum {by['CL']}({dev_power})",
    }


def _workload_sum(by_w: str, pod_key: str, series: str, info: str) -> str:
    # Pods the exporter sent no owner for cannot be attributed to a workload: left out.
    return (
        f"sum {by_w}(\n  {series}\n  * on ({pod_key}) group_left (workload_kind, workload_name)\n"
        f'    {info}{{workload_name!=""}}\n)'
    )


def _parenthesized(text: str) -> str:
    """A multi-line expression inside parentheses (an operand of a binary operator); one line as is."""
    text = textwrap.dedent(str(text)).strip()
    return f"(\n{textwrap.indent(text, '  ')}\n)" if "\n" in text else text


def _exprblock(text: str, indent: int = 6) -> str:
    """Format a rule body as the lines of a YAML block scalar at ``indent`` columns."""
    lines = [ln.rstrip() for ln in textwrap.dedent(text).splitlines() if ln.strip()]
    return "\n".join(" " * indent + ln for ln in lines)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["exprblock"] = _exprblock
    env.filters["parenthesized"] = _parenthesized
    env.filters["with_k8s_labels"] = with_k8s_labels
    return env


def render_rules(opts: RuleOptions) -> str:
    """Return the plain Prometheus rule file (``groups:``) for ``opts``."""
    opts.validate()
    return _environment().get_template("rules.yaml.j2").render(**_context(opts))


def render_prometheusrule(
    opts: RuleOptions,
    name: str = "kube-gpu-exporter",
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Return the bundle wrapped in a ``monitoring.coreos.com/v1`` PrometheusRule object."""
    opts.validate()
    meta = object_metadata(name, namespace, labels, RuleOptionsError)
    env = _environment()
    groups = env.get_template("groups.yaml.j2").render(**_context(opts))
    # yaml.safe_dump quotes label values as needed (e.g. "true", "1"), which hand-written
    # template text would get wrong.
    metadata = yaml.safe_dump({"metadata": meta}, default_flow_style=False, sort_keys=False)
    args = ["--format=prometheusrule", *opts.to_args(), f"--name={name}", *metadata_args(namespace, labels)]
    return env.get_template("prometheusrule.yaml.j2").render(
        metadata=metadata, groups=groups, cli_args=" ".join(args)
    )
