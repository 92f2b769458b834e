"""DRA reservations checked (issue 26, item 5): a claim counts only for consumers in its own namespace, and
the kubelet's ``dynamic_resources`` outranks the API objects, as pod-resources does for device plugins.

Each case failed before the fix: a consumer of another namespace in a claim's ``status.reservedFor`` turned
its holder's exclusive GPU ``share``; a claim the kubelet named in another namespace than the pod's was
taken; a container that only the API objects (Pod + claim) said held a GPU the kubelet gave another
container split it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.attribute import EXCLUSIVE, SHARE
from exporter.attribution.dra import consumers
from exporter.attribution.dra_objects import ClaimInfo
from exporter.model import ClaimResource, DynamicResource, PodResources, PodResourcesContainer
from tests.test_dra import NODE, U0, api_objects, kubelet_answer, puid, run, slices, summary
from tests.test_dra_shapes import claim, pod

SPY = puid(9)  # a pod of namespace "evil"


def _with_spy(reserved_for_spy: bool) -> tuple[list, list]:
    """The node of tests/test_dra.py plus a pod of another namespace, named in the victim's reservedFor."""
    pods_raw, claims_raw = api_objects()
    pods_raw.append(pod("evil", "spy", SPY, NODE, {"c": [("g", "")]}, {"g": ("claim", "train-gpu-x1")}))
    if reserved_for_spy:
        claims_raw[0] = claim("ml", "train-gpu-x1", [("gpu", NODE, "gpu-0")], [("train", puid(1)), ("spy", SPY)])
    return pods_raw, claims_raw


def test_a_consumer_of_another_namespace_does_not_split_an_exclusive_gpu():
    pods_raw, claims_raw = _with_spy(reserved_for_spy=True)
    for answer in (kubelet_answer(), None):
        allocs, attr = run(pods_raw, claims_raw, slices(), answer)
        s = summary(attr)
        assert s["modes"][U0] == EXCLUSIVE
        assert [a for a in s["allocs"] if a[2] == U0] == [("train", "main", U0, EXCLUSIVE, "dra", 100.0, 40 << 30)]
        assert allocs.skips.get("dra_claim_cross_namespace") == 1  # refused, counted once per claim


def test_a_claim_the_kubelet_names_in_another_namespace_is_refused():
    pods_raw, claims_raw = _with_spy(reserved_for_spy=False)
    stolen = (DynamicResource("train-gpu-x1", "ml", (ClaimResource("gpu.nvidia.com", NODE, "gpu-0"),)),)
    answer = (*kubelet_answer(), PodResources("spy", "evil", (PodResourcesContainer("c", (), stolen),)))
    allocs, attr = run(pods_raw, claims_raw, slices(), answer)
    assert summary(attr)["modes"][U0] == EXCLUSIVE
    assert not [a for a in allocs.allocations if a.pod_uid == SPY]
    assert allocs.skips.get("dra_claim_cross_namespace") == 1


def test_the_kubelets_dynamic_resources_outrank_the_api_objects():
    """A pod whose own claim (in its own namespace, reserved for it) names the GPU the kubelet gave another
    container holds nothing of it: the API objects never split what the kubelet assigned."""
    pods_raw, claims_raw = api_objects()
    pods_raw.append(pod("evil", "spy", SPY, NODE, {"c": [("g", "")]}, {"g": ("claim", "spy-gpu")}))
    claims_raw.append(claim("evil", "spy-gpu", [("gpu", NODE, "gpu-0")], [("spy", SPY)]))
    allocs, attr = run(pods_raw, claims_raw, slices(), kubelet_answer())
    assert summary(attr)["modes"][U0] == EXCLUSIVE
    assert not [a for a in allocs.allocations if a.pod_uid == SPY]
    assert allocs.skips.get("dra_claim_kubelet_disagrees") == 1
    # without the kubelet's answer (before 1.34) the API objects are all there is: two holders, share
    _, attr = run(pods_raw, claims_raw, slices(), None)
    assert summary(attr)["modes"][U0] == SHARE


def test_a_shared_claim_of_one_namespace_still_splits():
    pods_raw, claims_raw = api_objects()
    pods_raw.append(pod("ml", "waiting", puid(10), NODE, {"c": [("g", "")]}, {"g": ("claim", "other")}))
    claims_raw[0] = claim("ml", "train-gpu-x1", [("gpu", NODE, "gpu-0")], [("train", puid(1)), ("waiting", puid(10))])
    allocs, attr = run(pods_raw, claims_raw, slices(), kubelet_answer())
    assert summary(attr)["modes"][U0] == SHARE  # the second consumer may start any moment: the claim is shared
    assert "dra_claim_cross_namespace" not in allocs.skips


_uid = st.sampled_from([puid(i) for i in range(6)])


@settings(max_examples=200, deadline=None)
@given(reserved=st.frozensets(_uid, max_size=6), namespaces=st.dictionaries(_uid, st.sampled_from(["ml", "evil"])))
def test_consumers_counts_only_known_pods_of_the_claims_namespace(reserved, namespaces):
    refused: list[str] = []
    c = ClaimInfo("ml", "c", (), reserved)
    n = consumers(c, namespaces, refused.append)
    assert n == sum(1 for u in reserved if namespaces.get(u) == "ml")
    assert refused == (["dra_claim_cross_namespace"] if any(namespaces.get(u) == "evil" for u in reserved) else [])
