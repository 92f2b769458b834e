"""examples/hpa: the prometheus-adapter external rules and the HorizontalPodAutoscalers using them.

No API server or prometheus-adapter runs here, so the adapter's part is re-done as its code does it
(pkg/naming/metrics_query.go BuildExternal, pkg/naming/metric_namer.go): series discovery with the
rule's seriesQuery and name.matches/as, the HPA's metric selector turned into label matchers
(sorted by key, `=`/`=~`/`!~`/`!=""`/`=""`, values quoted like Go's %q), the HPA's namespace
appended as namespace_name="<ns>", and <<.GroupBy>> empty. The resulting PromQL runs on a real
Prometheus that scrapes simulated-node exporters and evaluates the recording-rule bundle; each value
is compared with the number worked out by hand from the scenario.

Scenario: the three nodes of tests/scenarios/rules_e2e_*.yaml, with one change to node 1: pod
serving/infer-7c6b5d4f3-aaaaa gets a sidecar container `proxy` without any GPU grant whose process
uses 10 % SM and 1e9 B on the shared GPU 1. By hand (percent of one GPU, bytes):

- serving/Deployment infer: containers infer (a) 20 % / 3e9 B, granted 30 %; proxy (a) 10 % / 1e9 B,
  granted nothing; infer (b) 35 % / 5e9 B, granted 50 %. Used 65, memory 9e9, pod a 30, pod b 35;
  used/granted over the granted containers 100 x (20 + 35) / (30 + 50) = 68.75 (the sidecar's 10 %
  would make it 81.25 if it counted).
- ml/StatefulSet train: train-0 65 % (GPU of its own, granted 100), train-1 85 % + 75 % (two GPUs,
  granted 200), memory 6.5e9 + 20.5e9 + 10e9. Used 225, memory 37e9, used/granted 75.
- dev (time-slicing): bare pods nb-a 15 %, nb-b 25 %; nothing granted, so no used/granted series.
"""

from __future__ import annotations

import copy
import json
import math
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from exporter.bundle.rules import RuleOptions, render_rules
from tests.prom_support import (
    PROMETHEUS,
    ROOT,
    SCENARIOS,
    http_get,
    poll,
    query,
    rule_health,
    run_prometheus,
    start_exporter,
    stop,
)
from tests.test_helm import CHART, KUBE_VERSIONS, one, render

EXAMPLES = ROOT / "examples" / "hpa"
ADAPTER_CONFIG = EXAMPLES / "prometheus-adapter-config.yaml"
ADAPTER_VALUES = EXAMPLES / "prometheus-adapter-values.yaml"
HPA_FILES = sorted(EXAMPLES.glob("hpa-*.yaml"))
NAMESPACE_LABEL = "namespace_name"


def external_rules() -> list[dict]:
    return yaml.safe_load(ADAPTER_CONFIG.read_text())["externalRules"]


def hpas() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in HPA_FILES for d in yaml.safe_load_all(p.read_text()) if d]


