"""HTTP/1.1 on an asyncio protocol: what a metrics endpoint needs, and the defences it needs, nothing else.

One :class:`HttpConnection` per connection. It reads a request head (request line and header fields,
no body is ever wanted: one announced by ``Content-Length`` is read and dropped, chunked ones are
refused), answers it with a :class:`Response` from the application, keeps the connection alive as
HTTP/1.1 says (``Connection: close``, HTTP/1.0), and closes it on its timers:

* idle: no request begun within ``idle_timeout`` of connecting or of the previous answer;
* header: a request begun but its head not complete within ``header_timeout`` (slowloris);
* request: the answer not handed over completely within ``request_timeout`` of the head (a client
  that does not read, a handler that hangs).

A malformed request gets ``400`` (``HTTP/1.0``, as aiohttp and Go answer it) and the connection is
closed; the reason (a bounded set: see http_stats) is counted and reported through the caller's
``on_error``. Handlers that answer at once (every route of the exporter but basic authentication)
run inline, without a task: a scrape costs a parse, a dictionary lookup and one ``write``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from exporter.server.wire import (
    BadRequest,
    Handler,
    Request,
    Response,
    content_length,
    head_problem,
    parse_head,
    response_head,
)

MAX_BODY = 1 << 20  # an unwanted body this large closes the connection instead of being read


class ConnectionHooks(Protocol):
    """What a connection tells the server: the limiter's bookkeeping, errors, the access log."""

    def opened(self, conn: HttpConnection) -> None: ...

    def closed(self, conn: HttpConnection) -> None: ...

    def dropped(self, conn: HttpConnection, reason: str, why: str) -> None: ...

    def bad_request(self, conn: HttpConnection, error: BadRequest) -> None: ...

    def internal_error(self, conn: HttpConnection, request: Request, exc: BaseException) -> None: ...

    def answered(self, conn: HttpConnection, request: Request, status: int, size: int) -> None: ...


JOIN_BELOW = 64 * 1024  # a smaller answer goes out in one write; a larger one part by part, uncopied


