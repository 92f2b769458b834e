"""Tiered federation with real Prometheus servers: two cluster servers, a regional and a global one.

The simulated nodes of tests/test_rules_e2e.py (tests/scenarios/rules_e2e_*.yaml) are scraped by
two per-cluster Prometheus 2.42 servers on loopback, each evaluating the whole bundle:

* "east" scrapes nodes 1 and 2 with ``cluster="east"`` as a target label (docs/rules.md), rules
  rendered with ``--cluster-label=cluster``, exactly as tests/test_rules_e2e.py does;
* "west" scrapes nodes 2 and 3 (the same node 2 exporter again: a node, namespace and workload with
  the same names in both clusters) and names its cluster in ``external_labels`` instead, with
  rules rendered without a cluster label; ``/federate`` adds the external label to its output.

A regional server (``external_labels: {region: r1}``) federates east with the shipped scrape job
(rules/kube-gpu-exporter.federate.yaml); the global server federates the regional one with the same
job and west with its ``--federation-selectors`` rendering without a cluster label. Both evaluate
the shipped global rule file (rules/kube-gpu-exporter.global.rules.yaml). Checked: the global
series equal the values worked out by hand below and the sums of what the cluster servers hold
(the region's: east's alone); the federated series are the clusters' own; and no exporter series,
helper, node-, card-, pod- or container-level record, nor the region's own global series, exists
on the global server.

Every server evaluates at 1 s, and the cluster servers' bundles use ``--rate-window 10s``: the busy
and power series (window averages that move every second) settle within seconds and are held to
the sums of the clusters' within 5 %; every other series exactly.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from exporter.bundle.federation import (
    FEDERATED_LEVELS,
    federation_job,
    global_rules,
    render_global_rules,
    tier_records,
)
from exporter.bundle.rules import RuleOptions, render_rules
from exporter.shell.generate import BANNER
from tests.federation_support import metric_names, prometheus_config, start_prometheus, strip, values, write_rules
from tests.prom_support import PROMETHEUS, ROOT, Labels, poll, rule_health, stop
from tests.test_rules_e2e import MIB, Target, expected_cluster_rendering, exporters, wait_recorded

__all__ = ["exporters"]  # the module-scoped fixture of tests/test_rules_e2e.py

OPTS = RuleOptions(cluster_label="cluster", interval="1s")
# the cluster servers' bundles: a short rate() window, so that busy and power settle within seconds
EAST = dataclasses.replace(OPTS, rate_window="10s")
WEST = dataclasses.replace(EAST, cluster_label=None)
TIER = [r for level in FEDERATED_LEVELS for r in tier_records(OPTS, level)]
COUNTERS = ("_gpu_busy", "_gpu_power_watts")  # window averages of counters: compared within REL_TOL
REL_TOL = 0.05

# ---------------------------------------------------------------- by hand, from the scenario files

# cluster: (100 x healthy GPUs, their memory, used, memory used, compute allocated, memory allocated)
CLUSTERS = {
    "east": (400, 96e9, 125 + 160, 15e9 + 30.5e9, 180 + 200, 16e9 + 10000 * MIB + 64e9),  # nodes 1 and 2
    "west": (200 + 100, 64e9 + 16e9, 160 + 45, 30.5e9 + 5.5e9, 200, 64e9),  # node 2 again, node 3
}
# (cluster, namespace): (used, memory used)
NAMESPACES = {
    ("east", "ml"): (65 + 160, 6.5e9 + 30.5e9),
    ("east", "serving"): (20 + 35, 3e9 + 5e9),
    ("west", "ml"): (160, 30.5e9),
    ("west", "dev"): (15 + 25, 2e9 + 3e9),
}
# (cluster, namespace, kind, name): (used, memory used)
WORKLOADS = {
    ("east", "ml", "StatefulSet", "train"): (225, 37e9),
    ("east", "serving", "Deployment", "infer"): (55, 8e9),
    ("west", "ml", "StatefulSet", "train"): (160, 30.5e9),
    ("west", "dev", "Pod", "nb-a"): (15, 2e9),
    ("west", "dev", "Pod", "nb-b"): (25, 3e9),
}
WL = ("namespace_name", "workload_kind", "workload_name")
KEYS = {"cluster": (), "namespace": ("namespace_name",), "workload": WL}
ALLOCATED = {"gpu_allocated_compute": ("rate_gpu_request_cluster", "gpu_total"),
             "gpu_allocated_memory_bytes": ("rate_gpu_memory_request_cluster", "gpu_memory_total_bytes")}  # fmt: skip


def _put(exp: dict[str, dict[Labels, float]], record: str, labels: dict[str, str], value: float) -> None:
    if "namespace_name" in labels:
        labels = {**labels, "namespace": labels["namespace_name"]}  # the kube-prometheus-stack copy
    exp.setdefault(record, {})[frozenset(labels.items())] = value


def expected_tier() -> dict[str, dict[Labels, float]]:
    """The cluster servers' workload, namespace and cluster records, busy and power aside."""
    exp: dict[str, dict[Labels, float]] = {}
    for cl, (total, mem_total, used, mem, alloc, alloc_mem) in CLUSTERS.items():
        k = {"cluster": cl}
        for name, v in [("gpu_total", total), ("gpu_memory_total_bytes", mem_total), ("gpu_used", used),
                        ("gpu_memory_used_bytes", mem), ("rate_gpu_used_cluster", used * 100 / total),
                        ("rate_gpu_request_cluster", alloc * 100 / total),
                        ("rate_gpu_memory_used_cluster", mem * 100 / mem_total),
                        ("rate_gpu_memory_request_cluster", alloc_mem * 100 / mem_total)]:  # fmt: skip
            _put(exp, f"k8s_cluster_{name}", k, v)
    for level, table, keys in (("namespace", NAMESPACES, ("namespace_name",)), ("workload", WORKLOADS, WL)):
        for (cl, *key), (used, mem) in table.items():
            k = {"cluster": cl, **dict(zip(keys, key, strict=True))}
            _put(exp, f"k8s_{level}_gpu_used", k, used)
            _put(exp, f"k8s_{level}_rate_gpu_used_cluster", k, used * 100 / CLUSTERS[cl][0])
            _put(exp, f"k8s_{level}_gpu_memory_used_bytes", k, mem)
            _put(exp, f"k8s_{level}_rate_gpu_memory_used_cluster", k, mem * 100 / CLUSTERS[cl][1])
    return exp