def external_metrics(hpa: dict) -> list[dict]:
    return [m["external"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]


# --------------------------------------------------------------------------------------------
# what prometheus-adapter does with a rule and an HPA's request


def go_quote(value: str) -> str:
    """Go's %q for the label values a selector can hold (printable ASCII)."""
    assert value.isascii() and value.isprintable(), value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector_requirements(selector: dict | None) -> list[tuple[str, str, list[str]]]:
    """metav1.LabelSelectorAsSelector: (key, operator, sorted values), sorted by key."""
    reqs = [(k, "Equals", [v]) for k, v in (selector or {}).get("matchLabels", {}).items()]
    for expr in (selector or {}).get("matchExpressions", []):
        reqs.append((expr["key"], expr["operator"], sorted(set(expr.get("values", [])))))
    return sorted(reqs, key=lambda r: r[0])


def label_matcher(key: str, op: str, values: list[str]) -> str:
    """metricsQuery.processQueryParts: selectMatcher + selectTargetValue."""
    if not values:
        if op == "Exists":
            return f'{key}!=""'
        if op == "DoesNotExist":
            return f'{key}=""'
        raise ValueError(f"{op} needs values")
    if op in ("Exists", "DoesNotExist"):
        raise ValueError(f"{op} takes no values")
    target = go_quote("|".join(values))
    if len(values) == 1:
        return {"Equals": f"{key}={target}", "NotEquals": f"{key}!={target}", "In": f"{key}=~{target}",
                "NotIn": f"{key}!~{target}"}[op]
    return {"Equals": f"{key}=~{target}", "In": f"{key}=~{target}", "NotEquals": f"{key}!~{target}",
            "NotIn": f"{key}!~{target}"}[op]


def expand(metrics_query: str, series: str, namespace: str, selector: dict | None, namespaced: bool = True) -> str:
    """BuildExternal: the PromQL the adapter sends for one external-metrics request."""
    matchers = [label_matcher(*r) for r in selector_requirements(selector)]
    if namespaced and namespace:
        matchers.append(f"{NAMESPACE_LABEL}={go_quote(namespace)}")
    args = {"Series": series, "LabelMatchers": ",".join(matchers), "GroupBy": ""}

    def field(m: re.Match[str]) -> str:
        assert m.group(1) in args, f"template field {m.group(0)} is not one this test expands"
        return args[m.group(1)]

    out = re.sub(r"<<-?\s*\.(\w+)\s*-?>>", field, metrics_query)
    assert "<<" not in out and ">>" not in out, f"unexpanded template action in {metrics_query!r}"
    return out


def metric_name(rule: dict, series: str) -> str | None:
    """metric_namer: the external metric a discovered series is served as (None: not matched)."""
    name = rule.get("name", {})
    m = re.search(name.get("matches", ""), series)
    if not m:
        return None
    as_ = name.get("as") or ("${1}" if m.groups() else "$0")
    return re.sub(r"\$\{(\d+)\}|\$(\d+)", lambda g: m.group(int(g.group(1) or g.group(2))), as_)


def rule_for(metric: str) -> dict:
    found = [r for r in external_rules() if r["name"]["as"] == metric]
    assert len(found) == 1, f"{metric}: {len(found)} adapter rules serve it"
    return found[0]


def test_expansion_follows_the_adapter():
    sel = {"matchLabels": {"workload_name": "infer", "cluster": "east"},
           "matchExpressions": [{"key": "pod_name", "operator": "In", "values": ["b", "a"]},
                                {"key": "zone", "operator": "NotIn", "values": ["x"]},
                                {"key": "workload_kind", "operator": "Exists"},
                                {"key": "gone", "operator": "DoesNotExist"}]}
    q = expand("sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)", "m", "serving", sel)
    assert q == ('sum(m{cluster="east",gone="",pod_name=~"a|b",workload_kind!="",workload_name="infer",'
                 'zone!~"x",namespace_name="serving"}) by ()')
    assert expand("<< .Series >>{<<.LabelMatchers>>}", "m", "ns", None) == 'm{namespace_name="ns"}'
    assert expand("<<.Series>>{<<.LabelMatchers>>}", "m", "ns", None, namespaced=False) == "m{}"
    assert label_matcher("a", "In", ["x"]) == 'a=~"x"'  # one value: still a regex match
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    rule = {"name": {"matches": "^(.*)_total$", "as": ""}}
    assert metric_name(rule, "x_total") == "x" and metric_name(rule, "x") is None


# --------------------------------------------------------------------------------------------
# manifests


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", [p.name for p in HPA_FILES])
def test_hpa_examples_pass_strict_schema_validation(name, kube_version):
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    assert docs
    for doc in docs:
        assert (doc["apiVersion"], doc["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
        try:
            kubernetes_validate.validate(doc, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {e.message} at {list(e.path)}")


def test_strict_validation_catches_a_misplaced_hpa_field():
    _, hpa = hpas()[0]
    bad = copy.deepcopy(hpa)
    bad["spec"]["metrics"][0]["external"]["metricName"] = "k8s_workload_gpu_used"  # autoscaling/v2beta1 style
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSIONS[-1], strict=True)


# Rates are already averages: Value. Sums over a workload's pods: AverageValue (per replica).
TARGET_TYPE = {"k8s_workload_gpu_used": "AverageValue", "k8s_workload_gpu_memory_used_bytes": "AverageValue",
               "k8s_pod_gpu_used": "AverageValue", "k8s_workload_rate_gpu_used_request": "Value"}


def test_docs_metric_table_is_the_adapter_rules():
    text = (ROOT / "docs" / "hpa.md").read_text()
    table = text[text.index("### Metrics"):text.index("Select with the series' labels")]
    rows = [[c.strip().strip("`") for c in line.split("|")[1:-1]] for line in table.splitlines()
            if line.startswith("| `")]
    assert {r[0]: r[3] for r in rows} == TARGET_TYPE
    for metric, source, *_ in rows:
        series = re.match(r"\w+", rule_for(metric)["seriesQuery"]).group(0)
        assert series in source, metric


def test_every_hpa_metric_is_served_by_an_adapter_rule_with_the_right_target_type():
    assert {r["name"]["as"] for r in external_rules()} == set(TARGET_TYPE)
    used = set()
    for name, hpa in hpas():
        assert external_metrics(hpa), name
        target = hpa["spec"]["scaleTargetRef"]
        for ext in external_metrics(hpa):
            metric = ext["metric"]["name"]
            rule_for(metric)
            used.add(metric)
            assert ext["target"]["type"] == TARGET_TYPE[metric], f"{name}: {metric}"
            # the selector names the HPA's own scale target (the adapter adds the namespace)
            labels = ext["metric"]["selector"]["matchLabels"]
            assert labels == {"workload_kind": target["kind"], "workload_name": target["name"]}, name
    assert {"k8s_workload_gpu_used", "k8s_workload_rate_gpu_used_request"} <= used


def test_adapter_rules_are_namespaced_on_namespace_name_and_aggregate_to_one_series():
    for rule in external_rules():
        assert rule["resources"] == {"overrides": {NAMESPACE_LABEL: {"resource": "namespace"}}}
        assert "namespaced" not in rule["resources"]  # the HPA's namespace is always applied
        series = re.match(r"\w+", rule["seriesQuery"]).group(0)
        assert metric_name(rule, series) == rule["name"]["as"]
        q = rule["metricsQuery"]
        assert "<<.GroupBy>>" not in q and " by " not in q and " by(" not in q  # one series, no grouping
        assert q.count("<<.LabelMatchers>>") == q.count("{"), "every selector is scoped by the request"


# --------------------------------------------------------------------------------------------
# one source of truth: the chart's ConfigMap, the adapter config, the adapter chart values


def test_chart_configmap_and_examples_carry_the_same_rules():
    cm = one(render({"prometheusAdapter": {"configMap": {"enabled": True}}}), "ConfigMap")
    from_chart = yaml.safe_load(cm["data"]["config.yaml"])
    assert from_chart == {"externalRules": external_rules()}
    assert yaml.safe_load(ADAPTER_CONFIG.read_text()).keys() == {"externalRules"}
    chart_file = yaml.safe_load((CHART / "files" / "prometheus-adapter-rules.yaml").read_text())
    assert chart_file == {"externalRules": external_rules()}
    values = yaml.safe_load(ADAPTER_VALUES.read_text())
    assert values["rules"]["external"] == external_rules()
    assert values["prometheus"]["url"].startswith("http")


# --------------------------------------------------------------------------------------------
# the queries on a real Prometheus


@dataclass(frozen=True)
class Case:
    metric: str
    namespace: str
    selector: dict
    want: float | None  # None: the adapter returns no series (the HPA gets no metric)


def _w(kind: str, name: str) -> dict:
    return {"matchLabels": {"workload_kind": kind, "workload_name": name}}


INFER, TRAIN = _w("Deployment", "infer"), _w("StatefulSet", "train")
CASES = [
    Case("k8s_workload_gpu_used", "serving", INFER, 20 + 10 + 35),
    Case("k8s_workload_gpu_used", "ml", TRAIN, 65 + 85 + 75),
    Case("k8s_workload_gpu_used", "ml", {"matchLabels": {"workload_name": "train"}}, 225),
    Case("k8s_workload_gpu_used", "serving", TRAIN, None),  # another namespace's workload: invisible
    Case("k8s_workload_gpu_used", "dev", {"matchExpressions": [{"key": "workload_kind", "operator": "Exists"}]},
         15 + 25),
    Case("k8s_workload_gpu_used", "dev",
         {"matchExpressions": [{"key": "workload_name", "operator": "NotIn", "values": ["nb-a"]}]}, 25),
    Case("k8s_workload_gpu_memory_used_bytes", "serving", INFER, 3e9 + 1e9 + 5e9),
    Case("k8s_workload_gpu_memory_used_bytes", "ml", TRAIN, 6.5e9 + 20.5e9 + 10e9),
    Case("k8s_pod_gpu_used", "serving", {"matchLabels": {"pod_name": "infer-7c6b5d4f3-aaaaa"}}, 20 + 10),
    Case("k8s_pod_gpu_used", "serving", INFER, 65),
    Case("k8s_pod_gpu_used", "ml",
         {"matchExpressions": [{"key": "pod_name", "operator": "In", "values": ["train-1", "train-0"]}]}, 225),
    Case("k8s_pod_gpu_used", "ml", {"matchLabels": {"pod_name": "train-1"}}, 85 + 75),
    Case("k8s_workload_rate_gpu_used_request", "serving", INFER, 100 * (20 + 35) / (30 + 50)),
    Case("k8s_workload_rate_gpu_used_request", "ml", TRAIN, 100 * 225 / 300),
    Case("k8s_workload_rate_gpu_used_request", "dev", _w("Pod", "nb-a"), None),  # time-slicing: no grant
]


def node1_with_sidecar(path: Path) -> Path:
    scenario = yaml.safe_load((SCENARIOS / "rules_e2e_east_node1.yaml").read_text())
    pod = next(p for p in scenario["pods"] if p["metadata"]["name"] == "infer-7c6b5d4f3-aaaaa")
    cid = "5" * 64
    slice_ = "kubepods-burstable-pod" + pod["metadata"]["uid"].replace("-", "_") + ".slice"
    scenario["devices"][1]["processes"].append(
        {"pid": 203, "used_memory_bytes": 1_000_000_000, "sm_util": 10,
         "cgroup": f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"})
    pod["spec"]["containers"].append({"name": "proxy", "image": "example.com/proxy:1"})
    pod["status"]["containerStatuses"].append(
        {"name": "proxy", "ready": True, "restartCount": 0, "image": "example.com/proxy:1", "imageID": "",
         "containerID": f"containerd://{cid}"})
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus with the recording rules (evaluated every second) over the three exporters."""
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    tmp = tmp_path_factory.mktemp("hpa-e2e")
    nodes = [(node1_with_sidecar(tmp / "node1-sidecar.yaml"), "e2e-node-1"),
             (SCENARIOS / "rules_e2e_east_node2.yaml", "e2e-node-2"),
             (SCENARIOS / "rules_e2e_west_node3.yaml", "e2e-node-3")]
    procs = []
    try:
        targets = []
        for scenario, node in nodes:
            proc, address = start_exporter(scenario, node, tmp)
            procs.append(proc)
            targets.append(address)
        # the chart's PrometheusRule holds exactly this bundle, with a 30 s interval
        proc, base = run_prometheus(tmp, render_rules(RuleOptions(interval="1s")), [{"targets": targets}])
        procs.append(proc)
        # every recorded series the adapter rules read is in, from all three nodes (7 containers);
        # the first scrape lands ~6 s after start
        ready = poll(lambda: all(query(base, f"count({r['seriesQuery']})") for r in external_rules())
                     and set(query(base, "count(k8s_container_gpu_used)").values()) == {7.0}, deadline_s=60)
        assert ready, "the recording rules produced no series: see prometheus.log in " + str(tmp)
        assert not rule_health(base)
        yield base
    finally:
        for proc in reversed(procs):
            stop(proc)


def discovered_series(base: str, rule: dict) -> str:
    """The adapter's series listing: seriesQuery -> series name -> name.matches/as."""
    body = json.loads(http_get(f"{base}/api/v1/series?{urllib.parse.urlencode({'match[]': rule['seriesQuery']})}"))
    assert body["status"] == "success", body
    names = {s["__name__"] for s in body["data"]}
    served = {n for n in names if metric_name(rule, n) == rule["name"]["as"]}
    assert len(served) == 1, f"{rule['name']['as']}: discovered series {names}"
    return served.pop()


def adapter_query(base: str, metric: str, namespace: str, selector: dict) -> str:
    rule = rule_for(metric)
    return expand(rule["metricsQuery"], discovered_series(base, rule), namespace, selector)


@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.metric}-{c.namespace}-{c.want}")
def test_adapter_query_returns_the_value_worked_out_by_hand(prometheus: str, case: Case):
    q = adapter_query(prometheus, case.metric, case.namespace, case.selector)
    got = query(prometheus, q)
    if case.want is None:
        assert got == {}, q
        return
    assert len(got) == 1, f"{q}: {got}"  # the HPA sums whatever comes back: exactly one series
    (value,) = got.values()
    assert math.isclose(value, case.want, rel_tol=1e-9), f"{q} = {value}, want {case.want}"


@pytest.mark.e2e
def test_every_adapter_rule_has_a_case():
    assert {c.metric for c in CASES} == set(TARGET_TYPE)


# Each example HPA on this scenario: the metric value it would read, and the replica count the HPA
# controller computes from it with the Deployment at its two pods (infer-...-aaaaa, infer-...-bbbbb).
HPA_EXPECTED = {
    ("hpa-gpu-used.yaml", "k8s_workload_gpu_used"): (65.0, 2),  # ceil(65 / 40)
    ("hpa-gpu-used-request.yaml", "k8s_workload_rate_gpu_used_request"): (68.75, 2),  # 68.75 / 70 within 10 %
}


def desired_replicas(target: dict, value: float, replicas: int, tolerance: float = 0.1) -> int:
    """The HPA controller's replica calculation for one External metric (replica_calculator.go)."""
    if target["type"] == "AverageValue":
        per_replica = float(target["averageValue"])
        ratio = value / (per_replica * replicas)
        return replicas if abs(1 - ratio) <= tolerance else math.ceil(value / per_replica)
    ratio = value / float(target["value"])
    return replicas if abs(1 - ratio) <= tolerance else math.ceil(ratio * replicas)


@pytest.mark.e2e
def test_example_hpas_read_their_metric_from_the_adapter(prometheus: str):
    seen = set()
    for name, hpa in hpas():
        ns = hpa["metadata"]["namespace"]
        for ext in external_metrics(hpa):
            metric = ext["metric"]["name"]
            want, replicas = HPA_EXPECTED[(name, metric)]
            got = query(prometheus, adapter_query(prometheus, metric, ns, ext["metric"]["selector"]))
            assert len(got) == 1 and math.isclose(next(iter(got.values())), want), (name, got)
            assert desired_replicas(ext["target"], want, 2) == replicas
            seen.add((name, metric))
    assert seen == set(HPA_EXPECTED)


def test_replica_calculation_reference():
    assert desired_replicas({"type": "AverageValue", "averageValue": "40"}, 200, 2) == 5
    assert desired_replicas({"type": "AverageValue", "averageValue": "40"}, 84, 2) == 2  # 5 % off: within
    assert desired_replicas({"type": "Value", "value": "70"}, 35, 4) == 2
