"""The HTTP/1.1 wire format the server speaks: request and response types, the parse of a request
head within the server's limits, and response heads.

Pure functions and plain data (no I/O): :mod:`exporter.server.protocol` drives them per connection.
A malformed head raises :class:`BadRequest` with a reason from a bounded set (see http_stats).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e\x80-\xff]+) HTTP/(\d)\.(\d)")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # every control character but HTAB
_FIELDS = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*")
_FIELD = re.compile(rb"\r\n([^:]+):([^\r]*)")
_METHOD_PREFIX = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]*( [\x21-\x7e\x80-\xff]*( H?T?T?P?/?\d?\.?\d?\r?)?)?")


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


def content_length(fields: list[str]) -> int:
    """The body length every ``Content-Length`` field names; :class:`BadRequest` unless they all name one.

    RFC 9110 section 8.6: repeated fields (or a list ``42, 42``) of one value are that value; differing
    ones are how requests get smuggled past a proxy that reads the other, so they are refused.
    """
    values = {v.strip() for f in fields for v in f.split(",")}
    if len(values) != 1:
        shown = ", ".join(sorted(values))[:60]
        raise BadRequest("bad_request", f"differing Content-Length values {shown!r}")
    (length,) = values
    if not (length.isascii() and length.isdigit()) or len(length) > 18:
        raise BadRequest("bad_request", f"invalid Content-Length {length[:20]!r}")
    return int(length)


def head_problem(buf: bytes, limits: Any) -> BadRequest | None:
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
