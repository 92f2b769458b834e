"""The alert bundle routed the kube-prometheus-stack way: per namespace, by a team's AlertmanagerConfig.

kube-prometheus-stack users give a team its alerts with an ``AlertmanagerConfig`` in the team's
namespace. The Prometheus Operator nests that object's route under the root route of the
Alertmanager's configuration, first, with a ``namespace="<its namespace>"`` matcher and
``continue: true`` added, and prefixes its receivers' names with ``<namespace>/<name>/``
(pkg/alertmanager/amcfg.go: ``namespaceEnforcer``, ``continueToNextRoute``,
``AddAlertmanagerConfigs``; golden file ``base_with_subroute_deprecated_matching_pattern_simple_CR``).
The chart's default Alertmanager configuration groups by ``namespace``.

Here a simulated node runs pods of two namespaces, team-a and team-b, whose GPUs are idle and
raise application Xids; a third GPU is hot. A real Prometheus scrapes it the way a ServiceMonitor
does (the exporter pod's own ``namespace``/``pod``/``container`` as target labels) and evaluates the
recording rules and the alerts; a real Alertmanager runs the default configuration merged with
team-a's AlertmanagerConfig exactly as the operator renders it. Two local webhook receivers record
what they are sent: team-a's, and the root route's (``null`` in the chart; a webhook here, so that
what falls through is visible).
"""

from __future__ import annotations

import copy
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.bundle.alerts.cli import render_alerts
from exporter.bundle.alerts.options import AlertOptions
from exporter.bundle.rules import RuleOptions, render_rules
from tests.prom_support import (
    ALERTMANAGER,
    PROMETHEUS,
    http_get,
    poll,
    rule_health,
    run_alertmanager,
    run_prometheus,
    start_exporter,
    stop,
)

pytestmark = pytest.mark.e2e  # every test here starts a server

NODE = "routing-node"
# The exporter's own pod, as a ServiceMonitor's target labels name it.
EXPORTER_POD = {"namespace": "monitoring", "pod": "kube-gpu-exporter-x7k2p", "container": "exporter",
                "service": "kube-gpu-exporter", "endpoint": "metrics"}  # fmt: skip
# The alerts the scenario fires; their `for:` is shortened to 1s (promtool tests the real ones).
FIRED = ("KubeGpuXidApplication", "KubeGpuAllocatedIdle", "KubeGpuTemperatureHigh")
# (namespace, pod, container, pid, GPU index, pod uid tail, container id digit)
PODS = [("team-a", "trainer-0", "trainer", 201, 0, "a", "a"), ("team-b", "infer-0", "server", 301, 1, "b", "b")]
TEAM_A_RECEIVER = "team-a/gpu-alerts/team-a-webhook"
KMSG = (
    "4,10,1000000,-;NVRM: Xid (PCI:0000:07:00): 31, pid=201, name=python, Ch 00000008, intr 00000000. MMU Fault\n"
    "4,11,1000500,-;NVRM: Xid (PCI:0000:0f:00): 13, pid=301, name=python, Graphics Exception on GPC 0\n"
)


def _uuid(index: int) -> str:
    return f"GPU-70e10000-0000-4000-8000-00000000000{index}"


