"""The chart next to kube-prometheus-stack, and on the GPU node pools of GKE, AKS and EKS.

kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by the label
``release: <its Helm release name>`` (its default ``serviceMonitorSelector``/``ruleSelector``, from
``serviceMonitorSelectorNilUsesHelmValues``/``ruleSelectorNilUsesHelmValues: true``), and its Grafana
sidecar loads ConfigMaps labelled ``grafana_dashboard: "1"`` from every namespace
(docs/deploy.md#with-kube-prometheus-stack). ``prometheusStack.release`` puts that label on the four
kinds of objects it concerns; the per-object ``labels`` values keep working and win. The scheduling
values (``runtimeClassName``, ``priorityClassName``, ``tolerations``) are checked here too, and the
NOTES.txt that tells the user how to check the install.

Rendered offline like tests/test_helm.py, whose helpers this module reuses.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.test_helm import (
    ALERT_RULES,
    CHART,
    KUBE_VERSIONS,
    MONITORING_API,
    NAMESPACE,
    RECORDING_RULES,
    RELEASE,
    ROOT,
    WITH_CRDS,
    by_kind,
    named,
    notes,
    one,
    render,
)
from tests.test_helm_monitoring import PROMETHEUSRULE_SCHEMA

KPS = "kube-prometheus-stack"  # a kube-prometheus-stack Helm release name
STACK = {**WITH_CRDS, "prometheusStack": {"release": KPS}, "dashboards": {"enabled": True}}
DASHBOARD_NAMES = {f"{RELEASE}-kube-gpu-exporter-{d}"
                   for d in ("kube-gpu-cluster", "kube-gpu-node", "kube-gpu-workload")}
# Every value this module adds or changes, set at once: rendered, linted and validated strictly.
STACK_ALL = {
    **STACK,
    "runtimeClassName": "nvidia",
    "priorityClassName": "gpu-monitoring",
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpuGroup", "effect": "NoSchedule"},
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
    "prometheusAdapter": {"configMap": {"enabled": True}},
}


def values_file() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def release_targets(objs: list[dict]) -> list[dict]:
    """The objects prometheusStack.release labels: the ServiceMonitor, both PrometheusRules and the
    dashboard ConfigMaps."""
    return [o for o in objs if o["kind"] in ("ServiceMonitor", "PrometheusRule")
            or (o["kind"] == "ConfigMap" and o["metadata"]["name"] in DASHBOARD_NAMES)]


def selects(selector: dict, labels: dict) -> bool:
    """A metav1.LabelSelector's matchLabels/matchExpressions against ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, vals = e["key"], e["operator"], e.get("values", [])
        if (op == "In" and labels.get(key) not in vals) or (op == "NotIn" and labels.get(key) in vals) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


# kube-prometheus-stack's templates/prometheus/prometheus.yaml with its default values
# (serviceMonitorSelectorNilUsesHelmValues/ruleSelectorNilUsesHelmValues: true, empty selectors).
def kps_selector(release: str) -> dict:
    return {"matchLabels": {"release": release}}


# --------------------------------------------------------------------------------------------
# defaults


