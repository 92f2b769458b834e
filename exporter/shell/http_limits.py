"""What keeps the HTTP server answering under hostile clients: descriptor limit, connection cap, timeouts.

* :func:`raise_nofile_limit` lifts the soft ``RLIMIT_NOFILE`` (commonly 1024 in containers) to the
  hard limit at start.
* :class:`ConnectionLimiter` caps open connections well under that limit: beyond the cap the oldest
  idle connection is dropped (oldest of all when every one is busy), so idle floods cannot exhaust
  descriptors and a new scrape always gets in.
* :class:`LimitedRequestHandler` is aiohttp's connection protocol plus a header-read timeout, a
  whole-request timeout (a client that never reads its response), and one-line, rate-limited,
  counted reporting of malformed requests instead of aiohttp's traceback per request.
* :func:`loop_exception_handler` does the same for asyncio's ``accept()`` failures (EMFILE...).

aiohttp has no public hook for "is this connection busy?" or for its error reporting, so the handler
overrides ``_handle_request`` and ``handle_error``; tests/test_server_limits.py pins the behaviour.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler

from exporter.shell.http_stats import HttpStats, RateLimitedLog

log = logging.getLogger("kube_gpu_exporter.http")

# asyncio pauses accepting for 1 s after these (selector_events._accept_connection)
ACCEPT_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
NR_OPEN_DEFAULT = 1 << 20  # Linux's default fs.nr_open: the most a soft limit can be when hard is unlimited


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds of the HTTP server; :meth:`fitted` fits the connection cap to the descriptor limit."""

    max_connections: int = 512
    # No complete request header within this many seconds of connecting or of the previous response:
    # closed (aiohttp's keep-alive timer; it is what frees descriptors held by idle floods).
    idle_timeout: float = 15.0
    # From the first byte of a request to its complete header (slowloris).
    header_timeout: float = 5.0
    # Handling plus writing one response (a client that stops reading holds it otherwise forever).
    request_timeout: float = 30.0
    max_line_size: int = 4096  # request line
    max_field_size: int = 8190  # one header line
    max_headers: int = 32
    backlog: int = 128
    lingering_time: float = 2.0  # reading an unwanted request body before closing
    shutdown_timeout: float = 5.0

    def fitted(self, nofile: int) -> ServerLimits:
        """The cap at most half of what the limit leaves after one accept burst (a ``backlog`` of accepts
        arrives before the dropped connections' descriptors are closed); the rest is for the sampler,
        the API clients and the log."""
        cap = max(16, min(self.max_connections, (nofile - self.backlog) // 2))
        return replace(self, max_connections=cap)


def raise_nofile_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit and log the result once; return the soft limit.

    Never raises: a start must not fail over it (the connection cap fits whatever limit is in force).
    """
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError) as e:
        log.warning("cannot read the file descriptor limit: %s", e)
        return 1024
    inf = resource.RLIM_INFINITY
    target = NR_OPEN_DEFAULT if hard == inf else hard
    if soft == inf or soft >= target:
        log.info("file descriptor limit: %s (hard limit %s)", _show(soft), _show(hard))
        return NR_OPEN_DEFAULT if soft == inf else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.warning("file descriptor limit stays %d: cannot raise it to %d: %s", soft, target, e)
        return soft
    log.info("file descriptor limit raised from %d to %d (hard limit %s)", soft, target, _show(hard))
    return target


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


class ConnectionLimiter:
    """Open connections in accept order; beyond ``max_connections`` the oldest idle one is dropped."""

    def __init__(self, max_connections: int, stats: HttpStats, report: RateLimitedLog) -> None:
        self.max_connections = max_connections
        self._stats = stats
        self._report = report
        self._open: dict[LimitedRequestHandler, None] = {}  # dicts keep insertion (= accept) order
        stats.connection_limit = max_connections

    def opened(self, handler: LimitedRequestHandler) -> None:
        self._open[handler] = None
        while len(self._open) > self.max_connections:
            self._drop_one(handler)
        self._stats.open_connections = len(self._open)

    def closed(self, handler: LimitedRequestHandler) -> None:
        self._open.pop(handler, None)
        self._stats.open_connections = len(self._open)

    def dropped(self, handler: LimitedRequestHandler, reason: str, why: str) -> None:
        """``handler`` is being closed by the server for ``reason``: count it, say so (rate-limited)."""
        self.closed(handler)
        self._stats.drop(reason)
        self._report("dropped", f"HTTP connection from {_peer(handler)} dropped: {why}")

    def _drop_one(self, newcomer: LimitedRequestHandler) -> None:
        # The newcomer has sent nothing yet, so it would always look idle: it is never the victim
        # while an older connection exists. All busy (clients that stop reading): the oldest goes.
        victim = next((h for h in self._open if h is not newcomer and not h.busy), None)
        if victim is None:
            victim = next(iter(self._open))
        self.dropped(victim, "limit", f"{self.max_connections} connections open, the oldest idle one goes")
        victim.force_close()


def _peer(handler: RequestHandler) -> str:
    transport = handler.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


def error_reason(status: int, exc: BaseException | None) -> str:
    """The ``reason`` label of a request that ended in ``status`` (bounded set: see http_stats)."""
    if status >= 500 or exc is None:
        return "internal_error" if status >= 500 else "bad_request"
    if isinstance(exc, http_exceptions.LineTooLong) or "Too many headers" in str(exc):
        return "too_large"
    if isinstance(exc, http_exceptions.BadStatusLine | http_exceptions.InvalidURLError):
        return "bad_request_line"
    if isinstance(exc, http_exceptions.InvalidHeader) or "Invalid header" in str(exc):
        return "bad_header"  # (aiohttp's C parser raises the generic class for "Invalid header token")
    return "bad_request"


class LimitedRequestHandler(RequestHandler):
    """aiohttp's HTTP/1.1 connection protocol, registered with a :class:`ConnectionLimiter`."""

    def __init__(self, manager: Any, *, limiter: ConnectionLimiter, stats: HttpStats, report: RateLimitedLog,
                 limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(manager, keepalive_timeout=limits.idle_timeout, max_line_size=limits.max_line_size,
                         max_field_size=limits.max_field_size, max_headers=limits.max_headers,
                         lingering_time=limits.lingering_time, **kwargs)
        self._limiter = limiter
        self._stats = stats
        self._report = report
        self._limits = limits
        self._header_timer: asyncio.TimerHandle | None = None
        self.busy = False  # a request is being handled or its response written

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._limiter.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._limiter.closed(self)
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # The first bytes of a request start its header clock; _handle_request stops it.
        if data and not self.busy and self._header_timer is None and self.transport is not None:
            self._header_timer = self._loop.call_later(self._limits.header_timeout, self._header_timed_out)

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.busy and self.transport is not None:
            self._limiter.dropped(self, "header_timeout",
                                  f"no complete request header within {self._limits.header_timeout:g}s")
            self.force_close()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    async def _handle_request(self, request: web.BaseRequest, start_time: float | None,
                              request_handler: Callable[..., Any]) -> tuple[web.StreamResponse, bool]:
        self.busy = True
        self._cancel_header_timer()
        try:
            async with asyncio.timeout(self._limits.request_timeout):
                return await super()._handle_request(request, start_time, request_handler)
        except TimeoutError:
            self._limiter.dropped(self, "request_timeout",
                                  f"response not taken within {self._limits.request_timeout:g}s")
            self.force_close()
            return web.Response(status=503), True  # True: the connection is gone, aiohttp stops here
        finally:
            self.busy = False

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """Count and report instead of aiohttp's traceback per request: one line a minute for all malformed ones."""
        reason = error_reason(status, exc)
        self._stats.error(reason)
        detail = message or (f"{type(exc).__name__}: {exc}" if exc is not None else "")
        text = f"HTTP {status} for a request from {request.remote or '?'} ({reason}): {detail}"
        if status >= 500:
            # our own bug: worth its traceback, but still once a minute
            if self._report("internal_error", text, logging.ERROR) and exc is not None:
                log.error("traceback of the error above", exc_info=exc)
        else:
            self._report("malformed", text)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started, cannot send the error response")
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        resp = web.Response(status=status, text=f"{status} {phrase}\n")
        resp.force_close()
        return resp


def loop_exception_handler(stats: HttpStats, report: RateLimitedLog
                           ) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An asyncio exception handler: accept() out of descriptors is counted and told in one line."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS:
            name = errno.errorcode[exc.errno]
            stats.error(f"accept_{name.lower()}")
            report("accept", f"cannot accept HTTP connections: {exc.strerror} ({name}); asyncio retries in 1s")
            return
        stats.error("loop_error")
        if report("loop_error", f"event loop error: {context.get('message', '?')}: {exc!r}", logging.ERROR):
            loop.default_exception_handler(context)  # unexpected: its traceback, once a minute

    return handle
