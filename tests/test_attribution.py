"""The attribution rules (exporter/attribution/attribute.py) with every sharing scheme."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.attribute import (
    EXCLUSIVE,
    NONE,
    SHARE,
    NodeAttribution,
    attribute,
    combine_util_samples,
)
from exporter.attribution.schemes.base import GIB, MIB, parse_quantity
from exporter.model import (
    CgroupRef,
    ContainerInfo,
    DeviceSample,
    NodeSample,
    PodInfo,
    PodResources,
    PodResourcesContainer,
    ProcessUsage,
    UtilSample,
)

TOTAL = 16 * GIB


def cid(n: int) -> str:
    return f"{n:064x}"


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def pod(n: int, limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        phase: str = "Running", containers: int = 1, namespace: str = "default") -> PodInfo:
    return PodInfo(
        uid=uid(n), name=f"pod-{n}", namespace=namespace, node_name="node-1", phase=phase,
        containers=tuple(ContainerInfo(f"c{i}", i, cid(n * 10 + i), MappingProxyType(limits or {}))
                         for i in range(containers)),
        annotations=MappingProxyType(annotations or {}))


@dataclass
class Pods:
    pods: dict[str, PodInfo] = field(default_factory=dict)
    by_container_id: dict[str, tuple[PodInfo, ContainerInfo]] = field(default_factory=dict)

    @classmethod
    def of(cls, *ps: PodInfo) -> Pods:
        v = cls()
        for p in ps:
            v.pods[p.uid] = p
            for c in p.containers:
                v.by_container_id[c.container_id] = (p, c)
        return v


def gpu(i: int, procs: tuple[tuple[int, int | None, int], ...] = (), util: int = 50, **kw) -> DeviceSample:
    """procs: (pid, used memory, sm util)."""
    return DeviceSample(
        index=i, uuid=f"GPU-{i}", name="Tesla T4", minor_number=i, memory_total_bytes=TOTAL,
        memory_used_bytes=sum(m or 0 for _, m, _ in procs) + 100 * MIB, utilization_gpu=util,
        power_usage_milliwatts=70000, temperature_celsius=40,
        processes=tuple(ProcessUsage(p, m) for p, m, _ in procs),
        util_samples=tuple(UtilSample(p, 1000, s) for p, _, s in procs if s), **kw)


def in_pod(n: int, container: int = 0) -> CgroupRef:
    return CgroupRef(uid(n), cid(n * 10 + container), "containerd")


def run(devices, pids, pods: Pods, node_labels=None, pod_resources=None) -> NodeAttribution:
    allocs = compute_allocations(AllocationInputs(pods.pods.values(), devices, node_labels or {}, pod_resources))
    return attribute(NodeSample(1.0, tuple(devices)), pids, pods, allocs.allocations)


def test_exclusive_whole_gpu_takes_device_values():
    p = pod(1, {"nvidia.com/gpu": "1"})
    a = run([gpu(0, ((100, 3 * GIB, 30),), util=37)], {100: in_pod(1)}, Pods.of(p))
    d = a.devices[0]
    assert d.mode == EXCLUSIVE
    assert [(u.pod.name, u.container, u.sm_util, u.memory_used_bytes) for u in d.users] == [
        ("pod-1", "c0", 37.0, 3 * GIB + 100 * MIB)]
    assert d.unaccounted == ()
    assert [(x.uuid, x.compute_percent, x.memory_bytes, x.allocate_mode) for x in a.allocations] == [
        ("GPU-0", 100.0, TOTAL, EXCLUSIVE)]


def test_two_gpu_container_gets_one_exclusive_row_per_gpu_placed_by_processes():
    p = pod(1, {"nvidia.com/gpu": "2"})
    devs = [gpu(0, ((100, GIB, 80),), util=81), gpu(1, ((101, GIB, 60),), util=62), gpu(2, util=0)]
    a = run(devs, {100: in_pod(1), 101: in_pod(1)}, Pods.of(p))
    assert [d.mode for d in a.devices] == [EXCLUSIVE, EXCLUSIVE, NONE]
    assert [d.users[0].sm_util for d in a.devices[:2]] == [81.0, 62.0]
    assert sorted(x.uuid for x in a.allocations) == ["GPU-0", "GPU-1"]


def test_idle_holder_known_from_pod_resources_is_exclusive():
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ("GPU-1",)),)),))]
    a = run([gpu(0, util=0), gpu(1, util=0)], {}, Pods.of(p), pod_resources=pr)
    assert [d.mode for d in a.devices] == [NONE, EXCLUSIVE]


def test_idle_holder_without_pod_resources_has_allocation_with_unknown_gpu():
    p = pod(1, {"nvidia.com/gpu": "1"})
    a = run([gpu(0, util=0)], {}, Pods.of(p))
    assert a.devices[0].mode == NONE
    assert [(x.uuid, x.compute_percent, x.memory_bytes) for x in a.allocations] == [("", 100.0, None)]


def test_gpushare_two_containers_share_with_own_usage_and_grant():
    ann = {"ALIYUN_COM_GPU_MEM_IDX": "0"}
    p1, p2 = pod(1, {"aliyun.com/gpu-mem": "4"}, ann), pod(2, {"aliyun.com/gpu-mem": "6"}, ann)
    a = run([gpu(0, ((100, 3 * GIB, 10), (200, 6 * GIB, 90)), util=95)],
            {100: in_pod(1), 200: in_pod(2)}, Pods.of(p1, p2))
    d = a.devices[0]
    assert d.mode == SHARE
    assert [(u.pod.name, u.sm_util, u.memory_used_bytes, u.allocation.memory_bytes) for u in d.users] == [
        ("pod-1", 10.0, 3 * GIB, 4 * GIB), ("pod-2", 90.0, 6 * GIB, 6 * GIB)]


def test_single_gpushare_container_is_still_share():
    p = pod(1, {"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"},
            {"ALIYUN_COM_GPU_MEM_IDX": "0"})
    a = run([gpu(0, ((100, GIB, 25),))], {100: in_pod(1)}, Pods.of(p))
    assert a.devices[0].mode == SHARE
    assert [(x.compute_percent, x.memory_bytes) for x in a.allocations] == [(30.0, 4 * GIB)]


def test_gpushare_allocation_annotation_json_places_per_container():
    ann = {"scheduler.framework.gpushare.allocation": '{"0":{"1":3}}'}
    p = pod(1, {"aliyun.com/gpu-mem": "3"}, ann)
    a = run([gpu(0), gpu(1)], {}, Pods.of(p))
    assert [(x.uuid, x.memory_bytes) for x in a.allocations] == [("GPU-1", 3 * GIB)]
    assert [d.mode for d in a.devices] == [NONE, SHARE]


@pytest.mark.parametrize("capacity,asked,expected,skips", [
    # --memory-unit=MiB: capacity per GPU is the card's MiB, so 1000 means 1000 MiB
    ({"aliyun.com/gpu-mem": str(2 * 16384), "aliyun.com/gpu-count": "2"}, "1000", 1000 * MIB, {}),
    # the default GiB unit: capacity per GPU is the card's GiB
    ({"aliyun.com/gpu-mem": "32", "aliyun.com/gpu-count": "2"}, "3", 3 * GIB, {}),
    # gpu-count absent: the GPUs NVML lists
    ({"aliyun.com/gpu-mem": str(2 * 16384)}, "2048", 2 * GIB, {}),
    # no capacity: GiB unless GiB cannot fit the card
    ({}, "4", 4 * GIB, {}),
    ({}, "1000", 1000 * MIB, {"gpushare_memory_unit_mib_by_size": 1}),
    # never larger than the card, whatever the unit says
    ({"aliyun.com/gpu-mem": "32", "aliyun.com/gpu-count": "2"}, "100", TOTAL, {"gpushare_allocation_exceeds_card": 1}),
])
def test_gpushare_memory_unit_from_the_node_capacity(capacity, asked, expected, skips):
    p = pod(1, {"aliyun.com/gpu-mem": asked}, {"ALIYUN_COM_GPU_MEM_IDX": "1"})
    result = compute_allocations(AllocationInputs([p], [gpu(0), gpu(1)], {}, None, capacity))
    assert [(x.uuid, x.memory_bytes) for x in result.allocations] == [("GPU-1", expected)]
    assert result.skips == skips


@given(request=st.integers(0, 10**7), capacity=st.one_of(st.none(), st.integers(1, 10**7)),
       placed=st.booleans())
def test_gpushare_never_allocates_more_than_the_card(request, capacity, placed):
    p = pod(1, {"aliyun.com/gpu-mem": str(request)}, {"ALIYUN_COM_GPU_MEM_IDX": "0"} if placed else {})
    cap = {} if capacity is None else {"aliyun.com/gpu-mem": str(capacity)}
    result = compute_allocations(AllocationInputs([p], [gpu(0)], {}, None, cap))
    assert all(0 <= (x.memory_bytes or 0) <= TOTAL for x in result.allocations)


def test_vcuda_fractional_is_share_and_whole_is_exclusive():
    frac = pod(1, {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-memory": "8"},
               {"tencent.com/predicate-gpu-idx-0": "0"})
    whole = pod(2, {"tencent.com/vcuda-core": "100"}, {"tencent.com/predicate-gpu-idx-0": "1"})
    a = run([gpu(0), gpu(1)], {}, Pods.of(frac, whole))
    assert [d.mode for d in a.devices] == [SHARE, EXCLUSIVE]
    assert [(x.pod.name, x.compute_percent, x.memory_bytes) for x in a.allocations] == [
        ("pod-1", 40.0, 8 * 256 * MIB), ("pod-2", 100.0, TOTAL)]


def test_vcuda_predicate_index_is_the_device_minor_not_the_nvml_index():
    # gpu-manager writes /dev/nvidia<minor> numbers; here NVML index 0 is /dev/nvidia3, index 1 /dev/nvidia1
    frac = pod(1, {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-memory": "8"},
               {"tencent.com/predicate-gpu-idx-0": "3"})
    whole = pod(2, {"tencent.com/vcuda-core": "100"}, {"tencent.com/predicate-gpu-idx-0": "1"})
    devices = [replace(gpu(0), minor_number=3), replace(gpu(1), minor_number=1)]
    a = run(devices, {}, Pods.of(frac, whole))
    assert [(x.pod.name, x.uuid) for x in a.allocations] == [("pod-1", "GPU-0"), ("pod-2", "GPU-1")]
    assert [d.mode for d in a.devices] == [SHARE, EXCLUSIVE]
    # a minor no device has is a counted skip, never another GPU's index
    stray = pod(3, {"tencent.com/vcuda-core": "40"}, {"tencent.com/predicate-gpu-idx-0": "0"})
    result = compute_allocations(AllocationInputs([stray], devices, {}))
    assert [x.uuid for x in result.allocations] == [None]
    assert result.skips == {"annotation_unknown_gpu_minor": 1}


def test_hami_virtual_gpus_from_annotation():
    p1 = pod(1, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"},
             {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:;"})
    p2 = pod(2, {"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,5000,0:;"})
    a = run([gpu(0, ((100, GIB, 20),))], {100: in_pod(1)}, Pods.of(p1, p2))
    assert a.devices[0].mode == SHARE
    assert [(u.pod.name, u.sm_util) for u in a.devices[0].users] == [("pod-1", 20.0), ("pod-2", 0.0)]
    assert [(x.compute_percent, x.memory_bytes) for x in a.allocations] == [
        (30.0, 3000 * MIB), (None, 5000 * MIB)]


def test_hami_second_container_segment():
    ann = {"hami.io/vgpu-devices-allocated": ";GPU-0,NVIDIA,1000,10:;"}
    p = pod(1, {"nvidia.com/gpu": "1"}, ann, containers=2)
    a = run([gpu(0)], {}, Pods.of(p))
    assert [(x.container, x.compute_percent) for x in a.allocations] == [("c1", 10.0)]


def with_init(p: PodInfo, *init_limits: dict[str, str]) -> PodInfo:
    """``p`` with init containers ``i0, i1, ...`` (their limits as given)."""
    init = tuple(ContainerInfo(f"i{k}", k, None, MappingProxyType(lim)) for k, lim in enumerate(init_limits))
    return replace(p, init_containers=init)


@pytest.mark.parametrize("annotation", [
    ";GPU-0,NVIDIA,1000,10:;GPU-1,NVIDIA,2000,20:;",  # HAMi >= 2.9: the init container's segment first
    "GPU-0,NVIDIA,1000,10:;GPU-1,NVIDIA,2000,20:;",  # older HAMi: containers only
])
def test_hami_segments_map_to_containers_in_both_layouts(annotation):
    p = with_init(pod(1, {"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-allocated": annotation}, containers=2), {})
    a = run([gpu(0), gpu(1)], {}, Pods.of(p))
    assert [(x.container, x.uuid, x.compute_percent, x.memory_bytes) for x in a.allocations] == [
        ("c0", "GPU-0", 10.0, 1000 * MIB), ("c1", "GPU-1", 20.0, 2000 * MIB)]


def test_hami_init_container_holding_a_gpu_segment_shifts_the_containers():
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:;GPU-1,NVIDIA,2000,20:;"}
    p = with_init(pod(1, {"nvidia.com/gpu": "1"}, ann), {"nvidia.com/gpu": "1"})
    a = run([gpu(0), gpu(1)], {}, Pods.of(p))
    assert [(x.container, x.uuid) for x in a.allocations] == [("c0", "GPU-1")]


def test_hami_layout_from_which_containers_request_gpus_when_the_count_fits_neither():
    # one segment for 1 init + 2 containers: only the old layout gives it to a GPU container
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:"}
    p = with_init(pod(1, {"nvidia.com/gpu": "1"}, ann, containers=2), {})
    result = compute_allocations(AllocationInputs([p], [gpu(0)], {}))
    assert [(x.container, x.uuid) for x in result.allocations] == [("c0", "GPU-0")]
    assert result.skips == {}


def test_hami_unreadable_layout_is_a_counted_skip_not_a_guess():
    # 1 init + 2 containers, 4 segments: fits neither count, and both layouts put a segment on a GPU-less container
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,10:;GPU-1,NVIDIA,1000,10:;;GPU-1,NVIDIA,1,1:;"}
    p = with_init(pod(1, {"nvidia.com/gpu": "1"}, ann, containers=2), {})
    result = compute_allocations(AllocationInputs([p], [gpu(0), gpu(1)], {}))
    assert result.skips == {"hami_annotation_layout_unknown": 2}
    assert [x.uuid for x in result.allocations] == [None, None]  # placed by processes, if any


def test_hami_segments_follow_the_gpu_requesting_containers_when_positions_are_wrong():
    # the entry sits on a container that requests nothing: the device plugin hands it to the requester
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,1000,0:;;;"}
    p = pod(1, {}, ann, containers=3)
    p = replace(p, containers=(p.containers[0], replace(p.containers[1], limits=MappingProxyType(
        {"nvidia.com/vgpu": "1", "nvidia.com/gpumem": "1000"})), p.containers[2]))
    a = run([gpu(0)], {}, Pods.of(p))
    assert [(x.container, x.uuid, x.memory_bytes) for x in a.allocations] == [("c1", "GPU-0", 1000 * MIB)]


@pytest.mark.parametrize("phase,terminated,sidecar,held", [
    ("Pending", False, False, True),  # init is running: it holds its segment
    ("Pending", True, False, False),  # done with init
    ("Running", False, False, False),  # init containers finished before the pod ran
    ("Running", False, True, True),  # a native sidecar runs beside the others
])
def test_hami_init_container_allocation_while_it_may_run(phase, terminated, sidecar, held):
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,500,10:;;"}
    init = ContainerInfo("warmup", 0, None, MappingProxyType({"nvidia.com/gpu": "1"}), init=True,
                         sidecar=sidecar, terminated=terminated)
    p = replace(pod(1, {}, ann, phase=phase), init_containers=(init,))
    result = compute_allocations(AllocationInputs([p], [gpu(0)], {}))
    assert [(x.container, x.uuid) for x in result.allocations] == ([("warmup", "GPU-0")] if held else [])


def test_init_containers_are_not_allocated_whole_gpus_twice():
    # the kubelet reuses an init container's devices for the app containers: only the app's count
    init = ContainerInfo("setup", 0, None, MappingProxyType({"nvidia.com/gpu": "1"}), init=True)
    p = replace(pod(1, {"nvidia.com/gpu": "1"}, phase="Pending"), init_containers=(init,))
    result = compute_allocations(AllocationInputs([p], [gpu(0)], {}))
    assert [x.container for x in result.allocations] == ["c0"]


def test_hami_to_allocate_stands_in_for_the_allocated_annotation():
    p = pod(1, {"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,3000,30:;"})
    a = run([gpu(0), gpu(1)], {}, Pods.of(p))
    assert [(x.uuid, x.compute_percent) for x in a.allocations] == [("GPU-1", 30.0)]


def mig(uuid: str, parent: str, total: int, procs=()) -> DeviceSample:
    return replace(gpu(0, procs), uuid=uuid, parent_uuid=parent, memory_total_bytes=total, mig_profile="1g.24gb")


def test_hami_dynamic_mig_attributes_to_the_mig_instance_not_the_parent():
    migs = json.dumps([{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-P", "profile": "1g.24gb",
                        "placement": {"start": 9, "size": 3}, "migUUID": "MIG-aaaa", "gpuInstanceID": 6,
                        "computeInstanceID": 0}])
    p = pod(1, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"},
            {"hami.io/vgpu-devices-allocated": "GPU-P,NVIDIA,8000,0:;", "hami.io/vgpu-mig-allocations": migs})
    devices = [mig("MIG-aaaa", "GPU-P", 24 * GIB, ((100, GIB, 30),)), mig("MIG-bbbb", "GPU-P", 24 * GIB)]
    allocs = compute_allocations(AllocationInputs([p], devices, {}))
    assert allocs.skips == {}
    a = attribute(NodeSample(1.0, tuple(devices)), {100: in_pod(1)}, Pods.of(p), allocs.allocations)
    assert [(x.uuid, x.allocate_mode, x.memory_bytes) for x in a.allocations] == [("MIG-aaaa", EXCLUSIVE, 24 * GIB)]
    assert [d.mode for d in a.devices] == [EXCLUSIVE, NONE]


def test_hami_mig_instance_not_created_yet_is_placed_by_processes():
    migs = json.dumps([{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-P", "profile": "1g.24gb"}])
    p = pod(1, {"nvidia.com/gpu": "1"},
            {"hami.io/vgpu-devices-allocated": "GPU-P,NVIDIA,8000,0:;", "hami.io/vgpu-mig-allocations": migs})
    devices = [mig("MIG-aaaa", "GPU-P", 24 * GIB, ((100, GIB, 30),))]
    allocs = compute_allocations(AllocationInputs([p], devices, {}))
    assert allocs.skips == {"hami_mig_instance_unknown": 1}
    a = attribute(NodeSample(1.0, tuple(devices)), {100: in_pod(1)}, Pods.of(p), allocs.allocations)
    assert [x.uuid for x in a.allocations] == ["MIG-aaaa"]


@pytest.mark.parametrize("raw", ["not json", "{}", "[1]", '[{"containerIndex": "0"}]', "[" + "{}," * 100 + "{}]"])
def test_hami_malformed_mig_annotation_is_a_counted_skip(raw):
    p = pod(1, {"nvidia.com/gpu": "1"},
            {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,8000,0:;", "hami.io/vgpu-mig-allocations": raw})
    result = compute_allocations(AllocationInputs([p], [gpu(0)], {}))
    assert result.skips == {"malformed_hami_mig_annotation": 1}
    assert [x.uuid for x in result.allocations] == ["GPU-0"]


_hami_text = st.lists(st.sampled_from(["GPU-0", "GPU-1", ",", "NVIDIA", ":", ";", "100", "-5", "x", "0"]),
                      max_size=30).map("".join)


@given(annotation=_hami_text, n_init=st.integers(0, 2), n_main=st.integers(1, 3),
       init_gpu=st.booleans())
def test_hami_any_annotation_places_only_on_listed_gpus(annotation, n_init, n_main, init_gpu):
    p = with_init(pod(1, {"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-allocated": annotation}, containers=n_main),
                  *([{"nvidia.com/gpu": "1"} if init_gpu else {}] * n_init))
    result = compute_allocations(AllocationInputs([p], [gpu(0), gpu(1)], {}))
    assert {x.uuid for x in result.allocations} <= {"GPU-0", "GPU-1", None}
    assert {x.container for x in result.allocations} <= {c.name for c in p.containers}


@pytest.mark.parametrize("labels,ids,scheme,compute", [
    ({"nvidia.com/gpu.sharing-strategy": "time-slicing"}, ("GPU-0::0",), "nvidia-time-slicing", None),
    ({}, ("GPU-0::3",), "nvidia-shared", None),  # replicas, no GFD label: shared, the mode not guessed
    ({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"}, ("GPU-0::1",),
     "nvidia-mps", 25.0),
])
def test_nvidia_time_slicing_and_mps_are_share(labels, ids, scheme, compute):
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ids),)),))]
    a = run([gpu(0, ((100, GIB, 40),))], {100: in_pod(1)}, Pods.of(p), labels, pr)
    assert a.devices[0].mode == SHARE
    assert [(x.scheme, x.compute_percent, x.uuid) for x in a.allocations] == [(scheme, compute, "GPU-0")]
    assert a.devices[0].users[0].sm_util == 40.0


@pytest.mark.parametrize("labels,ids,scheme,compute,memory", [
    ({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"}, ("GPU-0::1",),
     "nvidia-mps", 25.0, TOTAL // 4),
    ({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"}, (), "nvidia-mps", 25.0, TOTAL // 4),
    ({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}, ("GPU-0::1",),
     "nvidia-time-slicing", None, None),
])
def test_mps_clients_are_allocated_their_share_of_the_memory(labels, ids, scheme, compute, memory):
    """With sharing.mps.replicas N the plugin caps each client at total/N: that is its allocation."""
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ids),)),))]
    a = run([gpu(0, ((100, GIB, 40),))], {100: in_pod(1)}, Pods.of(p), labels, pr if ids else None)
    assert [(x.scheme, x.compute_percent, x.memory_bytes, x.uuid) for x in a.allocations] == [
        (scheme, compute, memory, "GPU-0")]


GKE_TS = {"cloud.google.com/gke-accelerator": "nvidia-l4", "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
          "cloud.google.com/gke-max-shared-clients-per-gpu": "2"}
GKE_MPS = {**GKE_TS, "cloud.google.com/gke-gpu-sharing-strategy": "mps"}


@pytest.mark.parametrize("labels,ids,scheme,mode,compute,memory", [
    ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, ("nvidia3",), "gke", EXCLUSIVE, 100.0, TOTAL),
    ({}, ("nvidia3",), "gke", EXCLUSIVE, 100.0, TOTAL),  # GKE's id form alone
    (GKE_TS, ("nvidia3/vgpu1",), "gke-time-sharing", SHARE, None, None),
    ({}, ("nvidia3/vgpu0",), "gke-time-sharing", SHARE, None, None),
    (GKE_MPS, ("nvidia3/vgpu1",), "gke-mps", SHARE, 50.0, TOTAL // 2),
])
def test_gke_device_plugin_ids_name_the_minor(labels, ids, scheme, mode, compute, memory):
    # NVML index 0 is /dev/nvidia3: GKE's ids name the minor, not the index
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ids),)),))]
    devices = [replace(gpu(0, ((100, GIB, 40),)), minor_number=3), replace(gpu(1), minor_number=0)]
    a = run(devices, {100: in_pod(1)}, Pods.of(p), labels, pr)
    assert [(x.scheme, x.uuid, x.compute_percent, x.memory_bytes) for x in a.allocations] == [
        (scheme, "GPU-0", compute, memory)]
    assert [d.mode for d in a.devices] == [mode, NONE]


@pytest.mark.parametrize("device_id,expected", [("nvidia0/gi1", "MIG-b"), ("nvidia0/gi0/vgpu1", "MIG-a")])
def test_gke_mig_partition_ids_name_the_gpu_instance(device_id, expected):
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", (device_id,)),)),))]
    migs = [replace(gpu(0), uuid=u, parent_uuid="GPU-0", gpu_instance_id=gi, minor_number=0)
            for u, gi in (("MIG-a", 0), ("MIG-b", 1))]
    labels = {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"}
    result = compute_allocations(AllocationInputs([p], migs, labels, pr))
    assert [x.uuid for x in result.allocations] == [expected]


def test_gke_time_sharing_without_pod_resources_is_placed_by_processes():
    p = pod(1, {"nvidia.com/gpu": "1"})
    a = run([gpu(0), gpu(1, ((100, GIB, 40),))], {100: in_pod(1)}, Pods.of(p), GKE_TS)
    assert [(x.scheme, x.uuid) for x in a.allocations] == [("gke-time-sharing", "GPU-1")]
    assert [d.mode for d in a.devices] == [NONE, SHARE]


def test_gke_unknown_minor_is_a_counted_skip():
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ("nvidia7",)),)),))]
    result = compute_allocations(AllocationInputs([p], [gpu(0)], GKE_TS, pr))
    assert [x.uuid for x in result.allocations] == [None]
    assert result.skips == {"pod_resources_unknown_device": 1}


@pytest.mark.parametrize("limits,annotations,scheme", [
    ({"aliyun.com/gpu-mem": "4"}, {"ALIYUN_COM_GPU_MEM_IDX": "0"}, "aliyun-gpushare"),
    ({"tencent.com/vcuda-core": "40"}, {"tencent.com/predicate-gpu-idx-0": "0"}, "tencent-vcuda"),
    ({"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:;"}, "hami"),
])
def test_an_annotation_that_lies_is_believed_for_the_allocation_not_for_usage(limits, annotations, scheme):
    """The annotation says GPU-0, the container's processes run on GPU-1 (a scheduler bug in the wild)."""
    liar, other = pod(1, limits, annotations), pod(2, {"aliyun.com/gpu-mem": "2"}, {"ALIYUN_COM_GPU_MEM_IDX": "1"})
    a = run([gpu(0), gpu(1, ((100, 2 * GIB, 35), (200, GIB, 5)))], {100: in_pod(1), 200: in_pod(2)},
            Pods.of(liar, other))
    assert a.disagreements == {scheme: 1}
    # usage where the processes run: a share row for pod-1 on GPU-1, nothing unaccounted
    on_1 = a.devices[1]
    assert on_1.mode == SHARE and not on_1.unaccounted
    assert [(u.pod.name, u.sm_util, u.memory_used_bytes) for u in on_1.users] == [
        ("pod-1", 35.0, 2 * GIB), ("pod-2", 5.0, GIB)]
    # the claimed allocation stays visible on GPU-0, with its scheme's mode; nobody's usage is there
    assert [(x.pod.name, x.uuid, x.allocate_mode) for x in a.allocations] == [
        ("pod-1", "GPU-0", SHARE), ("pod-2", "GPU-1", SHARE)]
    assert a.devices[0].mode == NONE and a.devices[0].users == ()


