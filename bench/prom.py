"""A real Prometheus for the fleet benchmarks: start on a loopback port, query, read its own metrics."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.proc import memory

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, data: bytes | None = None, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as resp:
        return resp.read()


class Prometheus:
    """``prometheus`` with ``config`` (a prometheus.yml mapping) and ``rules`` ({file name: text}) in ``tmp``."""

    def __init__(self, tmp: Path, config: dict[str, Any], rules: dict[str, str]) -> None:
        self.tmp = tmp
        paths = []
        for name, text in rules.items():
            (tmp / name).write_text(text)
            paths.append(str(tmp / name))
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({**config, "rule_files": paths}, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=2h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {(tmp / 'prometheus.log').read_text()}")
            try:
                http(f"{self.url}/-/ready", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("prometheus did not become ready in 60 s") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> Any:
        body = json.loads(http(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=120))
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """Instant vector (or scalar) as [(labels without __name__... kept, value)]."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, expr: str) -> float:
        """The single value of ``expr`` (NaN when empty)."""
        result = self.query(expr)
        return result[0][1] if result else math.nan

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Prometheus' own /metrics: {sample name: [(labels, value)]}."""
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(http(f"{self.url}/metrics").decode()):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def rss(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak) of the server process, in bytes."""
        return memory(self.proc.pid)

    def quiesce(self) -> float:
        """Reload without targets and rules (SIGHUP): nothing scrapes or evaluates any more.

        Returns the time just before the reload: the data up to then stays queryable at that time.
        """
        t0 = time.time()
        config = yaml.safe_load((self.tmp / "prometheus.yml").read_text())
        config = {"global": config.get("global", {})}
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 120
        while self.groups() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)  # the scrape loops and the rule groups wind down
        return t0

    def timed(self, exprs: dict[str, str], at: float, reps: int) -> dict[str, tuple[float, int]]:
        """Best of ``reps`` inner evaluation times (seconds) of each expression at time ``at``, and its series.

        Each repetition sweeps all expressions in turn, so that a burst of other work costs every
        expression one slow repetition rather than some expressions all of theirs.
        """
        best: dict[str, float] = dict.fromkeys(exprs, math.inf)
        series: dict[str, int] = {}
        for _ in range(reps):
            for name, expr in exprs.items():
                data = self.api("query", query=expr, time=f"{at:.3f}", stats="all")
                best[name] = min(best[name], data["stats"]["timings"]["innerEvalTime"])
                series[name] = len(data["result"]) if isinstance(data["result"], list) else 1
        return {name: (best[name], series[name]) for name in exprs}

    def groups(self) -> dict[str, dict[str, Any]]:
        """/api/v1/rules by group name: lastEvaluation, evaluationTime, rules (name, evaluationTime, health)."""
        return {g["name"]: g for g in self.api("rules")["groups"]}


def _records_pattern(rules: Sequence[Mapping[str, Any]]) -> re.Pattern[str]:
    """A reference to any of ``rules``' records as a whole name (longest first: no prefix match)."""
    names = sorted({r["record"] for r in rules}, key=len, reverse=True)
    return re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, names)) + r")(?![\w:])")


def rule_reads(rules: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """For each record, the records of ``rules`` its expression reads."""
    pattern = _records_pattern(rules)
    return {r["record"]: sorted(set(pattern.findall(r["expr"])) - {r["record"]}) for r in rules}


def renamed_rules(rules: Sequence[Mapping[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """Recording rules with every record, and every reference to one in their expressions, prefixed.

    Two bundles that record the same names can then run in one Prometheus without either reading
    the other's output.
    """
    pattern = _records_pattern(rules)
    return [{**r, "record": prefix + r["record"], "expr": pattern.sub(lambda m: prefix + m[1], r["expr"])}
            for r in rules]
