"""HTTP server: serves the last snapshot. A scrape never touches NVML, /proc or the API.

:func:`make_app` is the aiohttp application (the routes); :class:`HttpServer` puts it on a listening
socket with the defences of :mod:`exporter.shell.http_limits` (connection cap, timeouts, one-line
error reporting) and :func:`run` serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Callable

from aiohttp import web

from exporter.exposition.snapshot import CONTENT_TYPE, scrape_payload
from exporter.node.sampler import SnapshotHolder
from exporter.shell.encoding import wants_gzip
from exporter.shell.http_limits import (
    ConnectionLimiter,
    LimitedRequestHandler,
    ServerLimits,
    log,
    loop_exception_handler,
)
from exporter.shell.http_stats import HttpStats, RateLimitedLog
from exporter.shell.web_config import BasicAuth, TlsReloader, WebConfig


def make_app(holder: SnapshotHolder, stale_after: float, clock: Callable[[], float] = time.time,
             stats: HttpStats | None = None, monotonic: Callable[[], float] = time.monotonic,
             not_ready: Callable[[], str | None] | None = None) -> web.Application:
    """The aiohttp application.

    /healthz fails once the sampler has finished no cycle (good or bad) for ``stale_after`` seconds;
    /readyz fails before the first snapshot and while ``not_ready`` gives a reason (NVML down);
    ``stats`` are the server's own counters, appended to each scrape; ``/`` and ``/status.json`` serve
    the snapshot's status tree (docs/status.md) as HTML and JSON.
    """

    async def metrics(request: web.Request) -> web.Response:
        snapshot = holder.get()
        gz = wants_gzip(request.headers.getall("Accept-Encoding", None))
        body = scrape_payload(snapshot, clock(), gz, stats.render() if stats is not None else b"")
        # Vary: a cache between Prometheus and us must not hand gzip to a client that refused it.
        headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        ended = holder.last_cycle_end
        if ended is not None and (since := monotonic() - ended) > stale_after:
            # A hung NVML call stops the sampler; failing liveness lets the kubelet restart us.
            # Cycles that fail are no reason: the sampler runs, and its failures show in the metrics.
            return web.Response(status=503, text=f"sampler stuck: last cycle ended {since:.1f}s ago "
                                                 f"(limit {stale_after:g}s)\n")
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if not holder.ready:
            return web.Response(status=503, text="no snapshot yet\n")
        if not_ready is not None and (reason := not_ready()):
            return web.Response(status=503, text=f"{reason}\n")
        return web.Response(text="ok\n")

    from exporter.exposition.status import status_json, status_view
    from exporter.exposition.status_html import render_html
    from exporter.xid.parse import lookup

    def xid_catalog(code: int) -> dict[str, str]:
        info = lookup(code)
        return {"meaning": info.meaning, "action": info.action, "severity": info.severity}

    def view() -> dict:
        # The cycle's pre-built status tree: a request only adds the age and serialises it.
        snapshot = holder.get()
        return status_view(snapshot.status, snapshot.body, clock(), holder.ready, xid_catalog)

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=render_html(view()), content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    async def status(request: web.Request) -> web.Response:
        return web.Response(body=status_json(view()), content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/status.json", status)
    app.router.add_get("/", index)
    return app


class HttpServer:
    """``app`` listening on ``host:port`` through :class:`LimitedRequestHandler` connections.

    ``web_config`` (``--web-config-file``): TLS with certificates re-read when they change, and basic authentication
    on every path (exporter/shell/web_config.py).
    """

    def __init__(self, app: web.Application, host: str, port: int, limits: ServerLimits,
                 stats: HttpStats, access_log: logging.Logger | None = None,
                 web_config: WebConfig | None = None) -> None:
        self.app, self.host, self.requested_port = app, host, port
        self.limits, self.stats, self.access_log = limits, stats, access_log
        wc = web_config
        self.tls = TlsReloader(wc.tls, wc.context) if wc is not None and wc.tls is not None else None
        self.auth = BasicAuth(wc.users) if wc is not None and wc.users else None
        self.report = RateLimitedLog(log)
        self.limiter = ConnectionLimiter(limits.max_connections, stats, self.report)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(loop_exception_handler(self.stats, self.report))
        if self.auth is not None:
            self.app.middlewares.append(self.auth.middleware)  # before setup freezes the app
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=None,
                                     shutdown_timeout=self.limits.shutdown_timeout)
        await self._runner.setup()
        # Our own protocol factory instead of web.TCPSite: each connection is a LimitedRequestHandler;
        # the runner's Server stays its manager (request dispatch, graceful shutdown).
        factory = functools.partial(LimitedRequestHandler, self._runner.server, loop=loop, limiter=self.limiter,
                                    stats=self.stats, report=self.report, limits=self.limits,
                                    access_log=self.access_log)
        # TLS: a handshake must complete within the header timeout (the limiter counts connections only after it).
        tls = {} if self.tls is None else {"ssl": self.tls.server_context(),
                                           "ssl_handshake_timeout": self.limits.header_timeout}
        self._server = await loop.create_server(factory, self.host or None, self.requested_port,
                                                backlog=self.limits.backlog, reuse_address=True, **tls)

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()  # closes idle connections, waits a little for busy ones


class BindError(Exception):
    """The server could not listen on its address (``error`` is the OSError of the bind)."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        super().__init__(f"cannot listen on {host}:{port}: {error}")
        self.host, self.port, self.error = host, port, error


async def serve(server: HttpServer, on_started: Callable[[], None] | None = None) -> None:
    """Start ``server``, call ``on_started`` once it listens, serve until SIGTERM or SIGINT.

    Raises :class:`BindError` when it cannot listen.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except OSError as e:
        await server.close()
        raise BindError(server.host, server.requested_port, e) from e
    try:
        if on_started is not None:
            on_started()
        await stop.wait()
    finally:
        await server.close()


def run(server: HttpServer, on_started: Callable[[], None] | None = None) -> None:
    """Serve on a new event loop until SIGTERM or SIGINT (see :func:`serve`)."""
    asyncio.run(serve(server, on_started))
