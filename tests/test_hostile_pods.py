"""No pod can crash, freeze or falsify attribution: bounded input, trusted allocations, isolation.

Everything a pod's author controls (annotations of every scheme, resource quantities) is driven
through the real parser, the allocations, attribution and the rows: the cycle completes, memory
stays bounded, and the honest pods' rows do not change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.attribution import allocations
from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.attribute import EXCLUSIVE, SHARE, attribute
from exporter.attribution.schemes.base import GIB, Scheme
from exporter.exposition.rows import ExporterStats, LabelNames, build_families
from exporter.model import (
    CgroupRef,
    DeviceSample,
    NodeSample,
    PodResources,
    PodResourcesContainer,
    ProcessUsage,
    UtilSample,
)
from exporter.node.pod_store import PodStore
from exporter.node.pods import parse_pod

NODE = "gpu-node-1"
HUGE = "9" * 400


def gpu(i: int, procs: tuple[tuple[int, int, int], ...] = ()) -> DeviceSample:
    return DeviceSample(index=i, uuid=f"GPU-{i}", name="NVIDIA A100-SXM4-40GB", minor_number=i,
                        memory_total_bytes=40 * GIB, memory_used_bytes=sum(m for _, m, _ in procs),
                        utilization_gpu=50, processes=tuple(ProcessUsage(p, m) for p, m, _ in procs),
                        util_samples=tuple(UtilSample(p, 10, s) for p, _, s in procs))


def raw_pod(n: int, limits: Mapping[str, str] | None = None, annotations: Mapping[str, Any] | None = None,
            phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"uid": f"00000000-0000-4000-8000-{n:012x}", "name": f"pod-{n}", "namespace": "team",
                     "annotations": dict(annotations or {})},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"limits": dict(limits or {})}}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "main", "containerID": f"containerd://{n:064x}"}]},
    }


def run(objs: list[dict[str, Any]], devices: list[DeviceSample], pids: Mapping[int, int] | None = None,
        pod_resources: list[PodResources] | None = None):
    """The real pipeline from raw Pod objects to families; pids maps pid -> pod number."""
    store = PodStore()
    store.replace(objs, "1")
    view = store.view()
    allocs = compute_allocations(AllocationInputs(view.pods.values(), devices, {}, pod_resources))
    placement = {pid: CgroupRef(f"00000000-0000-4000-8000-{n:012x}", f"{n:064x}", "containerd")
                 for pid, n in (pids or {}).items()}
    attr = attribute(NodeSample(1.0, tuple(devices)), placement, view, allocs.allocations)
    stats = ExporterStats(skips=allocs.skips)
    families = build_families(attr, NodeSample(1.0, tuple(devices)), NODE, LabelNames(), stats)
    return allocs, attr, families


def kubelet(n: int, *uuids: str) -> PodResources:
    return PodResources(f"pod-{n}", "team", (PodResourcesContainer("main", (("nvidia.com/gpu", uuids),)),))


def rows_of(families, pod: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in families for s in f.samples
            if s.labels.get("pod_name") == pod}


# ---------------------------------------------------------------- the attacks, one by one

def test_a_huge_hami_number_on_a_pod_without_gpu_request_is_ignored_not_a_crash() -> None:
    hostile = raw_pod(2, {}, {"hami.io/vgpu-devices-allocated": f"GPU-0,NVIDIA,{HUGE},{HUGE}:;"})
    allocs, _, _ = run([hostile], [gpu(0)])
    assert allocs.allocations == ()
    assert allocs.skips == {"annotation_without_request": 1}


def test_a_huge_hami_number_on_a_gpu_pod_drops_that_pod_only() -> None:
    hostile = raw_pod(2, {"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-allocated": f"GPU-0,NVIDIA,{HUGE},30:;"})
    honest = raw_pod(3, {"nvidia.com/gpu": "1"}, {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,4000,30:;"})
    allocs, _, _ = run([hostile, honest], [gpu(0), gpu(1)])
    assert [(a.container, a.uuid) for a in allocs.allocations] == [("main", "GPU-1")]
    assert allocs.skips == {"hami_annotation_out_of_range": 1}


@pytest.mark.parametrize("limits", [
    {"nvidia.com/gpu": "100000000000"},
    {"nvidia.com/mig-1g.5gb": "100000000000"},
    {"tencent.com/vcuda-core": "100000000000"},
    {"tencent.com/vcuda-memory": "100000000000"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000000000"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1000"},
    {"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "100000000000"},
])
def test_quantities_beyond_what_the_node_holds_are_counted_skips(limits: dict[str, str]) -> None:
    """A Pending pod with nvidia.com/gpu: 1e11 grew the process by 1.1 GB in 26 s (one allocation per GPU)."""
    allocs, _, _ = run([raw_pod(2, limits, phase="Pending")], [gpu(0), gpu(1)])
    assert allocs.allocations == ()
    assert allocs.skips == {"quantity_out_of_range": 1}


@pytest.mark.parametrize("value", ["Infinity", "NaN", "-Infinity", "-1", "1e400"])
def test_non_finite_gpushare_annotation_is_malformed(value: str) -> None:
    annotation = '{"0": {"0": ' + value + "}}"
    allocs, _, _ = run([raw_pod(2, {"aliyun.com/gpu-mem": "4"}, {"scheduler.framework.gpushare.allocation":
                                                                 annotation})], [gpu(0)])
    assert allocs.skips == {"malformed_gpushare_annotation": 1}
    assert [(a.uuid, a.memory_bytes) for a in allocs.allocations] == [(None, 4 * GIB)]  # placed by processes


@pytest.mark.parametrize("quantity", [HUGE, "1e308", "9" * 60 + "Ei", "Infinity", "nan"])
def test_absurd_quantity_text_is_malformed_not_overflowed(quantity: str) -> None:
    allocs, _, _ = run([raw_pod(2, {"nvidia.com/gpu": quantity})], [gpu(0)])
    assert allocs.allocations == ()


def test_an_annotation_cannot_take_over_a_gpu_the_kubelet_gave_another_pod() -> None:
    """The attack: no GPU request, a HAMi annotation naming a GPU another pod holds whole."""
    owner = raw_pod(1, {"nvidia.com/gpu": "1"})
    thief = raw_pod(2, {}, {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,70000,90:;"})
    _, attr, _ = run([owner, thief], [gpu(0, ((100, GIB, 40),))], {100: 1}, [kubelet(1, "GPU-0")])
    assert attr.devices[0].mode == EXCLUSIVE
    assert [(a.pod.name, a.allocate_mode) for a in attr.allocations] == [("pod-1", EXCLUSIVE)]


def test_even_a_gpu_requesting_pod_cannot_annotate_its_way_onto_a_kubelet_whole_gpu() -> None:
    owner = raw_pod(1, {"nvidia.com/gpu": "1"})
    thief = raw_pod(2, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "90"},
                    {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,30000,90:;"})
    _, attr, _ = run([owner, thief], [gpu(0, ((100, GIB, 40),))], {100: 1}, [kubelet(1, "GPU-0")])
    assert attr.devices[0].mode == EXCLUSIVE
    assert [(a.pod.name, a.uuid, a.allocate_mode) for a in attr.allocations] == [
        ("pod-1", "GPU-0", EXCLUSIVE), ("pod-2", "", SHARE)]
    assert attr.disagreements == {"hami": 1}


def test_without_the_kubelet_an_annotation_cannot_share_a_gpu_a_pod_runs_on_whole() -> None:
    """Issue 26's attack without pod-resources: a HAMi pod names the GPU another tenant holds whole
    (its processes run there) and asks 90 % of it. Refused and counted, the victim stays exclusive."""
    victim = raw_pod(1, {"nvidia.com/gpu": "1"})
    thief = raw_pod(2, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "90"},
                    {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,30000,90:;"})
    _, attr, families = run([victim, thief], [gpu(0, ((100, GIB, 40),))], {100: 1})
    assert attr.devices[0].mode == EXCLUSIVE
    assert [u.pod.name for u in attr.devices[0].users] == ["pod-1"]
    assert [(a.pod.name, a.uuid, a.allocate_mode) for a in attr.allocations] == [
        ("pod-1", "GPU-0", EXCLUSIVE), ("pod-2", "", SHARE)]
    assert attr.disagreements == {"hami": 1}
    assert not any(name == "nvidia_gpu_allocated_compute_percent" and dict(labels).get("uuid") == "GPU-0"
                   for name, labels, _ in rows_of(families, "pod-2"))


def test_without_the_kubelet_a_pod_running_where_it_was_not_allocated_keeps_no_gpu_from_its_tenants() -> None:
    """The reverse: a whole-GPU pod whose processes reach a HAMi GPU (NVIDIA_VISIBLE_DEVICES=all) is
    inferred there, but the HAMi tenant running on it keeps its annotation: NVML shows it shares the GPU."""
    intruder = raw_pod(1, {"nvidia.com/gpu": "1"})
    tenant = raw_pod(2, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"},
                     {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,10000,30:;"})
    _, attr, _ = run([intruder, tenant], [gpu(0, ((100, GIB, 40), (200, GIB, 20)))], {100: 1, 200: 2})
    assert attr.devices[0].mode == SHARE and attr.disagreements == {}
    assert ("pod-2", "GPU-0", SHARE) in [(a.pod.name, a.uuid, a.allocate_mode) for a in attr.allocations]
    # with the kubelet's answer naming GPU-0 the intruder's, the annotation is refused even so
    _, attr, _ = run([intruder, tenant], [gpu(0, ((100, GIB, 40), (200, GIB, 20)))], {100: 1, 200: 2},
                     [kubelet(1, "GPU-0")])
    assert attr.disagreements == {"hami": 1}


def test_without_the_kubelet_an_idle_whole_gpu_is_not_protected() -> None:
    """The limit of the refusal: a whole GPU whose holder runs nothing is unplaced without the
    kubelet, so nothing collides with an annotation naming it (docs/sharing.md, trust model)."""
    victim = raw_pod(1, {"nvidia.com/gpu": "1"})
    thief = raw_pod(2, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "90"},
                    {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,30000,90:;"})
    _, attr, _ = run([victim, thief], [gpu(0)], {})
    assert attr.devices[0].mode == SHARE and attr.disagreements == {}
    _, attr, _ = run([victim, thief], [gpu(0)], {}, [kubelet(1, "GPU-0")])  # the kubelet's answer closes it
    assert attr.devices[0].mode == EXCLUSIVE and attr.disagreements == {"hami": 1}


def test_hami_binding_marks_naming_another_node_are_not_this_nodes() -> None:
    ann = {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,4000,30:;", "hami.io/vgpu-node": "other-node"}
    allocs, _, _ = run([raw_pod(2, {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, ann)], [gpu(0)])
    # the annotation is not used: no HAMi allocation, nothing placed on GPU-0 by it
    assert [(a.scheme, a.uuid) for a in allocs.allocations] == [("nvidia", None)]
    assert allocs.skips == {"annotation_without_request": 1}


def test_one_pod_failing_never_fails_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(node, pod, c):
        raise RuntimeError("a bug one pod's input reaches")

    boom = Scheme("boom", lambda node, pod, c: pod.name == "pod-2", explode)
    monkeypatch.setattr(allocations, "SCHEMES", (boom, *allocations.SCHEMES))
    honest = raw_pod(1, {"nvidia.com/gpu": "1"})
    allocs, _, _ = run([raw_pod(2, {"nvidia.com/gpu": "1"}), honest], [gpu(0)], pod_resources=[kubelet(1, "GPU-0")])
    assert [a.pod_uid[-1] for a in allocs.allocations] == ["1"]
    assert allocs.skips == {"pod_allocation_failed": 1}


# ---------------------------------------------------------------- any hostile pod at all

_numbers = st.one_of(st.integers(-10, 10**6).map(str), st.sampled_from([HUGE, "1e308", "inf", "NaN", "-0", "0x10",
                                                                       "1.5", "", " ", "1Ei", "99999999999999"]))
_text = st.one_of(_numbers, st.text(max_size=40), st.sampled_from(["GPU-0", "GPU-1", "MIG-x", "nvidia0"]))
_hami_entry = st.builds(lambda u, m, c: f"{u},NVIDIA,{m},{c}:", _text, _numbers, _numbers)
_annotations = st.fixed_dictionaries({}, optional={
    "hami.io/vgpu-devices-allocated": st.lists(st.lists(_hami_entry, max_size=3).map("".join), max_size=4).map(
        lambda segs: ";".join(segs) + ";"),
    "hami.io/vgpu-devices-to-allocate": _text,
    "hami.io/vgpu-mig-allocations": st.one_of(_text, st.lists(st.dictionaries(
        st.sampled_from(["containerIndex", "deviceIndex", "migUUID", "gpuUUID"]),
        st.one_of(st.integers(-5, 10**20), _text, st.none())), max_size=3).map(json.dumps)),
    "hami.io/vgpu-node": st.sampled_from([NODE, "elsewhere", ""]),
    "ALIYUN_COM_GPU_MEM_IDX": _text,
    "scheduler.framework.gpushare.allocation": st.one_of(_text, st.dictionaries(
        st.sampled_from(["0", "1", "-1", HUGE]), st.dictionaries(st.sampled_from(["0", "1", "7", HUGE]),
                                                                  st.one_of(st.floats(), st.integers()))).map(
        json.dumps)),
    "tencent.com/predicate-gpu-idx-0": _text,
})
_limits = st.dictionaries(st.sampled_from([
    "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "nvidia.com/gpumem", "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage", "nvidia.com/vgpu", "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage",
    "tencent.com/vcuda-core", "tencent.com/vcuda-memory"]), _numbers, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile=st.lists(st.tuples(_limits, _annotations, st.sampled_from(["Running", "Pending"])), max_size=4))
def test_any_hostile_pods_leave_the_honest_pods_rows_unchanged(hostile) -> None:
    devices = [gpu(0, ((100, 2 * GIB, 40),)), gpu(1, ((200, GIB, 10),))]
    honest = [raw_pod(1, {"nvidia.com/gpu": "1"}),
              raw_pod(3, {"aliyun.com/gpu-mem": "4"}, {"ALIYUN_COM_GPU_MEM_IDX": "1"})]
    # the honest pods alone: pod-1 holds GPU-0 whole by the kubelet's word, pod-3 shares GPU-1
    pids, pr = {100: 1, 200: 3}, [kubelet(1, "GPU-0")]
    _, _, alone = run(honest, devices, pids, pr)
    tenants = [raw_pod(10 + i, limits, ann, phase) for i, (limits, ann, phase) in enumerate(hostile)]
    allocs, attr, together = run(honest + tenants, devices, pids, pr)
    assert rows_of(together, "pod-1") == rows_of(alone, "pod-1")
    assert attr.devices[0].mode == EXCLUSIVE
    assert len(allocs.allocations) <= (len(honest) + len(tenants)) * len(devices) * 48  # bounded, whatever they say
    for a in allocs.allocations:
        assert a.memory_bytes is None or 0 <= a.memory_bytes <= 40 * GIB * len(devices)
        assert a.compute_percent is None or 0 <= a.compute_percent <= 100 * len(devices)
    assert {s.labels.get("uuid") for f in together for s in f.samples if "uuid" in s.labels} <= {"GPU-0", "GPU-1", ""}
    assert parse_pod(honest[0])[0].containers[0].limits == MappingProxyType({"nvidia.com/gpu": "1"})
