"""The chart grants exactly the Kubernetes API calls the exporter makes: nothing more, nothing missing.

Each case renders the chart, then runs the real exporter (``python -m exporter``, the real NVML
backend on the fake libnvidia-ml.so.1) with the arguments and environment of the rendered
DaemonSet against the Kubernetes API double, which records every request. Only what a pod gets
from its node is replaced: ``--host-proc`` points at a fake /proc, ``/dev/kmsg`` (when the chart
mounts it) at a file the test appends Xid records to, the pod-resources socket (when the chart
mounts it) at a grpc server, ``--kube-api-url`` stands in for the in-cluster configuration, and
``NODE_NAME`` for the downward API. The test makes Xids happen (NVML events or kernel-log
records), waits for the Event, and stops the exporter, which patches the Event's series on the
way out. Every recorded request is mapped to the RBAC (apiGroup, resource, verb, scope) that
authorizes it, the way the API server does (verbs from the method and ``watch``, scope from the
path); that set must equal what the chart's Roles and ClusterRoles grant through their bindings.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.node.simulate import parse_scenario
from exporter.xid.events import EVENT_NAMESPACE
from tests.fake_nvml import build_fake_nvml, subprocess_env, write_config
from tests.integration_support import (
    EXAMPLES,
    ExporterProcess,
    PodResourcesServer,
    build_fake_proc,
    free_port,
    load_scenario_dict,
    parse_exposition,
    poll,
)
from tests.k8s_double import ApiServerDouble, RecordedRequest, make_node
from tests.test_dra_shapes import claim, gpu_device, pod, resource_slice
from tests.test_helm import CLUSTER, ROOT, container, one, rbac_grants, render

READY_S = 60.0  # a Python process importing the kubernetes client on a loaded 2-core box
# NVML Xids are held for the dedup window (10 s) before they count and raise an Event
NVML_XID_S = 60.0
SCENARIO = EXAMPLES / "seed-exclusive-t4.yaml"
XID = 31  # MMU fault: the GPU stays up

Grant = tuple[str, str, str, str]  # (apiGroup, resource, verb, scope)
# DRA: this node's ResourceSlices (list, watch) and the ResourceClaims its pods name (get, in their namespace)
DRA = {("resource.k8s.io", "resourceslices", "list", CLUSTER), ("resource.k8s.io", "resourceslices", "watch", CLUSTER),
       ("resource.k8s.io", "resourceclaims", "get", CLUSTER)}


# --------------------------------------------------------------------------------------------
# a request -> the RBAC it needs


def rbac_needed(req: RecordedRequest) -> Grant:
    """The (apiGroup, resource, verb, scope) that authorizes ``req``: scope is the namespace of a
    namespaced request, CLUSTER for a cluster-scoped one or one across all namespaces."""
    parts = req.path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/...
        group, rest = "", parts[2:]
    else:  # /apis/<group>/<version>/...
        assert parts[0] == "apis", req.path
        group, rest = parts[1], parts[3:]
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"  # subresource
    named = len(rest) >= 2
    if req.method == "GET":
        verb = "get" if named else ("watch" if req.query.get("watch") in ("true", "1") else "list")
    elif req.method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[req.method]
    return group, resource, verb, namespace or CLUSTER


def test_request_mapping_follows_the_api_server():
    def req(method: str, path: str, **query: str) -> RecordedRequest:
        return RecordedRequest(method, path, dict(query), None, "")

    assert rbac_needed(req("GET", "/api/v1/pods", fieldSelector="spec.nodeName=n")) == ("", "pods", "list", CLUSTER)
    assert rbac_needed(req("GET", "/api/v1/pods", watch="true")) == ("", "pods", "watch", CLUSTER)
    assert rbac_needed(req("GET", "/api/v1/namespaces/ml/pods", watch="1")) == ("", "pods", "watch", "ml")
    assert rbac_needed(req("GET", "/api/v1/nodes/n1")) == ("", "nodes", "get", CLUSTER)
    assert rbac_needed(req("GET", "/api/v1/namespaces/ml")) == ("", "namespaces", "get", CLUSTER)
    assert rbac_needed(req("POST", "/apis/events.k8s.io/v1/namespaces/default/events")) == (
        "events.k8s.io", "events", "create", "default")
    assert rbac_needed(req("PATCH", "/apis/events.k8s.io/v1/namespaces/default/events/e")) == (
        "events.k8s.io", "events", "patch", "default")
    assert rbac_needed(req("PUT", "/api/v1/namespaces/ml/pods/p/status")) == ("", "pods/status", "update", "ml")
    assert rbac_needed(req("DELETE", "/api/v1/namespaces/ml/pods")) == ("", "pods", "deletecollection", "ml")
    assert rbac_needed(req("GET", "/apis/resource.k8s.io/v1/resourceslices", watch="true")) == (
        "resource.k8s.io", "resourceslices", "watch", CLUSTER)
    assert rbac_needed(req("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c")) == (
        "resource.k8s.io", "resourceclaims", "get", "ml")


# --------------------------------------------------------------------------------------------
# the exporter as the chart runs it


@dataclass
class Run:
    exporter: ExporterProcess
    api: ApiServerDouble
    kmsg: Path | None  # where the chart's /dev/kmsg is, when it mounts one
    node: str
    podres: PodResourcesServer | None  # the kubelet's socket, when the chart mounts it

    def append_kmsg_xids(self, seq: int, count: int = 2) -> None:
        assert self.kmsg is not None
        pid = load_scenario_dict(SCENARIO)["devices"][0]["processes"][0]["pid"]
        with self.kmsg.open("a") as f:
            for i in range(count):
                f.write(f"4,{seq + i},{(seq + i) * 1000},-;NVRM: Xid (PCI:0000:3b:00): {XID}, pid={pid}, "
                        "name=python, Ch 00000008, intr 00000000. MMU Fault\n")

    def xids_counted(self) -> float:
        text = self.exporter.try_scrape() or ""
        return sum(v for k, v in parse_exposition(text).items() if k[0] == "nvidia_gpu_xid_errors_total")


def _chart_command(values: dict) -> tuple[list[str], dict[str, str]]:
    """The exporter's argv tail and KUBE_GPU_EXPORTER_* environment of the rendered DaemonSet."""
    c = container(render(values))
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert {e["name"] for e in c["env"] if "value" not in e} == {"NODE_NAME"}  # the downward API
    return list(c["args"]), env


