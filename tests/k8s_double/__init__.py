"""Kubernetes API server double for tests: the real ``kubernetes`` client talks to it over HTTP.

Typical use from a synchronous test::

    with ApiServerDouble() as api:
        api.add_pod(make_pod("p1", node="gpu-node-1"))
        client = api_client_for(api)          # kubernetes.client.ApiClient pointed at the double
        ...
        api.go_offline(); api.come_back()     # outage
        api.expire_next_watch()               # 410 Gone on the next watch
"""

from __future__ import annotations

from kubernetes import client as _k8s

from .events_validation import CORE_V1, EVENTS_V1
from .objects import container_id, make_container, make_node, make_pod, now_micro, now_rfc3339
from .server import ApiServerDouble, RecordedRequest, merge_patch, poll_until, status_object


def api_client_for(api: ApiServerDouble) -> _k8s.ApiClient:
    """A real ``ApiClient`` for the double (plain HTTP, no auth, no retries so faults surface)."""
    cfg = _k8s.Configuration()
    cfg.host = api.url
    cfg.retries = False
    return _k8s.ApiClient(cfg)


__all__ = [
    "CORE_V1",
    "EVENTS_V1",
    "ApiServerDouble",
    "RecordedRequest",
    "api_client_for",
    "container_id",
    "make_container",
    "make_node",
    "make_pod",
    "merge_patch",
    "now_micro",
    "now_rfc3339",
    "poll_until",
    "status_object",
]
