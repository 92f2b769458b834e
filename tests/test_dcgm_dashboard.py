"""End to end: NVIDIA's dcgm-exporter dashboard and DCGM alert expressions against ``--dcgm-compat``.

A simulated node (tests/scenarios/dcgm_node.yaml: an exclusive GPU, a GPU shared by two pods, a MIG
card, an H100 with GPM and NVLinks; an Xid from a kmsg file) runs with ``--dcgm-compat``; a real
Prometheus scrapes it. Every query of NVIDIA's own Grafana dashboard for dcgm-exporter, with its
template variables substituted as Grafana does for "All", and every DCGM alert expression of
tests/data/dcgm (SOURCE.md there) must return a non-empty vector, except the few that read DCGM fields
NVML has no equivalent for (listed below, and asserted empty so the list stays true).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prom_support import (
    PROMETHEUS,
    SCENARIOS,
    http_get,
    poll,
    query,
    rule_health,
    run_prometheus,
    series_read,
    start_exporter,
    stop,
)

DATA = Path(__file__).resolve().parent / "data" / "dcgm"
NODE = "dcgm-node"
DASHBOARD = DATA / "dcgm-exporter-dashboard.json"
ALERT_FILES = ("canonical-hardware-observer-dcgm.yaml", "aws-hyperpod-observability-alerts.yaml")
# Alerts on DCGM fields without an NVML source: the thermal throttling duration (only the power one,
# nvmlDeviceGetViolationStatus(POWER), is read). They must stay empty; the rest of each file is checked.
NO_NVML_SOURCE = {"GPUThermalViolation": "DCGM_FI_DEV_THERMAL_VIOLATION"}
# Alerts of those files on other exporters' series (kubelet, node_exporter, FSx): not ours to answer.
NOT_DCGM = {"MIGConfigFailure", "NodeDiskSpaceWarning", "FsxLustreStorageWarning"}
# The test's kernel log: Xid 48 (double-bit ECC) on the H100 (00000000:1A:00.0).
KMSG = "3,10,1000000,-;NVRM: Xid (PCI:0000:1a:00): 48, pid=0, name=python, An uncorrectable double bit error\n"
# Git blobs of the stored inputs (SOURCE.md): a changed file must be re-fetched, not edited.
BLOBS = {
    "dcgm-exporter-dashboard.json": "c16810412c8f80d23eaea572fd1cfccb82f5977c",
    "default-counters.csv": "2eed7a651db300797554cb91591908f410902f21",
    "canonical-hardware-observer-dcgm.yaml": "97e43cd243c33feadf6c95a6a681f9071bb6a8d9",
    "aws-hyperpod-observability-alerts.yaml": "979241ed02b957e38e8d2735e48e5e3885516079",
}


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in panels:
        out.append(p)
        out.extend(_panels(p.get("panels", [])))
    return out


def grafana_substitute(expr: str) -> str:
    """Template variables as Grafana expands them for "All" (regex .*) and its interval macros."""
    expr = re.sub(r"\$__(rate_)?interval\b|\$\{__(rate_)?interval\}", "1m", expr)
    expr = re.sub(r"\$__range\b", "1h", expr)
    return re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target, variables substituted."""
    doc = json.loads(DASHBOARD.read_text())
    return [(p.get("title", ""), grafana_substitute(t["expr"])) for p in _panels(doc["panels"])
            for t in p.get("targets", []) if t.get("expr")]


def template_variables() -> list[tuple[str, str, str]]:
    """(variable, metric, label) of the dashboard's label_values(metric, label) variables."""
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for v in doc["templating"]["list"]:
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q or "")
        if m:
            out.append((v["name"], m.group(1), m.group(2)))
    return out


