"""--dcgm-compat under kube-prometheus-stack: the DCGM series keep the workload's namespace/pod/container.

The chart is rendered with real Helm (helm-python-sdk, as tests/test_helm.py); its ServiceMonitor is
turned into the scrape job prometheus-operator generates from it (tests/servicemonitor_support.py, a
translation of the operator's promcfg.go checked against the operator's own golden output), with the
target labels the operator adds (namespace, pod, container, service, endpoint, job, instance). A real
Prometheus scrapes the simulated node tests/scenarios/dcgm_node.yaml (a whole GPU, a shared one, a MIG
card with a held and a free instance, an unheld H100) through that job. docs/deploy.md#dcgm-workload-labels.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import subprocess
import urllib.parse
from functools import cache
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests import servicemonitor_support as smx
from tests.prom_support import PROMETHEUS, SCENARIOS, _launch, free_port, http_get, poll, start_exporter, stop
from tests.test_helm import CHART, WITH_CRDS, by_kind, one

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DATA = Path(__file__).resolve().parent / "data" / "prometheus-operator"
GOLDEN_BLOB = "7187bf76296ff329647c0453eff6faf0001e763e"  # SOURCE.md there
NAMESPACE = "gpu-monitoring"
DCGM_ON = {**WITH_CRDS, "config": {"dcgmCompat": True}, "serviceMonitor": {"interval": "1s", "scrapeTimeout": "1s"}}
WORKLOAD = ("namespace", "pod", "container")
# dcgm_node.yaml's holders: (gpu, GPU_I_ID or "") -> (namespace, pod, container); every other DCGM series
# (the shared A10, the free MIG instance, the MIG card's own series, the idle H100) is nobody's.
HELD = {("0", ""): ("ml", "train-0", "trainer"), ("2", "2"): ("research", "mig-train", "trainer")}
UNHELD = {("1", ""), ("2", "3"), ("3", "")}  # shared, free MIG instance, idle card
MIG_CARD = ("2", "")  # the card's own power/temperature series: no pod either


@cache
def _render(values_json: str, release: str) -> tuple[dict, ...]:
    out = helm_python.Chart.load(CHART).render(json.loads(values_json), name=release, namespace=NAMESPACE)
    return tuple(
        d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d
    )


def render(values: dict[str, Any], release: str) -> list[dict]:
    """Every object the chart renders for ``values`` as release ``release`` (copies: callers edit them)."""
    return copy.deepcopy(list(_render(json.dumps(values, sort_keys=True), release)))


def endpoint(values: dict[str, Any]) -> dict[str, Any]:
    (ep,) = one(render(values, "gpu"), "ServiceMonitor")["spec"]["endpoints"]
    return ep


# --- what the chart renders (no process) ---------------------------------------------------------------


def test_dcgm_compat_adds_the_metric_relabelings_only_with_honor_labels_false() -> None:
    ep = endpoint(DCGM_ON)
    assert ep["honorLabels"] is False
    rules = ep["metricRelabelings"]
    assert len(rules) == 6 and all(r["regex"].startswith("DCGM_FI_.+") for r in rules)
    assert {r["targetLabel"] for r in rules} == {*WORKLOAD, *(f"exported_{x}" for x in WORKLOAD)}
    assert "metricRelabelings" not in endpoint({**WITH_CRDS})
    assert "metricRelabelings" not in endpoint({**WITH_CRDS, "config": {"dcgmCompat": False}})
    # honorLabels true keeps the exposed labels already: the rules would delete them (no exported_* to copy)
    honor = {**DCGM_ON, "serviceMonitor": {**DCGM_ON["serviceMonitor"], "honorLabels": True}}
    assert "metricRelabelings" not in endpoint(honor)


def test_the_users_metric_relabelings_follow_the_charts() -> None:
    mine = [{"action": "labeldrop", "regex": "DCGM_FI_DRIVER_VERSION"}]
    ep = endpoint({**DCGM_ON, "serviceMonitor": {**DCGM_ON["serviceMonitor"], "metricRelabelings": mine}})
    assert ep["metricRelabelings"][-1:] == mine and len(ep["metricRelabelings"]) == 7
    assert endpoint({**WITH_CRDS, "serviceMonitor": {"metricRelabelings": mine}})["metricRelabelings"] == mine


def test_the_translation_reproduces_the_operators_golden_output() -> None:
    """prometheus-operator's TestGenerateRelabelConfig: its ServiceMonitor, as the CRD spells it."""
    monitor = {
        "metadata": {"name": "test", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"foo": "bar"}},
            "endpoints": [
                {
                    "port": "https-metrics",
                    "interval": "30s",
                    "metricRelabelings": [
                        {"action": "Drop", "regex": "container_fs*", "sourceLabels": ["__name__"]},
                        {"action": "Replace", "replacement": "", "targetLabel": "job"},
                    ],
                    "relabelings": [
                        {"action": "Uppercase", "sourceLabels": ["instance"], "targetLabel": "instance"},
                        {
                            "action": "Replace",
                            "regex": "(.+)(?::d+)",
                            "replacement": "$1:9537",
                            "sourceLabels": ["__address__"],
                            "targetLabel": "__address__",
                        },
                        {"action": "Replace", "replacement": "crio", "targetLabel": "job"},
                        {"action": "Replace", "replacement": "", "targetLabel": "job"},
                    ],
                }
            ],
        },
    }
    golden = yaml.safe_load((DATA / "GenerateRelabelConfig.golden").read_text())
    (expected,) = golden["scrape_configs"]
    expected.pop("kubernetes_sd_configs")
    assert smx.scrape_job(monitor, shard="$(SHARD)") == expected


