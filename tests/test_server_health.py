"""/healthz tells a stuck sampler from a failing one; while cycles fail the metrics say so truthfully.

The sampler thread runs the simulated node's real pipeline; a test makes its NVML source hang
(stuck: no cycle ends) or raise (failing: every cycle ends, in an exception).
"""

from __future__ import annotations

import asyncio
import gzip
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition.snapshot import empty_snapshot
from exporter.pipeline.holder import SnapshotHolder
from exporter.pipeline.sampler import SamplerThread
from exporter.server.app import make_app
from exporter.server.stats import HttpStats
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from tests.http_support import AppClient

pytestmark = pytest.mark.e2e  # every test here starts a server

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "seed-cgpu-t4.yaml"
STALE_AFTER = 0.6


class Faulty:
    """Wraps the NVML source: ``mode`` "ok", "hang" (until released) or "fail"."""

    def __init__(self, inner) -> None:
        self.inner, self.mode, self.release = inner, "ok", threading.Event()

    def sample(self):
        if self.mode == "hang":
            self.release.wait(30)
        if self.mode == "fail":
            raise RuntimeError("NVML went away")
        return self.inner.sample()


def values(text: str) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels}


def run_with_sampler(body: Callable[[AppClient, Faulty, SamplerThread], object], first_ok: bool = True):
    """A daemon on the simulated node, its sampler thread every 20 ms, served by make_app; run ``body``."""
    daemon = build_daemon(load_config(["--simulate", str(SEED)]))
    faulty = Faulty(daemon.pipeline.sources.backend)
    daemon.pipeline.sources = replace(daemon.pipeline.sources, backend=faulty)
    if not first_ok:
        faulty.mode = "fail"
    sampler = SamplerThread(daemon.pipeline, daemon.holder, interval=0.02)
    sampler.run_once()  # as Daemon.start does: the first cycle before serving

    async def go():
        app = make_app(daemon.holder, stale_after=STALE_AFTER, stats=HttpStats())
        async with AppClient(app) as client:
            sampler.start()
            try:
                return await body(client, faulty, sampler)
            finally:
                faulty.release.set()
                sampler.stop()

    try:
        return asyncio.run(go())
    finally:
        sampler.join(5)
        daemon.close()


async def poll_async(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await fn()
        if got:
            return got
        await asyncio.sleep(0.05)  # polling the server under test
    raise AssertionError(f"timed out waiting for {what}")


async def get(client: AppClient, path: str, **kw) -> tuple[int, str]:
    r = await client.get(path, **kw)
    return r.status, (await r.read()).decode()


def test_stuck_sampler_fails_healthz_with_the_reason_and_recovers():
    async def body(client: AppClient, faulty: Faulty, sampler: SamplerThread):
        assert await get(client, "/healthz") == (200, "ok\n")
        faulty.mode = "hang"

        async def unhealthy():
            status, text = await get(client, "/healthz")
            return text if status == 503 else None

        text = await poll_async(unhealthy, 5, "/healthz to fail")
        m = re.fullmatch(r"sampler stuck: last cycle ended (\d+\.\d)s ago \(limit 0\.6s\)\n", text)
        assert m and float(m.group(1)) >= STALE_AFTER - 0.05, text
        # the data is still served meanwhile, and says how old it is
        status, metrics = await get(client, "/metrics")
        assert status == 200 and values(metrics)["kube_gpu_exporter_snapshot_age_seconds"] > STALE_AFTER
        faulty.mode = "ok"
        faulty.release.set()

        async def healthy():
            return await get(client, "/healthz") == (200, "ok\n")

        await poll_async(healthy, 5, "/healthz to recover")

    run_with_sampler(body)


def test_failing_sampler_stays_healthy_and_its_failures_and_age_show():
    async def body(client: AppClient, faulty: Faulty, sampler: SamplerThread):
        _, before = await get(client, "/metrics")
        assert values(before)["kube_gpu_exporter_sample_failures_total"] == 0
        faulty.mode = "fail"
        failed_since = time.monotonic()

        async def failures_shown():
            _, text = await get(client, "/metrics")
            v = values(text)
            return v if v["kube_gpu_exporter_sample_failures_total"] >= 5 else None

        await poll_async(failures_shown, 5, "the failures to show")
        # longer than stale_after since the last good snapshot: still alive
        while time.monotonic() - failed_since < 2 * STALE_AFTER:
            assert await get(client, "/healthz") == (200, "ok\n")
            await asyncio.sleep(0.05)
        assert await get(client, "/healthz") == (200, "ok\n")
        _, text = await get(client, "/metrics")
        v = values(text)
        # the counter is the sampler's own, not the one of the snapshot's cycle ...
        assert abs(v["kube_gpu_exporter_sample_failures_total"] - sampler.pipeline.failures_total) <= 1
        assert v["kube_gpu_exporter_sample_failures_total"] >= 10
        # ... while the data and its age are the last good cycle's
        assert v["kube_gpu_exporter_snapshot_age_seconds"] >= 2 * STALE_AFTER
        assert abs(time.time() - v["kube_gpu_exporter_snapshot_timestamp_seconds"]
                   - v["kube_gpu_exporter_snapshot_age_seconds"]) < 0.5
        assert "nvidia_gpu_duty_cycle" in text
        # the gzip variant tells the same
        r = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        zipped = values(gzip.decompress(await r.read()).decode())
        assert zipped["kube_gpu_exporter_sample_failures_total"] >= v["kube_gpu_exporter_sample_failures_total"]
        assert (await get(client, "/readyz"))[0] == 200
        return text

    text = run_with_sampler(body)
    promtool = shutil.which("promtool")
    if promtool:  # the patched counter and the appended families keep the exposition valid
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_failing_from_the_first_cycle_is_alive_not_ready_and_counted():
    async def body(client: AppClient, faulty: Faulty, sampler: SamplerThread):
        async def counted():
            _, text = await get(client, "/metrics")
            return values(text).get("kube_gpu_exporter_sample_failures_total", 0) >= 3

        await poll_async(counted, 5, "the failures to show")
        assert await get(client, "/healthz") == (200, "ok\n")
        assert (await get(client, "/readyz"))[0] == 503

    run_with_sampler(body, first_ok=False)


@pytest.mark.parametrize("ended_ago,status", [(None, 200), (0.0, 200), (59.0, 200), (93.25, 503)])
def test_healthz_reads_the_heartbeat_only(ended_ago, status):
    holder = SnapshotHolder(empty_snapshot(0.0))  # built at 1970: the age of the data does not matter
    now = 1000.0
    if ended_ago is not None:
        holder.beat(now - ended_ago)

    async def go():
        app = make_app(holder, stale_after=60, monotonic=lambda: now)
        async with AppClient(app) as client:
            return await get(client, "/healthz")

    got = asyncio.run(go())
    assert got[0] == status
    if status == 503:
        assert got[1] == "sampler stuck: last cycle ended 93.2s ago (limit 60s)\n"
