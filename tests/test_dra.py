"""DRA attribution (exporter/attribution/dra.py, dra_objects.py, schemes/dra.py): unit and property tests.

Shapes are those of current releases: 1.33 (no ``dynamic_resources``: the Pods and claims are
read), 1.34+ (the kubelet lists the claims), 1.35 (``share_id``), NVIDIA driver v25.3 / v0.4 slices.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.attribute import EXCLUSIVE, NONE, SHARE, attribute
from exporter.attribution.dra_objects import parse_pod_claims
from exporter.model import (
    CgroupRef,
    ClaimResource,
    DeviceSample,
    DynamicResource,
    NodeSample,
    PodResources,
    PodResourcesContainer,
    ProcessUsage,
)
from exporter.node.pod_store import PodStore
from tests.test_dra_shapes import claim, gpu_device, mig_device, pod, resource_slice

NODE = "gpu-node-1"
GIB = 1 << 30
U0, U1, MIG_PARENT = "GPU-aaaa0000-0000-0000-0000-000000000000", "GPU-bbbb1111-0000-0000-0000-000000000000", \
    "GPU-cccc2222-0000-0000-0000-000000000000"
MIG_A = "MIG-dddd3333-0000-0000-0000-000000000000"


def cid(n: int) -> str:
    return f"{n:064x}"


def puid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


DEVICES = (
    DeviceSample(0, U0, "NVIDIA A100-SXM4-40GB", minor_number=0, pci_bus_id="00000000:07:00.0",
                 memory_total_bytes=40 * GIB, memory_used_bytes=GIB, utilization_gpu=30,
                 processes=(ProcessUsage(100, GIB // 2),)),
    DeviceSample(1, U1, "NVIDIA A100-SXM4-40GB", minor_number=1, pci_bus_id="00000000:0B:00.0",
                 memory_total_bytes=40 * GIB, memory_used_bytes=GIB, utilization_gpu=60,
                 processes=(ProcessUsage(110, GIB), ProcessUsage(111, GIB))),
    DeviceSample(2, MIG_A, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", minor_number=2, pci_bus_id="00000000:0F:00.0",
                 memory_total_bytes=10 * GIB, memory_used_bytes=GIB, parent_uuid=MIG_PARENT, gpu_instance_id=3,
                 compute_instance_id=0, mig_profile="2g.10gb", processes=(ProcessUsage(120, GIB),)),
)
MIG_NAME = "gpu-2-mig-2g10gb-14-0"  # driver v25.12+ naming


def slices(version: str = "v0.4") -> list[dict[str, Any]]:
    mine = resource_slice(NODE, [gpu_device(0, U0, bus="0000:07:00.0", version=version),
                                 gpu_device(1, U1, bus="0000:0b:00.0", version=version),
                                 mig_device(MIG_NAME, MIG_A, MIG_PARENT, "2g.10gb")])
    # another node's pool reuses every device name, with its own uuids
    other = resource_slice("gpu-node-2", [gpu_device(0, "GPU-other-0"), gpu_device(1, "GPU-other-1")])
    return [other, mine]


# train: claim "train-gpu-x1" (template) whole gpu-0 for container "main"; its "sidecar" names nothing.
# infer-a / infer-b: share user-created claim "shared-gpu" (gpu-1), two pods.
# mig: claim "mig-7abc" (template) on the MIG device, two containers naming it.
# dcgm: adminAccess claim on gpu-0.
def api_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods = [
        pod("ml", "train", puid(1), NODE, {"main": [("gpu", "")], "sidecar": []},
            {"gpu": ("template", "train-gpu-x1")}, container_ids={"main": cid(10), "sidecar": cid(11)}),
        pod("ml", "infer-a", puid(2), NODE, {"srv": [("gpu", "")]}, {"gpu": ("claim", "shared-gpu")},
            container_ids={"srv": cid(20)}),
        pod("ml", "infer-b", puid(3), NODE, {"srv": [("gpu", "")]}, {"gpu": ("claim", "shared-gpu")},
            container_ids={"srv": cid(30)}),
        pod("ml", "mig", puid(4), NODE, {"a": [("mig", "")], "b": [("mig", "")]}, {"mig": ("template", "mig-7abc")},
            container_ids={"a": cid(40), "b": cid(41)}),
        pod("monitoring", "dcgm", puid(5), NODE, {"dcgm": [("gpu", "")]}, {"gpu": ("template", "dcgm-gpu-q2")},
            container_ids={"dcgm": cid(50)}),
    ]
    claims = [
        claim("ml", "train-gpu-x1", [("gpu", NODE, "gpu-0")], [("train", puid(1))]),
        claim("ml", "shared-gpu", [("gpu", NODE, "gpu-1")], [("infer-a", puid(2)), ("infer-b", puid(3))]),
        claim("ml", "mig-7abc", [("mig", NODE, MIG_NAME)], [("mig", puid(4))]),
        claim("monitoring", "dcgm-gpu-q2", [("gpu", NODE, "gpu-0")], [("dcgm", puid(5))], admin=True),
    ]
    return pods, claims


def kubelet_answer() -> tuple[PodResources, ...]:
    """What a 1.34+ kubelet lists for api_objects()."""
    def dr(ns: str, name: str, device: str) -> tuple[DynamicResource, ...]:
        return (DynamicResource(name, ns, (ClaimResource("gpu.nvidia.com", NODE, device),)),)
    return (
        PodResources("train", "ml", (PodResourcesContainer("main", (), dr("ml", "train-gpu-x1", "gpu-0")),
                                     PodResourcesContainer("sidecar", ()))),
        PodResources("infer-a", "ml", (PodResourcesContainer("srv", (), dr("ml", "shared-gpu", "gpu-1")),)),
        PodResources("infer-b", "ml", (PodResourcesContainer("srv", (), dr("ml", "shared-gpu", "gpu-1")),)),
        PodResources("mig", "ml", (PodResourcesContainer("a", (), dr("ml", "mig-7abc", MIG_NAME)),
                                   PodResourcesContainer("b", (), dr("ml", "mig-7abc", MIG_NAME)))),
        PodResources("dcgm", "monitoring",
                     (PodResourcesContainer("dcgm", (), dr("monitoring", "dcgm-gpu-q2", "gpu-0")),)),
    )


PIDS = {100: CgroupRef(puid(1), cid(10)), 101: CgroupRef(puid(1), cid(11)), 109: CgroupRef(puid(5), cid(50)),
        110: CgroupRef(puid(2), cid(20)), 111: CgroupRef(puid(3), cid(30)), 120: CgroupRef(puid(4), cid(41))}


def run(pods_raw, claims_raw, slices_raw, pod_resources=None, with_pod_claims=True, devices=DEVICES):
    store = PodStore()
    store.replace(pods_raw, "1")
    view = store.view()
    pod_claims = {}
    if with_pod_claims:
        for obj in pods_raw:
            pc = parse_pod_claims(obj, lambda r: None)
            if pc is not None:
                pod_claims[pc.uid] = pc
    allocs = compute_allocations(AllocationInputs(tuple(view.pods.values()), devices, {}, pod_resources, {},
                                                  slices_raw, claims_raw, pod_claims, NODE))
    return allocs, attribute(NodeSample(1.0, devices), PIDS, view, allocs.allocations)


def summary(attr) -> dict[str, Any]:
    return {
        "modes": {d.device.uuid: d.mode for d in attr.devices},
        "users": {d.device.uuid: sorted((u.pod.name, u.container) for u in d.users) for d in attr.devices},
        "unaccounted": sorted((r.pid, r.uuid) for d in attr.devices for r in d.unaccounted),
        "allocs": sorted((a.pod.name, a.container, a.uuid, a.allocate_mode, a.scheme, a.compute_percent,
                          a.memory_bytes) for a in attr.allocations),
    }


EXPECTED_ALLOCS = sorted([
    ("train", "main", U0, EXCLUSIVE, "dra", 100.0, 40 * GIB),
    ("infer-a", "srv", U1, SHARE, "dra-shared", 50.0, 20 * GIB),
    ("infer-b", "srv", U1, SHARE, "dra-shared", 50.0, 20 * GIB),
    ("mig", "a", MIG_A, SHARE, "dra-shared", 50.0, 5 * GIB),
    ("mig", "b", MIG_A, SHARE, "dra-shared", 50.0, 5 * GIB),
])


def check_node(attr) -> None:
    s = summary(attr)
    assert s["allocs"] == EXPECTED_ALLOCS
    assert s["modes"] == {U0: EXCLUSIVE, U1: SHARE, MIG_A: SHARE}
    assert s["users"][U1] == [("infer-a", "srv"), ("infer-b", "srv")]
    assert s["users"][MIG_A] == [("mig", "a"), ("mig", "b")]
    assert s["unaccounted"] == []  # container "a" of pod mig runs nothing; "b" runs pid 120 and holds the MIG device


def test_admin_access_and_a_container_naming_no_claim_hold_nothing():
    """Their processes are unaccounted and, as any pod container running without a grant, make the GPU share."""
    pods_raw, claims_raw = api_objects()
    procs = (ProcessUsage(100, GIB // 2), ProcessUsage(101, 1), ProcessUsage(109, 1))
    busy = (replace(DEVICES[0], processes=procs), *DEVICES[1:])
    allocs, attr = run(pods_raw, claims_raw, slices(), kubelet_answer(), devices=busy)
    s = summary(attr)
    assert s["unaccounted"] == [(101, U0), (109, U0)]
    assert s["modes"][U0] == SHARE
    assert [a for a in allocs.allocations if a.pod_uid in (puid(5),) or a.container == "sidecar"] == []
    assert [(a.container, a.scheme, a.compute_percent) for a in allocs.allocations if a.uuid == U0] == [
        ("main", "dra", 100.0)]


def test_kubelet_1_34_dynamic_resources():
    pods_raw, claims_raw = api_objects()
    allocs, attr = run(pods_raw, claims_raw, slices(), kubelet_answer())
    check_node(attr)
    assert dict(allocs.skips) == {}


def test_kubelet_1_35_share_id_reads_the_same():
    pods_raw, claims_raw = api_objects()
    answer = tuple(PodResources(p.name, p.namespace, tuple(
        PodResourcesContainer(c.name, c.devices, tuple(DynamicResource(d.claim_name, d.claim_namespace, tuple(
            ClaimResource(r.driver_name, r.pool_name, r.device_name, "7f3c1f9e-52c0-4c62-9a0d-3a8d2f3e0b11")
            for r in d.claim_resources)) for d in c.dynamic_resources)) for c in p.containers))
        for p in kubelet_answer())
    check_node(run(pods_raw, claims_raw, slices(), answer)[1])


def test_1_33_without_the_gate_derives_the_same_from_pods_and_claims():
    pods_raw, claims_raw = api_objects()
    empty = tuple(PodResources(p.name, p.namespace, tuple(PodResourcesContainer(c.name, ()) for c in p.containers))
                  for p in kubelet_answer())
    for answer in (empty, None):
        allocs, attr = run(pods_raw, claims_raw, slices(), answer)
        check_node(attr)
        assert dict(allocs.skips) == {}


def test_driver_v25_3_attribute_names_and_v1beta1_wrapping():
    pods_raw, claims_raw = api_objects()
    old = slices("v25.3")
    for d in old[1]["spec"]["devices"]:
        d["attributes"].pop("uuid", None) if d["name"] != MIG_NAME else None
    check_node(run(pods_raw, claims_raw, old, kubelet_answer())[1])  # by pcieBusID
    beta = slices()
    beta[1]["spec"]["devices"] = [{"name": d["name"], "basic": {"attributes": d["attributes"]}}
                                  for d in beta[1]["spec"]["devices"]]
    check_node(run(pods_raw, claims_raw, beta, kubelet_answer())[1])


def test_dynamic_mig_device_without_uuid_by_parent_and_profile():
    pods_raw, claims_raw = api_objects()
    s = slices()
    s[1]["spec"]["devices"][2] = mig_device(MIG_NAME, None, MIG_PARENT, "2g.10gb")
    check_node(run(pods_raw, claims_raw, s, kubelet_answer())[1])


def test_older_pool_generation_is_ignored():
    pods_raw, claims_raw = api_objects()
    stale = resource_slice(NODE, [gpu_device(0, U1), gpu_device(1, U0)], generation=0, suffix="old00")
    check_node(run(pods_raw, claims_raw, [stale, *slices()], kubelet_answer())[1])


def test_bad_inputs_are_counted_skips_never_a_wrong_pod():
    pods_raw, claims_raw = api_objects()
    s = slices()
    s[1]["spec"]["devices"][1] = {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}  # no identity
    s.append({"spec": {"driver": "gpu.nvidia.com", "nodeName": NODE, "pool": "x", "devices": 7}})
    claims_raw.append(claim("ml", "ghost", [("gpu", NODE, "gpu-9")], [("train", puid(1))]))
    pods_raw.append(pod("ml", "thief", puid(6), NODE, {"c": [("g", "")]}, {"g": ("claim", "train-gpu-x1")}))
    answer = (*kubelet_answer(), PodResources("ghost", "ml", (PodResourcesContainer("c", (), (
        DynamicResource("ghost", "ml", (ClaimResource("gpu.nvidia.com", NODE, "gpu-9"),)),)),)))
    pods_raw.append(pod("ml", "ghost", puid(7), NODE, {"c": [("g", "")]}, {"g": ("claim", "ghost")}))
    allocs, attr = run(pods_raw, claims_raw, s, answer)
    assert dict(allocs.skips) == {"dra_device_attributes_unknown": 1, "dra_slice_malformed": 1,
                                  "dra_device_unmapped": 3, "dra_claim_not_reserved": 1}
    s_ = summary(attr)
    assert [a for a in s_["allocs"] if a[0] in ("thief", "ghost")] == []
    assert s_["modes"][U1] == NONE or s_["modes"][U1] == SHARE  # processes of two pods, nobody holding
    assert ("train", "main", U0, EXCLUSIVE, "dra", 100.0, 40 * GIB) in s_["allocs"]


def test_container_naming_one_request_of_a_claim_gets_only_its_devices():
    pods_raw = [pod("ml", "multi", puid(8), NODE, {"a": [("g", "first")], "b": [("g", "second")]},
                    {"g": ("claim", "two-gpus")})]
    claims_raw = [claim("ml", "two-gpus", [("first", NODE, "gpu-0"), ("second", NODE, "gpu-1")],
                        [("multi", puid(8))])]
    both = (ClaimResource("gpu.nvidia.com", NODE, "gpu-0"), ClaimResource("gpu.nvidia.com", NODE, "gpu-1"))
    answer = (PodResources("multi", "ml", tuple(PodResourcesContainer(c, (), (DynamicResource("two-gpus", "ml", both),))
                                                for c in ("a", "b"))),)
    for pr in (answer, None):
        allocs, _ = run(pods_raw, claims_raw, slices(), pr)
        assert sorted((a.container, a.uuid, a.scheme, a.compute_percent) for a in allocs.allocations) == [
            ("a", U0, "dra", 100.0, ), ("b", U1, "dra", 100.0)]


_text = st.text(st.sampled_from("ab-0/."), max_size=6)
_leaf = st.none() | st.booleans() | st.integers(-2, 3) | _text
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(junk=st.lists(_json, max_size=4), drop=st.sets(st.integers(0, 8), max_size=4), kubelet=st.booleans())
def test_hostile_objects_never_crash_and_each_device_grant_counts_once(junk, drop, kubelet):
    pods_raw, claims_raw = api_objects()
    s = slices()
    objs = [*s, *claims_raw]
    for i in sorted(drop, reverse=True):
        if i < len(objs):
            objs[i] = junk[0] if junk else {}
    s, claims_raw = objs[: len(s)] + junk, objs[len(s):] + junk
    allocs, attr = run(pods_raw + [j for j in junk if isinstance(j, dict)], claims_raw, s,
                       kubelet_answer() if kubelet else None)
    per_device: dict[str, float] = {}
    for a in allocs.allocations:
        assert a.uuid in {d.uuid for d in DEVICES} and a.scheme in ("dra", "dra-shared")
        per_device[a.uuid] = per_device.get(a.uuid, 0.0) + (a.compute_percent or 0.0)
    assert all(abs(v - 100.0) < 1e-6 for v in per_device.values())
    # never a wrong pod: a holder is one the kubelet or a claim reserved for it names
    legit = {(puid(1), "main", U0), (puid(2), "srv", U1), (puid(3), "srv", U1), (puid(4), "a", MIG_A),
             (puid(4), "b", MIG_A)}
    if kubelet and 5 in drop:  # the adminAccess claim unreadable: the kubelet's word (it has the device) stands
        legit.add((puid(5), "dcgm", U0))
    assert {(a.pod_uid, a.container, a.uuid) for a in allocs.allocations} <= legit
    assert all(d.mode in (EXCLUSIVE, SHARE, NONE) for d in attr.devices)


@settings(max_examples=40, deadline=None)
@given(n_pods=st.integers(1, 4), n_containers=st.integers(1, 3), kubelet=st.booleans())
def test_a_claim_shared_by_any_holders_counts_once(n_pods, n_containers, kubelet):
    names = [f"c{j}" for j in range(n_containers)]
    pods_raw = [pod("ml", f"p{i}", puid(100 + i), NODE, {c: [("g", "")] for c in names}, {"g": ("claim", "one")})
                for i in range(n_pods)]
    claims_raw = [claim("ml", "one", [("gpu", NODE, "gpu-1")], [(f"p{i}", puid(100 + i)) for i in range(n_pods)])]
    answer = tuple(PodResources(f"p{i}", "ml", tuple(PodResourcesContainer(c, (), (DynamicResource("one", "ml", (
        ClaimResource("gpu.nvidia.com", NODE, "gpu-1"),)),)) for c in names)) for i in range(n_pods))
    allocs, attr = run(pods_raw, claims_raw, slices(), answer if kubelet else None)
    holders = n_pods * n_containers
    assert len(allocs.allocations) == holders
    assert math.isclose(sum(a.compute_percent or 0 for a in allocs.allocations), 100.0)
    assert {a.scheme for a in allocs.allocations} == {"dra" if holders == 1 else "dra-shared"}
    assert {a.whole for a in allocs.allocations} == {holders == 1}
    dev = next(d for d in attr.devices if d.device.uuid == U1)
    assert len(dev.users) == holders or (holders == 1 and dev.mode == EXCLUSIVE)


# ---------------------------------------------------------------- consumable capacity (DRAConsumableCapacity)


def consumable(obj: dict[str, Any], consumed: list[Any]) -> dict[str, Any]:
    """``obj`` with a shareID and ``consumedCapacity`` on each result, as the scheduler writes them."""
    for i, (r, c) in enumerate(zip(obj["status"]["allocation"]["devices"]["results"], consumed, strict=True)):
        r["shareID"] = f"5a0e0000-0000-4000-8000-{share_uid(obj['metadata']['name'], i)}"
        if c is not None:
            r["consumedCapacity"] = c
    return obj


def share_uid(name: str, i: int) -> str:
    return f"{sum(map(ord, name)) * 16 + i:012x}"


def consumable_node(first: Any, second: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pods a (one container) and b (two containers naming one claim), each with its own claim on gpu-1."""
    pods_raw = [pod("ml", "a", puid(60), NODE, {"ctr": [("g", "")]}, {"g": ("claim", "share-a")}),
                pod("ml", "b", puid(61), NODE, {"x": [("g", "")], "y": [("g", "")]}, {"g": ("claim", "share-b")})]
    claims_raw = [consumable(claim("ml", "share-a", [("gpu", NODE, "gpu-1")], [("a", puid(60))]), [first]),
                  consumable(claim("ml", "share-b", [("gpu", NODE, "gpu-1")], [("b", puid(61))]), [second])]
    return pods_raw, claims_raw


