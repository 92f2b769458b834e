"""Pure event decisions: series, the token bucket, event bodies; and the writer against the double."""

from __future__ import annotations

import itertools
import json
import re
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.xid.events import (
    NODE_EVENT_NAMESPACES,
    REGARDING,
    REGARDING_POD,
    CreateEvent,
    EventPlanner,
    PatchSeries,
    PlannerConfig,
    PodRef,
    TokenBucket,
    XidOccurrence,
    build_event,
    build_note,
    event_name,
    series_key,
)
from exporter.xid.events_writer import EventsWriter
from exporter.xid.parse import XidReport
from tests.k8s_double import ApiServerDouble, kube_api_for, poll_until
from tests.k8s_double.events_validation import EVENTS_V1, validate_create

NODE = "gpu-node-1"
POD = PodRef("team-a", "trainer-0", "main", "3f0c1c9e-5b7a-4c1e-9a57-2f1e0e9b1f00")


def occ(
    xid: int = 79, uuid: str = "GPU-aaa", pod: PodRef | None = POD, t: float = 1000.0, **kw: object
) -> XidOccurrence:
    rep = XidReport(xid, "0000:3b:00", pid=1234 if pod else None, process_name="python" if pod else None,
                    message="GPU has fallen off the bus.", **kw)
    return XidOccurrence(NODE, rep, uuid, 0, pod, t, 1006, 1843308145)


def wire(body: object) -> dict:
    """The JSON the client sends."""
    return json.loads(json.dumps(body))


# ---------------------------------------------------------------- bodies


def test_event_body_passes_server_validation_and_has_fields() -> None:
    body = wire(build_event(occ(), "n.xid79.t.1", first_seen=1700000000.0))
    assert validate_create(body, EVENTS_V1, "default") == []
    assert body["type"] == "Warning" and body["reason"] == "NvidiaXid79" and body["action"] == "GPUError"
    assert body["reportingController"] == "kube-gpu-exporter.io/xid-watcher"
    assert body["reportingInstance"] == f"kube-gpu-exporter-{NODE}"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
    assert body["related"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "trainer-0",
                               "uid": POD.uid, "fieldPath": "spec.containers{main}"}
    assert body["eventTime"] == "2023-11-14T22:13:20.000000+00:00"  # microseconds even when zero
    assert "series" not in body
    assert "GPU has fallen off the bus" in body["note"] and "reboot the node" in body["note"]


def test_event_without_pod_has_no_related() -> None:
    body = wire(build_event(occ(pod=None), "n.x", first_seen=1.5))
    assert "related" not in body and validate_create(body, EVENTS_V1, "default") == []


def test_series_body_valid() -> None:
    body = wire(build_event(occ(), "n.x", first_seen=1.0, series=(7, 9.0)))
    assert body["series"] == {"count": 7, "lastObservedTime": "1970-01-01T00:00:09.000000+00:00"}
    assert validate_create(body, EVENTS_V1, "default") == []


def test_note_truncated_on_a_character_boundary() -> None:
    rep = XidReport(31, "0000:3b:00", pid=1, message="\u00e9" * 2000)
    long = XidOccurrence(NODE, rep, "GPU-a", 0, None, 1.0)
    note = build_note(long)
    assert len(note.encode()) <= 1024 and note.endswith("\u2026")
    assert note.startswith("Xid 31 (GPU memory page fault")


def test_note_mentions_mig_recovery_and_numberless() -> None:
    rep = XidReport(154, "0000:3b:00", gpu_instance=1, compute_instance=2,
                    recovery_action="Node Reboot Required")
    note = build_note(XidOccurrence(NODE, rep, "", None, None, 1.0))
    assert "MIG GPU-I 1 GPU-CI 2" in note and "Node Reboot Required" in note and "(unknown GPU)" in note
    note = build_note(XidOccurrence(NODE, XidReport(79, None, numbered=False), "", None, None, 1.0))
    assert "without an Xid number" in note and "PCI unknown" in note


_DNS_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@given(st.lists(_DNS_LABEL, min_size=1, max_size=8).map(".".join).filter(lambda n: len(n) <= 253),
       st.integers(0, 10**6), st.integers(0, 2**40))
def test_event_name_is_a_dns_subdomain(node: str, xid: int, serial: int) -> None:
    """Any valid node name, however long, gives a valid Event name."""
    name = event_name(node, xid, "a1b2c3d4", serial)
    assert len(name) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(name)


