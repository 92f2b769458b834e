"""exporter/node/kube_api.py: in-cluster configuration (token rotation, the service-account CA over
real TLS), errors, kept-alive connections the server closed, against the API double and a small
HTTPS server."""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.node.kube_api import ApiException, KubeApi, build_api_client, in_cluster
from tests.k8s_double import ApiServerDouble, kube_api_for, make_node, make_pod
from tests.test_web_config import make_ca, make_cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_cert(d, "server", "ca", "serverAuth")  # SANs localhost and 127.0.0.1
    return d


def service_account(d: Path, pki: Path, token: str = "tok-1") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "token").write_text(token + "\n")
    (d / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    return d


def rotate(path: Path, text: str) -> None:
    """As the kubelet does: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


@pytest.fixture
def https_api(pki: Path) -> Iterator[tuple[int, list[str]]]:
    """An HTTPS server answering every GET with a Node; records the Authorization headers it got."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps(make_node("n1", labels={"a": "b"})).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


@pytest.mark.e2e
def test_not_in_a_cluster_without_the_environment_or_the_files(tmp_path: Path, pki: Path) -> None:
    sa = service_account(tmp_path / "sa", pki)
    assert in_cluster(sa, {}) is None
    assert in_cluster(tmp_path / "none", {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}) \
        is None
    api = in_cluster(sa, {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert api is not None and api.host == "https://[fd00::1]:6443"


@pytest.mark.e2e
def test_in_cluster_verifies_the_ca_and_follows_token_rotation(tmp_path: Path, pki: Path,
                                                               https_api: tuple[int, list[str]]) -> None:
    port, seen = https_api
    sa = service_account(tmp_path / "sa", pki)
    api = in_cluster(sa, {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)})
    assert api is not None
    assert api.get("/api/v1/nodes/n1")["metadata"]["labels"]["a"] == "b"
    rotate(sa / "token", "tok-2\n")
    api.get("/api/v1/nodes/n1")
    assert seen == ["Bearer tok-1", "Bearer tok-2"]


@pytest.mark.e2e
def test_a_server_outside_the_service_account_ca_is_refused(tmp_path: Path, pki: Path,
                                                            https_api: tuple[int, list[str]]) -> None:
    port, seen = https_api
    other = tmp_path / "other"
    other.mkdir()
    make_ca(other, "ca")
    sa = service_account(tmp_path / "sa", other)
    api = in_cluster(sa, {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)})
    with pytest.raises(ssl.SSLCertVerificationError):
        api.get("/api/v1/nodes/n1")
    assert seen == []  # the token never left


@pytest.mark.e2e
def test_the_token_goes_only_over_https(tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr("exporter.node.kube_api.SERVICE_ACCOUNT", service_account(tmp_path / "sa", pki))
    assert build_api_client("http://127.0.0.1:8001", None).authorization() is None
    assert build_api_client("https://api.example:6443", None).authorization() == "Bearer tok-1"
    assert build_api_client(None, None).host == "https://10.0.0.1:443"


@pytest.mark.e2e
def test_errors_carry_the_status_and_the_servers_message() -> None:
    with ApiServerDouble() as double, pytest.raises(ApiException) as missing:
        kube_api_for(double).get("/api/v1/nodes/nope")
    assert missing.value.status == 404 and "not found" in str(missing.value)


@pytest.mark.e2e
def test_a_kept_alive_connection_the_server_closed_is_replaced() -> None:
    with ApiServerDouble() as double:
        double.add_pod(make_pod("p", node="n"))
        api = kube_api_for(double)
        assert len(api.get("/api/v1/pods")["items"]) == 1
        double.go_offline()  # drops every connection, ours included
        double.come_back()
        assert len(api.get("/api/v1/pods")["items"]) == 1
        assert [r.status for r in double.requests_to("GET", "/api/v1/pods")] == [200, 200]


@pytest.mark.e2e
def test_a_watch_a_silent_peer_never_answers_fails_at_the_connect_timeout() -> None:
    """A peer that accepts and sends nothing (a load balancer without backends): the watch fails at
    connect_timeout, not at read_timeout (330 s by default), so the pod watcher relists on time."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        api = KubeApi(f"http://127.0.0.1:{listener.getsockname()[1]}")
        outcome: list[BaseException] = []

        def start() -> None:
            try:
                api.watch("/api/v1/pods", {}, connect_timeout=0.2, read_timeout=300)
            except BaseException as exc:  # the test inspects it
                outcome.append(exc)

        t = threading.Thread(target=start, daemon=True)
        t.start()
        t.join(30)  # at read_timeout it would still be waiting
        assert not t.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError)


@pytest.mark.e2e
def test_an_idle_watch_outlives_the_connect_timeout() -> None:
    """The connect timeout stops applying once the headers are in: a quiet stream reads on."""
    with ApiServerDouble() as double:
        stream = kube_api_for(double).watch("/api/v1/pods", {"resourceVersion": str(double.resource_version)},
                                            connect_timeout=0.2, read_timeout=30)
        try:
            events = stream.events()
            time.sleep(0.6)  # quiet for three connect timeouts: the time passing is what is tested
            double.add_pod(make_pod("late", node="n"))
            event = next(events)
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "late")
        finally:
            stream.close()


@pytest.mark.e2e
def test_query_values_are_sent_as_the_kubernetes_client_sends_them() -> None:
    with ApiServerDouble() as double:
        api = kube_api_for(double)
        api.get("/api/v1/pods", {"fieldSelector": "spec.nodeName=n", "limit": 5, "continue": None})
        stream = api.watch("/api/v1/pods", {"allowWatchBookmarks": True, "timeoutSeconds": 1})
        list(stream.events())
        stream.close()
        first, second = double.requests_to("GET", "/api/v1/pods")
    assert first.query == {"fieldSelector": "spec.nodeName=n", "limit": "5"}
    assert second.query == {"allowWatchBookmarks": "true", "timeoutSeconds": "1", "watch": "true"}


def test_a_bad_url_is_a_configuration_error() -> None:
    from exporter.node.kube_api import KubeConfigError

    with pytest.raises(KubeConfigError, match="not an http"):
        KubeApi("ftp://x")
