"""Real processes for the end-to-end tests: simulated-node exporters, Prometheus, Alertmanager.

Shared by tests/test_rules_e2e.py, tests/test_alerts.py and tests/test_dashboards.py. Every
process listens on a free loopback port, logs into the test's temporary directory and is waited
for by polling its HTTP endpoint (never a fixed sleep). Also what those tests read queries with,
and the checks the alert and dashboard generators' CLIs share.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_rules import _documented_inputs, _metric_names, _rules

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "scenarios"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = (
    shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "/usr/bin/prometheus-alertmanager"
)
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
Labels = frozenset[tuple[str, str]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def wait_for(url: str, proc: subprocess.Popen, what: str, deadline_s: float = 30.0) -> None:
    """Poll ``url`` until it answers; fail early with the log when ``proc`` exits."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"{what} exited with {proc.returncode}:\n{out}")
        try:
            http_get(url)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    pytest.fail(f"{what} did not answer {url} within {deadline_s} s")


def poll(predicate: Callable[[], Any], deadline_s: float, interval: float = 0.5) -> Any:
    """Call ``predicate`` until it returns something truthy and return that; None at the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = predicate()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(interval)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _launch(argv: list[str], log: Path, url: str, what: str, cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` logging into ``log`` and wait until ``url`` answers; stopped again if it does not."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(url, proc, what)
    except BaseException:
        stop(proc)
        raise
    return proc


def start_exporter(scenario: Path, node: str, log_dir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """``python -m exporter --simulate scenario`` on a free port; returns (process, host:port)."""
    port = free_port()
    proc = _launch(
        [sys.executable, "-m", "exporter", "--simulate", str(scenario),
         "--listen", f"127.0.0.1:{port}", "--node-name", node, *extra],
        log_dir / f"{node}.log", f"http://127.0.0.1:{port}/metrics", f"exporter for {scenario.name}", cwd=ROOT,
    )  # fmt: skip
    try:
        body = http_get(f"http://127.0.0.1:{port}/metrics").decode()
        assert f'nvidia_gpu_num_devices{{node_name="{node}"}}' in body
    except BaseException:
        stop(proc)
        raise
    return proc, f"127.0.0.1:{port}"


def run_prometheus(
    tmp: Path,
    rules: str | Sequence[str],
    static_configs: list[dict],
    alertmanagers: Sequence[str] = (),
) -> tuple[subprocess.Popen, str]:
    """A Prometheus server scraping ``static_configs`` every second with ``rules`` loaded.

    ``rules`` is the text of one rule file or several; ``alertmanagers`` are host:port addresses
    it sends alerts to. Returns (process, base URL).
    """
    texts = [rules] if isinstance(rules, str) else list(rules)
    rule_files = []
    for i, text in enumerate(texts):
        path = tmp / ("rules.yaml" if i == 0 else f"rules-{i}.yaml")
        path.write_text(text)
        rule_files.append(str(path))
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": rule_files,
        "scrape_configs": [{"job_name": "kube-gpu-exporter", "static_configs": static_configs}],
    }
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _launch(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        tmp / "prometheus.log", f"{base}/-/ready", "prometheus",
    )  # fmt: skip
    return proc, base


def run_alertmanager(tmp: Path, config_text: str) -> tuple[subprocess.Popen, str]:
    """An Alertmanager (gossip cluster disabled) with ``config_text``; returns (process, base URL)."""
    (tmp / "alertmanager.yml").write_text(config_text)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _launch(
        [ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
        tmp / "alertmanager.log", f"{base}/-/ready", "alertmanager",
    )  # fmt: skip
    return proc, base


def query(base: str, expr: str) -> dict[Labels, float]:
    """Instant query; {label set without __name__: value}. Fails on a query error."""
    body = json.loads(http_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
    assert body["status"] == "success", body
    return {
        frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"): float(r["value"][1])
        for r in body["data"]["result"]
    }


def rule_health(base: str) -> list[tuple[str, str | None]]:
    """(rule name, last error) for every rule of every group that is not healthy."""
    groups = json.loads(http_get(f"{base}/api/v1/rules"))["data"]["groups"]
    return [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]


# ------------------------------------------------------------------ what a query reads


def recorded_series() -> set[str]:
    """Every series the committed recording-rule bundle records."""
    return {r["record"] for r in _rules((ROOT / "rules" / "kube-gpu-exporter.rules.yaml").read_text())}


def exporter_families() -> set[str]:
    """Every metric family docs/metrics.md documents (``nvidia_gpu_*`` and ``kube_gpu_exporter_*``)."""
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    return _documented_inputs() | set(re.findall(r"`(kube_gpu_exporter_[a-z_]+)`", text))


def series_read(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (test_rules' _metric_names minus functions, range
    selectors, offsets and Grafana variables)."""
    expr = re.sub(r"\[[^\]]*\]|\boffset\s+\w+", "", re.sub(r'"[^"]*"', '""', expr))
    return {n for n in _metric_names(expr) if not re.search(rf"(?<![\w:$]){re.escape(n)}\s*\(", expr)}


# ------------------------------------------------------------------ the generators' CLIs


def assert_cli_error(
    main: Callable[[list[str]], int], command: str, argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    """``main(argv)`` of a generator exits 2 with ``kube-gpu-exporter <command>: error: ...`` naming ``message``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kube-gpu-exporter {command}: error:") and message in err, err


def undocumented_flags(parser: argparse.ArgumentParser, doc: str) -> list[str]:
    """The parser's long options, but --help and --output, that ``doc`` does not quote (no `` `--flag`` in it)."""
    flags = {s for act in parser._actions for s in act.option_strings if s.startswith("--")}
    return [flag for flag in sorted(flags - {"--help", "--output"}) if f"`{flag}" not in doc]
