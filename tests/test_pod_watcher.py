"""PodWatcher against the API server double, through the exporter's own client (exporter/node/kube_api.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from exporter.node.kube_api import KubeApi, KubeConfigError, build_api_client
from exporter.node.pod_watcher import PodWatcher, PodWatcherStats, exponential_backoff
from tests.k8s_double import ApiServerDouble, kube_api_for, make_pod, poll_until

NODE = "gpu-node-1"


class RecordingBackoff:
    """Short, deterministic delays; remembers what it was asked."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.calls: list[int] = []

    def __call__(self, failures: int) -> float:
        self.calls.append(failures)
        return self.delay


@pytest.fixture
def backoff() -> RecordingBackoff:
    return RecordingBackoff()


@pytest.fixture
def watcher(double: ApiServerDouble, backoff: RecordingBackoff) -> Iterator[PodWatcher]:
    w = PodWatcher(NODE, kube_api_for(double), watch_timeout_seconds=30, request_timeout=5, backoff=backoff)
    yield w
    w.stop()


def names(w: PodWatcher) -> set[str]:
    return {p.name for p in w.view().pods.values()}


def pod_lists(double: ApiServerDouble) -> list:
    return [r for r in double.requests_to("GET", "/api/v1/pods") if r.query.get("watch") != "true"]


def pod_watches(double: ApiServerDouble) -> list:
    return [r for r in double.requests_to("GET", "/api/v1/pods") if r.query.get("watch") == "true"]


@pytest.mark.e2e
def test_initial_list_only_this_node(double: ApiServerDouble, watcher: PodWatcher) -> None:
    double.add_pod(make_pod("mine", node=NODE))
    double.add_pod(make_pod("theirs", node="other-node"))
    assert watcher.stats() == PodWatcherStats(0, None, False, {})
    before = time.time()
    watcher.start()
    poll_until(lambda: watcher.stats().synced)
    assert names(watcher) == {"mine"}
    stats = watcher.stats()
    assert stats.sync_errors == 0 and stats.last_sync_timestamp >= before
    assert pod_lists(double)[0].query["fieldSelector"] == f"spec.nodeName={NODE}"
    poll_until(lambda: pod_watches(double))
    w = pod_watches(double)[0].query
    assert w["fieldSelector"] == f"spec.nodeName={NODE}"
    assert w["allowWatchBookmarks"] == "true" and w["timeoutSeconds"] == "30"
    assert w["resourceVersion"] == watcher.view().resource_version


@pytest.mark.e2e
def test_add_modify_delete_seen(double: ApiServerDouble, watcher: PodWatcher) -> None:
    watcher.start()
    poll_until(lambda: double.active_watches == 1)
    double.add_pod(make_pod("p", node=NODE, phase="Pending", started=False))
    poll_until(lambda: names(watcher) == {"p"})
    assert watcher.view().by_container_id == {}
    double.update_pod(make_pod("p", node=NODE))
    poll_until(lambda: watcher.view().by_container_id)
    (pod, container), *_ = watcher.view().by_container_id.values()
    assert (pod.name, pod.phase, container.name) == ("p", "Running", "main")
    double.add_pod(make_pod("elsewhere", node="other-node"))
    double.delete_pod("default", "p")
    poll_until(lambda: names(watcher) == set())
    assert len(pod_lists(double)) == 1  # all of it through one watch
    assert watcher.stats().sync_errors == 0


@pytest.mark.e2e
def test_clean_watch_end_resumes_without_relist(double: ApiServerDouble, watcher: PodWatcher) -> None:
    watcher.start()
    poll_until(lambda: double.active_watches == 1)
    double.close_watches()  # as at the server's timeoutSeconds
    poll_until(lambda: len(pod_watches(double)) == 2 and double.active_watches == 1)
    double.add_pod(make_pod("after", node=NODE))
    poll_until(lambda: names(watcher) == {"after"})
    assert len(pod_lists(double)) == 1
    assert watcher.stats().sync_errors == 0


