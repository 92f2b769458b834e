"""DRA API objects -> bounded records: ResourceSlices, ResourceClaims, a Pod's claim references. Pure.

ResourceSlices are written by the driver, ResourceClaims and Pods by users, controllers and the
scheduler: all of it is untrusted. Each parser keeps what is well formed, bounds every list and
string, and counts what it dropped through ``skip(reason)``; none raises on bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.attribution.dra_sharing import DeviceConfig, parse_configs
from exporter.attribution.schemes.base import parse_quantity
from exporter.model import EMPTY

MAX_NAME = 253  # the longest object name (DNS subdomain); device and pool names are shorter
MAX_DEVICES = 128  # per slice: resource.k8s.io/v1 ResourceSliceMaxDevices
MAX_RESULTS = 32  # per claim: v1 AllocationResultsMaxSize
MAX_RESERVED = 256  # per claim: v1 ResourceClaimReservedForMaxSize
MAX_POD_CLAIMS = 32  # per pod, and claim references per container (the API's limits are lower)
MAX_ATTRIBUTES = 32  # per device: v1 ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_CONSUMED_BYTES = 1 << 50  # a consumed memory capacity: far above any device's, far below a float's precision
# The pod-local name given to the claim the scheduler made for DRA-backed extended resources (the pod's
# status.extendedResourceClaimStatus): not a DNS label, so no claim of the pod's spec can be named so.
EXTENDED = "<extended-resources>"

Skip = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device a ResourceSlice of this node announces, with what may identify it in NVML."""

    driver: str
    pool: str
    name: str
    generation: int
    kind: str = ""  # the ``type`` attribute: gpu | mig | vfio | ...
    uuid: str = ""
    parent_uuid: str = ""
    profile: str = ""
    minor: int | None = None
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One ``status.allocation.devices.results[]`` entry."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    # DRAConsumableCapacity (1.34+): one of several allocations of a device that allows them (shareID), and
    # the bytes of the device's ``memory`` capacity it consumed (consumedCapacity), a scheduler's booking.
    share_id: str = ""
    consumed_memory: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """An allocated ResourceClaim: its devices, the pods (uids) it is reserved for, the driver's configs."""

    namespace: str
    name: str
    results: tuple[ClaimResult, ...]
    reserved_for: frozenset[str]
    configs: tuple[DeviceConfig, ...] = ()  # gpu.nvidia.com's, lowest precedence first (dra_sharing.py)


@dataclass(frozen=True, slots=True)
class PodClaims:
    """A Pod's DRA references: pod claim name -> ResourceClaim name, and what each container names."""

    uid: str
    namespace: str
    claims: Mapping[str, str] = field(default_factory=lambda: EMPTY)  # "" while a template's claim is unnamed
    containers: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=lambda: EMPTY)  # (claim, request)
    # containers whose extended resources (e.g. nvidia.com/gpu) DRA serves -> those resources' names
    extended: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: EMPTY)


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_NAME else None


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else EMPTY


def _list(value: Any, limit: int, skip: Skip, reason: str) -> list[Any]:
    """A list of at most ``limit`` entries; a non-list is empty, a longer one is cut (both counted)."""
    if value is None:
        return []
    if not isinstance(value, list):
        skip(reason)
        return []
    if len(value) > limit:
        skip(reason)
    return value[:limit]


def _attributes(driver: str, raw: Any) -> dict[str, object]:
    """Attribute values by name, the driver's own domain stripped (``gpu.nvidia.com/uuid`` == ``uuid``)."""
    out: dict[str, object] = {}
    for key, value in list(_obj(raw).items())[:MAX_ATTRIBUTES]:
        if not isinstance(key, str) or not isinstance(value, Mapping):
            continue
        typed = next((value[t] for t in ("string", "int", "version", "bool") if t in value), None)
        out[key.removeprefix(driver + "/")] = typed
    return out


def _string_attr(attrs: Mapping[str, object], *names: str) -> str:
    for n in names:
        v = attrs.get(n)
        if isinstance(v, str) and 0 < len(v) <= MAX_NAME:
            return v
    return ""


