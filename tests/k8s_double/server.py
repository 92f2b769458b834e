"""A local Kubernetes API server double that the real ``kubernetes`` client can talk to.

It speaks the REST/JSON of the real server for the few resources a node agent touches: Pods
(list + watch with resourceVersion semantics), Nodes (get/list) and Events (both the core/v1 and
``events.k8s.io/v1`` APIs, with the server's validation). It runs on 127.0.0.1 in a background thread
with its own event loop, so synchronous pytest tests drive it through plain method calls.

Storage model, like etcd: one cluster-wide resourceVersion counter bumped by every write; pod changes
are kept in a history so watches can resume from a resourceVersion and list can serve an exact
snapshot. ``compact()`` (or the history limit) drops history, after which older resourceVersions get
410 Expired, as from a real server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import events_validation as ev_valid
from .dra import DraState
from .objects import now_rfc3339
from .selectors import (
    CORE_EVENT_FIELDS,
    EVENTS_V1_FIELDS,
    NODE_FIELDS,
    POD_FIELDS,
    Predicate,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PATCH_TYPES = frozenset(
    {
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
    }
)
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the real name generator draws from
_CLOSE = object()  # end a watch cleanly (server-side timeout)
_ABORT = object()  # drop a watch connection (server gone)
_BOOKMARK = object()


@dataclass
class RecordedRequest:
    """One request as the double received it; ``status`` is filled in once answered."""

    method: str
    path: str
    query: dict[str, str]
    body: Any  # parsed JSON, raw text if not JSON, None if empty
    content_type: str
    status: int | None = None


@dataclass(frozen=True)
class _Change:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    prev: dict[str, Any] | None


@dataclass(eq=False)
class _Watcher:
    namespace: str | None
    match: Predicate
    bookmarks: bool
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class ApiError(Exception):
    """Raised inside handlers; rendered as a metav1 Status."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_object(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict:
    """A metav1 Status, as the server sends for failures (also inside watch ERROR events)."""
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        out["details"] = dict(details)
    return out


def _is_true(value: str | None) -> bool:
    return value in ("true", "1", "True")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge for Events degenerates to it: no merge-keyed lists)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch: add, replace, remove, test."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise ApiError(400, "BadRequest", f"invalid json patch operation {op!r}")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        if not parts:
            raise ApiError(422, "Invalid", "json patch on the document root is not supported")
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise ApiError(422, "Invalid", f"json patch path {op['path']} does not exist")
        last, kind = parts[-1], op.get("op")
        if kind in ("add", "replace"):
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(idx, op.get("value"))
                else:
                    parent[idx] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(422, "Invalid", f"json patch replace: missing path {op['path']}")
                parent[last] = op.get("value")
        elif kind == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError) as exc:
                raise ApiError(422, "Invalid", f"json patch remove: missing path {op['path']}") from exc
        elif kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch test failed at {op['path']}")
        else:
            raise ApiError(400, "BadRequest", f"unsupported json patch op {kind!r}")
    return doc


