"""DRA end to end with the real exporter: NVML on the fake library, ResourceSlices and ResourceClaims from
the Kubernetes API double, ``dynamic_resources`` from the pod-resources gRPC double (examples/dra-node.yaml)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.integration_support import EXAMPLES, exporter_node, load_scenario_dict

pytestmark = pytest.mark.e2e  # every test here builds the fake NVML library (gcc)

READY_S = 60.0  # a Python process importing the kubernetes client on a loaded 2-core box
SETTLE_S = 40.0
SCENARIO = load_scenario_dict(EXAMPLES / "dra-node.yaml")
G0, G2 = "GPU-d0000000-0000-4000-8000-000000000000", "GPU-d0000000-0000-4000-8000-000000000002"
M1 = "MIG-d1000000-0000-5000-8000-000000000001"
EXPECTED = {
    ("infer-mig-0", "server", M1, "exclusive", "dra"): 100.0,
    ("notebook-a", "jupyter", G2, "share", "dra-shared"): 50.0,
    ("notebook-b", "jupyter", G2, "share", "dra-shared"): 50.0,
    ("train-0", "trainer", G0, "exclusive", "dra"): 100.0,
}


def allocations(samples) -> dict:
    out = {}
    for (name, labels), v in samples.items():
        if name == "nvidia_gpu_allocated_compute_percent":
            lb = dict(labels)
            out[(lb["pod_name"], lb["container_name"], lb["uuid"], lb["allocate_mode"], lb["scheme"])] = v
    return out


def run(scenario: dict, tmp_path: Path, version: str = "v1") -> None:
    with exporter_node(scenario, tmp_path, api_setup=lambda api: api.serve_resource_versions(version)) as node:
        node.exporter.wait_ready(READY_S)
        got = node.exporter.wait_for(lambda s: allocations(s) == EXPECTED, SETTLE_S, "the DRA allocations")
        shares = sorted(dict(k[1])["pod_name"] for k in got
                        if k[0] == "nvidia_gpu_memory_used_bytes" and dict(k[1])["uuid"] == G2)
        assert shares == ["", "notebook-a", "notebook-b"]
        assert not [k for k in got if k[0] == "nvidia_gpu_unaccounted_process_memory_used_bytes"]
        slices = node.api.requests_to("GET", f"/apis/resource.k8s.io/{version}/resourceslices")
        assert slices and {r.query.get("fieldSelector") for r in slices} == {"spec.nodeName=dra-node-1"}


def test_1_34_kubelet_lists_dynamic_resources(tmp_path: Path):
    run(SCENARIO, tmp_path)


def test_1_33_kubelet_without_the_gate(tmp_path: Path):
    """No dynamic_resources, and resource.k8s.io/v1beta2 instead of v1: from the Pods and claims."""
    scenario = copy.deepcopy(SCENARIO)
    for p in scenario["pod_resources"]:
        for c in p["containers"]:
            del c["dynamic_resources"]
    for obj in scenario["resource_slices"] + scenario["resource_claims"]:
        obj["apiVersion"] = "resource.k8s.io/v1beta2"
    run(scenario, tmp_path, "v1beta2")


def test_1_35_share_id_through_the_grpc_double(tmp_path: Path):
    scenario = copy.deepcopy(SCENARIO)
    for p in scenario["pod_resources"]:
        for c in p["containers"]:
            for r in c["dynamic_resources"]:
                for cr in r["claim_resources"]:
                    cr["share_id"] = "7f3c1f9e-52c0-4c62-9a0d-3a8d2f3e0b11"
    run(scenario, tmp_path)