def _scenario() -> dict[str, Any]:
    """team-a/trainer-0 holds GPU 0 and team-b/infer-0 GPU 1, both idle; GPU 2 is unheld and hot."""
    buses = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:17:00.0"]
    devices = [
        {"uuid": _uuid(i), "name": "NVIDIA A10", "minor_number": i, "pci_bus_id": bus,
         "memory_total_bytes": 16_000_000_000, "memory_used_bytes": 1_000_000_000 if i < 2 else 0,
         "utilization_gpu": 0, "utilization_memory": 0, "power_usage_milliwatts": 60_000,
         "temperature_celsius": 92 if i == 2 else 45}
        for i, bus in enumerate(buses)
    ]  # fmt: skip
    pods, resources = [], []
    for ns, pod, ctr, pid, gpu, uid_tail, cid_digit in PODS:
        uid = f"70e10000-0000-4000-8000-00000000001{uid_tail}"
        cid = cid_digit * 64
        devices[gpu]["processes"] = [{
            "pid": pid, "used_memory_bytes": 1_000_000_000, "sm_util": 0,
            "cgroup": f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n",
        }]  # fmt: skip
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns, "uid": uid, "resourceVersion": "1"},
            "spec": {"nodeName": NODE, "containers": [
                {"name": ctr, "image": "example.com/gpu:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": ctr, "ready": True, "restartCount": 0, "image": "example.com/gpu:1", "imageID": "",
                 "containerID": f"containerd://{cid}"}]},
        })  # fmt: skip
        resources.append({"name": pod, "namespace": ns, "containers": [
            {"name": ctr, "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [_uuid(gpu)]}]}]})  # fmt: skip
    return {"node": NODE, "devices": devices, "pods": pods, "pod_resources": resources}


# kube-prometheus-stack's default `alertmanager.config` (values.yaml), timings shortened for the test.
KPS_DEFAULT: dict[str, Any] = {
    "global": {"resolve_timeout": "5m"},
    "inhibit_rules": [
        {"source_matchers": ["severity = critical"], "target_matchers": ["severity =~ warning|info"],
         "equal": ["namespace", "alertname"]},
        {"source_matchers": ["severity = warning"], "target_matchers": ["severity = info"],
         "equal": ["namespace", "alertname"]},
        {"source_matchers": ["alertname = InfoInhibitor"], "target_matchers": ["severity = info"],
         "equal": ["namespace"]},
        {"target_matchers": ["alertname = InfoInhibitor"]},
    ],
    "route": {
        "group_by": ["namespace"], "group_wait": "1s", "group_interval": "1s", "repeat_interval": "12h",
        "receiver": "null",
        "routes": [{"receiver": "null", "matchers": ['alertname = "Watchdog"']}],
    },
    "receivers": [{"name": "null"}],
}  # fmt: skip

# team-a's AlertmanagerConfig (monitoring.coreos.com/v1alpha1): all of its namespace's alerts to its webhook.
TEAM_A_CONFIG: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1alpha1",
    "kind": "AlertmanagerConfig",
    "metadata": {"name": "gpu-alerts", "namespace": "team-a"},
    "spec": {
        "route": {"receiver": "team-a-webhook"},
        "receivers": [{"name": "team-a-webhook", "webhookConfigs": [{"url": "WEBHOOK/team-a", "sendResolved": False}]}],
    },
}  # fmt: skip


def operator_render(base: dict[str, Any], amc: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``amc`` merged in as the Prometheus Operator does (default OnNamespace strategy)."""
    ns, name = amc["metadata"]["namespace"], amc["metadata"]["name"]
    prefix = f"{ns}/{name}/"
    spec = amc["spec"]
    route: dict[str, Any] = {"receiver": prefix + spec["route"]["receiver"]}
    for field, key in (("groupBy", "group_by"), ("groupWait", "group_wait"), ("groupInterval", "group_interval")):
        if field in spec["route"]:
            route[key] = spec["route"][field]
    matchers = [f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"' for m in spec["route"].get("matchers", [])]
    route["matchers"] = [*matchers, f'namespace="{ns}"']  # namespaceEnforcer.processRoute
    route["continue"] = True  # continueToNextRoute: every first-level AlertmanagerConfig route
    cfg = copy.deepcopy(base)
    cfg["route"]["routes"] = [route, *cfg["route"].get("routes", [])]  # before the main config's routes
    for receiver in spec["receivers"]:
        hooks = [{"url": w["url"], "send_resolved": w["sendResolved"]} for w in receiver["webhookConfigs"]]
        cfg["receivers"].append({"name": prefix + receiver["name"], "webhook_configs": hooks})
    return cfg


class Webhooks:
    """A local HTTP server recording every Alertmanager notification, by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    received.append((self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def at(self, path: str) -> list[dict[str, Any]]:
        """The notifications posted to ``path``, oldest first."""
        return [body for p, body in list(self.received) if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhooks() -> Iterator[Webhooks]:
    hooks = Webhooks()
    yield hooks
    hooks.close()


def _alerts_text() -> str:
    doc = yaml.safe_load(render_alerts(AlertOptions()))
    for rule in doc["groups"][0]["rules"]:
        if rule["alert"] in FIRED:
            rule["for"] = "1s"
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _alerts_in(notifications: list[dict[str, Any]]) -> set[tuple[str, str | None, str | None]]:
    """(alertname, namespace, pod) of every alert in ``notifications``."""
    return {(a["labels"]["alertname"], a["labels"].get("namespace"), a["labels"].get("pod"))
            for n in notifications for a in n["alerts"]}  # fmt: skip


TEAM_A_ALERTS = {("KubeGpuXidApplication", "team-a", "trainer-0"), ("KubeGpuAllocatedIdle", "team-a", "trainer-0")}
TEAM_B_ALERTS = {("KubeGpuXidApplication", "team-b", "infer-0"), ("KubeGpuAllocatedIdle", "team-b", "infer-0")}
NODE_ALERTS = {("KubeGpuTemperatureHigh", None, None)}


def _check_notifications(team_a_got: list[dict[str, Any]], root_got: list[dict[str, Any]]) -> None:
    """What team-a's webhook and the root route's were sent: routed and grouped per namespace."""
    # team-a's receiver: its own GPU alerts, nothing of team-b's, no node-level alert
    assert _alerts_in(team_a_got) == TEAM_A_ALERTS
    assert {n["receiver"] for n in team_a_got} == {TEAM_A_RECEIVER}
    # team-a's route matched first and was the only match: its alerts do not fall through
    assert _alerts_in(root_got) == TEAM_B_ALERTS | NODE_ALERTS
    # grouped per namespace: each notification holds one namespace's alerts, named in groupLabels
    for n in team_a_got + root_got:
        namespaces = {a["labels"].get("namespace") for a in n["alerts"]}
        assert len(namespaces) == 1, n["alerts"]
        ns = namespaces.pop()
        assert n["groupLabels"] == ({"namespace": ns} if ns else {}), n["groupLabels"]
    assert {n["groupKey"] for n in team_a_got} == {'{}/{namespace="team-a"}:{namespace="team-a"}'}
    assert {n["groupLabels"].get("namespace") for n in root_got} == {"team-b", None}
    # the copies name the GPU's user; the exporter's own pod is on no alert
    for n in team_a_got + root_got:
        for a in n["alerts"]:
            labels = a["labels"]
            assert "monitoring" not in labels.values() and EXPORTER_POD["pod"] not in labels.values()
            if "namespace" in labels:
                copies = (labels["namespace"], labels["pod"], labels["container"])
                assert copies == (labels["namespace_name"], labels["pod_name"], labels["container_name"])


def test_team_a_alertmanagerconfig_gets_team_a_gpu_alerts_grouped_by_namespace(
    tmp_path: Path, webhooks: Webhooks
) -> None:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    assert Path(ALERTMANAGER).exists(), "Alertmanager missing: apt-get install prometheus-alertmanager"
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(_scenario(), sort_keys=False))
    (tmp_path / "kmsg").write_text(KMSG)
    base = copy.deepcopy(KPS_DEFAULT)
    base["receivers"] = [{"name": "null", "webhook_configs": [{"url": f"{webhooks.url}/null", "send_resolved": False}]}]
    team_a = json.loads(json.dumps(TEAM_A_CONFIG).replace("WEBHOOK", webhooks.url))
    config = operator_render(base, team_a)
    assert config["route"]["routes"][0] == {
        "receiver": TEAM_A_RECEIVER, "matchers": ['namespace="team-a"'], "continue": True,
    }  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        exporter, address = start_exporter(
            tmp_path / "scenario.yaml", NODE, logs,
            "--kmsg-path", str(tmp_path / "kmsg"), "--kmsg-replay", "--no-events", "--interval", "0.2",
        )  # fmt: skip
        procs.append(exporter)
        am, am_base = run_alertmanager(logs, yaml.safe_dump(config, sort_keys=False))
        procs.append(am)
        prom, prom_base = run_prometheus(
            tmp_path, [render_rules(RuleOptions(interval="1s")), _alerts_text()],
            [{"targets": [address], "labels": EXPORTER_POD}], [am_base.removeprefix("http://")],
        )  # fmt: skip
        procs.append(prom)

        def delivered() -> bool:
            return (_alerts_in(webhooks.at("/team-a")) >= TEAM_A_ALERTS
                    and _alerts_in(webhooks.at("/null")) >= TEAM_B_ALERTS | NODE_ALERTS)  # fmt: skip

        if not poll(delivered, deadline_s=90):
            seen = [(a["labels"], a["receivers"]) for a in json.loads(http_get(f"{am_base}/api/v2/alerts"))]
            pytest.fail(f"notifications missing; received {webhooks.received}; Alertmanager has {seen}")
        _check_notifications(webhooks.at("/team-a"), webhooks.at("/null"))
        # Alertmanager's own view of the routing agrees
        receivers = {(a["labels"]["alertname"], a["labels"].get("namespace")): [r["name"] for r in a["receivers"]]
                     for a in json.loads(http_get(f"{am_base}/api/v2/alerts"))}  # fmt: skip
        assert receivers == {
            ("KubeGpuXidApplication", "team-a"): [TEAM_A_RECEIVER],
            ("KubeGpuAllocatedIdle", "team-a"): [TEAM_A_RECEIVER],
            ("KubeGpuXidApplication", "team-b"): ["null"],
            ("KubeGpuAllocatedIdle", "team-b"): ["null"],
            ("KubeGpuTemperatureHigh", None): ["null"],
        }
        assert not rule_health(prom_base)
    finally:
        for proc in reversed(procs):
            stop(proc)