class ApiServerDouble:
    """The API server double. Use as a context manager, or call :meth:`start` / :meth:`stop`.

    All public methods are thread-safe: they run on the server's loop and wait for the result.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        history_limit: int = 10_000,
        default_watch_timeout: float = 1800.0,
    ) -> None:
        self.host = host
        self.port = 0
        self.history_limit = history_limit
        self.default_watch_timeout = default_watch_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None
        # --- state, touched only on the loop thread ---
        self._rv = 1
        self._oldest_rv = 1  # watches/exact lists from below this get 410
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._history: list[_Change] = []
        self._nodes: dict[str, dict[str, Any]] = {}
        self._events: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            ev_valid.EVENTS_V1: {},
            ev_valid.CORE_V1: {},
        }
        self._watchers: set[_Watcher] = set()
        self._fail_remaining = 0
        self._fail_status = 500
        self._expire_watches = 0
        self._offline = False
        self._requests: list[RecordedRequest] = []
        self._requests_lock = threading.Lock()
        self._dra = DraState(ApiError)  # resource.k8s.io/v1 ResourceSlices and ResourceClaims

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """Base URL for ``kubernetes.client.Configuration().host``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServerDouble:
        """Start listening on a free port; returns self."""
        if self._thread is not None:
            return self
        ready: threading.Event = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._setup())
            except BaseException as exc:  # surfaced to the caller of start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._teardown())
            loop.close()

        self._thread = threading.Thread(target=run, name="k8s-api-double", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        """Close every connection and stop the loop thread."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> ApiServerDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _setup(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=8 * 1024 * 1024)
        self._add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))  # port 0 first time: a free port, then the same one again
        self.port = sock.getsockname()[1]
        assert self._runner is not None
        self._site = web.SockSite(self._runner, sock)
        await self._site.start()

    async def _teardown(self) -> None:
        self._drop_connections()
        if self._runner is not None:
            await self._runner.cleanup()

    def _drop_connections(self) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait(_ABORT)
        if self._runner is not None and self._runner.server is not None:
            for handler in list(self._runner.server.connections):
                if handler.transport is not None:
                    handler.transport.abort()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the loop thread (where all state lives) and return its result."""
        if self._loop is None or self._thread is None:
            return fn(*args)  # not started: no concurrency yet
        if threading.current_thread() is self._thread:
            return fn(*args)

        async def wrapper() -> Any:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(10)

    # ------------------------------------------------------------------ test API: pods, nodes

    @property
    def resource_version(self) -> int:
        """The cluster's current resourceVersion."""
        return self._call(lambda: self._rv)

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record_change(self, change: _Change) -> None:
        self._history.append(change)
        if len(self._history) > self.history_limit:
            dropped = self._history[: len(self._history) - self.history_limit]
            del self._history[: len(dropped)]
            self._oldest_rv = dropped[-1].rv
        for w in list(self._watchers):
            w.queue.put_nowait(change)

    def add_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Create a pod (ADDED to watches); fills uid, namespace, resourceVersion. Returns the stored copy."""
        return self._call(self._add_pod, copy.deepcopy(dict(pod)))

    def _add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod.setdefault("metadata", {})
        if not isinstance(meta, dict) or not meta.get("name"):
            raise ValueError("add_pod needs metadata.name")
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta["name"])
        if key in self._pods:
            raise ValueError(f"pod {key} already exists")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        meta["resourceVersion"] = str(self._bump())
        self._pods[key] = pod
        self._record_change(_Change(self._rv, "ADDED", pod, None))
        return copy.deepcopy(pod)

    def update_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Replace an existing pod (MODIFIED to watches). Returns the stored copy."""
        return self._call(self._update_pod, copy.deepcopy(dict(pod)))

    def _update_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod.setdefault("metadata", {})
        key = (meta.get("namespace", "default"), meta.get("name"))
        prev = self._pods.get(key)
        if prev is None:
            raise KeyError(f"pod {key} does not exist")
        meta.setdefault("namespace", key[0])
        meta.setdefault("uid", prev["metadata"].get("uid"))
        meta.setdefault("creationTimestamp", prev["metadata"].get("creationTimestamp"))
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        meta["resourceVersion"] = str(self._bump())
        self._pods[key] = pod
        self._record_change(_Change(self._rv, "MODIFIED", pod, prev))
        return copy.deepcopy(pod)

    def mutate_pod(self, namespace: str, name: str, fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Apply ``fn`` to a copy of the stored pod and store the result (MODIFIED)."""

        def run() -> dict[str, Any]:
            pod = copy.deepcopy(self._pods[(namespace, name)])
            fn(pod)
            return self._update_pod(pod)

        return self._call(run)

    def delete_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Delete a pod (DELETED to watches, carrying the final state at a new resourceVersion)."""

        def run() -> dict[str, Any]:
            prev = self._pods.pop((namespace, name))
            final = copy.deepcopy(prev)
            final["metadata"]["resourceVersion"] = str(self._bump())
            self._record_change(_Change(self._rv, "DELETED", final, prev))
            return copy.deepcopy(final)

        return self._call(run)

    def pods(self) -> list[dict[str, Any]]:
        """Copies of every stored pod."""
        return self._call(lambda: copy.deepcopy(list(self._pods.values())))

    def set_resource_slices(self, slices: list[Mapping[str, Any]]) -> None:
        """Replace the ResourceSlices (resource.k8s.io/v1; watches see ADDED/MODIFIED/DELETED)."""
        self._call(lambda: self._dra.set_slices(slices, self._bump()))

    def serve_resource_versions(self, *versions: str) -> None:
        """Which resource.k8s.io versions answer (default v1; ``"v1beta2"`` alone for a 1.33 server)."""
        self._call(lambda: setattr(self._dra, "versions", set(versions)))

    def set_resource_claims(self, claims: list[Mapping[str, Any]]) -> None:
        """Replace the ResourceClaims (resource.k8s.io/v1, served by get and list)."""
        self._call(lambda: self._dra.set_claims(claims, self._bump()))

    def set_nodes(self, nodes: list[Mapping[str, Any]]) -> None:
        """Replace the set of Nodes (served by GET /api/v1/nodes[/name])."""

        def run() -> None:
            self._nodes = {}
            for node in nodes:
                obj = copy.deepcopy(dict(node))
                obj.setdefault("apiVersion", "v1")
                obj.setdefault("kind", "Node")
                obj["metadata"]["resourceVersion"] = str(self._bump())
                self._nodes[obj["metadata"]["name"]] = obj

        self._call(run)

    def events(self, api: str | None = None) -> list[dict[str, Any]]:
        """Stored Events; ``api`` = ``"events.k8s.io/v1"`` or ``"v1"`` (default: both)."""

        def run() -> list[dict[str, Any]]:
            apis = [api] if api else list(self._events)
            return [copy.deepcopy(e) for a in apis for e in self._events[a].values()]

        return self._call(run)

    # ------------------------------------------------------------------ test API: faults and inspection

    def fail_next(self, count: int = 1, status: int = 500) -> None:
        """Answer the next ``count`` requests (any path) with ``status`` and a Status body."""

        def run() -> None:
            self._fail_remaining, self._fail_status = count, status

        self._call(run)

    def expire_next_watch(self, count: int = 1) -> None:
        """The next ``count`` pod watches get an ERROR event with a 410 Expired Status, then end."""

        def run() -> None:
            self._expire_watches = count

        self._call(run)

    def compact(self) -> None:
        """Forget history: watches and exact lists from any older resourceVersion now get 410."""

        def run() -> None:
            self._history.clear()
            self._oldest_rv = self._rv

        self._call(run)

    def close_watches(self) -> None:
        """End every open watch cleanly, as the server does when a watch times out."""
        self._call(lambda: [w.queue.put_nowait(_CLOSE) for w in list(self._watchers)])

    def send_bookmark(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to watches that allowed bookmarks."""
        self._call(lambda: [w.queue.put_nowait(_BOOKMARK) for w in list(self._watchers)])

    @property
    def active_watches(self) -> int:
        """Open watch connections."""
        return self._call(lambda: len(self._watchers))

    def go_offline(self) -> None:
        """Become unreachable, as an API server behind a load balancer that lost its backends: drop every
        open connection (watches included) and reset every new one before it gets an answer.

        The port keeps listening on purpose: closing the listener in the middle of an accept can orphan
        the accepted socket (CPython 3.11's asyncio asserts in ``Server._attach`` and never closes it),
        leaving a client waiting for an answer that never comes; the pod watcher's outage test caught it
        about once in 200 runs.
        """

        def run() -> None:
            self._offline = True
            self._drop_connections()

        self._call(run)

    def come_back(self) -> None:
        """Answer again on the same port."""

        def run() -> None:
            self._offline = False

        self._call(run)

    @contextlib.contextmanager
    def offline(self) -> Iterator[None]:
        """``with double.offline(): ...`` unreachable inside the block."""
        self.go_offline()
        try:
            yield
        finally:
            self.come_back()

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received, in order."""
        with self._requests_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        """Forget recorded requests (and so reset :attr:`writes`)."""
        with self._requests_lock:
            self._requests.clear()

    @property
    def writes(self) -> int:
        """Write requests (POST/PUT/PATCH/DELETE) received, whatever their outcome."""
        return sum(1 for r in self.requests if r.method in WRITE_METHODS)

    def requests_to(self, method: str, path_prefix: str = "") -> list[RecordedRequest]:
        """Recorded requests with this method whose path starts with ``path_prefix``."""
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    # ------------------------------------------------------------------ HTTP plumbing

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self._offline:
            # Unreachable (go_offline): reset the connection unanswered and unrecorded, as a dead peer.
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable()
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        rec = RecordedRequest(
            request.method, request.path, dict(request.query), body, request.headers.get("Content-Type", "")
        )
        with self._requests_lock:
            self._requests.append(rec)
        try:
            if self._fail_remaining > 0:
                self._fail_remaining -= 1
                code = self._fail_status
                raise ApiError(code, "InternalError" if code == 500 else "Failure", "injected failure")
            try:
                resp = await handler(request)
            except web.HTTPNotFound as exc:
                raise ApiError(404, "NotFound", "the server could not find the requested resource") from exc
            except web.HTTPMethodNotAllowed as exc:
                raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here") from exc
        except ApiError as err:
            resp = web.json_response(
                status_object(err.code, err.reason, err.message, err.details), status=err.code
            )
        rec.status = resp.status
        return resp

    def _add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/v1/pods", self._pods_collection)
        r.add_get("/api/v1/namespaces/{ns}/pods", self._pods_collection)
        r.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        r.add_get("/api/v1/nodes", self._list_nodes)
        r.add_get("/api/v1/nodes/{name}", self._get_node)
        self._dra.add_routes(r)
        for api, prefix in ((ev_valid.EVENTS_V1, "/apis/events.k8s.io/v1"), (ev_valid.CORE_V1, "/api/v1")):
            coll, item = f"{prefix}/namespaces/{{ns}}/events", f"{prefix}/namespaces/{{ns}}/events/{{name}}"
            r.add_get(f"{prefix}/events", self._bind(self._list_events, api))
            r.add_get(coll, self._bind(self._list_events, api))
            r.add_post(coll, self._bind(self._create_event, api))
            r.add_get(item, self._bind(self._get_event, api))
            r.add_patch(item, self._bind(self._patch_event, api))
            r.add_put(item, self._bind(self._put_event, api))
            r.add_delete(item, self._bind(self._delete_event, api))

    @staticmethod
    def _bind(fn: Callable, api: str) -> Callable:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await fn(request, api)

        return handler

    # ------------------------------------------------------------------ pods

    def _pod_predicate(self, request: web.Request) -> tuple[str | None, Predicate]:
        ns = request.match_info.get("ns")
        try:
            fsel = parse_field_selector(request.query.get("fieldSelector"), POD_FIELDS)
            lsel = parse_label_selector(request.query.get("labelSelector"))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc

        def match(obj: Mapping[str, Any] | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata") or {}
            return (ns is None or meta.get("namespace") == ns) and fsel(obj) and lsel(obj)

        return ns, match

    async def _get_pod(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["ns"], request.match_info["name"])
        pod = self._pods.get(key)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{key[1]}" not found', {"name": key[1], "kind": "pods"})
        return web.json_response(pod)

    async def _pods_collection(self, request: web.Request) -> web.StreamResponse:
        ns, match = self._pod_predicate(request)
        if _is_true(request.query.get("watch")):
            return await self._watch_pods(request, ns, match)
        return self._list_pods(request, match)

    def _snapshot(self, rv: int) -> dict[tuple[str, str], dict[str, Any]]:
        """Pods as they were at ``rv`` (undoing newer history)."""
        if rv < self._oldest_rv:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self._oldest_rv})")
        state = dict(self._pods)
        for change in reversed(self._history):
            if change.rv <= rv:
                break
            meta = change.obj["metadata"]
            key = (meta["namespace"], meta["name"])
            if change.prev is None:
                state.pop(key, None)
            else:
                state[key] = change.prev
        return state

    def _list_pods(self, request: web.Request, match: Predicate) -> web.StreamResponse:
        q = request.query
        rv_param, rv_match, cont = q.get("resourceVersion"), q.get("resourceVersionMatch"), q.get("continue")
        if rv_match and not rv_param:
            raise ApiError(
                400, "BadRequest", "resourceVersionMatch is forbidden unless resourceVersion is provided"
            )
        if rv_match not in (None, "", "Exact", "NotOlderThan"):
            raise ApiError(400, "BadRequest", f"unsupported resourceVersionMatch {rv_match!r}")
        start_after: tuple[str, str] | None = None
        if cont:
            if rv_param:
                raise ApiError(
                    400, "BadRequest", "specifying resource version is not allowed when using continue"
                )
            try:
                token = json.loads(base64.urlsafe_b64decode(cont.encode()))
                snap_rv, start_after = int(token["rv"]), (token["start"][0], token["start"][1])
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ApiError(400, "BadRequest", "continue key is not valid") from exc
            if snap_rv < self._oldest_rv:
                raise ApiError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result.",
                )
        elif rv_param in (None, "", "0"):
            snap_rv = self._rv
        else:
            try:
                requested = int(rv_param)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resource version {rv_param!r}") from exc
            if requested > self._rv:
                raise ApiError(
                    504,
                    "Timeout",
                    f"Too large resource version: {requested}, current: {self._rv}",
                    {
                        "causes": [
                            {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                        ]
                    },
                )
            snap_rv = requested if rv_match == "Exact" else self._rv
        state = self._snapshot(snap_rv)
        keys = sorted(k for k, obj in state.items() if match(obj))
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        metadata: dict[str, Any] = {"resourceVersion": str(snap_rv)}
        limit = int(q.get("limit") or 0)
        if limit > 0 and len(keys) > limit:
            keys = keys[:limit]
            metadata["continue"] = base64.urlsafe_b64encode(
                json.dumps({"rv": snap_rv, "start": list(keys[-1])}).encode()
            ).decode()
        items = []
        for k in keys:
            item = dict(state[k])
            item.pop("kind", None)  # list items carry no TypeMeta on the real server
            item.pop("apiVersion", None)
            items.append(item)
        return web.json_response(
            {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}
        )

    @staticmethod
    def _filter_change(change: _Change, match: Callable[[Any], bool]) -> tuple[str, dict[str, Any]] | None:
        """The event a selector-filtered watch sees: objects moving in/out become ADDED/DELETED."""
        now, before = match(change.obj), match(change.prev)
        if change.type == "ADDED":
            return ("ADDED", change.obj) if now else None
        if change.type == "DELETED":
            return ("DELETED", change.obj) if before else None
        if now and before:
            return ("MODIFIED", change.obj)
        if now:
            return ("ADDED", change.obj)
        if before:
            return ("DELETED", change.obj)
        return None

    def _bookmark(self) -> dict[str, Any]:
        return {
            "type": "BOOKMARK",
            "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)}},
        }

    async def _watch_pods(self, request: web.Request, ns: str | None, match: Callable) -> web.StreamResponse:
        q = request.query
        rv_param = q.get("resourceVersion")
        try:
            timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout)
            requested = None if rv_param in (None, "", "0") else int(rv_param)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", "invalid timeoutSeconds or resourceVersion") from exc
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)

        async def send(event: Mapping[str, Any]) -> None:
            await resp.write(json.dumps(event).encode() + b"\n")

        if self._expire_watches > 0 or (requested is not None and requested < self._oldest_rv):
            if self._expire_watches > 0:
                self._expire_watches -= 1
            msg = f"too old resource version: {requested} ({self._oldest_rv})"
            with contextlib.suppress(ConnectionError):
                await send({"type": "ERROR", "object": status_object(410, "Expired", msg)})
                await resp.write_eof()
            return resp

        if requested is None:
            # Unset / "0": synthetic ADDED for the current state, then changes from now on.
            initial = [("ADDED", obj) for key, obj in sorted(self._pods.items()) if match(obj)]
        else:
            initial = [
                ev
                for c in self._history
                if c.rv > requested
                if (ev := self._filter_change(c, match)) is not None
            ]
        watcher = _Watcher(ns, match, _is_true(q.get("allowWatchBookmarks")))
        self._watchers.add(watcher)  # registered before any await: no change can slip between
        deadline = time.monotonic() + timeout
        try:
            for etype, obj in initial:
                await send({"type": etype, "object": obj})
            if requested is None and _is_true(q.get("sendInitialEvents")) and watcher.bookmarks:
                bm = self._bookmark()
                bm["object"]["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
                await send(bm)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if watcher.bookmarks:
                        await send(self._bookmark())
                    break
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    continue
                if item is _CLOSE:
                    break
                if item is _ABORT:
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if item is _BOOKMARK:
                    if watcher.bookmarks:
                        await send(self._bookmark())
                    continue
                filtered = self._filter_change(item, match)
                if filtered is not None:
                    await send({"type": filtered[0], "object": filtered[1]})
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away
        finally:
            self._watchers.discard(watcher)
        return resp

    # ------------------------------------------------------------------ nodes

    async def _list_nodes(self, request: web.Request) -> web.StreamResponse:
        try:
            fsel = parse_field_selector(request.query.get("fieldSelector"), NODE_FIELDS)
            lsel = parse_label_selector(request.query.get("labelSelector"))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        items = [n for _, n in sorted(self._nodes.items()) if fsel(n) and lsel(n)]
        return web.json_response(
            {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    async def _get_node(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        node = self._nodes.get(name)
        if node is None:
            raise ApiError(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
        return web.json_response(node)

    # ------------------------------------------------------------------ events

    @staticmethod
    def _resource_name(api: str) -> str:
        return "events.events.k8s.io" if api == ev_valid.EVENTS_V1 else "events"

    @staticmethod
    def _details(api: str, name: str, causes: list[dict[str, str]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "kind": "Event"}
        if api == ev_valid.EVENTS_V1:
            out["group"] = "events.k8s.io"
        if causes is not None:
            out["causes"] = causes
        return out

    def _invalid(self, api: str, name: str, causes: list[dict[str, str]]) -> ApiError:
        kind = "Event.events.k8s.io" if api == ev_valid.EVENTS_V1 else "Event"
        summary = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
        return ApiError(
            422, "Invalid", f'{kind} "{name}" is invalid: [{summary}]', self._details(api, name, causes)
        )

    def _not_found(self, api: str, name: str) -> ApiError:
        return ApiError(
            404, "NotFound", f'{self._resource_name(api)} "{name}" not found', self._details(api, name)
        )

    @staticmethod
    def _body_object(request_body: Any) -> dict[str, Any]:
        if not isinstance(request_body, dict):
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        return copy.deepcopy(request_body)

    async def _create_event(self, request: web.Request, api: str) -> web.StreamResponse:
        ns = request.match_info["ns"]
        try:
            body = self._body_object(json.loads(await request.read() or b"null"))
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON: {exc}") from exc
        if body.get("kind") not in (None, "Event") or body.get("apiVersion") not in (None, api):
            raise ApiError(
                400, "BadRequest", f"expected Event {api}, got {body.get('kind')} {body.get('apiVersion')}"
            )
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if meta.get("namespace") not in (None, "", ns):
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        meta["namespace"] = ns
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_SUFFIX_ALPHABET, k=5))
            else:
                cause = {
                    "reason": "FieldValueRequired",
                    "field": "metadata.name",
                    "message": "Required value: name or generateName is required",
                }
                raise self._invalid(api, "", [cause])
        causes = ev_valid.validate_create(body, api, ns)
        if causes:
            raise self._invalid(api, meta["name"], causes)
        store = self._events[api]
        if (ns, meta["name"]) in store:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{self._resource_name(api)} "{meta["name"]}" already exists',
                self._details(api, meta["name"]),
            )
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["resourceVersion"] = str(self._bump())
        body["kind"], body["apiVersion"] = "Event", api
        store[(ns, meta["name"])] = body
        return web.json_response(body, status=201)

    def _existing_event(self, request: web.Request, api: str) -> tuple[tuple[str, str], dict[str, Any]]:
        key = (request.match_info["ns"], request.match_info["name"])
        current = self._events[api].get(key)
        if current is None:
            raise self._not_found(api, key[1])
        return key, current

    def _store_update(self, api: str, key: tuple[str, str], old: dict, new: dict) -> web.StreamResponse:
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if meta.get("name", key[1]) != key[1] or meta.get("namespace", key[0]) != key[0]:
            raise ApiError(
                400, "BadRequest", "the name or namespace of the object does not match the request"
            )
        # Server-owned metadata survives any update.
        for field_name in ("name", "namespace", "uid", "creationTimestamp"):
            meta[field_name] = old["metadata"][field_name]
        causes = ev_valid.validate_update(new, old, api, key[0])
        if causes:
            raise self._invalid(api, key[1], causes)
        meta["resourceVersion"] = str(self._bump())
        new["kind"], new["apiVersion"] = "Event", api
        self._events[api][key] = new
        return web.json_response(new)

    async def _patch_event(self, request: web.Request, api: str) -> web.StreamResponse:
        key, current = self._existing_event(request, api)
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype not in PATCH_TYPES:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(sorted(PATCH_TYPES)),
            )
        try:
            patch = json.loads(await request.read() or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON patch: {exc}") from exc
        if ctype == "application/json-patch+json":
            new = json_patch(current, patch)
        else:
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            new = merge_patch(current, patch)
        return self._store_update(api, key, current, new)

    async def _put_event(self, request: web.Request, api: str) -> web.StreamResponse:
        key, current = self._existing_event(request, api)
        try:
            new = self._body_object(json.loads(await request.read() or b"null"))
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON: {exc}") from exc
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {self._resource_name(api)} "{key[1]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                self._details(api, key[1]),
            )
        return self._store_update(api, key, current, new)

    async def _get_event(self, request: web.Request, api: str) -> web.StreamResponse:
        _, current = self._existing_event(request, api)
        return web.json_response(current)

    async def _delete_event(self, request: web.Request, api: str) -> web.StreamResponse:
        key, _ = self._existing_event(request, api)
        del self._events[api][key]
        self._bump()
        return web.json_response(
            {**status_object(200, "", ""), "status": "Success", "details": self._details(api, key[1])}
        )

    async def _list_events(self, request: web.Request, api: str) -> web.StreamResponse:
        ns = request.match_info.get("ns")
        allowed = EVENTS_V1_FIELDS if api == ev_valid.EVENTS_V1 else CORE_EVENT_FIELDS
        try:
            fsel = parse_field_selector(request.query.get("fieldSelector"), allowed)
            lsel = parse_label_selector(request.query.get("labelSelector"))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        items = [
            e
            for (e_ns, _), e in sorted(self._events[api].items())
            if (ns is None or e_ns == ns) and fsel(e) and lsel(e)
        ]
        return web.json_response(
            {
                "kind": "EventList",
                "apiVersion": api,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )


def poll_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Call ``predicate`` until it returns something truthy; return that, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {result!r}")
        time.sleep(interval)
