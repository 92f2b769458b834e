"""The HTTP server's defences one by one, in-process on a real socket with small limits.

Connection cap (oldest idle dropped first, busy ones kept), idle/header/request timeouts, accept()
errors and malformed requests counted and logged once, the descriptor limit raised at start.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from exporter.exposition.snapshot import empty_snapshot
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.app import HttpServer, make_app
from exporter.server.limits import ServerLimits, loop_exception_handler, raise_nofile_limit
from exporter.server.stats import HttpStats, RateLimitedLog, one_line
from exporter.server.wire import Request, Response
from tests.integration_support import parse_exposition, value

ROOT = Path(__file__).resolve().parent.parent
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def run_server(limits: ServerLimits, body: Callable[[HttpServer, asyncio.Event], Awaitable[None]]) -> HttpStats:
    """Serve the app (plus /slow, which answers once the test sets an event) and run ``body`` against it."""
    async def main() -> HttpStats:
        holder = SnapshotHolder(empty_snapshot(time.time()))
        stats = HttpStats()
        app = make_app(holder, stale_after=60, stats=stats)
        release = asyncio.Event()

        async def slow(request: Request) -> Response:
            await release.wait()
            return Response.text(200, "slow\n")

        app.add_get("/slow", slow)
        server = HttpServer(app, "127.0.0.1", 0, limits, stats)
        await server.start()
        try:
            await asyncio.wait_for(body(server, release), 20)
        finally:
            release.set()
            await server.close()
        return stats
    return asyncio.run(main())


async def connect(server: HttpServer) -> Streams:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def closed_by_server(streams: Streams, within: float) -> bool:
    """True when the server closes the connection within ``within`` seconds (reads to EOF)."""
    reader, _ = streams
    try:
        async with asyncio.timeout(within):
            while await reader.read(65536):
                pass
        return True
    except TimeoutError:
        return False


async def get(server: HttpServer, path: str = "/metrics") -> bytes:
    reader, writer = await connect(server)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data


async def until(pred: Callable[[], bool], within: float = 5.0) -> None:
    async with asyncio.timeout(within):
        while not pred():
            await asyncio.sleep(0.01)  # polling a condition of the server under test


@pytest.mark.e2e
def test_oldest_idle_connection_is_dropped_first_and_busy_ones_are_kept():
    limits = ServerLimits(max_connections=16)

    async def body(server: HttpServer, release: asyncio.Event) -> None:
        busy = await connect(server)
        busy[1].write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await until(lambda: server.stats.open_connections == 1)
        idle = [await connect(server) for _ in range(15)]
        await until(lambda: server.stats.open_connections == 16)
        assert server.stats.dropped["limit"] == 0
        newcomer = await connect(server)
        # the oldest *idle* one goes; the older busy one stays, and so does the newcomer
        assert await closed_by_server(idle[0], 2)
        assert not await closed_by_server(idle[1], 0.1) and not await closed_by_server(newcomer, 0.1)
        release.set()
        assert (await busy[0].readuntil(b"slow\n")).startswith(b"HTTP/1.1 200 OK")
        # answered, the once busy connection is idle and the oldest: the next newcomer costs it
        assert (await get(server)).startswith(b"HTTP/1.1 200 OK")
        assert await closed_by_server(busy, 2)
        assert not await closed_by_server(idle[1], 0.1)
        assert server.stats.open_connections <= 16

    stats = run_server(limits, body)
    assert stats.dropped["limit"] >= 2
    assert b'kube_gpu_exporter_http_connections_dropped_total{reason="limit"}' in stats.render()


@pytest.mark.e2e
def test_all_busy_drops_the_oldest():
    limits = ServerLimits(max_connections=16)

    async def body(server: HttpServer, release: asyncio.Event) -> None:
        busy = []
        for _ in range(16):
            busy.append(await connect(server))
            busy[-1][1].write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await until(lambda: server.stats.open_connections == 16)
        newcomer = await connect(server)
        assert await closed_by_server(busy[0], 2)
        newcomer[1].write(REQUEST)
        assert (await newcomer[0].readuntil(b"\r\n")).startswith(b"HTTP/1.1 200 OK")

    run_server(limits, body)


@pytest.mark.e2e
def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout():
    limits = ServerLimits(idle_timeout=0.3)

    async def body(server: HttpServer, release: asyncio.Event) -> None:
        silent = await connect(server)
        assert await closed_by_server(silent, 3)
        # the same after a response on a keep-alive connection
        kept = await connect(server)
        kept[1].write(REQUEST)
        await kept[0].readuntil(b"# TYPE kube_gpu_exporter_http_connections_limit gauge\n")
        assert await closed_by_server(kept, 3)

    run_server(limits, body)


@pytest.mark.e2e
def test_slowloris_is_closed_after_the_header_timeout():
    limits = ServerLimits(header_timeout=0.3, idle_timeout=30)

    async def body(server: HttpServer, release: asyncio.Event) -> None:
        reader, writer = await connect(server)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        with pytest.raises((ConnectionError, TimeoutError)):
            async with asyncio.timeout(3):
                while not reader.at_eof():  # one header byte every 50 ms: never a complete header
                    writer.write(b"X")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                raise ConnectionResetError
        assert time.monotonic() - started < 2

    stats = run_server(limits, body)
    assert stats.dropped["header_timeout"] == 1


@pytest.mark.e2e
def test_a_response_nobody_takes_is_dropped_after_the_request_timeout():
    limits = ServerLimits(request_timeout=0.3)

    async def body(server: HttpServer, release: asyncio.Event) -> None:
        stuck = await connect(server)
        stuck[1].write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")  # never answered in time
        assert await closed_by_server(stuck, 3)
        assert (await get(server, "/healthz")).endswith(b"ok\n")

    stats = run_server(limits, body)
    assert stats.dropped["request_timeout"] == 1


@pytest.mark.e2e
def test_malformed_requests_get_400_one_log_line_and_a_count(caplog):
    caplog.set_level(logging.DEBUG)

    async def body(server: HttpServer, release: asyncio.Event) -> None:
        for _ in range(50):
            reader, writer = await connect(server)
            writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.0 400 Bad Request")
            writer.close()

    stats = run_server(ServerLimits(), body)
    assert stats.errors["bad_request"] == 50
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "kube_gpu_exporter"))]
    assert len(records) == 1 and records[0].exc_info is None
    assert "\n" not in records[0].getMessage() and "Missing 'Host' header" in records[0].getMessage()


def test_accept_out_of_descriptors_is_counted_and_logged_in_one_line(caplog):
    stats = HttpStats()
    handler = loop_exception_handler(stats, RateLimitedLog(logging.getLogger("kube_gpu_exporter.http")))
    loop = asyncio.new_event_loop()
    try:
        for _ in range(1000):
            handler(loop, {"message": "socket.accept() out of system resource",
                           "exception": OSError(errno.EMFILE, "Too many open files")})
        handler(loop, {"message": "socket.accept() out of system resource",
                       "exception": OSError(errno.ENFILE, "Too many open files in system")})
    finally:
        loop.close()
    assert stats.errors["accept_emfile"] == 1000 and stats.errors["accept_enfile"] == 1
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None  # one line a minute for all
    assert "EMFILE" in caplog.records[0].getMessage()


# A real EMFILE: a server with a cap above what 64 descriptors allow (as a misfitted cap would be).
EMFILE_SERVER = """
import asyncio, logging, resource, sys, time
from exporter.exposition.snapshot import empty_snapshot
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.limits import ServerLimits
from exporter.server.stats import HttpStats
from exporter.server.app import HttpServer, make_app

