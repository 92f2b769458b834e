#!/usr/bin/env python3
"""Benchmark kube-gpu-exporter (real NVML backend) and nvitop-exporter on the fake NVML.

Both exporters read the same generated node (``tests.integration_support.generate_node``)
through the fake ``libnvidia-ml.so.1``; ours also reads a fake /proc, the Kubernetes API double
and a pod-resources server. Measured per exporter: sampling-cycle duration, CPU seconds per
cycle, scrape latency p50/p99, scrape body size and series, and resident memory. Prints a table
and writes JSON. See bench/README.md for what each number means. Not a test: nothing is asserted.

    python bench/run.py [--gpus 8] [--processes 128] [--scrapes 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: tests.* are the harness

from bench.proc import cpu_seconds, memory  # noqa: E402
from tests.fake_nvml import build_fake_nvml, subprocess_env, write_config  # noqa: E402
from tests.integration_support import (  # noqa: E402
    ExporterProcess,
    exporter_node,
    generate_node,
    nvitop_exporter,
    scenario_pids,
    select,
    value,
)

OURS, PEER = "kube-gpu-exporter", "nvitop-exporter"

# Times our whole sampling cycle (Pipeline.step: NVML, /proc, pods, attribution, snapshot) in a
# process built from the exporter's own flags; the self-metric covers only the NVML reads.
OURS_CYCLE = textwrap.dedent("""
    import json, sys, time
    from exporter.shell.cli import build_daemon
    from exporter.shell.config import load_config
    daemon = build_daemon(load_config(sys.argv[2:]))
    deadline = time.monotonic() + 60
    while not daemon.pipeline.sources.pods().synced and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon.pipeline.step()  # NVML init and the identity reads happen once
    out = []
    for _ in range(int(sys.argv[1])):
        start = time.perf_counter()
        daemon.pipeline.step()
        out.append(time.perf_counter() - start)
    daemon.close()
    print(json.dumps(out))
""")

# Times nvitop's own collect-loop body (update_host + update_device per GPU), unchanged, in a
# process that loads the fake: nvitop-exporter exports no self-metric for its cycle.
NVITOP_CYCLE = textwrap.dedent("""
    import json, sys, time
    from prometheus_client import CollectorRegistry
    from nvitop import Device
    from nvitop_exporter.exporter import PrometheusExporter
    devices = Device.from_indices(range(Device.count()))
    exporter = PrometheusExporter(devices, hostname="bench", registry=CollectorRegistry())
    out = []
    for _ in range(int(sys.argv[1])):
        start = time.perf_counter()
        exporter.update_host()
        for device in devices:
            exporter.update_device(device)
        out.append(time.perf_counter() - start)
    print(json.dumps(out))
