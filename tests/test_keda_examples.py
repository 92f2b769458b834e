"""examples/keda (KEDA ScaledObjects) and examples/alertmanager (a team's AlertmanagerConfig).

No API server, KEDA or Prometheus Operator runs here, so their parts are re-done as their code does
them, the way tests/test_hpa_examples.py re-does prometheus-adapter:

- Schemas: every object is validated with jsonschema against the openAPIV3Schema of the released
  CRD copied into tests/data/crds/ (README there: repository, path, commit). Unknown fields are
  errors, as with the API server's strict field validation (kubectl's default); the CRD's CEL rules
  are not evaluated by jsonschema, the one that matters here (min <= max replicas) is checked by hand.
- KEDA's prometheus scaler (pkg/scalers/prometheus_scaler.go, v2.20.2): its metadata keys and their
  types, the credentials a TriggerAuthentication hands it from a Secret, and ExecutePromQuery: GET
  /api/v1/query, no element -> 0 or an error (ignoreNullValues), more than one -> error, active when
  the value is above activationThreshold. The replica count is the HPA's, as in test_hpa_examples.
- The Prometheus Operator's AlertmanagerConfig conversion (pkg/alertmanager/amcfg.go, v0.93.0):
  receivers renamed <namespace>/<name>/<receiver>, the top route first in the tree with
  `continue: true` and a namespace="<namespace>" matcher; routing is then decided by amtool.

Scenario: the nodes of test_hpa_examples (serving/infer with the sidecar `proxy` on node 1) in three
states, each behind a plain Prometheus and one with basic auth, both loading the recording rules:

- busy: as there. serving/infer uses 20 (infer a, granted 30) + 10 (proxy, no grant) + 35 (infer b,
  granted 50) = 65 % of a GPU; used/granted 100 x (20 + 35) / (30 + 50) = 68.75.
- idle: the same pods with the model loaded and no traffic: infer a 0 % SM, proxy 1 %, infer b 2 %
  (health checks): used 3, used/granted 100 x 2 / 80 = 2.5. Memory stays where it was.
- lost: the node's exporter is down (a target nobody listens on): no GPU series at all.

The expected numbers are computed from the scenario files (sum of the workload's processes' SM
utilization, grants from the containers' HAMi gpucores), not read back from Prometheus.
"""

from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import json
import math
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from exporter.bundle.rules import RuleOptions, render_rules
from tests.prom_support import (
    AMTOOL,
    PROMETHEUS,
    ROOT,
    SCENARIOS,
    free_port,
    poll,
    query,
    rule_health,
    run_prometheus,
    start_exporter,
    stop,
)
from tests.test_helm import KUBE_VERSIONS
from tests.test_hpa_examples import TARGET_TYPE, desired_replicas, expand, node1_with_sidecar, rule_for

KEDA = ROOT / "examples" / "keda"
ALERTMANAGER = ROOT / "examples" / "alertmanager"
CRDS = ROOT / "tests" / "data" / "crds"
KEDA_FILES = sorted(KEDA.glob("*.yaml"))
AMC_FILES = sorted(ALERTMANAGER.glob("*.yaml"))
CRD_FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): "monitoring.coreos.com_alertmanagerconfigs.yaml",
}
Doc = dict[str, Any]


