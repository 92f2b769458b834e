"""The attacks of hostile tenants against the real exporter: real NVML backend on the fake library,
pods from the Kubernetes API double, a kubelet pod-resources server.

The honest node (examples/mixed-4gpu-node.yaml) must come out row for row as the simulated node
says, with the hostile pods on the same node, and the process must stay small and keep sampling.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration_support import (
    EXAMPLES,
    exporter_node,
    load_scenario_dict,
    parse_exposition,
    render_simulated,
    seed_rows,
    select,
    value,
)
from tests.k8s_double.objects import make_container, make_pod

pytestmark = pytest.mark.e2e  # every test here starts python

READY_S = 30.0
SETTLE_S = 20.0
MIXED = EXAMPLES / "mixed-4gpu-node.yaml"
HUGE = "9" * 400


def hostile_pods(node: str, held_gpu: str) -> list[dict]:
    """The review's attacks: each froze, grew or falsified the exporter for the whole node."""
    return [
        # no GPU request, a 400-digit HAMi annotation: OverflowError in every cycle
        make_pod("overflow", namespace="tenant", node=node,
                 annotations={"hami.io/vgpu-devices-allocated": f"{held_gpu},NVIDIA,{HUGE},{HUGE}:;"}),
        # a Pending pod asking for 1e11 GPUs: one allocation object each, 1.1 GB in 26 s
        make_pod("greedy", namespace="tenant", node=node, phase="Pending", started=False,
                 containers=[make_container("main", limits={"nvidia.com/gpu": "100000000000"})]),
        # inf in a gpushare annotation
        make_pod("infinite", namespace="tenant", node=node,
                 containers=[make_container("main", limits={"aliyun.com/gpu-mem": "4"})],
                 annotations={"scheduler.framework.gpushare.allocation": '{"0": {"0": Infinity}}'}),
        # no GPU request, a HAMi annotation naming a GPU another pod holds whole: 90 % and 70 GB "allocated"
        make_pod("thief", namespace="tenant", node=node,
                 annotations={"hami.io/vgpu-devices-allocated": f"{held_gpu},NVIDIA,70000,90:;"}),
    ]


TENANTS = {"overflow", "greedy", "infinite", "thief"}


def honest(rows: dict) -> dict:
    """The rows of everyone but the tenants (a tenant that requests a scheme's memory keeps its own row)."""
    return {k: v for k, v in seed_rows(rows).items() if dict(k[1]).get("pod_name") not in TENANTS}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_hostile_tenants_neither_freeze_nor_grow_nor_falsify_the_exporter(tmp_path: Path) -> None:
    scenario = load_scenario_dict(MIXED)
    want = seed_rows(parse_exposition(render_simulated(MIXED)))
    held = scenario["devices"][0]["uuid"]  # the trainer holds GPU 0 whole (pod-resources says so)
    pods = [*scenario["pods"], *hostile_pods(scenario["node"], held)]
    with exporter_node(scenario, tmp_path, api_pods=pods) as node:
        node.exporter.wait_ready(READY_S)
        got = node.exporter.wait_for(lambda s: honest(s) == want, SETTLE_S, "the honest rows as simulated")
        # it keeps sampling (no frozen snapshot) and no cycle failed
        first = value(got, "kube_gpu_exporter_samples_total") or 0
        later = node.exporter.wait_for(lambda s: (value(s, "kube_gpu_exporter_samples_total") or 0) > first + 5,
                                       SETTLE_S, "more cycles")
        assert value(later, "kube_gpu_exporter_sample_failures_total") == 0
        skips = {dict(k[1])["reason"]: v for k, v in select(later, "kube_gpu_exporter_skips_total").items()}
        assert skips.get("annotation_without_request", 0) >= 2  # overflow and thief, counted, not used
        assert skips.get("quantity_out_of_range", 0) >= 1  # greedy
        assert skips.get("malformed_gpushare_annotation", 0) >= 1  # infinite
        # GPU 0 stays the trainer's alone
        modes = {dict(k[1])["allocate_mode"] for k in select(later, "nvidia_gpu_memory_used_bytes", uuid=held)}
        assert modes == {"exclusive"}
        assert not select(later, "nvidia_gpu_allocated_compute_percent", pod_name="thief")
        assert rss_mib(node.exporter.pid) < 200, "the process grew"
        assert "Traceback" not in node.exporter.output()
