"""Rule 9: the GPU's own infrastructure is no tenant. Pure.

An MPS control daemon (NVIDIA's device plugin in MPS mode, its DRA driver for a claim configured for MPS,
GKE's MPS) starts ``nvidia-cuda-mps-server``, which NVML lists on every GPU the daemon serves with its own
context (about 25-30 MiB), next to the clients (listed too, in their own containers). The daemon's pod
holds no GPU, so by rules 5 and 6 it would be a share user and an unaccounted process: the unaccounted
alert would fire on every MPS node and the daemon's namespace would be billed.

So a process that belongs to no holder of the GPU it runs on, whose command name is the MPS server's or
control daemon's (``/proc/<pid>/comm`` keeps 15 characters: both read ``nvidia-cuda-mps``), and that runs
on the host or in a pod of an infrastructure namespace (``--infrastructure-namespaces``), is
infrastructure: it counts in the device's totals and is listed as such, and is neither a user nor
unaccounted. The command name is its author's to choose, the namespace is not (creating pods there needs
rights a tenant does not have): a tenant's process named so is still unaccounted. A holder's own process
of any name stays the holder's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

MPS_COMM = "nvidia-cuda-mps"  # nvidia-cuda-mps-server and nvidia-cuda-mps-control, cut to 15 characters
# Where the MPS daemons run by default: GKE and the device plugin's static pods (kube-system), the GPU
# operator (its Helm chart's and OpenShift's namespace), the device plugin's and the DRA driver's Helm charts.
DEFAULT_NAMESPACES = ("kube-system", "gpu-operator", "nvidia-gpu-operator", "nvidia-device-plugin",
                      "nvidia-dra-driver-gpu")
MAX_NAMESPACES = 64
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class _Pod(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...


class _Process(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def pod(self) -> _Pod | None: ...
    @property
    def container(self) -> str | None: ...
    @property
    def host(self) -> bool: ...


P = TypeVar("P", bound=_Process)


def parse_namespaces(text: str) -> frozenset[str]:
    """``a,b,c`` -> the namespaces; ValueError (one line) for a name Kubernetes would not accept."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) > MAX_NAMESPACES:
        raise ValueError(f"at most {MAX_NAMESPACES} namespaces, got {len(names)}")
    for n in names:
        if not _DNS_LABEL.fullmatch(n):
            raise ValueError(f"{n!r} is not a namespace name (a DNS label: a-z, 0-9 and '-', at most 63)")
    return frozenset(names)


def is_infrastructure(p: _Process, comm: str | None, namespaces: frozenset[str]) -> bool:
    """Whether ``p`` (not a holder's process) is an MPS daemon of the host or of an infrastructure namespace."""
    if comm is None or not comm.startswith(MPS_COMM):
        return False
    # A pod the cache does not know yet (or while the API is down) is no host process: no namespace, no trust.
    return p.host if p.pod is None else p.pod.namespace in namespaces


def split(rows: Sequence[P], holders: Mapping[tuple[str, str], object], comms: Mapping[int, str],
          namespaces: frozenset[str]) -> tuple[list[P], tuple[P, ...]]:
    """One GPU's processes -> (those the tenant rules judge, its infrastructure processes)."""
    tenants: list[P] = []
    infrastructure: list[P] = []
    for r in rows:
        held = r.pod is not None and r.container is not None and (r.pod.uid, r.container) in holders
        (infrastructure if not held and is_infrastructure(r, comms.get(r.pid), namespaces) else tenants).append(r)
    return tenants, tuple(infrastructure)
