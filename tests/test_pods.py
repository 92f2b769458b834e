"""exporter.node.pods and pod_store: raw Pod objects -> PodInfo, workload resolution, the pod store and its views."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.node.pod_store import EMPTY_VIEW, PodStore, PodView
from exporter.node.pods import (
    MalformedPod,
    parse_container_id,
    parse_pod,
    pod_from_api,
    resolve_workload,
)
from tests.k8s_double import container_id, make_container, make_pod

HEX = "a" * 32 + "0123456789abcdef" * 2
assert len(HEX) == 64


def gpu_pod(**kwargs: Any) -> dict[str, Any]:
    return make_pod(
        "trainer-0",
        namespace="ml",
        uid="3F0C1C9E-5B7A-4C1E-9A57-2F1E0E9B1F00",
        containers=[
            make_container(
                "main",
                limits={"nvidia.com/gpu": "1", "memory": "4Gi"},
                requests={"cpu": "500m"},
                env={"NVIDIA_VISIBLE_DEVICES": "GPU-8e796295", "OTHER": "x"},
            ),
            make_container("sidecar"),
        ],
        labels={"app": "trainer"},
        annotations={"hami.io/vgpu-devices-allocated": "GPU-aaa,NVIDIA,3000,50:;"},
        **kwargs,
    )


# ------------------------------------------------------------------ pod_from_api


def test_pod_from_api_reads_every_field() -> None:
    obj = gpu_pod()
    obj["metadata"]["resourceVersion"] = "42"
    obj["spec"]["containers"][0]["env"].append({"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {}}})
    pod = pod_from_api(obj)
    assert pod.uid == "3f0c1c9e-5b7a-4c1e-9a57-2f1e0e9b1f00"
    assert (pod.name, pod.namespace, pod.node_name, pod.phase) == ("trainer-0", "ml", "gpu-node-1", "Running")
    assert pod.resource_version == "42"
    assert dict(pod.labels) == {"app": "trainer"}
    assert pod.annotations["hami.io/vgpu-devices-allocated"] == "GPU-aaa,NVIDIA,3000,50:;"
    main, sidecar = pod.containers
    assert (main.name, main.index, sidecar.name, sidecar.index) == ("main", 0, "sidecar", 1)
    assert dict(main.limits) == {"nvidia.com/gpu": "1", "memory": "4Gi"}
    assert dict(main.requests) == {"cpu": "500m"}
    assert not hasattr(main, "env")  # env values (secrets, often) are kept nowhere: nothing reads them
    expected = container_id("3F0C1C9E-5B7A-4C1E-9A57-2F1E0E9B1F00/main").split("://")[1]
    assert main.container_id == expected
    assert (pod.workload_kind, pod.workload_name) == ("Pod", "trainer-0")


def test_init_containers_are_read_with_their_kind_and_state() -> None:
    obj = gpu_pod()
    obj["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "proxy", "restartPolicy": "Always"},
    ]
    obj["status"]["initContainerStatuses"] = [
        {"name": "fetch", "containerID": f"containerd://{HEX}", "state": {"terminated": {"exitCode": 0}}},
        {"name": "proxy", "state": {"running": {}}},
    ]
    pod = pod_from_api(obj)
    fetch, proxy = pod.init_containers
    assert (fetch.name, fetch.index, fetch.init, fetch.sidecar, fetch.terminated) == ("fetch", 0, True, False, True)
    assert fetch.container_id == HEX and fetch.limits == {"nvidia.com/gpu": "1"}
    assert (proxy.name, proxy.index, proxy.init, proxy.sidecar, proxy.terminated) == ("proxy", 1, True, True, False)
    assert not any(c.init for c in pod.containers)
    obj["spec"]["initContainers"] = [{"image": "no-name"}]
    with pytest.raises(MalformedPod, match="initContainers"):
        pod_from_api(obj)
    obj["spec"]["initContainers"] = "not a list"
    with pytest.raises(MalformedPod, match="initContainers"):
        pod_from_api(obj)


def test_container_ids_matched_by_name_not_position() -> None:
    obj = gpu_pod()
    obj["status"]["containerStatuses"].reverse()
    pod = pod_from_api(obj)
    assert (
        pod.containers[0].container_id
        == container_id("3F0C1C9E-5B7A-4C1E-9A57-2F1E0E9B1F00/main").split("://")[1]
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (f"containerd://{HEX}", (HEX, None)),
        (f"cri-o://{HEX.upper()}", (HEX, None)),
        (f"docker://{HEX}", (HEX, None)),
        (HEX, (HEX, None)),
        ("", (None, None)),
        (None, (None, None)),
        ("containerd://abc", (None, "container_id_invalid")),
        (f"containerd://{HEX}\n", (None, "container_id_invalid")),
        (f"containerd://{HEX}0", (None, "container_id_invalid")),
        (12, (None, "container_id_invalid")),
    ],
)
def test_parse_container_id(raw: Any, expected: tuple[str | None, str | None]) -> None:
    assert parse_container_id(raw) == expected


def test_bad_container_id_is_an_issue_not_an_error() -> None:
    obj = gpu_pod()
    obj["status"]["containerStatuses"][0]["containerID"] = "containerd://not-hex"
    pod, issues = parse_pod(obj)
    assert pod.containers[0].container_id is None
    assert pod.containers[1].container_id is not None
    assert issues == ("container_id_invalid",)


def test_not_started_pod_has_no_container_ids() -> None:
    pod = pod_from_api(make_pod("p", phase="Pending", started=False))
    assert [c.container_id for c in pod.containers] == [None]
    obj = make_pod("q")
    del obj["status"]
    assert pod_from_api(obj).phase == "Unknown"


def test_yaml_style_numbers_in_quantities_are_kept_as_strings() -> None:
    obj = gpu_pod()
    obj["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": 2,
        "aliyun.com/gpu-mem": 3.5,
        "x": True,
    }
    pod, issues = parse_pod(obj)
    assert dict(pod.containers[0].limits) == {"nvidia.com/gpu": "2", "aliyun.com/gpu-mem": "3.5"}
    assert issues == ("resources_invalid",)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda o: o.pop("metadata"), "missing_uid"),
        (lambda o: o["metadata"].pop("uid"), "missing_uid"),
        (lambda o: o["metadata"].update(uid=7), "missing_uid"),
        (lambda o: o["metadata"].pop("name"), "missing_name"),
        (lambda o: o["metadata"].pop("namespace"), "missing_namespace"),
        (lambda o: o.update(metadata=[]), "metadata_invalid"),
        (lambda o: o.update(spec="x"), "spec_invalid"),
        (lambda o: o.update(status=1), "status_invalid"),
        (lambda o: o["spec"].pop("containers"), "containers_invalid"),
        (lambda o: o["spec"].update(containers={"a": 1}), "containers_invalid"),
        (lambda o: o["spec"]["containers"][1].pop("name"), "containers_invalid"),
        (lambda o: o["spec"]["containers"].append("oops"), "containers_invalid"),
    ],
)
def test_malformed_pods(mutate: Any, reason: str) -> None:
    obj = gpu_pod()
    mutate(obj)
    with pytest.raises(MalformedPod) as exc:
        pod_from_api(obj)
    assert exc.value.reason == reason
    assert isinstance(exc.value, ValueError)


def test_not_a_mapping() -> None:
    with pytest.raises(MalformedPod) as exc:
        pod_from_api(["not", "a", "pod"])  # type: ignore[arg-type]
    assert exc.value.reason == "not_an_object"


def test_garbage_in_maps_is_dropped_and_noted() -> None:
    obj = gpu_pod()
    obj["metadata"]["labels"] = {"ok": "1", "bad": 2}
    obj["metadata"]["annotations"] = "nope"
    obj["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, "junk", {"value": "no name"}]
    pod, issues = parse_pod(obj)
    assert dict(pod.labels) == {"ok": "1"}
    assert dict(pod.annotations) == {}
    assert sorted(issues) == ["annotations_invalid", "labels_invalid"]  # env is not read at all


# ------------------------------------------------------------------ workload resolution


def _owned(kind: str | None, name: str, labels: dict[str, str] | None = None, **ref: Any) -> dict[str, Any]:
    obj = make_pod("the-pod", labels=labels or {}, owner=(kind, name) if kind else None)
    if ref and kind:
        obj["metadata"]["ownerReferences"][0].update(ref)
    return obj


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (_owned("ReplicaSet", "web-7d4b9c8f5", {"pod-template-hash": "7d4b9c8f5"}), ("Deployment", "web")),
        (
            _owned("ReplicaSet", "my-app-v2-5f6d7c", {"pod-template-hash": "5f6d7c"}),
            ("Deployment", "my-app-v2"),
        ),
        (_owned("ReplicaSet", "bare-rs", {"pod-template-hash": "abc"}), ("ReplicaSet", "bare-rs")),
        (_owned("ReplicaSet", "web-7d4b9c8f5"), ("ReplicaSet", "web-7d4b9c8f5")),
        (_owned("ReplicaSet", "-abc", {"pod-template-hash": "abc"}), ("ReplicaSet", "-abc")),
        (
            _owned("Job", "nightly-28934820", {"batch.kubernetes.io/job-name": "nightly-28934820"}),
            ("CronJob", "nightly"),
        ),
        (_owned("Job", "report-v2-28934820", {"job-name": "report-v2-28934820"}), ("CronJob", "report-v2")),
        (_owned("Job", "nightly-28934820"), ("Job", "nightly-28934820")),
        (_owned("Job", "train-2", {"job-name": "train-2"}), ("Job", "train-2")),
        (_owned("Job", "train-abc", {"job-name": "train-abc"}), ("Job", "train-abc")),
        (_owned("Job", "nightly-28934820", {"job-name": "other"}), ("Job", "nightly-28934820")),
        (_owned("StatefulSet", "db"), ("StatefulSet", "db")),
        (_owned("DaemonSet", "agent"), ("DaemonSet", "agent")),
        (_owned("TFJob", "mnist"), ("TFJob", "mnist")),
        (_owned("ReplicaSet", "web-1", {"pod-template-hash": "1"}, controller=False), ("Pod", "the-pod")),
        (_owned("ReplicaSet", "", {"pod-template-hash": "1"}), ("Pod", "the-pod")),
        (_owned(None, ""), ("Pod", "the-pod")),
    ],
)
def test_resolve_workload(obj: dict[str, Any], expected: tuple[str, str]) -> None:
    assert resolve_workload(obj) == expected
    assert (pod_from_api(obj).workload_kind, pod_from_api(obj).workload_name) == expected


def test_non_controller_owner_refs_are_ignored() -> None:
    obj = make_pod("p")
    obj["metadata"]["ownerReferences"] = [
        {"kind": "Node", "name": "n", "controller": False},
        {"kind": "StatefulSet", "name": "db", "controller": True},
    ]
    assert resolve_workload(obj) == ("StatefulSet", "db")


# ------------------------------------------------------------------ store and view


def test_store_replace_and_view_indexes() -> None:
    store = PodStore()
    assert store.view() == EMPTY_VIEW
    a, b = gpu_pod(), make_pod("other", namespace="ml")
    store.replace([a, b], "10")
    view = store.view()
    assert isinstance(view, PodView)
    assert view.resource_version == "10" == store.resource_version
    assert set(view.pods) == {a["metadata"]["uid"].lower(), b["metadata"]["uid"]}
    pod = view.by_name[("ml", "trainer-0")]
    cid = pod.containers[1].container_id
    assert view.by_container_id[cid] == (pod, pod.containers[1])
    with pytest.raises(TypeError):
        view.pods["x"] = pod  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.resource_version = "11"  # type: ignore[misc]


def test_view_is_a_snapshot() -> None:
    store = PodStore()
    store.replace([make_pod("a")], "1")
    before = store.view()
    assert store.view() is before  # unchanged: cached
    store.apply("ADDED", make_pod("b"))
    assert len(before.pods) == 1
    assert len(store.view().pods) == 2


def test_store_apply_events() -> None:
    store = PodStore()
    store.replace([], "1")
    obj = make_pod("p", phase="Pending", started=False)
    obj["metadata"]["resourceVersion"] = "2"
    store.apply("ADDED", obj)
    assert store.view().by_name[("default", "p")].phase == "Pending"
    assert store.view().by_container_id == {}
    running = make_pod("p")
    running["metadata"]["resourceVersion"] = "3"
    store.apply("MODIFIED", running)
    assert store.view().by_name[("default", "p")].phase == "Running"
    assert len(store.view().by_container_id) == 1
    done = copy.deepcopy(running)
    done["status"]["phase"] = "Succeeded"
    done["metadata"]["resourceVersion"] = "4"
    store.apply("MODIFIED", done)
    # Terminated pods stay: their processes may still hold GPU memory.
    assert store.view().by_name[("default", "p")].phase == "Succeeded"
    assert len(store.view().by_container_id) == 1
    store.apply("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "9"}})
    assert store.view().resource_version == "9"
    done["metadata"]["resourceVersion"] = "10"
    store.apply("DELETED", done)
    assert store.view().pods == {}
    assert store.resource_version == "10"
    assert dict(store.skips()) == {}


def test_store_counts_malformed_and_keeps_last_good() -> None:
    store = PodStore()
    good = make_pod("p")
    store.replace([good, {"metadata": {"name": "x"}}, "garbage"], "1")
    assert dict(store.skips()) == {"missing_uid": 1, "not_an_object": 1}
    broken = copy.deepcopy(good)
    broken["spec"]["containers"] = None
    store.apply("MODIFIED", broken)
    assert store.view().by_name[("default", "p")].containers[0].name == "main"
    store.apply("WEIRD", good)
    store.apply("DELETED", {"metadata": {}})
    assert dict(store.skips()) == {
        "missing_uid": 2,
        "not_an_object": 1,
        "containers_invalid": 1,
        "unknown_event_type": 1,
    }
    # A deletion of a malformed object still removes the pod, by uid or by name.
    store.apply("DELETED", {"metadata": {"namespace": "default", "name": "p"}})
    assert store.view().pods == {}


def test_newest_pod_wins_a_name_clash() -> None:
    store = PodStore()
    old, new = make_pod("p", uid="uid-old"), make_pod("p", uid="uid-new")
    store.replace([old], "1")
    store.apply("ADDED", new)
    assert store.view().by_name[("default", "p")].uid == "uid-new"
    store.apply("MODIFIED", old)
    assert store.view().by_name[("default", "p")].uid == "uid-old"


# ------------------------------------------------------------------ property tests

json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_like = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "metadata", "spec", "status", "uid", "name", "namespace", "labels", "annotations",
        "ownerReferences", "containers", "containerStatuses", "containerID", "resources", "limits",
        "requests", "env", "value", "phase", "nodeName", "controller", "kind", "resourceVersion",
    ]
)  # fmt: skip
pod_like = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(keys | st.text(max_size=4), inner, max_size=6)
    ),
    max_leaves=40,
)


def _mutations(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid pod with garbage dropped in at a random path."""
    paths = [
        ("metadata",),
        ("metadata", "labels"),
        ("metadata", "ownerReferences"),
        ("metadata", "uid"),
        ("spec",),
        ("spec", "containers"),
        ("status",),
        ("status", "containerStatuses"),
        ("status", "phase"),
    ]

    def put(path: tuple[str, ...], value: Any) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        cur = obj
        for p in path[:-1]:
            cur = cur[p]
        cur[path[-1]] = value
        return obj

    def put_container(value: Any, where: str) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        if where == "spec":
            obj["spec"]["containers"][0] = value
        else:
            obj["status"]["containerStatuses"][0] = value
        return obj

    return st.one_of(
        st.builds(put, st.sampled_from(paths), pod_like),
        st.builds(put_container, pod_like, st.sampled_from(["spec", "status"])),
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_like, pod_like, _mutations(gpu_pod()), _mutations(_owned("Job", "j-12345678"))))
def test_garbage_never_raises_anything_but_malformed_pod(obj: Any) -> None:
    try:
        pod, issues = parse_pod(obj)
    except MalformedPod as exc:
        assert exc.reason
        return
    assert all(isinstance(i, str) for i in issues)
    assert isinstance(pod.uid, str) and pod.uid
    for c in pod.containers:
        assert c.container_id is None or (
            len(c.container_id) == 64 and c.container_id == c.container_id.lower()
        )
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in c.limits.items())
    kind, name = resolve_workload(obj)
    assert isinstance(kind, str) and isinstance(name, str)


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]), pod_like)))
def test_store_never_raises_on_garbage_events(events: list[tuple[str, Any]]) -> None:
    store = PodStore()
    store.replace([e for _, e in events], "1")
    for etype, obj in events:
        store.apply(etype, obj)
    view = store.view()
    assert all(pod.uid == uid for uid, pod in view.pods.items())
    assert all(v >= 1 for v in store.skips().values())
