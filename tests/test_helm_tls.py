"""The chart's webConfig (--web-config-file) and the ServiceMonitor's TLS and basic authentication."""

from __future__ import annotations

import helm_python
import kubernetes_validate
import pytest

from exporter.shell.config import ConfigError, load_config
from tests.test_helm import CHART, KUBE_VERSIONS, NAMESPACE, RELEASE, WITH_CRDS, container, notes, one, render

SM_TLS = {"ca": {"secret": {"name": "gpu-exporter-tls", "key": "ca.crt"}}, "serverName": "kube-gpu-exporter"}
SM_AUTH = {"username": {"name": "scrape", "key": "username"}, "password": {"name": "scrape", "key": "password"}}
AUTH_HEADER = [{"name": "Authorization", "value": "Basic cHJvYmU6cHJvYmU="}]
TLS_ON = {**WITH_CRDS, "webConfig": {"secretName": "gpu-exporter-web", "tlsSecretName": "gpu-exporter-tls",
                                     "probeHttpHeaders": AUTH_HEADER},
          "serviceMonitor": {"tlsConfig": SM_TLS, "basicAuth": SM_AUTH}}


def pod_spec(objs: list[dict]) -> dict:
    return one(objs, "DaemonSet")["spec"]["template"]["spec"]


def test_off_by_default_plain_http_probes_and_scrapes():
    objs = render(WITH_CRDS)
    c = container(objs)
    assert not any(a.startswith("--web-config-file") for a in c["args"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    (ep,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert ep["scheme"] == "http" and "tlsConfig" not in ep and "basicAuth" not in ep


def test_secrets_mounted_read_only_flag_set_https_everywhere():
    objs = render(TLS_ON)
    c = container(objs)
    assert "--web-config-file=/etc/kube-gpu-exporter/web/web-config.yml" in c["args"]
    with pytest.raises(ConfigError, match=r"^--web-config-file /etc/kube-gpu-exporter/web/\S+: cannot read"):
        load_config(c["args"])  # the exporter takes the argument (the file is in the pod only)
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["web-config"] == {"name": "web-config", "mountPath": "/etc/kube-gpu-exporter/web", "readOnly": True}
    assert mounts["web-tls"] == {"name": "web-tls", "mountPath": "/etc/kube-gpu-exporter/tls", "readOnly": True}
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    assert volumes["web-config"]["secret"] == {"secretName": "gpu-exporter-web"}  # no subPath: rotations arrive
    assert volumes["web-tls"]["secret"] == {"secretName": "gpu-exporter-tls"}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics", "scheme": "HTTPS", "httpHeaders": AUTH_HEADER}
        assert c[probe]["periodSeconds"] > 0  # the timing values stay
    (ep,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert ep["scheme"] == "https" and ep["tlsConfig"] == SM_TLS and ep["basicAuth"] == SM_AUTH


def test_tcp_probes_where_the_kubelet_cannot_authenticate():
    c = container(render({"webConfig": {"secretName": "w", "probe": "tcpSocket"}}))
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["tcpSocket"] == {"port": "metrics"} and "httpGet" not in c[probe]


def test_basic_auth_only_keeps_http():
    objs = render({**WITH_CRDS, "webConfig": {"secretName": "w", "tls": False, "probeHttpHeaders": AUTH_HEADER},
                   "serviceMonitor": {"basicAuth": SM_AUTH}})
    c = container(objs)
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "httpHeaders": AUTH_HEADER}
    (ep,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert ep["scheme"] == "http" and ep["basicAuth"] == SM_AUTH


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", [TLS_ON, {"webConfig": {"secretName": "w", "probe": "tcpSocket"}}],
                         ids=["https", "tcp"])
def test_rendered_daemonset_passes_strict_schema_validation(values, kube_version):
    kubernetes_validate.validate(one(render(values), "DaemonSet"), kube_version, strict=True)


def test_helm_lint_strict_is_clean():
    assert helm_python.lint(CHART, TLS_ON, strict=True, namespace=NAMESPACE)["errors"] == []


@pytest.mark.parametrize("bad", [{"probe": "exec"}, {"key": "../x"}, {"probeHttpHeaders": [{"name": "x"}]},
                                 {"unknown": 1}])
def test_schema_refuses_bad_web_config_values(bad):
    with pytest.raises(helm_python.HelmValuesError):
        helm_python.Chart.load(CHART).render({"webConfig": {"secretName": "w", **bad}}, name=RELEASE,
                                             namespace=NAMESPACE)


def test_notes_say_how_to_reach_the_metrics():
    assert "curl -s http://127.0.0.1:9400/metrics | grep" in notes()
    assert "curl -sk https://127.0.0.1:9400/metrics <-u user:password" in notes({"webConfig": {"secretName": "w"}})