def test_series_key_separates_gpu_xid_and_pod() -> None:
    keys = {series_key(o) for o in (occ(), occ(xid=31), occ(uuid="GPU-b"), occ(pod=None))}
    assert len(keys) == 4
    assert series_key(occ(t=1)) == series_key(occ(t=2))


# ---------------------------------------------------------------- token bucket


def test_token_bucket_burst_then_rate() -> None:
    bucket = TokenBucket.full(rate=0.5, burst=3, now=0.0)
    got = []
    for _ in range(5):
        bucket, ok = bucket.take(0.0)
        got.append(ok)
    assert got == [True, True, True, False, False]
    bucket, ok = bucket.take(1.0)
    assert not ok  # half a token
    bucket, ok = bucket.take(2.0)
    assert ok


def test_token_bucket_clock_stepping_back_mints_nothing() -> None:
    bucket = TokenBucket.full(rate=1, burst=1, now=100.0)
    bucket, ok = bucket.take(100.0)
    assert ok
    bucket, ok = bucket.take(50.0)
    assert not ok
    bucket, ok = bucket.take(100.5)
    assert not ok  # time is measured from the latest reading, not the stepped-back one


@given(st.lists(st.floats(0, 1000, allow_nan=False), max_size=200), st.floats(0.01, 10), st.integers(1, 30))
def test_token_bucket_never_exceeds_burst_plus_rate(times: list[float], rate: float, burst: int) -> None:
    bucket = TokenBucket.full(rate, burst, 0.0)
    granted, latest = 0, 0.0
    for t in times:
        bucket, ok = bucket.take(t)
        granted += ok
        latest = max(latest, t)
    assert granted <= burst + rate * latest + 1e-9


# ---------------------------------------------------------------- planner


def test_repeats_become_one_event_with_a_patched_series() -> None:
    cfg = PlannerConfig(window_seconds=300, patch_interval_seconds=10, rate=1, burst=5)
    planner = EventPlanner("tok", 1000.0, cfg)
    (create,) = planner.observe(occ(t=1000), 1000.0)
    assert isinstance(create, CreateEvent) and "series" not in create.body
    assert planner.observe(occ(), 1001.0) == []  # within the patch interval: folded in
    assert planner.observe(occ(), 1002.0) == []
    (patch,) = planner.tick(1010.0)
    assert isinstance(patch, PatchSeries) and patch.name == create.name
    assert patch.patch["series"]["count"] == 3
    assert patch.patch["series"]["lastObservedTime"] == "1970-01-01T00:16:42.000000Z"
    assert patch.recreate["series"]["count"] == 3
    assert planner.tick(1030.0) == []  # nothing new
    (patch2,) = planner.observe(occ(), 1040.0)  # interval passed: patched at once
    assert patch2.patch["series"]["count"] == 4


def test_after_the_window_a_new_event_starts() -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(window_seconds=60, rate=1, burst=5))
    (first,) = planner.observe(occ(), 0.0)
    (second,) = planner.observe(occ(), 61.0)
    assert isinstance(second, CreateEvent) and second.name != first.name
    assert planner.open_series == 1


def test_window_end_flushes_unsent_count() -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(window_seconds=60, patch_interval_seconds=100, rate=1,
                                                     burst=5))
    planner.observe(occ(), 0.0)
    planner.observe(occ(), 1.0)
    (patch,) = planner.tick(62.0)
    assert isinstance(patch, PatchSeries) and patch.patch["series"]["count"] == 2
    assert planner.open_series == 0


def test_rate_limit_drops_creates_and_defers_patches() -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(rate=0.0, burst=2, patch_interval_seconds=0))
    writes = []
    for xid in (13, 31, 43, 45):
        writes += planner.observe(occ(xid=xid), 0.0)
    assert [type(w) for w in writes] == [CreateEvent, CreateEvent]
    assert planner.rate_limited == 2
    assert planner.observe(occ(xid=13), 1.0) == []  # a patch is due but no token: deferred, not dropped
    assert planner.rate_limited == 2
    assert planner.flush(2.0) == []  # shutdown with no tokens: the unsent count is dropped
    assert planner.rate_limited == 3