class _CrdLoader(yaml.SafeLoader):
    """SafeLoader that reads the YAML 1.1 value scalar `=` (a matchType enum value) as a string."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


@cache
def docs_of(path: Path) -> list[Doc]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_CrdLoader) if d]


def all_docs(files: list[Path]) -> list[tuple[str, Doc]]:
    return [(p.name, d) for p in files for d in docs_of(p)]


def of_kind(files: list[Path], kind: str) -> list[Doc]:
    return [d for _, d in all_docs(files) if d["kind"] == kind]


def find(files: list[Path], kind: str, namespace: str, name: str) -> Doc:
    found = [d for d in of_kind(files, kind)
             if d["metadata"]["namespace"] == namespace and d["metadata"]["name"] == name]  # fmt: skip
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} in the examples"
    return found[0]


# --------------------------------------------------------------------------------------------
# CRD schemas


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the API server would refuse them
    (objects with `properties`, no `additionalProperties`, no x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not"):
            out[key] = strict(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out and not out.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(api_version: str, kind: str) -> Doc:
    crd = docs_of(CRDS / CRD_FILES[(api_version, kind)])[0]
    group, version = api_version.split("/")
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    # no Draft7Validator.check_schema: the patterns are Go RE2, and some (inline flags mid-pattern in
    # muteTimeIntervals) do not compile in Python; jsonschema compiles only those of present fields
    return strict(served["schema"]["openAPIV3Schema"])


def schema_errors(doc: Doc, schema: Doc | None = None) -> list[str]:
    schema = schema or crd_schema(doc["apiVersion"], doc["kind"])
    errors = jsonschema.Draft7Validator(schema).iter_errors(doc)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def metadata_errors(doc: Doc) -> list[str]:
    """The CRD schemas say only `metadata: object`; the API server checks ObjectMeta itself."""
    meta = doc["metadata"]
    errors = [f"metadata.{k}: unknown field" for k in set(meta) - {"name", "namespace", "labels", "annotations"}]
    for key in ("name", "namespace"):
        if not DNS1123.match(meta.get(key, "")) or len(meta[key]) > 63:
            errors.append(f"metadata.{key}: {meta.get(key)!r} is not a DNS-1123 label")
    return errors


def test_crd_copies_are_the_recorded_release_files() -> None:
    table = (CRDS / "README.md").read_text()
    for name in CRD_FILES.values():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        blob = row.rstrip(" |").rsplit("|", 1)[1].strip()
        data = (CRDS / name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, f"{name} was edited"


@pytest.mark.parametrize("name, doc", all_docs(KEDA_FILES + AMC_FILES),
                         ids=lambda v: v if isinstance(v, str) else f"{v['kind']}-{v['metadata']['name']}")  # fmt: skip
def test_examples_pass_their_schema(name: str, doc: Doc) -> None:
    assert doc["metadata"]["namespace"] == "serving", name
    key = (doc["apiVersion"], doc["kind"])
    if key == ("v1", "Secret"):
        for kube_version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name}: {e.message} at {list(e.path)}")
        return
    assert key in CRD_FILES, f"{name}: {key} has no CRD here"
    assert not schema_errors(doc) + metadata_errors(doc), name
    if doc["kind"] == "ScaledObject":  # the CRD's CEL rule
        assert doc["spec"].get("minReplicaCount", 0) <= doc["spec"].get("maxReplicaCount", 100)


def test_schema_check_refuses_what_the_api_server_refuses() -> None:
    so = find(KEDA_FILES, "ScaledObject", "serving", "infer-gpu")
    secured = find(KEDA_FILES, "ScaledObject", "serving", "infer-gpu-share")
    (ta,) = of_kind(KEDA_FILES, "TriggerAuthentication")
    (amc,) = of_kind(AMC_FILES, "AlertmanagerConfig")
    cases: list[tuple[Doc, tuple[str | int, ...], Any, str]] = [
        (so, ("spec", "trigger"), [], "'trigger' was unexpected"),  # typo of triggers
        (so, ("spec", "triggers", 0, "metadata", "ignoreNullValues"), False, "is not of type 'string'"),
        (so, ("spec", "fallback", "behavior"), "currentReplicasIfGreater", "is not one of"),
        (so, ("spec", "advanced", "horizontalPodAutoscalerConfig", "behaviour"), {}, "'behaviour' was unexpected"),
        (so, ("spec", "minReplicaCount"), -1, "less than the minimum"),
        (secured, ("spec", "triggers", 0, "authenticationRef", "kind"), "Secret", "is not one of"),
        (ta, ("spec", "secretTargetRef", 0, "secret"), "x", "'secret' was unexpected"),
        (amc, ("spec", "route", "matchers", 0, "matchType"), "==", "is not one of"),
        (amc, ("spec", "route", "group_by"), ["alertname"], "'group_by' was unexpected"),
        (amc, ("spec", "receivers", 0, "slackConfigs", 0, "apiURL"), "https://hooks.example", "is not of type"),
    ]
    for doc, path, value, message in cases:
        bad = copy.deepcopy(doc)
        target: Any = bad
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        errors = schema_errors(bad)
        assert any(message in e for e in errors), (path, errors)
    assert metadata_errors({"metadata": {"name": "Infer", "namespace": "serving"}})


# --------------------------------------------------------------------------------------------
# the prometheus scaler's configuration (kedacore/keda v2.20.2 pkg/scalers/prometheus_scaler.go,
# pkg/scalers/authentication/authentication_types.go)

SCALER_METADATA = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
    "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner",
    # authentication.Config: order=triggerMetadata;authParams
    "authModes", "authMode", "apiKey", "method", "keyParamName",
}  # fmt: skip
SCALER_REQUIRED = {"serverAddress", "query", "threshold"}
AUTH_PARAMS = {
    "authModes", "authMode", "bearerToken", "token", "username", "password", "cert", "key", "ca",
    "oauthTokenURI", "scopes", "scope", "clientID", "clientSecret", "endpointParams", "customAuthHeader",
    "customAuthValue", "apiKey", "method", "keyParamName", "awsRegion",
}  # fmt: skip
AUTH_MODES = {"apiKey", "basic", "tls", "bearer", "custom", "oauth"}
GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
            "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}  # fmt: skip


def scaled_objects() -> list[Doc]:
    return of_kind(KEDA_FILES, "ScaledObject")


def prometheus_triggers(so: Doc) -> list[Doc]:
    return [t for t in so["spec"]["triggers"] if t["type"] == "prometheus"]


def ignore_null_values(meta: dict[str, str]) -> bool:
    return GO_BOOLS[meta.get("ignoreNullValues", "true")]


def auth_params(so: Doc, trigger: Doc) -> dict[str, str]:
    """What KEDA resolves for the trigger's authenticationRef: parameter -> value from the Secret."""
    ref = trigger.get("authenticationRef")
    if not ref:
        return {}
    assert ref.get("kind", "TriggerAuthentication") == "TriggerAuthentication"
    ns = so["metadata"]["namespace"]
    ta = find(KEDA_FILES, "TriggerAuthentication", ns, ref["name"])
    assert set(ta["spec"]) == {"secretTargetRef"}, "the examples take credentials from Secrets only"
    out = {}
    for target in ta["spec"]["secretTargetRef"]:
        secret = find(KEDA_FILES, "Secret", ns, target["name"])
        data = {**{k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()},
                **secret.get("stringData", {})}  # fmt: skip
        assert target["key"] in data, f"Secret {target['name']} has no key {target['key']}"
        out[target["parameter"]] = data[target["key"]]
    return out


