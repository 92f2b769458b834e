"""The same fleet in the vocabulary of the seed's TKE rule group, and that group, renamed.

Inputs (bench/data/tke_seed_rules.yaml says which rule reads what):

- kube-state-metrics: ``kube_node_status_capacity`` / ``kube_node_status_allocatable``
  ``{node, resource, unit}`` (cpu, memory, pods, ephemeral_storage and TKE's
  ``tencent_com_vcuda_core`` = 100 per GPU, ``tencent_com_vcuda_memory`` in 256 MiB units, rounded
  down as the device plugin advertises them), ``kube_node_labels{node, node_role="Node"}``,
  ``kube_pod_status_phase{namespace, pod, pod_name, uid, phase}`` (five phases per pod);
- TKE's ``__pod_info2{namespace, pod_name, workload_kind, workload_name, node, node_role, unInstanceId}``;
- the GPU manager's ``container_gpu_utilization{gpu}`` (percent of one GPU; ``gpu="total"`` and one
  row per device) and ``container_gpu_memory_total{gpu_memory}`` (MiB), ``container_request_gpu_utilization``
  (GPUs) and ``container_request_gpu_memory`` (MiB) per container.

Every value is the fleet model's (the exporter's inputs): MIG devices count as devices of 100
vcuda-core each, a MIG container's utilization is unknown (no row), as it is for the exporter.
So where the two bundles disagree, the rules do, not their inputs.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from bench.fleet_model import MIB, Node
from bench.fleet_render import Family, Sample, pod_uid, with_labels
from bench.prom import renamed_rules

SEED_RULES = Path(__file__).resolve().parent / "data" / "tke_seed_rules.yaml"
PREFIX = "tke:"
VCUDA_MEMORY_UNIT = 256 * MIB
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def _key(name: str, labels: dict[str, str], extra: bytes) -> bytes:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return with_labels(f"{name}{{{text}}}".encode(), extra)


class _Out:
    def __init__(self, extra: bytes) -> None:
        self.extra = extra
        self.fams: dict[str, tuple[str, list[Sample]]] = {}

    def add(self, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        self.fams.setdefault(name, (doc, []))[1].append(Sample(_key(name, labels, self.extra), value))

    def result(self) -> list[Family]:
        return [Family(n, "gauge", doc, tuple(s)) for n, (doc, s) in self.fams.items()]


def _node_capacity(node: Node, healthy: bool) -> dict[str, tuple[str, float]]:
    devices = [d for d in node.devices if not (healthy and d.lost)]
    memory = sum(d.memory_total // VCUDA_MEMORY_UNIT for d in devices)
    return {"cpu": ("core", 96.0 if not healthy else 95.5), "memory": ("byte", 1.08e12), "pods": ("integer", 110.0),
            "ephemeral_storage": ("byte", 3.8e12), "tencent_com_vcuda_core": ("integer", 100.0 * len(devices)),
            "tencent_com_vcuda_memory": ("integer", float(memory))}


def ksm_families(node: Node) -> list[Family]:
    """kube-state-metrics' and TKE's node and pod series for ``node`` (instance: the cluster's KSM)."""
    out = _Out(f'cluster="{node.cluster}",instance="kube-state-metrics.{node.cluster}:8080"'.encode())
    out.add("kube_node_labels", "Kubernetes labels converted to Prometheus labels.",
            {"node": node.name, "node_role": "Node", "label_kubernetes_io_hostname": node.name,
             "label_nvidia_com_gpu_product": node.devices[0].product.name.replace(" ", "-")}, 1)
    for metric, healthy in (("kube_node_status_capacity", False), ("kube_node_status_allocatable", True)):
        for resource, (unit, value) in _node_capacity(node, healthy).items():
            out.add(metric, f"The {metric.rsplit('_', 1)[1]} for different resources of a node.",
                    {"node": node.name, "resource": resource, "unit": unit}, value)
    instance_id = "ins-" + pod_uid(node, node.pods[0])[:8] if node.pods else "ins-idle"
    for pod in node.pods:
        uid = pod_uid(node, pod)
        for phase in PHASES:
            out.add("kube_pod_status_phase", "The pods current phase.",
                    {"namespace": pod.namespace, "pod": pod.name, "pod_name": pod.name, "uid": uid, "phase": phase},
                    1.0 if phase == "Running" else 0.0)
        out.add("__pod_info2", "TKE pod information (workload, node).",
                {"namespace": pod.namespace, "pod_name": pod.name, "workload_kind": pod.workload_kind,
                 "workload_name": pod.workload_name, "node": node.name, "node_role": "Node",
                 "unInstanceId": instance_id}, 1)
    return out.result()


def gpu_manager_families(node: Node) -> list[Family]:
    """The GPU manager's per-container series for ``node`` (instance: the node)."""
    out = _Out(f'cluster="{node.cluster}",instance="{node.instance}"'.encode())
    for pod in node.pods:
        for c in pod.containers:
            base = {"namespace": pod.namespace, "pod_name": pod.name, "container_name": c.name}
            sms = [u.sm for u in c.uses if u.sm is not None]
            if sms:
                out.add("container_gpu_utilization", "gpu utilization", base | {"gpu": "total"}, float(sum(sms)))
                for u in c.uses:
                    out.add("container_gpu_utilization", "gpu utilization", base | {"gpu": str(u.device)},
                            float(u.sm or 0))
            out.add("container_gpu_memory_total", "gpu memory usage in MiB", base | {"gpu_memory": "total"},
                    sum(u.memory for u in c.uses) / MIB)
            for u in c.uses:
                out.add("container_gpu_memory_total", "gpu memory usage in MiB",
                        base | {"gpu_memory": f"gpu{u.device}"}, u.memory / MIB)
            compute = [u.compute for u in c.uses if u.compute is not None]
            if compute:
                out.add("container_request_gpu_utilization", "request of gpu utilization", base, sum(compute) / 100)
            grants = [u.memory_grant for u in c.uses if u.memory_grant is not None]
            if grants:
                out.add("container_request_gpu_memory", "request of gpu memory", base, sum(grants) / MIB)
    return out.result()


def tke_families(node: Node) -> list[Family]:
    """Every TKE input series of ``node``."""
    return ksm_families(node) + gpu_manager_families(node)


@functools.cache
def seed_records() -> tuple[str, ...]:
    """The series the seed's group records, in its order."""
    doc = yaml.safe_load(SEED_RULES.read_text())
    return tuple(r["record"] for g in doc["groups"] for r in g["rules"])


def seed_rule_file(prefix: str = PREFIX, group: str = "tke-seed") -> str:
    """The seed's group with every recorded series renamed ``<prefix><name>`` (in records and exprs).

    The two bundles record the same names (kube_node_status_capacity_gpu, k8s_cluster_gpu_total,
    ...): renamed, neither reads the other's output. Nothing else changes.
    """
    doc = yaml.safe_load(SEED_RULES.read_text())
    rules = renamed_rules([r for g in doc["groups"] for r in g["rules"]], prefix)
    for g in doc["groups"]:
        g["name"] = group
        g["rules"], rules = rules[:len(g["rules"])], rules[len(g["rules"]):]
    return yaml.safe_dump(doc, sort_keys=False, width=1000)