@contextmanager
def exporter_as_the_chart_runs_it(values: dict, tmp_path: Path, *, nvml_xids: bool,
                                  scenario_path: Path = SCENARIO) -> Iterator[Run]:
    """The exporter with the rendered DaemonSet's arguments and environment, on ``scenario_path``'s node."""
    scenario = load_scenario_dict(scenario_path)
    node = scenario["node"]
    if nvml_xids:  # two Xids of one series on the GPU, a few sampling cycles after start
        scenario["devices"][0]["xid_events"] = [{"tick": 8, "xid": XID}, {"tick": 9, "xid": XID}]
    parsed = parse_scenario(scenario)
    lib = build_fake_nvml(tmp_path / "nvml")
    config = write_config(scenario, tmp_path / "fake_nvml.cfg")
    proc_root = build_fake_proc(tmp_path / "proc", scenario)
    args, chart_env = _chart_command(values)
    port = free_port()
    with ExitStack() as stack:
        api = stack.enter_context(ApiServerDouble())
        api.set_nodes([make_node(node, labels=scenario.get("node_labels") or {})])
        for p in scenario.get("pods") or []:
            api.add_pod(p)
        _add_dra_pod(api, node)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KUBE_GPU_EXPORTER_") and k not in ("KUBECONFIG", "NODE_NAME")}
        env = subprocess_env(lib.parent, config, env)
        env.update(chart_env)
        env["NODE_NAME"] = node
        env["KUBE_GPU_EXPORTER_LISTEN"] = f"127.0.0.1:{port}"
        env.setdefault("KUBE_GPU_EXPORTER_INTERVAL", "0.2")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        podres = None
        if env["KUBE_GPU_EXPORTER_POD_RESOURCES_SOCKET"]:
            podres = stack.enter_context(PodResourcesServer(parsed.pod_resources or ()))
            env["KUBE_GPU_EXPORTER_POD_RESOURCES_SOCKET"] = podres.socket_path
        kmsg = None
        if env.get("KUBE_GPU_EXPORTER_KMSG_PATH") != "/dev/kmsg":
            # No kernel log: the chart says "none" (or turns Xids off), and this machine's own
            # /dev/kmsg is never opened.
            assert env.get("KUBE_GPU_EXPORTER_KMSG_PATH") in (None, "none")
        else:
            kmsg = tmp_path / "kmsg"
            kmsg.write_text("")  # the ring buffer at start: history, never counted
            env["KUBE_GPU_EXPORTER_KMSG_PATH"] = str(kmsg)
        host_proc = [a for a in args if a.startswith("--host-proc=")]
        assert host_proc == ["--host-proc=/host/proc"]
        argv = [sys.executable, "-m", "exporter", *[a for a in args if a not in host_proc],
                f"--host-proc={proc_root}", "--kube-api-url", api.url]
        exporter = ExporterProcess(argv, env, port, tmp_path / "exporter.log").start()
        stack.callback(exporter.stop)
        exporter.wait_ready(READY_S)
        yield Run(exporter, api, kmsg, node, podres)


