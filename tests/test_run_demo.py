"""scripts/run-demo.sh end to end: its Prometheus records the scenarios' truth, loads the alerts,
and a SIGINT or SIGTERM leaves no process of it behind.

The script runs in its own session on free ports; every wait polls (tests/prom_support.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.prom_support import ALERTMANAGER, PROMETHEUS, free_port, http_get, poll, query

pytestmark = pytest.mark.e2e  # every test here starts a server, starts test_demo_

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "run-demo.sh"
SCENARIOS = ["examples/seed-cgpu-t4.yaml", "examples/mixed-4gpu-node.yaml", "examples/mig-a100-node.yaml"]
BASH = shutil.which("bash") or "/bin/bash"

needs_prometheus = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus is not installed")


def truth(scenarios: list[str]) -> tuple[set[str], int, int]:
    """(node names, GPUs, GPU memory bytes) of the scenarios: a MIG-partitioned GPU counts as its instances."""
    nodes, gpus, memory = set(), 0, 0
    for name in scenarios:
        doc = yaml.safe_load((ROOT / name).read_text())
        nodes.add(doc["node"])
        for dev in doc["devices"]:
            migs = dev.get("mig_devices") or []
            gpus += len(migs) or 1
            memory += sum(m["memory_total_bytes"] for m in migs) if migs else dev["memory_total_bytes"]
    return nodes, gpus, memory


def session_processes(sid: int) -> list[str]:
    """Command lines of the live (not zombie) processes of session ``sid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(f"{stat.parent.name}: {cmdline.strip()}")
    return found


def exporter_command(tmp: Path) -> str:
    """The exporter of this tree, run by the suite's Python, rather than a reinstall into .venv."""
    script = tmp / "kube-gpu-exporter"
    script.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m exporter "$@"\n')
    script.chmod(0o755)
    return str(script)


def _api(base: str, path: str) -> dict:
    try:
        return json.loads(http_get(base + path))["data"]
    except OSError:
        return {}