async def main():
    stats = HttpStats()
    server = HttpServer(make_app(SnapshotHolder(empty_snapshot(time.time())), 60, stats=stats), "127.0.0.1", 0,
                        ServerLimits(max_connections=1000), stats)
    await server.start()
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(server.port, flush=True)
    await asyncio.sleep(20)
    await server.close()

logging.basicConfig()
asyncio.run(main())
"""


@pytest.mark.e2e
def test_real_emfile_is_survived_counted_and_logged_once(tmp_path: Path):
    script = tmp_path / "emfile_server.py"
    script.write_text(EMFILE_SERVER)
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=out)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]  # more than 64 descriptors
        deadline = time.monotonic() + 5
        while b"EMFILE" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the log file of another process
        for s in socks:
            s.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            samples = parse_exposition(r.read().decode())
        assert value(samples, "kube_gpu_exporter_http_errors_total", reason="accept_emfile") >= 1
    finally:
        proc.terminate()
        proc.wait(10)
    grown = log.read_text()
    assert "Traceback" not in grown and grown.count("EMFILE") == 1, grown[:2000]


def test_rate_limited_log_holds_back_and_then_says_how_many():
    now = [0.0]
    records: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("test_server_limits.rate")
    logger.addHandler(Capture())
    report = RateLimitedLog(logger, every=60, clock=lambda: now[0])
    assert report("a", "first\nline") and not report("a", "again") and report("b", "other topic")
    now[0] = 61
    assert report("a", "later")
    assert records == ["first line", "other topic", "later (and 1 more like it since the last such line)"]
    assert one_line("x" * 1000, 50).endswith("...") and len(one_line("x" * 1000, 50)) == 50
    assert one_line("bad\x00\x1b[31mbytes\u2028\xe9") == "bad\\x00\\x1b[31mbytes \\xe9"


def test_connection_cap_fits_the_descriptor_limit():
    assert ServerLimits().fitted(1024).max_connections == 448
    assert ServerLimits().fitted(4096).max_connections == 512
    assert ServerLimits().fitted(100).max_connections == 16
    assert ServerLimits(max_connections=64).fitted(1 << 20).max_connections == 64


def _in_subprocess(nofile: str, code: str) -> str:
    out = subprocess.run(["prlimit", f"--nofile={nofile}", sys.executable, "-c",
                          "import logging; logging.basicConfig(level='INFO'); " + code],
                         cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout + out.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("nofile,want,said", [
    ("1024:4096", "4096 (4096, 4096)", "raised from 1024 to 4096"),
    ("1024:1024", "1024 (1024, 1024)", "file descriptor limit: 1024 (hard limit 1024)"),
])
def test_raise_nofile_limit(nofile: str, want: str, said: str):
    out = _in_subprocess(nofile, "import resource; from exporter.server.limits import raise_nofile_limit; "
                                 "print(raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE))")
    assert want in out and out.count("file descriptor limit") == 1 and said in out


def test_raise_nofile_limit_never_fails_start(monkeypatch, caplog):
    def refuse(*args):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert raise_nofile_limit() == 256
    assert "stays 256" in caplog.text and "Operation not permitted" in caplog.text
    monkeypatch.setattr(resource, "getrlimit", refuse)
    assert raise_nofile_limit() == 1024
