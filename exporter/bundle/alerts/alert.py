"""The :class:`Alert` record and the label sets and description snippets the alert modules share."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.bundle.alerts.options import AlertOptions
from exporter.bundle.common import with_k8s_labels

SEVERITIES: frozenset[str] = frozenset({"critical", "warning", "info"})


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


def by(labels: Sequence[str]) -> str:
    """``by (a, b)``; a label repeated (e.g. an option naming a fixed label) is kept once."""
    return f"by ({', '.join(dict.fromkeys(labels))})"


def on(labels: Sequence[str]) -> str:
    """``on (a, b)``."""
    return f"on ({', '.join(labels)})"


_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


def spelled(duration: str) -> str:
    """``10m`` as a description says it (``10 minutes``); other forms stay as written (``1h30m``)."""
    m = re.fullmatch(r"(\d+)([smhd])", duration)
    if not m:
        return duration
    n, unit = int(m.group(1)), _UNITS[m.group(2)]
    return f"{n} {unit}{'' if n == 1 else 's'}"


def var(label: str) -> str:
    """The Go template printing ``label`` of the alert's series."""
    return f"{{{{ $labels.{label} }}}}"


@dataclass(frozen=True)
class Labels:
    """The label names of one install (from :class:`AlertOptions`) and what the alerts build from them."""

    cluster: tuple[str, ...]  # empty unless a cluster label tells clusters apart
    node: str
    namespace: str
    pod: str
    container: str
    instance: str
    # (kube-prometheus-stack name, exporter label) pairs a container's alert also carries
    k8s: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, opts: AlertOptions) -> Labels:
        return cls(
            cluster=(opts.cluster_label,) if opts.cluster_label else (),
            node=opts.node_label,
            namespace=opts.namespace_label,
            pod=opts.pod_label,
            container=opts.container_label,
            instance=opts.instance_label,
            k8s=opts.k8s_labels("container"),
        )

    def for_container(self, expr: str) -> str:
        """``expr`` (one series per container, or per process outside any pod) with ``namespace``,
        ``pod`` and ``container`` copied from the exporter's labels after its aggregations, for
        kube-prometheus-stack's routing (AlertmanagerConfig) and grouping by ``namespace``."""
        return with_k8s_labels(expr, self.k8s)

    @property
    def gpu(self) -> list[str]:
        """One GPU as reported by one exporter."""
        return [*self.cluster, self.instance, self.node, "uuid", "minor_number"]

    @property
    def gpu_named(self) -> list[str]:
        return [*self.gpu, "name"]

    @property
    def container_keys(self) -> list[str]:
        """One container as seen by one exporter."""
        return [*self.cluster, self.instance, self.node, self.namespace, self.pod, self.container]

    @property
    def where(self) -> str:
        """The node, in a description."""
        return var(self.node)

    @property
    def target(self) -> str:
        """The scrape target, in a description."""
        return var(self.instance)

    @property
    def gpu_desc(self) -> str:
        """``GPU <minor> (<uuid>) on node <node>``, in a description."""
        return f"GPU {var('minor_number')} ({var('uuid')}) on node {self.where}"

    @property
    def who(self) -> str:
        """``<namespace>/<pod>``, in a description."""
        return f"{var(self.namespace)}/{var(self.pod)}"

    # Processes outside any pod carry empty pod labels, which Prometheus drops: both phrases test for it.
    @property
    def in_pod(self) -> str:
        """``pod <ns>/<pod> (container <c>)`` or ``a process outside any pod``."""
        return (
            f"{{{{ if $labels.{self.pod} }}}}pod {self.who} (container {var(self.container)})"
            "{{ else }}a process outside any pod{{ end }}"
        )

    @property
    def owner(self) -> str:
        """``of pod <ns>/<pod> (container <c>)`` or ``outside any pod``."""
        return (
            f"{{{{ if $labels.{self.pod} }}}}of pod {self.who} (container {var(self.container)})"
            "{{ else }}outside any pod{{ end }}"
        )