def test_the_kubelets_answer_is_never_second_guessed():
    # pod-resources gives GPU-0; processes on GPU-1 stay unaccounted (an intruder, rule 6), no disagreement
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ("GPU-0",)),)),))]
    a = run([gpu(0), gpu(1, ((100, GIB, 35),))], {100: in_pod(1)}, Pods.of(p), pod_resources=pr)
    assert a.disagreements == {}
    assert [r.pid for r in a.devices[1].unaccounted] == [100]


def test_an_annotation_naming_every_gpu_it_runs_on_is_no_disagreement():
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:GPU-1,NVIDIA,3000,30:;"}
    p = pod(1, {"nvidia.com/gpu": "2"}, ann)
    a = run([gpu(0), gpu(1, ((100, GIB, 35),))], {100: in_pod(1)}, Pods.of(p))
    assert a.disagreements == {}


def test_processes_of_two_unallocated_containers_make_share():
    p1, p2 = pod(1), pod(2)
    a = run([gpu(0, ((100, GIB, 10), (200, GIB, 20)))], {100: in_pod(1), 200: in_pod(2)}, Pods.of(p1, p2))
    d = a.devices[0]
    assert d.mode == SHARE
    assert [u.pod.name for u in d.users] == ["pod-1", "pod-2"]
    assert all(u.allocation is None for u in d.users)
    assert {x.pid for x in d.unaccounted} == {100, 200}