def across(series: dict[Labels, float], keys: tuple[str, ...]) -> dict[Labels, float]:
    """``series`` summed over clusters by ``keys`` (plus the ``namespace`` copy)."""
    out: dict[Labels, float] = {}
    for labels, v in series.items():
        k = {n: dict(labels)[n] for n in keys}
        k.update({"namespace": k["namespace_name"]} if k else {})
        out[frozenset(k.items())] = out.get(frozenset(k.items()), 0) + v
    return out


def expected_global(tier: dict[str, dict[Labels, float]]) -> dict[str, dict[Labels, float]]:
    """The global records from the clusters' ``tier`` series: sums, and ratios of sums (never of ratios)."""
    exp: dict[str, dict[Labels, float]] = {}
    for record, series in tier.items():
        level, _, part = record.removeprefix("k8s_").partition("_")
        if not part.startswith("rate_"):
            exp[f"k8s_global_{'' if level == 'cluster' else level + '_'}{part}"] = across(series, KEYS[level])
    for part, (ratio, den) in ALLOCATED.items():  # the bundle records these as ratios: ratio x total
        rebuilt = (v * tier[f"k8s_cluster_{den}"][k] / 100 for k, v in tier[f"k8s_cluster_{ratio}"].items())
        exp[f"k8s_global_{part}"] = {frozenset(): sum(rebuilt)}
    gpus, mem = exp["k8s_global_gpu_total"][frozenset()], exp["k8s_global_gpu_memory_total_bytes"][frozenset()]
    ratios = [("gpu_used", "rate_gpu_used_global", gpus), ("gpu_memory_used_bytes", "rate_gpu_memory_used_global", mem)]
    for prefix in ("k8s_global_", "k8s_global_namespace_", "k8s_global_workload_"):
        extra = [("gpu_allocated_compute", "rate_gpu_request_global", gpus),
                 ("gpu_allocated_memory_bytes", "rate_gpu_memory_request_global", mem)]  # fmt: skip
        for num, name, total in ratios + (extra if prefix == "k8s_global_" else []):
            exp[prefix + name] = {k: v * 100 / total for k, v in exp[prefix + num].items()}
    exp["k8s_global_clusters"] = {frozenset(): len(tier["k8s_cluster_gpu_total"])}
    return exp


