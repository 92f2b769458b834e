"""The DaemonSet's default node affinity against the GPU nodes of each managed cloud, and a CPU node.

The chart is rendered with real Helm (helm-python-sdk, tests/test_helm.py); ``admits`` evaluates its
required node affinity as the Kubernetes scheduler does (``nodeSelectorTerms`` ORed, the expressions of
a term ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt; k8s.io/component-helpers
``scheduling/corev1/nodeaffinity``), together with ``nodeSelector``. The node label sets are what each
cloud puts on its nodes without the GPU operator (the sources in values.yaml's comments).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.test_helm import notes, one, render

Labels = dict[str, str]


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_matches(req: dict[str, Any], labels: Labels) -> bool:
    """One NodeSelectorRequirement against a node's labels."""
    key, op, values = req["key"], req["operator"], req.get("values", [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        # exactly one value, an integer; the label's value must parse as one too
        if not present or len(values) != 1 or _int(values[0]) is None or _int(labels[key]) is None:
            return False
        node, bound = _int(labels[key]), _int(values[0])
        return node > bound if op == "Gt" else node < bound
    raise ValueError(f"unknown operator {op!r}")


def term_matches(term: dict[str, Any], labels: Labels) -> bool:
    """A NodeSelectorTerm: every expression holds; an empty term matches no node."""
    exprs = term.get("matchExpressions") or []
    assert not term.get("matchFields"), "matchFields: not evaluated (the chart renders none)"
    return bool(exprs) and all(requirement_matches(r, labels) for r in exprs)


def admits(pod: dict[str, Any], labels: Labels) -> bool:
    """Whether the pod spec's nodeSelector and required node affinity admit a node with ``labels``."""
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = (pod.get("affinity") or {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(term_matches(t, labels) for t in required["nodeSelectorTerms"])


# --- the evaluator itself -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "values", "labels", "expected"),
    [
        ("In", ["a", "b"], {"k": "b"}, True),
        ("In", ["a"], {"k": "c"}, False),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {"k": "c"}, True),
        ("NotIn", ["a"], {}, True),
        ("NotIn", ["a"], {"k": "a"}, False),
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {}, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", [], {"k": "x"}, False),
        ("Gt", ["4"], {"k": "5"}, True),
        ("Gt", ["5"], {"k": "5"}, False),
        ("Gt", ["4"], {"k": "five"}, False),
        ("Gt", ["4"], {}, False),
        ("Lt", ["4"], {"k": "3"}, True),
        ("Lt", ["4"], {"k": "4"}, False),
        ("Lt", ["x"], {"k": "3"}, False),
    ],
)
def test_requirement_operators(op: str, values: list[str], labels: Labels, expected: bool) -> None:
    assert requirement_matches({"key": "k", "operator": op, "values": values}, labels) is expected


def test_terms_are_ored_and_expressions_anded() -> None:
    a = {"key": "a", "operator": "Exists"}
    b = {"key": "b", "operator": "Exists"}
    pod = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [a, b]},
                        {"matchExpressions": [{"key": "c", "operator": "Exists"}]},
                    ]
                }
            }
        }
    }
    assert admits(pod, {"a": "", "b": ""}) and admits(pod, {"c": ""})
    assert not admits(pod, {"a": ""}) and not admits(pod, {})
    assert not term_matches({"matchExpressions": []}, {"a": ""})  # an empty term matches nothing
    assert not admits({**pod, "nodeSelector": {"zone": "x"}}, {"c": ""})  # nodeSelector ANDs with it


@given(
    st.dictionaries(st.sampled_from("abc"), st.sampled_from(["", "1", "x"])),
    st.sampled_from("abc"),
    st.lists(st.sampled_from(["", "1", "x"]), max_size=2),
)
def test_notin_is_the_negation_of_in_and_doesnotexist_of_exists(labels: Labels, key: str, values: list[str]) -> None:
    def req(op: str) -> dict[str, Any]:
        return {"key": key, "operator": op, "values": values}

    assert requirement_matches(req("NotIn"), labels) is not requirement_matches(req("In"), labels)
    assert requirement_matches(req("DoesNotExist"), labels) is not requirement_matches(req("Exists"), labels)


