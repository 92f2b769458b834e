"""The DRA sources (exporter/node/dra_source.py) against the Kubernetes API double's resource.k8s.io/v1."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from exporter.attribution.dra_objects import PodClaims
from exporter.node.dra_source import ClaimAwarePodStore, DraWatcher, static_dra
from exporter.node.kube_api import ApiException
from tests.integration_support import poll
from tests.k8s_double import ApiServerDouble, api_client_for, kube_api_for
from tests.test_dra_shapes import claim, gpu_device, pod, resource_slice

NODE = "gpu-node-1"
UID = "d7a00000-0000-4000-8000-000000000001"


@pytest.mark.e2e
def test_double_serves_slices_and_claims_as_the_api_does():
    with ApiServerDouble() as api:
        api.set_resource_slices([resource_slice(NODE, [gpu_device(0, "GPU-a")]),
                                 resource_slice("other", [gpu_device(0, "GPU-b")], suffix="o")])
        api.set_resource_claims([claim("ml", "c1", [("gpu", NODE, "gpu-0")], [("p", UID)])])
        v1 = client.ResourceV1Api(api_client_for(api))
        got = v1.list_resource_slice(field_selector=f"spec.nodeName={NODE}")
        assert [s.spec.node_name for s in got.items] == [NODE]
        assert v1.read_namespaced_resource_claim("c1", "ml").status.reserved_for[0].uid == UID
        assert [c.metadata.name for c in v1.list_resource_claim_for_all_namespaces().items] == ["c1"]
        with pytest.raises(client.ApiException) as missing:
            v1.read_namespaced_resource_claim("nope", "ml")
        assert missing.value.status == 404
        with pytest.raises(client.ApiException) as bad:
            v1.list_resource_slice(field_selector="spec.devices=x")
        assert bad.value.status == 400


@pytest.mark.e2e
@pytest.mark.parametrize("versions", [("v1",), ("v1beta2",)], ids=["1.34+", "1.33"])
def test_watcher_follows_slices_and_reads_the_claims_pods_name(versions):
    with ApiServerDouble() as api:
        api.serve_resource_versions(*versions)
        api.set_resource_slices([resource_slice(NODE, [gpu_device(0, "GPU-a")])])
        api.set_resource_claims([claim("ml", "c1", [("gpu", NODE, "gpu-0")], [("p", UID)])])
        store = ClaimAwarePodStore()
        store.replace([pod("ml", "p", UID, NODE, {"c": [("gpu", "")]}, {"gpu": ("claim", "c1")})], "1")
        w = DraWatcher(NODE, kube_api_for(api), store.pod_claims, tick=0.1, watch_timeout_seconds=5)
        w.start()
        try:
            src = w.sources()
            poll(lambda: src.resource_claims() or None, 10, "the claim read")
            poll(lambda: src.resource_slices() or None, 10, "the slice list")
            path = f"/apis/resource.k8s.io/{versions[0]}/resourceslices"
            poll(lambda: [r for r in api.requests_to("GET", path) if r.query.get("watch")] or None, 10,
                 "the slice watch")
            api.set_resource_slices([resource_slice(NODE, [gpu_device(0, "GPU-z")])])
            poll(lambda: [s for s in src.resource_slices()
                          if s["spec"]["devices"][0]["attributes"]["uuid"]["string"] == "GPU-z"] or None,
                 10, "the watched update")
            store.apply("DELETED", {"metadata": {"uid": UID, "name": "p", "namespace": "ml"}})
            poll(lambda: not src.resource_claims() or None, 10, "the claim dropped with its pod")
            assert {r.path.split("/")[3] for r in api.requests if r.status == 200} == set(versions)
        finally:
            w.stop()


def test_pod_claims_follow_watch_events_and_static_sources():
    store = ClaimAwarePodStore()
    p = pod("ml", "p", UID, NODE, {"c": [("gpu", "r1")]}, {"gpu": ("template", "p-gpu-abc")})
    store.apply("ADDED", p)
    pc = store.pod_claims()[UID]
    assert pc.claims == {"gpu": "p-gpu-abc"} and pc.containers == {"c": (("gpu", "r1"),)}
    bad = pod("ml", "q", "d7a00000-0000-4000-8000-000000000002", NODE, {"c": []}, {})
    bad["spec"]["resourceClaims"] = [{"name": 7}]
    store.apply("ADDED", bad)
    assert store.skips()["dra_pod_claims_malformed"] == 1
    src = static_dra([{"a": 1}], [], [p])
    assert src.resource_slices() == ({"a": 1},) and UID in src.pod_claims()


def test_claims_past_the_per_pod_cap_are_not_followed_and_counted():
    store = ClaimAwarePodStore(max_claims=2)
    names = {f"g{i}": ("claim", f"c{i}") for i in range(5)}
    p = pod("ml", "greedy", UID, NODE, {"c": [(n, "") for n in names]}, names)
    p["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "sched-claim", "requestMappings": [
        {"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}
    store.replace([p], "1")
    pc = store.pod_claims()[UID]
    assert list(pc.claims.values()) == ["sched-claim", "c0"]  # the scheduler's own claim is never the one cut
    assert store.skips()["dra_pod_claims_over_limit"] == 1
    store.apply("MODIFIED", p)
    assert store.skips()["dra_pod_claims_over_limit"] == 2  # once per pod parsed, like every pod skip


class _FakeApi:
    """The API as the claim reader sees it: a claim ``ml/a`` exists, ``ml/b`` is a 404; calls recorded."""

    def __init__(self) -> None:
        self.claim_gets: list[tuple[str, dict | None]] = []

    def get(self, path: str, query: dict | None = None, timeout: float = 30.0):
        if path.endswith("/resourceslices"):
            return {"items": [], "metadata": {"resourceVersion": "1"}}
        self.claim_gets.append((path.rsplit("/", 1)[-1], query))
        if path.endswith("/a"):
            return {"metadata": {"namespace": "ml", "name": "a"}}
        raise ApiException(404, "Not Found")

    def watch(self, *args, **kwargs):
        raise OSError("no watch here")  # the slice loop then waits 30 s (stop() wakes it)


def test_the_claim_reader_reads_on_pod_changes_backs_off_misses_and_resyncs_from_the_cache():
    api, now = _FakeApi(), [1000.0]
    pods = {"u1": PodClaims("u1", "ml", {"x": "a", "y": "b"})}
    w = DraWatcher(NODE, api, lambda: dict(pods), tick=0.01, clock=lambda: now[0])  # type: ignore[arg-type]
    w.start()
    try:
        src = w.sources()
        poll(lambda: len(api.claim_gets) >= 2 or None, 10, "the first reads")
        assert sorted(api.claim_gets) == [("a", None), ("b", None)]  # a pod change: consistent reads
        assert [c["metadata"]["name"] for c in src.resource_claims()] == ["a"]
        pods["u2"] = PodClaims("u2", "ml", {"x": "a", "y": "b"})  # a new pod naming both
        poll(lambda: len(api.claim_gets) >= 3 or None, 10, "the new pod's read")
        time.sleep(0.2)
        assert api.claim_gets[2:] == [("a", None)]  # b is missing: its backoff (30 s) runs, a pod changes nothing
        now[0] += 40.0  # past b's backoff: read again, within the steady budget, from the server's cache
        poll(lambda: len(api.claim_gets) >= 4 or None, 10, "the retry")
        assert api.claim_gets[3] == ("b", {"resourceVersion": "0"})
        del pods["u1"], pods["u2"]
        poll(lambda: not src.resource_claims() or None, 10, "the claims dropped with their pods")
    finally:
        w.stop()
