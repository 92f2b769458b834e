"""The HTTP/1.1 server (exporter/server/protocol.py, http_wire.py) on a real socket: keep-alive, pipelining, HEAD,
404/405, bodies, requests split over many packets; and the stored gzip member a scrape appends."""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.exposition.snapshot import Snapshot, stored_gzip
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.app import HttpServer, make_app
from exporter.server.limits import ServerLimits
from exporter.server.stats import HttpStats
from exporter.server.wire import BadRequest, content_length

BODY = b"# HELP x test\n# TYPE x gauge\nx 1\n"


def exchange(*chunks: bytes, pause: float = 0.0) -> tuple[bytes, HttpStats]:
    """Send ``chunks`` on one connection (``pause`` between them), read until the server closes or goes quiet."""
    async def main() -> tuple[bytes, HttpStats]:
        holder = SnapshotHolder(Snapshot(BODY, gzip.compress(BODY), time.time()))
        holder.publish(holder.get())
        stats = HttpStats()
        server = HttpServer(make_app(holder, 60, stats=stats), "127.0.0.1", 0, ServerLimits(idle_timeout=1), stats)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            for chunk in chunks:
                writer.write(chunk)
                await writer.drain()
                await asyncio.sleep(pause)
            data = b""
            try:
                async with asyncio.timeout(2):
                    while part := await reader.read(65536):
                        data += part
            except TimeoutError:
                pass
            writer.close()
            return data, stats
        finally:
            await server.close()
    return asyncio.run(main())