@pytest.mark.e2e
def test_410_relists_and_loses_nothing(double: ApiServerDouble, watcher: PodWatcher) -> None:
    double.add_pod(make_pod("stays", node=NODE))
    double.add_pod(make_pod("goes", node=NODE))
    watcher.start()
    poll_until(lambda: double.active_watches == 1)
    double.expire_next_watch()
    double.close_watches()
    # Changes while the watcher is between watches: the relist must pick them up.
    double.delete_pod("default", "goes")
    double.add_pod(make_pod("new", node=NODE))
    poll_until(lambda: names(watcher) == {"stays", "new"})
    poll_until(lambda: len(pod_lists(double)) == 2)
    stats = watcher.stats()
    assert stats.sync_errors == 0 and stats.synced  # 410 is routine, not an error


@pytest.mark.e2e
def test_410_from_compaction(double: ApiServerDouble, watcher: PodWatcher) -> None:
    watcher.start()
    poll_until(lambda: double.active_watches == 1)
    double.go_offline()  # keep the watcher from resuming while history is compacted
    double.add_pod(make_pod("during", node=NODE))
    double.compact()
    double.come_back()
    poll_until(lambda: names(watcher) == {"during"})
    # Whichever came first (a failed relist, or a watch from the compacted version that got 410),
    # the watcher ended up relisting.
    assert len(pod_lists(double)) >= 2


@pytest.mark.e2e
def test_outage_keeps_last_good_view_and_recovers(
    double: ApiServerDouble, watcher: PodWatcher, backoff: RecordingBackoff
) -> None:
    double.add_pod(make_pod("a", node=NODE))
    double.add_pod(make_pod("b", node=NODE))
    watcher.start()
    poll_until(lambda: names(watcher) == {"a", "b"})
    good_view = watcher.view()
    synced_at = watcher.stats().last_sync_timestamp
    double.go_offline()
    poll_until(lambda: watcher.stats().sync_errors >= 2)
    stats = watcher.stats()
    assert not stats.synced
    assert watcher.view() is good_view  # the last good cache, untouched
    assert stats.last_sync_timestamp == synced_at
    assert backoff.calls[:2] == [1, 2]  # growing backoff while failing
    double.delete_pod("default", "a")
    double.add_pod(make_pod("c", node=NODE))
    double.come_back()
    poll_until(lambda: names(watcher) == {"b", "c"})
    poll_until(lambda: watcher.stats().synced)
    assert watcher.stats().last_sync_timestamp > synced_at


@pytest.mark.e2e
def test_server_errors_counted_then_synced(
    double: ApiServerDouble, watcher: PodWatcher, backoff: RecordingBackoff
) -> None:
    double.add_pod(make_pod("a", node=NODE))
    double.fail_next(3)
    watcher.start()
    poll_until(lambda: watcher.stats().synced)
    assert watcher.stats().sync_errors == 3
    assert backoff.calls == [1, 2, 3]
    assert names(watcher) == {"a"}


@pytest.mark.e2e
def test_malformed_pod_counted_not_crashing(double: ApiServerDouble, watcher: PodWatcher) -> None:
    bad = make_pod("bad", node=NODE)
    bad["spec"]["containers"] = "garbage"
    double.add_pod(bad)
    double.add_pod(make_pod("good", node=NODE))
    watcher.start()
    poll_until(lambda: watcher.stats().synced)
    assert names(watcher) == {"good"}
    assert watcher.stats().skips == {"containers_invalid": 1}
    bad2 = make_pod("bad2", node=NODE)
    bad2["status"]["containerStatuses"][0]["containerID"] = "containerd://short"
    double.add_pod(bad2)
    poll_until(lambda: "bad2" in names(watcher))
    assert watcher.stats().skips == {"containers_invalid": 1, "container_id_invalid": 1}
    double.add_pod(make_pod("later", node=NODE))
    poll_until(lambda: "later" in names(watcher))
    assert watcher.stats().sync_errors == 0


@pytest.mark.e2e
def test_pages_are_followed(double: ApiServerDouble, backoff: RecordingBackoff) -> None:
    for i in range(5):
        double.add_pod(make_pod(f"p{i}", node=NODE))
    w = PodWatcher(NODE, kube_api_for(double), page_size=2, backoff=backoff)
    w.start()
    try:
        poll_until(lambda: w.stats().synced)
        assert names(w) == {f"p{i}" for i in range(5)}
        lists = pod_lists(double)
        assert [r.query["limit"] for r in lists] == ["2", "2", "2"]
        assert "continue" in lists[1].query
    finally:
        w.stop()


