"""examples/dra-sharing-node.yaml end to end: MPS and time-slicing configured in a DRA claim, and nvidia.com/gpu
served by DRA (status.extendedResourceClaimStatus), from the API objects (1.33) and from the kubelet (1.34+)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from tests.simulated import render_doc

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "dra-sharing-node.yaml"
G0, G1, G2 = (f"GPU-d5a00000-0000-4000-8000-00000000000{i}" for i in range(3))
GIB = 1 << 30




def rows(m: dict, name: str) -> list[tuple]:
    return sorted((lb["pod_name"], lb["container_name"], lb["uuid"], lb["allocate_mode"], lb["scheme"], v)
                  for lb, v in m.get(name, []))


def check(m: dict) -> None:
    assert rows(m, "nvidia_gpu_allocated_compute_percent") == [
        ("gpu-full-pod", "cuda-container", G2, "exclusive", "dra", 100.0),
        ("pod0", "mps-ctr0", G1, "share", "dra-mps", 50.0),
        ("pod0", "mps-ctr1", G1, "share", "dra-mps", 50.0),
    ]  # the time-sliced containers are granted no compute: no row
    assert rows(m, "nvidia_gpu_allocated_memory_bytes") == [
        ("gpu-full-pod", "cuda-container", G2, "exclusive", "dra", 40.0 * GIB),
        ("pod0", "mps-ctr0", G1, "share", "dra-mps", 10.0 * GIB),
        ("pod0", "mps-ctr1", G1, "share", "dra-mps", 10.0 * GIB),
    ]
    used = sorted((lb["uuid"], lb["allocate_mode"], lb["container_name"]) for lb, _ in m["nvidia_gpu_memory_used_bytes"]
                  if lb["pod_name"])
    assert used == [(G0, "share", "ts-ctr0"), (G0, "share", "ts-ctr1"), (G1, "share", "mps-ctr0"),
                    (G1, "share", "mps-ctr1"), (G2, "exclusive", "cuda-container")]
    assert "nvidia_gpu_unaccounted_process_memory_used_bytes" not in m
    assert m.get("kube_gpu_exporter_skips_total", []) == []


def doc() -> dict:
    return yaml.safe_load(SCENARIO.read_text())


def test_from_pods_claims_and_slices(tmp_path: Path) -> None:
    check(render_doc(doc(), tmp_path))


def test_kubelet_lists_the_claims(tmp_path: Path) -> None:
    d = doc()
    pod0, full = d["pods"]

    def entry(p: dict, claim: str, devices: list[str]) -> dict:
        return {"claim_name": claim, "claim_namespace": p["metadata"]["namespace"], "claim_resources": [
            {"driver_name": "gpu.nvidia.com", "pool_name": d["node"], "device_name": dev} for dev in devices]}

    shared = [entry(pod0, "pod0-shared-gpus-v5d8r", ["gpu-0", "gpu-1"])]  # the kubelet lists the whole claim
    d["pod_resources"] = [
        {"name": "pod0", "namespace": "gpu-test5",
         "containers": [{"name": c["name"], "dynamic_resources": copy.deepcopy(shared)}
                        for c in pod0["spec"]["containers"]]},
        {"name": "gpu-full-pod", "namespace": "extended-resource-gpu-full",
         "containers": [{"name": "cuda-container",
                         "dynamic_resources": [entry(full, "gpu-full-pod-extended-resources-x7k9m", ["gpu-2"])]}]},
    ]
    check(render_doc(d, tmp_path))


def test_before_the_fix_the_device_plugin_would_have_claimed_it(tmp_path: Path) -> None:
    """Without its extendedResourceClaimStatus the pod is a device plugin's, unplaced: the status decides."""
    d = doc()
    del d["pods"][1]["status"]["extendedResourceClaimStatus"]
    m = render_doc(d, tmp_path)
    assert ("gpu-full-pod", "cuda-container", G2, "exclusive", "nvidia", 100.0) in rows(
        m, "nvidia_gpu_allocated_compute_percent")
