"""What keeps the HTTP server answering under hostile clients: descriptor limit, connection cap, timeouts.

* :func:`raise_nofile_limit` lifts the soft ``RLIMIT_NOFILE`` (commonly 1024 in containers) to the
  hard limit at start.
* :class:`ConnectionLimiter` caps open connections well under that limit: beyond the cap the oldest
  idle connection is dropped (oldest of all when every one is busy), so idle floods cannot exhaust
  descriptors and a new scrape always gets in.
* :class:`ServerHooks` is what each connection (:class:`~exporter.server.protocol.HttpConnection`,
  which keeps the idle, header and request timers) reports to: the limiter, and one-line,
  rate-limited, counted reporting of malformed requests and of our own errors, never a traceback
  per request.
* :func:`loop_exception_handler` does the same for asyncio's ``accept()`` failures (EMFILE...).

tests/test_server_limits.py pins the behaviour.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from exporter.server.protocol import HttpConnection
from exporter.server.stats import HttpStats, RateLimitedLog
from exporter.server.wire import BadRequest, Request

log = logging.getLogger("kube_gpu_exporter.http")

# asyncio pauses accepting for 1 s after these (selector_events._accept_connection)
ACCEPT_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
NR_OPEN_DEFAULT = 1 << 20  # Linux's default fs.nr_open: the most a soft limit can be when hard is unlimited


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds of the HTTP server; :meth:`fitted` fits the connection cap to the descriptor limit."""

    max_connections: int = 512
    # No request begun within this many seconds of connecting or of the previous response: closed
    # (the keep-alive timer; it is what frees descriptors held by idle floods).
    idle_timeout: float = 15.0
    # From the first byte of a request to its complete header (slowloris).
    header_timeout: float = 5.0
    # Handling plus writing one response (a client that stops reading holds it otherwise forever).
    request_timeout: float = 30.0
    max_line_size: int = 4096  # request line
    max_field_size: int = 8190  # one header line
    max_headers: int = 32
    backlog: int = 128
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
        self._open: dict[HttpConnection, None] = {}  # dicts keep insertion (= accept) order
        stats.connection_limit = max_connections

    def opened(self, conn: HttpConnection) -> None:
        self._open[conn] = None
        while len(self._open) > self.max_connections:
            self._drop_one(conn)
        self._stats.open_connections = len(self._open)

    def closed(self, conn: HttpConnection) -> None:
        self._open.pop(conn, None)
        self._stats.open_connections = len(self._open)

    def dropped(self, conn: HttpConnection, reason: str, why: str) -> None:
        """``conn`` is being closed by the server for ``reason``: count it, say so (rate-limited)."""
        self.closed(conn)
        self._stats.drop(reason)
        self._report("dropped", f"HTTP connection from {conn.remote} dropped: {why}")

    def connections(self) -> list[HttpConnection]:
        return list(self._open)

    def _drop_one(self, newcomer: HttpConnection) -> None:
        # The newcomer has sent nothing yet, so it would always look idle: it is never the victim
        # while an older connection exists. All busy (clients that stop reading): the oldest goes.
        victim = next((c for c in self._open if c is not newcomer and not c.busy), None)
        if victim is None:
            victim = next(iter(self._open))
        self.dropped(victim, "limit", f"{self.max_connections} connections open, the oldest idle one goes")
        victim.force_close()


class ServerHooks:
    """Where connections report: the limiter, the error counters, the rate-limited log, the access log."""

    def __init__(self, limiter: ConnectionLimiter, stats: HttpStats, report: RateLimitedLog,
                 access_log: logging.Logger | None = None) -> None:
        self.limiter, self._stats, self._report, self._access_log = limiter, stats, report, access_log
        self.opened, self.closed, self.dropped = limiter.opened, limiter.closed, limiter.dropped

    def bad_request(self, conn: HttpConnection, error: BadRequest) -> None:
        """Counted, and one line a minute for all malformed requests (never a traceback)."""
        self._stats.error(error.reason)
        self._report("malformed", f"HTTP 400 for a request from {conn.remote} ({error.reason}): {error}")

    def internal_error(self, conn: HttpConnection, request: Request, exc: BaseException) -> None:
        """Our own bug: worth its traceback, but still once a minute."""
        self._stats.error("internal_error")
        text = f"HTTP 500 for a request from {conn.remote} (internal_error): {type(exc).__name__}: {exc}"
        if self._report("internal_error", text, logging.ERROR):
            log.error("traceback of the error above", exc_info=exc)

    def answered(self, conn: HttpConnection, request: Request, status: int, size: int) -> None:
        if self._access_log is not None:
            self._access_log.debug('%s "%s %s HTTP/%d.%d" %d %d', conn.remote, request.method,
                                   request.target[:200], *request.version, status, size)


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