def test_intruder_on_exclusive_gpu_turns_it_shared_and_is_unaccounted():
    holder, intruder = pod(1, {"nvidia.com/gpu": "1"}), pod(2)
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ("GPU-0",)),)),))]
    a = run([gpu(0, ((100, GIB, 10), (200, 2 * GIB, 20)))], {100: in_pod(1), 200: in_pod(2)},
            Pods.of(holder, intruder), pod_resources=pr)
    d = a.devices[0]
    assert d.mode == SHARE
    assert [(x.pid, x.pod.name) for x in d.unaccounted] == [(200, "pod-2")]


def test_host_process_is_unaccounted_and_does_not_change_mode():
    p = pod(1, {"nvidia.com/gpu": "1"})
    a = run([gpu(0, ((100, GIB, 10), (300, GIB, 5)))], {100: in_pod(1), 300: None}, Pods.of(p))
    d = a.devices[0]
    assert d.mode == EXCLUSIVE
    assert [(x.pid, x.pod) for x in d.unaccounted] == [(300, None)]


def test_lone_process_of_unallocated_container_is_none_mode_and_unaccounted():
    a = run([gpu(0, ((100, GIB, 10),))], {100: in_pod(1)}, Pods.of(pod(1)))
    assert a.devices[0].mode == NONE
    assert [x.pid for x in a.devices[0].unaccounted] == [100]


