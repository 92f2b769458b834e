"""Keeps :class:`~exporter.node.pod_store.PodStore` in sync with the pods bound to this node (list + watch).

A thin adapter around :class:`~exporter.node.kube_api.KubeApi`: it only moves raw JSON between the
API and the store, so the store gets the Pod dicts exactly as the API sent them.

Protocol, as client-go's reflector does it: list (field selector ``spec.nodeName=<node>``), then
watch from the list's resourceVersion with ``timeoutSeconds`` and bookmarks; a watch that ends
cleanly is resumed from the last resourceVersion seen; 410 Gone (on the watch, or as a watch ERROR
event) means the history is compacted and forces a relist; any other error counts as a sync error
and relists after an exponential backoff. The last good view stays in place throughout, so an API
outage leaves attribution working on slightly stale (but usually still right) data.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.model import EMPTY
from exporter.node.kube_api import ApiException, ApiResponseTooLarge, KubeApi, WatchStream
from exporter.node.pod_store import PodStore, PodView

log = logging.getLogger(__name__)

Backoff = Callable[[int], float]  # consecutive failures (1, 2, ...) -> seconds to wait


def exponential_backoff(initial: float = 0.5, maximum: float = 30.0, jitter: float = 0.2) -> Backoff:
    """``initial * 2**(n-1)`` capped at ``maximum``, +-``jitter`` fraction so nodes don't relist in step."""

    def delay(failures: int) -> float:
        base = min(maximum, initial * 2 ** min(max(failures - 1, 0), 30))
        return base * (1 + random.uniform(-jitter, jitter))

    return delay


@dataclass(frozen=True, slots=True)
class PodWatcherStats:
    """Health of the pod cache, for the exporter's self-metrics."""

    sync_errors: int  # failed lists/watches since start (410 Gone is not an error)
    last_sync_timestamp: float | None  # unix time the cache was last known current
    synced: bool  # a list succeeded and the watch since then has not failed
    skips: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # malformed pods by reason


class _Gone(Exception):
    """The requested resourceVersion is too old: relist."""


class PodWatcher:
    """List + watch this node's pods in a daemon thread; :meth:`view` never blocks on the API."""

    def __init__(
        self,
        node_name: str,
        api_client: KubeApi,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout: float = 30.0,
        page_size: int = 500,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        store: PodStore | None = None,
    ) -> None:
        self.node_name = node_name
        self._api = api_client
        self._selector = f"spec.nodeName={node_name}"
        self._watch_timeout = watch_timeout_seconds
        self._request_timeout = request_timeout
        self._page_size = page_size
        self._backoff = backoff or exponential_backoff()
        self._clock = clock
        self._store = store or PodStore()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._response: WatchStream | None = None  # the watch in flight, shut down by stop()
        self._sync_errors = 0
        self._failures = 0  # consecutive; reset once a watch proves useful (an event or a clean end)
        self._last_sync: float | None = None
        self._synced = False

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        """Start the background thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"pod-watcher-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop promptly: interrupts a blocked watch read rather than waiting for its timeout."""
        self._stop.set()
        self._close_response()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def view(self) -> PodView:
        """The latest snapshot (the last good one while the API is unreachable)."""
        return self._store.view()

    def stats(self) -> PodWatcherStats:
        """Sync health and skip counts."""
        with self._lock:
            return PodWatcherStats(self._sync_errors, self._last_sync, self._synced, self._store.skips())

    # ------------------------------------------------------------------ loop

    def _mark(self, *, synced: bool | None = None, error: bool = False, current: bool = False) -> None:
        with self._lock:
            if error:
                self._sync_errors += 1
            if synced is not None:
                self._synced = synced
            if current:
                self._last_sync = self._clock()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rv = self._list()
                self._mark(synced=True, current=True)
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except _Gone:
                # Expected now and then (compaction, apiserver restart): relist at once, but back
                # off when it repeats without a useful watch in between, so nothing can make us spin.
                self._failures += 1
                if self._failures > 1 and self._stop.wait(self._backoff(self._failures - 1)):
                    break
            except Exception as exc:
                if self._stop.is_set():
                    break  # stop() closed the connection under us
                self._failures += 1
                self._mark(synced=False, error=True)
                delay = self._backoff(self._failures)
                log.warning(
                    "pod list/watch failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay
                )
                if self._stop.wait(delay):
                    break

    def _list(self) -> str:
        """List every page; replace the store; return the list's resourceVersion."""
        items: list[Any] = []
        token: str | None = None
        while True:
            body = self._page(token)
            meta = body.get("metadata") if isinstance(body, dict) else None
            page = body.get("items") if isinstance(body, dict) else None
            if not isinstance(meta, dict) or not isinstance(page, list):
                raise ValueError("pod list response without metadata/items")
            items.extend(page)
            token = meta.get("continue") or None
            if not token:
                rv = meta.get("resourceVersion")
                if not isinstance(rv, str) or not rv:
                    raise ValueError("pod list response without resourceVersion")
                self._store.replace(items, rv)
                return rv

    def _page(self, token: str | None) -> Any:
        """One page of the list. A page over the client's bound (pods with huge annotations) is asked for
        again with half as many pods, down to one (the API server takes a new limit with a continue token)."""
        while True:
            try:
                return self._get_json({"fieldSelector": self._selector, "limit": self._page_size, "continue": token})
            except ApiResponseTooLarge as e:
                if self._page_size == 1:
                    raise
                self._page_size = max(1, self._page_size // 2)
                log.warning("pod list page refused (%s); asking for %d pods a page", e, self._page_size)

    def _get_json(self, query: dict[str, Any]) -> Any:
        try:
            return self._api.get("/api/v1/pods", query, timeout=self._request_timeout)
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone(str(exc)) from exc
            raise

    def _watch(self, rv: str) -> str:
        """One watch request; returns the resourceVersion to resume from when it ends cleanly."""
        try:
            resp = self._api.watch(
                "/api/v1/pods",
                {"fieldSelector": self._selector, "resourceVersion": rv, "allowWatchBookmarks": True,
                 "timeoutSeconds": self._watch_timeout},
                connect_timeout=self._request_timeout,
                # Read timeout past the server's own: a silent, half-open connection still ends.
                read_timeout=self._watch_timeout + self._request_timeout,
            )
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone(str(exc)) from exc
            raise
        with self._lock:
            self._response = resp
        if self._stop.is_set():  # stop() ran before the response was published
            self._close_response()
        try:
            for event in resp.events():
                etype, obj = event.get("type"), event.get("object")
                if etype == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else None
                    if code == 410:
                        raise _Gone(str(obj.get("message", "")))
                    raise RuntimeError(f"watch error event: {obj!r}")
                self._store.apply(str(etype), obj)
                meta = obj.get("metadata") if isinstance(obj, dict) else None
                if isinstance(meta, dict) and isinstance(meta.get("resourceVersion"), str):
                    rv = meta["resourceVersion"] or rv
                self._failures = 0
                self._mark(current=True)
            if not self._stop.is_set():
                self._failures = 0
                self._mark(current=True)  # clean end (server timeout): current up to here
            return rv
        finally:
            with self._lock:
                self._response = None
            resp.close()

    def _close_response(self) -> None:
        with self._lock:
            resp = self._response
        if resp is not None:
            resp.shutdown()  # unblocks a thread sitting in read(), unlike close()
