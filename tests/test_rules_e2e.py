"""End to end: real Prometheus + the generated rules + simulated-node exporters.

Three ``python -m exporter --simulate`` processes serve tests/scenarios/rules_e2e_*.yaml (two
nodes of cluster "east", one of cluster "west"); a Prometheus 2.42 server on a free loopback
port scrapes them, with the ``cluster`` label attached as a target label, and evaluates the
bundle. Every recorded public series is compared with values worked out by hand from the
scenario files (see the comments at the top of each file).

The rules are rendered with ``--interval 1s`` (the only difference from the committed bundle)
so that results appear seconds after Prometheus' first scrape instead of a minute later.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from exporter.bundle.rules import RuleOptions, render_rules
from exporter.shell.generate import BANNER
from tests.prom_support import (
    PROMETHEUS,
    ROOT,
    SCENARIOS,
    Labels,
    query,
    rule_health,
    run_prometheus,
    start_exporter,
    stop,
)
from tests.test_rules import COUNTER_SERIES

pytestmark = pytest.mark.e2e  # every test here starts a server

MIB = 2**20

# (scenario file, node name, cluster)
NODES = [
    ("rules_e2e_east_node1.yaml", "e2e-node-1", "east"),
    ("rules_e2e_east_node2.yaml", "e2e-node-2", "east"),
    ("rules_e2e_west_node3.yaml", "e2e-node-3", "west"),
]


def _uuid(node: int, index: int) -> str:
    return f"GPU-e2e0000{node}-0000-4000-8000-00000000000{index}"


# ---------------------------------------------------------------- expected values, by hand

_C = (
    "cluster",
    "node_name",
    "namespace_name",
    "pod_name",
    "container_name",
    "workload_kind",
    "workload_name",
)
TRAIN0 = dict(
    zip(_C, ("east", "e2e-node-1", "ml", "train-0", "trainer", "StatefulSet", "train"), strict=True)
)
INFER_A = dict(
    zip(
        _C,
        ("east", "e2e-node-1", "serving", "infer-7c6b5d4f3-aaaaa", "infer", "Deployment", "infer"),
        strict=True,
    )
)
INFER_B = {**INFER_A, "pod_name": "infer-7c6b5d4f3-bbbbb"}
TRAIN1 = {**TRAIN0, "node_name": "e2e-node-2", "pod_name": "train-1"}
NB_A = dict(zip(_C, ("west", "e2e-node-3", "dev", "nb-a", "lab", "Pod", "nb-a"), strict=True))
NB_B = {**NB_A, "pod_name": "nb-b", "workload_name": "nb-b"}
CONTAINERS = [TRAIN0, INFER_A, INFER_B, TRAIN1, NB_A, NB_B]

# Per container, in CONTAINERS order. Exclusive containers read their GPUs' device values;
# share containers their own processes'. None = no request (time-slicing grants none).
USED = [65, 20, 35, 85 + 75, 15, 25]
MEM = [6.5e9, 3e9, 5e9, 20.5e9 + 10e9, 2e9, 3e9]
REQ = [100, 30, 50, 200, None, None]
MREQ = [16e9, 4000 * MIB, 6000 * MIB, 2 * 32e9, None, None]
NODE_CAP = {"e2e-node-1": 200, "e2e-node-2": 200, "e2e-node-3": 100}
NODE_MEM = {"e2e-node-1": 32e9, "e2e-node-2": 64e9, "e2e-node-3": 16e9}
CLUSTER_TOTAL = {"east": 400, "west": 100}  # healthy GPUs x 100
CLUSTER_MEM = {"east": 96e9, "west": 16e9}


def _l(d: dict[str, str], *drop: str) -> Labels:
    return frozenset((k, v) for k, v in d.items() if k not in drop)


# kube-prometheus-stack's names each level's series also carries, copied from the exporter's labels
K8S_COPIES = {
    "k8s_container_": (("namespace", "namespace_name"), ("pod", "pod_name"), ("container", "container_name")),
    "k8s_pod_": (("namespace", "namespace_name"), ("pod", "pod_name")),
    "k8s_workload_": (("namespace", "namespace_name"),),
    "k8s_namespace_": (("namespace", "namespace_name"),),
}


def with_k8s_copies(record: str, labels: dict[str, str]) -> dict[str, str]:
    """``labels`` of a ``record`` series plus the namespace/pod/container copies its level gets."""
    copies = next((c for prefix, c in K8S_COPIES.items() if record.startswith(prefix)), ())
    return {**labels, **{name: labels[source] for name, source in copies}}


def expected_cluster_rendering() -> dict[str, dict[Labels, float]]:
    exp: dict[str, dict[Labels, float]] = {}

    def put(record: str, labels: dict[str, str], value: float, *drop: str) -> None:
        kept = {k: v for k, v in labels.items() if k not in drop}
        exp.setdefault(record, {})[_l(with_k8s_copies(record, kept))] = value

    for c, used, mem, req, mreq in zip(CONTAINERS, USED, MEM, REQ, MREQ, strict=True):
        cap, cmem = NODE_CAP[c["node_name"]], NODE_MEM[c["node_name"]]
        for level, drop in (("container", ()), ("pod", ("container_name",))):
            put(f"k8s_{level}_gpu_used", c, used, *drop)
            put(f"k8s_{level}_rate_gpu_used_node", c, used * 100 / cap, *drop)
            put(f"k8s_{level}_gpu_memory_used_bytes", c, mem, *drop)
            put(f"k8s_{level}_rate_gpu_memory_used_node", c, mem * 100 / cmem, *drop)
            if req is not None:  # no request: no series at all
                put(f"k8s_{level}_gpu_request", c, req, *drop)
                put(f"k8s_{level}_rate_gpu_used_request", c, used * 100 / req, *drop)
                put(f"k8s_{level}_gpu_memory_request_bytes", c, mreq, *drop)
                put(f"k8s_{level}_rate_gpu_memory_used_request", c, mem * 100 / mreq, *drop)
    pod = ("container_name",)
    put("k8s_pod_gpu_allocated_compute", {**TRAIN0, "uuid": _uuid(1, 0), "minor_number": "0"}, 100, *pod)
    put("k8s_pod_gpu_allocated_compute", {**INFER_A, "uuid": _uuid(1, 1), "minor_number": "1"}, 30, *pod)
    put("k8s_pod_gpu_allocated_compute", {**INFER_B, "uuid": _uuid(1, 1), "minor_number": "1"}, 50, *pod)
    put("k8s_pod_gpu_allocated_compute", {**TRAIN1, "uuid": _uuid(2, 0), "minor_number": "0"}, 100, *pod)
    put("k8s_pod_gpu_allocated_compute", {**TRAIN1, "uuid": _uuid(2, 1), "minor_number": "1"}, 100, *pod)

    # nodes: usage = device totals (exclusive rows + None rows); node 1: 65 + 60, 6.5e9 + 8.5e9
    nodes = {
        # name: (cluster, used, mem used, allocated compute, allocated memory, GPUs allocated)
        "e2e-node-1": ("east", 65 + 60, 6.5e9 + 8.5e9, 100 + 30 + 50, 16e9 + 4000 * MIB + 6000 * MIB, 2),
        "e2e-node-2": ("east", 85 + 75, 20.5e9 + 10e9, 200, 64e9, 2),
        "e2e-node-3": ("west", 45, 5.5e9, 0, 0, 0),
    }
    for name, (cl, used, mem, ac, am, ad) in nodes.items():
        n = {"cluster": cl, "node_name": name}
        put("kube_node_status_capacity_gpu", n, NODE_CAP[name])
        put("kube_node_status_allocatable_gpu", n, NODE_CAP[name])
        put("kube_node_status_capacity_gpu_memory_bytes", n, NODE_MEM[name])
        put("kube_node_status_allocatable_gpu_memory_bytes", n, NODE_MEM[name])
        put("k8s_node_gpu_used", n, used)
        put("k8s_node_gpu_memory_used_bytes", n, mem)
        put("k8s_node_rate_gpu_used", n, used * 100 / NODE_CAP[name])
        put("k8s_node_rate_gpu_memory_used", n, mem * 100 / NODE_MEM[name])
        put("k8s_node_gpu_allocated_compute", n, ac)
        put("k8s_node_gpu_allocated_memory_bytes", n, am)
        put("k8s_node_rate_gpu_memory_allocated", n, am * 100 / NODE_MEM[name])
        put("k8s_node_gpu_allocated_devices", n, ad)
    cards = [
        # cluster, node, uuid, minor, allocated compute, allocated memory, card memory
        ("east", "e2e-node-1", _uuid(1, 0), "0", 100, 16e9, 16e9),
        ("east", "e2e-node-1", _uuid(1, 1), "1", 30 + 50, 10000 * MIB, 16e9),
        ("east", "e2e-node-2", _uuid(2, 0), "0", 100, 32e9, 32e9),
        ("east", "e2e-node-2", _uuid(2, 1), "1", 100, 32e9, 32e9),
        ("west", "e2e-node-3", _uuid(3, 0), "0", 0, 0, 16e9),
    ]
    for cl, node, uuid, minor, ac, am, total in cards:
        k = {"cluster": cl, "node_name": node, "uuid": uuid, "minor_number": minor}
        put("k8s_card_gpu_allocated_compute", k, ac)
        put("k8s_card_gpu_allocated_memory_bytes", k, am)
        put("k8s_card_rate_gpu_memory_allocated", k, am * 100 / total)

    workloads = [
        # cluster, namespace, kind, name, used, memory used
        ("east", "ml", "StatefulSet", "train", 65 + 160, 6.5e9 + 30.5e9),  # pods on two nodes
        ("east", "serving", "Deployment", "infer", 20 + 35, 3e9 + 5e9),
        ("west", "dev", "Pod", "nb-a", 15, 2e9),
        ("west", "dev", "Pod", "nb-b", 25, 3e9),
    ]
    for cl, ns, kind, name, used, mem in workloads:
        w = {"cluster": cl, "namespace_name": ns, "workload_kind": kind, "workload_name": name}
        put("k8s_workload_gpu_used", w, used)
        put("k8s_workload_rate_gpu_used_cluster", w, used * 100 / CLUSTER_TOTAL[cl])
        put("k8s_workload_gpu_memory_used_bytes", w, mem)
        put("k8s_workload_rate_gpu_memory_used_cluster", w, mem * 100 / CLUSTER_MEM[cl])
    for cl, ns, used, mem in [
        ("east", "ml", 225, 37e9),
        ("east", "serving", 55, 8e9),
        ("west", "dev", 40, 5e9),
    ]:
        s = {"cluster": cl, "namespace_name": ns}
        put("k8s_namespace_gpu_used", s, used)
        put("k8s_namespace_rate_gpu_used_cluster", s, used * 100 / CLUSTER_TOTAL[cl])
        put("k8s_namespace_gpu_memory_used_bytes", s, mem)
        put("k8s_namespace_rate_gpu_memory_used_cluster", s, mem * 100 / CLUSTER_MEM[cl])
    clusters = {
        # used (device totals), memory used, allocated compute, allocated memory
        "east": (125 + 160, 15e9 + 30.5e9, 180 + 200, 16e9 + 10000 * MIB + 64e9),
        "west": (45, 5.5e9, 0, 0),
    }
    for cl, (used, mem, ac, am) in clusters.items():
        k = {"cluster": cl}
        put("k8s_cluster_gpu_total", k, CLUSTER_TOTAL[cl])
        put("k8s_cluster_gpu_memory_total_bytes", k, CLUSTER_MEM[cl])
        put("k8s_cluster_gpu_used", k, used)
        put("k8s_cluster_rate_gpu_used_cluster", k, used * 100 / CLUSTER_TOTAL[cl])
        put("k8s_cluster_rate_gpu_request_cluster", k, ac * 100 / CLUSTER_TOTAL[cl])
        put("k8s_cluster_gpu_memory_used_bytes", k, mem)
        put("k8s_cluster_rate_gpu_memory_used_cluster", k, mem * 100 / CLUSTER_MEM[cl])
        put("k8s_cluster_rate_gpu_memory_request_cluster", k, am * 100 / CLUSTER_MEM[cl])
    return exp


def expected_default_rendering_east_only() -> dict[str, dict[Labels, float]]:
    """Cluster "east" alone, scraped without a cluster label: the same numbers, label dropped."""
    out: dict[str, dict[Labels, float]] = {}
    for record, series in expected_cluster_rendering().items():
        for labels, value in series.items():
            if ("cluster", "east") in labels:
                out.setdefault(record, {})[frozenset(kv for kv in labels if kv[0] != "cluster")] = value
    return out


# ---------------------------------------------------------------- processes


@dataclass(frozen=True)
class Target:
    address: str
    node: str
    cluster: str


@pytest.fixture(scope="module")
def exporters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Target]]:
    """The lead's simulated-node exporter, one process per scenario file."""
    logs = tmp_path_factory.mktemp("exporter-logs")
    procs: list[subprocess.Popen] = []
    targets: list[Target] = []
    try:
        for scenario, node, cluster in NODES:
            proc, address = start_exporter(SCENARIOS / scenario, node, logs)
            procs.append(proc)
            targets.append(Target(address, node, cluster))
        yield targets
    finally:
        for proc in procs:
            stop(proc)


