"""The pod cache: raw Pod objects from list and watch -> immutable :class:`PodView` snapshots. No I/O.

The watcher (``exporter.node.pod_watcher``) and the simulated node both feed raw Pod dicts, exactly as
the API returns them (camelCase JSON), into :class:`PodStore`; attribution reads immutable
:class:`PodView` snapshots. A pod the parser cannot make sense of is skipped and counted by reason,
never raised out of the store.

Terminated pods (phase Succeeded/Failed) stay in the view until the API deletes them: their
processes can linger on a GPU for a while (a CUDA context being torn down, a zombie holding memory),
and attributing that memory to the pod is more useful than reporting an unknown process.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.model import EMPTY, ContainerInfo, PodInfo
from exporter.node.pods import MalformedPod, parse_pod


@dataclass(frozen=True, slots=True)
class PodView:
    """An immutable snapshot of the node's pods, indexed the ways attribution looks them up."""

    pods: Mapping[str, PodInfo] = field(default_factory=lambda: EMPTY)  # by pod UID
    by_container_id: Mapping[str, tuple[PodInfo, ContainerInfo]] = field(default_factory=lambda: EMPTY)
    by_name: Mapping[tuple[str, str], PodInfo] = field(default_factory=lambda: EMPTY)  # (namespace, name)
    resource_version: str = ""


EMPTY_VIEW = PodView()


def _build_view(pods: Mapping[str, PodInfo], resource_version: str) -> PodView:
    by_cid: dict[str, tuple[PodInfo, ContainerInfo]] = {}
    by_name: dict[tuple[str, str], PodInfo] = {}
    for pod in pods.values():  # insertion order = order of last change: newer wins on a clash
        by_name[(pod.namespace, pod.name)] = pod
        for c in pod.containers:
            if c.container_id:
                by_cid[c.container_id] = (pod, c)
    return PodView(
        pods=MappingProxyType(dict(pods)),
        by_container_id=MappingProxyType(by_cid),
        by_name=MappingProxyType(by_name),
        resource_version=resource_version,
    )


def _uid_and_key(obj: Any) -> tuple[str | None, tuple[str, str] | None]:
    """Whatever identity a (possibly malformed) object still has, to process a deletion."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None, None
    uid, name, ns = meta.get("uid"), meta.get("name"), meta.get("namespace")
    key = (ns, name) if isinstance(ns, str) and isinstance(name, str) else None
    return (uid.lower() if isinstance(uid, str) and uid else None), key


class PodStore:
    """The node's pods, fed by list (:meth:`replace`) and watch events (:meth:`apply`). Thread-safe.

    A malformed pod is skipped and counted in :meth:`skips` by reason; if an earlier version of it
    was good, that version is kept (its container IDs are still the best knowledge there is).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._resource_version = ""
        self._skips: Counter[str] = Counter()
        self._view: PodView | None = EMPTY_VIEW

    @property
    def resource_version(self) -> str:
        """The resourceVersion of the latest list or event applied."""
        with self._lock:
            return self._resource_version

    def replace(self, objs: Iterable[Any], resource_version: str) -> None:
        """Replace the whole content with a fresh list result."""
        pods: dict[str, PodInfo] = {}
        skips: Counter[str] = Counter()
        for obj in objs:
            try:
                pod, issues = parse_pod(obj)
            except MalformedPod as exc:
                skips[exc.reason] += 1
                continue
            skips.update(issues)
            pods[pod.uid] = pod
        with self._lock:
            self._pods = pods
            self._resource_version = resource_version if isinstance(resource_version, str) else ""
            self._skips.update(skips)
            self._view = None

    def apply(self, event_type: str, obj: Any) -> None:
        """Apply one watch event: ADDED, MODIFIED, DELETED, or BOOKMARK (resourceVersion only)."""
        rv = None
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if isinstance(meta, Mapping) and isinstance(meta.get("resourceVersion"), str):
            rv = meta["resourceVersion"]
        with self._lock:
            if rv and rv != self._resource_version:
                self._resource_version = rv
                self._view = None
            if event_type == "BOOKMARK":
                return
            if event_type == "DELETED":
                self._delete(obj)
                return
            if event_type not in ("ADDED", "MODIFIED"):
                self._skips["unknown_event_type"] += 1
                return
            try:
                pod, issues = parse_pod(obj)
            except MalformedPod as exc:
                self._skips[exc.reason] += 1
                return
            self._skips.update(issues)
            self._pods.pop(pod.uid, None)  # re-insert: dict order tracks recency for by_name
            self._pods[pod.uid] = pod
            self._view = None

    def _delete(self, obj: Any) -> None:
        uid, key = _uid_and_key(obj)
        if uid is None and key is not None:
            uid = next((p.uid for p in self._pods.values() if (p.namespace, p.name) == key), None)
        if uid is None:
            self._skips["missing_uid"] += 1
            return
        if self._pods.pop(uid, None) is not None:
            self._view = None

    def skips(self) -> Mapping[str, int]:
        """Cumulative count of skipped pods and ignored fields, by reason."""
        with self._lock:
            return MappingProxyType(dict(self._skips))

    def view(self) -> PodView:
        """The current immutable snapshot (rebuilt only after a change)."""
        with self._lock:
            if self._view is None:
                self._view = _build_view(self._pods, self._resource_version)
            return self._view
