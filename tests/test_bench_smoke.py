"""bench/run.py runs end to end on a tiny node and writes its JSON (nothing is timed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_EXPORTER = {"cycle_seconds", "cpu_seconds_per_cycle", "scrape_seconds", "body_bytes", "series", "rss_bytes",
                "peak_rss_bytes"}


def test_bench_emits_the_json_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--gpus", "2", "--processes", "3",
                           "--scrapes", "3", "--cycles", "2", "--idle-s", "0.5", "--interval", "0.5",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert {"machine", "config", "exporters"} <= report.keys()
    assert set(report["exporters"]) == {"kube-gpu-exporter", "nvitop-exporter"}
    for name, result in report["exporters"].items():
        assert result.keys() >= PER_EXPORTER, name
        assert {"p50", "p99", "n"} <= result["scrape_seconds"].keys()
        assert result["scrape_seconds"]["n"] == 3 and result["body_bytes"] > 0
    assert "nvml_read_seconds" in report["exporters"]["kube-gpu-exporter"]
    assert "| scrape p99 (ms) |" in proc.stdout  # the table
