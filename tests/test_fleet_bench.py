"""The fleet benchmark's pieces on a few nodes (seconds): generator, rendering, TKE inputs, server, one run.

The numbers of bench/rule_cost.py are measurements (docs/scaling.md); these tests only hold what
they rest on: the synthetic nodes are what the exporter itself serves for the same scenario, the
seed's TKE group evaluates on the generated inputs, and the one command runs end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_model import BLOCK, build_block, build_fleet
from bench.fleet_render import node_exposition, node_families, rule_inputs, scenario
from bench.fleet_serve import FACTORS, Shard
from bench.fleet_tke import seed_records, seed_rule_file, tke_families
from bench.rule_cost_report import equivalent
from exporter.bundle.rules import HELPERS

ROOT = Path(__file__).resolve().parents[1]
PROMTOOL = "promtool"


def _kinds(seed: int = 1, blocks: int = 20) -> dict[str, int]:
    """The first block of each kind."""
    out: dict[str, int] = {}
    for b in range(blocks):
        out.setdefault(build_block(seed, b)[0].kind, b)
    return out


def _node(kind: str):
    return build_block(1, _kinds()[kind])[1]


def _keys(text: str) -> set[tuple[str, frozenset]]:
    return {(s.name, frozenset(s.labels.items())) for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_fleet_is_deterministic_and_smaller_fleets_are_prefixes() -> None:
    assert build_fleet(25, seed=1) == build_fleet(25, seed=1)
    assert build_fleet(25, seed=1) != build_fleet(25, seed=2)
    assert build_fleet(12, seed=1) == build_fleet(25, seed=1)[:12]
    assert _node("mig") == _node("mig")


def test_the_mix_has_what_a_fleet_has() -> None:
    fleet = [n for b in range(20) for n in build_block(1, b)]
    assert {n.kind for n in fleet} == {"train", "infer", "gpushare", "hami", "mig"}
    assert len({n.cluster for n in fleet}) == 3 and len({n.name for n in fleet}) == len(fleet)
    nodes_of: dict[tuple[str, str], set[str]] = {}
    for n in fleet:
        for p in n.pods:
            nodes_of.setdefault((p.workload_kind, p.workload_name), set()).add(n.name)
    spanning = {kind for (kind, _), nodes in nodes_of.items() if len(nodes) > 1}
    assert {"StatefulSet", "Job", "Deployment"} <= spanning  # trainers and Deployments span nodes
    per_card = Counter((n.name, u.device) for n in fleet if n.kind in ("gpushare", "hami")
                       for p in n.pods for c in p.containers for u in c.uses)
    assert set(per_card.values()) <= {2, 3, 4}
    mig = [d for n in fleet for d in n.devices if d.parent]
    assert {d.profile.split(".")[0] for d in mig} == {"1g", "2g", "3g"}
    assert any(d.util == 0 for n in fleet for d in n.devices if not d.parent)  # idle GPUs
    namespaces = {(n.cluster, p.namespace) for n in fleet for p in n.pods}
    assert len({ns for _, ns in namespaces}) < len(namespaces)  # namespaces repeat across clusters


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["hami", "gpushare", "mig", "train"])
def test_a_node_is_exactly_what_the_exporter_serves_for_it(kind: str, tmp_path: Path) -> None:
    node = _node(kind)
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(scenario(node)))
    out = subprocess.run([sys.executable, "-m", "exporter", "render", "--simulate", str(path), "--node-name",
                          node.name], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    real = _keys(out.stdout)
    ours = _keys(node_exposition(node).decode())
    assert ours == real  # one cycle (the CLI) or two (the generator): the same series
    modes = {dict(lbl).get("allocate_mode") for name, lbl in real if name == "nvidia_gpu_memory_used_bytes"}
    assert modes == {"train": {"exclusive"}, "mig": {"exclusive", "None"}}.get(kind, {"share", "None"})
    # with the target labels, each family once, counters with a rate
    fams = node_families(node)
    assert len({f.name for f in fams}) == len(fams)
    assert all(b'cluster="' in s.key and b'instance="' in s.key for f in fams for s in f.samples)
    rates = {f.name for f in fams for s in f.samples if s.rate}
    assert "nvidia_gpu_container_energy_joules_total" in rates
    assert kind == "mig" or "nvidia_gpu_busy_seconds_total" in rates
    lean = node_families(node, profile="rules")
    assert {f.name for f in lean} <= rule_inputs() and sum(len(f.samples) for f in lean) < len(real)


def test_the_shard_body_parses_and_moves_between_scrapes() -> None:
    nodes = [_node("hami"), _node("infer")]
    shard = Shard(f for n in nodes for f in node_families(n) + tke_families(n))
    first, second = shard.body(0.0, vary=True), shard.body(10.0, vary=True)
    a, b = (_values(x.decode()) for x in (first, second))
    assert a.keys() == b.keys() and len(a) == shard.series
    moved = {k[0] for k in a if a[k] != b[k]}
    assert {"nvidia_gpu_container_busy_seconds_total", "nvidia_gpu_duty_cycle", "container_gpu_utilization"} <= moved
    assert all(b[k] >= a[k] for k in a if k[0].startswith("nvidia_gpu_") and k[0].endswith("_total"))  # counters
    held = _values(shard.body(20.0, vary=False).decode())
    assert all(held[k] == a[k] for k in a if k[0] == "nvidia_gpu_duty_cycle") and FACTORS[0] == 1.0


def _values(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


@pytest.mark.e2e
def test_the_seed_group_evaluates_on_the_generated_tke_inputs(tmp_path: Path) -> None:
    nodes = build_fleet(BLOCK + 2, seed=1)  # two blocks: two clusters
    series = [{"series": s.key.decode(), "values": f"{s.value!r}x3"} for n in nodes for f in tke_families(n)
              for s in f.samples]
    sm = [u.sm for n in nodes for p in n.pods for c in p.containers for u in c.uses if u.sm is not None]
    compute = [u.compute for n in nodes for p in n.pods for c in p.containers for u in c.uses if u.compute]
    gpus = 100 * sum(1 for n in nodes for d in n.devices if not d.lost)
    using = {(n.cluster, p.namespace) for n in nodes for p in n.pods for c in p.containers if c.uses[0].sm is not None}
    exp = [("sum(tke:k8s_pod_gpu_used)", sum(sm)), ("sum(tke:k8s_pod_gpu_request)", sum(compute)),
           ("sum(tke:k8s_cluster_gpu_total)", gpus), ("count(tke:kube_node_status_capacity_gpu)", len(nodes)),
           ("count(tke:k8s_pod_gpu_memory_used_bytes)", sum(len(n.pods) for n in nodes)),
           # the cluster label survives down to the pods, the namespaces are fleet-wide
           ("count(count by (cluster) (tke:k8s_pod_gpu_memory_used_bytes))", len({n.cluster for n in nodes})),
           ("count(tke:k8s_namespace_gpu_used)", len({ns for _, ns in using}))]
    (tmp_path / "tke.rules.yaml").write_text(seed_rule_file())
    test = {"rule_files": ["tke.rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
                {"expr": e, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": v}]} for e, v in exp]}]}
    (tmp_path / "tke.test.yaml").write_text(yaml.safe_dump(test, width=1000))
    out = subprocess.run([PROMTOOL, "test", "rules", "tke.test.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(seed_records()) == 38 and "tke:k8s_cluster_gpu_total" in seed_rule_file()


@pytest.mark.e2e
def test_the_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    """Twelve nodes (two clusters), 1 s intervals: every number present, ours equal to the model."""
    argv = ["--nodes", str(BLOCK + 2), "--interval", "1s", "--scrape-timeout", "1s", "--evaluations", "2",
            "--full-up-to", "0", "--workers", "1", "--replay-reps", "1", "--out", str(tmp_path)]
    out = subprocess.run([sys.executable, "-m", "bench.rule_cost", *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads((tmp_path / "rule_cost.json").read_text())
    (run,) = report["runs"]
    assert run["groups"]["k8s-gpu"]["evaluations"] == 2 and run["groups"]["k8s-gpu"]["seconds_median"] > 0
    assert not run["groups"]["k8s-gpu"]["unhealthy"] and not run["groups"]["tke-seed"]["unhealthy"]
    assert run["prometheus"]["head_series"] > run["scraped_series"]["exporter"] > 0
    assert all(n > 0 for n in run["recorded_series"]["tke-seed"].values() if n is not None)
    # an equivalent series costs the helpers it reads: the pod-info and usage ones, not the counters'
    assert run["rule_reads"]["k8s_pod_gpu_used"] == ["k8s_container_gpu_used"]
    helpers = equivalent(run)["helpers"]
    assert HELPERS["info"] in helpers and HELPERS["duty"] in helpers and HELPERS["busy"] not in helpers
    comparison = run["comparison"]
    for name, q in comparison.items():
        if not name.startswith("_"):
            assert q["ours"]["missing"] == q["ours"]["nan"] == 0 and q["ours"]["max_rel_error"] < 1e-9, (name, q)
    assert comparison["namespace_rate"]["seed_vs_cluster"]["max_abs_error"] > 1  # fleet-wide, not per cluster
    assert comparison["_notes"]["scalar_over_per_cluster_totals"]["nan"] > 0
    assert "| rules | 12 |" in (tmp_path / "rule_cost.md").read_text()


class _Groups:
    """Prometheus' /api/v1/rules as _collect reads it: the fast group evaluates every poll, the slow one
    every third."""

    def __init__(self) -> None:
        self.polls = 0

    def groups(self) -> dict[str, dict[str, object]]:
        self.polls += 1

        def group(evaluated: int) -> dict[str, object]:
            return {"lastEvaluation": f"t{evaluated}", "evaluationTime": 0.01,
                    "rules": [{"name": "r", "evaluationTime": 0.001, "health": "ok"}]}

        return {"fast": group(self.polls), "slow": group(self.polls // 3)}


def test_each_group_is_summarised_over_as_many_evaluations_as_asked() -> None:
    """A fast group goes on evaluating while a slow one is awaited (a CI run under load reported 3 of 2)."""
    from bench.rule_cost import _collect, _group_summary

    prom = _Groups()
    evals = _collect(prom, ["fast", "slow"], 2, 1.0, sleep=lambda s: None)  # type: ignore[arg-type]
    assert prom.polls > 4  # the fast group evaluated more often meanwhile
    assert {g: _group_summary(e)["evaluations"] for g, e in evals.items()} == {"fast": 2, "slow": 2}
