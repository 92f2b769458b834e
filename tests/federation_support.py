"""Processes and queries for tests/test_federation.py and tests/test_remote_write.py.

Prometheus servers (full or agent mode) with a config the test writes, VictoriaMetrics with vmalert,
and a helper that keeps VictoriaMetrics' newest samples searchable at once. Every process listens
on a free loopback port and is waited for by polling its health endpoint.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.prom_support import PROMETHEUS, Labels, free_port, http_get, query, stop, wait_for

VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"
VMAGENT = shutil.which("vmagent") or "/usr/bin/vmagent"
# the labels a scrape of /federate (or of an exporter) attaches; not part of what the rules computed
SCRAPE_LABELS = frozenset({"instance", "job"})


def start(argv: Sequence[str], log: Path, health: str, what: str) -> subprocess.Popen:
    """Start ``argv`` logging into ``log``; wait until ``health`` answers (stopped again if it does not)."""
    proc = subprocess.Popen(list(argv), stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(health, proc, what)
    except BaseException:
        stop(proc)
        raise
    return proc


def prometheus_config(
    scrape_configs: Sequence[Mapping[str, Any]],
    rule_files: Sequence[str] = (),
    external_labels: Mapping[str, str] | None = None,
    remote_write: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A Prometheus config scraping (and evaluating) every second."""
    glob: dict[str, Any] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
    if rule_files:
        glob["evaluation_interval"] = "1s"
    if external_labels:
        glob["external_labels"] = dict(external_labels)
    config: dict[str, Any] = {"global": glob, "scrape_configs": list(scrape_configs)}
    if rule_files:
        config["rule_files"] = list(rule_files)
    if remote_write:
        config["remote_write"] = list(remote_write)
    return config


def start_prometheus(tmp: Path, config: Mapping[str, Any], *, agent: bool = False) -> tuple[subprocess.Popen, str]:
    """A Prometheus server (or agent, ``--enable-feature=agent``) with ``config``; (process, base URL)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    storage = [f"--storage.agent.path={tmp / 'agent'}", "--enable-feature=agent"] if agent else [
        f"--storage.tsdb.path={tmp / 'data'}"]  # fmt: skip
    argv = [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", *storage,
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    return start(argv, tmp / "prometheus.log", f"{base}/-/ready", f"prometheus in {tmp.name}"), base


def write_rules(tmp: Path, name: str, text: str) -> str:
    """Write a rule file into ``tmp``; its path."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text(text)
    return str(path)


def strip(series: Mapping[Labels, float], drop: frozenset[str] = SCRAPE_LABELS) -> dict[Labels, float]:
    """``series`` without the labels in ``drop`` (the scrape's job and instance)."""
    return {frozenset(kv for kv in labels if kv[0] not in drop): v for labels, v in series.items()}


def vmalert_errors(vmalert: str) -> list[tuple[str, str]]:
    """(rule, last error) of every vmalert rule whose last evaluation failed."""
    groups = json.loads(http_get(f"{vmalert}/api/v1/rules"))["data"]["groups"]
    assert any(g["rules"] for g in groups), groups  # the bundle is loaded
    return [(r["name"], r["lastError"]) for g in groups for r in g["rules"] if r.get("lastError")]


def metric_names(base: str) -> set[str]:
    """Every metric name the server at ``base`` holds now."""
    return {dict(labels)["__name__"] for labels in _raw_labels(base, 'count by (__name__) ({__name__=~".+"})')}


def _raw_labels(base: str, expr: str) -> list[Labels]:
    body = json.loads(http_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
    assert body["status"] == "success", body
    return [frozenset(r["metric"].items()) for r in body["data"]["result"]]


def values(base: str, records: Sequence[str]) -> dict[str, dict[Labels, float]]:
    """{record: its series at ``base`` now, without job/instance} for each of ``records``."""
    return {r: strip(query(base, r)) for r in records}


# ------------------------------------------------------------------ VictoriaMetrics


@contextlib.contextmanager
def force_flush(vm: str, every_s: float = 0.3) -> Iterator[None]:
    """Make VictoriaMetrics' newest samples searchable every ``every_s`` (``/internal/force_flush``).

    VictoriaMetrics 1.79 makes freshly written samples searchable only after up to ~10 s; each link
    of a chain of recorded series (scrape -> helper -> public series) waits that long. Flushing
    brings the whole bundle from ~30 s down to a few seconds; the values are the same.
    """
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                http_get(f"{vm}/internal/force_flush")

    thread = threading.Thread(target=loop, name="vm-force-flush", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


@contextlib.contextmanager
def victoria_with_vmalert(tmp: Path, rules: str, *scrape: str) -> Iterator[tuple[str, str]]:
    """VictoriaMetrics (``scrape``: extra flags, e.g. its own scraper) and vmalert evaluating ``rules``
    against it and writing the results back; yields their base URLs (VictoriaMetrics, vmalert)."""
    rule_file = write_rules(tmp, "rules.yaml", rules)
    vm_port, vmalert_port = free_port(), free_port()
    vm = f"http://127.0.0.1:{vm_port}"
    procs = [start([
        VICTORIA, f"-storageDataPath={tmp / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
        "-retentionPeriod=1d", "-search.latencyOffset=0s", "-search.disableCache", "-loggerLevel=WARN", *scrape,
    ], tmp / "victoria-metrics.log", f"{vm}/health", "victoria-metrics")]  # fmt: skip
    try:
        procs.append(start([
            VMALERT, f"-rule={rule_file}", f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
            f"-httpListenAddr=127.0.0.1:{vmalert_port}", "-evaluationInterval=1s",
            "-remoteWrite.flushInterval=200ms", "-loggerLevel=WARN",
        ], tmp / "vmalert.log", f"http://127.0.0.1:{vmalert_port}/health", "vmalert"))  # fmt: skip
        with force_flush(vm):
            yield vm, f"http://127.0.0.1:{vmalert_port}"

    finally:
        for proc in reversed(procs):
            stop(proc)
