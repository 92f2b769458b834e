"""Logging: text or JSON lines on stderr, and a log that speaks only when a state changes.

``--log-format json`` writes one JSON object per line (``time``, ``level``, ``logger``, ``message``,
and ``exception`` when there is one), for log pipelines; nothing beyond the standard library.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in the message are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class _OurHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (and replaces when called again)."""


def configure_logging(level: str, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Log at ``level`` in ``fmt`` ("text" or "json") to ``stream`` (default stderr).

    Like :func:`logging.basicConfig`, it leaves a root logger that someone else configured (a test
    runner) alone; a handler of an earlier call is replaced.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _OurHandler)]:
        root.removeHandler(handler)
    if root.handlers:
        return
    handler = _OurHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())


class StateLog:
    """Logs one subsystem's state when it changes, never the same state twice in a row.

    :meth:`bad` logs each new trouble (a new reason is a new state); :meth:`good` logs only a
    recovery: the first good state is for the start-up summary to tell.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self.state: str | None = None
        self.healthy: bool | None = None

    def bad(self, state: str, message: str, *args: object, level: int = logging.WARNING) -> bool:
        """Enter trouble ``state``; log ``message`` when it is new. Returns whether it logged."""
        if state == self.state:
            return False
        self.state, self.healthy = state, False
        self.log.log(level, message, *args)
        return True

    def good(self, state: str, message: str, *args: object) -> bool:
        """Enter healthy ``state``; log ``message`` (info) when it ends a trouble. Returns whether it logged."""
        recovered = self.healthy is False
        self.state, self.healthy = state, True
        if recovered:
            self.log.info(message, *args)
        return recovered
