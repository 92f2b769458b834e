"""What the rules, alerts and dashboards generators share.

``exporter.bundle.rules``, ``exporter.bundle.alerts`` and ``exporter.bundle.dashboards`` each keep their own
options class (a :class:`LabelOptions`) and error class; the helpers here raise the error class
they are given, so each CLI reports ``kube-gpu-exporter <command>: error: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from exporter.bundle.option_table import CONTROL_WHY, Option, options_dataclass, unprintable
from exporter.exposition.label_names import FIXED_LABELS as FIXED_LABELS  # public here too
from exporter.exposition.label_names import check_label_names
from exporter.model import one_line

# Prometheus duration syntax (units in descending order, each at most once).
# "\Z", not "$": "$" matches before a final newline, which would break a generated file's header.
DURATION_RE = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?\Z")
_DURATION_UNITS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")

# The names kube-prometheus-stack joins and routes on (kube-state-metrics, cAdvisor, the Prometheus
# Operator's AlertmanagerConfig `namespace` matcher), in the order a series gains them: a
# namespace-level series carries the first, a pod-level one two, a container-level one all three.
K8S_LABELS: tuple[str, ...] = ("namespace", "pod", "container")
K8S_LEVELS: dict[str, int] = {"namespace": 1, "pod": 2, "container": 3}

Error = type[Exception]


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration such as ``1h30m``; raises ValueError when malformed."""
    if not text or not DURATION_RE.match(text):
        raise ValueError(f"{text!r} is not a Prometheus duration")
    return sum(int(n) * _DURATION_UNITS[u] for n, u in re.findall(r"(\d+)(ms|[ywdhms])", text))


def is_positive_duration(text: str) -> bool:
    """Whether ``text`` is a Prometheus duration longer than zero."""
    try:
        return duration_seconds(text) > 0
    except ValueError:
        return False


# ------------------------------------------------------------------ options


def _no_label(value: str | None, flag: str, error: Error) -> str | None:
    return value or None  # an empty --cluster-label is none


# The label names every generator takes, one entry each. Their check is the exporter's own check of its
# label flags, across the entries (duplicates): :meth:`LabelOptions.validate_labels`. The cluster label's
# help and docs row differ by generator: :func:`label_options`.
LABEL_OPTIONS: tuple[Option, ...] = (
    Option("pod_label", "pod_name", "pod label name (default %(default)s)", "--pod-label",
           doc="must match the exporter's flag of the same name"),
    Option("namespace_label", "namespace_name", "namespace label (default %(default)s)", "--namespace-label",
           doc="must match the exporter's flag of the same name"),
    Option("container_label", "container_name", "container label (default %(default)s)", "--container-label",
           doc="must match the exporter's flag of the same name"),
    Option("node_label", "node_name", "node label (default %(default)s)", "--node-label",
           doc="if you relabel `node_name` at scrape time"),
    Option("cluster_label", None, "label telling clusters apart (default: none)", "--cluster-label",
           doc="a label that tells clusters apart", doc_default="none", convert=_no_label),
)  # fmt: skip


def label_options(cluster_help: str, cluster_doc: str) -> tuple[Option, ...]:
    """:data:`LABEL_OPTIONS` with a generator's own ``--help`` and docs meaning of ``--cluster-label``."""
    return (*LABEL_OPTIONS[:-1], replace(LABEL_OPTIONS[-1], help=cluster_help, doc=cluster_doc))


@options_dataclass(LABEL_OPTIONS)
class LabelOptions:
    """The label names every generator takes; they must match what the exporter was started with."""

    def validate_labels(self, error: Error) -> None:
        """Raise ``error`` naming the flag of a label name that is invalid, reserved, the exporter's own or
        repeated: the exporter's own check of its flags (:func:`check_label_names`)."""
        named = [(o.flag, getattr(self, o.attr)) for o in LABEL_OPTIONS if getattr(self, o.attr) is not None]
        # --node-label names the exporter's node_name label (renamed if the scrape relabels it)
        check_label_names(named, error, renames={"--node-label": "node_name"})

    def k8s_labels(self, level: str) -> tuple[tuple[str, str], ...]:
        """(kube-prometheus-stack name, exporter label it is copied from) for a series of ``level``.

        ``level`` is ``namespace``, ``pod`` or ``container`` (see :data:`K8S_LABELS`). A name that one
        of the configured labels already has is left out: it is either that very label (``--pod-label
        pod``) or another dimension, which a copy would overwrite.
        """
        sources = {"namespace": self.namespace_label, "pod": self.pod_label, "container": self.container_label}
        taken = {*sources.values(), self.node_label, self.cluster_label}
        return tuple((name, sources[name]) for name in K8S_LABELS[: K8S_LEVELS[level]] if name not in taken)