def _matches(got: dict[Labels, float], want: dict[Labels, float]) -> bool:
    return got.keys() == want.keys() and all(
        math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-9) for k in want
    )


def _table(series: dict[Labels, float]) -> list[str]:
    return sorted(f"{dict(sorted(k))} {v!r}" for k, v in series.items())


def wait_recorded(base: str, expected: dict[str, dict[Labels, float]], timeout: float = 60) -> None:
    """Poll ``base``'s query API until every series in ``expected`` has exactly the expected values."""
    pending = dict(expected)
    got: dict[str, dict[Labels, float]] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for record in list(pending):
            got[record] = query(base, record)
            if _matches(got[record], pending[record]):
                del pending[record]
        if pending:
            time.sleep(0.5)
    report = {r: {"want": _table(expected[r]), "got": _table(got.get(r, {}))} for r in pending}
    assert not pending, json.dumps(report, indent=1, default=str)[:6000]


def public_records(rules_text: str) -> list[str]:
    """The public series checked here; the counters' rates have their own test (test_usage_rules_e2e.py)."""
    records = [r["record"] for g in yaml.safe_load(rules_text)["groups"] for r in g["rules"]]
    counters = {s for names in COUNTER_SERIES.values() for s in names}
    return sorted(r for r in records if ":" not in r and r not in counters)