def test_the_golden_file_is_the_published_one() -> None:
    data = (DATA / "GenerateRelabelConfig.golden").read_bytes()
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == GOLDEN_BLOB
    assert GOLDEN_BLOB in (DATA / "SOURCE.md").read_text()


def test_the_translation_refuses_endpoint_settings_it_does_not_know() -> None:
    monitor = {
        "metadata": {"name": "m", "namespace": "n"},
        "spec": {"selector": {"matchLabels": {}}, "endpoints": [{"port": "metrics", "honorTimestamps": False}]},
    }
    with pytest.raises(AssertionError, match="honorTimestamps"):
        smx.scrape_job(monitor)


# --- a real Prometheus ------------------------------------------------------------------------------------


def _job(objs: list[dict], address: str, pod: str, drop_metric_relabelings: bool = False) -> tuple[dict, str]:
    """The operator's scrape job for the chart's ServiceMonitor, its target being ``address``; and the
    Service name (the ``service`` label, which tells the jobs apart)."""
    monitor = one(objs, "ServiceMonitor")
    if drop_metric_relabelings:
        monitor["spec"]["endpoints"][0].pop("metricRelabelings")
    service = one(objs, "Service")
    (ds,) = by_kind(objs, "DaemonSet")
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    job = smx.scrape_job(monitor)
    job["static_configs"] = [smx.endpoints_target(address, service, pod, ctr["name"], "metrics")]
    return job, service["metadata"]["name"]


def _series(base: str, selector: str) -> list[dict[str, str]]:
    q = urllib.parse.urlencode({"match[]": selector})
    return json.loads(http_get(f"{base}/api/v1/series?{q}"))["data"]