class HttpConnection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, route: Callable[[Request], Handler], limits: Any, hooks: ConnectionHooks,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._route, self._limits, self._hooks, self._loop = route, limits, hooks, loop
        self.transport: asyncio.Transport | None = None
        self.remote = "?"
        self._buf = b""
        self._discard = 0  # body bytes still to drop
        self.busy = False  # a request is being handled or its answer written
        self._close_after = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""
        self._task: asyncio.Task | None = None
        self._closing = False
        self._unsent = False  # part of the answer waits in the transport's buffer
        self._deadline = 0.0  # of the timer's current kind (see _arm)
        self._last: tuple[bytes, Request] | None = None  # the last head and what it parsed to

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        transport.set_write_buffer_limits(high=0)  # pause_writing while anything is unsent: we know when it left
        self._hooks.opened(self)
        self._arm("idle", self._limits.idle_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closing = True
        self._disarm()
        if self._task is not None:
            self._task.cancel()
        self._hooks.closed(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._discard:
            n = min(self._discard, len(data))
            self._discard -= n
            data = data[n:]
        self._buf += data
        if self.busy or not self._buf:
            if len(self._buf) > 2 * self._limits.max_field_size * self._limits.max_headers and self.transport:
                self.transport.pause_reading()  # pipelined requests pile up: read them when it is their turn
            return
        self._next_request()

    def pause_writing(self) -> None:
        self._unsent = True

    def resume_writing(self) -> None:
        self._unsent = False
        if self.busy and self._task is None:
            self._done()

    # ------------------------------------------------------------------ requests

    def _next_request(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            problem = head_problem(self._buf, self._limits)
            if problem is not None:
                self._refuse(problem)
            elif self._timer_kind != "header":
                self._arm("header", self._limits.header_timeout)  # the first bytes start the header clock
            return
        head, self._buf = self._buf[:end], self._buf[end + 4:]
        try:
            if self._last is not None and self._last[0] == head:
                request = self._last[1]  # a scraper sends the same head every time: parsed once per connection
            else:
                request = parse_head(head, self._limits, self.remote)
                self._last = (head, request)
            self._body(request)
        except BadRequest as e:
            self._refuse(e)
            return
        self.busy = True
        self._arm("request", self._limits.request_timeout)
        connection = (request.header("connection") or "").lower()
        self._close_after = "close" in connection or (request.version < (1, 1) and "keep-alive" not in connection)
        try:
            result = self._route(request)(request)
        except Exception as e:
            self._failed(request, e)
            return
        if isinstance(result, Response):
            self._send(request, result)
        else:
            self._task = self._loop.create_task(self._await(request, result))

    def _body(self, request: Request) -> None:
        if request.header("transfer-encoding") is not None:
            raise BadRequest("bad_request", "request bodies with Transfer-Encoding are not accepted")
        fields = request.header_values("content-length")
        if fields is None:
            return
        n = content_length(fields)
        if n > MAX_BODY:
            raise BadRequest("too_large", f"request body of {n} bytes")
        dropped = min(n, len(self._buf))
        self._buf = self._buf[dropped:]
        self._discard = n - dropped

    async def _await(self, request: Request, result: Awaitable[Response]) -> None:
        try:
            resp = await result
        except asyncio.CancelledError:
            return
        except Exception as e:
            self._task = None
            self._failed(request, e)
            return
        self._task = None
        self._send(request, resp)

    def _failed(self, request: Request, exc: BaseException) -> None:
        self._hooks.internal_error(self, request, exc)
        self._close_after = True
        self._send(request, Response.text(500, "500 Internal Server Error\n"))

    def _send(self, request: Request, resp: Response) -> None:
        if self.transport is None or self._closing:
            return
        head = response_head(resp, self._close_after, request.version < (1, 1))
        size = resp.length
        if request.method == "HEAD":
            self.transport.write(head)
        elif size < JOIN_BELOW:
            self.transport.write(b"".join((head, resp.body, *resp.more)))
        else:
            for part in (head, resp.body, *resp.more):
                self.transport.write(part)
        self._hooks.answered(self, request, resp.status, size)
        if not self._unsent:
            self._done()

    def _done(self) -> None:
        """The answer has left: close, or wait for the next request (maybe already here)."""
        self.busy = False
        if self._close_after:
            self._close()
            return
        self._arm("idle", self._limits.idle_timeout)
        if self.transport is not None:
            self.transport.resume_reading()
        if self._buf:  # pipelined: the next one on the next turn of the loop (no recursion, others get theirs)
            self._loop.call_soon(self._pipelined)

    def _pipelined(self) -> None:
        if not self._closing and not self.busy and self._buf:
            self._next_request()

    def _refuse(self, error: BadRequest) -> None:
        self._hooks.bad_request(self, error)
        if self.transport is not None:
            body = b"400 Bad Request\n"
            self.transport.write(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        self._close()

    # ------------------------------------------------------------------ timers and closing

    def _arm(self, kind: str, seconds: float) -> None:
        """One timer per connection: a later deadline only moves ``_deadline`` (checked when the timer
        fires), an earlier one sets the timer anew; so a kept-alive scrape costs no timer of its own."""
        self._timer_kind, self._deadline = kind, self._loop.time() + seconds
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._deadline, self._fire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_kind = None, ""

    def _fire(self) -> None:
        self._timer = None
        if not self._timer_kind:
            return
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._fire)
            return
        self._expired(self._timer_kind)

    def _expired(self, kind: str) -> None:
        self._timer, self._timer_kind = None, ""
        if kind == "header":
            self._hooks.dropped(self, "header_timeout",
                                f"no complete request header within {self._limits.header_timeout:g}s")
        elif kind == "request":
            self._hooks.dropped(self, "request_timeout",
                                f"response not taken within {self._limits.request_timeout:g}s")
        self.force_close()

    def _close(self) -> None:
        self._closing = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()  # after what is buffered has been written

    def force_close(self) -> None:
        """Close at once, whatever is unsent (the limiter's victims, expired timers, shutdown)."""
        self._closing = True
        self._disarm()
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def close_idle(self) -> bool:
        """Close if idle (shutdown); True when it was."""
        if self.busy:
            return False
        self._close()
        return True
