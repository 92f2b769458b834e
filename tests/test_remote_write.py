"""The bundle evaluated centrally: scrapers remote-write into VictoriaMetrics, vmalert evaluates it there.

The fleet setup of docs/scaling.md ("Federation and remote write"): no rule runs where the
exporters are scraped. The three simulated nodes of tests/test_rules_e2e.py (clusters "east" and
"west") are scraped by

* two Prometheus 2.42 servers in agent mode (``--enable-feature=agent``), one per cluster, each
  naming its cluster in ``external_labels`` (which remote write attaches to every sample; no target
  label), remote-writing to VictoriaMetrics' ``/api/v1/write``;
* or one ``vmagent`` with the cluster as a target label, as tests/test_rules_e2e.py scrapes them.

vmalert evaluates the bundle (rendered with ``--cluster-label=cluster``) against VictoriaMetrics and
writes the recorded series back through remote write. Every public series (the busy and power
ones aside, tests/test_usage_rules_e2e.py) must equal the hand-computed value a single Prometheus
is held to (tests/test_rules_e2e.py, ``expected_cluster_rendering``), label sets included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter.bundle.rules import RuleOptions, render_rules
from tests.federation_support import (
    VICTORIA,
    VMAGENT,
    VMALERT,
    prometheus_config,
    start,
    start_prometheus,
    victoria_with_vmalert,
    vmalert_errors,
)
from tests.prom_support import PROMETHEUS, free_port, stop
from tests.test_rules_e2e import Target, expected_cluster_rendering, exporters, public_records, wait_recorded

pytestmark = pytest.mark.e2e  # every test here starts a server

__all__ = ["exporters"]  # the module-scoped fixture of tests/test_rules_e2e.py

CLUSTERS = ("east", "west")
RULES = render_rules(RuleOptions(cluster_label="cluster", interval="1s"))
TIMEOUT_S = 40  # ~8 s when idle: remote write, vmalert at 1 s, VictoriaMetrics flushed every 0.3 s


def _check(vm: str, vmalert: str) -> None:
    expected = expected_cluster_rendering()
    assert public_records(RULES) == sorted(expected), "every public series has expectations"
    wait_recorded(vm, expected, timeout=TIMEOUT_S)
    assert not vmalert_errors(vmalert)


def test_prometheus_agents_remote_write_to_victoriametrics(exporters: list[Target], tmp_path: Path) -> None:
    assert Path(PROMETHEUS).exists() and Path(VICTORIA).exists() and Path(VMALERT).exists()
    with victoria_with_vmalert(tmp_path / "central", RULES) as (vm, vmalert):
        write = {
            "url": f"{vm}/api/v1/write",
            "queue_config": {"batch_send_deadline": "200ms", "min_backoff": "50ms", "max_backoff": "1s"},
        }
        agents = []
        try:
            for cluster in CLUSTERS:
                job = {
                    "job_name": "kube-gpu-exporter",
                    "static_configs": [{"targets": [t.address for t in exporters if t.cluster == cluster]}],
                }
                config = prometheus_config([job], external_labels={"cluster": cluster}, remote_write=[write])
                agents.append(start_prometheus(tmp_path / f"agent-{cluster}", config, agent=True)[0])
            _check(vm, vmalert)
        finally:
            for proc in agents:
                stop(proc)


def test_vmagent_remote_writes_the_same(exporters: list[Target], tmp_path: Path) -> None:
    assert Path(VMAGENT).exists() and Path(VICTORIA).exists() and Path(VMALERT).exists()
    static = [{"targets": [t.address for t in exporters if t.cluster == cl], "labels": {"cluster": cl}}
              for cl in CLUSTERS]  # fmt: skip
    scrape = tmp_path / "scrape.yml"
    scrape.write_text(yaml.safe_dump(prometheus_config([{"job_name": "kube-gpu-exporter", "static_configs": static}])))
    with victoria_with_vmalert(tmp_path / "central", RULES) as (vm, vmalert):
        port = free_port()
        agent = start([
            VMAGENT, f"-promscrape.config={scrape}", f"-remoteWrite.url={vm}/api/v1/write",
            f"-remoteWrite.tmpDataPath={tmp_path / 'vmagent-data'}", "-remoteWrite.flushInterval=200ms",
            f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN",
        ], tmp_path / "vmagent.log", f"http://127.0.0.1:{port}/health", "vmagent")  # fmt: skip
        try:
            _check(vm, vmalert)
        finally:
            stop(agent)
