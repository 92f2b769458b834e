"""exporter.node.node_object: the Node's labels and capacity through the exporter's API client, on the API double."""

from __future__ import annotations

import pytest

from exporter.node.node_object import NodeObject
from tests.k8s_double import ApiServerDouble, kube_api_for, poll_until
from tests.k8s_double.objects import make_node

pytestmark = pytest.mark.e2e  # every test here starts a server, builds the fake NVML library (gcc)


def test_labels_and_capacity_are_read(double: ApiServerDouble) -> None:
    double.set_nodes([make_node("gpu-1", labels={"nvidia.com/gpu.sharing-strategy": "mps"},
                                capacity={"aliyun.com/gpu-mem": "30218", "aliyun.com/gpu-count": "2"})])
    node = NodeObject("gpu-1", kube_api_for(double))
    node.start()
    try:
        poll_until(lambda: node.capacity(), what="capacity read")
        assert node.capacity() == {"aliyun.com/gpu-mem": "30218", "aliyun.com/gpu-count": "2"}
        assert node.labels()["nvidia.com/gpu.sharing-strategy"] == "mps"
    finally:
        node.stop()


def test_missing_node_keeps_empty_answers_and_the_thread_alive(double: ApiServerDouble) -> None:
    node = NodeObject("absent", kube_api_for(double))
    node.start()
    try:
        poll_until(lambda: double.requests_to("GET", "/api/v1/nodes/absent"), what="a read")
        assert node.labels() == {} and node.capacity() == {}
        assert node.is_alive()
    finally:
        node.stop()
