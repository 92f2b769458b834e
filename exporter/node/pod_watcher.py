"""Keeps :class:`~exporter.node.pod_store.PodStore` in sync with the pods bound to this node (list + watch).

A thin adapter around the ``kubernetes`` client: it only moves raw JSON between the API and the
store. Responses are read with ``_preload_content=False`` so the store gets the Pod dicts exactly as
the API sent them (no model round trip, which would also reject objects the pydantic models dislike).

Protocol, as client-go's reflector does it: list (field selector ``spec.nodeName=<node>``), then
watch from the list's resourceVersion with ``timeoutSeconds`` and bookmarks; a watch that ends
cleanly is resumed from the last resourceVersion seen; 410 Gone (on the watch, or as a watch ERROR
event) means the history is compacted and forces a relist; any other error counts as a sync error
and relists after an exponential backoff. The last good view stays in place throughout, so an API
outage leaves attribution working on slightly stale (but usually still right) data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from exporter.model import EMPTY
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
        api_client: client.ApiClient,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout: float = 30.0,
        page_size: int = 500,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        store: PodStore | None = None,
    ) -> None:
        self.node_name = node_name
        self._api = client.CoreV1Api(api_client)
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
        self._response: Any = None  # the in-flight HTTP response, closed by stop()
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
            kwargs: dict[str, Any] = {"field_selector": self._selector, "limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            body = self._get_json(**kwargs)
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

    def _get_json(self, **kwargs: Any) -> Any:
        try:
            resp = self._api.list_pod_for_all_namespaces(
                _preload_content=False, _request_timeout=self._request_timeout, **kwargs
            )
        except client.ApiException as exc:
            if exc.status == 410:
                raise _Gone(str(exc)) from exc
            raise
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def _watch(self, rv: str) -> str:
        """One watch request; returns the resourceVersion to resume from when it ends cleanly."""
        try:
            resp = self._api.list_pod_for_all_namespaces(
                field_selector=self._selector,
                resource_version=rv,
                watch=True,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _preload_content=False,
                # Read timeout past the server's own: a silent, half-open connection still ends.
                _request_timeout=(self._request_timeout, self._watch_timeout + self._request_timeout),
            )
        except client.ApiException as exc:
            if exc.status == 410:
                raise _Gone(str(exc)) from exc
            raise
        with self._lock:
            self._response = resp
        if self._stop.is_set():  # stop() ran before the response was published
            self._close_response()
        try:
            for event in _events(resp):
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
            resp.release_conn()

    def _close_response(self) -> None:
        with self._lock:
            resp = self._response
        if resp is not None:
            try:
                resp.shutdown()  # unblocks a thread sitting in read(), unlike close()
            except Exception:  # already closed or no socket: nothing to interrupt
                log.debug("closing watch response", exc_info=True)


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """Newline-delimited JSON watch events from a streaming urllib3 response."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError("watch event is not an object")
                yield event
    if buf.strip():
        raise ValueError("watch stream ended in the middle of an event")


def build_api_client(api_url: str | None, kubeconfig: str | None) -> client.ApiClient:
    """An ApiClient from, in this order: an explicit API URL, a kubeconfig path, the in-cluster
    service account, then ``$KUBECONFIG`` / ``~/.kube/config``.

    With an explicit https URL the in-cluster token and CA are still used when present (pointing
    a DaemonSet at a specific apiserver endpoint); otherwise it is plain (tests, ``kubectl proxy``).
    """
    cfg = client.Configuration()
    if api_url:
        if api_url.startswith("https://"):
            # Never send the service-account token over plain http.
            with contextlib.suppress(ConfigException):  # not in a cluster: no credentials
                config.load_incluster_config(client_configuration=cfg)
        cfg.host = api_url.rstrip("/")
        return client.ApiClient(cfg)
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
        return client.ApiClient(cfg)
    try:
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except ConfigException:
        pass
    # Read $KUBECONFIG now: the library's own default was frozen when it was imported.
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    try:
        config.load_kube_config(config_file=default, client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError) as exc:
        raise ConfigException(
            f"no Kubernetes API configuration: not in a cluster and no usable kubeconfig at {default} "
            "(use --kube-api-url or --kubeconfig)"
        ) from exc
    return client.ApiClient(cfg)