def _add_dra_pod(api: ApiServerDouble, node: str) -> None:
    """A pod holding a GPU through a ResourceClaim, so that the exporter reads the DRA objects."""
    uid = "d7a00000-0000-4000-8000-00000000ab01"
    api.add_pod(pod("ml", "dra-probe", uid, node, {"c": [("gpu", "")]}, {"gpu": ("claim", "dra-probe-gpu")}))
    api.set_resource_claims([claim("ml", "dra-probe-gpu", [("gpu", node, "gpu-0")], [("dra-probe", uid)])])
    api.set_resource_slices([resource_slice(node, [gpu_device(0, "GPU-00000000-0000-4000-8000-00000000ab01")])])


def _answered(api: ApiServerDouble) -> list[RecordedRequest]:
    requests = api.requests
    bad = [(r.method, r.path, r.status) for r in requests if r.status is None or not 200 <= r.status < 300]
    # a watch cut short by the exporter's stop has no status; everything else must have succeeded
    bad = [b for b in bad if not (b[0] == "GET" and b[2] is None)]
    assert not bad, f"requests the double refused: {bad}"
    return requests


def _wait_for_pod_and_node_reads(run: Run) -> None:
    poll(lambda: run.api.requests_to("GET", f"/api/v1/nodes/{run.node}") or None, READY_S, "the Node read")
    poll(lambda: [r for r in run.api.requests_to("GET", "/api/v1/pods") if r.query.get("watch")] or None,
         READY_S, "the pod watch")
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    poll(lambda: [r for r in run.api.requests_to("GET", slices) if r.query.get("watch")] or None,
         READY_S, "the ResourceSlice watch")
    poll(lambda: run.api.requests_to("GET", "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/") or None,
         READY_S, "the ResourceClaim read")


def _event_creates(api: ApiServerDouble) -> list[RecordedRequest]:
    return api.requests_to("POST", f"/apis/events.k8s.io/v1/namespaces/{EVENT_NAMESPACE}/events")


def _recorded_vs_granted(values: dict, run: Run) -> tuple[set[Grant], set[Grant]]:
    run.exporter.stop()  # flushes the pending series update: the PATCH
    assert run.exporter.proc is not None and run.exporter.proc.returncode == 0, run.exporter.output()[-3000:]
    granted = rbac_grants(render(values))
    recorded = {rbac_needed(r) for r in _answered(run.api)}
    # a namespaced read that a ClusterRoleBinding authorizes (the claims of pods in any namespace)
    recorded = {(g, r, v, CLUSTER) if (g, r, v, CLUSTER) in granted else (g, r, v, s) for g, r, v, s in recorded}
    return recorded, granted


# --------------------------------------------------------------------------------------------
# the cases: the default (NVML Xids), the kernel log, and the features that remove API calls


def _assert_event_series_written(recorded: set[Grant]) -> None:
    assert ("events.k8s.io", "events", "create", EVENT_NAMESPACE) in recorded
    assert ("events.k8s.io", "events", "patch", EVENT_NAMESPACE) in recorded


@pytest.mark.e2e
def test_default_chart_grants_exactly_what_the_exporter_calls(tmp_path: Path):
    values: dict = {}
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=True) as run:
        assert run.kmsg is None  # the default takes Xids from NVML events, not the kernel log
        _wait_for_pod_and_node_reads(run)
        assert "Xids from NVML events only, without pods" in run.exporter.output()
        poll(lambda: _event_creates(run.api) or None, NVML_XID_S, "the NVML Xid's Event")
        poll(lambda: run.xids_counted() == 2 or None, NVML_XID_S, "both NVML Xids counted")
        recorded, granted = _recorded_vs_granted(values, run)
    _assert_event_series_written(recorded)
    assert recorded == granted
    assert granted == {("", "pods", "list", CLUSTER), ("", "pods", "watch", CLUSTER), ("", "nodes", "get", CLUSTER),
                       ("events.k8s.io", "events", "create", EVENT_NAMESPACE),
                       ("events.k8s.io", "events", "patch", EVENT_NAMESPACE)} | DRA
    slices = run.api.requests_to("GET", "/apis/resource.k8s.io/v1/resourceslices")
    assert slices and {r.query.get("fieldSelector") for r in slices} == {f"spec.nodeName={run.node}"}
    # the pod list/watch is this node's pods only (which RBAC cannot express; the code does)
    pods = [r for r in run.api.requests_to("GET", "/api/v1/pods")]
    assert pods and {r.query.get("fieldSelector") for r in pods} == {f"spec.nodeName={run.node}"}


