"""The label names, selectors and ``by`` lists the dashboards' queries are written with."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.bundle.dashboards.options import DashboardOptions

# The exporter's rows of a GPU (docs/metrics.md), told apart by allocate_mode.
DEVICE_ROWS = 'allocate_mode=~"exclusive|None"'  # exactly one row per GPU: the device values
SHARE_ROWS = 'allocate_mode="share"'  # one row per container on a shared GPU


@dataclass(frozen=True)
class Selectors:
    """Label names of one rendering and the PromQL fragments built from them.

    With a cluster label every selector, ``by`` and ``on`` list starts with it, so no query mixes
    two clusters; without one they are as if the label did not exist.
    """

    cluster: tuple[str, ...]  # empty unless --cluster-label
    node: str
    ns: str
    pod: str
    ctr: str

    @classmethod
    def of(cls, opts: DashboardOptions) -> Selectors:
        return cls(
            cluster=(opts.cluster_label,) if opts.cluster_label else (),
            node=opts.node_label,
            ns=opts.namespace_label,
            pod=opts.pod_label,
            ctr=opts.container_label,
        )

    # matchers on the dashboards' variables
    @property
    def this_node(self) -> str:
        return f'{self.node}="$node"'

    @property
    def this_namespace(self) -> str:
        return f'{self.ns}="$namespace"'

    @property
    def this_workload(self) -> str:
        return 'workload_name="$workload"'

    @property
    def these_pods(self) -> str:
        return f'{self.pod}=~"$pod"'

    @property
    def these_gpus(self) -> str:
        return 'minor_number=~"$gpu"'

    def s(self, *matchers: str) -> str:
        """A label selector with the cluster matcher first; empty string when there is none."""
        ms = [*(f'{c}="$cluster"' for c in self.cluster), *matchers]
        return "{" + ", ".join(ms) + "}" if ms else ""

    def by(self, *labels: str) -> str:
        """``by (<cluster>, labels...)``."""
        return f"by ({', '.join([*self.cluster, *labels])})"

    def on(self, *labels: str) -> str:
        """``on (<cluster>, labels...)``."""
        return f"on ({', '.join([*self.cluster, *labels])})"

    def labels(self, *pairs: tuple[str, str]) -> list[tuple[str, str]]:
        """A table's (label, header) columns, the cluster first."""
        return [*((c, "Cluster") for c in self.cluster), *pairs]

    def legend(self, *labels: str) -> str:
        """A legend format naming ``labels`` joined by ``/``: ``{{a}}/{{b}}``."""
        return "/".join(f"{{{{{label}}}}}" for label in labels)
