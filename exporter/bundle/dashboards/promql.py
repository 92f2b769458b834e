"""The label names, selectors and ``by`` lists the dashboards' queries are written with."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.bundle.dashboards.options import DashboardOptions

# The exporter's rows of a GPU (docs/metrics.md), told apart by allocate_mode.
DEVICE_ROWS = 'allocate_mode=~"exclusive|None"'  # exactly one row per GPU: the device values
SHARE_ROWS = 'allocate_mode="share"'  # one row per container on a shared GPU
# A MIG device is a device of its own in every family, with its card's minor number, power and
# temperature (docs/metrics.md, MIG); this family names its card (parent_uuid) and profile.
MIG_INFO = "nvidia_gpu_mig_device_info"
# An allocation the exporter could not place on a GPU yet has uuid="" (docs/metrics.md).
UUID_KNOWN, UUID_UNKNOWN = 'uuid!=""', 'uuid=""'


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
        return 'uuid=~"$gpu"'

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

    # devices and cards: a device is a whole GPU or a MIG device (node, uuid); a card is a physical GPU

    @property
    def device(self) -> tuple[str, str]:
        """The labels that tell devices apart: (node, uuid). A MIG device shares its card's minor number."""
        return self.node, "uuid"

    def gpu_names(self, *matchers: str) -> str:
        """One series (value 1) per device with a ``gpu`` label naming it in legends and tables.

        A whole GPU is named by its minor number (``3``), a MIG device by its card's minor number,
        its profile and its GPU instance (``0/3g.40gb GI 2``): two slices of a profile on one card
        differ only by the instance.
        """
        dev = self.device
        mig = f"max {self.by(*dev, 'minor_number', 'profile', 'gpu_instance_id')} ({MIG_INFO}{self.s(*matchers)})"
        whole = f"max {self.by(*dev, 'minor_number')} (nvidia_gpu_info{self.s(*matchers)})"
        return (
            f"group {self.by(*dev, 'gpu')} (\n"
            f'  label_join(label_join({mig}, "gpu", "/", "minor_number", "profile"), '
            f'"gpu", " GI ", "gpu", "gpu_instance_id")\n'
            f'  or {self.on(*dev)} label_replace({whole}, "gpu", "$1", "minor_number", "(.*)")\n'
            ")"
        )

    def named(self, expr: str, *matchers: str) -> str:
        """``expr`` (series that keep the node and uuid labels) with each device's ``gpu`` name added."""
        return f"({expr})\n* {self.on(*self.device)} group_left (gpu) {self.gpu_names(*matchers)}"

    def per_device(self, series: str, *matchers: str, names: tuple[str, ...] = ()) -> str:
        """``series`` once per device (a device scraped twice, or on several rows, counted once), named.

        ``matchers`` select the series, ``names`` the devices named (the node, not a row's allocate_mode).
        """
        return self.named(f"max {self.by(*self.device)} ({series}{self.s(*matchers)})", *names)

    def allocated_per_device(
        self, series: str, *labels: str, where: tuple[str, ...], names: tuple[str, ...] = ()
    ) -> str:
        """An allocation ``series`` per device and ``labels``, named; one on no known GPU (``uuid=""``) as "unknown".

        ``where`` selects the series, ``names`` the devices named (as :meth:`per_device`).
        """
        by = self.by(*self.device, *labels)
        placed = self.named(f"max {by} ({series}{self.s(*where, UUID_KNOWN)})", *names)
        unplaced = f"max {by} ({series}{self.s(*where, UUID_UNKNOWN)})"
        return f'{placed}\nor label_replace({unplaced}, "gpu", "unknown", "uuid", "")'

    def cards(self, *matchers: str) -> str:
        """One series (value 1) per device with the ``card`` (physical GPU uuid) it is on.

        A MIG device's card is its ``parent_uuid``, a whole GPU is its own card.
        """
        dev = self.device
        mig = f"max {self.by(*dev, 'parent_uuid')} ({MIG_INFO}{self.s(*matchers)})"
        whole = f"max {self.by(*dev)} (nvidia_gpu_info{self.s(*matchers)})"
        return (
            f"group {self.by(*dev, 'card')} (\n"
            f'  label_replace({mig}, "card", "$1", "parent_uuid", "(.+)")\n'
            f'  or {self.on(*dev)} label_replace({whole}, "card", "$1", "uuid", "(.+)")\n'
            ")"
        )

    def per_card(self, series: str, *matchers: str, cards: tuple[str, ...] = ()) -> str:
        """A card's value (power, temperature) once per physical GPU: (node, card, minor_number).

        The exporter repeats it on every row of a GPU and on every MIG device of a card; summing
        devices would count a MIG card once per slice. ``cards`` select the devices mapped to cards.
        """
        dev = self.device
        return (
            f"max {self.by(self.node, 'card', 'minor_number')} (\n"
            f"  max {self.by(*dev, 'minor_number')} ({series}{self.s(*matchers)})\n"
            f"  * {self.on(*dev)} group_left (card) {self.cards(*cards)}\n"
            ")"
        )

    def card_count(self, *labels: str, where: tuple[str, ...] = ()) -> str:
        """Physical GPUs by the cluster and ``labels``: a card counted once, however many MIG devices it holds."""
        return f"count{self._by(*labels)} (count {self.by(self.node, 'card')} ({self.cards(*where)}))"

    def utilization(self, *matchers: str) -> str:
        """Device duty cycle once per device; absent for MIG devices (NVML gives them no utilization)."""
        return f"max {self.by(*self.device)} (nvidia_gpu_duty_cycle{self.s(DEVICE_ROWS, *matchers)})"

    def without_utilization(self, *labels: str, where: tuple[str, ...] = ()) -> str:
        """Devices that report no duty cycle (MIG devices) by the cluster and ``labels``; 0 where all do."""
        devices = f"group {self.by(*self.device)} (nvidia_gpu_info{self.s(*where)})"
        by, on = self._by(*labels), f" {self.on(*labels)}" if self.cluster or labels else ""
        return (
            f"count{by} ({devices} unless {self.on(*self.device)} {self.utilization(*where)})\n"
            f"or{on} 0 * count{by} ({devices})"
        )

    def _by(self, *labels: str) -> str:
        """`` by (<cluster>, labels...)``, or nothing when that list is empty (a plain ``count(...)``)."""
        return f" {self.by(*labels)}" if self.cluster or labels else ""