def test_hand_values_agree_with_the_single_prometheus_ones() -> None:
    """East is tests/test_rules_e2e.py's cluster; the global numbers, once more by hand."""
    single = expected_cluster_rendering()
    tier = expected_tier()
    for record, series in tier.items():
        east = {k: v for k, v in series.items() if ("cluster", "east") in k}
        assert east == {k: v for k, v in single[record].items() if ("cluster", "east") in k}, record
    glob = {r: next(iter(s.values())) for r, s in expected_global(tier).items() if len(s) == 1}
    assert glob["k8s_global_gpu_total"] == 700 and glob["k8s_global_gpu_used"] == 490
    assert glob["k8s_global_gpu_allocated_compute"] == pytest.approx(580)
    assert glob["k8s_global_rate_gpu_used_global"] == 70  # the clusters' 71.25 % and 68.3 % average 69.8
    ml = frozenset({("namespace_name", "ml"), ("namespace", "ml")})
    assert expected_global(tier)["k8s_global_namespace_gpu_used"][ml] == 385  # 225 east + 160 west
    # every public global record is checked here, but the busy and power ones (checked against sums)
    names = {r["record"] for r in global_rules(OPTS)}
    assert names - set(expected_global(tier)) == {n for n in names if n.endswith(COUNTERS)}


# ---------------------------------------------------------------- the servers


@dataclasses.dataclass(frozen=True)
class Tiers:
    east: str
    west: str
    region: str
    glob: str


def _federate(job: dict, name: str, server: str) -> dict:
    """The shipped scrape ``job`` pulling from the Prometheus at base URL ``server``."""
    return {**job, "job_name": name, "static_configs": [{"targets": [server.removeprefix("http://")]}]}


def _cluster_server(tmp: Path, nodes: dict, opts: RuleOptions, external: dict | None) -> tuple[subprocess.Popen, str]:
    job = {"job_name": "kube-gpu-exporter", "static_configs": [nodes]}
    rules = write_rules(tmp, "rules.yaml", render_rules(opts))
    return start_prometheus(tmp, prometheus_config([job], [rules], external))


