"""The chart's alerts (a second PrometheusRule) and Grafana dashboards (sidecar ConfigMaps).

Rendered offline like tests/test_helm.py (whose helpers this module reuses): the alert groups must
equal the generated bundle (and, with the chart's overrides, the generator run with the matching
options), promtool must accept them and pass the bundle's own unit tests with them, and the
dashboards' JSON must equal the committed dashboards byte for byte.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter.bundle.alerts.cli import render_alerts
from exporter.bundle.alerts.options import DEFAULT_RUNBOOK_URL, AlertOptions
from exporter.bundle.dashboards.options import DashboardOptions
from exporter.bundle.dashboards.render import render_dashboards
from exporter.shell.generate import BANNER
from tests.test_helm import (
    ALERT_RULES,
    ALL_ON,
    CHART,
    KUBE_VERSIONS,
    MONITORING_API,
    NAMESPACE,
    PROMTOOL,
    RECORDING_RULES,
    RELEASE,
    ROOT,
    WITH_CRDS,
    by_kind,
    env_of,
    named,
    notes,
    render,
)

DASHBOARDS_ON = {"dashboards": {"enabled": True}}
DASHBOARD_FILES = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))


def bundle_alert_groups(**options) -> list[dict]:
    return yaml.safe_load(render_alerts(AlertOptions(**options)))["groups"]


def alert_rule(values: dict | None = None) -> dict:
    return named(render({**WITH_CRDS, **(values or {})}), "PrometheusRule", ALERT_RULES)


def dashboard_maps(values: dict | None = None) -> dict[str, dict]:
    """The dashboard ConfigMaps by the one file each carries."""
    maps = [o for o in by_kind(render({**DASHBOARDS_ON, **(values or {})}), "ConfigMap")
            if not o["metadata"]["name"].endswith("-prometheus-adapter")]
    out = {}
    for cm in maps:
        (key,) = cm["data"]
        out[key] = cm
    assert len(out) == len(maps)
    return out


def render_error(values: dict) -> str:
    chart = helm_python.Chart.load(CHART)
    with pytest.raises((helm_python.HelmRenderError, helm_python.HelmValuesError)) as info:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# alerts: switch and gate


def test_alerts_render_with_the_crds_by_default_and_follow_their_switch():
    assert not [o for o in by_kind(render(), "PrometheusRule")]  # no monitoring API: nothing
    objs = render(WITH_CRDS)
    assert {o["metadata"]["name"] for o in by_kind(objs, "PrometheusRule")} == {RECORDING_RULES, ALERT_RULES}
    objs = render({**WITH_CRDS, "alerts": {"enabled": False}})
    assert [o["metadata"]["name"] for o in by_kind(objs, "PrometheusRule")] == [RECORDING_RULES]
    # the alerts do not depend on the recording-rules switch (KubeGpuRecordingRulesMissing tells)
    objs = render({**WITH_CRDS, "prometheusRule": {"enabled": False}})
    assert [o["metadata"]["name"] for o in by_kind(objs, "PrometheusRule")] == [ALERT_RULES]
    assert by_kind(render({"alerts": {"enabled": True}}), "PrometheusRule") == []


def test_alerts_gate_is_the_same_as_the_recording_rules():
    text = (CHART / "templates" / "prometheusrule-alerts.yaml").read_text()
    first = text.splitlines()[0]
    assert first == '{{- if and .Values.alerts.enabled (include "kube-gpu-exporter.monitoringAPI" .) -}}'
    recording = (CHART / "templates" / "prometheusrule.yaml").read_text().splitlines()[0]
    assert first.replace("alerts", "prometheusRule") == recording


# --------------------------------------------------------------------------------------------
# alerts: content equals the generated bundle


def test_alert_groups_equal_the_generated_bundle_and_the_committed_files():
    rule = alert_rule()
    assert rule["apiVersion"] == MONITORING_API
    assert set(rule["spec"]) == {"groups"}
    groups = rule["spec"]["groups"]
    assert groups == bundle_alert_groups()
    committed = yaml.safe_load((ROOT / "alerts" / "kube-gpu-exporter.alerts.yaml").read_text())
    assert groups == committed["groups"]
    committed_pr = yaml.safe_load((ROOT / "alerts" / "kube-gpu-exporter.prometheusrule.yaml").read_text())
    assert groups == committed_pr["spec"]["groups"]
    assert [r["alert"] for g in groups for r in g["rules"]]  # not empty
    # no group name collides with the recording rules' (one Prometheus loads both objects)
    recording = named(render(WITH_CRDS), "PrometheusRule", RECORDING_RULES)
    assert not {g["name"] for g in groups} & {g["name"] for g in recording["spec"]["groups"]}


def test_chart_copy_of_the_alerts_is_fresh():
    copy = (CHART / "files" / "alerts.yaml").read_text()
    assert copy == BANNER + render_alerts(AlertOptions()), "stale: run scripts/generate.sh"
    assert copy == (ROOT / "alerts" / "kube-gpu-exporter.alerts.yaml").read_text()


OVERRIDES = {
    "runbook": ({"alerts": {"runbookUrl": "https://wiki.example.com/gpu/runbook"}},
                {"runbook_url": "https://wiki.example.com/gpu/runbook"}),
    "rule-labels": ({"alerts": {"additionalRuleLabels": {"team": "ml-platform", "tier": "gpu"}}},
                    {"extra_labels": {"team": "ml-platform", "tier": "gpu"}}),
    "selector": ({"alerts": {"exporterSelector": 'job="gpu", cluster=~"prod-.*"'}},
                 {"exporter_selector": 'job="gpu", cluster=~"prod-.*"'}),
    # the ServiceMonitor's job is app.kubernetes.io/name, which nameOverride changes
    "name-override": ({"nameOverride": "gpu-metrics"}, {"exporter_selector": 'job="gpu-metrics"'}),
    "all": ({"nameOverride": "x", "alerts": {"runbookUrl": "http://r.example/a.md",
                                             "additionalRuleLabels": {"team": "a"}}},
            {"exporter_selector": 'job="x"', "runbook_url": "http://r.example/a.md",
             "extra_labels": {"team": "a"}}),
}


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_alert_overrides_equal_the_generator_with_the_same_options(case):
    values, options = OVERRIDES[case]
    groups = named(render({**WITH_CRDS, **values}), "PrometheusRule",
                   ALERT_RULES.replace("kube-gpu-exporter", values.get("nameOverride", "kube-gpu-exporter"))
                   )["spec"]["groups"]
    assert groups == bundle_alert_groups(**options)
    assert groups != bundle_alert_groups()


def test_the_chart_rewrites_exactly_the_bundles_default_selector():
    # the template replaces {<default selector>}; if the generator's default changed, the
    # name-override case above would fail, this says why
    text = (CHART / "templates" / "prometheusrule-alerts.yaml").read_text()
    assert f'printf "{{%s}}" "{AlertOptions().exporter_selector.replace(chr(34), chr(92) + chr(34))}"' in text
    assert AlertOptions().runbook_url == DEFAULT_RUNBOOK_URL


def _promtool_check(tmp_path, groups: list[dict]) -> None:
    path = tmp_path / "chart-alerts.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {n} rules found" in proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["default", *sorted(OVERRIDES)])
def test_promtool_accepts_the_rendered_alerts(tmp_path, case):
    values = OVERRIDES[case][0] if case != "default" else {}
    objs = render({**WITH_CRDS, **values})
    (rule,) = [o for o in by_kind(objs, "PrometheusRule") if o["metadata"]["name"].endswith("-alerts")]
    _promtool_check(tmp_path, rule["spec"]["groups"])


@pytest.mark.e2e
@pytest.mark.parametrize("name_override", [None, "gpu-metrics"])
def test_the_bundles_promtool_unit_tests_pass_on_the_chart_objects(tmp_path, name_override):
    """alerts/tests/*.test.yaml (every alert fires when it should, and only then), run on what
    the chart renders: its two PrometheusRules instead of the bundle files. With nameOverride
    the scrape job changes name, and so do the tests' input series and expected labels."""
    values = {**WITH_CRDS, **({"nameOverride": name_override} if name_override else {})}
    objs = render(values)
    job = name_override or "kube-gpu-exporter"
    files = {}
    for obj in by_kind(objs, "PrometheusRule"):
        kind = "alerts" if obj["metadata"]["name"].endswith("-alerts") else "rules"
        files[kind] = tmp_path / f"chart-{kind}.yaml"
        files[kind].write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, sort_keys=False))
    assert set(files) == {"alerts", "rules"}
    for test_file in sorted((ROOT / "alerts" / "tests").glob("*.test.yaml")):
        doc = yaml.safe_load(test_file.read_text())
        doc["rule_files"] = [
            str(files["rules"] if "rules.yaml" in f and "alerts" not in f else files["alerts"])
            for f in doc["rule_files"]
        ]
        text = yaml.safe_dump(doc, sort_keys=False, width=10_000)
        text = text.replace('job="kube-gpu-exporter"', f'job="{job}"').replace(
            "job: kube-gpu-exporter", f"job: {job}")
        out = tmp_path / test_file.name
        out.write_text(text)
        proc = subprocess.run([PROMTOOL, "test", "rules", str(out)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{test_file.name}:\n{proc.stdout}{proc.stderr}"


# --------------------------------------------------------------------------------------------
# alerts: metadata, and the schema of the PrometheusRule CRD

_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# monitoring.coreos.com/v1 PrometheusRule as the Prometheus Operator's CRD (0.82) declares it,
# made strict: a field the CRD does not know is an error here (the API server would prune it).
PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": MONITORING_API},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", "maxLength": 253},
                "namespace": {"type": "string"},
                "labels": _STRING_MAP,
                "annotations": _STRING_MAP,
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "query_offset": {"type": "string", "pattern": _DURATION},
                            "limit": {"type": "integer"},
                            "labels": _STRING_MAP,
                            "partial_response_strategy": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "keep_firing_for": {"type": "string", "pattern": _DURATION},
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("case", ["default", "all-on", *sorted(OVERRIDES)])
def test_both_prometheusrules_pass_the_crd_schema_strictly(case):
    values = {"default": WITH_CRDS, "all-on": ALL_ON}.get(case) or {**WITH_CRDS, **OVERRIDES[case][0]}
    rules = by_kind(render(values), "PrometheusRule")
    assert len(rules) == 2
    validator = jsonschema.Draft7Validator(PROMETHEUSRULE_SCHEMA)
    for obj in rules:
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(obj)]
        assert errors == [], obj["metadata"]["name"]
        names = [g["name"] for g in obj["spec"]["groups"]]
        assert len(names) == len(set(names))  # x-kubernetes-list-map-keys: name
        for group in obj["spec"]["groups"]:
            for rule in group["rules"]:
                assert ("alert" in rule) != ("record" in rule)


def test_the_crd_schema_check_catches_a_misplaced_field():
    obj = alert_rule()
    obj["spec"]["groups"][0]["rules"][0]["severity"] = "critical"  # belongs under labels
    assert list(jsonschema.Draft7Validator(PROMETHEUSRULE_SCHEMA).iter_errors(obj))


def test_alert_metadata_labels_for_the_rule_selector():
    rule = alert_rule()
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert "annotations" not in rule["metadata"]
    # prometheusRule.labels (what the README/deploy.md install sets) reach the alerts too
    rule = alert_rule({"prometheusRule": {"labels": {"release": "kube-prometheus-stack"}}})
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # alerts.labels add to them and win on a shared key, without touching the recording rules
    values = {**WITH_CRDS, "prometheusRule": {"labels": {"release": "kps", "tier": "rules"}},
              "alerts": {"labels": {"tier": "alerts", "team": "gpu"}, "annotations": {"a.example/b": "c"},
                         "namespace": "alerting"}}
    objs = render(values)
    rule = named(objs, "PrometheusRule", ALERT_RULES)
    assert {k: rule["metadata"]["labels"][k] for k in ("release", "tier", "team")} == {
        "release": "kps", "tier": "alerts", "team": "gpu"}
    assert rule["metadata"]["annotations"] == {"a.example/b": "c"}
    assert rule["metadata"]["namespace"] == "alerting"
    recording = named(objs, "PrometheusRule", RECORDING_RULES)
    assert recording["metadata"]["labels"]["tier"] == "rules" and "team" not in recording["metadata"]["labels"]
    assert recording["metadata"]["namespace"] == NAMESPACE


def test_alerts_name_never_collides_with_the_recording_rules():
    for full in ("k", "a" * 56, "b" * 60, "c" * 63):
        objs = render({**WITH_CRDS, "fullnameOverride": full})
        names = [o["metadata"]["name"] for o in by_kind(objs, "PrometheusRule")]
        assert len(set(names)) == 2, names
        assert all(len(n) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) for n in names), names


@pytest.mark.parametrize("bad", [
    {"alerts": {"additionalRuleLabels": {"severity": "info"}}},
    {"alerts": {"additionalRuleLabels": {"alertname": "x"}}},
    {"alerts": {"additionalRuleLabels": {"bad-name": "x"}}},
    {"alerts": {"runbookUrl": "wiki/runbook"}},
    {"alerts": {"runbookUrl": "https://wiki.example.com/runbook#anchor"}},
    {"alerts": {"exporterSelector": "job=gpu"}},
    {"alerts": {"exporterSelector": "up{job=\"gpu\"}"}},
    {"alerts": {"labels": {"release": 1}}},
    {"alerts": {"runbookURL": "https://typo.example.com"}},
    {"alerts": {"enabled": "yes"}},
])
def test_schema_rejects_bad_alert_values(bad):
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render({**WITH_CRDS, **bad}, name=RELEASE, namespace=NAMESPACE)


# --------------------------------------------------------------------------------------------
# renamed exporter labels: every bundle the chart renders refuses them


@pytest.mark.parametrize(("key", "default"), [("podLabel", "pod_name"), ("namespaceLabel", "namespace_name"),
                                              ("containerLabel", "container_name")])
def test_renamed_labels_are_refused_while_alerts_or_dashboards_render(key, default):
    config = {"config": {key: "renamed"}}
    off = {"prometheusRule": {"enabled": False}}
    message = render_error({**WITH_CRDS, **config, **off})
    assert f"config.{key}=renamed: the bundled alerts use {default}. Set alerts.enabled=false" in message
    assert "kube-gpu-exporter alerts" in message
    message = render_error({**config, **DASHBOARDS_ON})  # no monitoring API needed: plain ConfigMaps
    assert f"config.{key}=renamed: the bundled dashboards use {default}. Set dashboards.enabled=false" in message
    assert "kube-gpu-exporter dashboards --format configmap" in message
    # with all three off the exporter runs with the renamed label
    env = env_of(render({**WITH_CRDS, **config, **off, "alerts": {"enabled": False}}))
    assert "renamed" in env.values()
    # without the CRDs the alerts are not rendered, so they do not object
    assert by_kind(render({**config, "prometheusRule": {"enabled": False}}), "DaemonSet")


# --------------------------------------------------------------------------------------------
# dashboards


def test_dashboards_are_off_by_default():
    for values in ({}, WITH_CRDS):
        maps = [o for o in by_kind(render(values), "ConfigMap")]
        assert maps == []
    assert "Grafana dashboards" not in notes()
    assert "Grafana dashboards created" in notes(DASHBOARDS_ON)


def test_one_configmap_per_committed_dashboard_with_its_exact_json():
    maps = dashboard_maps()
    assert sorted(maps) == DASHBOARD_FILES
    assert len(DASHBOARD_FILES) == 3
    for file_name, cm in maps.items():
        text = cm["data"][file_name]
        assert text == (ROOT / "dashboards" / file_name).read_text(), file_name
        assert json.loads(text)["uid"] == file_name.removesuffix(".json")


def test_chart_copy_of_the_dashboards_is_fresh():
    generated = render_dashboards(DashboardOptions())
    copies = {p.name: p.read_text() for p in (CHART / "files" / "dashboards").glob("*")}
    assert copies == generated, "stale: run scripts/generate.sh"
    assert sorted(generated) == DASHBOARD_FILES


def test_dashboard_configmaps_equal_the_committed_sidecar_bundle():
    committed = [d for d in yaml.safe_load_all(
        (ROOT / "dashboards" / "kube-gpu-exporter.dashboards.configmap.yaml").read_text()) if d]
    assert {k: v for d in committed for k, v in d["data"].items()} == {
        k: v for cm in dashboard_maps().values() for k, v in cm["data"].items()}


def test_dashboard_configmap_labels_namespace_and_folder():
    maps = dashboard_maps()
    for cm in maps.values():
        meta = cm["metadata"]
        assert meta["labels"]["grafana_dashboard"] == "1"
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert meta["namespace"] == NAMESPACE
        assert "annotations" not in meta
        assert meta["name"].startswith(f"{RELEASE}-kube-gpu-exporter-")
    values = {"dashboards": {"enabled": True, "label": "example.com/dashboard", "labelValue": "gpu",
                             "labels": {"team": "ml", "grafana_dashboard": "0"}, "namespace": "grafana",
                             "annotations": {"note": "x"}, "folder": "GPU/Kubernetes",
                             "folderAnnotation": "k8s-sidecar-target-directory"}}
    for cm in dashboard_maps(values).values():
        meta = cm["metadata"]
        assert meta["labels"]["example.com/dashboard"] == "gpu"
        assert meta["labels"]["team"] == "ml"
        assert meta["labels"]["grafana_dashboard"] == "0"  # an extra label is just a label
        assert meta["namespace"] == "grafana"
        assert meta["annotations"] == {"note": "x", "k8s-sidecar-target-directory": "GPU/Kubernetes"}
    # the sidecar's label wins over the same key in dashboards.labels; an integer value is quoted
    for cm in dashboard_maps({"dashboards": {"enabled": True, "labelValue": 1,
                                             "labels": {"grafana_dashboard": "no"}}}).values():
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    for cm in dashboard_maps({"dashboards": {"enabled": True, "folder": "GPU"}}).values():
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}


def test_dashboard_configmap_names_are_unique_dns_labels():
    for full in ("k", "a" * 40, "b" * 63):
        names = [cm["metadata"]["name"] for cm in dashboard_maps({"fullnameOverride": full}).values()]
        assert len(set(names)) == 3
        assert all(len(n) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) for n in names), names


def test_each_dashboard_configmap_fits_a_client_side_apply():
    # `helm template | kubectl apply` stores the object in an annotation limited to 256 KiB
    for cm in dashboard_maps().values():
        assert len(json.dumps(cm)) < 256 * 1024


@pytest.mark.parametrize("bad", [
    {"dashboards": {"enabled": True, "label": ""}},
    {"dashboards": {"enabled": True, "label": "has space"}},
    {"dashboards": {"enabled": True, "namespace": "Not_A_Namespace"}},
    {"dashboards": {"enabled": True, "labelValue": "not valid!"}},
    {"dashboards": {"enabled": True, "folderAnnotation": "bad key!"}},
    {"dashboards": {"enable": True}},
])
def test_schema_rejects_bad_dashboard_values(bad):
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(bad, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_dashboard_configmaps_pass_strict_schema_validation(kube_version):
    values = {"dashboards": {"enabled": True, "namespace": "grafana", "folder": "GPU",
                             "labels": {"team": "ml"}, "annotations": {"a.example/b": "c"}}}
    for cm in dashboard_maps(values).values():
        kubernetes_validate.validate(cm, kube_version, strict=True)


# --------------------------------------------------------------------------------------------
# the switches change nothing else

UNCHANGED_KINDS = ("DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                   "Service", "ServiceMonitor")


@pytest.mark.parametrize(("alerts", "dashboards", "crds"), list(itertools.product([False, True], repeat=3)))
def test_rbac_daemonset_and_other_objects_are_unchanged_by_the_switches(alerts, dashboards, crds):
    base = {"alerts": {"enabled": False}, "dashboards": {"enabled": False}, **(WITH_CRDS if crds else {})}
    values = {**base, "alerts": {"enabled": alerts}, "dashboards": {"enabled": dashboards}}

    def others(objs):
        return sorted(json.dumps(o, sort_keys=True) for o in objs
                       if o["kind"] in UNCHANGED_KINDS
                       or (o["kind"] == "PrometheusRule" and o["metadata"]["name"] == RECORDING_RULES))

    before, after = render(base), render(values)
    assert others(after) == others(before)
    # ClusterRole+Binding, the Events' Role+Binding, SA, DS, Service (+SM, rules)
    assert len(others(before)) == (9 if crds else 7)
    added = {(o["kind"], o["metadata"]["name"]) for o in after} - {(o["kind"], o["metadata"]["name"]) for o in before}
    expected = ({("PrometheusRule", ALERT_RULES)} if alerts and crds else set()) | (
        {("ConfigMap", f"{RELEASE}-kube-gpu-exporter-{f.removesuffix('.json')}") for f in DASHBOARD_FILES}
        if dashboards else set())
    assert added == expected


# --------------------------------------------------------------------------------------------
# docs/deploy.md (scripts/generate.sh writing the chart's copies: tests/test_generate.py)


def test_deploy_doc_lists_every_alerts_and_dashboards_value():
    text = (ROOT / "docs" / "deploy.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    for section in ("alerts", "dashboards"):
        assert set(values[section]) == set(schema["properties"][section]["properties"]), section
        for key in values[section]:
            assert f"`{section}.{key}`" in text, f"docs/deploy.md does not mention {section}.{key}"
    assert values["alerts"]["enabled"] is True and values["dashboards"]["enabled"] is False
    assert (values["dashboards"]["label"], values["dashboards"]["labelValue"]) == ("grafana_dashboard", "1")
