"""--pod-labels-allowlist: pod labels copied onto nvidia_gpu_pod_info as label_<key>, bounded (hostile input)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import helm_python
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution.attribute import NodeAttribution
from exporter.exposition.pod_labels import (
    MAX_KEY_LENGTH,
    MAX_LABELS_PER_POD,
    NO_POD_LABELS,
    SKIP_KEY_INVALID,
    SKIP_NAME_COLLISION,
    SKIP_OVER_LIMIT,
    SKIP_VALUE_INVALID,
    AllowlistError,
    label_name,
    parse_allowlist,
    pod_label_skips,
    sanitize,
    select_pod_labels,
)
from exporter.exposition.rows import ExporterStats, LabelNames, build_families
from exporter.model import NodeSample, PodInfo
from exporter.shell.config import load_config
from tests.simulated import one_cycle

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kube-gpu-exporter"
PROM_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
OWN_LABELS = ("node_name", "namespace_name", "pod_name", "workload_kind", "workload_name", "pod_uid")


# --------------------------------------------------------------------------------------------
# sanitising and matching


@pytest.mark.parametrize("key,name", [
    ("team", "label_team"),
    ("app.kubernetes.io/name", "label_app_kubernetes_io_name"),
    ("cost-center", "label_cost_center"),
    ("9lives", "label__9lives"),
    ("Team_X", "label_Team_X"),
    ("équipe", "label__quipe"),
    ("a b\n", "label_a_b_"),
])
def test_sanitising_like_kube_state_metrics(key: str, name: str):
    assert label_name(key) == name
    assert sanitize(key) == name.removeprefix("label_")


def test_default_is_empty_and_copies_nothing():
    assert load_config([], environ={}).pod_labels_allowlist == ""
    assert parse_allowlist("") == NO_POD_LABELS == parse_allowlist(" , ,")
    assert select_pod_labels({"team": "a"}, NO_POD_LABELS).labels == ()


def test_full_match_on_keys_only():
    allow = parse_allowlist(r"team, app\.kubernetes\.io/.*")
    got = select_pod_labels({"team": "vision", "teams": "x", "my-team": "y", "app.kubernetes.io/name": "web",
                             "app.kubernetes.io/part-of": "shop", "other": "team"}, allow)
    assert got.labels == (("label_app_kubernetes_io_name", "web"), ("label_app_kubernetes_io_part_of", "shop"),
                          ("label_team", "vision"))
    assert got.skips == {}


def test_collision_keeps_the_smallest_key_whatever_the_order():
    allow = parse_allowlist("team.*")
    labels = {"team.x": "dot", "team_x": "underscore", "team/x": "slash"}
    for order in (labels, dict(reversed(labels.items()))):
        got = select_pod_labels(order, allow)
        assert got.labels == (("label_team_x", "dot"),)  # "." < "/" < "_"
        assert got.skips == {SKIP_NAME_COLLISION: 2}


def test_bounds_key_length_value_and_count():
    allow = parse_allowlist(".*")
    labels = {f"k{i:02d}": "v" for i in range(20)}
    labels |= {"x" * (MAX_KEY_LENGTH + 1): "v", "": "v", "long": "v" * 64, "bad": "a b", "ok63": "v" * 63}
    got = select_pod_labels(labels, allow)
    assert len(got.labels) == MAX_LABELS_PER_POD
    assert [n for n, _ in got.labels] == sorted(label_name(k) for k in [*labels, "ok63"]
                                                if k.startswith("k"))[:MAX_LABELS_PER_POD]
    # 21 acceptable labels (20 k.., ok63) for 16 places
    assert got.skips == {SKIP_KEY_INVALID: 2, SKIP_VALUE_INVALID: 2, SKIP_OVER_LIMIT: 21 - MAX_LABELS_PER_POD}
    assert select_pod_labels({"x" * MAX_KEY_LENGTH: "v"}, allow).labels == (("label_" + "x" * MAX_KEY_LENGTH, "v"),)


def test_reserved_names_are_never_produced():
    allow = parse_allowlist(".*")
    got = select_pod_labels({"pod_name": "a", "x": "b"}, allow, reserved=["label_x"])
    assert got.labels == (("label_pod_name", "a"),) and got.skips == {SKIP_NAME_COLLISION: 1}


# Regexes an operator would write, the nastiest of the accepted ones included.
SAFE_REGEXES = [
    "team", "Team", "(?i)team", ".*", ".*team.*", r"app\.kubernetes\.io/.*", "cost-center|owner", "[a-z]+",
    "[a-z0-9.-]*/team", "(?:team|group)-[a-z]*", "a?" * 18, "(?:ab)*c?", r"\w+", "[^/]*", "x{3}", ".+/.+",
]


@given(
    labels=st.dictionaries(st.text(max_size=MAX_KEY_LENGTH + 20),
                           st.one_of(st.text(max_size=70), st.from_regex(r"[a-z0-9]{1,63}", fullmatch=True)),
                           max_size=40),
    regexes=st.lists(st.sampled_from(SAFE_REGEXES), min_size=1, max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_any_labels_any_safe_regex_give_bounded_valid_label_names(labels: dict[str, str], regexes: list[str]):
    allow = parse_allowlist(",".join(regexes))
    got = select_pod_labels(labels, allow, OWN_LABELS)
    names = [n for n, _ in got.labels]
    assert len(names) <= MAX_LABELS_PER_POD
    assert names == sorted(set(names))
    for name, value in got.labels:
        assert PROM_NAME.fullmatch(name) and name.startswith("label_") and not name.startswith("__")
        assert name not in OWN_LABELS
        assert len(value) <= 63
        assert any(label_name(k) == name and v == value and allow.allows(k) for k, v in labels.items())
    # the same result whatever order the API lists the labels in
    assert select_pod_labels(dict(reversed(labels.items())), allow, OWN_LABELS) == got
    assert sum(got.skips.values()) + len(names) <= len(labels)


@pytest.mark.parametrize("text,message", [
    ("(", "not a regular expression"),
    ("team,[a-", "not a regular expression"),
    ("(a+)+", "repeated group"),
    ("(a|ab)*", "repeated group"),
    ("(?:.*/)*x", "repeated group"),
    (r"(a)\1", "backreferences"),
    ("(?=team)t.*", "lookarounds"),
    ("(?(1)a|b)", "not a regular expression"),
    ("[[", "ambiguous"),  # re's FutureWarning "possible nested set": refused, never printed (explore profile found it)
    ("team,[[a]", "ambiguous"),  # valid today, read differently by a future Python
    ("[a-z]*[a-z]*[a-z]*", "too long"),
    ("a?" * 40, "too long"),
    ("(?:a|a)" * 30, "too long"),
    ("a{1,3}", "unbalanced braces"),
    ("a{99999999999999999999}", "not a usable"),
    ("x" * 513, "at most 512 characters"),
    (",".join(f"k{i}" for i in range(65)), "at most 64 regexes"),
    (",".join([".*a.*"] * 8 + [f"{i}.*b.*" for i in range(10)]), "together"),
])
def test_unsafe_or_bad_regexes_are_refused(text: str, message: str):
    with pytest.raises(AllowlistError, match=message):
        parse_allowlist(text)


@pytest.mark.parametrize("regex", ["a?" * 18 + "x", "(?:a|a|a|a)" * 9 + "x", "(?:[a-z]*|[a-z]*)[a-z]*x",
                                   ".*a.*a", "[a-z]*?[a-z]*?x"])
def test_accepted_regexes_stay_fast_on_hostile_keys(regex: str):
    pattern = parse_allowlist(regex).patterns[0]
    for key in ("a" * MAX_KEY_LENGTH, "a" * (MAX_KEY_LENGTH - 1) + "b", ("ab" * MAX_KEY_LENGTH)[:MAX_KEY_LENGTH]):
        started = time.perf_counter()
        pattern.fullmatch(key)
        assert time.perf_counter() - started < 0.5, (regex, key[:10])  # measured: a few milliseconds


# --------------------------------------------------------------------------------------------
# the row builder


def pod(name: str, labels: dict[str, str]) -> PodInfo:
    return PodInfo(uid=f"uid-{name}", name=name, namespace="ml", node_name="n1", phase="Running", containers=(),
                   labels=labels, workload_kind="Deployment", workload_name=name)


def pod_info_samples(names: LabelNames, allowlist_text: str, pods: tuple[PodInfo, ...]) -> list[dict[str, str]]:
    attr = NodeAttribution(devices=(), allocations=(), pods=pods, skips={})
    families = build_families(attr, NodeSample(1.0), "n1", names, ExporterStats(),
                              pod_labels=parse_allowlist(allowlist_text))
    fam = next(f for f in families if f.name == "nvidia_gpu_pod_info")
    return [s.labels for s in fam.samples]


def test_row_builder_copies_the_allowlisted_labels_and_keeps_its_own():
    pods = (pod("a", {"team": "vision", "pod_name": "evil", "node_name": "evil", "pod_uid": "evil",
                      "workload_kind": "evil", "namespace_name": "evil", "app": "x"}),
            pod("b", {"app": "y"}))
    got = pod_info_samples(LabelNames(), "team,pod_name,node_name,pod_uid,workload_kind,namespace_name", pods)
    assert got == [
        {"node_name": "n1", "namespace_name": "ml", "pod_name": "a", "workload_kind": "Deployment",
         "workload_name": "a", "pod_uid": "uid-a", "label_namespace_name": "evil", "label_node_name": "evil",
         "label_pod_name": "evil", "label_pod_uid": "evil", "label_team": "vision", "label_workload_kind": "evil"},
        {"node_name": "n1", "namespace_name": "ml", "pod_name": "b", "workload_kind": "Deployment",
         "workload_name": "b", "pod_uid": "uid-b"},
    ]
    assert pod_label_skips(pods, parse_allowlist("team")) == {}


def test_row_builder_with_configured_names_and_no_allowlist():
    pods = (pod("a", {"team": "vision", "gpu_pod": "evil"}),)
    names = LabelNames("gpu_pod", "gpu_ns", "gpu_container")
    got = pod_info_samples(names, ".*", pods)
    assert got[0]["gpu_pod"] == "a" and got[0]["gpu_ns"] == "ml" and got[0]["label_gpu_pod"] == "evil"
    assert "label_team" not in pod_info_samples(names, "", pods)[0]


def test_configured_label_names_starting_with_label_are_refused_with_an_allowlist():
    from exporter.shell.config import ConfigError

    assert load_config(["--pod-label", "label_team"], environ={}).pod_label == "label_team"  # no allowlist: fine
    with pytest.raises(ConfigError, match=r"--pod-label 'label_team' could collide .* --pod-labels-allowlist"):
        load_config(["--pod-label", "label_team", "--pod-labels-allowlist", "team"], environ={})


# --------------------------------------------------------------------------------------------
# the simulated node, in process


def scenario_with_labels(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "mixed-4gpu-node.yaml").read_text())
    by_name = {p["metadata"]["name"]: p for p in doc["pods"]}
    by_name["trainer-5d8f7c9b4-x2k9p"]["metadata"]["labels"] |= {
        "team": "vision", "cost-center": "cc-42", "team.kubernetes.io/x": "a", "team_kubernetes_io_x": "b"}
    by_name["infer-a-7c6b5d4f3-qwert"]["metadata"]["labels"] |= {"team": "nlp", "cost-center": "v" * 64}
    hostile = by_name["infer-b-6b5a4c3d2-asdfg"]["metadata"]["labels"]
    hostile |= {f"team-{i:03d}": "x" for i in range(40)} | {"t" * 400: "x"}
    path = tmp_path / "labelled.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path




@pytest.mark.e2e
def test_simulated_node_with_the_allowlist(tmp_path: Path):
    text = one_cycle(scenario_with_labels(tmp_path), "--pod-labels-allowlist", "team.*,cost-center")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    info = {s.labels["pod_name"]: s.labels for s in fams["nvidia_gpu_pod_info"].samples}
    trainer = info["trainer-5d8f7c9b4-x2k9p"]
    assert trainer["label_team"] == "vision" and trainer["label_cost_center"] == "cc-42"
    assert trainer["label_team_kubernetes_io_x"] == "a"  # "team.kubernetes.io/x" < "team_kubernetes_io_x"
    assert trainer["workload_name"] == "trainer" and "label_app" not in trainer
    assert info["infer-a-7c6b5d4f3-qwert"]["label_team"] == "nlp"
    assert "label_cost_center" not in info["infer-a-7c6b5d4f3-qwert"]  # a 64-character value
    hostile = info["infer-b-6b5a4c3d2-asdfg"]
    assert sum(k.startswith("label_") for k in hostile) == MAX_LABELS_PER_POD
    assert "label_team_000" in hostile and "label_team_016" not in hostile
    assert "label_app" not in info["nightly-eval-29012345-k7m2p"]
    skips = {s.labels["reason"]: s.value for s in fams["kube_gpu_exporter_skips"].samples}
    assert skips[SKIP_NAME_COLLISION] == 1 and skips[SKIP_VALUE_INVALID] == 1
    assert skips[SKIP_OVER_LIMIT] == 40 - MAX_LABELS_PER_POD and skips[SKIP_KEY_INVALID] == 1
    promtool = shutil.which("promtool")
    if promtool:
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_simulated_node_without_the_allowlist_is_unchanged(tmp_path: Path):
    scenario = scenario_with_labels(tmp_path)
    text = one_cycle(scenario)
    assert "label_" not in text and "pod_label" not in text

    def pod_info(body: str) -> list[str]:
        return [line for line in body.splitlines() if line.startswith("nvidia_gpu_pod_info{")]

    assert pod_info(one_cycle(scenario, "--pod-labels-allowlist", "nothing-matches")) == pod_info(text) != []


def test_env_variable_and_bad_regex_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from exporter.shell import cli

    cfg = load_config([], environ={"KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST": "team"})
    assert cfg.pod_labels_allowlist == "team"
    rc = cli.main(["render", "--simulate", str(ROOT / "examples" / "seed-cgpu-t4.yaml"),
                   "--pod-labels-allowlist", "team,(a+)+"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("kube-gpu-exporter: error: --pod-labels-allowlist: '(a+)+'")


# --------------------------------------------------------------------------------------------
# the Helm chart


def daemonset_env(values: dict) -> dict[str, str]:
    rendered = helm_python.Chart.load(CHART).render(values, name="gpu", namespace="monitoring")
    for path, text in rendered.items():
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        for obj in yaml.safe_load_all(text):
            if isinstance(obj, dict) and obj.get("kind") == "DaemonSet":
                (c,) = obj["spec"]["template"]["spec"]["containers"]
                return {e["name"]: e.get("value") for e in c["env"]}
    raise AssertionError("no DaemonSet rendered")


def test_helm_chart_exposes_the_allowlist():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert "podLabelsAllowlist" in values["config"] and values["config"]["podLabelsAllowlist"] is None
    assert "podLabelsAllowlist" in schema["properties"]["config"]["properties"]
    assert "KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST" not in daemonset_env({})
    for given_value, want in ([["team", r"app\.kubernetes\.io/.*"], r"team,app\.kubernetes\.io/.*"],
                              ["team,cost-center", "team,cost-center"]):
        env = daemonset_env({"config": {"podLabelsAllowlist": given_value}})
        assert env["KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST"] == want
        cfg = load_config([], environ={"KUBE_GPU_EXPORTER_POD_LABELS_ALLOWLIST": want})
        assert len(parse_allowlist(cfg.pod_labels_allowlist).patterns) == 2
