"""Sharing configured in a DRA claim (exporter/attribution/dra_sharing.py) and DRA-backed extended resources.

The sourced inputs are in tests/data/realworld/pods-dra-*.yaml; these tests pin the bounds, the counted
skips and the parsers' properties on the same shapes (tests/test_dra_shapes.py).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.dra_objects import EXTENDED, MAX_RESULTS, parse_pod_claims
from exporter.attribution.dra_sharing import (
    INVALID,
    MAX_CONFIGS,
    MAX_PER_DEVICE,
    MAX_REQUESTS,
    MPS,
    DeviceConfig,
    Sharing,
    grants,
    parse_configs,
    select,
)
from exporter.model import ClaimResource, DeviceSample, DynamicResource, PodResources, PodResourcesContainer
from exporter.node.pods import parse_pod
from tests.test_dra_shapes import claim, gpu_device, mig_device, pod, resource_slice

NODE = "gpu-node-1"
GIB, MIB = 1 << 30, 1 << 20
U0, U1 = "GPU-aaaa0000-0000-4000-8000-000000000000", "GPU-bbbb1111-0000-4000-8000-000000000000"
PARENT, MIG = "GPU-cccc2222-0000-4000-8000-000000000000", "MIG-dddd3333-0000-5000-8000-000000000000"
DEVICES = (DeviceSample(0, U0, "A100", minor_number=0, memory_total_bytes=40 * GIB),
           DeviceSample(1, U1, "A100", minor_number=1, memory_total_bytes=40 * GIB),
           DeviceSample(2, MIG, "A100 MIG 1g.5gb", minor_number=2, memory_total_bytes=5 * GIB, parent_uuid=PARENT,
                        mig_profile="1g.5gb"))
SLICES = [resource_slice(NODE, [gpu_device(0, U0), gpu_device(1, U1), mig_device("gpu-2-mig-1g5gb-19-0", MIG, PARENT,
                                                                                "1g.5gb")])]
UID = "00000000-0000-4000-8000-000000000001"


def gpu_config(sharing: Any, *, kind: str = "GpuConfig", requests: list[str] | None = None,
               source: str = "FromClaim") -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": sharing}}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def mps(**limits: Any) -> dict[str, Any]:
    return {"strategy": "MPS", "mpsConfig": limits}


def run(configs: list[dict[str, Any]], devices: list[str] = ("gpu-0",), *, holders: int = 2,
        kubelet: bool = False) -> tuple[list[tuple], dict[str, int]]:
    """One pod whose ``holders`` containers name a claim on ``devices`` with ``configs`` in its status."""
    c = claim("ml", "c1", [("gpu", NODE, d) for d in devices], [("p", UID)])
    c["status"]["allocation"]["devices"]["config"] = configs
    p = pod("ml", "p", UID, NODE, {f"c{i}": [("g", "")] for i in range(holders)}, {"g": ("claim", "c1")})
    pr = None
    if kubelet:
        dr = (DynamicResource("c1", "ml", tuple(ClaimResource("gpu.nvidia.com", NODE, d) for d in devices)),)
        pr = [PodResources("p", "ml", tuple(PodResourcesContainer(f"c{i}", (), dr) for i in range(holders)))]
    pc = parse_pod_claims(p, lambda r: None)
    result = compute_allocations(AllocationInputs([parse_pod(p)[0]], DEVICES, {}, pr, {}, SLICES, [c],
                                                  {pc.uid: pc}, NODE))
    rows = sorted((a.container, a.scheme, a.uuid, a.whole, a.compute_percent, a.memory_bytes)
                  for a in result.allocations)
    return rows, dict(result.skips)


def test_mps_limits_are_each_holders_grant_from_kubelet_or_api_objects():
    for kubelet in (False, True):
        rows, skips = run([gpu_config(mps(defaultActiveThreadPercentage=30, defaultPinnedDeviceMemoryLimit="6Gi"))],
                          kubelet=kubelet)
        assert rows == [("c0", "dra-mps", U0, False, 30.0, 6 * GIB), ("c1", "dra-mps", U0, False, 30.0, 6 * GIB)]
        assert skips == {}


def test_mps_without_limits_and_time_slicing_grant_nothing_fixed():
    assert run([gpu_config({"strategy": "MPS"})], holders=1)[0] == [("c0", "dra-mps", U0, False, None, None)]
    assert run([gpu_config({"strategy": "TimeSlicing"})], holders=1)[0] == [
        ("c0", "dra-time-slicing", U0, False, None, None)]


def test_pinned_limit_is_cut_to_whole_mib_and_capped_at_the_card():
    assert run([gpu_config(mps(defaultPinnedDeviceMemoryLimit="10M"))], holders=1)[0][0][5] == 9 * MIB
    assert run([gpu_config(mps(defaultPinnedDeviceMemoryLimit="1Ti"))], holders=1)[0][0][5] == 40 * GIB


def test_per_device_limit_by_uuid_and_by_sorted_index():
    by_uuid = mps(defaultPinnedDeviceMemoryLimit="2Gi", defaultPerDevicePinnedMemoryLimit={U1: "1Gi"})
    rows, _ = run([gpu_config(by_uuid)], ["gpu-1", "gpu-0"], holders=1)
    assert [(r[2], r[5]) for r in rows] == [(U0, 2 * GIB), (U1, GIB)]
    by_index = mps(defaultPerDevicePinnedMemoryLimit={"1": "3Gi"})  # sorted uuids: U0, U1
    rows, _ = run([gpu_config(by_index)], ["gpu-0", "gpu-1"], holders=1)
    assert [(r[2], r[5]) for r in rows] == [(U0, None), (U1, 3 * GIB)]


def test_claim_config_beats_class_config_and_later_beats_earlier():
    cls = gpu_config({"strategy": "TimeSlicing"}, source="FromClass")
    first, last = gpu_config(mps(defaultActiveThreadPercentage=10)), gpu_config(mps(defaultActiveThreadPercentage=20))
    assert run([first, cls, last], holders=1)[0] == [("c0", "dra-mps", U0, False, 20.0, None)]
    named = gpu_config({"strategy": "TimeSlicing"}, requests=["gpu"])
    assert run([named, last], holders=1)[0] == [("c0", "dra-mps", U0, False, 20.0, None)]
    assert run([last, named], holders=1)[0] == [("c0", "dra-time-slicing", U0, False, None, None)]
    other = gpu_config({"strategy": "TimeSlicing"}, requests=["other"])
    assert run([last, other], holders=1)[0] == [("c0", "dra-mps", U0, False, 20.0, None)]


def test_config_kind_must_fit_the_device():
    # MigDeviceConfig without requests does not apply to a full GPU; naming the request is the driver's error
    assert run([gpu_config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig")], holders=1) == (
        [("c0", "dra", U0, True, 100.0, None)], {})
    rows, skips = run([gpu_config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig", requests=["gpu"])], holders=1)
    assert rows == [("c0", "dra", U0, True, 100.0, None)] and skips == {INVALID: 1}
    rows, _ = run([gpu_config(mps(defaultActiveThreadPercentage=40), kind="MigDeviceConfig")],
                  ["gpu-2-mig-1g5gb-19-0"], holders=1)
    assert rows == [("c0", "dra-mps", MIG, False, 40.0, None)]


BAD_SHARING = [
    mps(defaultActiveThreadPercentage=101), mps(defaultActiveThreadPercentage=-1),
    mps(defaultActiveThreadPercentage="50"), mps(defaultActiveThreadPercentage=True),
    mps(defaultPinnedDeviceMemoryLimit="1M"), mps(defaultPinnedDeviceMemoryLimit="0"),
    mps(defaultPinnedDeviceMemoryLimit="-1Gi"), mps(defaultPinnedDeviceMemoryLimit="x" * 100),
    mps(defaultPerDevicePinnedMemoryLimit={"0": "1k"}),
    mps(defaultPerDevicePinnedMemoryLimit={str(i): "1Gi" for i in range(MAX_PER_DEVICE + 1)}),
    {"strategy": "Exclusive"}, {"strategy": "mps"}, {"strategy": "TimeSlicing", "mpsConfig": {}},
    {"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}},
    {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}, "MPS", ["MPS"],
]


def test_configs_the_driver_would_refuse_are_counted_and_grant_nothing_special():
    for sharing in BAD_SHARING:
        rows, skips = run([gpu_config(sharing)], holders=1)
        assert rows == [("c0", "dra", U0, True, 100.0, None)], sharing
        assert skips == {INVALID: 1}, sharing
    wrong_api = gpu_config({"strategy": "TimeSlicing"})
    wrong_api["opaque"]["parameters"]["apiVersion"] = "gpu.resource.nvidia.com/v1alpha1"
    assert run([wrong_api], holders=1) == ([("c0", "dra", U0, True, 100.0, None)], {INVALID: 1})
    unknown_key = mps(defaultPinnedDeviceMemoryLimit="2Gi", defaultPerDevicePinnedMemoryLimit={"7": "1Gi"})
    assert run([gpu_config(unknown_key)], holders=1) == ([("c0", "dra-mps", U0, False, None, 2 * GIB)], {INVALID: 1})


def test_another_drivers_config_is_not_ours_and_spec_config_is_read_when_the_status_has_none():
    foreign = gpu_config(mps(defaultActiveThreadPercentage=10))
    foreign["opaque"]["driver"] = "compute-domain.nvidia.com"
    assert run([foreign], holders=1) == ([("c0", "dra", U0, True, 100.0, None)], {})
    spec_only = parse_configs(None, [gpu_config({"strategy": "TimeSlicing"})], lambda r: None)
    assert spec_only == (DeviceConfig((), "gpu", Sharing("TimeSlicing", interval="Default")),)


def test_unreadable_claim_keeps_the_kubelets_word_without_a_config():
    rows, _ = run([gpu_config(mps(defaultActiveThreadPercentage=30))], kubelet=True)
    assert {r[1] for r in rows} == {"dra-mps"}
    # the same pod, its claim not read: the kubelet's two holders split the device as before
    p = pod("ml", "p", UID, NODE, {"c0": [("g", "")], "c1": [("g", "")]}, {"g": ("claim", "c1")})
    dr = (DynamicResource("c1", "ml", (ClaimResource("gpu.nvidia.com", NODE, "gpu-0"),)),)
    pr = [PodResources("p", "ml", (PodResourcesContainer("c0", (), dr), PodResourcesContainer("c1", (), dr)))]
    result = compute_allocations(AllocationInputs([parse_pod(p)[0]], DEVICES, {}, pr, {}, SLICES, [], {}, NODE))
    assert {(a.scheme, a.compute_percent) for a in result.allocations} == {("dra-shared", 50.0)}


_text = st.text(st.sampled_from("aMP0S-/Gi."), max_size=8)
_leaf = st.none() | st.booleans() | st.integers(-200, 200) | _text | st.sampled_from(
    ["MPS", "TimeSlicing", "GpuConfig", "MigDeviceConfig", "resource.nvidia.com/v1beta1", "gpu.nvidia.com", "10Gi"])
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["driver", "parameters", "opaque", "requests", "source", "kind", "apiVersion", "sharing",
                     "strategy", "mpsConfig", "timeSlicingConfig", "interval", "defaultActiveThreadPercentage",
                     "defaultPinnedDeviceMemoryLimit", "defaultPerDevicePinnedMemoryLimit", "0"]) | _text,
    inner, max_size=5), max_leaves=30)


@given(allocated=_json, spec=_json, request=_text, kind=st.sampled_from(["gpu", "mig", ""]))
def test_config_parser_never_raises_and_stays_bounded(allocated, spec, request, kind):
    skips: list[str] = []
    configs = parse_configs(allocated, spec, skips.append)
    assert len(configs) <= MAX_CONFIGS and set(skips) <= {INVALID}
    for c in configs:
        assert len(c.requests) <= MAX_REQUESTS and c.kind in ("gpu", "mig", "vfio")
        s = c.sharing
        if s is not None:
            assert s.thread_percent is None or 0 <= s.thread_percent <= 100
            assert all(v % MIB == 0 and v > 0 for v in [*(x for _, x in s.pinned_per_device),
                                                         *([s.pinned_default] if s.pinned_default else [])])
    i = select(configs, request, kind, skips.append)
    assert i is None or 0 <= i < len(configs)


@given(threads=st.integers(0, 100), mib=st.integers(1, 1 << 20), extra=st.integers(0, MIB - 1),
       n=st.integers(1, 4))
def test_valid_mps_limits_are_read_exactly(threads, mib, extra, n):
    limits = mps(defaultActiveThreadPercentage=threads, defaultPinnedDeviceMemoryLimit=str(mib * MIB + extra))
    raw = [gpu_config(limits)]
    (config,) = parse_configs(raw, None, lambda r: None)
    assert config.sharing == Sharing(MPS, thread_percent=threads, pinned_default=mib * MIB)
    uuids = [f"GPU-{i}" for i in range(n)]
    got = grants(config.sharing, uuids, {}, lambda r: None)
    assert {g.compute_percent for g in got.values()} == {float(threads)}
    assert {g.memory_bytes for g in got.values()} == {mib * MIB}


# ---------------------------------------------------------------- extended resources backed by DRA

def extended_pod(mappings: Any, *, gpus: str = "1", claim_name: str = "p-extended-resources-x7k9m") -> dict:
    p = pod("ml", "p", UID, NODE, {"cuda": []}, {})
    p["spec"].pop("resourceClaims")
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    p["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": claim_name, "requestMappings": mappings}
    return p


MAPPING = [{"containerName": "cuda", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]


def run_extended(p: dict, claims: list[dict]) -> tuple[list[tuple], dict[str, int]]:
    skips: list[str] = []
    pc = parse_pod_claims(p, skips.append)
    result = compute_allocations(AllocationInputs([parse_pod(p)[0]], DEVICES, {}, None, {}, SLICES, claims,
                                                  {pc.uid: pc} if pc else {}, NODE))
    counted = dict(result.skips)
    for r in skips:
        counted[r] = counted.get(r, 0) + 1
    return sorted((a.container, a.scheme, a.uuid, a.compute_percent) for a in result.allocations), counted


def test_extended_resource_claim_is_the_containers_not_the_device_plugins():
    c = claim("ml", "p-extended-resources-x7k9m", [("container-0-request-0", NODE, "gpu-1")], [("p", UID)])
    assert run_extended(extended_pod(MAPPING), [c]) == ([("cuda", "dra", U1, 100.0)], {})
    # not read yet: two unplaced DRA grants, never the device plugin's
    assert run_extended(extended_pod(MAPPING, gpus="2"), []) == ([("cuda", "dra", None, 100.0)] * 2, {})


def test_extended_claim_of_another_pod_gives_nothing_of_it():
    c = claim("ml", "p-extended-resources-x7k9m", [("container-0-request-0", NODE, "gpu-1")],
              [("q", "00000000-0000-4000-8000-000000000009")])
    assert run_extended(extended_pod(MAPPING), [c]) == ([("cuda", "dra", None, 100.0)], {"dra_claim_not_reserved": 1})


def test_malformed_extended_status_is_counted_and_bounded():
    for mappings in ("x", [{"containerName": "cuda"}], [{**MAPPING[0], "requestName": "r" * 300}]):
        seen: list[str] = []
        pc = parse_pod_claims(extended_pod(mappings), seen.append)
        assert pc is None and seen == ["dra_pod_claims_malformed"], mappings
    many = [{**MAPPING[0], "requestName": f"container-0-request-{i}"} for i in range(MAX_RESULTS + 5)]
    skips: list[str] = []
    pc = parse_pod_claims(extended_pod(many), skips.append)
    assert len(pc.containers["cuda"]) == MAX_RESULTS and skips == ["dra_pod_claims_malformed"]
    assert pc.claims == {EXTENDED: "p-extended-resources-x7k9m"}
    no_name = extended_pod(MAPPING, claim_name="")
    assert parse_pod_claims(no_name, skips.append) is None


def test_extended_mapping_joins_the_pods_own_claims():
    p = pod("ml", "p", UID, NODE, {"cuda": [("g", "")]}, {"g": ("claim", "mine")})
    p["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-er-1", "requestMappings": MAPPING}
    pc = parse_pod_claims(copy.deepcopy(p), lambda r: None)
    assert pc.claims == {"g": "mine", EXTENDED: "p-er-1"}
    assert pc.containers["cuda"] == (("g", ""), (EXTENDED, "container-0-request-0"))
    assert pc.extended == {"cuda": ("nvidia.com/gpu",)}


@given(status=_json)
def test_extended_status_parser_never_raises(status):
    p = extended_pod(MAPPING)
    p["status"]["extendedResourceClaimStatus"] = status
    skips: list[str] = []
    pc = parse_pod_claims(p, skips.append)
    assert set(skips) <= {"dra_pod_claims_malformed"}
    assert pc is None or sum(len(v) for v in pc.containers.values()) <= MAX_RESULTS