def consumable_answer(pods_raw: list[dict[str, Any]]) -> tuple[PodResources, ...]:
    """The 1.35 kubelet's answer for consumable_node(): each container's claim, with its share id."""
    def dr(claim_name: str) -> tuple[DynamicResource, ...]:
        return (DynamicResource(claim_name, "ml", (ClaimResource("gpu.nvidia.com", NODE, "gpu-1", "share"),)),)
    return (PodResources("a", "ml", (PodResourcesContainer("ctr", (), dr("share-a")),)),
            PodResources("b", "ml", (PodResourcesContainer("x", (), dr("share-b")),
                                     PodResourcesContainer("y", (), dr("share-b")))))


def test_consumable_capacity_grants_each_claim_its_consumed_memory_and_no_compute():
    pods_raw, claims_raw = consumable_node({"memory": "4Gi"}, {"memory": "10Gi", "shares": "1"})
    for answer in (None, consumable_answer(pods_raw)):
        allocs, attr = run(pods_raw, claims_raw, slices(), answer)
        assert sorted((a.container, a.scheme, a.uuid, a.whole, a.compute_percent, a.memory_bytes)
                      for a in allocs.allocations) == [
            ("ctr", "dra-consumable", U1, False, None, 4 * GIB),
            ("x", "dra-consumable", U1, False, None, 5 * GIB),  # one claim named by two containers: split
            ("y", "dra-consumable", U1, False, None, 5 * GIB),
        ]
        assert dict(allocs.skips) == {}
        assert next(d for d in attr.devices if d.device.uuid == U1).mode == SHARE