def test_defaults_of_the_new_values():
    values = values_file()
    assert values["prometheusStack"] == {"release": ""}
    assert values["runtimeClassName"] == ""
    assert values["priorityClassName"] == ""
    assert values["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    ]
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod and "priorityClassName" not in pod
    assert pod["tolerations"] == values["tolerations"]
    # no release label anywhere by default, not even with everything rendered
    objs = render({**WITH_CRDS, "dashboards": {"enabled": True}})
    assert len(release_targets(objs)) == 6
    assert not [o for o in objs if "release" in o["metadata"].get("labels", {})]


def test_the_dashboards_already_carry_kube_prometheus_stacks_sidecar_label():
    # the grafana sub-chart of kube-prometheus-stack: sidecar.dashboards.label grafana_dashboard,
    # labelValue "1", searchNamespace ALL
    for cm in by_kind(render({"dashboards": {"enabled": True}}), "ConfigMap"):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


# --------------------------------------------------------------------------------------------
# the release label


def test_release_label_on_all_four_kinds_of_objects():
    objs = render(STACK)
    targets = release_targets(objs)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in targets)
    assert kinds == sorted([("ServiceMonitor", RECORDING_RULES), ("PrometheusRule", RECORDING_RULES),
                            ("PrometheusRule", ALERT_RULES)] + [("ConfigMap", n) for n in DASHBOARD_NAMES])
    for obj in targets:
        assert obj["metadata"]["labels"]["release"] == KPS, obj["metadata"]["name"]
        # the chart's own labels stay
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    # what kube-prometheus-stack's default selectors pick up
    for obj in by_kind(objs, "ServiceMonitor") + by_kind(objs, "PrometheusRule"):
        assert selects(kps_selector(KPS), obj["metadata"]["labels"])
        assert not selects(kps_selector("another-stack"), obj["metadata"]["labels"])
    for cm in release_targets(objs):
        if cm["kind"] == "ConfigMap":
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar still finds them
    # nothing else is labelled: the Service, the DaemonSet's pods, RBAC, the adapter's ConfigMap
    others = [o for o in render({**STACK, "prometheusAdapter": {"configMap": {"enabled": True}}})
              if o["kind"] not in ("ServiceMonitor", "PrometheusRule") and o["metadata"]["name"] not in DASHBOARD_NAMES]
    assert {o["kind"] for o in others} >= {"DaemonSet", "Service", "ConfigMap", "ServiceAccount"}
    for obj in others:
        assert "release" not in obj["metadata"].get("labels", {}), obj["kind"]
    pod_labels = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert "release" not in pod_labels


def test_the_release_label_changes_nothing_else():
    def strip(objs):
        for o in objs:
            o["metadata"].get("labels", {}).pop("release", None)
        return sorted(map(repr, objs))

    base = {**WITH_CRDS, "dashboards": {"enabled": True}}
    assert strip(render(STACK)) == strip(render(base))


def test_per_object_labels_keep_working_and_win_over_the_release_label():
    # the labels alone, as docs/deploy.md's plain install sets them
    objs = render({**WITH_CRDS, "serviceMonitor": {"labels": {"release": KPS}},
                   "prometheusRule": {"labels": {"release": KPS}}})
    for obj in by_kind(objs, "ServiceMonitor") + by_kind(objs, "PrometheusRule"):
        assert obj["metadata"]["labels"]["release"] == KPS
    # with prometheusStack.release too: each object's own labels win, the others are kept
    values = {**STACK,
              "serviceMonitor": {"labels": {"release": "sm", "team": "gpu"}},
              "prometheusRule": {"labels": {"tier": "rules"}},
              "alerts": {"labels": {"release": "alerting"}},
              "dashboards": {"enabled": True, "labels": {"release": "grafana", "grafana_dashboard": "0"}}}
    objs = render(values)
    sm = one(objs, "ServiceMonitor")["metadata"]["labels"]
    assert (sm["release"], sm["team"]) == ("sm", "gpu")
    rules = named(objs, "PrometheusRule", RECORDING_RULES)["metadata"]["labels"]
    assert (rules["release"], rules["tier"]) == (KPS, "rules")
    alerts = named(objs, "PrometheusRule", ALERT_RULES)["metadata"]["labels"]
    assert (alerts["release"], alerts["tier"]) == ("alerting", "rules")  # alerts.labels > prometheusRule.labels
    for cm in release_targets(objs):
        if cm["kind"] == "ConfigMap":
            labels = cm["metadata"]["labels"]
            assert (labels["release"], labels["grafana_dashboard"]) == ("grafana", "1")  # the sidecar's wins
    # a release in prometheusRule.labels reaches the alerts too, over prometheusStack.release
    objs = render({**STACK, "prometheusRule": {"labels": {"release": "rules"}}})
    assert {o["metadata"]["labels"]["release"] for o in by_kind(objs, "PrometheusRule")} == {"rules"}
    assert one(objs, "ServiceMonitor")["metadata"]["labels"]["release"] == KPS


