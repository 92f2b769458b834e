"""HTTP server: serves the last snapshot. A scrape never touches NVML, /proc or the API.

:func:`make_app` is the application (the routes); :class:`HttpServer` puts it on a listening socket,
one :class:`~exporter.server.protocol.HttpConnection` per connection, with the defences of
:mod:`exporter.server.limits` (connection cap, timeouts, one-line error reporting), and
:func:`run` serves until SIGTERM/SIGINT. No web framework: a scrape is a parse, a lookup and one
write, on an event loop that does nothing else (the sampler has its own thread).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import time
from collections.abc import Awaitable, Callable

from exporter.exposition.snapshot import CONTENT_TYPE, scrape_parts
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.auth import BasicAuth
from exporter.server.encoding import wants_gzip
from exporter.server.limits import ConnectionLimiter, ServerHooks, ServerLimits, log, loop_exception_handler
from exporter.server.protocol import HttpConnection
from exporter.server.stats import HttpStats, RateLimitedLog
from exporter.server.tls_accept import TlsAccept, handshake_reason
from exporter.server.web_config import TlsReloader, WebConfig
from exporter.server.wire import Handler, Request, Response

NO_STORE = [("Cache-Control", "no-store")]


class App:
    """Routes by path, GET and HEAD only; an optional check before every route (basic authentication)."""

    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.check: Callable[[Request], Awaitable[Response | None]] | None = None

    def add_get(self, path: str, handler: Handler) -> None:
        """``handler(request)`` returns a :class:`Response`, or an awaitable of one."""
        self.routes[path] = handler

    def handler(self, request: Request) -> Handler:
        route = self.routes.get(request.path, _not_found)
        if route is not _not_found and request.method not in ("GET", "HEAD"):
            route = _not_allowed
        if self.check is not None:  # every path, unknown ones included, as node_exporter
            return lambda r: self._checked(route, r)
        return route

    async def _checked(self, route: Handler, request: Request) -> Response:
        assert self.check is not None
        refused = await self.check(request)
        if refused is not None:
            return refused
        result = route(request)
        return await result if inspect.isawaitable(result) else result


def _not_found(request: Request) -> Response:
    return Response.text(404, "404: Not Found")


def _not_allowed(request: Request) -> Response:
    return Response.text(405, "405: Method Not Allowed", headers=[("Allow", "GET,HEAD")])


def make_app(holder: SnapshotHolder, stale_after: float, clock: Callable[[], float] = time.time,
             stats: HttpStats | None = None, monotonic: Callable[[], float] = time.monotonic,
             not_ready: Callable[[], str | None] | None = None,
             starting: Callable[[], str | None] | None = None) -> App:
    """The application.

    /healthz fails once the sampler has finished no cycle (good or bad) for ``stale_after`` seconds;
    /readyz fails before the first snapshot (saying ``starting``'s reason, NVML initialising, when it has
    one) and while ``not_ready`` gives a reason (NVML down);
    ``stats`` are the server's own counters, appended to each scrape; ``/`` and ``/status.json`` serve
    the snapshot's status tree (docs/status.md) as HTML and JSON.
    """
    # Vary: a cache between Prometheus and us must not hand gzip to a client that refused it.
    plain = [("Vary", "Accept-Encoding")]
    zipped = [("Vary", "Accept-Encoding"), ("Content-Encoding", "gzip")]

    def metrics(request: Request) -> Response:
        snapshot = holder.get()
        gz = wants_gzip(request.header_values("accept-encoding"))
        body, tail = scrape_parts(snapshot, clock(), gz, stats.render() if stats is not None else b"")
        return Response(200, body, CONTENT_TYPE, zipped if gz else plain, (tail,))

    def healthz(request: Request) -> Response:
        ended = holder.last_cycle_end
        if ended is not None and (since := monotonic() - ended) > stale_after:
            # A hung NVML call stops the sampler; failing liveness lets the kubelet restart us.
            # Cycles that fail are no reason: the sampler runs, and its failures show in the metrics.
            return Response.text(503, f"sampler stuck: last cycle ended {since:.1f}s ago (limit {stale_after:g}s)\n")
        return Response.text(200, "ok\n")

    def readyz(request: Request) -> Response:
        if not holder.ready:
            return Response.text(503, f"{(starting() if starting is not None else None) or 'no snapshot yet'}\n")
        if not_ready is not None and (reason := not_ready()):
            return Response.text(503, f"{reason}\n")
        return Response.text(200, "ok\n")

    from exporter.exposition.status import status_json, status_view
    from exporter.exposition.status_html import render_html
    from exporter.exposition.status_page import page_parts
    from exporter.xid.parse import catalog_entry

    def page(request: Request, html: bool) -> Response:
        snapshot = holder.get()
        ctype = "text/html; charset=utf-8" if html else "application/json"
        stored = snapshot.page
        if stored is not None and stored.renders(snapshot.status, snapshot.sample_failures_total):
            # rendered by the cycle: a request fills in the age, whatever the node's pods
            gz = wants_gzip(request.header_values("accept-encoding"))
            parts = page_parts(stored, clock(), html, gz)
            return Response(200, parts[0], ctype, NO_STORE + (zipped if gz else plain), parts[1:])
        # before the first cycle (a tree of constant size), or a snapshot made without its page (tests)
        view = status_view(snapshot.status, snapshot.sample_failures_total, clock(), holder.ready, catalog_entry)
        return Response(200, render_html(view) if html else status_json(view), ctype, NO_STORE)

    def index(request: Request) -> Response:
        return page(request, True)

    def status(request: Request) -> Response:
        return page(request, False)

    app = App()
    for path, handler in (("/metrics", metrics), ("/healthz", healthz), ("/readyz", readyz),
                          ("/status.json", status), ("/", index)):
        app.add_get(path, handler)
    return app


class HttpServer:
    """``app`` listening on ``host:port``, one :class:`HttpConnection` per connection.

    ``web_config`` (``--web-config-file``): TLS with certificates re-read when they change, and basic authentication
    on every path (exporter/server/web_config.py).
    """

    def __init__(self, app: App, host: str, port: int, limits: ServerLimits,
                 stats: HttpStats, access_log: logging.Logger | None = None,
                 web_config: WebConfig | None = None) -> None:
        self.app, self.host, self.requested_port = app, host, port
        self.limits, self.stats, self.access_log = limits, stats, access_log
        wc = web_config
        self.tls = TlsReloader(wc.tls, wc.context) if wc is not None and wc.tls is not None else None
        self.auth = BasicAuth(wc.users) if wc is not None and wc.users else None
        if self.auth is not None:
            stats.auth = self.auth.results  # the same dict: counted where checked
        self.report = RateLimitedLog(log)
        self.limiter = ConnectionLimiter(limits.max_connections, stats, self.report)
        self.hooks = ServerHooks(self.limiter, stats, self.report, access_log)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(loop_exception_handler(self.stats, self.report))
        if self.auth is not None:
            self.app.check = self.auth.check

        def factory() -> HttpConnection:
            return HttpConnection(self.app.handler, self.limits, self.hooks, loop)

        accept: Callable[[], asyncio.Protocol] = factory
        if self.tls is not None:  # a handshake must complete within the header timeout (the limiter counts
            context = self.tls.server_context()  # connections only after it); a failed one is told

            def accept() -> asyncio.Protocol:
                return TlsAccept(factory, context, self.limits.header_timeout, self._handshake_failed, loop)

        self._server = await loop.create_server(accept, self.host or None, self.requested_port,
                                                backlog=self.limits.backlog, reuse_address=True)

    def _handshake_failed(self, remote: str, exc: BaseException) -> None:
        """Counted (``http_errors_total{reason="tls_handshake"}``) and one line a minute at most."""
        self.stats.error("tls_handshake")
        self.report("tls_handshake", f"TLS handshake with {remote} failed: {handshake_reason(exc)}")

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening, close idle connections, give busy ones a little time, then cut them."""
        if self._server is not None:
            self._server.close()
        busy = [c for c in self.limiter.connections() if not c.close_idle()]
        deadline = time.monotonic() + self.limits.shutdown_timeout
        while any(c.busy and c.transport is not None for c in busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the busy ones finish their answers
        for c in self.limiter.connections():
            c.force_close()
        await asyncio.sleep(0)  # their connection_lost callbacks


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
