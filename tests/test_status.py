"""The status page's data (exporter/exposition/status.py) and its HTML (status_html.py) on the simulated nodes."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from exporter.exposition.snapshot import empty_snapshot, with_sample_failures
from exporter.exposition.status import build_status, status_json, status_view
from exporter.exposition.status_html import render_html
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.app import make_app
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.xid.stats import XidStats, xid_summary
from tests.http_support import AppClient

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "examples" / "mixed-4gpu-node.yaml"
MIG = ROOT / "examples" / "mig-a100-node.yaml"
MIB = 1024 * 1024


def cycle(scenario: Path):
    daemon = build_daemon(load_config(["--simulate", str(scenario)]))
    try:
        return daemon.pipeline.step()
    finally:
        daemon.close()


def view_of(scenario: Path, age: float = 2.0) -> dict:
    snapshot, _ = cycle(scenario)
    return status_view(snapshot.status, snapshot.sample_failures_total, snapshot.built_at + age, True)


def test_mixed_node_gpus_match_the_scenario() -> None:
    scenario = yaml.safe_load(MIXED.read_text())
    view = view_of(MIXED)
    assert view["node"] == scenario["node"] and view["snapshot_age_seconds"] == 2.0
    assert [g["uuid"] for g in view["gpus"]] == [d["uuid"] for d in scenario["devices"]]
    for g, d in zip(view["gpus"], scenario["devices"], strict=True):
        assert g["model"] == d["name"] and g["minor"] == d["minor_number"] and g["state"] == "up"
        assert g["utilization_percent"] == d["utilization_gpu"]
        assert (g["memory_used_bytes"], g["memory_total_bytes"]) == (d["memory_used_bytes"], d["memory_total_bytes"])
        assert g["power_watts"] == d["power_usage_milliwatts"] / 1000
        assert g["temperature_celsius"] == d["temperature_celsius"] and g["instances"] == []
    assert [g["allocate_mode"] for g in view["gpus"]] == ["exclusive", "exclusive", "share", "exclusive"]


def test_mixed_node_containers_grants_use_and_unaccounted() -> None:
    gpus = view_of(MIXED)["gpus"]
    trainer = gpus[0]["containers"]
    assert [(c["namespace"], c["pod"], c["container"], c["scheme"]) for c in trainer] == [
        ("ml", "trainer-5d8f7c9b4-x2k9p", "trainer", "nvidia")]
    assert trainer[0]["grant"] == {"compute_percent": 100.0, "memory_bytes": 85899345920}
    shared = {c["pod"]: c for c in gpus[2]["containers"]}
    assert set(shared) == {"infer-a-7c6b5d4f3-qwert", "infer-b-6b5a4c3d2-asdfg"}
    a, b = shared["infer-a-7c6b5d4f3-qwert"], shared["infer-b-6b5a4c3d2-asdfg"]
    assert (a["allocate_mode"], a["scheme"]) == ("share", "hami")
    assert a["grant"] == {"compute_percent": 30.0, "memory_bytes": 20000 * MIB}  # the HAMi annotation
    assert b["grant"] == {"compute_percent": 50.0, "memory_bytes": 30000 * MIB}
    assert a["use"] == {"sm_percent": 22.0, "memory_bytes": 19327352832}  # pid 2001
    assert b["use"] == {"sm_percent": 41.0, "memory_bytes": 26843545600}  # pid 2002
    assert gpus[2]["unaccounted"] == [{"pid": 2003, "comm": "ollama", "memory_bytes": 2147483648, "sm_percent": 5.0,
                                       "namespace": None, "pod": None, "container": None}]  # ollama on the host
    idle = gpus[3]["containers"]  # the CronJob pod known only from pod-resources
    assert [(c["pod"], c["allocate_mode"]) for c in idle] == [("nightly-eval-29012345-k7m2p", "exclusive")]


def test_mixed_node_subsystems() -> None:
    sub = view_of(MIXED)["subsystems"]
    assert sub["nvml"]["up"] is True and sub["nvml"]["errors"] == []
    assert sub["pod_cache"]["synced"] is True and sub["pod_cache"]["age_seconds"] >= 0
    assert sub["sampler"] == {**sub["sampler"], "samples_total": 1, "sample_failures_total": 0}
    # a simulated node: the scenario's pod-resources and no kernel log, neither in use (no problem)
    assert sub["pod_resources"] == {"state": "simulated (the scenario's answers)", "ok": None}
    assert sub["kernel_log"] == {"state": "none", "ok": None} and not any(sub["output_failures"].values())
    assert sub["skips"] == {}


def test_mig_instances_stand_under_their_card() -> None:
    scenario = yaml.safe_load(MIG.read_text())
    gpus = view_of(MIG)["gpus"]
    card, whole = gpus
    spec = scenario["devices"][0]
    assert card["uuid"] == spec["uuid"] and card["model"] == spec["name"] and card["minor"] == 0
    assert card["power_watts"] == 212.0 and card["temperature_celsius"] == 51
    assert card["memory_used_bytes"] == spec["memory_used_bytes"]  # the total: unknown to NVML in MIG mode
    assert card["memory_total_bytes"] is None and card["instances_memory_total_bytes"] == sum(
        m["memory_total_bytes"] for m in spec["mig_devices"])
    assert [i["uuid"] for i in card["instances"]] == [m["uuid"] for m in spec["mig_devices"]]
    assert [i["mig"]["profile"] for i in card["instances"]] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    big, small, free = card["instances"]
    assert [(c["pod"], c["allocate_mode"]) for c in big["containers"]] == [("train-large-0", "exclusive")]
    assert big["containers"][0]["grant"]["memory_bytes"] == 42949672960
    assert big["containers"][0]["use"] == {"sm_percent": None, "memory_bytes": 21474836480}  # no MIG utilization
    assert [c["pod"] for c in small["containers"]] == ["infer-small-6d5c4b3a2-xk2lp"]
    assert free["containers"] == [] and free["allocate_mode"] == "None"
    assert whole["uuid"] == scenario["devices"][1]["uuid"] and whole["instances"] == []
    assert [c["pod"] for c in whole["containers"]] == ["notebook-ana"]


def test_status_is_immutable_and_a_view_leaves_it_unchanged() -> None:
    snapshot, _ = cycle(MIXED)
    with pytest.raises(TypeError):
        snapshot.status["node"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.status["gpus"][0]["uuid"] = "x"  # type: ignore[index]
    view = status_view(snapshot.status, snapshot.sample_failures_total, snapshot.built_at + 9, True)
    view["gpus"].clear()
    assert snapshot.status["snapshot_age_seconds"] == 0.0 and len(snapshot.status["gpus"]) == 4


def test_a_failed_cycle_shows_its_failure_count() -> None:
    snapshot, _ = cycle(MIXED)
    failed = with_sample_failures(snapshot, 3)
    view = status_view(failed.status, failed.sample_failures_total, failed.built_at + 30, True)
    assert view["subsystems"]["sampler"]["sample_failures_total"] == 3 and view["snapshot_age_seconds"] == 30


def test_xid_counts_per_gpu_and_code_with_their_meaning() -> None:
    _, attr = cycle(MIXED)
    uuid = attr.devices[2].device.uuid
    stats = XidStats(xid_counts={(uuid, 2, 79, "serving", "a", "c"): 2, (uuid, 2, 79, "serving", "b", "c"): 1,
                                 (uuid, 2, 13, "", "", ""): 1, ("", None, 48, "", "", ""): 4},
                     last_xid_time={(uuid, 2): 1234.5}, last_xid={(uuid, 2): 79},
                     last_seen={(uuid, 2, 79, "serving", "a", "c"): 1234.5, (uuid, 2, 79, "serving", "b", "c"): 1200.0,
                                (uuid, 2, 13, "", "", ""): 1100.0, ("", None, 48, "", "", ""): 1000.0})
    status = build_status(attr, _sample(), _stats(), xid_summary(stats), "n", 100.0)
    view = status_view(status, None, 101.0, True, lambda code: {"meaning": f"m{code}"})
    gpu = view["gpus"][2]
    culprits = [{"namespace": "serving", "pod": "a", "container": "c", "count": 2, "last_at": 1234.5},
                {"namespace": "serving", "pod": "b", "container": "c", "count": 1, "last_at": 1200.0}]
    assert gpu["xids"] == [{"xid": 13, "count": 1, "last_at": 1100.0, "pods": [], "meaning": "m13"},
                           {"xid": 79, "count": 3, "last_at": 1234.5, "pods": culprits, "meaning": "m79"}]
    assert gpu["last_xid_at"] == 1234.5
    assert view["other_xids"] == [{"uuid": "", "xid": 48, "count": 4, "last_at": 1000.0, "pods": [],
                                   "meaning": "m48"}]
    assert all(g["xids"] == [] for i, g in enumerate(view["gpus"]) if i != 2)


def _sample():
    from exporter.model import NodeSample
    return NodeSample(timestamp=100.0)


def _stats():
    from exporter.exposition.rows import ExporterStats
    return ExporterStats(samples_total=1, sample_failures_total=0, pod_sync_errors_total=0,
                         pod_cache_age_seconds=None, pod_cache_synced=False, skips={}, snapshot_timestamp=100.0)


def test_before_the_first_snapshot() -> None:
    snapshot = empty_snapshot(0.0)
    view = status_view(snapshot.status, snapshot.sample_failures_total, 5.0, False)
    assert view["ready"] is False and view["gpus"] == []
    assert json.loads(status_json(view))["subsystems"] is None
    assert b"No snapshot yet" in render_html(view)


HOSTILE = '<script>alert("x")</script>'


def test_hostile_pod_names_are_escaped(tmp_path: Path) -> None:
    scenario = yaml.safe_load(MIXED.read_text())
    pod = next(p for p in scenario["pods"] if p["metadata"]["name"].startswith("infer-a"))
    pod["metadata"]["name"] = HOSTILE
    pod["metadata"]["namespace"] = '"><img src=x onerror=alert(1)>'
    pod["spec"]["containers"][0]["name"] = "c&<b>"
    pod["status"]["containerStatuses"][0]["name"] = "c&<b>"
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(scenario))
    view = view_of(path)
    assert HOSTILE in {c["pod"] for c in view["gpus"][2]["containers"]}  # the data keeps the name as it is
    page = render_html(view).decode()
    assert "<script" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page and "c&amp;&lt;b&gt;" in page
    assert HOSTILE in {c["pod"] for c in json.loads(status_json(view))["gpus"][2]["containers"]}


def test_page_shows_the_tables_and_links() -> None:
    page = render_html(view_of(MIXED)).decode()
    for text in ('href="/metrics"', 'href="/healthz"', 'href="/readyz"', 'href="/status.json"',
                 'http-equiv="refresh"', "prefers-color-scheme:dark", "trainer-5d8f7c9b4-x2k9p",
                 "Unaccounted processes", "GPU-2c9e3174-5d3f-4fa8-b120-8e4fac6d3003", "hami"):
        assert text in page, text
    assert "http://" not in page and "https://" not in page  # no external assets


@pytest.mark.e2e
def test_server_routes_serve_the_status() -> None:
    snapshot, _ = cycle(MIG)
    holder = SnapshotHolder(empty_snapshot(0.0))

    async def fetch() -> tuple:
        async with AppClient(make_app(holder, 60, clock=lambda: snapshot.built_at + 1.5)) as client:
            before = await (await client.get("/status.json")).json()
            holder.publish(snapshot)
            r = await client.get("/status.json")
            page = await client.get("/")
            return before, r.headers["Content-Type"], await r.json(), page.headers["Content-Type"], await page.text()

    before, json_type, body, html_type, page = asyncio.run(fetch())
    assert before["ready"] is False
    assert json_type.startswith("application/json") and html_type.startswith("text/html")
    assert body["ready"] is True and body["snapshot_age_seconds"] == 1.5
    assert [i["mig"]["profile"] for i in body["gpus"][0]["instances"]] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    assert "MIG 3g.40gb" in page and "train-large-0" in page


@pytest.mark.e2e
def test_served_xids_carry_the_catalog_meaning() -> None:
    snapshot, attr = cycle(MIXED)
    uuid = attr.devices[0].device.uuid
    xids = xid_summary(XidStats(xid_counts={(uuid, 0, 79, "", "", ""): 1}))
    status = build_status(attr, _sample(), _stats(), xids, "n", snapshot.built_at)
    holder = SnapshotHolder(empty_snapshot(0.0))
    holder.publish(replace(snapshot, status=status))

    async def fetch() -> tuple[dict, str]:
        async with AppClient(make_app(holder, 60)) as client:
            return await (await client.get("/status.json")).json(), await (await client.get("/")).text()

    body, page = asyncio.run(fetch())
    assert body["gpus"][0]["xids"] == [{"xid": 79, "count": 1, "last_at": 0.0, "pods": [],
                                        "meaning": "GPU has fallen off the bus",
                                        "action": "reboot the node / service the GPU", "severity": "node"}]
    assert "GPU has fallen off the bus" in page


def test_page_tells_the_health_an_operator_acts_on() -> None:
    """Row remapping to reset or replace, clocks held back and energy, per GPU (tests/scenarios/health_node.yaml)."""
    from exporter.exposition.status_html import GPU_HEADERS, _gpu_row

    view = view_of(ROOT / "tests" / "scenarios" / "health_node.yaml")
    scenario = yaml.safe_load((ROOT / "tests" / "scenarios" / "health_node.yaml").read_text())
    column = GPU_HEADERS.index("Health")
    assert GPU_HEADERS[:2] == ("State", "Health")  # what an operator acts on stays on screen at 800 px
    health = {g["minor"]: _gpu_row({**g, "allocate_mode": "exclusive"})[column].removeprefix('<div class="health">')
              .removesuffix("</div>") for g in view["gpus"]}
    assert "row remap failed: replace the GPU" in health[6] and "pending" not in health[6]
    assert "row remap pending: reset the GPU" in health[7]
    assert health[2] == "clocks held: sw_power_cap, sw_thermal_slowdown"  # 0x24
    assert health[0] == '<span class="ok">ok</span>'
    card0 = next(d for d in scenario["devices"] if d["minor_number"] == 0)
    energy = _gpu_row({**view["gpus"][0], "allocate_mode": "exclusive"})[GPU_HEADERS.index("Energy")]
    assert energy == f"{card0['energy_millijoules'] / 1000 / 3.6e6:.2f}&nbsp;kWh"
    page = render_html(view).decode()
    assert "<th>Health</th>" in page and page.count("row remap failed") == 1
    # the banner leads with the failed remap (critical) and the GPU's section and row are highlighted
    assert page.index('id="problems" class="critical"') < page.index("<h2>Subsystems") < page.index('class="gpu')
    assert page.index("failed to remap a memory row") < page.index("has memory rows remapped")
    assert '<section class="gpu critical"><h2>GPU 6:' in page and '<tr class="critical"><td><span class="ok">up' in page