def _device(driver: str, pool: str, generation: int, raw: Any) -> SliceDevice | None:
    raw = _obj(raw)
    name = _name(raw.get("name"))
    if name is None:
        return None
    # v1beta1 wraps a device's attributes in ``basic``; v1beta2 and v1 have them flat.
    attrs = _attributes(driver, (_obj(raw.get("basic")) or raw).get("attributes"))
    minor = attrs.get("minor")
    return SliceDevice(
        driver, pool, name, generation, kind=_string_attr(attrs, "type"), uuid=_string_attr(attrs, "uuid"),
        parent_uuid=_string_attr(attrs, "parentUUID"), profile=_string_attr(attrs, "profile"),
        minor=minor if isinstance(minor, int) and not isinstance(minor, bool) and 0 <= minor < 1 << 20 else None,
        # the standard attribute (driver v25.12+), else the driver's own older one
        pci_bus_id=_string_attr(attrs, "resource.kubernetes.io/pciBusID", "pcieBusID"),
    )


def parse_slices(objs: Iterable[Any], node: str, skip: Skip) -> list[SliceDevice]:
    """The devices of this node's slices, newest pool generation only (other nodes reuse the names)."""
    devices: list[SliceDevice] = []
    for obj in objs:
        spec = _obj(_obj(obj).get("spec"))
        driver, pool = _name(spec.get("driver")), _obj(spec.get("pool"))
        pool_name, generation = _name(pool.get("name")), pool.get("generation", 0)
        if node and spec.get("nodeName") != node:
            continue  # another node's slice (or a network-attached pool): not this node's devices
        if driver is None or pool_name is None or not isinstance(generation, int) or isinstance(generation, bool):
            skip("dra_slice_malformed")
            continue
        for raw in _list(spec.get("devices"), MAX_DEVICES, skip, "dra_slice_malformed"):
            d = _device(driver, pool_name, generation, raw)
            if d is None:
                skip("dra_slice_malformed")
            else:
                devices.append(d)
    newest: dict[tuple[str, str], int] = {}
    for d in devices:
        newest[(d.driver, d.pool)] = max(newest.get((d.driver, d.pool), d.generation), d.generation)
    return [d for d in devices if d.generation == newest[(d.driver, d.pool)]]


