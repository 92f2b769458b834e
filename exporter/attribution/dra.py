"""DRA: ResourceSlice devices -> NVML uuids, and claims -> the containers that hold each GPU. Pure.

A DRA device is named ``(driver, pool, device)``: ``gpu.nvidia.com`` / ``<node>`` / ``gpu-<minor>``
or a MIG name. Names are neither NVML indices nor uuids, and every node reuses them, so a device
is identified through this node's ResourceSlice: its ``uuid`` attribute, else its PCI bus id or
minor attribute (older drivers), else (a MIG device announced before it exists) its parent's uuid
and profile when they single out one MIG device. Anything else is a counted skip.

Which containers hold a device comes from the kubelet's ``dynamic_resources`` when it lists any
for the container (authoritative), else from the Pod's claim references joined with the allocated
ResourceClaim, which must be reserved for that pod (a pod cannot take a device by naming another
pod's claim). The kubelet outranks the API objects, as pod-resources outranks annotations for
device plugins: a device it lists for some container is held by no container the API objects alone
name (``dra_claim_kubelet_disagrees``). A claim belongs to its namespace: one the kubelet names in
another namespace than the pod's is refused, and of a claim's ``reservedFor`` only the known pods of
its own namespace count as consumers (``dra_claim_cross_namespace``). ``adminAccess`` results
(monitoring) hold nothing. A device held by several containers, of one pod or of several, or whose
claim has several consumers, is shared: its one grant (100 % and the device's memory) is split
evenly among its holders, so every claim counts once however many containers name it. A device under
a sharing config of NVIDIA's driver (MPS, time-slicing: :mod:`exporter.attribution.dra_sharing`) is
shared whatever its holders: each gets the MPS limits (``dra-mps``), or no fixed grant
(``dra-time-slicing``). A device that allows several allocations (DRAConsumableCapacity: the result
carries a ``shareID``) is not split: each claim holds the ``memory`` capacity its result consumed, the
scheduler's booking, and no compute (``dra-consumable``); several containers naming that claim split it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from exporter.attribution import dra_sharing
from exporter.attribution.dra_objects import MAX_RESULTS, ClaimInfo, ClaimResult, PodClaims, SliceDevice
from exporter.attribution.schemes.base import Allocation, amount
from exporter.model import ContainerInfo, DeviceSample, DynamicResource, PodInfo, PodResources

SCHEME_DRA = "dra"
SCHEME_DRA_SHARED = "dra-shared"
SCHEME_DRA_CONSUMABLE = "dra-consumable"
SCHEME_BY_STRATEGY = {dra_sharing.MPS: "dra-mps", dra_sharing.TIME_SLICING: "dra-time-slicing"}
GPU_DRIVERS = frozenset({"gpu.nvidia.com"})  # devices of other drivers (compute domains, NICs) are no GPUs
NOT_NVML = frozenset({"vfio"})  # passed through to a VM: NVML on the host does not list it

Triplet = tuple[str, str, str]  # (driver, pool, device)
ContainerKey = tuple[str, str]  # (pod uid, container)
Skip = Callable[[str], None]
_BUS = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def _bus(value: str) -> str:
    """``00000000:3B:00.0`` (NVML) and ``0000:3b:00.0`` (the slice) -> one comparable form."""
    m = _BUS.fullmatch(value.strip())
    return f"{int(m.group(1) or '0', 16):x}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower() if m else ""


def device_uuids(slices: Iterable[SliceDevice], devices: Sequence[DeviceSample], skip: Skip) -> dict[Triplet, str]:
    """Each slice device of this node that NVML lists, by (driver, pool, device) -> uuid."""
    uuids = {d.uuid for d in devices}
    whole = [d for d in devices if d.parent_uuid is None]
    by_bus = {_bus(d.pci_bus_id): d.uuid for d in whole if _bus(d.pci_bus_id)}
    by_minor = {d.minor_number: d.uuid for d in whole if d.minor_number is not None}
    out: dict[Triplet, str] = {}
    for s in slices:
        if s.kind in NOT_NVML:
            continue
        if s.uuid:
            uuid = s.uuid if s.uuid in uuids else None
            reason = "dra_device_not_in_nvml"
        elif s.parent_uuid:
            migs = [d.uuid for d in devices if d.parent_uuid == s.parent_uuid and d.mig_profile == s.profile]
            uuid, reason = (migs[0] if len(migs) == 1 else None), "dra_mig_device_ambiguous"
        else:
            uuid = by_bus.get(_bus(s.pci_bus_id)) if s.pci_bus_id else by_minor.get(s.minor)
            known = bool(s.pci_bus_id) or s.minor is not None
            reason = "dra_device_not_in_nvml" if known else "dra_device_attributes_unknown"
        if uuid is not None:
            out[(s.driver, s.pool, s.name)] = uuid
        elif s.driver in GPU_DRIVERS:
            skip(reason)
    return out


def index_dynamic_resources(pod_resources: Iterable[PodResources]) -> dict[tuple[str, str, str],
                                                                           tuple[DynamicResource, ...]]:
    """The kubelet's DRA entries by (namespace, pod, container); containers without any are left out."""
    return {(p.namespace, p.name, c.name): c.dynamic_resources
            for p in pod_resources for c in p.containers if c.dynamic_resources}


