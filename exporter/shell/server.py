"""HTTP server: serves the last snapshot. A scrape never touches NVML, /proc or the API."""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from exporter.exposition.snapshot import CONTENT_TYPE, scrape_payload
from exporter.node.sampler import SnapshotHolder

INDEX = b"""<html><head><title>kube-gpu-exporter</title></head><body>
<h1>kube-gpu-exporter</h1><p><a href="/metrics">Metrics</a> &middot; <a href="/healthz">Health</a>
&middot; <a href="/readyz">Ready</a></p></body></html>"""


def make_app(holder: SnapshotHolder, stale_after: float, clock: Callable[[], float] = time.time
             ) -> web.Application:
    """The aiohttp application; ``stale_after`` seconds without a new snapshot fails /healthz."""

    async def metrics(request: web.Request) -> web.Response:
        snapshot = holder.get()
        gz = "gzip" in request.headers.get("Accept-Encoding", "")
        body = scrape_payload(snapshot, clock(), gz)
        headers = {"Content-Type": CONTENT_TYPE}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        age = clock() - holder.get().built_at
        if holder.ready and age > stale_after:
            # A hung NVML call stops the sampler; failing liveness lets the kubelet restart us.
            return web.Response(status=503, text=f"snapshot is {age:.1f}s old\n")
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if not holder.ready:
            return web.Response(status=503, text="no snapshot yet\n")
        return web.Response(text="ok\n")

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=INDEX, content_type="text/html")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", index)
    return app
