"""The status page under load (issue 26, item 6): scrapes and /healthz timed while clients read /status.json.

    .venv/bin/python -m bench.status_load                          # before and after, 5,000 pods: about 3 minutes
    .venv/bin/python -m bench.status_load --pods 500 --seconds 5 --json /tmp/status-load.json

One simulated node (``--gpus`` A100s shared by ``--pods`` pods, HAMi annotations, one GPU process each),
served by the daemon itself (``python -m exporter --simulate``, sampling every second) of two trees in
turn, in one run: ``before``, the commit ``--before`` (per-request rendering) extracted with ``git
archive``, and ``after``, this checkout. For each, ``alone``: one Prometheus-like scraper (keep-alive,
gzip, GETs of /metrics back to back) and a /healthz probe every 100 ms for ``--seconds``; then
``loaded``: the same while ``--clients`` connections GET /status.json back to back (keep-alive,
identity, as ``top`` does), from another process. Latencies are request to last byte, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from io import BytesIO
from pathlib import Path
from typing import Any

from bench.footprint_load import _answer
from bench.run import percentile
from tests.integration_support import free_port

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "846ef4f"  # main before the stored status page: /status.json and / rendered per request


def node(gpus: int, pods: int) -> dict[str, Any]:
    """``gpus`` GPUs shared by ``pods`` pods, each with one small process (valid for the simulated node)."""
    sys.path.insert(0, str(ROOT))
    from tests.integration_support import generate_node
    scenario = generate_node(gpus, pods, shared_every=1)
    for d in scenario["devices"]:
        for p in d["processes"]:
            p["used_memory_bytes"], p["sm_util"] = 64 << 20, p["sm_util"] % 7
        d["memory_used_bytes"] = (64 << 20) * len(d["processes"]) + (512 << 20)
    return scenario


def _tree(ref: str, into: Path) -> Path:
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            return r.status
    except OSError:
        return 0


def _percentiles(values: list[float]) -> dict[str, float | int]:
    """Latencies (s) as milliseconds: nearest-rank p50 and p99 (bench/run.py's), max."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50_ms": round(1e3 * percentile(values, 50), 2),
            "p99_ms": round(1e3 * percentile(values, 99), 2), "max_ms": round(1e3 * max(values), 2)}


async def _loop(port: int, path: str, gz: bool, seconds: float, pause: float) -> tuple[list[float], int]:
    """GETs of ``path`` on one keep-alive connection for ``seconds``; latencies and the last body's size."""
    enc = "Accept-Encoding: gzip\r\n" if gz else ""
    request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n{enc}\r\n".encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out, size, end = [], 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        writer.write(request)
        _keep, size = await _answer(reader)
        out.append(time.perf_counter() - start)
        if pause:
            await asyncio.sleep(pause)
    writer.close()
    return out, size


async def _measure(port: int, seconds: float) -> dict[str, Any]:
    (scrapes, size), (health, _) = await asyncio.gather(_loop(port, "/metrics", True, seconds, 0.0),
                                                        _loop(port, "/healthz", False, seconds, 0.1))
    return {"scrape": _percentiles(scrapes), "scrape_gzip_bytes": size, "healthz": _percentiles(health)}


async def _clients(port: int, clients: int, seconds: float) -> dict[str, Any]:
    runs = await asyncio.gather(*(_loop(port, "/status.json", False, seconds, 0.0) for _ in range(clients)))
    latencies = [x for r, _ in runs for x in r]
    return {"status": _percentiles(latencies), "status_bytes": runs[0][1],
            "status_requests_per_second": round(len(latencies) / seconds, 1)}


def _exporter(tree: Path, scenario: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", str(scenario), "--listen",
                             f"127.0.0.1:{port}", "--interval", "1"], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _get(f"http://127.0.0.1:{port}/readyz") != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the exporter of {tree} did not get ready")
        time.sleep(0.2)
    return proc


def run_one(tree: Path, scenario: Path, seconds: float, clients: int) -> dict[str, Any]:
    port = free_port()
    proc = _exporter(tree, scenario, port)
    try:
        time.sleep(2)  # a few cycles: the pod cache warm
        alone = asyncio.run(_measure(port, seconds))
        load = subprocess.Popen([sys.executable, "-m", "bench.status_load", "clients", str(port), str(clients),
                                 str(seconds + 2)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        time.sleep(1)  # the clients connected and reading
        loaded = asyncio.run(_measure(port, seconds))
        out, _ = load.communicate(timeout=seconds + 60)
        return {"alone": alone, "loaded": {**loaded, **json.loads(out)}}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--before", default=BEFORE, help="the commit measured as 'before'")
    ap.add_argument("--only", choices=("before", "after"))
    ap.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "kge-status-load.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "node.json"
        scenario.write_text(json.dumps(node(args.gpus, args.pods)))
        trees = {"before": lambda: _tree(args.before, Path(tmp) / "before"), "after": lambda: ROOT}
        result: dict[str, Any] = {"config": {**{k: v for k, v in vars(args).items() if k != "json"},
                                             "cpus": os.cpu_count(), "load_average": os.getloadavg()}}
        for name in ("before", "after"):
            if args.only in (None, name):
                result[name] = run_one(trees[name](), scenario, args.seconds, args.clients)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))


def table(result: dict[str, Any]) -> str:
    rows = ["| | scrape p50 | scrape p99 | /healthz p99 | /status.json p50 | /status.json p99 | bytes | requests/s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("before", "after"):
        if name not in result:
            continue
        for phase in ("alone", "loaded"):
            r = result[name][phase]
            status = [f"{r['status'].get('p50_ms')} ms", f"{r['status'].get('p99_ms')} ms", f"{r['status_bytes']:,}",
                      f"{r['status_requests_per_second']}"] if "status" in r else ["-"] * 4
            rows.append(f"| {name}, {phase} | {r['scrape'].get('p50_ms')} ms | {r['scrape'].get('p99_ms')} ms | "
                        f"{r['healthz'].get('p99_ms')} ms | " + " | ".join(status) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:2] == ["clients"]:
        port, clients, seconds = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(asyncio.run(_clients(port, clients, seconds))))
    else:
        main()