def test_exited_process_is_skipped_and_counted():
    p = pod(1, {"aliyun.com/gpu-mem": "2"}, {"ALIYUN_COM_GPU_MEM_IDX": "0"})
    a = run([gpu(0, ((100, GIB, 10), (101, GIB, 10)))], {100: in_pod(1)}, Pods.of(p))
    assert a.skips["process_exited"] == 1
    assert a.devices[0].users[0].memory_used_bytes == GIB


def test_unknown_memory_is_omitted_not_zero():
    p = pod(1, {"aliyun.com/gpu-mem": "2"}, {"ALIYUN_COM_GPU_MEM_IDX": "0"})
    a = run([gpu(0, ((100, None, 10),))], {100: in_pod(1)}, Pods.of(p))
    assert a.devices[0].users[0].memory_used_bytes is None
    assert a.devices[0].users[0].sm_util == 10.0


def test_unreadable_process_list_is_not_idle():
    p = pod(1, {"aliyun.com/gpu-mem": "2"}, {"ALIYUN_COM_GPU_MEM_IDX": "0"})
    a = run([gpu(0, processes_ok=False)], {}, Pods.of(p))
    u = a.devices[0].users[0]
    assert (u.sm_util, u.memory_used_bytes) == (None, None)


def test_utilization_not_supported_gives_no_sm_value():
    p = pod(1, {"aliyun.com/gpu-mem": "2"}, {"ALIYUN_COM_GPU_MEM_IDX": "0"})
    a = run([gpu(0, ((100, GIB, 10),), util_samples_ok=False)], {100: in_pod(1)}, Pods.of(p))
    assert a.devices[0].users[0].sm_util is None