@pytest.fixture(scope="module")
def tiers(exporters: list[Target], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    """east -> region -> global and west -> global; the region and global servers run the global file."""
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    tmp = tmp_path_factory.mktemp("federation")
    addr = {t.node: t.address for t in exporters}
    shipped = yaml.safe_load((ROOT / "rules" / "kube-gpu-exporter.federate.yaml").read_text())[0]
    assert shipped == federation_job(RuleOptions(cluster_label="cluster"))
    external_label_job = federation_job(RuleOptions())  # its rendering for external-label clusters
    text = render_global_rules(OPTS)
    committed = (ROOT / "rules" / "kube-gpu-exporter.global.rules.yaml").read_text().removeprefix(BANNER)
    assert text.replace("interval: 1s", "interval: 30s").splitlines()[1:] == committed.splitlines()[1:]
    procs = []
    try:
        east_nodes = {"targets": [addr["e2e-node-1"], addr["e2e-node-2"]], "labels": {"cluster": "east"}}
        proc, east = _cluster_server(tmp / "east", east_nodes, EAST, None)
        procs.append(proc)
        west_nodes = {"targets": [addr["e2e-node-2"], addr["e2e-node-3"]]}
        proc, west = _cluster_server(tmp / "west", west_nodes, WEST, {"cluster": "west"})
        procs.append(proc)
        rules = write_rules(tmp / "region", "global.rules.yaml", text)
        config = prometheus_config([_federate(shipped, "federate-east", east)], [rules], {"region": "r1"})
        proc, region = start_prometheus(tmp / "region", config)
        procs.append(proc)
        jobs = [_federate(shipped, "federate-region", region), _federate(external_label_job, "federate-west", west)]
        rules = write_rules(tmp / "global", "global.rules.yaml", text)
        proc, glob = start_prometheus(tmp / "global", prometheus_config(jobs, [rules]))
        procs.append(proc)
        yield Tiers(east, west, region, glob)
    finally:
        for proc in reversed(procs):
            stop(proc)


def _cluster_values(tiers: Tiers) -> dict[str, dict[Labels, float]]:
    """The tier records as the two cluster servers hold them, west's given its external label."""
    east, west = values(tiers.east, TIER), values(tiers.west, TIER)
    out: dict[str, dict[Labels, float]] = {}
    for record in TIER:
        out[record] = {**east[record], **{k | {("cluster", "west")}: v for k, v in west[record].items()}}
    return out


def _only(tier: dict[str, dict[Labels, float]], cluster: str) -> dict[str, dict[Labels, float]]:
    return {r: {k: v for k, v in series.items() if ("cluster", cluster) in k} for r, series in tier.items()}


@pytest.mark.e2e
def test_global_numbers_are_the_hand_computed_sums(tiers: Tiers) -> None:
    tier = expected_tier()
    wait_recorded(tiers.glob, expected_global(tier))
    wait_recorded(tiers.region, expected_global(_only(tier, "east")))  # the region holds east alone
    # the federated copies are the cluster servers' own series: east's via the region, which adds its
    # external label, the job label the global scrape's
    federated = values(tiers.glob, list(tier))
    assert {r: strip(s, frozenset({"region"})) for r, s in federated.items()} == tier
    assert all((("region", "r1") in k) == (("cluster", "east") in k) for s in federated.values() for k in s)
    assert {r: _cluster_values(tiers)[r] for r in tier} == tier
    for base in dataclasses.astuple(tiers):
        assert not rule_health(base), base


@pytest.mark.e2e
def test_global_numbers_equal_the_sums_of_the_clusters(tiers: Tiers) -> None:
    """Every global record, busy and power included, from what the cluster servers hold at that moment."""
    records = [r["record"] for r in global_rules(OPTS)]

    def disagree() -> dict[str, object]:
        want = expected_global(_cluster_values(tiers))
        got = {r: strip(s, frozenset({"region"})) for r, s in values(tiers.glob, records).items()}
        assert set(want) == set(records)
        return {r: (got[r], want[r]) for r in records if not _close(got[r], want[r], r.endswith(COUNTERS))}

    assert poll(lambda: not disagree(), 20), disagree()


def _close(got: dict[Labels, float], want: dict[Labels, float], counter: bool) -> bool:
    rel = REL_TOL if counter else 1e-9
    return got.keys() == want.keys() and all(math.isclose(got[k], want[k], rel_tol=rel, abs_tol=1e-9) for k in want)


@pytest.mark.e2e
def test_no_raw_or_per_node_series_crosses_the_tier(tiers: Tiers) -> None:
    wait_recorded(tiers.glob, {"k8s_global_clusters": {frozenset(): 2}})
    names = metric_names(tiers.glob)
    raw = sorted(n for n in names if n.startswith(("nvidia_gpu_", "kube_gpu_exporter_", "kube_node_")) or ":" in n
                 or n.startswith(("k8s_container_", "k8s_pod_", "k8s_node_", "k8s_card_")))  # fmt: skip
    assert not raw
    # every tier record the cluster servers hold crossed, and nothing else but the global tier's own:
    # not the region's k8s_global_* series either
    held = (metric_names(tiers.east) | metric_names(tiers.west)) & set(TIER)
    own = {r["record"] for r in global_rules(OPTS)} & names
    scrape = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
              "scrape_series_added"}  # fmt: skip
    assert names - own - scrape == held