def _check_recorded(base: str, rules_text: str, expected: dict[str, dict[Labels, float]]) -> None:
    assert public_records(rules_text) == sorted(expected), "every public series has expectations"
    # The first scrape lands ~5.7 s after start, rules run each second after that.
    wait_recorded(base, expected)
    # no rule in the group failed to evaluate (e.g. a many-to-many join)
    bad = rule_health(base)
    assert not bad, bad


def test_cluster_rendering_on_real_prometheus(exporters: list[Target], tmp_path: Path) -> None:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    rules = render_rules(RuleOptions(cluster_label="cluster", interval="1s"))
    static = [
        {"targets": [t.address for t in exporters if t.cluster == cl], "labels": {"cluster": cl}}
        for cl in ("east", "west")
    ]
    proc, base = run_prometheus(tmp_path, rules, static)
    try:
        _check_recorded(base, rules, expected_cluster_rendering())
    finally:
        stop(proc)


def test_default_rendering_on_real_prometheus(exporters: list[Target], tmp_path: Path) -> None:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    committed = (ROOT / "rules" / "kube-gpu-exporter.rules.yaml").read_text().removeprefix(BANNER)
    rules = render_rules(RuleOptions(interval="1s"))
    # identical to the committed bundle except for the evaluation interval
    assert rules.replace("interval: 1s", "interval: 30s").splitlines()[1:] == committed.splitlines()[1:]
    # as a ServiceMonitor scrapes it: the exporter pod's own namespace/pod/container as target labels,
    # which no recorded series may carry (the copies come from namespace_name/pod_name/container_name)
    exporter_pod = {"namespace": "monitoring", "pod": "kube-gpu-exporter-e2e", "container": "exporter"}
    static = [{"targets": [t.address for t in exporters if t.cluster == "east"], "labels": exporter_pod}]
    proc, base = run_prometheus(tmp_path, rules, static)
    try:
        _check_recorded(base, rules, expected_default_rendering_east_only())
    finally:
        stop(proc)
