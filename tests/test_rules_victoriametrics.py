"""The same rule bundle on the second engine: VictoriaMetrics single-node + vmalert (Debian 1.79).

Many platform teams keep GPU metrics in VictoriaMetrics, whose MetricsQL differs from PromQL in
corners (label handling of binary operators, staleness, ``scalar``). The three simulated nodes of
tests/test_rules_e2e.py are scraped by victoria-metrics' own scraper, vmalert evaluates the
generated bundle (rendered with the cluster label) and writes the results back, and every
recorded series must equal the hand-computed value that Prometheus is held to.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from exporter.bundle.rules import RuleOptions, render_rules
from tests.federation_support import force_flush, start
from tests.prom_support import free_port, stop
from tests.test_rules_e2e import Target, expected_cluster_rendering, exporters, public_records, wait_recorded

pytestmark = pytest.mark.e2e  # every test here starts a server

__all__ = ["exporters"]  # the module-scoped fixture, shared with the Prometheus test

VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"


def test_cluster_rendering_on_victoriametrics(exporters: list[Target], tmp_path: Path) -> None:
    assert Path(VICTORIA).exists() and Path(VMALERT).exists(), "apt-get install victoria-metrics"
    rules = render_rules(RuleOptions(cluster_label="cluster", interval="1s"))
    (tmp_path / "rules.yaml").write_text(rules)
    static = [
        {"targets": [t.address for t in exporters if t.cluster == cl], "labels": {"cluster": cl}}
        for cl in ("east", "west")
    ]
    scrape = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "kube-gpu-exporter", "static_configs": static}]}
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump(scrape))
    vm_port, vmalert_port = free_port(), free_port()
    vm = f"http://127.0.0.1:{vm_port}"
    procs = [start([
        VICTORIA, f"-storageDataPath={tmp_path / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
        f"-promscrape.config={tmp_path / 'scrape.yml'}", "-retentionPeriod=1d",
        # serve the newest samples at once: the default hides the last 30 s from queries
        "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN",
    ], tmp_path / "victoria-metrics.log", f"{vm}/health", "victoria-metrics")]
    try:
        procs.append(start([
            VMALERT, f"-rule={tmp_path / 'rules.yaml'}", f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
            f"-httpListenAddr=127.0.0.1:{vmalert_port}", "-evaluationInterval=1s",
            "-remoteWrite.flushInterval=200ms", "-loggerLevel=WARN",
        ], tmp_path / "vmalert.log", f"http://127.0.0.1:{vmalert_port}/health", "vmalert"))
        expected = expected_cluster_rendering()
        assert public_records(rules) == sorted(expected)
        # scrape, then chains of recorded series, each a remote write and a read: every link waits
        # for VictoriaMetrics to make the newest samples searchable, which the flushes hurry
        with force_flush(vm):
            wait_recorded(vm, expected, timeout=120)
    finally:
        for proc in reversed(procs):
            stop(proc)
