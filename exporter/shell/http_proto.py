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
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e\x80-\xff]+) HTTP/(\d)\.(\d)")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # every control character but HTAB
_FIELDS = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*")
_FIELD = re.compile(rb"\r\n([^:]+):([^\r]*)")
_METHOD_PREFIX = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]*( [\x21-\x7e\x80-\xff]*( H?T?T?P?/?\d?\.?\d?\r?)?)?")
MAX_BODY = 1 << 20  # an unwanted body this large closes the connection instead of being read


@dataclass(slots=True)
class Request:
    method: str
    target: str  # path and query, as sent
    version: tuple[int, int]
    headers: tuple[tuple[str, str], ...]  # (lower-case name, value), in order
    remote: str
    _first: dict[str, str] = field(default_factory=dict, repr=False)  # the first value of each name

    def __post_init__(self) -> None:
        for k, v in reversed(self.headers):
            self._first[k] = v

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def header(self, name: str) -> str | None:
        """The first field named ``name`` (lower case), or None."""
        return self._first.get(name)

    def header_values(self, name: str) -> list[str] | None:
        """Every field named ``name`` (lower case), or None when there is none."""
        values = [v for k, v in self.headers if k == name]
        return values or None


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str | None = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    more: tuple[bytes, ...] = ()  # further parts of the body, sent after ``body`` without joining them

    @property
    def length(self) -> int:
        return len(self.body) + sum(len(p) for p in self.more)

    @classmethod
    def text(cls, status: int, text: str, **kw: Any) -> Response:
        return cls(status, text.encode(), **kw)


Handler = Callable[[Request], "Response | Awaitable[Response]"]


class BadRequest(Exception):
    """A request the server refuses to read (``reason``: the label of ``http_errors_total``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ConnectionHooks(Protocol):
    """What a connection tells the server: the limiter's bookkeeping, errors, the access log."""

    def opened(self, conn: HttpConnection) -> None: ...

    def closed(self, conn: HttpConnection) -> None: ...

    def dropped(self, conn: HttpConnection, reason: str, why: str) -> None: ...

    def bad_request(self, conn: HttpConnection, error: BadRequest) -> None: ...

    def internal_error(self, conn: HttpConnection, request: Request, exc: BaseException) -> None: ...

    def answered(self, conn: HttpConnection, request: Request, status: int, size: int) -> None: ...


def parse_head(head: bytes, limits: Any, remote: str) -> Request:
    """A request head (without the blank line that ends it) -> :class:`Request`, or :class:`BadRequest`."""
    end = head.find(b"\r\n")
    line, block = (head, b"") if end < 0 else (head[:end], head[end:])  # block: "\r\nName: value" repeated
    if len(line) > limits.max_line_size:
        raise BadRequest("too_large", f"request line longer than {limits.max_line_size} bytes")
    m = _REQUEST_LINE.fullmatch(line)
    if m is None or m.group(3) != b"1":
        raise BadRequest("bad_request_line", f"bad request line {line[:80]!r}")
    if len(block) <= limits.max_field_size and block.count(b"\r\n") <= limits.max_headers and _FIELDS.fullmatch(block):
        pairs = _FIELD.findall(block)  # well-formed, within the limits: one pass of each regex
    else:
        pairs = _checked_fields(block.split(b"\r\n")[1:], limits)  # says what is wrong
    headers = tuple((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")) for name, value in pairs)
    version = (1, int(m.group(4)))
    request = Request(m.group(1).decode("ascii"), m.group(2).decode("latin-1"), version, headers, remote)
    if version >= (1, 1) and request.header("host") is None:
        raise BadRequest("bad_request", "Missing 'Host' header")
    return request


def _checked_fields(lines: list[bytes], limits: Any) -> list[tuple[bytes, bytes]]:
    """Header fields one by one; raises :class:`BadRequest` naming the first problem."""
    if len(lines) > limits.max_headers:
        raise BadRequest("too_large", f"more than {limits.max_headers} header fields")
    pairs = []
    for raw in lines:
        if len(raw) > limits.max_field_size:
            raise BadRequest("too_large", f"header field longer than {limits.max_field_size} bytes")
        name, colon, value = raw.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest("bad_header", f"invalid header field {raw[:40]!r}")
        if bad := _CTL.search(value):
            raise BadRequest("bad_header", f"control character {bad.group()!r} in header field {name[:40]!r}")
        pairs.append((name, value))
    return pairs


def _head_problem(buf: bytes, limits: Any) -> BadRequest | None:
    """Whether an incomplete head can already be refused (a first line no request could start with)."""
    end = buf.find(b"\r\n")
    first = buf if end < 0 else buf[:end]
    if len(first) > limits.max_line_size:
        return BadRequest("too_large", f"request line longer than {limits.max_line_size} bytes")
    if end < 0 and not _METHOD_PREFIX.fullmatch(first[:300]):
        return BadRequest("bad_request_line", f"bad request line {first[:80]!r}")
    if end >= 0 and len(buf) - buf.rfind(b"\r\n") - 2 > limits.max_field_size:
        return BadRequest("too_large", f"header field longer than {limits.max_field_size} bytes")
    if len(buf) > limits.max_line_size + limits.max_headers * (limits.max_field_size + 2) + 4:
        return BadRequest("too_large", "request head too large")
    return None


_PHRASES = {s.value: s.phrase for s in HTTPStatus}


def response_head(resp: Response, close: bool, keep_alive_10: bool = False) -> bytes:
    key = (resp.status, resp.content_type, tuple(resp.headers), close, keep_alive_10)
    parts = _HEADS.get(key)
    if parts is None:
        parts = _head_parts(*key)
        if len(_HEADS) >= 64:  # the app's answers are a handful of shapes; never grow without bound
            _HEADS.clear()
        _HEADS[key] = parts
    return b"%sContent-Length: %d\r\n%s" % (parts[0], resp.length, parts[1])


def _head_parts(status: int, content_type: str | None, headers: tuple[tuple[str, str], ...], close: bool,
                keep_alive_10: bool) -> tuple[bytes, bytes]:
    """The response head without its Content-Length: the lines before it, and those after."""
    lines = [f"HTTP/1.1 {status} {_PHRASES.get(status, 'Unknown')}"]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    lines += [f"{k}: {v}" for k, v in headers]
    after = "Connection: close\r\n" if close else "Connection: keep-alive\r\n" if keep_alive_10 else ""
    return ("\r\n".join(lines) + "\r\n").encode("latin-1"), (after + "\r\n").encode("latin-1")


_HEADS: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}


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
            problem = _head_problem(self._buf, self._limits)
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
        length = request.header("content-length")
        if length is None:
            return
        if not length.isdigit():
            raise BadRequest("bad_request", f"invalid Content-Length {length[:20]!r}")
        n = int(length)
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
