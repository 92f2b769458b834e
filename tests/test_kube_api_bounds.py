"""The API client's answers are bounded (exporter/node/kube_api.py): a body over max_response_bytes and a
watch event over max_event_bytes are refused in one line after reading no further, and the client goes on."""

from __future__ import annotations

import http.server
import itertools
import json
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.node.kube_api import ApiResponseTooLarge, KubeApi, WatchStream
from tests.k8s_double import ApiServerDouble, make_pod

BIG = {"note": "x" * 20_000}  # one pod of about 22 KB


@pytest.mark.e2e
def test_a_list_over_the_bound_is_refused_and_the_next_request_works() -> None:
    with ApiServerDouble() as double:
        for i in range(5):
            double.add_pod(make_pod(f"p{i}", node="n", annotations=BIG))
        api = KubeApi(double.url, max_response_bytes=64 * 1024)
        with pytest.raises(ApiResponseTooLarge) as exc:
            api.get("/api/v1/pods")  # about 110 KB
        assert "\n" not in str(exc.value) and "65,536 bytes" in str(exc.value)
        page = api.get("/api/v1/pods", {"limit": 2})  # a new connection: the refused body is not read
        assert len(page["items"]) == 2


class _Chunked(http.server.BaseHTTPRequestHandler):
    """An answer without Content-Length (chunked), longer than the bound."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # http.server calls it by this name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = json.dumps({"items": ["y" * 1000] * 200}).encode()
        for i in range(0, len(body), 4096):
            part = body[i:i + 4096]
            self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def chunked_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Chunked)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.e2e
def test_a_chunked_answer_over_the_bound_is_refused(chunked_server: str) -> None:
    with pytest.raises(ApiResponseTooLarge):
        KubeApi(chunked_server, max_response_bytes=50_000).get("/api/v1/pods")
    assert len(KubeApi(chunked_server).get("/api/v1/pods")["items"]) == 200


@pytest.mark.e2e
def test_a_watch_event_over_the_bound_is_refused_one_under_it_read() -> None:
    with ApiServerDouble() as double:
        api = KubeApi(double.url, max_event_bytes=16 * 1024)
        stream = api.watch("/api/v1/pods", {"resourceVersion": str(double.resource_version)},
                           connect_timeout=5, read_timeout=30)
        try:
            events = stream.events()
            double.add_pod(make_pod("small", node="n"))
            assert next(events)["object"]["metadata"]["name"] == "small"
            double.add_pod(make_pod("big", node="n", annotations=BIG))
            with pytest.raises(ApiResponseTooLarge, match="watch event over 16,384 bytes"):
                next(events)
        finally:
            stream.close()


class _Resp:
    """What WatchStream reads: read1() handing out the given chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = iter(chunks)

    def read1(self, n: int) -> bytes:
        return next(self._chunks, b"")


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


_event = st.fixed_dictionaries({"type": st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]),
                                "object": st.dictionaries(st.text(max_size=5), st.text(max_size=40), max_size=4)})


@given(st.lists(_event, max_size=6), st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_events_are_the_same_however_the_stream_is_cut(events: list[dict], cuts: list[int],
                                                       blank_lines: bool) -> None:
    sep = b"\n\n" if blank_lines else b"\n"
    data = b"".join(json.dumps(e).encode() + sep for e in events)
    stream = WatchStream(None, _Resp(_split(data, cuts)))  # type: ignore[arg-type]
    assert list(stream.events()) == events


@given(st.integers(min_value=1, max_value=300), st.lists(st.integers(min_value=0), max_size=12))
def test_an_event_longer_than_the_bound_is_refused_wherever_the_stream_is_cut(bound: int,
                                                                              cuts: list[int]) -> None:
    line = json.dumps({"type": "ADDED", "object": {"k": "v" * bound}}).encode()  # longer than bound
    stream = WatchStream(None, _Resp(_split(line + b"\n", cuts)), max_event_bytes=bound)  # type: ignore[arg-type]
    with pytest.raises(ApiResponseTooLarge):
        list(stream.events())


def test_a_stream_cut_in_the_middle_of_an_event_is_an_error() -> None:
    stream = WatchStream(None, _Resp([b'{"type": "ADDED", "object": {}}\n{"type": "AD']))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="middle of an event"):
        list(stream.events())
