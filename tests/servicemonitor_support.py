"""A ServiceMonitor endpoint as prometheus-operator turns it into a Prometheus scrape job.

A translation of prometheus-operator v0.93.0 (f8fafd475f3d132e239432ae6172de60a6cb6516),
``pkg/prometheus/promcfg.go`` (git blob 4c194c9789ecd6d11c72adf2a96c522ba7db764c):
``generateServiceMonitorConfig`` for the default Prometheus (role ``endpoints``, one shard, no scrape
class, no enforced namespace label, ``overrideHonorLabels`` false) and ``generateRelabelConfig`` for the
endpoint's ``relabelings``/``metricRelabelings``. Only the endpoint fields the chart renders are
translated; any other one is refused, so the test cannot silently drop a setting. The operator's own
golden output for one ServiceMonitor (tests/data/prometheus-operator, SOURCE.md) checks the
translation in tests/test_helm_dcgm_labels.py.

Kubernetes service discovery is replaced by one static target carrying the ``__meta_kubernetes_*``
labels the ``endpoints`` role gives a Service port backed by a pod (Prometheus'
``discovery/kubernetes/endpoints.go``), so the operator's relabelings run unchanged.
"""

from __future__ import annotations

import re
from typing import Any

# The endpoint keys translated below; anything else in a rendered endpoint fails the translation.
KNOWN_ENDPOINT_KEYS = {
    "port",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
}
_RELABEL_KEYS = (
    ("sourceLabels", "source_labels"),
    ("separator", "separator"),
    ("targetLabel", "target_label"),
    ("regex", "regex"),
    ("modulus", "modulus"),
    ("replacement", "replacement"),
    ("action", "action"),
)
# What the config-reloader substitutes for $(SHARD) in the operator's sharding rule: shard 0 of 1.
SHARD = "0"


def sanitize(name: str) -> str:
    """promcfg.go's sanitizeLabelName: every character outside [a-zA-Z0-9_] becomes _."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def relabel_config(rc: dict[str, Any]) -> dict[str, Any]:
    """generateRelabelConfig: the CRD's camelCase keys in Prometheus' names and order, action lower case."""
    unknown = set(rc) - {k for k, _ in _RELABEL_KEYS}
    assert not unknown, f"relabel keys the translation does not know: {unknown}"
    out: dict[str, Any] = {}
    for crd, prom in _RELABEL_KEYS:
        # separator and replacement are pointers in the CRD type (set, even to "", is written); the rest
        # are written when not their zero value
        if (crd in ("separator", "replacement") and rc.get(crd) is not None) or rc.get(crd):
            out[prom] = rc[crd].lower() if crd == "action" else rc[crd]
    return out


def _selector_rules(selector: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for k in sorted(selector.get("matchLabels", {})):
        rules.append(
            {
                "action": "keep",
                "source_labels": [
                    f"__meta_kubernetes_service_label_{sanitize(k)}",
                    f"__meta_kubernetes_service_labelpresent_{sanitize(k)}",
                ],
                "regex": f"({selector['matchLabels'][k]});true",
            }
        )
    assert not selector.get("matchExpressions"), "matchExpressions: not translated (the chart renders none)"
    return rules


def _target_label_rules(port: str) -> list[dict[str, Any]]:
    kind = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    return [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
        {"source_labels": kind, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": kind, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        # filterRunning defaults to true
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
    ]


def _sharding_rules(shard: str) -> list[dict[str, Any]]:
    """appendShardingRelabelingWithLabel for one shard; ``shard`` is what $(SHARD) becomes."""
    return [
        {
            "source_labels": ["__address__", "__tmp_hash"],
            "target_label": "__tmp_hash",
            "regex": "(.+);",
            "replacement": "$1",
            "action": "replace",
        },
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": f"{shard};|.+;.+", "action": "keep"},
    ]


def scrape_job(monitor: dict[str, Any], index: int = 0, shard: str = SHARD) -> dict[str, Any]:
    """The scrape job of endpoint ``index`` of ``monitor`` (a ServiceMonitor), without its SD config."""
    spec, meta = monitor["spec"], monitor["metadata"]
    ep = spec["endpoints"][index]
    unknown = set(ep) - KNOWN_ENDPOINT_KEYS
    assert not unknown, f"endpoint keys the translation does not know: {unknown}"
    job: dict[str, Any] = {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
        "honor_labels": bool(ep.get("honorLabels", False)),
    }
    for crd, prom in (
        ("interval", "scrape_interval"),
        ("scrapeTimeout", "scrape_timeout"),
        ("path", "metrics_path"),
        ("scheme", "scheme"),
    ):
        if ep.get(crd):
            job[prom] = ep[crd]
    rules: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    rules += _selector_rules(spec["selector"])
    rules += _target_label_rules(ep["port"])
    rules.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"})
    if spec.get("jobLabel"):
        rules.append(
            {
                "source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    rules.append({"target_label": "endpoint", "replacement": ep["port"]})
    rules += [relabel_config(r) for r in ep.get("relabelings", [])]
    rules += _sharding_rules(shard)
    job["relabel_configs"] = rules
    if ep.get("metricRelabelings"):
        job["metric_relabel_configs"] = [relabel_config(r) for r in ep["metricRelabelings"]]
    return job


def endpoints_target(address: str, service: dict[str, Any], pod: str, container: str, port: str) -> dict[str, Any]:
    """A static target with the meta labels the ``endpoints`` role gives ``address``: port ``port`` of
    ``service``, backed by container ``container`` of pod ``pod`` (Running, ready), in the Service's namespace."""
    ns = service["metadata"]["namespace"]
    labels = {
        "__meta_kubernetes_namespace": ns,
        "__meta_kubernetes_endpoints_name": service["metadata"]["name"],
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_endpoint_port_name": port,
        "__meta_kubernetes_endpoint_port_protocol": "TCP",
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": pod,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_container_port_name": port,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
    }
    for k, v in service["metadata"].get("labels", {}).items():
        labels[f"__meta_kubernetes_service_label_{sanitize(k)}"] = v
        labels[f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"] = "true"
    return {"targets": [address], "labels": labels}
