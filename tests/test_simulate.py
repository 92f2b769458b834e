"""The simulated node end to end: seed rows, promtool lint, scenario errors, HTTP serving."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from exporter.exposition.snapshot import empty_snapshot
from exporter.node.simulate import ScenarioError, load_scenario, parse_scenario
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.app import make_app
from exporter.shell.cli import build_daemon, main
from exporter.shell.config import load_config
from tests.http_support import AppClient
from tests.simulated import one_cycle, values

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DATA = Path(__file__).resolve().parent / "data"




def samples_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("# HELP")]


@pytest.mark.parametrize("seed,scenario", [
    ("seed_exclusive.prom", "seed-exclusive-t4.yaml"),
    ("seed_cgpu.prom", "seed-cgpu-t4.yaml"),
])
def test_seed_rows_reproduced_row_for_row(seed: str, scenario: str):
    want = samples_of((DATA / seed).read_text())
    got = samples_of(one_cycle(ROOT / "examples" / scenario))
    # Every TYPE line and sample of the seed, in the seed's order (our extra families follow).
    positions = [got.index(line) if line in got else -1 for line in want]
    missing = [line for line, pos in zip(want, positions, strict=True) if pos < 0]
    assert not missing, "\n".join(missing)
    assert positions == sorted(positions)
    # No row of the seed's families beyond the seed's.
    seed_families = {re.match(r"[a-z_]+", s).group(0) for s in want if not s.startswith("#")}
    extra = [s for s in got if not s.startswith("#") and re.match(r"[a-z_]+", s).group(0) in seed_families
             and s not in want]
    assert extra == []


@pytest.mark.e2e
@pytest.mark.parametrize("scenario", EXAMPLES, ids=lambda p: p.name)
def test_promtool_check_metrics_is_clean(scenario: Path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/test.sh (installs Debian's prometheus)"
    text = one_cycle(scenario, "--per-process-metrics")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mixed_node_rows():
    v = values(one_cycle(ROOT / "examples" / "mixed-4gpu-node.yaml"))

    def get(name, **labels):
        hits = [val for (n, lbl), val in v.items() if n == name and all(
            (k, str(x)) in lbl for k, x in labels.items())]
        assert len(hits) == 1, (name, labels, hits)
        return hits[0]

    assert get("nvidia_gpu_duty_cycle", uuid="GPU-0a7c1f52-3b1d-4e86-9f0e-6c2d8a4b1e01",
               allocate_mode="exclusive", pod_name="trainer-5d8f7c9b4-x2k9p") == 88
    assert get("nvidia_gpu_duty_cycle", minor_number=1, allocate_mode="exclusive") == 74
    assert get("nvidia_gpu_duty_cycle", minor_number=2, allocate_mode="None") == 71
    assert get("nvidia_gpu_duty_cycle", minor_number=2, pod_name="infer-a-7c6b5d4f3-qwert") == 22
    assert get("nvidia_gpu_gpu_sharing_memory", minor_number=2, pod_name="infer-b-6b5a4c3d2-asdfg") == (
        30000 * 2**20)
    assert get("nvidia_gpu_memory_used_bytes", minor_number=3, allocate_mode="exclusive",
               pod_name="nightly-eval-29012345-k7m2p") == 4 * 2**20
    assert get("nvidia_gpu_unaccounted_process_memory_used_bytes", pid=2003, pod_name="") == 2 * 2**30
    assert get("nvidia_gpu_allocated_compute_percent", pod_name="infer-a-7c6b5d4f3-qwert") == 30
    assert get("nvidia_gpu_allocated_memory_bytes", pod_name="trainer-5d8f7c9b4-x2k9p",
               minor_number=1) == 85899345920
    assert get("nvidia_gpu_pod_info", pod_name="trainer-5d8f7c9b4-x2k9p", workload_kind="Deployment",
               workload_name="trainer") == 1
    assert get("nvidia_gpu_pod_info", pod_name="nightly-eval-29012345-k7m2p",
               workload_kind="CronJob", workload_name="nightly-eval") == 1
    assert get("nvidia_gpu_num_devices") == 4
    assert get("nvidia_gpu_node_memory_total_bytes") == 4 * 85899345920


def test_custom_label_names_apply_everywhere():
    text = one_cycle(ROOT / "examples" / "seed-cgpu-t4.yaml", "--pod-label", "gpu_pod",
                  "--namespace-label", "gpu_namespace", "--container-label", "gpu_container")
    assert 'gpu_pod="app-3g-v1-0"' in text and "pod_name" not in text
    assert 'gpu_namespace="default"' in text and 'gpu_container="app-3g-v2"' in text


def test_not_supported_and_lost_devices(tmp_path: Path):
    doc = yaml.safe_load((ROOT / "examples" / "mixed-4gpu-node.yaml").read_text())
    doc["devices"][0]["not_supported"] = ["power", "temperature"]
    doc["devices"][1]["lost_after_ticks"] = 0
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    v = values(one_cycle(path))
    gpu0 = "GPU-0a7c1f52-3b1d-4e86-9f0e-6c2d8a4b1e01"
    gpu1 = "GPU-1b8d2063-4c2e-4f97-a01f-7d3e9b5c2f02"
    names_for = {n for (n, lbl) in v if ("uuid", gpu0) in lbl}
    assert "nvidia_gpu_power_usage_milliwatts" not in names_for
    assert "nvidia_gpu_temperature_celsius" not in names_for
    assert "nvidia_gpu_duty_cycle" in names_for
    assert v[("nvidia_gpu_up", frozenset({"node_name": "gpu-node-mixed-1", "uuid": gpu1,
                                          "minor_number": "1", "name": "NVIDIA A100-SXM4-80GB"}.items()))] == 0
    assert not [n for (n, lbl) in v if ("uuid", gpu1) in lbl and n == "nvidia_gpu_duty_cycle"]
    assert v[("nvidia_gpu_node_healthy_devices", frozenset({"node_name": "gpu-node-mixed-1"}.items()))] == 3


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(bogus=1), "unknown key(s) bogus"),
    (lambda d: d["devices"][0].update(utilization_gpu=101), "devices[0].utilization_gpu"),
    (lambda d: d["devices"][0].update(memory_used_bytes="lots"), "devices[0].memory_used_bytes"),
    (lambda d: d["devices"][0]["processes"].append(dict(d["devices"][0]["processes"][0])), "duplicate pid"),
    (lambda d: d["devices"][0]["processes"][0].update(pid=-4), "processes[0].pid"),
    (lambda d: d["devices"][0].update(not_supported=["warp_drive"]), "warp_drive"),
    (lambda d: d["devices"].append(dict(d["devices"][0])), "duplicate uuid"),
    (lambda d: d.update(devices={"a": 1}), "devices: expected a list"),
    (lambda d: d["devices"][0].pop("uuid"), "'uuid' is required"),
])
def test_broken_scenarios_give_clear_errors(mutate, message):
    doc = yaml.safe_load((ROOT / "examples" / "seed-cgpu-t4.yaml").read_text())
    mutate(doc)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(doc)


@pytest.mark.e2e
def test_cli_reports_bad_scenario_and_bad_flags(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [1, 2\n")
    assert main(["--simulate", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["--simulate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
    assert main(["--listen", "nope", "--simulate", str(EXAMPLES[0])]) == 2
    assert "--listen must be HOST:PORT" in capsys.readouterr().err
    assert main(["--interval", "-1", "--simulate", str(EXAMPLES[0])]) == 2
    assert main(["--pod-label", "bad-label", "--simulate", str(EXAMPLES[0])]) == 2
    assert "Prometheus label name" in capsys.readouterr().err


def test_malformed_pod_is_counted_not_fatal(tmp_path: Path):
    doc = yaml.safe_load((ROOT / "examples" / "seed-cgpu-t4.yaml").read_text())
    doc["pods"].append({"metadata": "garbage"})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    load_scenario(path)
    text = one_cycle(path)
    skips = [(lbl, val) for (n, lbl), val in values(text).items() if n == "kube_gpu_exporter_skips_total"]
    assert skips and sum(v for _, v in skips) >= 1
    assert 'pod_name="app-3g-v2-0"' in text


class Counting:
    """Wraps a source and counts every call into it."""

    def __init__(self, inner, counter: dict[str, int], name: str) -> None:
        self._inner, self._counter, self._name = inner, counter, name

    def __getattr__(self, attr):
        target = getattr(self._inner, attr)

        def call(*a, **kw):
            self._counter[self._name] = self._counter.get(self._name, 0) + 1
            return target(*a, **kw)
        return call

    def __call__(self, *a, **kw):
        self._counter[self._name] = self._counter.get(self._name, 0) + 1
        return self._inner(*a, **kw)


@pytest.mark.e2e
def test_scrape_path_touches_no_source():
    daemon = build_daemon(load_config(["--simulate", str(ROOT / "examples" / "seed-cgpu-t4.yaml")]))
    calls: dict[str, int] = {}
    p = daemon.pipeline
    # every source of the cycle counted, whatever it is
    p.sources = dataclasses.replace(p.sources, **{f.name: Counting(getattr(p.sources, f.name), calls, f.name)
                                                  for f in dataclasses.fields(p.sources)})
    holder = SnapshotHolder(empty_snapshot(0.0))
    holder.publish(p.step()[0])
    before = dict(calls)
    assert before["backend"] == 1 and before["proc"] >= 1 and before["pods"] == 1

    async def scrape_many() -> list[bytes]:
        async with AppClient(make_app(holder, stale_after=60)) as client:
            bodies = []
            for enc in ("identity", "gzip", "identity"):
                r = await client.get("/metrics", headers={"Accept-Encoding": enc}, auto_decompress=True)
                assert r.status == 200
                bodies.append(await r.read())
            for path in ("/", "/status.json"):  # the status page serves the cycle's tree, reads no source
                r = await client.get(path)
                assert r.status == 200
                bodies.append(await r.read())
            return bodies

    bodies = asyncio.run(scrape_many())
    assert calls == before
    assert all(b"nvidia_gpu_duty_cycle" in b and b"kube_gpu_exporter_snapshot_age_seconds" in b for b in bodies[:3])
    assert b"app-3g-v1-0" in bodies[3] and b'"scheme": "aliyun-gpushare"' in bodies[4]
    daemon.close()


def test_gzip_payload_is_one_valid_stream():
    daemon = build_daemon(load_config(["--simulate", str(EXAMPLES[0])]))
    snapshot, _ = daemon.pipeline.step()
    from exporter.exposition.snapshot import scrape_payload
    plain = scrape_payload(snapshot, snapshot.built_at + 2.5, gzipped=False)
    zipped = scrape_payload(snapshot, snapshot.built_at + 2.5, gzipped=True)
    assert gzip.decompress(zipped) == plain
    assert plain.endswith(b"kube_gpu_exporter_snapshot_age_seconds 2.5\n")
    daemon.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_daemon_serves_on_the_listen_address():
    port = free_port()
    env = {**os.environ, "KUBE_GPU_EXPORTER_INTERVAL": "0.2"}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate",
                             str(ROOT / "examples" / "seed-exclusive-t4.yaml"), "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        body = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)  # polling for the port to open
        assert body is not None
        assert 'allocate_mode="exclusive"' in body and 'pod_name="app-3g-v1-0"' in body
        # Samples keep coming: the counter grows.
        first = values(body)[("kube_gpu_exporter_samples_total", frozenset())]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                now = values(r.read().decode())[("kube_gpu_exporter_samples_total", frozenset())]
            if now > first:
                break
            time.sleep(0.1)
        assert now > first
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert f"serving http://127.0.0.1:{port}/metrics" in out
    assert proc.returncode == 0, out
