"""Adapter: performs event writes through :class:`~exporter.node.kube_api.KubeApi` on a background thread.

``submit`` only enqueues (a full queue drops and counts), so the Xid watcher and the sampler never
wait on the API server. The worker retries transient failures (connection errors, 408/429/5xx) with
exponential backoff, gives up on rejections (other 4xx) at once, and counts every outcome.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from dataclasses import replace
from typing import Any

from exporter.node.kube_api import ApiException, KubeApi
from exporter.xid.events import (
    EVENT_NAMESPACE,
    CreateEvent,
    EventsSink,
    EventWrite,
    PatchSeries,
    WriterCounts,
)

__all__ = ["EventsSink", "EventsWriter", "WriterCounts"]

log = logging.getLogger(__name__)

_TRANSIENT = frozenset({0, 408, 429, 500, 502, 503, 504})
_STOP = object()


class _Gone(Exception):
    """The patched Event does not exist (expired, deleted, or its create was never accepted)."""


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """Backoff before retry number ``attempt`` (1-based): base, 2*base, 4*base, ... capped."""
    return min(cap, base * (2 ** (attempt - 1)))


def is_transient(err: BaseException) -> bool:
    """Worth retrying: the server may accept the same request later."""
    if isinstance(err, ApiException):
        return (err.status or 0) in _TRANSIENT
    return True  # connection refused/reset, timeouts, DNS: the network, not the request


class EventsWriter:
    """An :class:`EventsSink` posting to ``events.k8s.io/v1`` (``api``: its ``create_event``/``patch_event``).

    The worker thread starts with :meth:`start` (or the first :meth:`submit`); :meth:`stop` is :meth:`close`.
    """

    def __init__(
        self,
        api: KubeApi,
        namespace: str = EVENT_NAMESPACE,  # for a write whose Event names none
        *,
        max_queue: int = 1000,
        max_attempts: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        request_timeout: float = 10.0,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._max_attempts = max_attempts
        self._backoff = (backoff_base, backoff_max)
        self._timeout = request_timeout
        self._lock = threading.Lock()
        self._counts = WriterCounts()
        self._retries = 0
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid-events-writer", daemon=True)
        self._start_lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        with self._start_lock:
            if not self._started and not self._closing.is_set():
                self._started = True
                self._thread.start()

    def submit(self, write: EventWrite) -> bool:
        """Queue ``write``; ``False`` (and counted as dropped) when the queue is full or closed."""
        if not self._closing.is_set():
            if not self._started:
                self.start()
            try:
                self._queue.put_nowait(write)
                return True
            except queue.Full:
                pass
        self._count(dropped=1)
        return False

    def counts(self) -> WriterCounts:
        """Cumulative outcomes; ``retries`` counts retried attempts."""
        with self._lock:
            return replace(self._counts, retries=self._retries)

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the queued writes (retries are cut short); wait at most ``timeout``."""
        with self._start_lock:
            self._closing.set()
            if not self._started:
                return
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)

    def stop(self) -> None:
        """Same as :meth:`close` with the default timeout."""
        self.close()

    def _count(self, **deltas: int) -> None:
        with self._lock:
            self._counts = replace(
                self._counts, **{k: getattr(self._counts, k) + v for k, v in deltas.items()}
            )

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._perform(item)
            except Exception:  # never let one write kill the worker
                log.exception("event write failed unexpectedly")
                self._count(failed=1)

    def _perform(self, write: EventWrite) -> None:
        attempt = 0
        recreate = False
        while True:
            attempt += 1
            try:
                if isinstance(write, CreateEvent) or recreate:
                    self._create(write)
                    self._count(posted=1)
                else:
                    self._patch(write)
                    self._count(patched=1)
                return
            except _Gone:
                recreate = True  # the patch's full object, series included, as a create
                attempt -= 1
                continue
            except Exception as err:
                if not is_transient(err) or attempt >= self._max_attempts or self._closing.is_set():
                    log.warning("event %s not written after %d attempt(s): %s", write.name, attempt, err)
                    self._count(failed=1)
                    return
                with self._lock:
                    self._retries += 1
                if self._closing.wait(retry_delay(attempt, *self._backoff)):
                    self._count(failed=1)
                    return

    def _namespace_of(self, event: dict[str, Any]) -> str:
        """The Event's own namespace (the Node's Events', or its pod's with --xid-events-regarding pod)."""
        return event.get("metadata", {}).get("namespace") or self._namespace

    def _create(self, write: EventWrite) -> None:
        body = write.body if isinstance(write, CreateEvent) else write.recreate
        try:
            self._api.create_event(self._namespace_of(body), body, timeout=self._timeout)
        except ApiException as err:
            if err.status != 409:  # AlreadyExists: an earlier attempt got through
                raise

    def _patch(self, write: EventWrite) -> None:
        assert isinstance(write, PatchSeries)
        try:
            self._api.patch_event(write.name, self._namespace_of(write.recreate), write.patch, timeout=self._timeout)
        except ApiException as err:
            if err.status == 404:
                raise _Gone from err
            raise