def auth_modes(trigger: Doc, params: dict[str, str]) -> list[str]:
    raw = trigger["metadata"].get("authModes") or params.get("authModes") or ""
    return [m.strip() for m in raw.split(",") if m.strip()]


def test_prometheus_triggers_use_the_scalers_metadata() -> None:
    sos = scaled_objects()
    assert len(sos) == 2
    for so in sos:
        (trigger,) = prometheus_triggers(so)
        meta = trigger["metadata"]
        name = so["metadata"]["name"]
        assert set(meta) <= SCALER_METADATA, f"{name}: {set(meta) - SCALER_METADATA}"
        assert set(meta) >= SCALER_REQUIRED, name
        assert float(meta["threshold"]) > float(meta["activationThreshold"]) > 0, name
        assert meta["ignoreNullValues"] in GO_BOOLS and not ignore_null_values(meta), name
        assert GO_BOOLS[meta.get("unsafeSsl", "false")] is False, name
        assert urllib.parse.urlsplit(meta["serverAddress"]).scheme in ("http", "https"), name
        # the HPA metric KEDA creates: AverageValue (the default) or Value, never Utilization
        assert trigger.get("metricType", "AverageValue") in ("AverageValue", "Value"), name
        if "fallback" in so["spec"]:  # KEDA's webhook refuses a fallback without an AverageValue trigger
            assert trigger.get("metricType", "AverageValue") == "AverageValue", name
        params = auth_params(so, trigger)
        assert set(params) <= AUTH_PARAMS, f"{name}: {set(params) - AUTH_PARAMS}"
        modes = auth_modes(trigger, params)
        assert set(modes) <= AUTH_MODES and len(set(modes) & {"bearer", "basic", "oauth"}) <= 1, name
        if "basic" in modes:
            assert {"username", "password"} <= set(params), name
        if "bearer" in modes:
            assert "bearerToken" in params or "token" in params, name
        assert bool(modes) == bool(params), f"{name}: credentials without authModes are not sent"
    assert any(auth_modes(t, auth_params(so, t)) for so in sos for t in prometheus_triggers(so))


def test_one_prometheus_across_the_keda_files() -> None:
    """Every trigger reads the same Prometheus (host and port; the secured one over TLS, with credentials)."""
    where = {urllib.parse.urlsplit(t["metadata"]["serverAddress"]).netloc for so in scaled_objects()
             for t in prometheus_triggers(so)}
    assert where == {"kube-prometheus-stack-prometheus.monitoring.svc:9090"}, where


# Each ScaledObject's trigger is the query prometheus-adapter runs for this HPA metric.
ADAPTER_METRIC = {"infer-gpu": "k8s_workload_gpu_used", "infer-gpu-share": "k8s_workload_rate_gpu_used_request"}


def test_keda_queries_are_the_adapter_queries_for_their_own_target() -> None:
    for so in scaled_objects():
        (trigger,) = prometheus_triggers(so)
        metric = ADAPTER_METRIC[so["metadata"]["name"]]
        rule = rule_for(metric)
        target = so["spec"]["scaleTargetRef"]
        selector = {"matchLabels": {"workload_kind": target["kind"], "workload_name": target["name"]}}
        series = re.match(r"\w+", rule["seriesQuery"]).group(0)
        want = expand(rule["metricsQuery"], series, so["metadata"]["namespace"], selector)
        assert " ".join(trigger["metadata"]["query"].split()) == " ".join(want.split()), so["metadata"]["name"]
        assert trigger.get("metricType", "AverageValue") == TARGET_TYPE[metric]


