"""DRA sources: this node's ResourceSlices, the ResourceClaims of its pods, and the pods' claim references.

The objects are kept raw (as the API returns them) and parsed by attribution every cycle, which
counts what is malformed. Slices are listed and watched with ``spec.nodeName=<node>`` (every node
reuses the same device names); a claim is read by name, for the claims this node's pods reference
(at most ``max_claims`` a pod), when a pod names it and then slowly again, as
:mod:`exporter.node.claim_cache` decides: so the exporter needs ``get`` on resourceclaims and
``list``/``watch`` on resourceslices, nothing cluster-wide beyond that. Every call goes through the
client's shared rate limit. The last good answer is kept while the API is down.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from exporter.attribution.dra_objects import MAX_POD_CLAIMS, PodClaims, parse_pod_claims
from exporter.node import claim_cache
from exporter.node.claim_cache import Entry, Key, Policy
from exporter.node.pod_store import PodStore

if TYPE_CHECKING:  # the client is loaded only where the API is used
    from exporter.node.kube_api import KubeApi

log = logging.getLogger(__name__)
_VERSIONS = ("v1", "v1beta2", "v1beta1")  # of resource.k8s.io, newest first


@dataclass(frozen=True, slots=True)
class DraSources:
    """What the pipeline reads each cycle (all empty: no DRA on this node, or nothing to read it from)."""

    resource_slices: Callable[[], Sequence[Any]] = tuple
    resource_claims: Callable[[], Sequence[Any]] = tuple
    pod_claims: Callable[[], Mapping[str, PodClaims]] = field(default=dict)


NO_DRA = DraSources()


class ClaimAwarePodStore(PodStore):
    """A :class:`PodStore` that also keeps each pod's DRA claim references (the pod parser drops them)."""

    def __init__(self, max_claims: int = MAX_POD_CLAIMS) -> None:
        super().__init__()
        self._claims: Mapping[str, PodClaims] = {}
        self._max_claims = max_claims  # claims followed per pod (--dra-max-claims-per-pod)

    def replace(self, objs: Iterable[Any], resource_version: str) -> None:
        objs = list(objs)
        super().replace(objs, resource_version)
        skips: Counter[str] = Counter()
        parsed = (parse_pod_claims(o, lambda r: skips.update((r,)), self._max_claims) for o in objs)
        claims = {pc.uid: pc for pc in parsed if pc is not None}
        with self._lock:
            self._claims = claims
            self._skips.update(skips)

    def apply(self, event_type: str, obj: Any) -> None:
        super().apply(event_type, obj)
        skips: Counter[str] = Counter()
        pc = (parse_pod_claims(obj, lambda r: skips.update((r,)), self._max_claims)
              if event_type in ("ADDED", "MODIFIED") else None)
        uid = _uid(obj)
        with self._lock:
            self._skips.update(skips)
            if uid is None or event_type not in ("ADDED", "MODIFIED", "DELETED"):
                return
            claims = dict(self._claims)  # copy on write: a reader keeps the mapping it got
            claims.pop(uid, None)
            if pc is not None:
                claims[uid] = pc
            self._claims = claims

    def pod_claims(self) -> Mapping[str, PodClaims]:
        return self._claims