def test_the_release_label_follows_each_objects_switch():
    objs = render({**STACK, "serviceMonitor": {"enabled": False}, "alerts": {"enabled": False},
                   "dashboards": {"enabled": False}})
    assert [(o["kind"], o["metadata"]["name"]) for o in release_targets(objs)] == [
        ("PrometheusRule", RECORDING_RULES)]
    # without the Prometheus Operator API only the dashboards are rendered, and labelled
    objs = render({"prometheusStack": {"release": KPS}, "dashboards": {"enabled": True}})
    assert {o["kind"] for o in release_targets(objs)} == {"ConfigMap"}
    assert all(o["metadata"]["labels"]["release"] == KPS for o in release_targets(objs))


# --------------------------------------------------------------------------------------------
# strict validation, lint and schema


def test_helm_lint_strict_with_every_new_value():
    report = helm_python.lint(CHART, STACK_ALL, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


_LABEL_VALUE = re.compile(r"^(|[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_new_value_renders_objects_that_pass_strict_validation(kube_version):
    objs = render(STACK_ALL)
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "gpu-monitoring"
    assert pod["tolerations"] == STACK_ALL["tolerations"]
    checked = 0
    for obj in objs:
        if obj["apiVersion"] == MONITORING_API:
            continue
        kubernetes_validate.validate(obj, kube_version, strict=True)
        checked += 1
    assert checked >= 8  # DaemonSet, Service, SA, RBAC, 3 dashboards, the adapter's ConfigMap
    validator = jsonschema.Draft7Validator(PROMETHEUSRULE_SCHEMA)
    for rule in by_kind(objs, "PrometheusRule"):
        assert [e.message for e in validator.iter_errors(rule)] == []
    for obj in release_targets(objs):
        assert all(isinstance(v, str) and _LABEL_VALUE.match(v) for v in obj["metadata"]["labels"].values())


@pytest.mark.parametrize("bad", [
    {"prometheusStack": {"release": "not a label value!"}},
    {"prometheusStack": {"release": "x" * 64}},
    {"prometheusStack": {"release": 1}},
    {"prometheusStack": {"releaseName": KPS}},  # a typo is an error, not silently ignored
    {"prometheusStack": "kps"},
    {"runtimeClassName": "NVIDIA"},
    {"runtimeClassName": "nvidia_runtime"},
    {"priorityClassName": "System-Node-Critical"},
    {"priorityClassName": 5},
    {"tolerations": [{"key": "nvidia.com/gpu", "operater": "Exists"}]},
    {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Sometimes"}]},
    {"tolerations": [{"key": "nvidia.com/gpu", "effect": "NoScheduling"}]},
    {"tolerations": "nvidia.com/gpu"},
])
def test_schema_rejects_bad_new_values(bad):
    with pytest.raises(helm_python.HelmValuesError):
        helm_python.Chart.load(CHART).render({**WITH_CRDS, **bad}, name=RELEASE, namespace=NAMESPACE)


def test_schema_of_the_new_values_is_closed_where_the_chart_owns_the_keys():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    assert schema["prometheusStack"]["additionalProperties"] is False
    assert set(schema["prometheusStack"]["properties"]) == set(values_file()["prometheusStack"])
    assert schema["tolerations"]["items"]["additionalProperties"] is False
    for key in ("runtimeClassName", "priorityClassName"):
        assert schema[key]["type"] == "string"


# --------------------------------------------------------------------------------------------
# scheduling: the GPU taints of the managed clouds


def tolerates(toleration: dict, taint: dict) -> bool:
    """Kubernetes' Toleration.ToleratesTaint."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


# The taints GPU node pools carry (docs/deploy.md#scheduling).
GPU_TAINTS = {
    "GKE GPU node pool": {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    "AKS GPU node pool (documented)": {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
    "EKS Karpenter / Auto Mode NodePool": {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
    "nvidia.com/gpu without a value": {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
    "nvidia.com/gpu NoExecute (a GPU health remediation)": {"key": "nvidia.com/gpu", "value": "unhealthy",
                                                            "effect": "NoExecute"},
}
# Not GPU taints: the defaults must not reach past the GPU pools' own taints.
OTHER_TAINTS = {
    "AKS CPU pool": {"key": "sku", "value": "cpu", "effect": "NoSchedule"},
    "dedicated pool": {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
    "AKS spot": {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"},
    "sku=gpu NoExecute": {"key": "sku", "value": "gpu", "effect": "NoExecute"},
}


@pytest.mark.parametrize("name", sorted(GPU_TAINTS))
def test_the_default_tolerations_accept_the_gpu_pool_taints(name):
    tolerations = one(render(), "DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    assert any(tolerates(t, GPU_TAINTS[name]) for t in tolerations)


@pytest.mark.parametrize("name", sorted(OTHER_TAINTS))
def test_the_default_tolerations_accept_no_other_taint(name):
    tolerations = one(render(), "DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    assert not any(tolerates(t, OTHER_TAINTS[name]) for t in tolerations)


def test_tolerations_are_replaced_whole_or_removed():
    mine = [{"key": "dedicated", "operator": "Equal", "value": "gpuGroup", "effect": "NoSchedule"}]
    pod = one(render({"tolerations": mine}), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["tolerations"] == mine  # Helm replaces lists: the defaults are gone
    for empty in ([], None):
        pod = one(render({"tolerations": empty}), "DaemonSet")["spec"]["template"]["spec"]
        assert "tolerations" not in pod, empty


def test_runtime_and_priority_class_are_passed_through():
    pod = one(render({"runtimeClassName": "nvidia", "priorityClassName": "system-node-critical"}),
              "DaemonSet")["spec"]["template"]["spec"]
    assert (pod["runtimeClassName"], pod["priorityClassName"]) == ("nvidia", "system-node-critical")


# --------------------------------------------------------------------------------------------
# NOTES.txt


def test_notes_tell_how_to_check_the_pods_and_the_metrics():
    objs = render({"port": 9500})
    ds = one(objs, "DaemonSet")
    text = notes({"port": 9500})
    name = ds["metadata"]["name"]
    assert f"kubectl -n {NAMESPACE} get ds {name}\n" in text
    selector = f"app.kubernetes.io/instance={RELEASE}"
    assert f"kubectl -n {NAMESPACE} get pods -l {selector} -o wide" in text
    key, value = selector.split("=")
    assert ds["spec"]["template"]["metadata"]["labels"][key] == value
    assert f"kubectl -n {NAMESPACE} port-forward ds/{name} 9500:9500" in text
    curl = next(line.strip() for line in text.splitlines() if line.strip().startswith("curl "))
    assert curl.startswith("curl -s http://127.0.0.1:9500/metrics | grep -E ")
    pattern = shlex.split(curl.split("|", 1)[1])[2]
    # the series it greps for are the exporter's, and the pattern finds them in an exposition
    exposition = "kube_gpu_exporter_nvml_up 1\nnvidia_gpu_num_devices{node_name=\"n\"} 2\n" \
                 "nvidia_gpu_duty_cycle{uuid=\"GPU-1\"} 35\nnvidia_gpu_duty_cycle_x 1\n"
    found = [line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if re.search(pattern, line)]
    assert found[:3] == ["kube_gpu_exporter_nvml_up", "nvidia_gpu_num_devices", "nvidia_gpu_duty_cycle"]
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    for series in ("kube_gpu_exporter_nvml_up", "nvidia_gpu_num_devices", "nvidia_gpu_duty_cycle"):
        assert f"`{series}`" in metrics_doc
    assert "expect kube_gpu_exporter_nvml_up 1" in text


def test_notes_say_what_to_do_when_nvml_is_down():
    text = notes()
    assert "kube_gpu_exporter_nvml_up 0: the NVIDIA container runtime gave the pod no libnvidia-ml.so" in text
    assert f"logs ds/{RELEASE}-kube-gpu-exporter | grep -i nvml" in text
    assert "set runtimeClassName=nvidia" in text
    text = notes({"runtimeClassName": "nvidia"})
    assert "The pods use runtimeClassName nvidia" in text and "kubectl get runtimeclass nvidia" in text
    assert "set runtimeClassName=nvidia" not in text


def test_notes_report_the_servicemonitor_pickup_by_the_stack():
    text = notes(WITH_CRDS)
    sm = f"ServiceMonitor {NAMESPACE}/{RELEASE}-kube-gpu-exporter"
    assert f"{sm} has no release label" in text
    assert "set prometheusStack.release=<that name>" in text
    assert text.count("no release label: set prometheusStack.release") == 2  # both PrometheusRules
    for values in (STACK, {**WITH_CRDS, "serviceMonitor": {"labels": {"release": KPS}},
                           "prometheusRule": {"labels": {"release": KPS}}}):
        text = notes(values)
        expected = (f"{sm} is labelled release={KPS}, which\n"
                    f"   kube-prometheus-stack release \"{KPS}\" selects by default.")
        assert expected in text
        assert "no release label" not in text
    # the Prometheus query names the job the ServiceMonitor gives the targets
    objs = render({**STACK, "nameOverride": "gpu-metrics"})
    svc = one(objs, "Service")
    assert one(objs, "ServiceMonitor")["spec"]["jobLabel"] == "app.kubernetes.io/name"
    job = svc["metadata"]["labels"]["app.kubernetes.io/name"]
    assert f'up{{job="{job}"}}' in notes({**STACK, "nameOverride": "gpu-metrics"})
    assert "kubectl get prometheus -A" in text
    # no ServiceMonitor, no paragraph about it
    assert "3. Prometheus" not in notes({**STACK, "serviceMonitor": {"enabled": False}})
    assert "3. Prometheus" not in notes({**STACK, "service": {"enabled": False}})
    assert "3. Prometheus" not in notes({"prometheusStack": {"release": KPS}})  # no Operator API


def test_notes_render_for_every_value_set_of_this_module():
    for values in ({}, WITH_CRDS, STACK, STACK_ALL):
        text = notes(values)
        assert "{{" not in text and "<no value>" not in text
        assert text.startswith("kube-gpu-exporter ")
        assert len(text.splitlines()) <= 40  # short


# --------------------------------------------------------------------------------------------
# docs/deploy.md


def _stack_section() -> str:
    text = (ROOT / "docs" / "deploy.md").read_text()
    return text.split("\n## With kube-prometheus-stack\n", 1)[1].split("\n## ", 1)[0]


def _set_flags(command: str) -> dict:
    values: dict = {}
    words = shlex.split(command.replace("\\\n", " "))
    for flag, arg in itertools.pairwise(words):
        if flag == "--set":
            path, _, value = arg.partition("=")
            node = values
            *parents, leaf = path.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = {"true": True, "false": False}.get(value, value)
    return values


def test_deploy_doc_stack_install_labels_what_the_stack_selects():
    section = _stack_section()
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    assert "helm install kube-gpu-exporter helm/kube-gpu-exporter" in block
    values = _set_flags(block)
    assert values["prometheusStack"]["release"] == KPS
    objs = render({**values, **WITH_CRDS})  # the cluster serves the Operator's API next to the stack
    targets = release_targets(objs)
    assert {o["kind"] for o in targets} == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    assert all(o["metadata"]["labels"]["release"] == KPS for o in targets)
    # the facts it relies on are cited
    for fact in ("serviceMonitorSelectorNilUsesHelmValues", "ruleSelectorNilUsesHelmValues",
                 "grafana_dashboard", "searchNamespace"):
        assert fact in section, fact
    assert "https://github.com/prometheus-community/helm-charts/" in section


def test_deploy_doc_values_table_lists_the_new_values():
    text = (ROOT / "docs" / "deploy.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for key in ("prometheusStack.release", "runtimeClassName", "priorityClassName", "tolerations"):
        assert any(f"`{key}`" in row.split("|")[1] for row in rows), key