@needs_prometheus
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_records_the_truth_and_stops_everything(tmp_path: Path, sig: signal.Signals) -> None:
    ports = [free_port() for _ in range(5)]
    env = dict(os.environ)
    env.update(
        DEMO_SCENARIOS=" ".join(SCENARIOS),
        DEMO_EXPORTER_PORTS=" ".join(map(str, ports[:3])),
        DEMO_PROMETHEUS_PORT=str(ports[3]),
        DEMO_ALERTMANAGER_PORT=str(ports[4]),
        DEMO_INTERVAL="2s",
        DEMO_DIR=str(tmp_path / "demo"),
    )
    env["DEMO_EXPORTER"] = exporter_command(tmp_path)
    log = tmp_path / "run-demo.out"
    # Through a trampoline that sets SIGINT back to its default: a suite started in the background of
    # a non-interactive shell (`cmd &`) inherits SIGINT ignored, and bash cannot trap a signal ignored
    # at its entry; as from a terminal, the demo must start with Ctrl-C live.
    reset = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); os.execv(sys.argv[1], sys.argv[1:])")
    proc = subprocess.Popen(
        [sys.executable, "-c", reset, BASH, str(SCRIPT)], cwd=ROOT, env=env, stdout=log.open("w"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    prom = f"http://127.0.0.1:{ports[3]}"
    nodes, gpus, memory = truth(SCENARIOS)
    try:
        banner = poll(lambda: proc.poll() is not None or "Ctrl-C stops everything" in log.read_text(), 40, 0.2)
        assert proc.poll() is None and banner, log.read_text()
        out = log.read_text()
        for port in ports[:3]:
            assert f"http://127.0.0.1:{port}/metrics" in out
        # the graph in the UI this Prometheus serves (Debian's: the classic one only)
        assert re.search(re.escape(prom) + r"(/classic)?/graph\?g0\.expr=k8s_cluster_gpu_used", out), out

        def recorded() -> bool:
            try:
                capacity = query(prom, "kube_node_status_capacity_gpu")
                total = query(prom, "k8s_cluster_gpu_total")
                mem = query(prom, "k8s_cluster_gpu_memory_total_bytes")
            except OSError:
                return False
            return (
                {dict(k)["node_name"] for k in capacity} == nodes
                and list(total.values()) == [100.0 * gpus]
                and list(mem.values()) == [float(memory)]
            )

        assert poll(recorded, 30), (
            query(prom, "kube_node_status_capacity_gpu"),
            query(prom, "k8s_cluster_gpu_total"),
            log.read_text(),
        )

        alert_file = yaml.safe_load((ROOT / "alerts" / "kube-gpu-exporter.alerts.yaml").read_text())
        expected = {r["alert"] for g in alert_file["groups"] for r in g["rules"] if "alert" in r}

        def alerts_loaded() -> bool:
            groups = _api(prom, "/api/v1/rules").get("groups", [])
            rules = [r for g in groups for r in g["rules"]]
            return {r["name"] for r in rules if r["type"] == "alerting"} == expected and all(
                r["health"] == "ok" for r in rules
            )

        assert poll(alerts_loaded, 15), _api(prom, "/api/v1/rules")
        if Path(ALERTMANAGER).exists():
            am = f"127.0.0.1:{ports[4]}"

            def wired() -> bool:
                active = _api(prom, "/api/v1/alertmanagers").get("activeAlertmanagers", [])
                return any(am in a["url"] for a in active)

            assert poll(wired, 15), _api(prom, "/api/v1/alertmanagers")
            http_get(f"http://{am}/-/ready")

        children = session_processes(proc.pid)
        assert any("prometheus" in c for c in children) and sum("--simulate" in c for c in children) == 3, children

        proc.send_signal(sig)
        # It stops in well under a second; the bound only tells a hang from a machine under load
        # (a CI run beside a 12 GiB Prometheus once took more than 20 s).
        assert proc.wait(timeout=60) == 128 + sig, log.read_text()
        left = poll(lambda: not session_processes(proc.pid), 15, 0.2)
        assert left, session_processes(proc.pid)
    finally:
        if proc.poll() is None or session_processes(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_demo_without_prometheus_says_how_to_install_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    result = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)], cwd=ROOT, env={"PATH": str(bin_dir)}, capture_output=True, text=True,
        timeout=20,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "prometheus is not installed" in lines[0], result.stderr
    assert "scripts/test.sh" in lines[0] and "apt-get install prometheus" in lines[0]


def examples_answer(prom: str) -> None:
    """Each HPA's metric (the query prometheus-adapter runs for it) and each KEDA trigger's query, as written,
    answer on the demo: one element, the value worked out in examples/trouble-node.yaml (serving/infer)."""
    from tests.test_hpa_examples import adapter_query, external_metrics, hpas
    from tests.test_keda_examples import prometheus_triggers, scaled_objects

    want = {"k8s_workload_gpu_used": 21 + 30, "k8s_workload_rate_gpu_used_request": 100 * (21 + 30) / (30 + 40)}
    def adapter_queries() -> list[tuple[str, str]] | None:
        """The adapter's queries once its series discovery finds the recorded series (the rules' first round)."""
        try:
            return [(m["metric"]["name"], adapter_query(prom, m["metric"]["name"], hpa["metadata"]["namespace"],
                                                        m["metric"]["selector"]))
                    for _, hpa in hpas() for m in external_metrics(hpa)]
        except (AssertionError, OSError):  # discovered_series asserts one series: none recorded yet
            return None

    queries = poll(adapter_queries, 60)
    assert queries, "prometheus-adapter's series discovery found no recorded series within 60 s"
    keda_metric = {"infer-gpu": "k8s_workload_gpu_used", "infer-gpu-share": "k8s_workload_rate_gpu_used_request"}
    queries += [(keda_metric[so["metadata"]["name"]], t["metadata"]["query"]) for so in scaled_objects()
                for t in prometheus_triggers(so)]
    assert len(queries) == 4

    def answered() -> bool:
        try:
            return all(len(got := query(prom, q)) == 1 and math.isclose(next(iter(got.values())), want[metric])
                       for metric, q in queries)
        except OSError:
            return False

    assert poll(answered, 60), [(q, query(prom, q)) for _, q in queries]


TROUBLE_ALERTS = {"KubeGpuLost", "KubeGpuXidCritical", "KubeGpuXidApplication", "KubeGpuRowRemapFailure",
                  "KubeGpuRowRemapPending", "KubeGpuContainerOverMemoryGrant", "KubeGpuUnaccountedProcesses",
                  "KubeGpuTemperatureHigh", "KubeGpuAllocatedIdle", "KubeGpuHardwareSlowdown",
                  "KubeGpuRetiredPagesLimit", "KubeGpuThermalThrottling", "KubeGpuPowerThrottling",
                  "KubeGpuEccUncorrectedErrors", "KubeGpuPageRetirementPending"}  # every alert the trouble node has


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's `cmd &` starts it


@needs_prometheus
def test_demo_in_the_background_fires_the_trouble_alerts_prints_urls_that_answer_and_stops_on_sigint(
        tmp_path: Path) -> None:
    """The defaults (the trouble node among the nodes), started with SIGINT ignored, flags for every exporter."""
    ports = [free_port() for _ in range(6)]
    env = {**os.environ, "DEMO_EXPORTER_PORTS": " ".join(map(str, ports[:4])), "DEMO_PROMETHEUS_PORT": str(ports[4]),
           "DEMO_ALERTMANAGER_PORT": str(ports[5]), "DEMO_INTERVAL": "1s", "DEMO_DIR": str(tmp_path / "demo"),
           "DEMO_EXPORTER": exporter_command(tmp_path), "DEMO_EXPORTER_FLAGS": "--dcgm-compat"}
    env.pop("_RUN_DEMO_SIGINT", None)
    log = tmp_path / "run-demo.out"
    proc = subprocess.Popen([BASH, str(SCRIPT)], cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_ignore_sigint)
    prom = f"http://127.0.0.1:{ports[4]}"
    try:
        banner = poll(lambda: proc.poll() is not None or "Ctrl-C stops everything" in log.read_text(), 60, 0.2)
        assert proc.poll() is None and banner, log.read_text()
        out = log.read_text()
        assert "examples/trouble-node.yaml" in out and sum("--simulate" in c for c in session_processes(proc.pid)) == 4
        urls = {u.rstrip("),") for u in re.findall(r"http://127\.0\.0\.1:\d+\S*", out)}
        assert len(urls) >= 10, out
        for url in sorted(urls):  # the classic UI or the API, whichever this Prometheus serves
            http_get(url)  # raises on 404
        if Path(ALERTMANAGER).exists():
            assert f"127.0.0.1:{ports[5]}/api/v2/alerts" in out
        assert b"DCGM_FI_DEV_GPU_UTIL" in http_get(f"http://127.0.0.1:{ports[3]}/metrics")  # DEMO_EXPORTER_FLAGS

        def alerting() -> set[str]:
            try:
                return {dict(k)["alertname"] for k in query(prom, "ALERTS")}
            except OSError:
                return set()

        assert poll(lambda: alerting() >= TROUBLE_ALERTS, 60), sorted(alerting())
        examples_answer(prom)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
        assert poll(lambda: not session_processes(proc.pid), 15, 0.2), session_processes(proc.pid)
    finally:
        if proc.poll() is None or session_processes(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@needs_prometheus
def test_demo_refuses_a_port_in_use_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = [free_port() for _ in range(5)]
        env = {**os.environ, "DEMO_EXPORTER_PORTS": f"{ports[0]} {port} {ports[1]} {ports[2]}",
               "DEMO_PROMETHEUS_PORT": str(ports[3]), "DEMO_ALERTMANAGER_PORT": str(ports[4]),
               "DEMO_EXPORTER": exporter_command(tmp_path), "DEMO_DIR": str(tmp_path / "demo")}
        result = subprocess.run([BASH, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.splitlines() == [
            f"run-demo: port {port} (exporter examples/mixed-4gpu-node.yaml) is already in use; "
            "set DEMO_EXPORTER_PORTS"]
        env["DEMO_EXPORTER_PORTS"], env["DEMO_PROMETHEUS_PORT"] = " ".join(map(str, ports[:4])), str(port)
        result = subprocess.run([BASH, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            f"run-demo: port {port} (Prometheus) is already in use; set DEMO_PROMETHEUS_PORT"]
    assert not (tmp_path / "demo").exists()  # refused before it started anything
