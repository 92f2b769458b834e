"""DRA end to end through the simulated node (examples/dra-node.yaml): 1.34+, 1.33 without the gate, 1.35."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter.node.simulate import ScenarioError, parse_scenario
from tests.simulated import render_doc

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "dra-node.yaml"
G0, G2 = "GPU-d0000000-0000-4000-8000-000000000000", "GPU-d0000000-0000-4000-8000-000000000002"
M1 = "MIG-d1000000-0000-5000-8000-000000000001"




def allocations(m: dict) -> list[tuple]:
    return sorted((lb["pod_name"], lb["container_name"], lb["uuid"], lb["allocate_mode"], lb["scheme"], v)
                  for lb, v in m["nvidia_gpu_allocated_compute_percent"])


EXPECTED = [
    ("infer-mig-0", "server", M1, "exclusive", "dra", 100.0),
    ("notebook-a", "jupyter", G2, "share", "dra-shared", 50.0),
    ("notebook-b", "jupyter", G2, "share", "dra-shared", 50.0),
    ("train-0", "trainer", G0, "exclusive", "dra", 100.0),
]


def check(m: dict) -> None:
    assert allocations(m) == EXPECTED
    rows = sorted((lb["uuid"], lb["allocate_mode"], lb["pod_name"]) for lb, _ in m["nvidia_gpu_memory_used_bytes"])
    assert (G0, "exclusive", "train-0") in rows and (M1, "exclusive", "infer-mig-0") in rows
    assert [r for r in rows if r[0] == G2] == [(G2, "None", ""), (G2, "share", "notebook-a"),
                                               (G2, "share", "notebook-b")]
    assert "nvidia_gpu_unaccounted_process_memory_used_bytes" not in m  # no DRA holder's process is unaccounted
    mem = {(lb["pod_name"], lb["scheme"]): v for lb, v in m["nvidia_gpu_allocated_memory_bytes"]}
    assert mem[("notebook-a", "dra-shared")] == mem[("notebook-b", "dra-shared")] == 20 * 2**30
    assert all(lb["reason"].startswith("dra_") is False for lb, _ in m.get("kube_gpu_exporter_skips_total", []))


def doc() -> dict:
    return yaml.safe_load(SCENARIO.read_text())


def test_1_34_kubelet_lists_the_claims(tmp_path: Path):
    check(render_doc(doc(), tmp_path))


def test_1_33_without_the_gate_from_pods_and_claims(tmp_path: Path):
    d = doc()
    for p in d["pod_resources"]:
        for c in p["containers"]:
            del c["dynamic_resources"]
    check(render_doc(d, tmp_path))
    del d["pod_resources"]  # no pod-resources socket at all
    check(render_doc(d, tmp_path))


def test_1_35_share_id_changes_nothing(tmp_path: Path):
    d = doc()
    for p in d["pod_resources"]:
        for c in p["containers"]:
            for r in c["dynamic_resources"]:
                for cr in r["claim_resources"]:
                    cr["share_id"] = "7f3c1f9e-52c0-4c62-9a0d-3a8d2f3e0b11"
    check(render_doc(d, tmp_path))


def test_two_containers_of_one_pod_naming_one_claim_share_its_grant(tmp_path: Path):
    d = doc()
    train = d["pods"][0]
    train["spec"]["containers"].append({"name": "logger", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}})
    train["status"]["containerStatuses"].append({"name": "logger", "containerID": "containerd://" + "6" * 64})
    d["pod_resources"][0]["containers"].append({"name": "logger",
                                                "dynamic_resources": d["pod_resources"][0]["containers"][0][
                                                    "dynamic_resources"]})
    cgroup = d["devices"][0]["processes"][0]["cgroup"].replace("1" * 64, "6" * 64)
    d["devices"][0]["processes"].append({"pid": 8006, "used_memory_bytes": 1 << 30, "sm_util": 5, "cgroup": cgroup})
    m = render_doc(d, tmp_path)
    got = [a for a in allocations(m) if a[0] == "train-0"]
    assert got == [("train-0", "logger", G0, "share", "dra-shared", 50.0),
                   ("train-0", "trainer", G0, "share", "dra-shared", 50.0)]
    assert "nvidia_gpu_unaccounted_process_memory_used_bytes" not in m


def test_bad_dra_input_is_counted_not_fatal(tmp_path: Path):
    d = doc()
    d["resource_slices"][0]["spec"]["devices"][2]["attributes"] = {"type": {"string": "gpu"}}  # gpu-2 unidentified
    d["resource_claims"][0]["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-7"  # on no slice
    d["pod_resources"][0]["containers"][0]["dynamic_resources"][0]["claim_resources"][0]["device_name"] = "gpu-7"
    m = render_doc(d, tmp_path)
    skips = {lb["reason"]: v for lb, v in m["kube_gpu_exporter_skips_total"]}
    assert skips["dra_device_attributes_unknown"] == 1 and skips["dra_device_unmapped"] == 3
    assert allocations(m) == [EXPECTED[0]]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(resource_slices={"a": 1}), "resource_slices"),
    (lambda d: d["pod_resources"][0]["containers"][0]["dynamic_resources"][0].update(claim_name=3), "claim_name"),
    (lambda d: d["pod_resources"][0]["containers"][0].update(dynamic_resources="x"), "dynamic_resources"),
])
def test_broken_dra_scenario_keys_are_named(mutate, message):
    d = doc()
    mutate(d)
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(d)