def with_k8s_labels(expr: str, pairs: Sequence[tuple[str, str]]) -> str:
    """``expr`` inside one ``label_replace`` per (name, source) pair, copying ``source`` to ``name``.

    Applied to the result of ``expr``'s aggregations, never to a raw series: the scrape may attach
    ``namespace``/``pod`` of the exporter's own pod, which no ``by`` clause keeps, so the copies can
    only come from the exporter's labels. An empty source leaves the name unset.
    """
    if not pairs:
        return expr
    body = textwrap.indent(textwrap.dedent(expr).strip(), "  ")
    args = "".join(f',\n  "{name}", "$1", "{source}", "(.*)")' for name, source in pairs)
    return "label_replace(" * len(pairs) + "\n" + body + args


def parse_key_values(items: Sequence[str], flag: str, error: Error) -> dict[str, str]:
    """``["k=v", ...]`` of a repeatable ``flag`` as a dict; ``error`` for an item without ``=`` or key, or
    not one line (the header of a generated file repeats the items)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise error(f"{flag}: {item!r} must look like key=value")
        if unprintable(item):
            raise error(f"{flag}: {item!r} {CONTROL_WHY}")
        out[key] = value
    return out


# ------------------------------------------------------------------ Kubernetes objects


def check_namespace(namespace: str | None, error: Error) -> None:
    if namespace is not None and not K8S_NAME_RE.match(namespace):
        raise error(f"--namespace: {namespace!r} is not a valid Kubernetes namespace")


def object_metadata(
    name: str, namespace: str | None, labels: Mapping[str, str] | None, error: Error
) -> dict[str, object]:
    """Checked ``metadata`` of a PrometheusRule: name, namespace and labels when given."""
    if not K8S_NAME_RE.match(name):
        raise error(f"--name: {name!r} is not a valid Kubernetes object name")
    check_namespace(namespace, error)
    meta: dict[str, object] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    return meta


def prometheus_rule(metadata: Mapping[str, object], groups: Sequence[object]) -> dict[str, object]:
    """A ``monitoring.coreos.com/v1`` PrometheusRule holding ``groups``, for :func:`dump_yaml`."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": dict(metadata),
            "spec": {"groups": list(groups)}}


def metadata_args(namespace: str | None, labels: Mapping[str, str] | None) -> list[str]:
    """The ``--namespace`` and ``--label`` flags that reproduce an object's metadata."""
    args = [f"--namespace={namespace}"] if namespace else []
    return args + [f"--label={k}={v}" for k, v in (labels or {}).items()]


def command_line(command: str, args: Sequence[str]) -> str:
    """``kube-gpu-exporter <command> <args>``, shell-quoted, for a generated file's header."""
    return " ".join([f"kube-gpu-exporter {command}", *map(shlex.quote, args)])


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings; never wraps long lines."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _str_representer)


def dump_yaml(doc: object) -> str:
    """YAML of ``doc`` in key order, multi-line strings (PromQL, JSON) as block scalars."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)


# ------------------------------------------------------------------ CLI


def add_prometheusrule_arguments(p: argparse.ArgumentParser, name: str, label_help: str) -> None:
    """``--format plain|prometheusrule`` and the PrometheusRule's ``--name``, ``--namespace``, ``--label``."""
    p.add_argument("--format", choices=("plain", "prometheusrule"), default="plain")
    p.add_argument("--name", default=name, help="PrometheusRule metadata.name")
    p.add_argument("--namespace", default=None, help="PrometheusRule metadata.namespace")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help=label_help)


def fail(command: str, exc: Exception) -> int:
    """Report an options error the way every generator does; the exit status (2)."""
    print(one_line(f"kube-gpu-exporter {command}: error: {exc}"), file=sys.stderr)  # one line, whatever it echoes
    return 2


def write_output(text: str, output: str | None) -> None:
    """Write ``text`` to stdout (``-`` or no output given) or to the file ``output``."""
    if output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(output).write_text(text, encoding="utf-8")


def rule_file_main(
    command: str,
    error: Error,
    args: argparse.Namespace,
    options: Callable[[argparse.Namespace], Any],
    plain: Callable[[Any], str],
    prometheusrule: Callable[[Any, str, str | None, dict[str, str]], str],
) -> int:
    """``main()`` of a rule-file generator: render ``--format`` (see :func:`add_prometheusrule_arguments`)
    to ``--output`` and return 0; on ``error`` report it and return 2."""
    try:
        opts = options(args)
        if args.format == "plain":
            text = plain(opts)
        else:
            text = prometheusrule(opts, args.name, args.namespace, parse_key_values(args.label, "--label", error))
    except error as exc:
        return fail(command, exc)
    write_output(text, args.output)
    return 0
