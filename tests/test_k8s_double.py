"""The API server double, exercised through the real ``kubernetes`` client (and raw HTTP where the
client would refuse to send the malformed request we want the server to reject)."""

from __future__ import annotations

import datetime as dt
import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.k8s_double import (
    CORE_V1,
    EVENTS_V1,
    ApiServerDouble,
    api_client_for,
    make_node,
    make_pod,
    now_micro,
    poll_until,
)

pytestmark = pytest.mark.e2e  # every test here starts a server

NODE = "gpu-node-1"
SEL = f"spec.nodeName={NODE}"
EV_PATH = "/apis/events.k8s.io/v1/namespaces/default/events"


@pytest.fixture
def v1(double: ApiServerDouble) -> client.CoreV1Api:
    return client.CoreV1Api(api_client_for(double))


@pytest.fixture
def events(double: ApiServerDouble) -> client.EventsV1Api:
    return client.EventsV1Api(api_client_for(double))


def stream(v1: client.CoreV1Api, **kwargs: Any) -> list[dict[str, Any]]:
    """Every event of one pod watch through the client's Watch helper (ends at timeout_seconds)."""
    return list(watch.Watch().stream(v1.list_pod_for_all_namespaces, **kwargs))


def raw(double: ApiServerDouble, method: str, path: str, body: Any = None, ctype: str = "application/json"):
    """(status, parsed JSON) for a raw request, bypassing client-side model validation."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(double.url + path, data=data, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def node_event(**overrides: Any) -> dict[str, Any]:
    """A valid events.k8s.io/v1 Event about a Node, as a node agent sends it."""
    ev: dict[str, Any] = {
        "apiVersion": EVENTS_V1,
        "kind": "Event",
        "metadata": {"generateName": f"{NODE}."},
        "eventTime": now_micro(),
        "reportingController": "example.com/gpu-exporter",
        "reportingInstance": f"gpu-exporter-{NODE}",
        "action": "Monitor",
        "reason": "XidError",
        "type": "Warning",
        "note": "Xid 79 on GPU 0",
        "regarding": {"kind": "Node", "name": NODE, "uid": NODE, "apiVersion": "v1"},
    }
    ev.update(overrides)
    return ev


# ------------------------------------------------------------------ pods: list and watch


def test_list_filters_by_node_and_returns_typed_objects(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.add_pod(make_pod("a", node=NODE))
    double.add_pod(make_pod("b", node="other-node"))
    double.add_pod(make_pod("c", node=NODE, namespace="ml"))
    pods = v1.list_pod_for_all_namespaces(field_selector=SEL)
    assert sorted(p.metadata.name for p in pods.items) == ["a", "c"]
    assert pods.metadata.resource_version == str(double.resource_version)
    ns_pods = v1.list_namespaced_pod("ml", field_selector=SEL)
    assert [p.metadata.name for p in ns_pods.items] == ["c"]
    assert v1.read_namespaced_pod("a", "default").spec.node_name == NODE


def test_watch_sees_add_modify_delete_in_order(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    rv = v1.list_pod_for_all_namespaces(field_selector=SEL).metadata.resource_version
    double.add_pod(make_pod("p", node=NODE))
    double.mutate_pod("default", "p", lambda pod: pod["status"].update(phase="Succeeded"))
    double.delete_pod("default", "p")
    seen = [
        (e["type"], e["object"].metadata.name, e["object"].status.phase)
        for e in watch.Watch().stream(
            v1.list_pod_for_all_namespaces, field_selector=SEL, resource_version=rv, timeout_seconds=1
        )
    ]
    assert seen == [("ADDED", "p", "Running"), ("MODIFIED", "p", "Succeeded"), ("DELETED", "p", "Succeeded")]


def test_live_watch_receives_changes_made_while_streaming(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    rv = v1.list_pod_for_all_namespaces().metadata.resource_version
    got: list[str] = []

    def consume() -> None:
        w = watch.Watch()
        for e in w.stream(v1.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=5):
            got.append(f"{e['type']}:{e['raw_object']['metadata']['name']}")
            if len(got) == 2:
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    poll_until(lambda: double.active_watches == 1)
    double.add_pod(make_pod("live", node=NODE))
    double.delete_pod("default", "live")
    t.join(5)
    assert got == ["ADDED:live", "DELETED:live"]


def test_pod_moving_out_of_selector_is_a_delete(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.add_pod(make_pod("mover", node=NODE))
    rv = v1.list_pod_for_all_namespaces(field_selector=SEL).metadata.resource_version
    double.mutate_pod("default", "mover", lambda pod: pod["spec"].update(nodeName="elsewhere"))
    seen = [
        e["type"]
        for e in watch.Watch().stream(
            v1.list_pod_for_all_namespaces, field_selector=SEL, resource_version=rv, timeout_seconds=1
        )
    ]
    assert seen == ["DELETED"]


def test_watch_without_resource_version_starts_with_synthetic_adds(
    double: ApiServerDouble, v1: client.CoreV1Api
) -> None:
    double.add_pod(make_pod("existing", node=NODE))
    seen = [e["type"] for e in stream(v1, field_selector=SEL, timeout_seconds=1)]
    assert seen == ["ADDED"]


def test_namespaced_watch_with_watch_1(double: ApiServerDouble) -> None:
    double.add_pod(make_pod("a", namespace="ml"))
    double.add_pod(make_pod("b", namespace="default"))
    url = f"{double.url}/api/v1/namespaces/ml/pods?watch=1&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=5) as resp:
        lines = [json.loads(line) for line in resp.read().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "a")]


def test_watch_from_compacted_resource_version_gets_410(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    rv = v1.list_pod_for_all_namespaces().metadata.resource_version
    double.add_pod(make_pod("p", node=NODE))
    double.compact()
    with pytest.raises(ApiException) as exc:
        stream(v1, resource_version=rv, timeout_seconds=1)
    assert exc.value.status == 410
    # The current resourceVersion is still fine.
    current = v1.list_pod_for_all_namespaces().metadata.resource_version
    assert stream(v1, resource_version=current, timeout_seconds=1) == []


def test_expire_next_watch_sends_error_event_with_status(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.expire_next_watch()
    resp = v1.list_pod_for_all_namespaces(watch=True, resource_version="1", _preload_content=False)
    lines = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    assert len(lines) == 1
    assert lines[0]["type"] == "ERROR"
    assert lines[0]["object"]["kind"] == "Status"
    assert lines[0]["object"]["code"] == 410
    assert lines[0]["object"]["reason"] == "Expired"
    # Only the next one: the following watch streams normally.
    assert stream(v1, resource_version="1", timeout_seconds=1) == []


def test_watch_timeout_seconds_is_honoured_and_ends_with_bookmark(
    double: ApiServerDouble, v1: client.CoreV1Api
) -> None:
    rv = v1.list_pod_for_all_namespaces().metadata.resource_version
    resp = v1.list_pod_for_all_namespaces(
        watch=True, resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=True, _preload_content=False
    )
    # resp.data returned at all: the timeout ended the stream.
    lines = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    assert [e["type"] for e in lines] == ["BOOKMARK"]
    assert lines[0]["object"]["metadata"]["resourceVersion"] == rv


def test_close_watches_and_bookmarks(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    rv = v1.list_pod_for_all_namespaces().metadata.resource_version
    types: list[str] = []

    def consume() -> None:
        w = watch.Watch()
        for e in w.stream(
            v1.list_pod_for_all_namespaces,
            resource_version=rv,
            timeout_seconds=30,
            allow_watch_bookmarks=True,
        ):
            types.append(e["type"])

    t = threading.Thread(target=consume)
    t.start()
    poll_until(lambda: double.active_watches == 1)
    double.send_bookmark()
    poll_until(lambda: types == ["BOOKMARK"])
    double.close_watches()
    t.join(5)
    assert not t.is_alive()


def test_list_resource_version_semantics(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.add_pod(make_pod("first", node=NODE))
    rv_first = str(double.resource_version)
    double.add_pod(make_pod("second", node=NODE))
    exact = v1.list_pod_for_all_namespaces(resource_version=rv_first, resource_version_match="Exact")
    assert [p.metadata.name for p in exact.items] == ["first"]
    assert exact.metadata.resource_version == rv_first
    newer = v1.list_pod_for_all_namespaces(resource_version=rv_first, resource_version_match="NotOlderThan")
    assert len(newer.items) == 2
    with pytest.raises(ApiException) as too_large:
        v1.list_pod_for_all_namespaces(resource_version="999999", resource_version_match="NotOlderThan")
    assert too_large.value.status == 504
    double.compact()
    with pytest.raises(ApiException) as expired:
        v1.list_pod_for_all_namespaces(resource_version=rv_first, resource_version_match="Exact")
    assert expired.value.status == 410
    assert json.loads(expired.value.body)["reason"] == "Expired"


def test_limit_and_continue_give_a_consistent_snapshot(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    for i in range(5):
        double.add_pod(make_pod(f"p{i}", node=NODE))
    page1 = v1.list_pod_for_all_namespaces(limit=2)
    assert [p.metadata.name for p in page1.items] == ["p0", "p1"]
    double.add_pod(make_pod("late", node=NODE))  # not in the snapshot being paged
    names = [p.metadata.name for p in page1.items]
    token = page1.metadata._continue
    while token:
        page = v1.list_pod_for_all_namespaces(limit=2, _continue=token)
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
    assert names == ["p0", "p1", "p2", "p3", "p4"]


@pytest.mark.parametrize(
    ("kwargs", "accepted"),
    [
        ({"field_selector": "spec.nodeName!=x,status.phase=Running"}, True),
        ({"field_selector": "spec.bogus=x"}, False),
        ({"field_selector": "garbage"}, False),
        ({"label_selector": "app=web,tier in (a,b),!canary"}, True),
        ({"label_selector": "app=="}, True),
        ({"label_selector": "a b c"}, False),
        ({"label_selector": "-bad-=x"}, False),
    ],
)
def test_selectors_accepted_or_rejected_like_the_server(
    v1: client.CoreV1Api, kwargs: dict[str, str], accepted: bool
) -> None:
    if accepted:
        v1.list_pod_for_all_namespaces(**kwargs)
        return
    with pytest.raises(ApiException) as exc:
        v1.list_pod_for_all_namespaces(**kwargs)
    assert exc.value.status == 400


def test_label_selector_filters(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.add_pod(make_pod("web", labels={"app": "web", "tier": "a"}))
    double.add_pod(make_pod("db", labels={"app": "db"}))
    double.add_pod(make_pod("canary", labels={"app": "web", "canary": "1"}))

    def names(sel: str) -> list[str]:
        return sorted(p.metadata.name for p in v1.list_pod_for_all_namespaces(label_selector=sel).items)

    assert names("app=web") == ["canary", "web"]
    assert names("app=web,!canary") == ["web"]
    assert names("app notin (web)") == ["db"]
    assert names("tier") == ["web"]


# ------------------------------------------------------------------ nodes, faults, recording


def test_get_node(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.set_nodes([make_node(NODE, labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"})])
    node = v1.read_node(NODE)
    assert node.metadata.labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    with pytest.raises(ApiException) as exc:
        v1.read_node("missing")
    assert exc.value.status == 404
    assert [n.metadata.name for n in v1.list_node().items] == [NODE]


def test_fail_next_requests(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.fail_next(2)
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            v1.list_pod_for_all_namespaces()
        assert exc.value.status == 500
        assert json.loads(exc.value.body)["kind"] == "Status"
    v1.list_pod_for_all_namespaces()
    assert [r.status for r in double.requests] == [500, 500, 200]


def test_offline_and_back(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    double.add_pod(make_pod("p", node=NODE))
    v1.list_pod_for_all_namespaces()  # leaves a kept-alive connection in the client pool
    port = double.port
    with double.offline():
        with pytest.raises(Exception) as exc:  # urllib3 raises several kinds here
            v1.list_pod_for_all_namespaces(_request_timeout=2)
        assert not isinstance(exc.value, ApiException)
    assert double.port == port
    assert [p.metadata.name for p in v1.list_pod_for_all_namespaces().items] == ["p"]


def test_offline_drops_open_watches(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    outcome: list[str] = []

    def consume() -> None:
        try:
            stream(v1, resource_version="1", timeout_seconds=30)
            outcome.append("ended")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    t = threading.Thread(target=consume)
    t.start()
    poll_until(lambda: double.active_watches == 1)
    double.go_offline()
    t.join(5)
    assert not t.is_alive() and outcome
    double.come_back()


def test_requests_are_recorded_and_writes_counted(double: ApiServerDouble, events: client.EventsV1Api) -> None:
    status, _ = raw(double, "POST", EV_PATH, node_event())
    assert status == 201
    events.list_namespaced_event("default")
    assert double.writes == 1
    post = double.requests_to("POST")[0]
    assert post.path == EV_PATH
    assert post.body["reason"] == "XidError"
    assert double.requests[-1].method == "GET"


# ------------------------------------------------------------------ events


def test_event_created_through_the_real_client(double: ApiServerDouble, events: client.EventsV1Api) -> None:
    body = client.EventsV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{NODE}."),
        event_time=dt.datetime.now(dt.UTC),
        reporting_controller="example.com/gpu-exporter",
        reporting_instance=f"gpu-exporter-{NODE}",
        action="Monitor",
        reason="XidError",
        type="Warning",
        note="Xid 79",
        regarding=client.V1ObjectReference(kind="Node", name=NODE, uid=NODE),
    )
    created = events.create_namespaced_event("default", body)
    assert created.metadata.name.startswith(f"{NODE}.") and len(created.metadata.name) == len(NODE) + 6
    assert created.metadata.resource_version
    got = events.read_namespaced_event(created.metadata.name, "default")
    assert got.reason == "XidError"
    assert [e["metadata"]["name"] for e in double.events(EVENTS_V1)] == [created.metadata.name]


def test_core_v1_event_created(double: ApiServerDouble, v1: client.CoreV1Api) -> None:
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="n1.xid"),
        involved_object=client.V1ObjectReference(kind="Node", name=NODE, uid=NODE),
        reason="XidError",
        message="Xid 79",
        type="Warning",
        source=client.V1EventSource(component="gpu-exporter", host=NODE),
    )
    v1.create_namespaced_event("default", body)
    assert [e["reason"] for e in double.events(CORE_V1)] == ["XidError"]
    assert v1.list_namespaced_event("default").items[0].message == "Xid 79"


def test_duplicate_name_is_409(double: ApiServerDouble) -> None:
    ev = node_event(metadata={"name": "fixed"})
    assert raw(double, "POST", EV_PATH, ev)[0] == 201
    status, body = raw(double, "POST", EV_PATH, ev)
    assert status == 409
    assert body["reason"] == "AlreadyExists" and body["details"]["name"] == "fixed"


INVALID_V1 = [
    ("reportingController", {"reportingController": ""}, "FieldValueRequired"),
    ("reportingController", {"reportingController": "not a qualified name!"}, "FieldValueInvalid"),
    ("reportingController", {"reportingController": "x" * 129}, "FieldValueInvalid"),
    ("reportingInstance", {"reportingInstance": ""}, "FieldValueRequired"),
    ("reportingInstance", {"reportingInstance": "i" * 129}, "FieldValueInvalid"),
    ("action", {"action": ""}, "FieldValueRequired"),
    ("action", {"action": "a" * 129}, "FieldValueInvalid"),
    ("reason", {"reason": ""}, "FieldValueRequired"),
    ("reason", {"reason": "r" * 129}, "FieldValueInvalid"),
    ("note", {"note": "n" * 1025}, "FieldValueInvalid"),
    ("type", {"type": "Error"}, "FieldValueNotSupported"),
    ("type", {"type": ""}, "FieldValueNotSupported"),
    ("series.count", {"series": {"count": 1, "lastObservedTime": now_micro()}}, "FieldValueInvalid"),
    ("series.lastObservedTime", {"series": {"count": 2}}, "FieldValueRequired"),
    ("regarding", {"regarding": None}, "FieldValueRequired"),
    ("eventTime", {"eventTime": None}, "FieldValueRequired"),
    ("deprecatedCount", {"deprecatedCount": 3}, "FieldValueInvalid"),
]


@pytest.mark.parametrize(
    ("field", "override", "cause_reason"), INVALID_V1, ids=[f"{f}-{r}" for f, _, r in INVALID_V1]
)
def test_events_v1_validation_rejects_with_422(
    double: ApiServerDouble, field: str, override: dict[str, Any], cause_reason: str
) -> None:
    ev = {k: v for k, v in node_event(**override).items() if v is not None}
    status, body = raw(double, "POST", EV_PATH, ev)
    assert status == 422
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["code"] == 422
    assert body["details"]["group"] == "events.k8s.io"
    assert (field, cause_reason) in [(c["field"], c["reason"]) for c in body["details"]["causes"]]
    assert double.events() == []
    # Exactly the limit is fine.
    if cause_reason == "FieldValueInvalid" and field in ("reportingInstance", "action", "reason", "note"):
        limit = 1024 if field == "note" else 128
        ok = node_event(**{field: "x" * limit})
        assert raw(double, "POST", EV_PATH, ok)[0] == 201


def test_node_event_only_in_default_or_kube_system(double: ApiServerDouble) -> None:
    for ns, expected in (("default", 201), ("kube-system", 201), ("gpu-operator", 422)):
        status, body = raw(double, "POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", node_event())
        assert status == expected, (ns, body)
    assert body["details"]["causes"][0]["field"] == "regarding.namespace"


def test_missing_name_and_generate_name_is_422(double: ApiServerDouble) -> None:
    status, body = raw(double, "POST", EV_PATH, node_event(metadata={}))
    assert status == 422
    assert body["details"]["causes"][0]["field"] == "metadata.name"


def test_namespace_mismatch_is_400(double: ApiServerDouble) -> None:
    ev = node_event(metadata={"name": "x", "namespace": "kube-system"})
    assert raw(double, "POST", EV_PATH, ev)[0] == 400


def test_core_v1_rules_when_event_time_set(double: ApiServerDouble) -> None:
    base = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Node", "name": NODE, "uid": NODE},
        "eventTime": now_micro(),
        "reportingComponent": "example.com/gpu-exporter",
        "reportingInstance": "i",
        "action": "Monitor",
        "reason": "XidError",
        "type": "Warning",
    }
    status, body = raw(double, "POST", "/api/v1/namespaces/default/events", {**base, "action": ""})
    assert status == 422
    assert [c["field"] for c in body["details"]["causes"]] == ["action"]
    assert "group" not in body["details"]
    status, body = raw(double, "POST", "/api/v1/namespaces/default/events", {**base, "reportingComponent": ""})
    assert [c["field"] for c in body["details"]["causes"]] == ["reportingComponent"]
    assert raw(double, "POST", "/api/v1/namespaces/default/events", base)[0] == 201


def test_invalid_through_real_client_surfaces_status(events: client.EventsV1Api) -> None:
    body = client.EventsV1Event(
        metadata=client.V1ObjectMeta(generate_name="x."),
        event_time=dt.datetime.now(dt.UTC),
        reporting_controller="example.com/x",
        reporting_instance="i",
        action="A",
        reason="R" * 200,
        type="Warning",
        regarding=client.V1ObjectReference(kind="Node", name=NODE, uid=NODE),
    )
    with pytest.raises(ApiException) as exc:
        events.create_namespaced_event("default", body)
    assert exc.value.status == 422
    assert json.loads(exc.value.body)["details"]["causes"][0]["field"] == "reason"


@pytest.mark.parametrize(
    "content_type", [None, "application/merge-patch+json", "application/json-patch+json"]
)
def test_patch_series(double: ApiServerDouble, events: client.EventsV1Api, content_type: str | None) -> None:
    status, created = raw(double, "POST", EV_PATH, node_event())
    assert status == 201
    name = created["metadata"]["name"]
    last = now_micro()
    patch: Any = {"series": {"count": 2, "lastObservedTime": last}}
    if content_type == "application/json-patch+json":
        patch = [{"op": "add", "path": "/series", "value": patch["series"]}]
    kwargs = {"_content_type": content_type} if content_type else {}  # None: client default (strategic)
    patched = events.patch_namespaced_event(name, "default", patch, **kwargs)
    assert patched.series.count == 2
    assert int(patched.metadata.resource_version) > int(created["metadata"]["resourceVersion"])
    assert double.events()[0]["series"] == {"count": 2, "lastObservedTime": last}
    expected_type = content_type or "application/strategic-merge-patch+json"
    assert double.requests_to("PATCH")[0].content_type == expected_type


def test_patch_validation(double: ApiServerDouble, events: client.EventsV1Api) -> None:
    _, created = raw(double, "POST", EV_PATH, node_event())
    path = f"/apis/events.k8s.io/v1/namespaces/default/events/{created['metadata']['name']}"
    merge = "application/merge-patch+json"
    status, body = raw(double, "PATCH", path, {"series": {"count": 1, "lastObservedTime": now_micro()}}, merge)
    assert status == 422 and body["details"]["causes"][0]["field"] == "series.count"
    status, body = raw(double, "PATCH", path, {"reason": "Other"}, merge)
    assert status == 422 and body["details"]["causes"][0]["field"] == "reason"
    assert raw(double, "PATCH", path, {"series": {"count": 3}}, "text/plain")[0] == 415
    assert raw(double, "PATCH", path.replace(created["metadata"]["name"], "nope"), {}, merge)[0] == 404
    assert double.events()[0].get("series") is None


def test_delete_event(double: ApiServerDouble, events: client.EventsV1Api) -> None:
    _, created = raw(double, "POST", EV_PATH, node_event())
    events.delete_namespaced_event(created["metadata"]["name"], "default")
    assert double.events() == []


def test_unknown_path_is_404_status(double: ApiServerDouble) -> None:
    status, body = raw(double, "GET", "/api/v1/secrets")
    assert status == 404 and body["kind"] == "Status"