def test_max_series_evicts_least_recent() -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(rate=100, burst=100, max_series=2))
    planner.observe(occ(xid=1), 0.0)
    planner.observe(occ(xid=2), 1.0)
    planner.observe(occ(xid=1), 2.0)  # xid 1 is now the most recent, and has an unsent repeat
    writes = planner.observe(occ(xid=3), 3.0)
    assert planner.open_series == 2
    assert [type(w) for w in writes] == [CreateEvent]  # xid 2 evicted: nothing unsent, so no write


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 5, allow_nan=False)), max_size=300))
def test_planner_writes_bounded_and_counts_consistent(steps: list[tuple[int, float]]) -> None:
    cfg = PlannerConfig(rate=0.5, burst=3, window_seconds=20, patch_interval_seconds=2)
    planner = EventPlanner("tok", 0.0, cfg)
    now, writes, created = 0.0, 0, set()
    for xid, dt in steps:
        now += dt
        for w in planner.observe(occ(xid=xid), now) + planner.tick(now):
            writes += 1
            if isinstance(w, CreateEvent):
                assert w.name not in created
                created.add(w.name)
            else:
                assert w.name in created and w.patch["series"]["count"] >= 2
    assert writes <= cfg.burst + cfg.rate * now + 1e-9


# ---------------------------------------------------------------- writer against the API server double


def make_writer(double: ApiServerDouble, **kw) -> EventsWriter:
    return EventsWriter(kube_api_for(double), backoff_base=0.01, backoff_max=0.05, **kw)


@pytest.mark.e2e
def test_writer_creates_and_patches(double: ApiServerDouble) -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(patch_interval_seconds=5, rate=10, burst=10))
    writer = make_writer(double)
    try:
        for w in planner.observe(occ(), 0.0) + planner.observe(occ(), 1.0) + planner.tick(6.0):
            assert writer.submit(w)
        poll_until(lambda: writer.counts().patched == 1)
        (event,) = double.events(EVENTS_V1)
        assert event["series"]["count"] == 2 and event["reason"] == "NvidiaXid79"
        patch_req = double.requests_to("PATCH")[0]
        assert patch_req.content_type.startswith("application/merge-patch+json")
        assert writer.counts().posted == 1 and writer.counts().failed == 0
    finally:
        writer.close()


@pytest.mark.e2e
def test_writer_retries_server_errors_with_backoff(double: ApiServerDouble) -> None:
    planner = EventPlanner("tok", 0.0)
    writer = make_writer(double)
    try:
        double.fail_next(2, status=503)
        (create,) = planner.observe(occ(), 0.0)
        writer.submit(create)
        poll_until(lambda: writer.counts().posted == 1)
        assert len(double.requests_to("POST")) == 3
        assert writer.counts().retries == 2
    finally:
        writer.close()


@pytest.mark.e2e
def test_writer_does_not_retry_invalid_and_counts_failure(double: ApiServerDouble) -> None:
    (create,) = EventPlanner("tok", 0.0).observe(occ(), 0.0)
    bad = CreateEvent(create.name, {**create.body, "reason": "x" * 200})
    writer = make_writer(double)
    try:
        writer.submit(bad)
        poll_until(lambda: writer.counts().failed == 1)
        assert len(double.requests_to("POST")) == 1 and double.events() == []
    finally:
        writer.close()


@pytest.mark.e2e
def test_writer_recreates_a_vanished_event_on_patch(double: ApiServerDouble) -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(patch_interval_seconds=0, rate=10, burst=10))
    planner.observe(occ(), 0.0)  # its create is never sent: the object does not exist
    (patch,) = planner.observe(occ(), 1.0)
    writer = make_writer(double)
    try:
        writer.submit(patch)
        poll_until(lambda: writer.counts().posted == 1)
        (event,) = double.events(EVENTS_V1)
        assert event["series"]["count"] == 2 and event["metadata"]["name"] == patch.name
    finally:
        writer.close()


@pytest.mark.e2e
def test_writer_never_blocks_and_counts_queue_drops(double: ApiServerDouble) -> None:
    gate = threading.Event()

    class SlowApi:
        def create_event(self, *a, **kw):
            gate.wait(5)

    writer = EventsWriter(SlowApi(), max_queue=3)  # type: ignore[arg-type]
    try:
        names = (f"n.{i}" for i in itertools.count())
        body = build_event(occ(), "n", first_seen=0.0)
        results = [writer.submit(CreateEvent(next(names), body)) for _ in range(10)]
        assert results.count(False) >= 6 and writer.counts().dropped == results.count(False)
    finally:
        gate.set()
        writer.close()