# --- the chart's default against each cloud's nodes -----------------------------------------------------

COMMON = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}
# GPU nodes as each platform labels them without the GPU operator, GPU feature discovery or NFD.
GPU_NODES: dict[str, Labels] = {
    "GKE (Standard, GKE-managed driver)": {
        **COMMON,
        "cloud.google.com/gke-nodepool": "gpu-pool",
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "node.kubernetes.io/instance-type": "g2-standard-8",
    },
    "EKS with Karpenter": {
        **COMMON,
        "karpenter.sh/nodepool": "gpu",
        "karpenter.k8s.aws/instance-gpu-name": "l4",
        "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
        "karpenter.k8s.aws/instance-gpu-count": "1",
        "node.kubernetes.io/instance-type": "g6.xlarge",
    },
    "EKS Auto Mode": {
        **COMMON,
        "eks.amazonaws.com/compute-type": "auto",
        "eks.amazonaws.com/instance-gpu-name": "a10g",
        "eks.amazonaws.com/instance-gpu-manufacturer": "nvidia",
        "eks.amazonaws.com/instance-gpu-count": "1",
        "node.kubernetes.io/instance-type": "g5.xlarge",
    },
    "AKS GPU node pool": {
        **COMMON,
        "kubernetes.azure.com/agentpool": "gpunp",
        "kubernetes.azure.com/mode": "user",
        "kubernetes.azure.com/accelerator": "nvidia",
        "node.kubernetes.io/instance-type": "Standard_NC6s_v3",
    },
    "ACK GPU node": {
        **COMMON,
        "alibabacloud.com/nodepool-id": "np1",
        "aliyun.accelerator/nvidia_count": "1",
        "aliyun.accelerator/nvidia_mem": "16276MiB",
        "aliyun.accelerator/nvidia_name": "Tesla-P100-PCIE-16GB",
        "node.kubernetes.io/instance-type": "ecs.gn5-c4g1.xlarge",
    },
    "GPU operator / GFD": {
        **COMMON,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    },
    "node-feature-discovery": {**COMMON, "feature.node.kubernetes.io/pci-10de.present": "true"},
    "node-feature-discovery (3D controller)": {**COMMON, "feature.node.kubernetes.io/pci-0302_10de.present": "true"},
    "node-feature-discovery (VGA controller)": {**COMMON, "feature.node.kubernetes.io/pci-0300_10de.present": "true"},
}
# Nodes the exporter has nothing to read on: no GPU, or no NVIDIA one.
OTHER_NODES: dict[str, Labels] = {
    "a CPU node": {
        **COMMON,
        "node.kubernetes.io/instance-type": "m7i.large",
        "topology.kubernetes.io/zone": "eu-west-1a",
    },
    "GKE CPU node": {**COMMON, "cloud.google.com/gke-nodepool": "default-pool"},
    "GKE TPU node": {**COMMON, "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"},
    "EKS Karpenter CPU node": {
        **COMMON,
        "karpenter.sh/nodepool": "default",
        "karpenter.k8s.aws/instance-category": "m",
    },
    "EKS Karpenter AMD GPU node": {**COMMON, "karpenter.k8s.aws/instance-gpu-manufacturer": "amd"},
    "EKS Auto Mode CPU node": {
        **COMMON,
        "eks.amazonaws.com/compute-type": "auto",
        "eks.amazonaws.com/instance-category": "c",
    },
    "AKS CPU node": {**COMMON, "kubernetes.azure.com/agentpool": "nodepool1", "kubernetes.azure.com/mode": "system"},
    "NFD without an NVIDIA device": {
        **COMMON,
        "feature.node.kubernetes.io/pci-1002.present": "true",
        "nvidia.com/gpu.present": "false",
    },
}


def default_pod() -> dict[str, Any]:
    return one(render(), "DaemonSet")["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", sorted(GPU_NODES))
def test_the_default_affinity_admits_the_gpu_nodes_of(name: str) -> None:
    assert admits(default_pod(), GPU_NODES[name])


@pytest.mark.parametrize("name", sorted(OTHER_NODES))
def test_the_default_affinity_refuses(name: str) -> None:
    assert not admits(default_pod(), OTHER_NODES[name])