def _consumed_memory(driver: str, raw: Any, skip: Skip) -> int | None:
    """``consumedCapacity.memory`` in bytes; None when absent, or malformed or absurd (counted)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        skip("dra_claim_malformed")
        return None
    value = next((v for k, v in list(raw.items())[:MAX_ATTRIBUTES]
                  if isinstance(k, str) and k.removeprefix(driver + "/") == "memory"), None)
    if value is None:
        return None  # another capacity only (the driver's "shares")
    q = parse_quantity(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    if q is None or q > MAX_CONSUMED_BYTES:
        skip("dra_claim_malformed")
        return None
    return int(q)


def _result(raw: Any, skip: Skip) -> ClaimResult | None:
    raw = _obj(raw)
    request, driver, pool, device = (_name(raw.get(k)) for k in ("request", "driver", "pool", "device"))
    if request is None or driver is None or pool is None or device is None:
        return None
    return ClaimResult(request, driver, pool, device, raw.get("adminAccess") is True,
                       _name(raw.get("shareID")) or "", _consumed_memory(driver, raw.get("consumedCapacity"), skip))


def parse_claims(objs: Iterable[Any], skip: Skip) -> dict[tuple[str, str], ClaimInfo]:
    """Allocated ResourceClaims by (namespace, name); unallocated ones are left out silently."""
    out: dict[tuple[str, str], ClaimInfo] = {}
    for obj in objs:
        meta, spec, status = (_obj(_obj(obj).get(k)) for k in ("metadata", "spec", "status"))
        ns, name = _name(meta.get("namespace")), _name(meta.get("name"))
        allocation = status.get("allocation")
        if ns is None or name is None:
            skip("dra_claim_malformed")
            continue
        if allocation is None:
            continue  # not allocated yet: holds nothing
        results = []
        for raw in _list(_obj(_obj(allocation).get("devices")).get("results"), MAX_RESULTS, skip,
                         "dra_claim_malformed"):
            r = _result(raw, skip)
            if r is None:
                skip("dra_claim_malformed")
            else:
                results.append(r)
        pods = set()
        for ref in _list(status.get("reservedFor"), MAX_RESERVED, skip, "dra_claim_malformed"):
            ref = _obj(ref)
            uid = _name(ref.get("uid"))
            if ref.get("resource") == "pods" and not ref.get("apiGroup") and uid is not None:
                pods.add(uid.lower())
        configs = parse_configs(_obj(_obj(allocation).get("devices")).get("config"),
                                _obj(spec.get("devices")).get("config"), skip)
        out[(ns, name)] = ClaimInfo(ns, name, tuple(results), frozenset(pods), configs)
    return out


def _extended(raw: Any, skip: Skip) -> tuple[str, dict[str, list[tuple[str, str]]]]:
    """``status.extendedResourceClaimStatus`` (1.34+): the scheduler's claim, and per container its
    (resource, request) pairs; ("", {}) when absent or malformed (counted)."""
    if raw is None:
        return "", {}
    raw = _obj(raw)
    name = _name(raw.get("resourceClaimName"))
    if name is None:
        skip("dra_pod_claims_malformed")
        return "", {}
    mappings: dict[str, list[tuple[str, str]]] = {}
    # one mapping per container and extended resource, each a request of the claim: at most its 32 requests
    for m in _list(raw.get("requestMappings"), MAX_RESULTS, skip, "dra_pod_claims_malformed"):
        m = _obj(m)
        container, resource, request = (_name(m.get(k)) for k in ("containerName", "resourceName", "requestName"))
        if container is None or resource is None or request is None:
            skip("dra_pod_claims_malformed")
            continue
        mappings.setdefault(container, []).append((resource, request))
    return name, mappings


def parse_pod_claims(obj: Any, skip: Skip, limit: int = MAX_POD_CLAIMS) -> PodClaims | None:
    """A Pod's claim references (its spec's and the scheduler's extended-resource claim); None for a pod
    without identity or without any claim. At most ``limit`` claims are followed (the scheduler's, then the
    spec's in order): more is counted once per pod (``dra_pod_claims_over_limit``)."""
    meta, spec, status = (_obj(_obj(obj).get(k)) for k in ("metadata", "spec", "status"))
    uid, ns = _name(meta.get("uid")), _name(meta.get("namespace"))
    extended, mappings = _extended(status.get("extendedResourceClaimStatus"), skip)
    if uid is None or ns is None or not (spec.get("resourceClaims") or mappings):
        return None
    generated = {}  # claims from a template are named in the status only
    for st in _list(status.get("resourceClaimStatuses"), MAX_POD_CLAIMS, skip, "dra_pod_claims_malformed"):
        st = _obj(st)
        if _name(st.get("name")) is not None:
            generated[st["name"]] = _name(st.get("resourceClaimName")) or ""
    claims: dict[str, str] = {}
    for ref in _list(spec.get("resourceClaims"), MAX_POD_CLAIMS, skip, "dra_pod_claims_malformed"):
        ref = _obj(ref)
        local = _name(ref.get("name"))
        if local is None:
            skip("dra_pod_claims_malformed")
            continue
        direct = _name(ref.get("resourceClaimName"))
        claims[local] = direct if direct is not None else generated.get(local, "")
    containers: dict[str, tuple[tuple[str, str], ...]] = {}
    for c in [*_list(spec.get("containers"), 1024, skip, "dra_pod_claims_malformed"),
              *_list(spec.get("initContainers"), 1024, skip, "dra_pod_claims_malformed")]:
        c = _obj(c)
        refs = _list(_obj(c.get("resources")).get("claims"), MAX_POD_CLAIMS, skip, "dra_pod_claims_malformed")
        named = tuple((r["name"], _name(r.get("request")) or "") for r in map(_obj, refs)
                      if _name(r.get("name")) is not None)
        if _name(c.get("name")) is not None and named:
            containers[c["name"]] = named
    if mappings:
        claims = {EXTENDED: extended, **claims}  # the scheduler's own claim first: never the one cut
    if len(claims) > limit:
        skip("dra_pod_claims_over_limit")  # each claim followed costs API reads: a pod author cannot name more
        claims = dict(list(claims.items())[:limit])
    if EXTENDED in claims:
        for container, pairs in mappings.items():
            containers[container] = (*containers.get(container, ()), *((EXTENDED, req) for _, req in pairs))
    return PodClaims(uid.lower(), ns, claims, containers, {c: tuple(r for r, _ in p) for c, p in mappings.items()})