""")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats
    return ordered[int(rank) - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "mean": statistics.fmean(values),
            "max": max(values), "n": len(values)}




def scrape_series(exporter: ExporterProcess, n: int) -> tuple[list[float], list[int], str]:
    """``n`` sequential GETs: their latencies (request to last byte), body sizes and the last body."""
    latencies, sizes, body = [], [], b""
    for _ in range(n):
        start = time.perf_counter()
        with urllib.request.urlopen(exporter.url, timeout=30) as resp:
            body = resp.read()
        latencies.append(time.perf_counter() - start)
        sizes.append(len(body))
    return latencies, sizes, body.decode()


def measure(exporter: ExporterProcess, *, scrapes: int, idle_s: float, cycles: Callable[[], float]) -> dict[str, Any]:
    """The numbers every exporter gets; ``cycles()`` counts its sampling cycles so far."""
    # CPU per cycle over a window without scrapes: what sampling alone costs
    c0, n0, t0 = cpu_seconds(exporter.pid), cycles(), time.monotonic()
    time.sleep(idle_s)
    c1, n1, t1 = cpu_seconds(exporter.pid), cycles(), time.monotonic()
    latencies, sizes, body = scrape_series(exporter, scrapes)
    return {
        "cpu_seconds_per_cycle": (c1 - c0) / max(n1 - n0, 1e-9),
        "cycles_in_idle_window": n1 - n0,
        "idle_window_seconds": t1 - t0,
        "scrape_seconds": summary(latencies),
        "body_bytes": int(statistics.median(sizes)),
        "series": sum(1 for line in body.splitlines() if line and not line.startswith("#")),
        **memory(exporter.pid),
    }


def bench_ours(scenario: dict[str, Any], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    pods = {p["metadata"]["name"] for p in scenario["pods"]}
    with exporter_node(scenario, work / "ours", interval=args.interval) as node:
        exp = node.exporter
        exp.wait_ready(60)

        def attributed(s: dict) -> bool:
            # warm: the pod cache synced and every pod's container has its memory row
            rows = select(s, "nvidia_gpu_memory_used_bytes")
            return value(s, "kube_gpu_exporter_pod_cache_synced") == 1 and pods <= {
                dict(k[1]).get("pod_name") for k in rows}

        exp.wait_for(attributed, 60, "the exporter warm")
        durations: dict[float, float] = {}

        def sample_self_metric() -> float:
            s = exp.samples()
            total = value(s, "kube_gpu_exporter_samples_total") or 0.0
            durations[total] = value(s, "kube_gpu_exporter_sample_duration_seconds") or 0.0
            return total

        result = measure(exp, scrapes=args.scrapes, idle_s=args.idle_s, cycles=sample_self_metric)
        # the self-metric holds the last cycle's NVML read time: collect one value per cycle
        deadline = time.monotonic() + args.interval * (args.cycles + 2) + 30
        while len(durations) < args.cycles and time.monotonic() < deadline:
            sample_self_metric()
            time.sleep(args.interval / 4)
        result["nvml_read_seconds"] = summary(list(durations.values()))
        # the harness needs the API double and the pod-resources server, not the exporter's CPU share
        exp.stop()
        out = subprocess.run([sys.executable, "-c", OURS_CYCLE, str(args.cycles), *exp.argv[3:]], env=exp.env,
                             cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
        result["cycle_seconds"] = summary(json.loads(out.stdout))
        result["cycle_measured_as"] = "Pipeline.step (NVML, /proc, pods, attribution, snapshot), timed in a harness"
        return result


def bench_peer(scenario: dict[str, Any], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    pids = {str(p) for p in scenario_pids(scenario)}
    with nvitop_exporter(scenario, work / "peer", interval=args.interval) as exp:
        exp.wait_ready(60)
        exp.wait_for(lambda s: {dict(k[1])["pid"] for k in select(s, "process_gpu_memory_MiB")} == pids, 60,
                     "nvitop-exporter warm")
        started = time.monotonic()
        # its loop keeps one cycle per interval while a cycle is shorter than that (checked below)
        result = measure(exp, scrapes=args.scrapes, idle_s=args.idle_s,
                         cycles=lambda: (time.monotonic() - started) / args.interval)
    # the harness process loads the same fake, after the server is gone (no CPU contention)
    lib = build_fake_nvml(work / "peer" / "nvml")
    config = write_config({**scenario, "nvml": {"timestamps": "wallclock"}}, work / "peer" / "harness.cfg")
    out = subprocess.run([sys.executable, "-c", NVITOP_CYCLE, str(args.cycles)], env=subprocess_env(lib.parent, config),
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    result["cycle_seconds"] = summary(json.loads(out.stdout))
    result["cycle_measured_as"] = "nvitop's collect-loop body (update_host + update_device per GPU), timed in a harness"
    if result["cycle_seconds"]["p50"] > args.interval:
        result["note"] = "cycle longer than the interval: cpu_seconds_per_cycle is an upper bound"
    return result


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu_model": model, "platform": platform.platform(),
            "python": platform.python_version()}


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        ("sample cycle p50 (ms)", lambda r: r["cycle_seconds"]["p50"] * 1e3),
        ("sample cycle p99 (ms)", lambda r: r["cycle_seconds"]["p99"] * 1e3),
        ("NVML reads p50 (ms, self-metric)", lambda r: r["nvml_read_seconds"]["p50"] * 1e3 if "nvml_read_seconds" in r
         else None),
        ("CPU per cycle (ms)", lambda r: r["cpu_seconds_per_cycle"] * 1e3),
        ("scrape p50 (ms)", lambda r: r["scrape_seconds"]["p50"] * 1e3),
        ("scrape p99 (ms)", lambda r: r["scrape_seconds"]["p99"] * 1e3),
        ("body (KiB)", lambda r: r["body_bytes"] / 1024),
        ("series", lambda r: r["series"]),
        ("RSS (MiB)", lambda r: r["rss_bytes"] / 2**20),
        ("peak RSS (MiB)", lambda r: r["peak_rss_bytes"] / 2**20),
    ]
    names = list(results)
    lines = [f"| metric | {' | '.join(names)} |", f"| --- |{' ---: |' * len(names)}"]
    for label, get in rows:
        cells = (get(results[n]) for n in names)
        lines.append(f"| {label} | {' | '.join('n/a' if c is None else f'{c:.1f}' for c in cells)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=128, help="GPU processes over all GPUs")
    parser.add_argument("--scrapes", type=int, default=200, help="sequential scrapes for the latency percentiles")
    parser.add_argument("--cycles", type=int, default=20, help="sampling cycles timed per exporter")
    parser.add_argument("--interval", type=float, default=1.0, help="sampling interval of both exporters (s)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="window without scrapes for CPU per cycle (s)")
    parser.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "kube-gpu-exporter-bench.json",
                        help="where to write the report (bench/baseline.json is the run in docs/testing.md)")
    parser.add_argument("--no-peer", action="store_true", help="only kube-gpu-exporter")
    args = parser.parse_args(argv)

    scenario = generate_node(gpus=args.gpus, processes=args.processes)
    report: dict[str, Any] = {
        "machine": machine(),
        "config": {"gpus": args.gpus, "processes": args.processes, "pods": len(scenario["pods"]),
                   "scrapes": args.scrapes, "cycles": args.cycles, "interval_s": args.interval,
                   "idle_window_s": args.idle_s},
        "exporters": {},
    }
    with tempfile.TemporaryDirectory(prefix="kge-bench-") as tmp:
        work = Path(tmp)
        report["exporters"][OURS] = bench_ours(scenario, work, args)
        if not args.no_peer:
            report["exporters"][PEER] = bench_peer(scenario, work, args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    c = report["config"]
    print(f"{c['gpus']} GPUs, {c['processes']} processes, {c['pods']} pods; {report['machine']['cpus']} CPUs "
          f"({report['machine']['cpu_model']}); interval {c['interval_s']} s, {c['scrapes']} scrapes")
    print(table(report["exporters"]))
    print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