def _for_request(result: ClaimResult, requests: set[str]) -> bool:
    """Whether a result serves one of the container's requests (none named: all of the claim's)."""
    return not requests or "" in requests or any(
        result.request == r or result.request.startswith(r + "/") for r in requests)


def _requests(pc: PodClaims | None, container: str, claim_name: str) -> set[str]:
    """The requests a container names of one claim ({} when the pod is not known)."""
    if pc is None:
        return set()
    return {req for local, req in pc.containers.get(container, ()) if pc.claims.get(local) == claim_name}


def consumers(claim: ClaimInfo, namespaces: Mapping[str, str], skip: Skip) -> int:
    """How many pods a claim is reserved for that count: known pods (uid -> namespace) of its own namespace.

    ``reservedFor`` names pods by uid only, and a consumer is always in the claim's namespace: a known pod
    of another namespace is refused (counted once per claim); an unknown uid runs on no GPU of this node.
    """
    known = [namespaces[u] for u in claim.reserved_for if u in namespaces]
    if any(ns != claim.namespace for ns in known):
        skip("dra_claim_cross_namespace")
    return sum(1 for ns in known if ns == claim.namespace)


class _Holdings:
    """Who holds which GPU through which claim, gathered container by container."""

    def __init__(self, mapping: Mapping[Triplet, str], claims: Mapping[tuple[str, str], ClaimInfo],
                 skip: Skip, devices: Sequence[DeviceSample] = (), namespaces: Mapping[str, str] | None = None
                 ) -> None:
        self.mapping, self.claims, self.skip = mapping, claims, skip
        self.namespaces = namespaces or {}  # pod uid -> namespace, of the pods that may run
        self.held: dict[ContainerKey, list[str]] = {}
        self.holders: dict[str, list[ContainerKey]] = {}
        self.kubelet: set[str] = set()  # uuids the kubelet lists for some container: the API objects' word yields
        self.reserved: dict[str, int] = {}  # uuid -> the most consumers one of its claims counts
        self._consumers: dict[tuple[str, str], int] = {}
        self.kinds = {d.uuid: "gpu" if d.parent_uuid is None else "mig" for d in devices}
        self.memory = {d.uuid: d.memory_total_bytes for d in devices if d.memory_total_bytes}
        self.grants: dict[str, dra_sharing.Grant] = {}  # uuid -> its holders' grant under a sharing config
        self._claim_grants: dict[tuple[str, str], dict[str, dra_sharing.Grant]] = {}
        self.expected: dict[ContainerKey, int] = {}  # DRA-backed extended resources: how many devices
        # consumable capacity: (holder, uuid) -> (its claim, the memory the claim's results consumed there)
        self.consumed: dict[tuple[ContainerKey, str], tuple[tuple[str, str], int | None]] = {}
        self.claim_holders: dict[tuple[tuple[str, str], str], int] = {}

    def grants_of(self, claim: ClaimInfo) -> dict[str, dra_sharing.Grant]:
        """The sharing grants of a claim's devices by uuid, worked out once per claim (skips counted once)."""
        key = (claim.namespace, claim.name)
        if key not in self._claim_grants:
            # config index -> its sharing and the uuids it applies to, as the driver groups them
            groups: dict[int, tuple[dra_sharing.Sharing, list[str]]] = {}
            for r in claim.results:
                uuid = self.mapping.get((r.driver, r.pool, r.device))
                if uuid is None or r.admin_access or r.driver != dra_sharing.DRIVER:
                    continue
                i = dra_sharing.select(claim.configs, r.request, self.kinds.get(uuid, ""), self.skip)
                sharing = claim.configs[i].sharing if i is not None else None
                if i is not None and sharing is not None:
                    groups.setdefault(i, (sharing, []))[1].append(uuid)
            out: dict[str, dra_sharing.Grant] = {}
            for sharing, uuids in groups.values():
                out.update(dra_sharing.grants(sharing, uuids, self.memory, self.skip))
            self._claim_grants[key] = out
        return self._claim_grants[key]

    def consumers_of(self, claim: ClaimInfo) -> int:
        """:func:`consumers`, worked out once per claim (its skip counted once)."""
        key = (claim.namespace, claim.name)
        if key not in self._consumers:
            self._consumers[key] = consumers(claim, self.namespaces, self.skip)
        return self._consumers[key]

    def add(self, key: ContainerKey, claim: ClaimInfo | None, triplet: Triplet,
            results: Sequence[ClaimResult] = (), *, kubelet: bool) -> None:
        """``key`` holds the device ``triplet`` through ``claim`` (its ``results`` on that device, when known)."""
        uuid = self.mapping.get(triplet)
        if uuid is None:
            if triplet[0] in GPU_DRIVERS:
                self.skip("dra_device_unmapped")
            return
        if uuid in self.held.setdefault(key, []):
            return  # one device, listed twice for one container (the kubelet's, or two requests)
        if not kubelet and uuid in self.kubelet:
            self.skip("dra_claim_kubelet_disagrees")  # the kubelet gave it to other containers, not this one
            return
        if kubelet:
            self.kubelet.add(uuid)
        self.held[key].append(uuid)
        self.holders.setdefault(uuid, []).append(key)
        shares = [r for r in results if r.share_id]
        if claim is not None and shares:
            consumed = [r.consumed_memory for r in shares if r.consumed_memory is not None]
            claim_key = (claim.namespace, claim.name)
            self.consumed[(key, uuid)] = (claim_key, sum(consumed) if consumed else None)
            self.claim_holders[(claim_key, uuid)] = self.claim_holders.get((claim_key, uuid), 0) + 1
        if claim is not None:
            self.reserved[uuid] = max(self.reserved.get(uuid, 0), self.consumers_of(claim))
            grant = self.grants_of(claim).get(uuid)
            if grant is not None:
                self.grants[uuid] = grant

    def from_kubelet(self, pod: PodInfo, key: ContainerKey, entries: Sequence[DynamicResource],
                     pc: PodClaims | None) -> None:
        for dr in entries:
            if dr.claim_namespace != pod.namespace:
                self.skip("dra_claim_cross_namespace")  # a pod's claims are of its namespace: a kubelet bug
                continue
            claim = self.claims.get((dr.claim_namespace, dr.claim_name))
            results: dict[Triplet, list[ClaimResult]] = {}
            for r in claim.results if claim else ():
                results.setdefault((r.driver, r.pool, r.device), []).append(r)
            requests = _requests(pc, key[1], dr.claim_name)
            for cr in dr.claim_resources:
                triplet = (cr.driver_name, cr.pool_name, cr.device_name)
                listed = results.get(triplet, [])
                mine = [r for r in listed if not r.admin_access and _for_request(r, requests)]
                if listed and not mine:
                    continue  # monitoring access, or another container's request of the same claim
                self.add(key, claim, triplet, mine, kubelet=True)

    def from_claims(self, pod: PodInfo, key: ContainerKey, pc: PodClaims) -> None:
        for local, request in pc.containers.get(key[1], ()):
            claim = self.claims.get((pod.namespace, pc.claims.get(local, "")))
            if claim is None:
                continue  # no claim yet, not allocated, or not readable: nothing is held
            if pod.uid not in claim.reserved_for:
                self.skip("dra_claim_not_reserved")  # a pod naming a claim that is not its own
                continue
            mine: dict[Triplet, list[ClaimResult]] = {}
            for r in claim.results:
                if not r.admin_access and _for_request(r, {request}):
                    mine.setdefault((r.driver, r.pool, r.device), []).append(r)
            for triplet, results in mine.items():
                self.add(key, claim, triplet, results, kubelet=False)

    def allocations(self) -> dict[ContainerKey, tuple[Allocation, ...]]:
        # A container whose nvidia.com/gpu DRA serves but whose claim is not read yet (or not its own) holds
        # that many devices of DRA, placed by its processes: never the device plugin's (an empty tuple
        # still keeps the device plugin's scheme off it).
        out: dict[ContainerKey, list[Allocation]] = {
            k: [Allocation(k[0], k[1], SCHEME_DRA, True, None, 100.0, None)] * n
            for k, n in self.expected.items() if k not in self.held}
        for uuid, keys in self.holders.items():
            grant = self.grants.get(uuid)
            if grant is not None:  # the config's limits are each holder's (MPS), or there is none (time-slicing)
                for pod_uid, container in keys:
                    out.setdefault((pod_uid, container), []).append(Allocation(
                        pod_uid, container, SCHEME_BY_STRATEGY[grant.strategy], False, uuid, grant.compute_percent,
                        grant.memory_bytes))
                continue
            for k in keys:  # consumable capacity: the claim's own booking, split among its holders only
                if (k, uuid) in self.consumed:
                    claim_key, memory = self.consumed[(k, uuid)]
                    total = self.memory.get(uuid)
                    each = (memory // self.claim_holders[(claim_key, uuid)] or None) if memory else None  # 0 B: none
                    out.setdefault(k, []).append(Allocation(
                        k[0], k[1], SCHEME_DRA_CONSUMABLE, False, uuid, None,
                        min(each, total) if each is not None and total else each))
            keys = [k for k in keys if (k, uuid) not in self.consumed]
            if not keys:
                continue
            n = len(keys)
            whole = n == 1 and self.reserved.get(uuid, 1) <= 1
            scheme = SCHEME_DRA if whole else SCHEME_DRA_SHARED
            for pod_uid, container in keys:
                out.setdefault((pod_uid, container), []).append(Allocation(
                    pod_uid, container, scheme, whole, uuid, 100.0 / n, None, None if whole else 1.0 / n))
        return {k: tuple(v) for k, v in out.items()}


def dra_allocations(pods: Iterable[PodInfo], mapping: Mapping[Triplet, str],
                    dynamic: Mapping[tuple[str, str, str], Sequence[DynamicResource]],
                    claims: Mapping[tuple[str, str], ClaimInfo], pod_claims: Mapping[str, PodClaims],
                    skip: Skip, devices: Sequence[DeviceSample] = ()) -> dict[ContainerKey, tuple[Allocation, ...]]:
    """Every container's DRA allocations on this node (see the module docstring); ``devices``: NVML's."""
    running = [p for p in pods if p.phase not in ("Succeeded", "Failed")]
    h = _Holdings(mapping, claims, skip, devices, {p.uid: p.namespace for p in running})
    rest: list[tuple[PodInfo, ContainerKey, PodClaims]] = []
    # The kubelet's word first, for every container: what it lists, the API objects cannot take.
    for pod in running:
        pc = pod_claims.get(pod.uid)
        for c in (*pod.containers, *(ic for ic in pod.init_containers if ic.sidecar)):
            key = (pod.uid, c.name)
            entries = dynamic.get((pod.namespace, pod.name, c.name))
            if entries:
                h.from_kubelet(pod, key, entries, pc)
            elif pc is not None and pc.namespace == pod.namespace:
                rest.append((pod, key, pc))  # before 1.34 the kubelet lists no DRA entries by default
            if pc is not None and c.name in pc.extended:
                h.expected[key] = _count(c, pc.extended[c.name])
    for pod, key, pc in rest:
        h.from_claims(pod, key, pc)
    return h.allocations()


def _count(c: ContainerInfo, resources: Sequence[str]) -> int:
    """How many devices a container's DRA-backed extended resources ask for (bounded by a claim's results)."""
    n = sum(int(q) for q in (amount(c, r) for r in resources) if q is not None and q <= MAX_RESULTS)
    return min(n, MAX_RESULTS)