# --------------------------------------------------------------------------------------------
# the scenario's truth


@dataclass(frozen=True)
class Usage:
    used: float  # % of one GPU, every container of the workload
    granted_used: float  # of the containers that were granted compute
    granted: float

    @property
    def rate(self) -> float:
        return 100 * self.granted_used / self.granted


def deployment_containers(scenario: Doc, namespace: str, name: str) -> dict[str, tuple[str, str, float | None]]:
    """container ID -> (pod, container, HAMi gpucores grant or None) of a Deployment's pods."""
    out = {}
    for pod in scenario["pods"]:
        meta = pod["metadata"]
        rs = f"{name}-{meta.get('labels', {}).get('pod-template-hash')}"
        owners = [o for o in meta.get("ownerReferences", []) if o["kind"] == "ReplicaSet" and o["name"] == rs]
        if meta["namespace"] != namespace or not owners:
            continue
        limits = {c["name"]: c.get("resources", {}).get("limits", {}) for c in pod["spec"]["containers"]}
        for status in pod["status"]["containerStatuses"]:
            grant = limits[status["name"]].get("nvidia.com/gpucores")
            cid = status["containerID"].split("://", 1)[1]
            out[cid] = (meta["name"], status["name"], float(grant) if grant is not None else None)
    return out


def workload_usage(scenarios: list[Doc], namespace: str, name: str) -> Usage:
    """Share containers: their processes' SM utilization, per GPU capped at 100 (docs/hpa.md)."""
    used: dict[tuple[str, str, int], float] = {}
    grants: dict[tuple[str, str], float | None] = {}
    for scenario in scenarios:
        containers = deployment_containers(scenario, namespace, name)
        grants |= {(pod, c): g for pod, c, g in containers.values()}
        for gpu, device in enumerate(scenario["devices"]):
            for proc in device.get("processes", []):
                for cid, (pod, container, _) in containers.items():
                    if cid in proc["cgroup"]:
                        key = (pod, container, gpu)
                        used[key] = min(100.0, used.get(key, 0.0) + proc["sm_util"])
    per_container: dict[tuple[str, str], float] = {}
    for (pod, container, _), value in used.items():
        per_container[(pod, container)] = per_container.get((pod, container), 0.0) + value
    granted = {k: g for k, g in grants.items() if g}
    return Usage(used=sum(per_container.values()),
                 granted_used=sum(per_container.get(k, 0.0) for k in granted),
                 granted=sum(granted.values()))  # fmt: skip


IDLE_SM = {("infer-7c6b5d4f3-aaaaa", "infer"): 0, ("infer-7c6b5d4f3-aaaaa", "proxy"): 1,
           ("infer-7c6b5d4f3-bbbbb", "infer"): 2}  # fmt: skip


def idle_variant(busy: Path, path: Path) -> Path:
    """serving/infer's pods as in ``busy``, their processes at IDLE_SM, their shared GPU at the sum."""
    scenario = yaml.safe_load(busy.read_text())
    containers = deployment_containers(scenario, "serving", "infer")
    for device in scenario["devices"]:
        hit = False
        for proc in device.get("processes", []):
            for cid, (pod, container, _) in containers.items():
                if cid in proc["cgroup"]:
                    proc["sm_util"] = IDLE_SM[(pod, container)]
                    hit = True
        if hit:
            device["utilization_gpu"] = sum(p["sm_util"] for p in device["processes"])
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    return path


def test_truth_matches_the_numbers_worked_out_by_hand(tmp_path: Path) -> None:
    busy = [yaml.safe_load(node1_with_sidecar(tmp_path / "n1.yaml").read_text()),
            yaml.safe_load((SCENARIOS / "rules_e2e_east_node2.yaml").read_text())]  # fmt: skip
    assert workload_usage(busy, "serving", "infer") == Usage(used=20 + 10 + 35, granted_used=55, granted=80)
    assert workload_usage(busy, "serving", "infer").rate == 68.75
    idle = [yaml.safe_load(idle_variant(tmp_path / "n1.yaml", tmp_path / "idle.yaml").read_text())]
    assert workload_usage(idle, "serving", "infer") == Usage(used=3, granted_used=2, granted=80)
    assert workload_usage(busy, "ml", "infer") == Usage(used=0, granted_used=0, granted=0)


# --------------------------------------------------------------------------------------------
# the worlds: Prometheus servers with the recording rules, plain and with basic auth

# bcrypt (cost 4) of the example Secret's password "change-me", for Prometheus' web config
EXAMPLE_PASSWORD_BCRYPT = "$2b$04$1wzylmamcdcDewMx0dK4pOusgcRddwkOpfXSLCik.K6eRHbyHCqRW"


def basic_auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
        return resp.read()