def alert_rules() -> list[tuple[str, str, str]]:
    """(file, alert, expression) of every alerting rule in the stored alert files."""
    return [(name, r["alert"], r["expr"]) for name in ALERT_FILES
            for g in yaml.safe_load((DATA / name).read_text())["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.e2e
def test_stored_inputs_are_the_published_files() -> None:
    for name, blob in BLOBS.items():
        got = subprocess.run(["git", "hash-object", str(DATA / name)], capture_output=True, text=True, check=True)
        assert got.stdout.strip() == blob, f"{name} changed: re-fetch it and update SOURCE.md"
    assert len(dashboard_queries()) == 8 and {v for v, _, _ in template_variables()} == {"instance", "gpu"}
    names = {a for _, a, _ in alert_rules()}
    assert set(NO_NVML_SOURCE) | NOT_DCGM <= names and len(names) == 16


@pytest.mark.e2e
def test_nvidia_dashboard_and_dcgm_alerts_return_data(tmp_path: Path) -> None:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        exporter, address = start_exporter(
            SCENARIOS / "dcgm_node.yaml", NODE, logs, "--dcgm-compat",
            "--kmsg-path", str(kmsg), "--kmsg-replay", "--no-events", "--interval", "0.2",
        )  # fmt: skip
        procs.append(exporter)
        # The alert files load as they are: Prometheus accepts them against our series too.
        prom, base = run_prometheus(tmp_path, [(DATA / f).read_text() for f in ALERT_FILES],
                                    [{"targets": [address]}])
        procs.append(prom)
        # Ready when every GPU's temperature and the Xid are in (the Xid watcher starts after the first cycle).
        ready = poll(lambda: len(query(base, "DCGM_FI_DEV_GPU_TEMP")) == 4
                     and query(base, "DCGM_FI_DEV_XID_ERRORS > 0"), deadline_s=60)
        assert ready, "the DCGM_FI_* series did not arrive"
        _check_dashboard(base)
        _check_alerts(base)
        assert not rule_health(base), rule_health(base)
    finally:
        for proc in reversed(procs):
            stop(proc)


def _check_dashboard(base: str) -> None:
    for var, metric, label in template_variables():
        url = f"{base}/api/v1/label/{label}/values?{urllib.parse.urlencode({'match[]': metric})}"
        assert json.loads(http_get(url))["data"], f"dashboard variable ${var} has no values"
    empty = [(title, expr) for title, expr in dashboard_queries() if not poll(lambda e=expr: query(base, e), 10)]
    assert not empty, f"dashboard panels without data: {empty}"


def _check_alerts(base: str) -> None:
    checked, empty = [], []
    for name, alert, expr in alert_rules():
        reads = series_read(expr)
        if alert in NOT_DCGM:
            assert not any(r.startswith("DCGM_") for r in reads), alert
            continue
        if alert in NO_NVML_SOURCE:
            assert NO_NVML_SOURCE[alert] in reads and not query(base, expr), alert
            continue
        checked.append(alert)
        if not poll(lambda e=expr: query(base, e), 10):
            empty.append((name, alert, expr))
    assert not empty, f"alert expressions without data: {empty}"
    assert len(checked) == 12, checked  # 6 throttle alerts, 6 of the HyperPod set (power violation included)
    # Spot values: the Xid is the kmsg file's, the shared GPU's throttle series has no pod labels.
    (xid,) = query(base, "DCGM_FI_DEV_XID_ERRORS > 0").items()
    assert xid[1] == 48 and ("UUID", "GPU-dc600000-0000-4000-8000-000000000003") in xid[0]
    (throttle,) = query(base, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS % 256 >= 128")
    assert ("gpu", "1") in throttle and not any(k == "pod" for k, _ in throttle)


@pytest.mark.parametrize("expr", ["DCGM_FI_DEV_GPU_TEMP{instance=~\"$instance\", gpu=~\"$gpu\"}",
                                  "rate(x[$__rate_interval])"])
def test_grafana_substitution(expr: str) -> None:
    out = grafana_substitute(expr)
    assert "$" not in out and (".*" in out or "[1m]" in out)


MIG_H100 = Path(__file__).resolve().parent.parent / "examples" / "mig-h100-node.yaml"
# The Hopper MIG node's GPU instances (GPU_I_ID) -> (profile, pod holding it, its tensor pipe ratio).
MIG_H100_INSTANCES = {"2": ("3g.40gb", "train-large-0", 0.57), "3": ("2g.20gb", "infer-small-7f6d5c4b3-m2q8r", 0.18),
                      "9": ("1g.10gb", "", 0.0)}


@pytest.mark.e2e
def test_nvidia_dashboard_on_a_hopper_mig_node(tmp_path: Path) -> None:
    """examples/mig-h100-node.yaml: every panel has data; the tensor core panel shows each GPU instance
    (GPM per instance, nvmlGpmMigSampleGet) with its holder's pod and GPU_I_* labels, the card's power
    and temperature once per card, and the whole H100 beside them."""
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        exporter, address = start_exporter(MIG_H100, "gpu-node-mig-h100", logs, "--dcgm-compat", "--no-xid",
                                           "--interval", "0.2")
        procs.append(exporter)
        prom, base = run_prometheus(tmp_path, "groups: []\n", [{"targets": [address]}])
        procs.append(prom)
        # GPM needs two samples: ready when the four handles with GPM have their tensor series
        assert poll(lambda: len(query(base, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) == 4, deadline_s=60)
        _check_dashboard(base)
        tensor = query(base, 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{GPU_I_ID!=""}')
        got = {dict(k)["GPU_I_ID"]: (dict(k)["GPU_I_PROFILE"], dict(k).get("pod", ""), v) for k, v in tensor.items()}
        assert got == MIG_H100_INSTANCES
        assert {dict(k)["UUID"] for k in tensor} == {"GPU-b2000000-0000-4000-8000-000000000000"}  # the card's
        assert len(query(base, "DCGM_FI_DEV_POWER_USAGE")) == 2  # once per card, not per instance
        assert not query(base, 'DCGM_FI_DEV_GPU_UTIL{GPU_I_ID!=""}')  # NVML has no MIG device utilization
    finally:
        for proc in reversed(procs):
            stop(proc)
