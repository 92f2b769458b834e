"""The HTTP server's own counters, appended to every scrape, and its rate-limited one-line log.

Everything here runs on the event loop thread only (no locks). A hostile client controls how often
these events happen, so none of them may cost more than a counter increment and, at most once a
minute per topic, one log line: never a traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.exposition.snapshot import go_float

ERRORS_FAMILY = "kube_gpu_exporter_http_errors_total"
DROPPED_FAMILY = "kube_gpu_exporter_http_connections_dropped_total"
OPEN_FAMILY = "kube_gpu_exporter_http_connections"
LIMIT_FAMILY = "kube_gpu_exporter_http_connections_limit"
AUTH_FAMILY = "kube_gpu_exporter_http_auth_total"

# Every reason is exported from the start (at 0), so rate() and alerts see the first increment.
ERROR_REASONS = (
    "accept_emfile", "accept_enfile", "accept_enobufs", "accept_enomem",  # accept() out of resources
    "bad_request_line", "bad_header", "too_large", "bad_request",  # malformed requests (400)
    "internal_error", "loop_error",  # our own faults: a handler raised, the event loop reported one
    "tls_handshake",  # a TLS handshake that failed (plain HTTP on the TLS port, a refused client certificate)
)
DROP_REASONS = ("limit", "header_timeout", "request_timeout")


def one_line(text: str, limit: int = 240) -> str:
    """``text`` as one printable ASCII line of at most ``limit`` characters (it may be attacker bytes)."""
    flat = "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii")
                   for c in " ".join(text.split()))  # no control bytes: no terminal escapes in the log
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RateLimitedLog:
    """At most one line per ``every`` seconds per topic; the next line says how many were held back.

    The server's topics: ``malformed`` (requests answered 400), ``accept`` (accept() failures),
    ``dropped`` (connections closed by the cap or a timeout), ``internal_error``, ``loop_error``,
    ``tls_handshake``.
    """

    def __init__(self, logger: logging.Logger, every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._every = every
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __call__(self, topic: str, message: str, level: int = logging.WARNING) -> bool:
        """Log ``message`` (made one line) unless ``topic`` logged within the window; True if logged."""
        now = self._clock()
        last = self._last.get(topic)
        if last is not None and now - last < self._every:
            self._held[topic] = self._held.get(topic, 0) + 1
            return False
        self._last[topic] = now
        held = self._held.pop(topic, 0)
        more = f" (and {held} more like it since the last such line)" if held else ""
        self._log.log(level, "%s%s", one_line(message), more)
        return True


@dataclass
class HttpStats:
    """Counters of the HTTP server; :meth:`render` is the text a scrape appends."""

    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_REASONS, 0))
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    open_connections: int = 0
    connection_limit: int = 0
    auth: dict[str, int] | None = None  # basic authentication's results (exporter/server/auth.py), when it is on
    _rendered: tuple[tuple[int, ...], bytes] | None = field(default=None, repr=False, compare=False)

    def error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def render(self) -> bytes:
        """Prometheus text of these counters: a few hundred bytes, built again only when one changed."""
        # the reasons are fixed and in order (a new one lengthens the key): the values say it all
        key = (*self.errors.values(), *self.dropped.values(), self.open_connections, self.connection_limit,
               *(self.auth or {}).values())
        if self._rendered is not None and self._rendered[0] == key:
            return self._rendered[1]
        text = self._render()
        self._rendered = (key, text)
        return text

    def _render(self) -> bytes:
        out = [
            f"# HELP {ERRORS_FAMILY} HTTP accept failures and malformed requests, by reason\n"
            f"# TYPE {ERRORS_FAMILY} counter\n",
            *(f'{ERRORS_FAMILY}{{reason="{r}"}} {n}\n' for r, n in self.errors.items()),
            f"# HELP {DROPPED_FAMILY} HTTP connections the server closed to protect itself, by reason\n"
            f"# TYPE {DROPPED_FAMILY} counter\n",
            *(f'{DROPPED_FAMILY}{{reason="{r}"}} {n}\n' for r, n in self.dropped.items()),
            f"# HELP {OPEN_FAMILY} Open HTTP connections\n# TYPE {OPEN_FAMILY} gauge\n"
            f"{OPEN_FAMILY} {self.open_connections}\n",
            f"# HELP {LIMIT_FAMILY} Open HTTP connections at most (the oldest idle one is dropped beyond)\n"
            f"# TYPE {LIMIT_FAMILY} gauge\n{LIMIT_FAMILY} {go_float(self.connection_limit)}\n",
        ]
        if self.auth is not None:
            out += [f"# HELP {AUTH_FAMILY} Basic authentication checks by result (cached, verified, wrong, busy: "
                    f"refused at once with 429)\n# TYPE {AUTH_FAMILY} counter\n",
                    *(f'{AUTH_FAMILY}{{result="{r}"}} {n}\n' for r, n in self.auth.items())]
        return "".join(out).encode()