@pytest.mark.e2e
def test_stop_is_prompt_during_a_long_watch(double: ApiServerDouble, backoff: RecordingBackoff) -> None:
    w = PodWatcher(NODE, kube_api_for(double), watch_timeout_seconds=600, backoff=backoff)
    w.start()
    poll_until(lambda: double.active_watches == 1)
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 2
    assert w._thread is None
    assert w.stats().sync_errors == 0  # closing the stream is not an error


@pytest.mark.e2e
def test_stop_during_backoff_is_prompt(double: ApiServerDouble) -> None:
    double.go_offline()
    w = PodWatcher(NODE, kube_api_for(double), backoff=lambda n: 60.0)
    w.start()
    poll_until(lambda: w.stats().sync_errors == 1)
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 2


def test_exponential_backoff_grows_and_caps() -> None:
    b = exponential_backoff(initial=1.0, maximum=8.0, jitter=0.0)
    assert [b(n) for n in (1, 2, 3, 4, 5, 100)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    j = exponential_backoff(initial=1.0, maximum=8.0, jitter=0.2)
    assert all(0.8 <= j(1) <= 1.2 for _ in range(50))


# ------------------------------------------------------------------ build_api_client


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def write_kubeconfig(path: Path, server: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.mark.e2e
def test_build_api_client_explicit_url_wins(no_cluster: Path, double: ApiServerDouble) -> None:
    write_kubeconfig(no_cluster / "kc", "http://127.0.0.1:1")
    c = build_api_client(double.url + "/", str(no_cluster / "kc"))
    assert c.host == double.url
    double.add_pod(make_pod("x", node=NODE))
    w = PodWatcher(NODE, c, backoff=RecordingBackoff())
    w.start()
    try:
        poll_until(lambda: names(w) == {"x"})
    finally:
        w.stop()


@pytest.mark.e2e
def test_build_api_client_kubeconfig_path(no_cluster: Path, double: ApiServerDouble) -> None:
    c = build_api_client(None, str(write_kubeconfig(no_cluster / "kc", double.url)))
    assert c.host == double.url
    assert c.authorization() == "Bearer t0ken"


def test_build_api_client_falls_back_to_kubeconfig_env_then_home(
    no_cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_kubeconfig(no_cluster / ".kube" / "config", "https://home.example:6443")
    assert build_api_client(None, None).host == "https://home.example:6443"
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(no_cluster / "env-kc", "https://env.example:6443")))
    assert build_api_client(None, None).host == "https://env.example:6443"


def test_build_api_client_nothing_configured(no_cluster: Path) -> None:
    with pytest.raises(KubeConfigError, match="--kube-api-url"):
        build_api_client(None, None)


@pytest.mark.e2e
def test_a_page_over_the_clients_bound_is_asked_for_again_with_fewer_pods(double: ApiServerDouble) -> None:
    """Pods with huge annotations: a 500-pod page over the bound is asked for with half as many pods until
    one fits; the list still holds every pod and counts no sync error."""
    big = {"note": "x" * 20_000}  # about 22 KB a pod
    for i in range(10):
        double.add_pod(make_pod(f"p{i}", node=NODE, annotations=big))
    api = KubeApi(double.url, max_response_bytes=64 * 1024)  # three such pods fit a page
    w = PodWatcher(NODE, api, watch_timeout_seconds=30, request_timeout=5, backoff=RecordingBackoff())
    try:
        w.start()
        poll_until(lambda: w.stats().synced)
        assert names(w) == {f"p{i}" for i in range(10)} and w.stats().sync_errors == 0
        limits = [int(r.query["limit"]) for r in pod_lists(double)]
        assert limits[:3] == [500, 250, 125] and limits[-1] == 3 and sorted(set(limits), reverse=True) == [
            500, 250, 125, 62, 31, 15, 7, 3]
    finally:
        w.stop()