def responses(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        n = int(headers.get("content-length", 0))
        out.append((status, headers, data[:n]))
        data = data[n:]
    return out


def get(path: str, *extra: str, method: str = "GET", version: str = "1.1") -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/{version}", "Host: x", *extra, "", ""]).encode()


@pytest.mark.e2e
def test_pipelined_requests_are_answered_in_order_on_one_connection():
    data, _ = exchange(get("/healthz") + get("/metrics") + get("/readyz") + get("/healthz", "Connection: close"))
    answers = responses(data)
    assert [a[0] for a in answers] == ["HTTP/1.1 200 OK"] * 4
    assert answers[0][2] == answers[2][2] == b"ok\n" and answers[1][2].startswith(BODY)
    assert answers[3][1]["connection"] == "close" and "connection" not in answers[0][1]


@pytest.mark.e2e
def test_a_request_split_over_many_packets():
    request = get("/metrics", "Accept-Encoding: gzip")
    data, _ = exchange(*(request[i:i + 3] for i in range(0, len(request), 3)), pause=0.005)
    ((status, headers, body),) = responses(data)
    assert status == "HTTP/1.1 200 OK" and headers["content-encoding"] == "gzip"
    assert gzip.decompress(body).startswith(BODY)


@pytest.mark.e2e
def test_head_404_405_and_http_1_0():
    data, _ = exchange(get("/metrics", method="HEAD") + get("/nope") + get("/metrics", method="POST")
                       + get("/healthz", version="1.0"))
    (head, missing, post, old) = responses(data.replace(b"Content-Length: ", b"X: ", 1))  # HEAD: no body follows
    assert head[0] == "HTTP/1.1 200 OK" and head[1]["x"] != "0"
    assert missing[0] == "HTTP/1.1 404 Not Found" and post[0] == "HTTP/1.1 405 Method Not Allowed"
    assert post[1]["allow"] == "GET,HEAD"
    assert old[2] == b"ok\n" and old[1]["connection"] == "close"  # HTTP/1.0 without keep-alive: closed


@pytest.mark.e2e
def test_an_announced_body_is_read_and_dropped_chunked_ones_refused():
    data, _ = exchange(get("/healthz", "Content-Length: 5") + b"hello" + get("/healthz"))
    assert [r[2] for r in responses(data)] == [b"ok\n", b"ok\n"]
    data, stats = exchange(get("/healthz", "Transfer-Encoding: chunked") + b"5\r\nhello\r\n0\r\n\r\n")
    assert data.startswith(b"HTTP/1.0 400 Bad Request\r\n") and stats.errors["bad_request"] == 1


@pytest.mark.e2e
def test_differing_content_lengths_are_refused_equal_ones_accepted():
    data, stats = exchange(get("/healthz", "Content-Length: 5", "Content-Length: 0") + b"hello" + get("/healthz"))
    assert data.startswith(b"HTTP/1.0 400 Bad Request\r\n") and stats.errors["bad_request"] == 1  # before: 200
    data, _ = exchange(get("/healthz", "Content-Length: 5", "Content-Length: 5") + b"hello" + get("/healthz"))
    assert [r[2] for r in responses(data)] == [b"ok\n", b"ok\n"]


@pytest.mark.parametrize(("fields", "length"), [(["5"], 5), (["5", "5"], 5), (["5, 5"], 5), ([" 0 "], 0)])
def test_content_length_of_one_value(fields: list[str], length: int) -> None:
    assert content_length(fields) == length


@pytest.mark.parametrize("fields", [["5", "0"], ["5, 6"], ["-1"], ["0x5"], ["\u00b2"], ["1" * 30], [""], ["5", ""]])
def test_content_length_refused(fields: list[str]) -> None:
    with pytest.raises(BadRequest, match="Content-Length"):
        content_length(fields)


@pytest.mark.e2e
@pytest.mark.parametrize("request_bytes,reason", [
    (b"\x16\x03\x01\x02\x00", "bad_request_line"),  # TLS to the HTTP port: refused before a line ends
    (b"GET / HTTP/1.1\r\nHost: x\r\nA: b\x01c\r\n\r\n", "bad_header"),
    (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"a" * 9000, "too_large"),  # refused before the head ends
])
def test_malformed_heads(request_bytes: bytes, reason: str):
    data, stats = exchange(request_bytes)
    assert data.startswith(b"HTTP/1.0 400 Bad Request\r\n") and stats.errors[reason] == 1


@given(st.binary(max_size=200_000), st.binary(max_size=100))
def test_stored_gzip_member_decodes_after_a_compressed_one(data: bytes, first: bytes):
    assert gzip.decompress(stored_gzip(data)) == data
    assert gzip.decompress(gzip.compress(first) + stored_gzip(data)) == first + data
    assert zlib.decompress(stored_gzip(data)[10:-8], -15) == data  # plain deflate stored blocks


@pytest.mark.e2e
def test_a_deep_pipeline_is_served_without_recursion():
    data, _ = exchange(get("/healthz") * 3000 + get("/healthz", "Connection: close"))
    assert data.count(b"HTTP/1.1 200 OK") == 3001


@pytest.mark.e2e
def test_a_repeated_head_is_answered_as_parsed_and_a_changed_one_anew():
    """The connection reuses the parse of a head equal to its last one; any change is parsed again."""
    gz, plain = get("/metrics", "Accept-Encoding: gzip"), get("/metrics")
    data, _ = exchange(gz + gz + plain + gz + get("/nope") + get("/nope", "Connection: close"))
    answers = responses(data)
    assert [h.get("content-encoding") for _, h, _ in answers[:4]] == ["gzip", "gzip", None, "gzip"]
    assert [s for s, _, _ in answers[4:]] == ["HTTP/1.1 404 Not Found"] * 2
    assert answers[5][1]["connection"] == "close" and "connection" not in answers[4][1]
    assert gzip.decompress(answers[3][2]).startswith(BODY) and answers[2][2].startswith(BODY)


@given(st.integers(0, 10**9), st.booleans(), st.booleans())
def test_response_heads_from_the_cache_equal_fresh_ones(length: int, close: bool, keep_alive_10: bool):
    from exporter.server.wire import Response, response_head
    resp = Response(200, b"x" * (length % 1000), "text/plain", [("Vary", "Accept-Encoding")])
    connection = "Connection: close\r\n" if close else "Connection: keep-alive\r\n" if keep_alive_10 else ""
    expected = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nVary: Accept-Encoding\r\n"
                f"Content-Length: {length % 1000}\r\n{connection}\r\n").encode()
    assert response_head(resp, close, keep_alive_10) == response_head(resp, close, keep_alive_10) == expected
    assert expected.endswith(b"\r\n\r\n") and expected.count(b"\r\n\r\n") == 1
