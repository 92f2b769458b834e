#!/usr/bin/env python3
"""Scrape load and the bare server it is compared with (subprocesses of bench/footprint.py).

    python bench/footprint_load.py client HOST PORT PATH SCRAPERS REQUESTS GZIP   # prints JSON
    python bench/footprint_load.py bare PORT BODY GZIP_BODY                     # serves until killed

``client``: SCRAPERS concurrent asyncio connections (kept alive, as Prometheus keeps them; a
server that closes after each answer is reconnected, the connect counted in the latency), each
sending REQUESTS sequential GETs, request to last byte; the first two per scraper are warm-up.
``bare``: the least an asyncio server does to hand out the same bytes: asyncio streams, the
request head read and dropped, one fixed answer (the gzip body when the request asks for gzip).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

WARMUP = 2


async def _answer(reader: asyncio.StreamReader) -> tuple[bool, int]:
    """Read one response; (server keeps the connection, body bytes)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    keep = lines[0].startswith("HTTP/1.1") and headers.get("connection", "").lower() != "close"
    if "content-length" in headers:
        return keep, len(await reader.readexactly(int(headers["content-length"])))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        size = 0
        while True:
            n = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            size += len(await reader.readexactly(n + 2)) - 2
            if n == 0:
                return keep, size
    return False, len(await reader.read())


async def _scraper(host: str, port: int, request: bytes, n: int, out: list[float], sizes: list[int]) -> None:
    reader = writer = None
    for i in range(n):
        start = time.perf_counter()
        if writer is None:
            reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        keep, size = await _answer(reader)
        if i >= WARMUP:
            out.append(time.perf_counter() - start)
            sizes.append(size)
        if not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def client(host: str, port: int, path: str, scrapers: int, requests: int, gzip: bool) -> dict:
    encoding = b"Accept-Encoding: gzip\r\n" if gzip else b""
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kge-footprint\r\n".encode()
               + encoding + b"Accept: text/plain\r\n\r\n")
    latencies: list[float] = []
    sizes: list[int] = []
    started = time.perf_counter()
    await asyncio.gather(*(_scraper(host, port, request, requests, latencies, sizes) for _ in range(scrapers)))
    return {"latencies": latencies, "bytes": sorted(sizes)[len(sizes) // 2], "wall_s": time.perf_counter() - started}


async def bare(port: int, body: bytes, body_gzip: bytes) -> None:
    def response(data: bytes, gz: bool) -> bytes:
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"Vary: Accept-Encoding\r\n{'Content-Encoding: gzip' + chr(13) + chr(10) if gz else ''}"
                f"Content-Length: {len(data)}\r\n\r\n")
        return head.encode() + data

    plain, gzipped = response(body, False), response(body_gzip, True)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(gzipped if b"gzip" in head.lower() else plain)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    if argv[0] == "client":
        host, port, path, scrapers, requests, gz = argv[1:7]
        print(json.dumps(asyncio.run(client(host, int(port), path, int(scrapers), int(requests), gz == "1"))))
        return 0
    port, body, body_gzip = argv[1:4]
    asyncio.run(bare(int(port), Path(body).read_bytes(), Path(body_gzip).read_bytes()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
