#!/usr/bin/env python3
"""Footprint of kube-gpu-exporter (real mode) and nvitop-exporter, side by side in one run.

Both read one generated node (default 16 GPUs, 64 pods) through the fake ``libnvidia-ml.so.1``;
ours also reads a fake /proc, the Kubernetes API double and a pod-resources server, as in
production. Measured: import RSS per dependency, the modules the daemon loaded, time from process
start to the first served snapshot, RSS after start and over ``--cycles`` back-to-back cycles
(flatness), the sampling cycle's cost, and scrape latency with ``--scrapers`` concurrent clients
against ours, a bare asyncio server handing out the same bytes, and nvitop. See bench/README.md.

    python bench/footprint.py [--smoke] [--cycles 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc import cpu_seconds, memory  # noqa: E402
from bench.run import NVITOP_CYCLE, OURS_CYCLE, machine, summary  # noqa: E402
from tests.integration_support import (  # noqa: E402
    ExporterProcess,
    exporter_node,
    free_port,
    generate_node,
    nvitop_exporter,
)

OURS, PEER, BARE = "kube-gpu-exporter", "nvitop-exporter", "bare asyncio"
LOAD = ROOT / "bench" / "footprint_load.py"
PROBE = ROOT / "tests" / "module_probe.py"
MIB = 2**20
# Cumulative, in the order a daemon would load them; each also alone. Missing ones are skipped.
IMPORTS = ("prometheus_client", "pynvml", "yaml", "aiohttp", "grpc", "kubernetes", "grpclib", "jinja2",
           "bcrypt", "exporter.shell.cli")
HEAVY = ("kubernetes", "grpc", "grpclib", "aiohttp", "yaml", "jinja2", "bcrypt", "textual", "urllib3", "google",
         "pydantic", "requests", "h2", "psutil", "nvitop")
RSS_PROBE = ("import sys\nfor m in sys.argv[1:]:\n    __import__(m)\n"
             "print(open('/proc/self/status').read())")


def import_rss() -> dict[str, Any]:
    """VmRSS (MiB) of a bare interpreter, then after each import on top of the ones before, and alone."""
    def rss(mods: Sequence[str]) -> float | None:
        out = subprocess.run([sys.executable, "-c", RSS_PROBE, *mods], cwd=ROOT, capture_output=True, text=True)
        if out.returncode:
            return None
        return int(re.search(r"VmRSS:\s+(\d+)", out.stdout).group(1)) / 1024

    bare = rss([])
    present = [m for m in IMPORTS if rss([m]) is not None]
    cumulative = {m: rss(present[: i + 1]) for i, m in enumerate(present)}
    alone = {m: round(rss([m]) - bare, 1) for m in present}
    return {"bare_mib": bare, "cumulative_mib": cumulative, "alone_added_mib": alone}


def scrape(url: str, gzip: bool = False) -> bytes:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def try_scrape(url: str) -> bytes | None:
    try:
        return scrape(url)
    except OSError:
        return None


def first_snapshot(argv: list[str], env: dict, port: int, log: Path, marker: bytes,
                   warm: bytes | None) -> tuple[ExporterProcess, dict[str, float]]:
    """Start a process; seconds to its first page holding ``marker`` (and ``warm``), polled every 5 ms."""
    start = time.monotonic()
    exp = ExporterProcess(argv, env, port, log).start()
    times: dict[str, float] = {}
    while time.monotonic() - start < 120:
        body = try_scrape(exp.url)
        if body and marker in body:
            times.setdefault("first_snapshot_s", time.monotonic() - start)
            if warm is None or warm in body:
                times["warm_s"] = time.monotonic() - start
                return exp, times
        if not exp.alive():
            raise RuntimeError(f"{argv[:3]} exited:\n{exp.output()[-3000:]}")
        time.sleep(0.005)
    raise RuntimeError(f"{argv[:3]}: no snapshot after 120 s:\n{exp.output()[-3000:]}")


def with_port(argv: list[str], port: int, interval: float | None = None) -> list[str]:
    out = list(argv)
    for flag, value in (("--listen", f"127.0.0.1:{port}"), ("--port", str(port)), ("--interval", interval)):
        if flag in out and value is not None:
            out[out.index(flag) + 1] = str(value)
    return out


def load(url_port: int, scrapers: int, requests: int, gzip: bool = True, path: str = "/metrics") -> dict:
    out = subprocess.run([sys.executable, str(LOAD), "client", "127.0.0.1", str(url_port), path, str(scrapers),
                          str(requests), "1" if gzip else "0"], capture_output=True, text=True, timeout=900,
                         check=True)
    result = json.loads(out.stdout)
    return {**summary(result.pop("latencies")), **result}


def rounds_summary(runs: list[dict]) -> dict:
    """Median over the rounds of each percentile (one noisy round moves it little), the rounds kept."""
    return {"p50": statistics.median(r["p50"] for r in runs), "p99": statistics.median(r["p99"] for r in runs),
            "best_p99": min(r["p99"] for r in runs), "n": sum(r["n"] for r in runs),
            "bytes": runs[0]["bytes"], "rounds": runs}


@contextmanager
def bare_server(body: bytes, body_gzip: bytes, work: Path) -> Iterator[int]:
    (work / "body").write_bytes(body)
    (work / "body.gz").write_bytes(body_gzip)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(LOAD), "bare", str(port), str(work / "body"), str(work / "body.gz")],
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        yield port
    finally:
        proc.kill()
        proc.wait()


def startups(argv: list[str], env: dict, work: Path, n: int, marker: bytes, warm: bytes | None) -> dict:
    runs = []
    for i in range(n):
        port = free_port()
        exp, times = first_snapshot(with_port(argv, port), env, port, work / f"start{i}.log", marker, warm)
        time.sleep(2)  # settle: watchers synced, a couple of cycles
        times["rss_after_start_mib"] = memory(exp.pid)["rss_bytes"] / MIB
        exp.stop()
        runs.append(times)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {"runs": runs}


def cycles_served(body: bytes) -> float:
    m = re.search(rb"^kube_gpu_exporter_samples_total (\S+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def idle_cpu(exp: ExporterProcess, seconds: float, cycles: Callable[[], float]) -> float:
    c0, n0 = cpu_seconds(exp.pid), cycles()
    time.sleep(seconds)
    return (cpu_seconds(exp.pid) - c0) / max(cycles() - n0, 1e-9)


def flatness(ours: tuple[list[str], dict], peer: tuple[list[str], dict], work: Path, cycles: int) -> dict:
    """Ours back to back for ``cycles`` cycles and nvitop (interval 0.25 s) for the same wall time, at once."""
    pa, pb = free_port(), free_port()
    modules_out = work / "modules.json"
    argv = [sys.executable, str(PROBE), str(modules_out), "--interval", "0", "--", *with_port(ours[0], pa)[3:]]
    a, _ = first_snapshot(argv, ours[1], pa, work / "flat-ours.log", b"nvidia_gpu_memory_total_bytes", None)
    b, _ = first_snapshot(with_port(peer[0], pb, 0.25), peer[1], pb, work / "flat-peer.log", b"gpu_memory_total_MiB",
                          None)
    start, c0 = time.monotonic(), cpu_seconds(a.pid)
    n0 = cycles_served(scrape(a.url))
    timeline: dict[str, list] = {OURS: [], PEER: []}
    while True:
        n = cycles_served(scrape(a.url)) - n0
        t = time.monotonic() - start
        timeline[OURS].append((round(t, 1), n, memory(a.pid)["rss_bytes"] / MIB))
        timeline[PEER].append((round(t, 1), None, memory(b.pid)["rss_bytes"] / MIB))
        if n >= cycles:
            break
        time.sleep(1.0)
    cpu = (cpu_seconds(a.pid) - c0) / max(n, 1)
    for exp in (a, b):
        exp.stop()
    out: dict[str, Any] = {"wall_s": time.monotonic() - start, "cycles": n, "cpu_ms_per_cycle_back_to_back": cpu * 1e3}
    for name, points in timeline.items():
        rss = [p[2] for p in points]
        tenth = rss[len(rss) // 10]
        out[name] = {"rss_first_mib": rss[0], "rss_10pct_mib": tenth, "rss_end_mib": rss[-1], "rss_max_mib": max(rss),
                     "growth_after_10pct_mib": rss[-1] - tenth, "timeline": points[:: max(1, len(points) // 50)]}
    if modules_out.exists():
        loaded = json.loads(modules_out.read_text())["modules"]
        tops = sorted({m.split(".")[0] for m in loaded})
        out["daemon_modules"] = {"count": len(loaded), "heavy_top_level": [m for m in HEAVY if m in tops]}
    return out


def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    scenario = generate_node(gpus=args.gpus, processes=args.processes)
    report: dict[str, Any] = {"machine": machine(), "config": {
        "gpus": args.gpus, "processes": args.processes, "pods": len(scenario["pods"]), "cycles": args.cycles,
        "scrapers": args.scrapers, "requests_per_scraper": args.requests}, "imports": import_rss()}
    with exporter_node(scenario, work / "ours", interval=1.0) as node, \
            nvitop_exporter(scenario, work / "peer", interval=1.0) as peer_exp:
        node.exporter.stop()
        peer_exp.stop()
        ours = (node.exporter.argv, node.exporter.env)
        peer = (peer_exp.argv, peer_exp.env)
        res: dict[str, dict[str, Any]] = {OURS: {}, PEER: {}, BARE: {}}
        res[OURS]["startup"] = startups(*ours, work, args.startups, b"nvidia_gpu_memory_total_bytes",
                                        b"kube_gpu_exporter_pod_cache_synced 1")
        res[PEER]["startup"] = startups(*peer, work, args.startups, b"gpu_memory_total_MiB", None)
        # serving at the default interval (1 s): CPU per cycle while idle, then the scrape load
        port = free_port()
        exp, _ = first_snapshot(with_port(ours[0], port), ours[1], port, work / "serve.log",
                                b"nvidia_gpu_memory_total_bytes", b"kube_gpu_exporter_pod_cache_synced 1")
        try:
            cycles = lambda: cycles_served(scrape(exp.url))  # noqa: E731
            res[OURS]["cpu_ms_per_cycle_idle"] = idle_cpu(exp, args.idle_s, cycles) * 1e3
            body, body_gz = scrape(exp.url), scrape(exp.url, gzip=True)
            res[OURS]["body_bytes"], res[OURS]["body_gzip_bytes"] = len(body), len(body_gz)
            with bare_server(body, body_gz, work) as bare_port:
                for gz in (True, False):
                    key = "scrape_gzip" if gz else "scrape_identity"
                    rounds: dict[str, list[dict]] = {OURS: [], BARE: []}
                    for _ in range(args.rounds):  # alternate, so drift in the machine's load hits both
                        for name, p in ((OURS, port), (BARE, bare_port)):
                            rounds[name].append(load(p, args.scrapers, args.requests, gz))
                    for name, runs in rounds.items():
                        res[name][key] = rounds_summary(runs)
            res[OURS]["rss_after_scrapes_mib"] = memory(exp.pid)["rss_bytes"] / MIB
        finally:
            exp.stop()
        port = free_port()
        exp, _ = first_snapshot(with_port(peer[0], port), peer[1], port, work / "peer-serve.log",
                                b"gpu_memory_total_MiB", None)
        try:
            res[PEER]["scrape_gzip"] = load(port, args.scrapers, max(3, args.requests // 10), True)
        finally:
            exp.stop()
        res[OURS]["cycle_seconds"] = harness(OURS_CYCLE, args.cycle_samples, ours[0][3:], ours[1])
        res[PEER]["cycle_seconds"] = harness(NVITOP_CYCLE, max(3, args.cycle_samples // 5), [], peer[1])
        report["flatness"] = flatness(ours, peer, work, args.cycles) if args.cycles else None
    report["exporters"] = res
    return report


def harness(code: str, n: int, flags: list[str], env: dict) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, str(n), *flags], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=900, check=True)
    return summary(json.loads(out.stdout))


def table(report: dict[str, Any]) -> str:
    r, f = report["exporters"], report["flatness"] or {"cycles": 0, OURS: {}, PEER: {}}
    ms = 1e3

    def cell(v: float | None, fmt: str = "{:.1f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    rows = [
        ("first served snapshot (s)", r[OURS]["startup"]["first_snapshot_s"], r[PEER]["startup"]["first_snapshot_s"],
         None),
        ("RSS after start (MiB)", r[OURS]["startup"]["rss_after_start_mib"], r[PEER]["startup"]["rss_after_start_mib"],
         None),
        (f"RSS after {f['cycles']:.0f} cycles (MiB)", f[OURS].get("rss_end_mib"), f[PEER].get("rss_end_mib"), None),
        ("RSS growth after the first 10 % (MiB)", f[OURS].get("growth_after_10pct_mib"),
         f[PEER].get("growth_after_10pct_mib"), None),
        ("sample cycle p50 (ms)", r[OURS]["cycle_seconds"]["p50"] * ms, r[PEER]["cycle_seconds"]["p50"] * ms, None),
        ("CPU per cycle at 1 s interval (ms)", r[OURS]["cpu_ms_per_cycle_idle"], None, None),
        ("scrape p50, 10 scrapers, gzip (ms)", r[OURS]["scrape_gzip"]["p50"] * ms, r[PEER]["scrape_gzip"]["p50"] * ms,
         r[BARE]["scrape_gzip"]["p50"] * ms),
        ("scrape p99, 10 scrapers, gzip (ms)", r[OURS]["scrape_gzip"]["p99"] * ms, r[PEER]["scrape_gzip"]["p99"] * ms,
         r[BARE]["scrape_gzip"]["p99"] * ms),
        ("scrape p50, identity (ms)", r[OURS]["scrape_identity"]["p50"] * ms, None,
         r[BARE]["scrape_identity"]["p50"] * ms),
        ("scrape p99, identity (ms)", r[OURS]["scrape_identity"]["p99"] * ms, None,
         r[BARE]["scrape_identity"]["p99"] * ms),
    ]
    lines = [f"| metric | {OURS} | {PEER} | {BARE} |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {label} | {cell(a)} | {cell(b)} | {cell(c)} |" for label, a, b, c in rows]
    imp = report["imports"]
    lines.append("\nimport RSS (MiB; bare interpreter {:.1f}): ".format(imp["bare_mib"]) + ", ".join(
        f"+{m} {v:.1f}" for m, v in imp["cumulative_mib"].items()))
    lines.append("each alone adds: " + ", ".join(f"{m} {v:.1f}" for m, v in imp["alone_added_mib"].items()))
    if "daemon_modules" in f:
        lines.append(f"daemon loaded {f['daemon_modules']['count']} modules; heavy: "
                     f"{', '.join(f['daemon_modules']['heavy_top_level']) or 'none'}")
    ratio = r[OURS]["scrape_gzip"]["p99"] / r[BARE]["scrape_gzip"]["p99"]
    rss = (f[OURS].get("rss_end_mib") or r[OURS]["startup"]["rss_after_start_mib"]) / (
        f[PEER].get("rss_end_mib") or r[PEER]["startup"]["rss_after_start_mib"])
    lines.append(f"targets: RSS {rss:.2f}x nvitop (<= 1.5), "
                 f"first snapshot {r[OURS]['startup']['first_snapshot_s']:.2f} s (< 1), "
                 f"scrape p99 {ratio:.2f}x bare (<= 1.5)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--processes", type=int, default=112, help="GPU processes (112 on 16 GPUs: 64 pods)")
    parser.add_argument("--cycles", type=int, default=20_000, help="back-to-back cycles of the flatness run")
    parser.add_argument("--scrapers", type=int, default=10, help="concurrent scrapers")
    parser.add_argument("--requests", type=int, default=2000,
                        help="sequential scrapes per scraper (2000: a few seconds, a few sampling cycles)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="load rounds per server, alternating (the median of their percentiles is reported)")
    parser.add_argument("--startups", type=int, default=3, help="starts timed per exporter (median)")
    parser.add_argument("--cycle-samples", type=int, default=50, help="cycles timed in the harness")
    parser.add_argument("--idle-s", type=float, default=10.0, help="window for CPU per cycle at 1 s interval")
    parser.add_argument("--smoke", action="store_true", help="tiny and quick: a 2-GPU node, few cycles and scrapes")
    parser.add_argument("--json", type=Path,
                        default=Path(tempfile.gettempdir()) / "kube-gpu-exporter-footprint.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.gpus, args.processes, args.cycles, args.requests, args.rounds = 2, 3, 20, 5, 1
        args.startups, args.cycle_samples, args.idle_s = 1, 3, 1.0
    with tempfile.TemporaryDirectory(prefix="kge-footprint-") as tmp:
        report = bench(args, Path(tmp))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    c, m = report["config"], report["machine"]
    print(f"{c['gpus']} GPUs, {c['processes']} processes, {c['pods']} pods; {m['cpus']} CPUs ({m['cpu_model']}), "
          f"Python {m['python']}; load average {os.getloadavg()[0]:.1f}")
    print(table(report))
    print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