@pytest.mark.e2e
def test_kmsg_and_pod_resources_change_no_api_call(tmp_path: Path):
    values = {"xid": {"kmsg": {"enabled": True}}, "podResources": {"enabled": True}}
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=False) as run:
        _wait_for_pod_and_node_reads(run)
        assert run.podres is not None and run.podres.calls > 0  # the kubelet's answer is not an API call
        run.append_kmsg_xids(seq=100)
        poll(lambda: _event_creates(run.api) or None, READY_S, "the kernel-log Xid's Event")
        poll(lambda: run.xids_counted() == 2 or None, READY_S, "both kernel-log Xids counted")
        recorded, granted = _recorded_vs_granted(values, run)
    _assert_event_series_written(recorded)
    assert recorded == granted
    assert granted == rbac_grants(render({}))



@pytest.mark.e2e
def test_events_about_pods_are_written_in_the_pods_namespace_with_the_cluster_wide_grant(tmp_path: Path):
    values = {"xid": {"kmsg": {"enabled": True}, "eventsRegarding": "pod"}}
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=False) as run:
        _wait_for_pod_and_node_reads(run)
        run.append_kmsg_xids(seq=150)
        creates = poll(lambda: run.api.requests_to("POST") or None, READY_S, "the kernel-log Xid's Event")
        poll(lambda: run.xids_counted() == 2 or None, READY_S, "both kernel-log Xids counted")
        recorded, granted = _recorded_vs_granted(values, run)
    (event,) = [e for e in run.api.events() if e["reason"].startswith("NvidiaXid")]
    assert event["regarding"]["kind"] == "Pod" and event["related"]["kind"] == "Node"
    assert {r.path for r in creates} == {f"/apis/events.k8s.io/v1/namespaces/{event['regarding']['namespace']}/events"}
    pod = load_scenario_dict(SCENARIO)["pods"][0]["metadata"]
    assert (event["regarding"]["namespace"], event["regarding"]["name"]) == (pod["namespace"], pod["name"])
    assert recorded == granted
    others = {g for g in rbac_grants(render({})) if g[1] != "events"}
    assert granted == others | {("events.k8s.io", "events", v, CLUSTER) for v in ("create", "patch")}

@pytest.mark.e2e
def test_without_events_no_event_is_written_and_none_granted(tmp_path: Path):
    values = {"xid": {"events": False, "kmsg": {"enabled": True}}}
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=False) as run:
        _wait_for_pod_and_node_reads(run)
        run.append_kmsg_xids(seq=200)
        poll(lambda: run.xids_counted() == 2 or None, READY_S, "both Xids counted")
        recorded, granted = _recorded_vs_granted(values, run)
    assert recorded == granted == {("", "pods", "list", CLUSTER), ("", "pods", "watch", CLUSTER),
                                   ("", "nodes", "get", CLUSTER)} | DRA


@pytest.mark.e2e
def test_without_xid_the_events_role_goes(tmp_path: Path):
    values = {"xid": {"enabled": False}}
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=True) as run:
        _wait_for_pod_and_node_reads(run)
        time.sleep(3)  # past the NVML Xids' ticks: nothing reads them
        recorded, granted = _recorded_vs_granted(values, run)
    assert recorded == granted
    assert not any(g[1] == "events" for g in granted)


@pytest.mark.e2e
def test_without_the_pod_watch_there_are_no_api_calls_and_no_rbac(tmp_path: Path):
    values = {"config": {"podWatch": False}, "xid": {"kmsg": {"enabled": True}}}
    objs = render(values)
    assert not [o for o in objs if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=False) as run:
        run.append_kmsg_xids(seq=300)
        poll(lambda: run.xids_counted() == 2 or None, READY_S, "both Xids counted")
        recorded, granted = _recorded_vs_granted(values, run)
    assert recorded == granted == set()