def test_container_usage_is_capped_at_100():
    p = pod(1, {"aliyun.com/gpu-mem": "2"}, {"ALIYUN_COM_GPU_MEM_IDX": "0"})
    a = run([gpu(0, ((100, GIB, 70), (101, GIB, 60)))], {100: in_pod(1), 101: in_pod(1)}, Pods.of(p))
    assert a.devices[0].users[0].sm_util == 100.0


def test_finished_pods_release_their_allocation():
    p = pod(1, {"nvidia.com/gpu": "1"}, phase="Succeeded")
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", ("GPU-0",)),)),))]
    a = run([gpu(0)], {}, Pods.of(p), pod_resources=pr)
    assert a.devices[0].mode == NONE and a.allocations == ()


def test_process_in_pod_missing_from_cache_is_counted():
    a = run([gpu(0, ((100, GIB, 10),))], {100: in_pod(7)}, Pods.of())
    assert a.skips["process_pod_not_in_cache"] == 1
    assert a.devices[0].unaccounted[0].pod is None


def test_mean_of_samples_per_pid():
    got = combine_util_samples([UtilSample(1, 10, 20), UtilSample(1, 20, 40), UtilSample(2, 10, 5)])
    assert got == {1: 30.0, 2: 5.0}


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 100)), max_size=40))
def test_combined_utilization_stays_a_percentage(samples):
    got = combine_util_samples([UtilSample(p, i, u) for i, (p, u) in enumerate(samples)])
    assert set(got) == {p for p, _ in samples}
    assert all(0 <= v <= 100 for v in got.values())


