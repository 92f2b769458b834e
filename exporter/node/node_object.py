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
from urllib.parse import quote

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
        while not self._stop_event.is_set():
            try:
                node = self._api.get(f"/api/v1/nodes/{quote(self._node, safe='')}", timeout=10)
                if not isinstance(node, Mapping):
                    raise ValueError("the Node is not an object")
                meta, status = node.get("metadata"), node.get("status")
                self._labels = _strings(meta.get("labels") if isinstance(meta, Mapping) else None)
                self._capacity = _strings(status.get("capacity") if isinstance(status, Mapping) else None)
                wait = self._refresh
            except Exception as e:  # keep the last answer; the API may be down
                log.warning("cannot read node %s: %s", self._node, e)
                wait = 30.0
            self._stop_event.wait(wait)

    def stop(self) -> None:
        self._stop_event.set()
