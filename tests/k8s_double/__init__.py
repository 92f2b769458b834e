"""Kubernetes API server double for tests: the real ``kubernetes`` client and the exporter's own
(``exporter.node.kube_api``) talk to it over HTTP, and it checks their requests as the API server does.

Typical use from a synchronous test::

    with ApiServerDouble() as api:
        api.add_pod(make_pod("p1", node="gpu-node-1"))
        client = api_client_for(api)          # kubernetes.client.ApiClient pointed at the double
        kube = kube_api_for(api)              # the exporter's KubeApi pointed at the double
        ...
        api.go_offline(); api.come_back()     # outage
        api.expire_next_watch()               # 410 Gone on the next watch
"""

from __future__ import annotations

from kubernetes import client as _k8s

from exporter.node.kube_api import KubeApi

from .events_validation import CORE_V1, EVENTS_V1
from .objects import container_id, make_container, make_node, make_pod, now_micro, now_rfc3339
from .server import ApiServerDouble, RecordedRequest, merge_patch, poll_until, status_object


def api_client_for(api: ApiServerDouble) -> _k8s.ApiClient:
    """A real ``ApiClient`` for the double (plain HTTP, no auth, no retries so faults surface)."""
    cfg = _k8s.Configuration()
    cfg.host = api.url
    cfg.retries = False
    return _k8s.ApiClient(cfg)


def kube_api_for(api: ApiServerDouble) -> KubeApi:
    """The exporter's own API client for the double (plain HTTP, no auth)."""
    return KubeApi(api.url)


__all__ = [
    "CORE_V1",
    "EVENTS_V1",
    "ApiServerDouble",
    "RecordedRequest",
    "api_client_for",
    "container_id",
    "kube_api_for",
    "make_container",
    "make_node",
    "make_pod",
    "merge_patch",
    "now_micro",
    "now_rfc3339",
    "poll_until",
    "status_object",
]