@pytest.mark.parametrize("text,value", [("2", 2.0), ("500m", 0.5), ("4Gi", 4 * GIB), ("1k", 1000.0),
                                        ("abc", None), ("-1", None), ("", None), ("1.5", 1.5)])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@given(st.one_of(st.text(), st.integers(), st.floats(), st.none(), st.booleans()))
def test_parse_quantity_never_raises(value):
    got = parse_quantity(value)
    assert got is None or got >= 0


@given(st.text(), st.dictionaries(st.sampled_from([
    "aliyun.com/gpu-mem", "tencent.com/vcuda-core", "tencent.com/vcuda-memory", "nvidia.com/gpu",
    "nvidia.com/gpucores", "nvidia.com/gpumem", "aliyun.com/gpu-core.percentage"]), st.text(max_size=8)),
    st.sampled_from(["hami.io/vgpu-devices-allocated", "ALIYUN_COM_GPU_MEM_IDX",
                     "scheduler.framework.gpushare.allocation", "tencent.com/predicate-gpu-idx-0"]))
def test_garbage_annotations_and_quantities_never_raise(value, limits, key):
    p = pod(1, limits, {key: value})
    a = run([gpu(0), gpu(1)], {}, Pods.of(p))
    assert all(x.memory_bytes is None or x.memory_bytes >= 0 for x in a.allocations)


