"""The recording-rule bundle: freshness, promtool validity and unit tests, generator options."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.bundle import rules as rulesgen
from exporter.bundle import rules_cli
from exporter.bundle.rules import (
    HELPERS,
    LEVELS,
    RuleOptions,
    RuleOptionsError,
    render_prometheusrule,
    render_rules,
)
from exporter.shell.generate import BANNER, COMMANDS

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "rules"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# Every committed rendering and the exact arguments that produce it (docs/rules.md lists the same).
COMMITTED: dict[str, list[str]] = {
    "rules/kube-gpu-exporter.rules.yaml": [],
    "rules/kube-gpu-exporter.prometheusrule.yaml": [
        "--format=prometheusrule",
        "--label=app.kubernetes.io/name=kube-gpu-exporter",
    ],
    "rules/tests/rendered/custom-cluster.rules.yaml": [
        "--cluster-label=cluster",
        "--pod-label=pod",
        "--namespace-label=namespace",
        "--container-label=container",
        "--node-label=node",
    ],
}

# The seed's table (issue 4), which dashboards and HPA configs rely on.
SEED_SERIES = {
    "container": [
        "k8s_container_gpu_used",
        "k8s_container_rate_gpu_used_request",
        "k8s_container_rate_gpu_used_node",
        "k8s_container_gpu_memory_used_bytes",
        "k8s_container_rate_gpu_memory_used_request",
        "k8s_container_rate_gpu_memory_used_node",
    ],
    "pod": [
        "k8s_pod_gpu_used",
        "k8s_pod_gpu_request",
        "k8s_pod_rate_gpu_used_request",
        "k8s_pod_rate_gpu_used_node",
        "k8s_pod_gpu_memory_used_bytes",
        "k8s_pod_gpu_memory_request_bytes",
        "k8s_pod_rate_gpu_memory_used_request",
        "k8s_pod_rate_gpu_memory_used_node",
        "k8s_pod_gpu_allocated_compute",  # seed 003 view
    ],
    "node": [
        "kube_node_status_capacity_gpu",
        "kube_node_status_capacity_gpu_memory_bytes",
        "kube_node_status_allocatable_gpu",
        "kube_node_status_allocatable_gpu_memory_bytes",
        "k8s_node_gpu_used",
        "k8s_node_gpu_memory_used_bytes",
        "k8s_node_rate_gpu_used",
        "k8s_node_rate_gpu_memory_used",
        "k8s_node_rate_gpu_memory_allocated",  # seed 003 views from here on
        "k8s_node_gpu_allocated_devices",
        "k8s_card_gpu_allocated_compute",
        "k8s_card_rate_gpu_memory_allocated",
    ],
    "workload": [
        "k8s_workload_gpu_used",
        "k8s_workload_rate_gpu_used_cluster",
        "k8s_workload_gpu_memory_used_bytes",
        "k8s_workload_rate_gpu_memory_used_cluster",
    ],
    "namespace": [
        "k8s_namespace_gpu_used",
        "k8s_namespace_rate_gpu_used_cluster",
        "k8s_namespace_gpu_memory_used_bytes",
        "k8s_namespace_rate_gpu_memory_used_cluster",
    ],
    "cluster": [
        "k8s_cluster_gpu_total",
        "k8s_cluster_gpu_memory_total_bytes",
        "k8s_cluster_gpu_used",
        "k8s_cluster_rate_gpu_used_cluster",
        "k8s_cluster_rate_gpu_request_cluster",
        "k8s_cluster_gpu_memory_used_bytes",
        "k8s_cluster_rate_gpu_memory_used_cluster",
        "k8s_cluster_rate_gpu_memory_request_cluster",
    ],
}

# The per-container counters' window averages (issue 18): busy (% of one GPU) and power (W) per level.
COUNTER_SERIES = {
    level: [f"k8s_{level}_gpu_busy", f"k8s_{level}_gpu_power_watts"]
    for level in ("container", "pod", "node", "workload", "namespace", "cluster")
}

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PROMQL_WORDS = {
    "sum", "max", "min", "count", "group", "topk", "avg", "by", "on", "group_left", "group_right",
    "and", "or", "unless", "without", "ignoring", "bool", "label_replace", "rate",
}  # fmt: skip


def _rules(text: str) -> list[dict]:
    doc = yaml.safe_load(text)
    groups = doc["spec"]["groups"] if "spec" in doc else doc["groups"]
    return [r for g in groups for r in g["rules"]]


def _metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (strips strings, label matchers and by/on lists)."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors ([5m])
    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = {m.group(0) for m in _NAME_RE.finditer(expr)}
    return {n for n in names if n not in _PROMQL_WORDS and not re.fullmatch(r"\d.*|e\d+", n)}


def _documented_inputs() -> set[str]:
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    return set(re.findall(r"`(nvidia_gpu_[a-z_]+)`", text))


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ committed bundle


@pytest.mark.e2e
@pytest.mark.parametrize("path", sorted(COMMITTED))
def test_committed_rendering_is_fresh(path: str, tmp_path: Path) -> None:
    out = tmp_path / "fresh.yaml"
    assert rules_cli.main([*COMMITTED[path], "-o", str(out)]) == 0
    fresh = out.read_text(encoding="utf-8")
    committed = (ROOT / path).read_text(encoding="utf-8")
    assert committed == BANNER + fresh, f"{path} is stale: run scripts/generate.sh"
    assert COMMANDS[path] == ("rules", tuple(COMMITTED[path])), "scripts/generate.sh renders it otherwise"


def test_templates_ship_inside_the_package() -> None:
    # pyproject's package-data ("*.j2" in every package under exporter/) carries them into a
    # wheel; rules/templates is a link so they are also found where the issue says.
    assert rulesgen.TEMPLATE_DIR.is_relative_to(ROOT / "exporter")
    names = sorted(p.name for p in rulesgen.TEMPLATE_DIR.glob("*.j2"))
    assert names == ["groups.yaml.j2", "macros.j2", "prometheusrule.yaml.j2", "rules.yaml.j2"]
    assert (RULES / "templates").resolve() == rulesgen.TEMPLATE_DIR
    assert not (rulesgen.TEMPLATE_DIR / "__init__.py").exists()  # namespace package: found by find


def test_default_bundle_has_every_seed_series_once() -> None:
    records = [r["record"] for r in _rules((RULES / "kube-gpu-exporter.rules.yaml").read_text())]
    assert len(records) == len(set(records))
    for level, names in SEED_SERIES.items():
        missing = [n for n in names if n not in records]
        assert not missing, f"{level}: {missing}"


def test_prometheusrule_wraps_the_same_groups() -> None:
    plain = yaml.safe_load((RULES / "kube-gpu-exporter.rules.yaml").read_text())
    pr = yaml.safe_load((RULES / "kube-gpu-exporter.prometheusrule.yaml").read_text())
    assert pr["apiVersion"] == "monitoring.coreos.com/v1"
    assert pr["kind"] == "PrometheusRule"
    assert pr["metadata"] == {
        "name": "kube-gpu-exporter",
        "labels": {"app.kubernetes.io/name": "kube-gpu-exporter"},
    }
    assert pr["spec"]["groups"] == plain["groups"]


def test_prometheusrule_metadata_options() -> None:
    text = render_prometheusrule(
        RuleOptions(), "gpu-rules", "monitoring", {"release": "kps", "enabled": "true"}
    )
    pr = yaml.safe_load(text)
    assert pr["metadata"] == {
        "name": "gpu-rules",
        "namespace": "monitoring",
        "labels": {"release": "kps", "enabled": "true"},
    }
    with pytest.raises(RuleOptionsError, match="--name"):
        render_prometheusrule(RuleOptions(), "Bad_Name")


# ------------------------------------------------------------------ semantics visible in the text


def test_inputs_are_only_documented_exporter_metrics() -> None:
    """No kube-state-metrics, no cAdvisor: only what docs/metrics.md documents, or our own records."""
    inputs = _documented_inputs()
    assert "nvidia_gpu_duty_cycle" in inputs and "nvidia_gpu_pod_info" in inputs
    for path in COMMITTED:
        rules = _rules((ROOT / path).read_text())
        recorded: set[str] = set()
        for rule in rules:
            unknown = _metric_names(rule["expr"]) - inputs - recorded
            assert not unknown, f"{path} {rule['record']} reads {unknown}"
            recorded.add(rule["record"])  # only series recorded EARLIER: no one-interval lag


def test_no_seed_defects() -> None:
    text = (RULES / "kube-gpu-exporter.rules.yaml").read_text()
    assert "namesapce" not in text
    assert "scalar(" not in text  # NaN as soon as two clusters share a Prometheus
    assert not re.search(r"\*\s*0\b(?!\.)", text)  # no `+ on(...) group_left X * 0` filtering trick
    assert "container_cpu" not in text and "kube_pod_status_phase" not in text
    for rule in _rules(text):
        if "_rate_" in rule["record"]:
            # every ratio divides by a guarded denominator (no +Inf) after summing separately
            assert re.search(r"/\s.*> 0\)", rule["expr"], re.S), rule["record"]


def test_cluster_label_is_kept_by_every_aggregation_and_join() -> None:
    text = (RULES / "tests/rendered/custom-cluster.rules.yaml").read_text()
    clauses = re.findall(r"\b(by|on)\s*\(([^)]*)\)", text)
    assert clauses
    for kind, labels in clauses:
        assert "cluster" in [s.strip() for s in labels.split(",")], f"{kind} ({labels})"
    for rule in _rules(text):
        if rule["record"].endswith("_cluster") and not rule["record"].startswith("k8s_cluster_"):
            assert "on (cluster) group_left ()" in rule["expr"], rule["record"]
    # and the default rendering has no trace of a cluster label
    assert "cluster)" not in (RULES / "kube-gpu-exporter.rules.yaml").read_text().replace("_cluster", "")


def test_custom_label_names_replace_the_defaults() -> None:
    text = (RULES / "tests/rendered/custom-cluster.rules.yaml").read_text()
    for default in ("pod_name", "namespace_name", "container_name", "node_name"):
        assert not re.search(rf"\b{default}\b", text), default


_COPY_RE = re.compile(r'^\s*"(\w+)", "\$1", "(\w+)", "\(\.\*\)"\)', re.M)
K8S_COPIES = {
    "k8s_container_": ["namespace", "pod", "container"],
    "k8s_pod_": ["namespace", "pod"],
    "k8s_workload_": ["namespace"],
    "k8s_namespace_": ["namespace"],
}
# Per-node and cluster-wide divisors, read on the right of a `group_left ()` (which adds no label).
DIVISORS = {"nvidia_gpu_num_devices", "nvidia_gpu_node_memory_total_bytes", "nvidia_gpu_node_healthy_devices",
            "nvidia_gpu_node_healthy_memory_bytes", "kube_node_status_allocatable_gpu",
            "kube_node_status_allocatable_gpu_memory_bytes"}
_SERIES_RE = re.compile(r"(?<![\w:])(nvidia_gpu_\w+|k8s_\w+|kube_node_\w+|[a-z_]+:[\w:]+)(?![\w:])")


def _copies(record: str) -> list[str]:
    if record == HELPERS["info"]:
        return ["namespace", "pod"]
    return next((names for prefix, names in K8S_COPIES.items() if record.startswith(prefix)), [])


def _how_copied(record: str, expr: str) -> str:
    """How a rule's result gets its namespace/pod/container; AssertionError where it could be the scrape's.

    ``copied``: label_replace outermost (after every aggregation) from the exporter's labels;
    ``joined``: some of them brought by a ``group_left`` from the pod-info helper (which copies
    them outermost), the rest copied outermost; ``kept``: the rule reads only recorded series
    carrying them (plus divisors joined with ``group_left ()``), groups by all of them where it
    aggregates and never matches one-to-one with ``on`` (which keeps only the labels it lists);
    ``none``: a level without copies, which names none of them.
    """
    k8s = {"namespace", "pod", "container"}
    want = set(_copies(record))
    copies = _COPY_RE.findall(expr)
    assert all(source == f"{name}_name" for name, source in copies), record
    copied = {name for name, _ in copies}
    assert expr.startswith("label_replace(" * len(copies)), f"{record}: copies not outermost"
    joins = re.findall(r"group_left \(([^)]*)\)\s*" + re.escape(HELPERS["info"]), expr)
    joined = {n.strip() for j in joins for n in j.split(",")} & k8s
    other = re.sub(r"group_left \([^)]*\)\s*" + re.escape(HELPERS["info"]), "", expr)
    clauses = [{n.strip() for n in c.split(",")} for c in re.findall(r"\b(?:by|on|group_left) \(([^)]*)\)", other)]
    if not want:
        assert not copied and not joined and not any(c & k8s for c in clauses), record
        return "none"
    if copied or joined:
        assert copied | joined == want and not copied & joined, f"{record}: {copied} + {joined} != {want}"
        assert not any(c & k8s for c in clauses), f"{record}: groups or matches by a copy"
        return "joined" if joined else "copied"
    read = set(_SERIES_RE.findall(expr))
    carriers = {n for n in read if want <= set(_copies(n))}
    assert carriers, f"{record}: no copies and reads no series carrying them"
    for name in read - carriers:
        assert name in DIVISORS, f"{record} reads {name}, which does not carry the copies"
        assert expr.index("group_left ()") < expr.index(name), f"{record}: {name} is not a divisor"
    assert all(not c & k8s or want <= c for c in clauses), f"{record}: groups by some of the copies only"
    assert not re.search(r"\bon \([^)]*\) (?!group_left)", expr), f"{record}: one-to-one on (...) drops them"
    return "kept"


def test_kube_prometheus_stack_labels_come_from_the_exporters_labels() -> None:
    """namespace/pod/container: copied from the exporter's labels after every aggregation, joined from
    the pod-info helper, or kept from recorded series of the bundle carrying them; never the scrape's.

    The values are proven in a real Prometheus with the exporter pod's own labels on every target
    (tests/test_rules_restructure.py)."""
    how = {r["record"]: _how_copied(r["record"], r["expr"])
           for r in _rules((RULES / "kube-gpu-exporter.rules.yaml").read_text())}
    assert how[HELPERS["info"]] == "copied" and how["k8s_container_gpu_used"] == "joined"
    assert how["k8s_pod_gpu_allocated_compute"] == "joined"
    assert how["k8s_pod_gpu_used"] == how["k8s_container_rate_gpu_used_node"] == "kept"
    assert how["k8s_namespace_gpu_used"] == "copied"
    # every --levels subset: the pods computed without the container level join the copies too
    for levels in (("pod",), ("container", "workload"), ("workload", "namespace")):
        rendered = _rules(render_rules(RuleOptions(levels=levels)))
        sub = {r["record"]: _how_copied(r["record"], r["expr"]) for r in rendered}
        assert sub.get("k8s_pod_gpu_used", "joined") == "joined"
    # a name a label option already has is not copied (nor is another dimension overwritten)
    text = render_rules(RuleOptions(namespace_label="namespace", container_label="pod"))
    assert set(_COPY_RE.findall(text)) == {("container", "pod")}
    assert not _COPY_RE.findall((RULES / "tests/rendered/custom-cluster.rules.yaml").read_text())


@pytest.mark.parametrize(("record", "expr"), [
    # a raw row grouped by the scrape's own namespace/pod
    ("k8s_pod_gpu_used", "sum by (node_name, namespace_name, pod_name, namespace, pod) (nvidia_gpu_duty_cycle)"),
    # recorded series, but grouped by one copy only
    ("k8s_pod_gpu_used", "sum by (node_name, namespace_name, pod_name, pod) (k8s_container_gpu_used)"),
    # a one-to-one on (...) that drops the copies the two sides carry
    ("k8s_pod_rate_gpu_used_request", "k8s_pod_gpu_used * 100 / on (node_name, pod_name) (k8s_pod_gpu_request > 0)"),
    # a copy made inside, before an aggregation
    ("k8s_namespace_gpu_used", 'sum by (namespace_name) (label_replace(nvidia_gpu_duty_cycle, "namespace", "$1", '
     '"namespace_name", "(.*)"))'),
    # joined from the helper but the container copy missing
    ("k8s_container_gpu_used", f"{HELPERS['duty']} * on (namespace_name, pod_name) group_left (workload_kind, "
     f"workload_name, namespace, pod) {HELPERS['info']}"),
])
def test_the_label_check_catches_a_copy_that_could_be_the_scrapes(record: str, expr: str) -> None:
    with pytest.raises(AssertionError):
        _how_copied(record, expr)


# ------------------------------------------------------------------ promtool


@pytest.mark.e2e
def test_promtool_check_rules_clean() -> None:
    res = _promtool(
        "check",
        "rules",
        "rules/kube-gpu-exporter.rules.yaml",
        "rules/tests/rendered/custom-cluster.rules.yaml",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == 2
    assert "WARNING" not in (res.stdout + res.stderr).upper()


@pytest.mark.e2e
def test_promtool_unit_tests_pass() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (RULES / "tests").glob("*.yaml"))
    assert len(files) >= 2
    res = _promtool("test", "rules", *files)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(files)


@pytest.mark.e2e
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """A wrong expectation must make promtool fail (guards against vacuous test files)."""
    src = (RULES / "tests" / "default.test.yaml").read_text()
    bad = src.replace("value: 38.75    # 155 * 100 / 400", "value: 38.5", 1)
    assert bad != src
    (tmp_path / "bad.test.yaml").write_text(
        bad.replace("../kube-gpu-exporter.rules.yaml", str(RULES / "kube-gpu-exporter.rules.yaml"))
    )
    res = _promtool("test", "rules", str(tmp_path / "bad.test.yaml"))
    assert res.returncode != 0
    assert "k8s_node_rate_gpu_used" in res.stdout + res.stderr


@pytest.mark.parametrize("test_file", sorted(p.name for p in (RULES / "tests").glob("*.yaml")))
def test_every_recorded_series_is_asserted(test_file: str) -> None:
    spec = yaml.safe_load((RULES / "tests" / test_file).read_text())
    recorded = set()
    for rf in spec["rule_files"]:
        recorded |= {r["record"] for r in _rules((RULES / "tests" / rf).read_text())}
    asserted: set[str] = set()
    for case in spec["tests"]:
        assert case.get("interval", spec.get("evaluation_interval")) == spec["evaluation_interval"] == "30s"
        for t in case.get("promql_expr_test", []):
            asserted |= _metric_names(t["expr"])
            for sample in t.get("exp_samples") or []:
                # expectations name the series they expect, so a typo cannot pass silently
                assert sample["labels"].split("{")[0] in _metric_names(t["expr"]) | {""}
    assert recorded - asserted == set()


@pytest.mark.e2e
def test_promtool_check_for_each_single_level(tmp_path: Path) -> None:
    paths = []
    for level in LEVELS:
        p = tmp_path / f"{level}.yaml"
        p.write_text(render_rules(RuleOptions(levels=(level,), cluster_label="cluster")))
        paths.append(str(p))
    res = _promtool("check", "rules", *paths)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("n", range(1, len(LEVELS) + 1))
def test_any_level_subset_is_self_contained(n: int) -> None:
    inputs = _documented_inputs()
    for levels in itertools.combinations(LEVELS, n):
        rules = _rules(render_rules(RuleOptions(levels=levels)))
        recorded: set[str] = set()
        for rule in rules:
            assert _metric_names(rule["expr"]) <= inputs | recorded, (levels, rule["record"])
            recorded.add(rule["record"])
        public = {r for r in recorded if ":" not in r}
        wanted = {s for lv in levels for s in SEED_SERIES[lv] + COUNTER_SERIES[lv]}
        other = {s for lv in set(LEVELS) - set(levels) for s in SEED_SERIES[lv] + COUNTER_SERIES[lv]}
        assert wanted <= public and not (other & public), levels


# ------------------------------------------------------------------ options and CLI


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pod_label": "pod-name"}, "--pod-label must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*), got 'pod-n"),
        ({"namespace_label": "1ns"}, "--namespace-label"),
        ({"container_label": ""}, "--container-label"),
        ({"node_label": "__node"}, "reserved for Prometheus"),
        ({"cluster_label": "clu ster"}, "--cluster-label"),
        ({"cluster_label": "uuid"}, "--cluster-label 'uuid' collides"),
        ({"pod_label": "workload_name"}, "collides with the exporter's own 'workload_name' label"),
        ({"pod_label": "x", "container_label": "x"}, "must differ"),
        ({"cluster_label": "node", "node_label": "node"}, "must differ"),
        ({"interval": "30"}, "--interval"),
        ({"interval": "0s"}, "--interval"),
        ({"interval": "1m30x"}, "--interval"),
        ({"rate_window": "5"}, "--rate-window"),
        ({"rate_window": "0m"}, "--rate-window"),
        ({"levels": ()}, "--levels"),
        ({"levels": ("pod", "pods")}, "unknown level(s) pods"),
    ],
)
def test_bad_options_give_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(RuleOptionsError) as exc:
        render_rules(RuleOptions(**kwargs))
    assert message in str(exc.value)


def test_cli_reports_errors_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert rules_cli.main(["--pod-label", "pod-name"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kube-gpu-exporter rules: error: --pod-label")
    assert rules_cli.main(["--format", "prometheusrule", "--label", "novalue"]) == 2
    assert "--label" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        rules_cli.main(["--format", "json"])
    assert exc.value.code == 2


def test_cli_levels_interval_and_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert rules_cli.main(["--levels", "cluster, namespace", "--interval", "1m"]) == 0
    out = capsys.readouterr().out
    doc = yaml.safe_load(out)
    group = doc["groups"][0]
    assert group["name"] == "k8s-gpu" and group["interval"] == "1m"
    records = [r["record"] for r in group["rules"]]
    assert records[0].startswith("node_namespace_pod_container:")  # helpers first
    assert {r for r in records if ":" not in r} == set(
        SEED_SERIES["cluster"] + SEED_SERIES["namespace"] + COUNTER_SERIES["cluster"] + COUNTER_SERIES["namespace"]
    )
    assert "--interval=1m --levels=cluster,namespace" in out.splitlines()[0]


def test_rate_window_reaches_every_rate() -> None:
    """The counters' rate() window is one option: every rate() of the bundle uses it."""
    committed = (RULES / "kube-gpu-exporter.rules.yaml").read_text()
    assert set(re.findall(r"\brate\([^\[]*\[([^\]]+)\]\)", committed)) == {"5m"}
    text = render_rules(RuleOptions(rate_window="2m"))
    windows = re.findall(r"\brate\([^\[]*\[([^\]]+)\]\)", text)
    assert len(windows) == 6 and set(windows) == {"2m"}  # 2 helpers, node x2, cluster x2
    assert text.splitlines()[0].endswith("`kube-gpu-exporter rules --rate-window=2m`: do not edit by hand.")


_label = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: s not in rulesgen.FIXED_LABELS
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_label, min_size=5, max_size=5, unique=True), st.booleans())
def test_any_valid_label_names_render_consistently(names: list[str], with_cluster: bool) -> None:
    pod, ns, ctr, node, cl = names
    opts = RuleOptions(pod, ns, ctr, node, cl if with_cluster else None)
    rules = _rules(render_rules(opts))
    assert len(rules) == len(_rules((RULES / "kube-gpu-exporter.rules.yaml").read_text()))
    for rule in rules:
        for by in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            labels = [s.strip() for s in by.split(",")]
            assert (cl in labels) == with_cluster
            assert not {"pod_name", "namespace_name", "container_name", "node_name"} & (
                set(labels) - set(names)
            )


def test_docs_list_every_series_and_the_regeneration_command() -> None:
    doc = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    for rule in _rules((RULES / "kube-gpu-exporter.rules.yaml").read_text()):
        assert f"`{rule['record']}`" in doc, rule["record"]
    for path in COMMITTED:
        assert f"`{path}`" in doc
    assert "scripts/generate.sh\n" in doc and f" -o {next(iter(COMMITTED))}" not in doc  # one command, not ten