def _uid(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid.lower() if isinstance(uid, str) and uid else None


def static_dra(slices: Sequence[Any], claims: Sequence[Any], pods: Sequence[Any]) -> DraSources:
    """A simulated node's DRA objects, fixed for its lifetime."""
    store = ClaimAwarePodStore()
    store.replace(pods, "1")
    pod_claims = store.pod_claims()
    slices, claims = tuple(slices), tuple(claims)
    return DraSources(lambda: slices, lambda: claims, lambda: pod_claims)


class DraWatcher:
    """Lists and watches this node's ResourceSlices; reads the claims its pods name as :mod:`claim_cache` plans."""

    def __init__(self, node: str, api_client: KubeApi, pod_claims: Callable[[], Mapping[str, PodClaims]], *,
                 policy: Policy | None = None, tick: float = 1.0, watch_timeout_seconds: int = 300,
                 request_timeout: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._node, self._api, self._pod_claims = node, api_client, pod_claims
        self._policy, self._tick, self._clock = policy or Policy(), tick, clock
        self._watch_timeout, self._timeout = watch_timeout_seconds, request_timeout
        self._slices: dict[str, Any] = {}
        self._claims: tuple[Any, ...] = ()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._response: Any = None  # the slice watch in flight, shut down by stop()
        self._version = 0  # index in _VERSIONS, moved on by the slice lister when the server lacks one
        self._version_known = threading.Event()  # set once the slice lister found (or gave up on) a version

    def sources(self) -> DraSources:
        return DraSources(lambda: tuple(self._slices.values()), lambda: self._claims, self._pod_claims)

    def start(self) -> None:
        for target, name in ((self._watch_slices, "dra-slices"), (self._read_claims, "dra-claims")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        resp = self._response
        if resp is not None:
            resp.shutdown()  # unblocks the watch read, unlike close()
        for t in self._threads:
            t.join(timeout)

    def _base(self) -> str:
        """The resource.k8s.io API of the version the server serves (v1 from 1.34; 1.33 has v1beta2)."""
        return f"/apis/resource.k8s.io/{_VERSIONS[self._version]}"

    def _watch_slices(self) -> None:
        selector = f"spec.nodeName={self._node}"
        while not self._stop.is_set():
            path = f"{self._base()}/resourceslices"
            try:
                try:
                    body = self._api.get(path, {"fieldSelector": selector}, timeout=self._timeout)
                except Exception as e:
                    if getattr(e, "status", None) == 404 and self._version + 1 < len(_VERSIONS):
                        self._version += 1  # an older server: its beta API has the same fields
                        continue
                    raise
                self._slices = {_key(o): o for o in body.get("items") or [] if isinstance(o, Mapping)}
                self._version_known.set()
                resp = self._api.watch(
                    path, {"fieldSelector": selector, "allowWatchBookmarks": True,
                           "resourceVersion": body.get("metadata", {}).get("resourceVersion", ""),
                           "timeoutSeconds": self._watch_timeout},
                    connect_timeout=self._timeout, read_timeout=self._watch_timeout + self._timeout)
                self._response = resp
                try:
                    for event in resp.events():
                        if self._stop.is_set() or not self._apply(event):
                            break
                finally:
                    self._response = None
                    resp.close()
            except Exception as e:  # keep the last answer: the API may be down, or serve no resource.k8s.io/v1
                if self._stop.is_set():
                    break  # stop() closed the watch under us
                log.warning("cannot list/watch the ResourceSlices of %s: %s", self._node, e)
                self._version_known.set()  # claims are read all the same (their errors back off)
                self._stop.wait(30.0)

    def _apply(self, event: Any) -> bool:
        """One watch event; False when the watch must be restarted (an ERROR event, e.g. 410 Gone)."""
        etype, obj = event.get("type"), event.get("object")
        if etype == "ERROR" or not isinstance(obj, Mapping):
            return False
        slices = dict(self._slices)
        if etype == "DELETED":
            slices.pop(_key(obj), None)
        elif etype in ("ADDED", "MODIFIED"):
            slices[_key(obj)] = obj
        self._slices = slices
        return True

    def _read_claims(self) -> None:
        state = claim_cache.START
        # A claim read under a version the server lacks would be a 404, remembered as a missing claim.
        while not self._version_known.wait(self._tick):
            if self._stop.is_set():
                return
        failing = ""  # the reader's own failure, logged once until it changes
        while not self._stop.is_set():
            try:
                state, reads = claim_cache.step(state, self._pod_claims(), self._clock(), self._policy)
                for key, consistent in reads:
                    if self._stop.is_set():
                        return
                    state = claim_cache.record(state, key, self._read(key, state.entries.get(key), consistent))
                    # each answer at once: at start a node's claims come at the rate limit's pace
                    self._claims = claim_cache.published(state.entries, state.wanted)
                self._claims = claim_cache.published(state.entries, state.wanted)  # a claim no pod names goes
                failing = ""
            except Exception as e:  # a bug here must not end the thread: the last published claims stay
                if repr(e) != failing:
                    log.exception("the ResourceClaim reader failed; going on")
                failing = repr(e)
            self._stop.wait(self._tick)

    def _read(self, key: Key, prev: Entry | None, consistent: bool) -> Entry:
        """One claim read: a pod change reads the claim as it is now, a resync from the server's cache."""
        ns, name = key
        path = f"{self._base()}/namespaces/{quote(ns, safe='')}/resourceclaims/{quote(name, safe='')}"
        obj, status = None, None
        try:
            obj = self._api.get(path, None if consistent else {"resourceVersion": "0"}, timeout=self._timeout)
        except Exception as e:
            status = getattr(e, "status", None) or 0
            if status != 404:  # 404: not created yet, or deleted with its pod; remembered with a backoff
                log.warning("cannot read ResourceClaim %s/%s: %s", ns, name, e)
        return claim_cache.after_read(prev, obj, status, self._clock(), self._policy, random.uniform(0.8, 1.2))


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else repr(id(obj))