def _gke_form(minor: int, gi: int | None, k: int | None) -> str:
    return f"nvidia{minor}" + (f"/gi{gi}" if gi is not None else "") + (f"/vgpu{k}" if k is not None else "")


_small = st.one_of(st.none(), st.integers(0, 9))
_gke_id = st.one_of(st.builds(_gke_form, st.integers(0, 9), _small, _small), st.text(max_size=20))


@given(ids=st.lists(_gke_id, max_size=4), labels=st.dictionaries(
    st.sampled_from(["cloud.google.com/gke-accelerator", "cloud.google.com/gke-gpu-sharing-strategy",
                     "cloud.google.com/gke-max-shared-clients-per-gpu"]),
    st.sampled_from(["nvidia-l4", "time-sharing", "mps", "2", "0", "x", ""])))
def test_gke_any_device_ids_place_only_on_listed_gpus(ids, labels):
    p = pod(1, {"nvidia.com/gpu": "1"})
    pr = [PodResources("pod-1", "default", (PodResourcesContainer("c0", (("nvidia.com/gpu", tuple(ids)),)),))]
    devices = [replace(gpu(0), minor_number=3), replace(gpu(1), uuid="MIG-x", parent_uuid="GPU-9", minor_number=4,
                                                        gpu_instance_id=1)]
    result = compute_allocations(AllocationInputs([p], devices, labels, pr))
    assert {x.uuid for x in result.allocations} <= {"GPU-0", "MIG-x", None}
    assert all(x.memory_fraction is None or 0 < x.memory_fraction <= 1 for x in result.allocations)