@pytest.mark.e2e
def test_writer_start_stop(double: ApiServerDouble) -> None:
    writer = EventsWriter(kube_api_for(double))
    writer.start()
    writer.start()
    (create,) = EventPlanner("tok", 0.0).observe(occ(), 0.0)
    assert writer.submit(create)
    poll_until(lambda: writer.counts().posted == 1)
    writer.stop()
    assert not writer.submit(create) and writer.counts().dropped == 1  # closed: refused, counted


@pytest.mark.e2e
def test_writer_survives_an_unreachable_server(double: ApiServerDouble) -> None:
    writer = make_writer(double, max_attempts=3)
    try:
        (create,) = EventPlanner("tok", 0.0).observe(occ(), 0.0)
        with double.offline():
            writer.submit(create)
            poll_until(lambda: writer.counts().failed == 1)
        (create2,) = EventPlanner("tok2", 0.0).observe(occ(), 0.0)
        writer.submit(create2)
        poll_until(lambda: writer.counts().posted == 1)
    finally:
        writer.close()


# ---------------------------------------------------------------- where the Events go (--xid-events-*)


@pytest.mark.parametrize("namespace", NODE_EVENT_NAMESPACES)
def test_node_events_go_to_either_namespace_the_server_accepts(namespace: str) -> None:
    body = wire(build_event(occ(), "n.x", first_seen=1.0, namespace=namespace))
    assert body["metadata"]["namespace"] == namespace and body["regarding"]["kind"] == "Node"
    assert validate_create(body, EVENTS_V1, namespace) == []


def test_a_node_event_elsewhere_is_what_the_server_refuses() -> None:
    """Why the flag takes only those two: the same body in a tenant namespace is refused."""
    body = wire(build_event(occ(), "n.x", first_seen=1.0, namespace="team-a"))
    assert validate_create(body, EVENTS_V1, "team-a")


def test_regarding_pod_is_an_event_about_the_pod_in_its_namespace() -> None:
    body = wire(build_event(occ(), "n.x", first_seen=1.0, namespace="kube-system", regarding=REGARDING_POD))
    assert body["metadata"]["namespace"] == POD.namespace
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "trainer-0",
                                 "uid": POD.uid, "fieldPath": "spec.containers{main}"}
    assert body["related"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
    assert validate_create(body, EVENTS_V1, POD.namespace) == []


def test_regarding_pod_without_a_pod_is_the_nodes_event() -> None:
    body = wire(build_event(occ(pod=None), "n.x", first_seen=1.0, namespace="kube-system", regarding=REGARDING_POD))
    assert body["metadata"]["namespace"] == "kube-system" and body["regarding"]["kind"] == "Node"
    assert "related" not in body and validate_create(body, EVENTS_V1, "kube-system") == []


@pytest.mark.parametrize("regarding", REGARDING)
def test_the_planner_keeps_the_choice_on_creates_and_recreates(regarding: str) -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(patch_interval_seconds=1, namespace="kube-system",
                                                     regarding=regarding))
    (create,) = planner.observe(occ(), 0.0)
    planner.observe(occ(), 0.5)
    (patch,) = planner.tick(2.0)
    assert isinstance(create, CreateEvent) and isinstance(patch, PatchSeries)
    want = POD.namespace if regarding == REGARDING_POD else "kube-system"
    assert create.body["metadata"]["namespace"] == patch.recreate["metadata"]["namespace"] == want


@pytest.mark.e2e
def test_writer_posts_and_patches_each_event_in_its_own_namespace(double: ApiServerDouble) -> None:
    planner = EventPlanner("tok", 0.0, PlannerConfig(patch_interval_seconds=1, rate=10, burst=10,
                                                     namespace="kube-system", regarding=REGARDING_POD))
    writer = make_writer(double)
    try:
        writes = planner.observe(occ(), 0.0) + planner.observe(occ(pod=None), 0.0) + planner.observe(occ(), 0.5)
        for w in writes + planner.tick(2.0):
            assert writer.submit(w)
        poll_until(lambda: writer.counts().patched == 1 and writer.counts().posted == 2)
        assert writer.counts().failed == 0
        posts = {r.path for r in double.requests_to("POST")}
        assert posts == {"/apis/events.k8s.io/v1/namespaces/team-a/events",
                         "/apis/events.k8s.io/v1/namespaces/kube-system/events"}
        (patch,) = double.requests_to("PATCH")
        assert patch.path.startswith("/apis/events.k8s.io/v1/namespaces/team-a/events/")
    finally:
        writer.close()