def test_each_term_admits_a_node_of_its_own() -> None:
    """No dead term: every default term is what admits one of the GPU nodes above."""
    terms = default_pod()["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    for term in terms:
        assert any(term_matches(term, labels) for labels in GPU_NODES.values()), term


def test_the_affinity_can_be_dropped_for_a_node_selector() -> None:
    pod = one(render({"affinity": None, "nodeSelector": {"gpu": "yes"}}), "DaemonSet")["spec"]["template"]["spec"]
    assert admits(pod, {"gpu": "yes"}) and not admits(pod, GPU_NODES["AKS GPU node pool"])


def test_notes_tell_how_to_compare_the_desired_count_with_the_gpu_nodes() -> None:
    text = notes()
    assert "kubectl get nodes -l" in text and "DESIRED" in text
    for key in (
        "nvidia.com/gpu.present",
        "cloud.google.com/gke-accelerator",
        "kubernetes.azure.com/accelerator",
        "karpenter.k8s.aws/instance-gpu-manufacturer",
        "eks.amazonaws.com/instance-gpu-manufacturer",
        "aliyun.accelerator/nvidia_name",
    ):
        assert key in text, key


def selector_matches(selector: str, labels: Labels) -> bool:
    """A kubectl -l selector of the forms NOTES prints (k=v, k, !k, k in (..), k notin (..), k>n, k<n)."""
    if not selector:
        return True
    for part in re.split(r",(?![^()]*\))", selector):
        if m := re.fullmatch(r"(\S+) (in|notin) \((.*)\)", part):
            key, op, values = m.group(1), m.group(2), m.group(3).split(",")
            ok = requirement_matches(
                {"key": key, "operator": "In" if op == "in" else "NotIn", "values": values}, labels
            )
        elif m := re.fullmatch(r"([^=<>!]+)([<>])(-?\d+)", part):
            ok = requirement_matches(
                {"key": m.group(1), "operator": "Gt" if m.group(2) == ">" else "Lt", "values": [m.group(3)]}, labels
            )
        elif "=" in part:
            key, value = part.split("=", 1)
            ok = labels.get(key) == value
        else:
            ok = (part[1:] not in labels) if part.startswith("!") else part in labels
        if not ok:
            return False
    return True


def notes_selectors(values: dict[str, Any] | None = None) -> list[str]:
    (line,) = [x for x in notes(values).splitlines() if x.strip().startswith("for s in ")]
    return shlex.split(line.split(" in ", 1)[1].split("; do", 1)[0])


MIXED = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "a", "operator": "In", "values": ["1", "2"]},
                            {"key": "b", "operator": "NotIn", "values": ["x"]},
                        ]
                    },
                    {
                        "matchExpressions": [
                            {"key": "c", "operator": "DoesNotExist"},
                            {"key": "n", "operator": "Gt", "values": ["3"]},
                        ]
                    },
                    {
                        "matchExpressions": [
                            {"key": "n", "operator": "Lt", "values": ["2"]},
                            {"key": "d", "operator": "Exists"},
                        ]
                    },
                ]
            }
        }
    },
    "nodeSelector": {"pool": "gpu"},
}


@pytest.mark.parametrize(
    "values",
    [None, MIXED, {"affinity": None, "nodeSelector": {"gpu": "yes"}}],
    ids=["default", "every operator", "nodeSelector only"],
)
def test_the_notes_selectors_select_exactly_the_nodes_the_pod_spec_admits(values: dict[str, Any] | None) -> None:
    pod = one(render(values), "DaemonSet")["spec"]["template"]["spec"]
    selectors = notes_selectors(values)
    nodes = [
        *GPU_NODES.values(),
        *OTHER_NODES.values(),
        {"pool": "gpu", "a": "1"},
        {"pool": "gpu", "a": "1", "b": "x"},
        {"pool": "gpu", "n": "4"},
        {"pool": "gpu", "n": "4", "c": ""},
        {"pool": "gpu", "n": "1", "d": ""},
        {"a": "2"},
        {"gpu": "yes"},
    ]
    for labels in nodes:
        assert any(selector_matches(s, labels) for s in selectors) is admits(pod, labels), labels