def test_consumable_capacity_without_memory_is_a_share_with_no_grant_and_bad_values_are_counted():
    pods_raw, claims_raw = consumable_node({"memory": "0", "shares": "1"}, {"memory": "lots"})
    allocs, _ = run(pods_raw, claims_raw, slices())
    assert {(a.scheme, a.compute_percent, a.memory_bytes) for a in allocs.allocations} == {
        ("dra-consumable", None, None)}
    assert dict(allocs.skips) == {"dra_claim_malformed": 1}
    pods_raw, claims_raw = consumable_node({"memory": "400Gi"}, ["not", "a", "map"])
    allocs, _ = run(pods_raw, claims_raw, slices())
    assert sorted((a.container, a.memory_bytes) for a in allocs.allocations) == [
        ("ctr", 40 * GIB), ("x", None), ("y", None)]  # never more than the card; a list is no capacity map
    assert dict(allocs.skips) == {"dra_claim_malformed": 1}


_capacity = st.one_of(
    _json, st.dictionaries(st.sampled_from(["memory", "shares", "gpu.nvidia.com/memory", "other.io/memory"]),
                           st.one_of(_leaf, st.integers(-(1 << 60), 1 << 60), st.floats(allow_nan=True),
                                     st.sampled_from(["4Gi", "1e30", "-1Mi", "0", "512Mi", "1.5Gi", "9Ei"])),
                           max_size=3))


@settings(max_examples=150, deadline=None)
@given(first=_capacity, second=_capacity, kubelet=st.booleans())
def test_hostile_consumed_capacity_is_bounded_and_never_crashes(first, second, kubelet):
    pods_raw, claims_raw = consumable_node(first, second)
    allocs, _ = run(pods_raw, claims_raw, slices(), consumable_answer(pods_raw) if kubelet else None)
    assert len(allocs.allocations) == 3
    for a in allocs.allocations:
        assert (a.scheme, a.uuid, a.whole, a.compute_percent) == ("dra-consumable", U1, False, None)
        assert a.memory_bytes is None or 0 < a.memory_bytes <= 40 * GIB
    assert set(allocs.skips) <= {"dra_claim_malformed"}
