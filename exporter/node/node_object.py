"""This node's Node object: the labels and capacity that sharing schemes read, refreshed slowly.

Labels announce sharing (``nvidia.com/gpu.sharing-strategy``, GKE's sharing labels); capacity
tells the units of some schemes (gpushare's ``aliyun.com/gpu-mem`` in GiB or MiB). Both change
rarely, so one read every few minutes is enough; the last good answer is kept while the API is down.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def _strings(value: Any) -> Mapping[str, str]:
    """A label or capacity map with string keys and values only (the client may hand back None)."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


class NodeObject(threading.Thread):
    """Reads the node's labels and capacity every ``refresh`` seconds on a daemon thread."""

    def __init__(self, node: str, api_client: Any, refresh: float = 300.0) -> None:
        super().__init__(name="node-labels", daemon=True)
        self._node, self._api, self._refresh = node, api_client, refresh
        self._labels: Mapping[str, str] = {}
        self._capacity: Mapping[str, str] = {}
        self._stop_event = threading.Event()

    def labels(self) -> Mapping[str, str]:
        return self._labels

    def capacity(self) -> Mapping[str, str]:
        return self._capacity

    def run(self) -> None:
        from kubernetes import client

        api = client.CoreV1Api(self._api)
        while not self._stop_event.is_set():
            try:
                node = api.read_node(self._node, _request_timeout=10)
                self._labels = _strings(node.metadata.labels)
                self._capacity = _strings(node.status.capacity if node.status is not None else None)
                wait = self._refresh
            except Exception as e:  # keep the last answer; the API may be down
                log.warning("cannot read node %s: %s", self._node, e)
                wait = 30.0
            self._stop_event.wait(wait)

    def stop(self) -> None:
        self._stop_event.set()
