#!/usr/bin/env python3
"""Soak: the real exporter on the fake NVML for ``--minutes`` (default 15), scraped steadily.

8 GPUs (``generate_node``), ``--interval 0.2``, one scraper GETting ``/metrics`` every
``--scrape-every`` seconds (gzip and identity in turn); every ``--sample-every`` seconds the
exporter process's VmRSS, open fds and threads. After the warm-up (the first ``--warmup``
fraction of the run) each meter must be flat; ``flatness`` says how that is decided. See
bench/README.md "Soak".

    python bench/soak.py [--minutes 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc import memory, open_fds, threads  # noqa: E402
from bench.run import machine  # noqa: E402
from tests.integration_support import exporter_node, generate_node, parse_exposition, value  # noqa: E402

MIB = 2**20
METERS = ("rss_bytes", "fds", "threads")
# Allowed growth after the warm-up, per meter: RSS max(1 MiB, 1 % of its post-warm-up level);
# fds 2 (a scrape's socket and a file being read may be open at the sampling instant); threads 1.
ABS_TOLERANCE = {"rss_bytes": 1 * MIB, "fds": 2, "threads": 1}
REL_TOLERANCE = {"rss_bytes": 0.01, "fds": 0.0, "threads": 0.0}


def slope(ts: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``ts`` (units per second); 0 for fewer than two points."""
    if len(ts) < 2:
        return 0.0
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / den if den else 0.0


def flatness(samples: Sequence[dict[str, float]], warmup: float = 0.2) -> dict[str, Any]:
    """Is each meter flat after the warm-up?

    ``samples`` are ``{"t": seconds, "rss_bytes": .., "fds": .., "threads": ..}`` in time order.
    The samples after the first ``warmup`` fraction of the run's duration are split into thirds;
    ``growth`` is the median of the last third minus the median of the first (medians, so one
    sample taken mid-scrape moves neither), ``drift`` the least-squares slope over the post-warm-up
    samples times their span. A meter is flat when both are at most its tolerance
    (``ABS_TOLERANCE`` or ``REL_TOLERANCE`` of the first third's median, whichever is larger): a
    leak shows in both, a step after warm-up in the growth, a slow creep in the drift.
    """
    if not samples:
        raise ValueError("no samples")
    t0 = samples[0]["t"]
    cut = t0 + warmup * (samples[-1]["t"] - t0)
    after = [s for s in samples if s["t"] >= cut]
    if len(after) < 3:
        raise ValueError(f"{len(after)} samples after the warm-up: need 3 or more")
    third = max(1, len(after) // 3)
    out: dict[str, Any] = {"samples_after_warmup": len(after), "warmup_s": cut - t0}
    for meter in METERS:
        ys = [s[meter] for s in after]
        base = statistics.median(ys[:third])
        growth = statistics.median(ys[-third:]) - base
        fitted = slope([s["t"] for s in after], ys)
        drift = fitted * (after[-1]["t"] - after[0]["t"])
        tolerance = max(ABS_TOLERANCE[meter], REL_TOLERANCE[meter] * base)
        out[meter] = {"first": samples[0][meter], "after_warmup": base, "end": ys[-1], "max": max(ys),
                      "growth": growth, "drift": drift, "slope_per_hour": fitted * 3600,
                      "tolerance": tolerance, "flat": growth <= tolerance and drift <= tolerance}
    out["flat"] = all(out[m]["flat"] for m in METERS)
    return out


class Scraper(threading.Thread):
    """GETs the page every ``every`` seconds until stopped; counts answers and errors."""

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.stop_event = threading.Event()
        self.ok = self.errors = 0
        self.last = b""

    def run(self) -> None:
        gzip = False
        while not self.stop_event.wait(self.every):
            req = urllib.request.Request(self.url, headers={"Accept-Encoding": "gzip"} if gzip else {})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    body = resp.read()
                self.ok += 1
                if not gzip:
                    self.last = body
            except OSError:
                self.errors += 1
            gzip = not gzip


def sample(pid: int, t: float) -> dict[str, float]:
    return {"t": t, "rss_bytes": memory(pid)["rss_bytes"], "fds": open_fds(pid), "threads": threads(pid)}


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    scenario = generate_node(gpus=args.gpus, processes=args.processes)
    report: dict[str, Any] = {"machine": machine(), "config": {
        "gpus": args.gpus, "processes": args.processes, "pods": len(scenario["pods"]), "interval": args.interval,
        "minutes": args.minutes, "scrape_every_s": args.scrape_every, "sample_every_s": args.sample_every,
        "warmup_fraction": args.warmup}}
    with exporter_node(scenario, work, interval=args.interval) as node:
        exp = node.exporter
        exp.wait_for(lambda s: value(s, "kube_gpu_exporter_pod_cache_synced") == 1, 60, "the pod cache to sync")
        scraper = Scraper(exp.url, args.scrape_every)
        scraper.start()
        samples: list[dict[str, float]] = []
        start = time.monotonic()
        end = start + args.minutes * 60
        try:
            while True:
                now = time.monotonic()
                if not exp.alive():
                    raise RuntimeError(f"the exporter exited:\n{exp.output()[-3000:]}")
                samples.append(sample(exp.pid, now - start))
                if now >= end:
                    break
                time.sleep(min(args.sample_every, max(0.0, end - now)))  # a sampling period, not a wait for a state
        finally:
            scraper.stop_event.set()
            scraper.join(15)
        cycles = value(parse_exposition(scraper.last.decode()), "kube_gpu_exporter_samples_total")
    report["samples"] = samples
    report["scrapes"] = {"ok": scraper.ok, "errors": scraper.errors}
    report["cycles"] = cycles
    report["flatness"] = flatness(samples, args.warmup)
    return report


def table(report: dict[str, Any]) -> str:
    flat = report["flatness"]
    rows = ["| meter | first | after warm-up | end | max | growth | drift | tolerance | flat |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for meter in METERS:
        m = flat[meter]
        scale, fmt = (MIB, "{:.2f}") if meter == "rss_bytes" else (1, "{:g}")
        cells = [fmt.format(m[k] / scale) for k in ("first", "after_warmup", "end", "max", "growth", "drift",
                                                    "tolerance")]
        name = "RSS (MiB)" if meter == "rss_bytes" else meter
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if m['flat'] else 'NO'} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="length of the run")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64, help="GPU processes spread over the GPUs")
    parser.add_argument("--interval", type=float, default=0.2, help="the exporter's --interval")
    parser.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS/fd/thread samples")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run not judged")
    parser.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "kube-gpu-exporter-soak.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kge-soak-") as tmp:
        report = soak(args, Path(tmp))
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"\ncycles {report['cycles']:g}, scrapes {report['scrapes']['ok']} ok / {report['scrapes']['errors']} "
          f"errors; flat: {'yes' if report['flatness']['flat'] else 'NO'}; JSON: {args.json}")
    return 0 if report["flatness"]["flat"] and not report["scrapes"]["errors"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