def run_secured_prometheus(tmp: Path, rules: str, targets: list[str], users: dict[str, str],
                           login: dict[str, str]) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """run_prometheus with `--web.config.file` asking for basic auth (bcrypt hashes by user)."""
    (tmp / "rules.yaml").write_text(rules)
    (tmp / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": users}))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
              "rule_files": [str(tmp / "rules.yaml")],
              "scrape_configs": [{"job_name": "kube-gpu-exporter", "static_configs": [{"targets": targets}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={tmp / 'web.yml'}", "--log.level=warn"],
        stdout=(tmp / "prometheus.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip

    def ready() -> bool:
        assert proc.poll() is None, (tmp / "prometheus.log").read_text()
        try:
            return bool(get(f"{base}/-/ready", login))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    if not poll(ready, deadline_s=30, interval=0.1):
        stop(proc)
        pytest.fail(f"the secured Prometheus refused the login or did not start (is EXAMPLE_PASSWORD_BCRYPT the bcrypt"
                    f" hash of the example Secret's password?); see {tmp / 'prometheus.log'}")
    return proc, base


@dataclass
class World:
    name: str
    plain: str
    secured: str
    usage: Usage | None  # serving/infer; None: no data at all
    login: dict[str, str] = field(default_factory=dict)

    def base_for(self, so: Doc) -> str:
        """A ScaledObject with credentials talks to the secured server, one without to the plain one."""
        return self.secured if any(t.get("authenticationRef") for t in so["spec"]["triggers"]) else self.plain


def holds(base: str, expr: str, headers: dict[str, str], ago_s: float = 2.0) -> bool:
    """``expr`` returns something at ``ago_s`` seconds ago: KEDA's query time is now cut to the second."""
    args = {"query": expr, "time": f"{time.time() - ago_s:.3f}"}
    body = json.loads(get(f"{base}/api/v1/query?{urllib.parse.urlencode(args)}", headers))
    assert body["status"] == "success", body
    return bool(body["data"]["result"])


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, World]]:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    tmp = tmp_path_factory.mktemp("keda-e2e")
    (secret,) = of_kind(KEDA_FILES, "Secret")
    user, password = secret["stringData"]["username"], secret["stringData"]["password"]
    login = basic_auth(user, password)
    node1 = node1_with_sidecar(tmp / "node1-sidecar.yaml")
    nodes = {"busy": [(node1, "e2e-node-1"), (SCENARIOS / "rules_e2e_east_node2.yaml", "e2e-node-2"),
                      (SCENARIOS / "rules_e2e_west_node3.yaml", "e2e-node-3")],
             "idle": [(idle_variant(node1, tmp / "node1-idle.yaml"), "e2e-node-1")],
             "lost": []}  # fmt: skip
    rules = render_rules(RuleOptions(interval="1s"))
    procs: list[subprocess.Popen] = []
    try:
        out: dict[str, World] = {}
        for name, scenario_nodes in nodes.items():
            targets = []
            for scenario, node in scenario_nodes:
                proc, address = start_exporter(scenario, node, tmp)
                procs.append(proc)
                targets.append(address)
            targets = targets or [f"127.0.0.1:{free_port()}"]  # lost: nobody listens there
            (tmp / name / "plain").mkdir(parents=True)
            (tmp / name / "secured").mkdir()
            proc, plain = run_prometheus(tmp / name / "plain", rules, [{"targets": targets}])
            procs.append(proc)
            proc, secured = run_secured_prometheus(tmp / name / "secured", rules, targets,
                                                   {user: EXAMPLE_PASSWORD_BCRYPT}, login)  # fmt: skip
            procs.append(proc)
            usage = workload_usage([yaml.safe_load(p.read_text()) for p, _ in scenario_nodes], "serving", "infer")
            out[name] = World(name, plain, secured, usage if scenario_nodes else None, login)
        for world in out.values():
            # serving/infer's three containers recorded (two with a grant), or the target seen down
            want = (['count(k8s_container_gpu_used{namespace_name="serving"}) == 3',
                     'count(k8s_container_gpu_request{namespace_name="serving"}) == 2']
                    if world.usage else ['up{job="kube-gpu-exporter"} == 0'])  # fmt: skip
            ready = poll(lambda w=world, want=want: all(holds(w.plain, q, {}) and holds(w.secured, q, w.login)
                                                        for q in want), deadline_s=60)  # fmt: skip
            assert ready, f"{world.name}: {want} not reached; logs in {tmp}"
            assert not rule_health(world.plain), world.name
        yield out
    finally:
        for proc in reversed(procs):
            stop(proc)


# --------------------------------------------------------------------------------------------
# what KEDA's prometheus scaler does with a trigger


@dataclass(frozen=True)
class Reading:
    value: float | None  # what the scaler hands the HPA; None: the scaler reports an error
    active: bool
    error: str = ""


def scaler_reading(base: str, so: Doc, trigger: Doc, **override: str) -> Reading:
    """prometheusScaler.ExecutePromQuery + GetMetricsAndActivity, against ``base`` instead of
    serverAddress; ``override`` replaces metadata entries (e.g. ignoreNullValues)."""
    meta = {**trigger["metadata"], **override}
    params = auth_params(so, trigger)
    args = {"query": meta["query"], "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if meta.get("namespace"):
        args["namespace"] = meta["namespace"]
    headers = dict(h.split("=", 1) for h in meta.get("customHeaders", "").split(",") if h)
    modes = auth_modes(trigger, params)
    if "bearer" in modes:
        headers["Authorization"] = "Bearer " + params.get("bearerToken", params.get("token", ""))
    elif "basic" in modes:
        headers |= basic_auth(params["username"], params["password"])
    try:
        body = json.loads(get(f"{base}/api/v1/query?{urllib.parse.urlencode(args)}", headers))
    except urllib.error.HTTPError as e:
        return Reading(None, False, f"prometheus query api returned error. status: {e.code}")
    result = body["data"]["result"]
    ignore = ignore_null_values(meta)
    if not result:
        return Reading(0.0, False) if ignore else Reading(None, False, "target may be lost, the result is empty")
    if len(result) > 1:
        return Reading(None, False, f"prometheus query {meta['query']} returned multiple elements")
    value = float(result[0]["value"][1])
    if math.isnan(value) or math.isinf(value):
        return Reading(0.0, False) if ignore else Reading(None, False, f"prometheus query returns {value}")
    return Reading(value, value > float(meta.get("activationThreshold", "0")))


def keda_replicas(so: Doc, trigger: Doc, reading: Reading, current: int) -> int:
    """The replica count the HPA KEDA manages asks for, within min/max; on an error, the fallback's."""
    spec = so["spec"]
    lo, hi = max(spec.get("minReplicaCount", 0), 1), spec.get("maxReplicaCount", 100)
    if reading.value is None:
        fallback = spec.get("fallback")
        if not fallback:
            return current  # the HPA gets no metric and keeps the count
        n = fallback["replicas"]
        behavior = fallback.get("behavior", "static")
        return {"static": n, "currentReplicas": current, "currentReplicasIfHigher": max(current, n),
                "currentReplicasIfLower": min(current, n)}[behavior]  # fmt: skip
    kind = trigger.get("metricType", "AverageValue")
    target = {"type": kind, {"AverageValue": "averageValue", "Value": "value"}[kind]: trigger["metadata"]["threshold"]}
    return min(hi, max(lo, desired_replicas(target, reading.value, current)))


# What each example's query reads, from the scenario's Usage (the truth above).
EXPECTED = {"infer-gpu": lambda u: u.used, "infer-gpu-share": lambda u: u.rate}


@pytest.mark.e2e
@pytest.mark.parametrize("so", scaled_objects(), ids=lambda so: so["metadata"]["name"])
def test_busy_workload_reads_its_gpu_use_and_is_active(worlds: dict[str, World], so: Doc) -> None:
    world = worlds["busy"]
    (trigger,) = prometheus_triggers(so)
    want = EXPECTED[so["metadata"]["name"]](world.usage)
    got = scaler_reading(world.base_for(so), so, trigger)
    assert got.value is not None and math.isclose(got.value, want, rel_tol=1e-9), (got, want)
    assert got.active, f"{got.value} <= activationThreshold {trigger['metadata']['activationThreshold']}"
    # 65 / 40 per replica -> 2; 68.75 % of the grant against 70 is within the HPA's 10 % -> stays 2
    assert keda_replicas(so, trigger, got, current=2) == 2


@pytest.mark.e2e
@pytest.mark.parametrize("so", scaled_objects(), ids=lambda so: so["metadata"]["name"])
def test_idle_workload_reads_below_the_activation_threshold(worlds: dict[str, World], so: Doc) -> None:
    world = worlds["idle"]
    (trigger,) = prometheus_triggers(so)
    want = EXPECTED[so["metadata"]["name"]](world.usage)
    got = scaler_reading(world.base_for(so), so, trigger)
    assert got.value is not None and math.isclose(got.value, want, rel_tol=1e-9), (got, want)
    assert not got.active, f"idle {got.value} > activationThreshold {trigger['metadata']['activationThreshold']}"
    # the threshold sits between the two states of the same pods
    busy = EXPECTED[so["metadata"]["name"]](worlds["busy"].usage)
    assert want <= float(trigger["metadata"]["activationThreshold"]) < busy
    assert keda_replicas(so, trigger, got, current=2) == so["spec"]["minReplicaCount"] == 1


@pytest.mark.e2e
@pytest.mark.parametrize("so", scaled_objects(), ids=lambda so: so["metadata"]["name"])
def test_lost_exporter_is_an_error_not_an_idle_workload(worlds: dict[str, World], so: Doc) -> None:
    world = worlds["lost"]
    (trigger,) = prometheus_triggers(so)
    got = scaler_reading(world.base_for(so), so, trigger)
    assert got.value is None and "empty" in got.error, got
    # with the scaler's default (ignoreNullValues true) the same reads 0: scale down to minReplicaCount
    default = scaler_reading(world.base_for(so), so, trigger, ignoreNullValues="true")
    assert default == Reading(0.0, False)
    assert keda_replicas(so, trigger, default, current=5) == 1
    # ignoreNullValues "false": infer-gpu falls back to max(current, 2); infer-gpu-share keeps its count
    assert keda_replicas(so, trigger, got, current=5) == 5
    assert keda_replicas(so, trigger, got, current=1) == (2 if "fallback" in so["spec"] else 1)


@pytest.mark.e2e
def test_secured_prometheus_answers_only_with_the_trigger_authentications_credentials(worlds: dict[str, World]) -> None:
    world = worlds["busy"]
    (so,) = [s for s in scaled_objects() if world.base_for(s) == world.secured]
    (trigger,) = prometheus_triggers(so)
    assert scaler_reading(world.secured, so, trigger).value is not None
    without = copy.deepcopy(trigger)
    del without["authenticationRef"], without["metadata"]["authModes"]
    assert scaler_reading(world.secured, so, without).error.endswith("status: 401")
    (plain_so,) = [s for s in scaled_objects() if s is not so and world.base_for(s) == world.plain]
    assert scaler_reading(world.secured, plain_so, prometheus_triggers(plain_so)[0]).error.endswith("status: 401")


@pytest.mark.e2e
def test_scaler_reading_reference(worlds: dict[str, World]) -> None:
    so = scaled_objects()[0]
    (trigger,) = prometheus_triggers(so)
    per_pod = copy.deepcopy(trigger)
    per_pod["metadata"]["query"] = 'k8s_pod_gpu_used{namespace_name="serving"}'
    assert "multiple elements" in scaler_reading(worlds["busy"].plain, so, per_pod).error
    nan = copy.deepcopy(trigger)
    nan["metadata"]["query"] = "vector(0) / 0"
    assert scaler_reading(worlds["busy"].plain, so, nan).error == "prometheus query returns nan"
    assert scaler_reading(worlds["busy"].plain, so, nan, ignoreNullValues="true") == Reading(0.0, False)


# --------------------------------------------------------------------------------------------
# the AlertmanagerConfig


def amc() -> Doc:
    (doc,) = of_kind(AMC_FILES, "AlertmanagerConfig")
    return doc


def test_alertmanagerconfig_child_routes_and_secrets() -> None:
    doc = amc()
    route_schema = crd_schema(doc["apiVersion"], doc["kind"])["properties"]["spec"]["properties"]["route"]

    def walk(route: Doc) -> Iterator[Doc]:
        yield route
        for child in route.get("routes", []):
            # the CRD keeps child routes as raw JSON; the operator decodes them with DisallowUnknownFields
            assert not schema_errors(child, route_schema), child
            yield from walk(child)

    receivers = {r["name"] for r in doc["spec"]["receivers"]}
    for route in walk(doc["spec"]["route"]):
        assert route.get("receiver", next(iter(receivers))) in receivers
    assert doc["spec"]["route"]["receiver"], "the top route needs a receiver"
    for receiver in doc["spec"]["receivers"]:
        for slack in receiver.get("slackConfigs", []):
            secret = find(AMC_FILES, "Secret", doc["metadata"]["namespace"], slack["apiURL"]["name"])
            url = secret["stringData"][slack["apiURL"]["key"]]
            assert url.startswith("https://"), url


def matcher_text(m: Doc) -> str:
    """monitoringv1alpha1.Matcher.String()."""
    value = m.get("value", "").replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'{m["name"]}{m.get("matchType") or ("=~" if m.get("regex") else "=")}"{value}"'


def operator_route(route: Doc, ns: str, name: str, top: bool) -> Doc:
    """ConfigBuilder.convertRoute (+ the namespace enforcer and `continue: true` on the top route)."""
    matchers = [m for m in route.get("matchers", []) if not (top and m["name"] == "namespace")]
    out: Doc = {"matchers": [matcher_text(m) for m in matchers] + ([f'namespace="{ns}"'] if top else [])}
    if route.get("receiver"):
        out["receiver"] = f"{ns}/{name}/{route['receiver']}"
    for src, dst in (("groupBy", "group_by"), ("groupWait", "group_wait"), ("groupInterval", "group_interval"),
                     ("repeatInterval", "repeat_interval")):  # fmt: skip
        if src in route:
            out[dst] = route[src]
    out["continue"] = True if top else route.get("continue", False)
    if route.get("routes"):
        out["routes"] = [operator_route(r, ns, name, False) for r in route["routes"]]
    return out


def operator_config(main: Doc, doc: Doc) -> Doc:
    """The main Alertmanager configuration with the AlertmanagerConfig merged in as the operator does
    (receivers keep only their names: routing does not look at the integrations)."""
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    out = copy.deepcopy(main)
    out["route"]["routes"] = [operator_route(doc["spec"]["route"], ns, name, True), *out["route"].get("routes", [])]
    out["receivers"] += [{"name": f"{ns}/{name}/{r['name']}"} for r in doc["spec"]["receivers"]]
    return out


def routed_to(config_file: Path, labels: dict[str, str]) -> list[str]:
    args = [f'{k}="{v}"' for k, v in sorted(labels.items()) if v]
    res = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={config_file}", *args],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().split(",")


def firing_alerts(base: str) -> list[dict[str, str]]:
    """The label sets the bundle's alerts have on ``base`` now (their `for:` aside), as sent."""
    bundle = yaml.safe_load((ROOT / "alerts" / "kube-gpu-exporter.alerts.yaml").read_text())
    out = []
    for rule in (r for g in bundle["groups"] for r in g["rules"]):
        for labels in query(base, rule["expr"]):
            out.append({**dict(labels), **rule["labels"], "alertname": rule["alert"]})
    return out


@pytest.mark.e2e
def test_team_alertmanagerconfig_routes_the_teams_gpu_alerts(worlds: dict[str, World], tmp_path: Path) -> None:
    assert Path(AMTOOL).exists(), "amtool missing: apt-get install prometheus-alertmanager"
    doc = amc()
    main = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yaml").read_text())
    (tmp_path / "main.yaml").write_text(yaml.safe_dump(main, sort_keys=False))
    config = tmp_path / "alertmanager.yaml"
    config.write_text(yaml.safe_dump(operator_config(main, doc), sort_keys=False))
    check = subprocess.run([AMTOOL, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    team = f"serving/gpu-alerts/{doc['spec']['route']['receiver']}"
    # idle world: serving/infer-...-aaaaa holds 30 % cores unused (KubeGpuAllocatedIdle), its sidecar
    # uses the GPU without a grant (KubeGpuUnaccountedProcesses); lost world: KubeGpuExporterDown
    alerts = {a["alertname"]: a for a in firing_alerts(worlds["idle"].plain) + firing_alerts(worlds["lost"].plain)}
    assert {"KubeGpuAllocatedIdle", "KubeGpuUnaccountedProcesses", "KubeGpuExporterDown"} <= set(alerts)
    for name, labels in alerts.items():
        # the team first for alerts about its pods, then (continue: true) whatever the main config says
        want = ([team] if labels.get("namespace_name") == "serving" else []) + routed_to(tmp_path / "main.yaml", labels)
        assert routed_to(config, labels) == want, (
            f"{name} {labels}: an alert about a pod reaches the team only with the `namespace` label"
            " the operator matches on"
        )
    assert routed_to(config, alerts["KubeGpuAllocatedIdle"]) == [team, "gpu-tickets"]
    assert team not in routed_to(config, alerts["KubeGpuExporterDown"])
    other = {**alerts["KubeGpuAllocatedIdle"], "namespace": "ml", "namespace_name": "ml"}
    assert team not in routed_to(config, other)


def test_readme_lists_the_alerts_that_reach_a_team() -> None:
    bundle = yaml.safe_load((ROOT / "alerts" / "kube-gpu-exporter.alerts.yaml").read_text())
    copied = {r["alert"] for g in bundle["groups"] for r in g["rules"]
              if re.search(r'"namespace",\s*"\$1",\s*"namespace_name"', r["expr"])}  # fmt: skip
    text = (ALERTMANAGER / "README.md").read_text()
    listed = set(re.findall(r"^- `(KubeGpu\w+)`", text, re.M))
    assert listed == copied
    value = next(m["value"] for m in amc()["spec"]["route"]["matchers"] if m["name"] == "alertname")
    assert all(re.fullmatch(value, n) for n in copied)


# --------------------------------------------------------------------------------------------
# docs


def test_docs_point_at_the_examples() -> None:
    text = (ROOT / "docs" / "hpa.md").read_text()
    keda = text[text.index("## KEDA") : text.index("## What the tests check")]
    for path in KEDA_FILES:
        assert f"`{path.name}`" in keda, path.name
    for key in ("activationThreshold", "ignoreNullValues", "authModes", "TriggerAuthentication"):
        assert key in keda, key
    for so in scaled_objects():
        (trigger,) = prometheus_triggers(so)
        for key in ("threshold", "activationThreshold"):
            assert f'{key}: "{trigger["metadata"][key]}"' in keda or f"{key} {trigger['metadata'][key]}" in keda

