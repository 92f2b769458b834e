"""Each source of a cycle read in isolation: one that raises keeps its last good answer, the others go on.

A source (NVML, /proc, the pods, the kubelet's pod-resources, the Node, the DRA objects, the Xid
counts) is a call the cycle makes. When it raises, whatever it raised, the cycle uses that source's
last good answer (its fallback before the first), counts the failure by source and kind (the
exception's class name: ``kube_gpu_exporter_source_errors_total{source,kind}``) and logs one line
when the source starts failing, when it fails in a new way and when it recovers, never once per
cycle. NVML's sample is the one exception: it is the cycle's measurement, so one that raises is
counted and fails the cycle (the previous snapshot stays served, its age telling; the sampler logs
it once), rather than old values served under a new timestamp. :func:`transition` is the pure
decision of what to log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from exporter.model import one_line

log = logging.getLogger(__name__)

T = TypeVar("T")

# Every source a cycle reads, as the metric's ``source`` label names it.
SOURCES = ("nvml", "proc", "pods", "node", "pod_resources", "dra", "xid")
# Distinct kinds counted per source; a source raising ever new classes (a library's) stays bounded.
MAX_KINDS = 16
OTHER_KIND = "other"
_MISSING = object()


def transition(failing: str | None, kind: str | None) -> str | None:
    """What to log when a read that was failing with ``failing`` (None: fine) now fails with ``kind``.

    Returns "failing" (a new trouble, or a new kind of it), "recovered", or None (no change: nothing to log).
    """
    if kind is None:
        return "recovered" if failing is not None else None
    return "failing" if kind != failing else None


class SourceGuard:
    """Reads sources; see the module docstring. One per pipeline, used from the sampler thread only."""

    def __init__(self) -> None:
        self._last: dict[str, Any] = {}  # read name -> its last good answer
        self._failing: dict[str, str] = {}  # read name -> the kind it fails with now
        self._errors: dict[tuple[str, str], int] = {}

    def read(self, source: str, part: str, call: Callable[[], T], fallback: T | object = _MISSING,
             *, keep_last: bool = True) -> T:
        """``call()``; when it raises, the last good answer of ``source``'s ``part`` (else ``fallback``).

        Without either, or with ``keep_last`` False, the exception is counted and goes on: the caller
        cannot go on without that source, and its own log tells (the sampler's, once per change).
        """
        name = f"{source}.{part}"
        try:
            answer = call()
        except Exception as exc:  # a source's fault or bug must not cost the node its other sources
            kind = self._count(source, type(exc).__name__)
            if not keep_last:
                raise
            self._log(name, source, part, kind, exc)
            if name in self._last:
                return self._last[name]
            if fallback is _MISSING:
                raise
            return fallback  # type: ignore[return-value]
        self._log(name, source, part, None, None)
        if keep_last:
            self._last[name] = answer
        return answer

    def errors(self) -> Mapping[tuple[str, str], int]:
        """Failed reads by (source, kind)."""
        return dict(self._errors)

    def _count(self, source: str, kind: str) -> str:
        kinds = {k for s, k in self._errors if s == source}
        if kind not in kinds and len(kinds) >= MAX_KINDS - 1:
            kind = OTHER_KIND
        self._errors[(source, kind)] = self._errors.get((source, kind), 0) + 1
        return kind

    def _log(self, name: str, source: str, part: str, kind: str | None, exc: BaseException | None) -> None:
        change = transition(self._failing.get(name), kind)
        if change == "failing" and kind is not None:
            self._failing[name] = kind
            kept = "its last good answer" if name in self._last else "no answer yet"
            # One line (the message is the source's, possibly hostile input): the traceback only at debug.
            log.error("source %s (%s) failed: %s: %s; keeping %s until it recovers", source, part, kind,
                      one_line(str(exc))[:300], kept)
            log.debug("source %s (%s) failure", source, part, exc_info=exc)
        elif change == "recovered":
            log.info("source %s (%s) recovered", source, part)
            del self._failing[name]
