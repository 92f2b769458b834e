"""Dynamic Resource Allocation (resource.k8s.io): GPUs and MIG devices granted through ResourceClaims.

The node-wide work (slice devices -> uuids, claims -> holders, a shared claim's split) is done by
:mod:`exporter.attribution.dra` before the schemes run; this scheme hands each container its part.
It comes first in ``SCHEMES``: a DRA grant is the kubelet's (or the scheduler's) word, and a
container that got ``nvidia.com/gpu`` through DRA's extended resources must not be counted again
by the device plugin's scheme.
"""

from __future__ import annotations

from exporter.attribution.schemes.base import Allocation, NodeContext, Scheme
from exporter.model import ContainerInfo, PodInfo


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    return (pod.uid, c.name) in node.dra


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    return list(node.dra.get((pod.uid, c.name), ()))


SCHEME = Scheme("DRA (ResourceClaims: whole, MIG, shared claims)", claims, allocate)
