"""The NVIDIA device plugin's sharing as the node says it: per-resource GFD labels, replicas, unknown sharing.

Real inputs are in tests/data/realworld/pods-nvidia-plugin.yaml and pods-nvidia-mig-sharing.yaml; this module
checks the label reading itself (any labels, never a guessed mode) and the counted reasons.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.schemes.nvidia import resource_sharing
from exporter.model import ContainerInfo, DeviceSample, PodInfo, PodResources, PodResourcesContainer

RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.shared")
_values = st.one_of(st.sampled_from(["none", "mps", "time-slicing", "MPS ", "", "0", "1", "2", "48", "-1", "1e308",
                                     "nan", "x" * 64]), st.text(max_size=70))
_labels = st.dictionaries(
    st.sampled_from([f"{r}.{k}" for r in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb")
                     for k in ("sharing-strategy", "replicas", "product", "count")]), _values, max_size=6)


@given(labels=_labels, resource=st.sampled_from(RESOURCES), evidence=st.booleans())
def test_any_labels_give_a_known_mode_and_bounded_replicas(labels, resource, evidence) -> None:
    mode, replicas = resource_sharing(labels, resource, evidence)
    assert mode in ("none", "time-slicing", "mps", "unknown")
    assert 0 <= replicas <= 2.0**53
    base = resource.removesuffix(".shared")
    said = (labels.get(f"{base}.sharing-strategy") or "").strip().lower()
    if mode == "mps":
        assert said == "mps"  # MPS (and its limits) only where GFD says so
    if (evidence or resource != base) and said not in ("mps", "time-slicing"):
        assert mode in ("unknown", "time-slicing")  # shared is never reported whole
    if mode == "time-slicing" and said != "time-slicing":
        assert said == "" and replicas > 1  # GFD before v0.15.0: replicas, no strategy label


def test_each_resource_is_read_with_its_own_labels() -> None:
    labels = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4",
              "nvidia.com/mig-1g.10gb.sharing-strategy": "none", "nvidia.com/mig-1g.10gb.replicas": "1"}
    assert resource_sharing(labels, "nvidia.com/mig-1g.10gb", False) == ("none", 1.0)
    assert resource_sharing(labels, "nvidia.com/gpu", False) == ("time-slicing", 4.0)
    # a stale "none" while the kubelet hands out replicas: shared, mode unknown
    assert resource_sharing(labels, "nvidia.com/mig-1g.10gb", True)[0] == "unknown"
    assert resource_sharing({}, "nvidia.com/gpu.shared", False)[0] == "unknown"
    assert resource_sharing({}, "nvidia.com/gpu", False) == ("none", 0.0)


def _gpu(i: int) -> DeviceSample:
    return DeviceSample(index=i, uuid=f"GPU-{i}", name="T4", minor_number=i, memory_total_bytes=16 << 30)


def _pod(limits: dict[str, str]) -> PodInfo:
    return PodInfo(uid="u1", name="p", namespace="default", node_name="n", phase="Running",
                   containers=(ContainerInfo(name="c", index=0, container_id="c" * 64, limits=limits),))


def _run(limits, devices, labels=None, ids=None, capacity=None):
    pr = None if ids is None else [PodResources("p", "default", (PodResourcesContainer("c", ids),))]
    return compute_allocations(AllocationInputs([_pod(limits)], devices, labels or {}, pr, capacity or {}))


def test_unknown_sharing_is_counted_and_grants_nothing() -> None:
    result = _run({"nvidia.com/gpu": "1"}, [_gpu(0)], ids=(("nvidia.com/gpu", ("GPU-0::3",)),))
    assert [(a.scheme, a.uuid, a.whole, a.compute_percent, a.memory_fraction) for a in result.allocations] == [
        ("nvidia-shared", "GPU-0", False, None, None)]
    assert result.skips == {"nvidia_sharing_mode_unknown": 1}


def test_more_advertised_than_nvml_lists_is_shared_without_the_socket() -> None:
    """Bottlerocket without pod-resources: capacity 8 of one T4 (the README's 'advertise 80 instead of 8')."""
    result = _run({"nvidia.com/gpu": "2"}, [_gpu(0)], capacity={"nvidia.com/gpu": "8"})
    assert [(a.scheme, a.uuid, a.whole) for a in result.allocations] == [("nvidia-shared", None, False)]
    whole = _run({"nvidia.com/gpu": "1"}, [_gpu(0)], capacity={"nvidia.com/gpu": "1"})
    assert [(a.scheme, a.whole) for a in whole.allocations] == [("nvidia", True)] and whole.skips == {}


def test_replicas_of_one_gpu_are_one_allocation_and_unknown_ids_stay_unplaced() -> None:
    ids = (("nvidia.com/gpu", ("GPU-0::0", "GPU-0::1", "GPU-9::0")),)
    result = _run({"nvidia.com/gpu": "3"}, [_gpu(0), _gpu(1)],
                  {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "2"}, ids)
    assert sorted((a.uuid or "") for a in result.allocations) == ["", "GPU-0"]
    assert result.skips == {"pod_resources_unknown_device": 1}


def test_a_hostile_quantity_of_an_unknown_shared_resource_is_dropped() -> None:
    result = _run({"nvidia.com/gpu.shared": "100000000000"}, [_gpu(0)])
    assert result.allocations == ()
    assert result.skips == {"nvidia_sharing_mode_unknown": 1, "quantity_out_of_range": 1}