def _exposed_dcgm(address: str) -> list[dict[str, str]]:
    """The DCGM samples as the exporter serves them: name and labels, empty values dropped."""
    out = []
    for line in http_get(f"http://{address}/metrics").decode().splitlines():
        m = re.match(r"(DCGM_FI_\w+)\{(.*)\} ", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append({"__name__": m.group(1), **{k: v for k, v in labels.items() if v}})
    return out


@pytest.mark.e2e
def test_dcgm_series_carry_the_workloads_labels_in_a_real_prometheus(tmp_path: Path) -> None:
    exporter, address = start_exporter(SCENARIOS / "dcgm_node.yaml", "dcgm-node", tmp_path, "--dcgm-compat")
    prom = None
    try:
        # Three releases of the chart, one job each, all scraping the one exporter: the default
        # (honorLabels false + the chart's metric relabelings), honorLabels true, and the endpoint as
        # the chart rendered it before (no metric relabelings: the exported_* control).
        fixed = render(DCGM_ON, "gpu")
        honor = render({**DCGM_ON, "serviceMonitor": {**DCGM_ON["serviceMonitor"], "honorLabels": True}}, "gpuh")
        jobs = {}
        for name, objs, drop in (("fixed", fixed, False), ("honor", honor, False), ("control", fixed, True)):
            pod = f"{one(objs, 'DaemonSet')['metadata']['name']}-x7k2p"
            job, service = _job(objs, address, pod, drop)
            if name == "control":
                job["job_name"] += "-control"
                job["static_configs"][0]["labels"]["__meta_kubernetes_service_name"] = service = f"{service}-control"
            jobs[name] = (job, service, pod)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [j for j, _, _ in jobs.values()],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")], check=True, capture_output=True)
        prom = _launch(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            tmp_path / "prometheus.log",
            f"{base}/-/ready",
            "prometheus",
        )
        exposed = _exposed_dcgm(address)
        for name in ("fixed", "honor"):
            _check_job(base, address, *jobs[name], exposed)
        _check_control(base, *jobs["control"][1:])
    finally:
        if prom is not None:
            stop(prom)
        stop(exporter)


def _items(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _key(s: dict[str, str]) -> tuple[str, str]:
    return s["gpu"], s.get("GPU_I_ID", "")


def _check_job(base: str, address: str, job: dict, service: str, pod: str, exposed: list[dict[str, str]]) -> None:
    own = {
        "namespace": NAMESPACE,
        "pod": pod,
        "container": "exporter",
        "service": service,
        "endpoint": "metrics",
        "job": "kube-gpu-exporter",
        "instance": address,
    }
    dcgm = poll(
        lambda: len(got := _series(base, f'{{__name__=~"DCGM_FI_.+",service="{service}"}}')) >= len(exposed) and got, 30
    )
    assert dcgm, f"{job['job_name']}: no DCGM series within 30 s"
    everything = _series(base, f'{{__name__=~".+",service="{service}"}}')
    assert not {k for s in everything for k in s if k.startswith("exported_")}, job["job_name"]
    # one series per exposed sample, nothing merged, each with the exporter's own workload labels
    assert len(dcgm) == len(exposed)
    target = {"service": service, "endpoint": "metrics", "job": "kube-gpu-exporter", "instance": address}
    assert sorted(_items(s) for s in dcgm) == sorted(_items({**e, **target}) for e in exposed)
    for s in dcgm:
        assert s.get("pod") != pod, s
        holder = HELD.get(_key(s))
        if holder:
            assert tuple(s.get(k) for k in WORKLOAD) == holder, s
        else:
            assert _key(s) in UNHELD | {MIG_CARD} and not set(WORKLOAD) & set(s), s
    seen = {_key(s) for s in dcgm}
    assert set(HELD) | UNHELD | {MIG_CARD} <= seen
    # the exporter's own series and the native ones keep the target labels
    for selector in (
        f'up{{service="{service}"}}',
        f'{{__name__=~"kube_gpu_exporter_.+",service="{service}"}}',
        f'nvidia_gpu_num_devices{{service="{service}"}}',
    ):
        found = _series(base, selector)
        assert found, selector
        for s in found:
            assert {k: s.get(k) for k in own} == own, s


def _check_control(base: str, service: str, pod: str) -> None:
    """Without the metric relabelings the bug is there: the workload's labels are exported_*."""
    (s,) = poll(lambda: _series(base, f'DCGM_FI_DEV_FB_USED{{gpu="0",service="{service}"}}'), 30)
    assert (s["exported_pod"], s["pod"]) == ("train-0", pod)
    (idle,) = _series(base, f'DCGM_FI_DEV_FB_USED{{gpu="3",service="{service}"}}')
    assert idle["pod"] == pod  # an unheld GPU would name the exporter's pod
