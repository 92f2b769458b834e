"""Both bundles against the fleet model's truth, on the quantities both compute.

The truth is computed from bench/fleet_model.py (the values the exporter and the TKE inputs were
rendered from, read with the server's gauges held at factor 1): GPUs are healthy devices (MIG
devices count) x 100, cluster usage is the devices' duty cycles (host processes included: what
the cards did), namespace, workload and pod usage the containers' own SM, requests the grants.
Ours is keyed by cluster; the seed's group cannot be (its ``sum``/``sum by`` drop the cluster
label), so its value for a key is compared with the truth of each cluster (``vs cluster``) and
with the sum over the clusters (``vs fleet``): right where it is a fleet-wide number, wrong per
cluster wherever a namespace or ratio spans clusters.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.fleet_model import Node
from bench.fleet_tke import PREFIX, VCUDA_MEMORY_UNIT

Key = tuple[str, ...]
Query = Callable[[str], list[tuple[dict[str, str], float]]]


@dataclass(frozen=True)
class Quantity:
    name: str
    ours: str  # recorded series of our bundle
    ours_labels: tuple[str, ...]  # its labels in truth-key order (cluster first)
    seed: str  # the seed's (renamed) series
    seed_labels: tuple[str, ...]  # truth-key labels but the cluster
    ratio: bool = False  # a ratio: the fleet-wide truth is not the sum of the clusters'


def truth(nodes: Sequence[Node]) -> dict[str, dict[Key, float]]:
    """Per quantity name: {key (cluster first): value} from the model."""
    t: dict[str, dict[Key, float]] = defaultdict(lambda: defaultdict(float))
    for n in nodes:
        c = n.cluster
        t["nodes"][(c,)] += 1
        t["node_capacity"][(c, n.name)] = 100.0 * len(n.devices)
        for d in n.devices:
            if not d.lost:
                t["total"][(c,)] += 100.0
                t["memory_total"][(c,)] += d.memory_total
                t["memory_total_vcuda"][(c,)] += d.memory_total // VCUDA_MEMORY_UNIT * VCUDA_MEMORY_UNIT
                if d.util is not None:  # MIG devices have no utilization: no usage series, not 0
                    t["used"][(c,)] += d.util
        for p in n.pods:
            for ctr in p.containers:
                for u in ctr.uses:
                    t["namespace_memory"][(c, p.namespace)] += u.memory
                    if u.sm is not None:
                        t["namespace_used"][(c, p.namespace)] += u.sm
                        t["workload_used"][(c, p.namespace, p.workload_kind, p.workload_name)] += u.sm
                        t["pod_used"][(c, p.namespace, p.name)] += u.sm
                        t["attributed"][(c,)] += u.sm
                    if u.compute is not None:
                        t["pod_request"][(c, p.namespace, p.name)] += u.compute
                        t["request"][(c,)] += u.compute
    out = {k: dict(v) for k, v in t.items()}
    tot = out["total"]
    out["rate_used"] = {k: 100 * v / tot[k] for k, v in out.get("used", {}).items()}
    out["rate_request"] = {k: 100 * out.get("request", {}).get(k, 0.0) / v for k, v in tot.items()}
    out["namespace_rate"] = {k: 100 * v / tot[k[:1]] for k, v in out.get("namespace_used", {}).items()}
    out["workload_rate"] = {k: 100 * v / tot[k[:1]] for k, v in out.get("workload_used", {}).items()}
    return out


NS, WL = ("namespace_name",), ("namespace_name", "workload_kind", "workload_name")
SNS, SWL = ("namespace",), ("namespace", "workload_kind", "workload_name")
QUANTITIES = (
    Quantity("total", "k8s_cluster_gpu_total", ("cluster",), "k8s_cluster_gpu_total", ()),
    Quantity("memory_total", "k8s_cluster_gpu_memory_total_bytes", ("cluster",),
             "k8s_cluster_gpu_memory_total_bytes", ()),
    Quantity("used", "k8s_cluster_gpu_used", ("cluster",), "k8s_cluster_gpu_used", ()),
    Quantity("rate_used", "k8s_cluster_rate_gpu_used_cluster", ("cluster",), "k8s_cluster_rate_gpu_used_cluster",
             (), ratio=True),
    Quantity("rate_request", "k8s_cluster_rate_gpu_request_cluster", ("cluster",),
             "k8s_cluster_rate_gpu_request_cluster", (), ratio=True),
    Quantity("namespace_used", "k8s_namespace_gpu_used", ("cluster", *NS), "k8s_namespace_gpu_used", SNS),
    Quantity("namespace_rate", "k8s_namespace_rate_gpu_used_cluster", ("cluster", *NS),
             "k8s_namespace_rate_gpu_used_cluster", SNS, ratio=True),
    Quantity("namespace_memory", "k8s_namespace_gpu_memory_used_bytes", ("cluster", *NS),
             "k8s_namespace_gpu_memory_used_bytes", SNS),
    Quantity("workload_used", "k8s_workload_gpu_used", ("cluster", *WL), "k8s_workload_gpu_used", SWL),
    Quantity("workload_rate", "k8s_workload_rate_gpu_used_cluster", ("cluster", *WL),
             "k8s_workload_rate_gpu_used_cluster", SWL, ratio=True),
    Quantity("node_capacity", "kube_node_status_capacity_gpu", ("cluster", "node_name"),
             "kube_node_status_capacity_gpu", ("node",)),
    Quantity("pod_used", "k8s_pod_gpu_used", ("cluster", "namespace_name", "pod_name"), "k8s_pod_gpu_used",
             ("namespace", "pod_name")),
    Quantity("pod_request", "k8s_pod_gpu_request", ("cluster", "namespace_name", "pod_name"), "k8s_pod_gpu_request",
             ("namespace", "pod_name")),
)


def _series(query: Query, expr: str, labels: Sequence[str]) -> tuple[dict[Key, float], int]:
    """{key: value} of an instant query and the number of duplicate keys (kept: the first)."""
    out: dict[Key, float] = {}
    dup = 0
    for metric, value in query(expr):
        key = tuple(metric.get(lbl, "") for lbl in labels)
        if key in out:
            dup += 1
        else:
            out.setdefault(key, value)
    return out, dup


def _errors(got: dict[Key, float], want: dict[Key, float], key: Callable[[Key], Key] = lambda k: k) -> dict[str, Any]:
    """How ``got`` (looked up by ``key(truth key)``) matches ``want``: missing, NaN, max abs/rel error."""
    missing = nan = 0
    abs_err = rel_err = 0.0
    for k, v in want.items():
        g = got.get(key(k))
        if g is None:
            missing += 1
        elif math.isnan(g):
            nan += 1
        else:
            abs_err = max(abs_err, abs(g - v))
            rel_err = max(rel_err, abs(g - v) / abs(v) if v else (0.0 if g == 0 else math.inf))
    return {"keys": len(want), "missing": missing, "nan": nan, "max_abs_error": abs_err, "max_rel_error": rel_err}


def compare(query: Query, nodes: Sequence[Node]) -> dict[str, Any]:
    """Every quantity: truth keys, ours vs truth, the seed vs each cluster's and vs the fleet's truth."""
    t = truth(nodes)
    out: dict[str, Any] = {}
    for q in QUANTITIES:
        want = t.get(q.name, {})
        ours, ours_dup = _series(query, q.ours, q.ours_labels)
        seed, seed_dup = _series(query, PREFIX + q.seed, q.seed_labels)
        fleet: dict[Key, float] = defaultdict(float)
        for k, v in want.items():
            fleet[k[1:]] += v
        if q.ratio:  # the fleet-wide ratio: sum of numerators over sum of denominators
            fleet = _fleet_ratio(q.name, t)
        out[q.name] = {
            "ours_series": q.ours, "seed_series": PREFIX + q.seed, "truth_keys": len(want),
            "ours": {**_errors(ours, want), "series": len(ours), "duplicates": ours_dup},
            "seed_vs_cluster": {**_errors(seed, want, lambda k: k[1:]), "series": len(seed), "duplicates": seed_dup},
            "seed_vs_fleet": _errors(seed, dict(fleet)),
        }
    out["_notes"] = _notes(query, t)
    return out


def _fleet_ratio(name: str, t: dict[str, dict[Key, float]]) -> dict[Key, float]:
    total = sum(t["total"].values())
    num = {"rate_used": "used", "rate_request": "request", "namespace_rate": "namespace_used",
           "workload_rate": "workload_used"}[name]
    out: dict[Key, float] = defaultdict(float)
    for k, v in t.get(num, {}).items():
        out[k[1:]] += 100 * v / total
    return dict(out)


def _notes(query: Query, t: dict[str, dict[Key, float]]) -> dict[str, Any]:
    """The explanations' numbers: host-process usage, memory rounding, and scalar() over several clusters."""
    nan_demo = query(f"{PREFIX}k8s_namespace_gpu_used * 100 / scalar(k8s_cluster_gpu_total)")
    seed_used = query(f"{PREFIX}k8s_cluster_gpu_used")
    return {
        "clusters": len(t["total"]),
        "device_minus_attributed_used": sum(t.get("used", {}).values()) - sum(t.get("attributed", {}).values()),
        "seed_cluster_used": seed_used[0][1] if seed_used else None,
        "fleet_attributed_used": sum(t.get("attributed", {}).values()),
        "memory_total_minus_vcuda_units": sum(t["memory_total"].values()) - sum(t["memory_total_vcuda"].values()),
        "scalar_over_per_cluster_totals": {
            "expr": f"{PREFIX}k8s_namespace_gpu_used * 100 / scalar(k8s_cluster_gpu_total)",
            "series": len(nan_demo), "nan": sum(1 for _, v in nan_demo if math.isnan(v))},
    }


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per quantity."""
    def err(e: dict[str, Any], pct: bool) -> str:
        if e["keys"] == 0:
            return "-"
        bad = [f"{e[k]} {k}" for k in ("missing", "nan") if e[k]]
        val = f"{e['max_abs_error']:.3g} pp" if pct else f"{100 * e['max_rel_error']:.3g} %"
        return ", ".join([val, *bad])

    lines = ["| quantity (ours / seed series) | truth keys | ours: series, max error | seed: series, "
             "max error per cluster | seed vs fleet-wide |", "| --- | ---: | --- | --- | --- |"]
    for name, r in result.items():
        if name.startswith("_"):
            continue
        pct = name.startswith("rate") or name.endswith("rate")
        lines.append(f"| `{r['ours_series']}` | {r['truth_keys']} | {r['ours']['series']}, "
                     f"{err(r['ours'], pct)} | {r['seed_vs_cluster']['series']}, {err(r['seed_vs_cluster'], pct)} "
                     f"| {err(r['seed_vs_fleet'], pct)} |")
    return "\n".join(lines)
