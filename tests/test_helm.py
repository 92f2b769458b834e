"""The Helm chart (helm/kube-gpu-exporter), rendered offline with helm-python-sdk.

helm-python-sdk cannot pass API versions to a render, so `.Capabilities.APIVersions` never holds
monitoring.coreos.com/v1 here; the chart's `monitoring.assumeCRDsPresent` switch (meant for
`helm template`/GitOps renders) stands in for "the Prometheus Operator CRDs are installed".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import helm_python
import kubernetes_validate
import pytest
import yaml

from exporter.attribution.infrastructure import DEFAULT_NAMESPACES, parse_namespaces
from exporter.bundle.rules import RuleOptions, render_rules
from exporter.shell.config import OPTIONS, load_config
from exporter.shell.generate import BANNER
from exporter.xid.events import EVENT_NAMESPACE

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kube-gpu-exporter"
RELEASE, NAMESPACE = "gpu", "monitoring"
# Oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schema available.
KUBE_VERSIONS = ("1.25.0", "1.37.0")
MONITORING_API = "monitoring.coreos.com/v1"
WITH_CRDS = {"monitoring": {"assumeCRDsPresent": True}}
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"  # Debian's prometheus (scripts/test.sh)

# Exporter flags the chart sets itself instead of through `config` (and how).
CHART_SET_ENV = {"listen", "pod_resources_socket", "xid", "kmsg_path", "events", "xid_events_namespace",
                 "xid_events_regarding"}
CHART_SET_OTHER = {
    "host_proc",  # --host-proc argument
    "node_name",  # $NODE_NAME from the downward API
    "simulate", "kube_api_url", "kubeconfig",  # not for a cluster deployment (in-cluster config)
    "web_config_file",  # --web-config-file argument (webConfig.secretName; tests/test_helm_tls.py)
}


def camel(dest: str) -> str:
    head, *rest = dest.split("_")
    return head + "".join(w.capitalize() for w in rest)


@cache
def _render(values_json: str) -> tuple[tuple[str, str], ...]:
    chart = helm_python.Chart.load(CHART)
    out = chart.render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
    return tuple(sorted(out.items()))


def render(values: dict | None = None) -> list[dict]:
    """Every object the chart renders for ``values`` (NOTES.txt excluded)."""
    objs: list[dict] = []
    for path, text in _render(json.dumps(values or {}, sort_keys=True)):
        if path.endswith("NOTES.txt"):
            continue
        objs.extend(d for d in yaml.safe_load_all(text) if d)
    return objs


def notes(values: dict | None = None) -> str:
    return dict(_render(json.dumps(values or {}, sort_keys=True)))[f"{CHART.name}/templates/NOTES.txt"]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(objs: list[dict]) -> dict:
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def env_of(objs: list[dict]) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objs)["env"]}


RECORDING_RULES = f"{RELEASE}-kube-gpu-exporter"  # the recording rules' PrometheusRule
ALERT_RULES = f"{RELEASE}-kube-gpu-exporter-alerts"  # the alerts' PrometheusRule


def named(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, got {len(found)}"
    return found[0]


CLUSTER = "cluster"  # the scope of a ClusterRoleBinding's grants: every namespace and cluster-scoped


def rbac_grants(objs: list[dict]) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, scope) granted through the chart's bindings: scope CLUSTER for a
    ClusterRoleBinding, the binding's namespace for a RoleBinding. Every binding must name a role
    the chart renders, and bind the ServiceAccount the DaemonSet runs as."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    pods = by_kind(objs, "DaemonSet")
    sa = pods[0]["spec"]["template"]["spec"]["serviceAccountName"] if pods else None
    grants: set[tuple[str, str, str, str]] = set()
    bound = set()
    for binding in objs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ns = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        key = (ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])
        assert key in roles, f"{binding['kind']}/{binding['metadata']['name']} binds a role the chart lacks"
        bound.add(key)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
        for rule in roles[key]["rules"]:
            grants |= {(g, r, v, ns or CLUSTER) for g in rule["apiGroups"] for r in rule["resources"]
                       for v in rule["verbs"]}
    assert bound == set(roles), "a role without its binding"
    return grants


def rbac_rules(objs: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r, v, _ in rbac_grants(objs)}


OPT_INS = {"podResources": {"enabled": True}, "xid": {"kmsg": {"enabled": True}}}
ALL_ON = {
    **WITH_CRDS,
    **OPT_INS,
    "networkPolicy": {"enabled": True},
    "prometheusAdapter": {"configMap": {"enabled": True}},
    "runtimeClassName": "nvidia",
    "priorityClassName": "system-node-critical",
    "podAnnotations": {"example.com/a": "b"},
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}, "honorLabels": True,
                       "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                                        "targetLabel": "instance"}]},
    "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}},
    "prometheusStack": {"release": "kube-prometheus-stack"},
    "alerts": {"labels": {"team": "gpu"}, "annotations": {"example.com/a": "b"},
               "additionalRuleLabels": {"team": "ml-platform"}},
    "dashboards": {"enabled": True, "folder": "GPU"},
}
VALUE_SETS = {
    "default": {},
    "all-on": ALL_ON,
    "xid-off": {"xid": {"enabled": False}},
    "kmsg": {"xid": {"kmsg": {"enabled": True}}},
    "kmsg-unprivileged": {"xid": {"kmsg": {"enabled": True, "privileged": False}}},
    "kmsg-non-root": {"xid": {"kmsg": {"enabled": True, "runAsRoot": False}}},
    "pod-resources": {"podResources": {"enabled": True}},
    "network-policy": {"networkPolicy": {"enabled": True, "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        {"ipBlock": {"cidr": "10.0.0.0/8"}}]}},
    "no-pod-resources-no-watch": {"podResources": {"enabled": False}, "config": {"podWatch": False}},
    "no-rbac-no-sa": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "gpu-sa"}},
    # next to kube-prometheus-stack, on a pool with taints of its own (tests/test_helm_stack.py)
    "stack": {**WITH_CRDS, "prometheusStack": {"release": "kps"}, "dashboards": {"enabled": True},
              "runtimeClassName": "nvidia", "priorityClassName": "gpu-monitoring",
              "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpuGroup", "effect": "NoSchedule"},
                              {"key": "nvidia.com/gpu", "operator": "Exists"}]},
    "no-tolerations": {"tolerations": []},
}


# --------------------------------------------------------------------------------------------
# lint and schema validation of every built-in object


@pytest.mark.parametrize("values", [{}, ALL_ON, VALUE_SETS["stack"]], ids=["default", "all-on", "stack"])
def test_helm_lint_strict_is_clean(values):
    report = helm_python.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    # info ("icon is recommended") is fine; warnings and errors are not
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_builtin_object_passes_strict_schema_validation(name, kube_version):
    objs = render(VALUE_SETS[name])
    checked = 0
    for obj in objs:
        if obj["apiVersion"] == MONITORING_API:
            continue  # CRDs: structure checked below
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
        checked += 1
    assert checked >= 2  # at least the DaemonSet and the Service


def test_kubernetes_validate_strict_catches_an_unknown_field():
    # the check above is only worth something if strict mode rejects what an API server rejects
    ds = one(render(), "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["hostProc"] = "/proc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE_VERSIONS[-1], strict=True)


def test_every_object_is_namespaced_in_the_release_namespace_or_cluster_scoped():
    for obj in render(ALL_ON):
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in obj["metadata"]
        elif obj["kind"] in ("Role", "RoleBinding"):
            # the Events' Role lives where the exporter writes them (exporter/xid/events.py)
            assert obj["metadata"]["namespace"] == EVENT_NAMESPACE, obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]


# --------------------------------------------------------------------------------------------
# values schema <-> exporter flags


def test_values_schema_config_keys_are_the_exporter_flags_the_chart_does_not_set():
    schema = json.loads((CHART / "values.schema.json").read_text())
    config_keys = set(schema["properties"]["config"]["properties"])
    option_keys = {camel(o.dest) for o in OPTIONS}
    chart_set = {camel(d) for d in CHART_SET_ENV | CHART_SET_OTHER}
    assert chart_set <= option_keys, "the chart sets a flag the exporter no longer has"
    assert config_keys == option_keys - chart_set
    assert schema["properties"]["config"]["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["config"]) == config_keys
    assert all(v is None for v in values["config"].values())  # the exporter's own defaults apply


def test_infrastructure_namespaces_reach_the_exporter_as_a_list_or_a_string():
    for given in (["gpu-operator", "my-mps"], "gpu-operator,my-mps"):
        cfg = _exporter_config(render({"config": {"infrastructureNamespaces": given}}))
        assert parse_namespaces(cfg.infrastructure_namespaces) == {"gpu-operator", "my-mps"}
    assert parse_namespaces(_exporter_config(render()).infrastructure_namespaces) == set(DEFAULT_NAMESPACES)
    with pytest.raises(helm_python.HelmValuesError):  # not a namespace name: refused by the schema
        helm_python.Chart.load(CHART).render({"config": {"infrastructureNamespaces": ["Kube_System"]}},
                                             name=RELEASE, namespace=NAMESPACE)


def test_schema_rejects_unknown_or_chart_managed_config_keys():
    chart = helm_python.Chart.load(CHART)
    for bad in ({"config": {"hostProc": "/x"}}, {"config": {"listen": ":1"}},
                {"config": {"logLevel": "loud"}}, {"port": 0}):
        with pytest.raises(helm_python.HelmValuesError):
            chart.render(bad, name=RELEASE, namespace=NAMESPACE)


# --------------------------------------------------------------------------------------------
# DaemonSet


def test_daemonset_mounts_host_proc_and_the_kubelets_socket_by_default():
    objs = render()
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"host-proc", "pod-resources", "tmp"}
    mounts = {m["name"]: m for m in container(objs)["volumeMounts"]}
    assert set(mounts) == {"host-proc", "pod-resources", "tmp"}
    assert mounts["pod-resources"]["readOnly"] is True and mounts["host-proc"]["readOnly"] is True
    objs = render(NO_POD_RESOURCES)
    assert {v["name"] for v in one(objs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]} == {"host-proc", "tmp"}


def test_daemonset_mounts_host_proc_pod_resources_and_kmsg_read_only():
    objs = render(OPT_INS)
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container(objs)["volumeMounts"]}
    assert volumes["host-proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources",
                                                     "type": "Directory"}
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    # every hostPath mount is read-only; the only writable mount is the in-memory /tmp
    for name, v in volumes.items():
        if "hostPath" in v:
            assert mounts[name]["readOnly"] is True, name
    assert volumes["tmp"]["emptyDir"]["medium"] == "Memory"
    # host /proc is mounted, so no host PID namespace; no host network either
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert "--host-proc=/host/proc" in container(objs)["args"]


def test_daemonset_without_xid_or_pod_resources_has_neither_mount():
    objs = render({"xid": {"enabled": False}, "podResources": {"enabled": False}})
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"host-proc", "tmp"}
    env = env_of(objs)
    assert env["KUBE_GPU_EXPORTER_XID"] == "false"
    assert env["KUBE_GPU_EXPORTER_EVENTS"] == "false"
    assert env["KUBE_GPU_EXPORTER_POD_RESOURCES_SOCKET"] == ""
    assert "KUBE_GPU_EXPORTER_KMSG_PATH" not in env


def _exporter_config(objs: list[dict]):
    env = {k: v for k, v in env_of(objs).items() if k.startswith("KUBE_GPU_EXPORTER_")}
    return load_config(container(objs)["args"], environ=env)


def test_default_env_takes_xids_from_nvml_events_only():
    cfg = _exporter_config(render())
    assert (cfg.xid, cfg.xid_nvml_events, cfg.events, cfg.pod_watch) == (True, True, True, True)
    assert cfg.kmsg_path == "none"  # nothing mounted at /dev/kmsg: the exporter is told, it does not try
    # on (issue 26): the kubelet's answer outranks annotations a pod's author writes
    assert cfg.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert _exporter_config(render(NO_POD_RESOURCES)).pod_resources_socket == ""
    cfg = _exporter_config(render({"config": {"xidNvmlEvents": False}, "xid": {"kmsg": {"enabled": True}}}))
    assert (cfg.xid, cfg.xid_nvml_events, cfg.kmsg_path) == (True, False, "/dev/kmsg")
    # the watcher needs a source: the chart refuses to leave it none
    with pytest.raises(helm_python.HelmRenderError, match="no source"):
        helm_python.Chart.load(CHART).render({"config": {"xidNvmlEvents": False}}, name=RELEASE,
                                             namespace=NAMESPACE)
    assert _exporter_config(render({"config": {"xidNvmlEvents": False}, "xid": {"enabled": False}})).xid is False


@pytest.mark.parametrize("key", ["privileged", "kmsgHostPath"])
def test_removed_xid_values_are_refused_with_their_replacement(key):
    with pytest.raises(helm_python.HelmRenderError, match=rf"xid\.{key} was replaced by xid\.kmsg"):
        helm_python.Chart.load(CHART).render({"xid": {key: True if key == "privileged" else "/dev/kmsg"}},
                                             name=RELEASE, namespace=NAMESPACE)


def test_env_and_args_are_accepted_by_the_exporter_as_the_chart_means_them():
    values = {"config": {"interval": 2.5, "podWatch": True, "perProcessMetrics": True, "nvlinkMetrics": False,
                         "kmsgReplay": False, "xidLookback": 30, "logLevel": "debug"},
              "port": 9500, **OPT_INS}
    objs = render(values)
    c = container(objs)
    env = env_of(objs)
    exporter_env = {k: v for k, v in env.items() if k.startswith("KUBE_GPU_EXPORTER_")}
    known = {o.env for o in OPTIONS}
    assert set(exporter_env) <= known, f"unknown variables {set(exporter_env) - known}"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    cfg = load_config(c["args"], environ=exporter_env)
    assert cfg.host_proc == "/host/proc"
    assert cfg.host_port == ("0.0.0.0", 9500)
    assert cfg.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert (cfg.xid, cfg.events, cfg.kmsg_path) == (True, True, "/dev/kmsg")
    assert (cfg.interval, cfg.pod_watch, cfg.per_process_metrics) == (2.5, True, True)
    assert env["KUBE_GPU_EXPORTER_NVLINK_METRICS"] == "false" and cfg.nvlink_metrics is False
    assert (cfg.kmsg_replay, cfg.xid_lookback, cfg.log_level) == (False, 30.0, "debug")
    ports = c["ports"]
    assert ports == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]


def test_every_config_key_maps_to_its_exporter_variable():
    schema = json.loads((CHART / "values.schema.json").read_text())
    samples = {"number": 1, "integer": 2, "boolean": True, "string": "x_label"}
    config = {}
    for key, prop in schema["properties"]["config"]["properties"].items():
        types = prop.get("type") or ["string"]
        kind = next(t for t in (types if isinstance(types, list) else [types]) if t != "null")
        config[key] = {"logLevel": "info", "logFormat": "json"}.get(key, samples[kind])
    env = env_of(render({"config": config, "prometheusRule": {"enabled": False}}))
    by_dest = {o.dest: o for o in OPTIONS}
    for key, value in config.items():
        dest = re.sub(r"([A-Z])", r"_\1", key).lower()
        assert env[by_dest[dest].env] == (str(value).lower() if isinstance(value, bool) else str(value)), key


def test_unset_config_leaves_the_exporter_defaults():
    set_by_chart = {f"KUBE_GPU_EXPORTER_{d.upper()}" for d in CHART_SET_ENV}
    env = env_of(render(OPT_INS))
    assert {k for k in env if k.startswith("KUBE_GPU_EXPORTER_")} == set_by_chart
    # without xid.kmsg the chart says so: no kernel log at all, rather than a path that is not there
    env = env_of(render())
    assert {k for k in env if k.startswith("KUBE_GPU_EXPORTER_")} == set_by_chart
    assert env["KUBE_GPU_EXPORTER_KMSG_PATH"] == "none"


def test_probes_resources_and_no_gpu_request():
    c = container(render())
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert "memory" in c["resources"]["limits"]
    # the exporter must see every GPU without taking one away from workloads
    for section in c["resources"].values():
        assert not any(k.startswith("nvidia.com/") for k in section)


UID = 9400  # the image's user (Dockerfile USER; tests/test_dockerfile.py)
NO_POD_RESOURCES = {"podResources": {"enabled": False}}
LEAST_PRIVILEGE = {
    "runAsUser": UID, "runAsGroup": UID, "runAsNonRoot": True, "privileged": False,
    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"},
}


def test_security_context_is_least_privilege_by_default():
    """The default takes the kubelet's answer (pod-resources): uid 0, the image's gid, nothing else added."""
    objs = render()
    assert container(objs)["securityContext"] == {**LEAST_PRIVILEGE, "runAsUser": 0, "runAsNonRoot": False}
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert "securityContext" not in pod  # podSecurityContext: {} adds nothing
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert "Xid" not in notes() and "privileged (for /dev/kmsg)" not in notes()
    assert "They run as uid 0, for the kubelet's pod-resources socket." in notes()
    # without the socket nothing runs as root, also with the features that need no privilege switched off
    assert f"They run as uid {UID}, unprivileged, without capabilities." in notes(NO_POD_RESOURCES)
    for values in ({}, {"xid": {"enabled": False}}, {"config": {"podWatch": False}}, {"xid": {"events": False}}):
        values = {**values, **NO_POD_RESOURCES}
        assert container(render(values))["securityContext"] == LEAST_PRIVILEGE, values


def test_each_opt_in_adds_only_what_it_needs():
    root = {"runAsUser": 0, "runAsNonRoot": False}

    def kmsg(**kw: bool) -> dict:  # the kernel log alone, without the default's pod-resources
        return {"xid": {"kmsg": {"enabled": True, **kw}}, **NO_POD_RESOURCES}

    # pod-resources: uid 0 to connect to the kubelet's socket; still no capability, not privileged
    sc = container(render({"podResources": {"enabled": True}}))["securityContext"]
    assert sc == {**LEAST_PRIVILEGE, **root}
    assert "uid 0, for the kubelet's pod-resources socket." in notes({"podResources": {"enabled": True}})
    # kmsg (default mode): privileged for the device cgroup, uid 0 for CAP_SYSLOG; the API rejects
    # privileged together with allowPrivilegeEscalation=false, and a drop list would contradict it
    sc = container(render(kmsg()))["securityContext"]
    expected = {k: v for k, v in LEAST_PRIVILEGE.items() if k not in ("allowPrivilegeEscalation", "capabilities")}
    assert sc == {**expected, **root, "privileged": True}
    text = notes(kmsg())
    assert "run privileged (for /dev/kmsg)" in text and "uid 0, for CAP_SYSLOG on /dev/kmsg." in text
    # kmsg where kernel.dmesg_restrict=0: privileged, but the image's user
    sc = container(render(kmsg(runAsRoot=False)))["securityContext"]
    assert sc == {**expected, "privileged": True}
    assert f"They run as uid {UID}.\n" in notes(kmsg(runAsRoot=False))
    # kmsg where the runtime admits /dev/kmsg: not privileged, uid 0 with CAP_SYSLOG alone
    sc = container(render(kmsg(privileged=False)))["securityContext"]
    assert sc == {**LEAST_PRIVILEGE, **root, "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]}}
    assert "xid.kmsg.privileged=false" in notes(kmsg(privileged=False))
    sc = container(render(kmsg(privileged=False, runAsRoot=False)))["securityContext"]
    assert sc == LEAST_PRIVILEGE
    # xid.kmsg means nothing without the Xid watcher
    objs = render({"xid": {"enabled": False, "kmsg": {"enabled": True}}, **NO_POD_RESOURCES})
    assert container(objs)["securityContext"] == LEAST_PRIVILEGE
    assert "kmsg" not in {v["name"] for v in one(objs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}


def test_service_account_token_only_with_api_access():
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    pod = one(render({"config": {"podWatch": False}}), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_scheduling_gpu_nodes_tolerations_runtime_class():
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert "nvidia.com/gpu.present" in keys
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod["tolerations"]
    assert "runtimeClassName" not in pod and "priorityClassName" not in pod
    # Helm merges a user's map into the default one, so {} would keep the default affinity:
    # null is what deletes it (as `--set affinity=null` does)
    pod = one(render({"runtimeClassName": "nvidia", "affinity": None,
                      "nodeSelector": {"gpu": "yes"}}), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert "affinity" not in pod
    assert pod["nodeSelector"] == {"gpu": "yes"}


def test_image_defaults_to_app_version_and_digest_wins():
    from exporter import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__  # the package version (exporter/_version.py)
    assert container(render())["image"] == f"ghcr.io/kube-gpu-exporter/kube-gpu-exporter:{chart['appVersion']}"
    digest = "sha256:" + "a" * 64
    image = container(render({"image": {"repository": "r.example/kgx", "digest": digest}}))["image"]
    assert image == f"r.example/kgx@{digest}"


# --------------------------------------------------------------------------------------------
# RBAC


# What each feature needs; tests/test_helm_rbac.py derives the same sets from the API calls the
# exporter makes against the API double.
EVENTS = {("events.k8s.io", "events", v, EVENT_NAMESPACE) for v in ("create", "patch")}
PODS_NODES = {("", "pods", "list", CLUSTER), ("", "pods", "watch", CLUSTER), ("", "nodes", "get", CLUSTER),
              # DRA: this node's ResourceSlices, and the ResourceClaims its pods name (docs/sharing.md)
              ("resource.k8s.io", "resourceslices", "list", CLUSTER),
              ("resource.k8s.io", "resourceslices", "watch", CLUSTER),
              ("resource.k8s.io", "resourceclaims", "get", CLUSTER)}


def test_rbac_is_exactly_what_the_exporter_needs():
    objs = render()
    assert rbac_grants(objs) == PODS_NODES | EVENTS
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no wildcards
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    # no Events in the core group, and none through a ClusterRole
    assert not any(r == "events" for rule in one(objs, "ClusterRole")["rules"] for r in rule["resources"])
    role = one(objs, "Role")
    assert role["metadata"]["namespace"] == EVENT_NAMESPACE
    assert role["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    binding = one(objs, "RoleBinding")
    assert binding["metadata"]["namespace"] == EVENT_NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    sa = one(objs, "ServiceAccount")
    cluster_binding = one(objs, "ClusterRoleBinding")
    assert cluster_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                          "name": one(objs, "ClusterRole")["metadata"]["name"]}
    for b in (binding, cluster_binding):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]


@pytest.mark.parametrize(("values", "expected"), [
    ({"xid": {"events": False}}, PODS_NODES),
    ({"xid": {"enabled": False}}, PODS_NODES),
    # the kernel log changes the Xid source, not the API calls
    ({"xid": {"kmsg": {"enabled": True}}}, PODS_NODES | EVENTS),
    ({"xid": {"kmsg": {"enabled": True}}, "podResources": {"enabled": True}}, PODS_NODES | EVENTS),
    # without the pod watch the exporter has no API client: no Events either
    ({"config": {"podWatch": False}}, set()),
    ({"config": {"podWatch": False}, "xid": {"enabled": False}}, set()),
    ({"rbac": {"create": False}}, set()),
])
def test_rbac_shrinks_with_the_features(values, expected):
    objs = render(values)
    assert rbac_grants(objs) == expected
    assert len(by_kind(objs, "ClusterRoleBinding")) == (1 if expected & PODS_NODES else 0)
    assert len(by_kind(objs, "RoleBinding")) == (1 if expected & EVENTS else 0)



def test_xid_events_namespace_moves_the_role_and_reaches_the_exporter():
    objs = render({"xid": {"eventsNamespace": "kube-system"}})
    events = {("events.k8s.io", "events", v, "kube-system") for v in ("create", "patch")}
    assert rbac_grants(objs) == PODS_NODES | events
    env = env_of(objs)
    assert (env["KUBE_GPU_EXPORTER_XID_EVENTS_NAMESPACE"], env["KUBE_GPU_EXPORTER_XID_EVENTS_REGARDING"]) == (
        "kube-system", "node")
    assert (env_of(render())["KUBE_GPU_EXPORTER_XID_EVENTS_NAMESPACE"]) == EVENT_NAMESPACE
    cfg = load_config([], {k: v for k, v in env.items() if isinstance(v, str)})
    assert (cfg.xid_events_namespace, cfg.xid_events_regarding) == ("kube-system", "node")


def test_xid_events_about_pods_grant_events_cluster_wide_and_nothing_more():
    objs = render({"xid": {"eventsRegarding": "pod", "kmsg": {"enabled": True}}})
    events = {("events.k8s.io", "events", v, CLUSTER) for v in ("create", "patch")}
    assert rbac_grants(objs) == PODS_NODES | events
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding")
    (role,) = [r for r in by_kind(objs, "ClusterRole") if r["metadata"]["name"].endswith("-events")]
    assert role["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    assert env_of(objs)["KUBE_GPU_EXPORTER_XID_EVENTS_REGARDING"] == "pod"


def test_xid_events_about_pods_need_the_kernel_log():
    with pytest.raises(helm_python.HelmError, match=r"xid\.eventsRegarding=pod needs xid\.kmsg\.enabled=true"):
        render({"xid": {"eventsRegarding": "pod"}})
    # without Events, or without the API client, there is nothing to decide
    assert render({"xid": {"eventsRegarding": "pod", "events": False}})


@pytest.mark.parametrize("bad", [{"eventsNamespace": "gpu-monitoring"}, {"eventsRegarding": "container"}])
def test_the_schema_refuses_event_places_the_api_server_would(bad):
    with pytest.raises(helm_python.HelmValuesError):
        helm_python.Chart.load(CHART).render({"xid": bad}, name=RELEASE, namespace=NAMESPACE)


def test_existing_service_account():
    objs = render({"serviceAccount": {"create": False, "name": "gpu-sa"}})
    assert by_kind(objs, "ServiceAccount") == []
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-sa"
    assert one(objs, "ClusterRoleBinding")["subjects"][0]["name"] == "gpu-sa"
    assert one(objs, "RoleBinding")["subjects"][0]["name"] == "gpu-sa"


# --------------------------------------------------------------------------------------------
# NetworkPolicy


PROMETHEUS_PEERS = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_network_policy_is_off_by_default():
    assert by_kind(render(), "NetworkPolicy") == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
    assert values == {"enabled": False, "from": PROMETHEUS_PEERS}


def test_network_policy_admits_only_the_prometheus_pods_to_the_metrics_port():
    objs = render({"networkPolicy": {"enabled": True}, "port": 9500})
    policy = one(objs, "NetworkPolicy")
    ds = one(objs, "DaemonSet")
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    spec = policy["spec"]
    # it selects exactly the exporter's pods
    assert spec["podSelector"] == {"matchLabels": ds["spec"]["selector"]["matchLabels"]}
    assert spec["podSelector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]  # the exporter's own API calls are not restricted
    (rule,) = spec["ingress"]
    # kube-prometheus-stack's Prometheus pods, in any namespace (both selectors in one peer: AND)
    assert rule["from"] == PROMETHEUS_PEERS
    port = container(objs)["ports"][0]
    assert rule["ports"] == [{"port": port["containerPort"], "protocol": "TCP"}] == [{"port": 9500, "protocol": "TCP"}]
    peers = VALUE_SETS["network-policy"]["networkPolicy"]["from"]
    assert one(render(VALUE_SETS["network-policy"]), "NetworkPolicy")["spec"]["ingress"][0]["from"] == peers


@pytest.mark.parametrize("bad", [[], [{}], [{"podSelector": {}, "ports": [9400]}]])
def test_network_policy_refuses_peers_that_would_admit_everyone_or_are_not_peers(bad):
    # an empty `from` admits every source; an empty peer is not valid either
    with pytest.raises(helm_python.HelmValuesError):
        helm_python.Chart.load(CHART).render({"networkPolicy": {"enabled": True, "from": bad}},
                                             name=RELEASE, namespace=NAMESPACE)


# --------------------------------------------------------------------------------------------
# Service, ServiceMonitor, PrometheusRule


def test_headless_service_selects_the_daemonset_pods():
    objs = render()
    svc = one(objs, "Service")
    ds = one(objs, "DaemonSet")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9400, "targetPort": "metrics",
                                     "protocol": "TCP"}]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert ds["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


def _monitoring(values: dict) -> set[str]:
    return {f"{o['kind']}/{o['metadata']['name']}" for o in render(values)
            if o["kind"] in ("ServiceMonitor", "PrometheusRule")}


def test_monitoring_objects_only_with_the_crds_and_their_switches():
    sm, rules, alerts = (f"ServiceMonitor/{RECORDING_RULES}", f"PrometheusRule/{RECORDING_RULES}",
                         f"PrometheusRule/{ALERT_RULES}")
    assert _monitoring({}) == set()
    assert "Xid" not in notes()  # sanity: NOTES render
    assert "monitoring.coreos.com/v1 API (Prometheus Operator) was not found" in notes()
    assert _monitoring(WITH_CRDS) == {sm, rules, alerts}
    assert _monitoring({**WITH_CRDS, "serviceMonitor": {"enabled": False}}) == {rules, alerts}
    assert _monitoring({**WITH_CRDS, "prometheusRule": {"enabled": False}}) == {sm, alerts}
    assert _monitoring({**WITH_CRDS, "alerts": {"enabled": False}}) == {sm, rules}
    objs = render({**WITH_CRDS, "service": {"enabled": False}})
    assert not {o["kind"] for o in objs} & {"Service", "ServiceMonitor"}


def test_the_gate_is_the_capability_check():
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    assert f'.Capabilities.APIVersions.Has "{MONITORING_API}"' in text
    for name in ("servicemonitor.yaml", "prometheusrule.yaml", "prometheusrule-alerts.yaml"):
        assert 'include "kube-gpu-exporter.monitoringAPI"' in (CHART / "templates" / name).read_text()


def test_servicemonitor_structure_and_options():
    objs = render(ALL_ON)
    sm = one(objs, "ServiceMonitor")
    svc = one(objs, "Service")
    assert sm["apiVersion"] == MONITORING_API
    assert set(sm["spec"]) == {"jobLabel", "selector", "namespaceSelector", "endpoints"}
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["path"] == "/metrics"
    assert ep["honorLabels"] is True
    assert ep["relabelings"] == ALL_ON["serviceMonitor"]["relabelings"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert re.fullmatch(r"\d+[smh]", ep["interval"]) and re.fullmatch(r"\d+[smh]", ep["scrapeTimeout"])
    ep = one(render(WITH_CRDS), "ServiceMonitor")["spec"]["endpoints"][0]
    assert ep["honorLabels"] is False
    assert "relabelings" not in ep and "metricRelabelings" not in ep


def bundle_groups() -> list[dict]:
    return yaml.safe_load(render_rules(RuleOptions()))["groups"]


def test_prometheusrule_groups_equal_the_generated_bundle():
    rule = named(render(ALL_ON), "PrometheusRule", RECORDING_RULES)
    assert rule["apiVersion"] == MONITORING_API
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == bundle_groups()
    committed = yaml.safe_load((ROOT / "rules" / "kube-gpu-exporter.rules.yaml").read_text())
    assert rule["spec"]["groups"] == committed["groups"]
    for group in rule["spec"]["groups"]:
        assert group["rules"], group["name"]
        for r in group["rules"]:
            assert set(r) <= {"record", "alert", "expr", "for", "labels", "annotations"}
            assert "expr" in r and ("record" in r) != ("alert" in r)


def test_chart_copy_of_the_rules_is_fresh():
    copy = (CHART / "files" / "recording-rules.yaml").read_text()
    assert copy == BANNER + render_rules(RuleOptions()), "stale: run scripts/generate.sh"
    assert copy == (ROOT / "rules" / "kube-gpu-exporter.rules.yaml").read_text()


@pytest.mark.e2e
def test_promtool_accepts_the_rules_of_the_rendered_prometheusrule(tmp_path):
    rule = named(render(WITH_CRDS), "PrometheusRule", RECORDING_RULES)
    path = tmp_path / "chart-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert f"SUCCESS: {n} rules found" in proc.stdout + proc.stderr


def test_rule_label_names_must_match_the_exporter_while_the_bundle_is_installed():
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmRenderError, match="bundled recording rules use pod_name"):
        chart.render({**WITH_CRDS, "config": {"podLabel": "pod"}}, name=RELEASE, namespace=NAMESPACE)
    # the alerts and dashboards refuse it too (tests/test_helm_monitoring.py)
    objs = render({**WITH_CRDS, "config": {"podLabel": "pod"}, "prometheusRule": {"enabled": False},
                   "alerts": {"enabled": False}})
    assert env_of(objs)["KUBE_GPU_EXPORTER_POD_LABEL"] == "pod"
    # explicitly setting the default is fine
    assert named(render({**WITH_CRDS, "config": {"podLabel": "pod_name"}}), "PrometheusRule", RECORDING_RULES)


def test_prometheus_adapter_configmap_carries_the_chart_rules():
    assert not by_kind(render(), "ConfigMap")
    cm = one(render({"prometheusAdapter": {"configMap": {"enabled": True, "namespace": "custom-metrics",
                                                         "name": "adapter-rules"}}}), "ConfigMap")
    assert cm["metadata"]["name"] == "adapter-rules"
    assert cm["metadata"]["namespace"] == "custom-metrics"
    config = yaml.safe_load(cm["data"]["config.yaml"])
    source = yaml.safe_load((CHART / "files" / "prometheus-adapter-rules.yaml").read_text())
    assert config == {"externalRules": source["externalRules"]}
    assert len(config["externalRules"]) >= 2


# --------------------------------------------------------------------------------------------
# docs/deploy.md and docs/hpa.md stay true to the chart


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("doc", ["docs/deploy.md", "docs/hpa.md", "README.md"])
def test_doc_links_resolve(doc):
    path = ROOT / doc
    text = path.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target) if target else path
        assert file.exists(), f"{doc}: {link}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{doc}: {link}"
    if doc == "README.md":
        assert {"docs/deploy.md", "docs/hpa.md"} <= set(links)


def test_deploy_doc_lists_the_config_keys_and_rbac_of_the_chart():
    text = (ROOT / "docs" / "deploy.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `config.*`"))
    schema = json.loads((CHART / "values.schema.json").read_text())
    documented = set(re.findall(r"`(\w+)`", row.split("|")[3]))
    assert documented == set(schema["properties"]["config"]["properties"])
    # every verb and resource the chart grants is in the RBAC table, with its API group
    for group, resource, verb in rbac_rules(render()):
        row = rf"^\| `{resource}`: [^|]*`{verb}`[^|]*\(`{group or 'core'}`\)"
        assert re.search(row, text, re.M), (group, resource, verb)
