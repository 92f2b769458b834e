"""MIG values where they are shown (issue 27, item 4): /status.json, the page and ``top``, examples/mig-a100-node.yaml.

The card's power, temperature, energy and health once, on the card; never repeated on its instances. A
MIG card's memory total is the card's own, not the sum of its instances' (memory no instance holds
included).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml

from exporter.exposition.status import CARD_HEALTH_KEYS, CARD_KEYS
from exporter.exposition.status_page import page_parts
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.top.rows import CARD, GPU_COLUMNS, build_view

ROOT = Path(__file__).resolve().parent.parent
MIG = ROOT / "examples" / "mig-a100-node.yaml"
GIB = 1 << 30


def _served(scenario: Path) -> tuple[dict, str]:
    """/status.json (gzip) and / of one simulated cycle, as the server hands them out."""
    daemon = build_daemon(load_config(["--simulate", str(scenario)]))
    try:
        snapshot = daemon.pipeline.step()[0]
    finally:
        daemon.close()
    assert snapshot.page is not None
    body = json.loads(gzip.decompress(b"".join(page_parts(snapshot.page, snapshot.built_at + 1, False, True))))
    return body, b"".join(page_parts(snapshot.page, snapshot.built_at + 1, True, False)).decode()


def test_card_values_once_on_the_card_none_on_its_instances() -> None:
    spec = yaml.safe_load(MIG.read_text())["devices"][0]
    body, _ = _served(MIG)
    card = body["gpus"][0]
    assert card["power_watts"] == spec["power_usage_milliwatts"] / 1000 == 212.0
    assert card["temperature_celsius"] == spec["temperature_celsius"]
    assert set(CARD_KEYS) >= {"power_watts", "temperature_celsius", "energy_joules", "power_limit_watts"}
    for inst in card["instances"]:
        assert {k: inst[k] for k in (*CARD_KEYS, *CARD_HEALTH_KEYS)} == dict.fromkeys((*CARD_KEYS, *CARD_HEALTH_KEYS))
        assert inst["memory_total_bytes"] is not None  # each instance's own values stay
    whole = body["gpus"][1]  # not in MIG mode: its own values, as before
    assert whole["power_watts"] == 250.0 and whole["instances"] == []


def test_card_memory_total_is_never_the_sum_of_its_instances(tmp_path: Path) -> None:
    """NVML answers a MIG card's memory to a privileged caller only (the fake and the simulated node alike):
    the total is unknown, the instances' sum is named as such beside it, never shown as the card's."""
    scenario = yaml.safe_load(MIG.read_text())
    card_spec = scenario["devices"][0]
    # only the free 2g.20gb instance left: its 20 GiB is all the instances have, the card has 80
    card_spec["mig_devices"] = card_spec["mig_devices"][2:]
    card_spec["memory_used_bytes"] = 0
    path = tmp_path / "mig-one-slice.yaml"
    path.write_text(yaml.safe_dump(scenario))
    body, page = _served(path)
    card = body["gpus"][0]
    assert card["memory_total_bytes"] is None and card_spec["memory_total_bytes"] == 80 * GIB
    assert card["instances_memory_total_bytes"] == 20 * GIB and card["memory_used_bytes"] == 0
    assert "0.0&nbsp;GiB / &ndash; (instances 20.0&nbsp;GiB)" in page
    full, _ = _served(MIG)
    assert full["gpus"][0]["memory_total_bytes"] is None
    assert full["gpus"][0]["memory_used_bytes"] == sum(m["memory_used_bytes"]
                                                       for m in yaml.safe_load(MIG.read_text())["devices"][0]
                                                       ["mig_devices"])


def test_page_shows_the_cards_power_once() -> None:
    _, page = _served(MIG)
    assert page.count("212.0&nbsp;W") == 1  # the card's row; its three slices say "card"
    assert page.count(">card</span>") >= 3 * 4  # power, temperature, energy and health of each slice
    assert page.count("51&nbsp;&deg;C") == 1


def test_top_shows_the_cards_values_once() -> None:
    body, _ = _served(MIG)
    view = build_view(body)
    rows = {r[0]: dict(zip(GPU_COLUMNS, r, strict=True)) for r in view.gpus}
    assert list(rows) == ["0", "0/MIG 3g.40gb GI 2", "0/MIG 2g.20gb GI 3", "0/MIG 2g.20gb GI 4", "1"]
    card_row = rows["0"]
    assert CARD not in card_row.values() and "212" in " ".join(card_row.values())
    for label in list(rows)[1:4]:
        values = list(rows[label].values())
        assert values.count(CARD) >= 4 and "212" not in " ".join(values)  # power, temperature, energy, health
        assert rows[label]["Memory" if "Memory" in rows[label] else list(rows[label])[6]] != CARD
    assert rows["0"][list(card_row)[6]] == "28.0/-"  # used by the slices / the card's total, unknown to NVML


def test_card_memory_unknown_to_nvml_is_null_not_the_sum() -> None:
    """Real NVML answers a MIG card's memory to a privileged caller only: then the total is unknown, and the
    page shows the instances' sum beside it, named so."""
    from dataclasses import replace

    from exporter.exposition.rows import ExporterStats
    from exporter.exposition.status import build_status, status_view
    from exporter.exposition.status_html import render_html
    daemon = build_daemon(load_config(["--simulate", str(MIG)]))
    try:
        _, attr = daemon.pipeline.step()
        sample = daemon.pipeline.last_sample
    finally:
        daemon.close()
    assert sample is not None
    unknown = replace(attr, devices=tuple(replace(d, device=replace(d.device, card_memory_total_bytes=None))
                                          for d in attr.devices))
    status = build_status(unknown, sample, ExporterStats(), None, "n", 0.0)
    card = status["gpus"][0]
    assert card["memory_total_bytes"] is None and card["instances_memory_total_bytes"] == 80 * GIB
    assert "/ &ndash; (instances 80.0&nbsp;GiB)" in render_html(status_view(status, None, 0.0, True)).decode()


# ---- where a MIG instance's utilisation comes from (issue 27, item 3) ----------------------------------

H100_MIG = ROOT / "examples" / "mig-h100-node.yaml"


def test_an_a100_instance_says_nvml_has_no_utilisation_on_the_page_and_in_top() -> None:
    body, page = _served(MIG)
    instances = body["gpus"][0]["instances"]
    assert instances and {i["utilization_source"] for i in instances} == {"unavailable"}
    assert all(i["utilization_percent"] is None for i in instances)
    assert body["gpus"][0]["utilization_source"] is None  # the card in MIG mode: its instances carry it
    assert body["gpus"][1]["utilization_source"] == "nvml"  # the whole A100 beside it
    assert page.count('title="utilisation not available from NVML on this GPU">n/a</span>') == len(instances)
    util = GPU_COLUMNS.index("Util %")
    rows = {r[0]: r for r in build_view(body).gpus}
    assert [r[util] for label, r in rows.items() if "/" in label] == ["n/a"] * len(instances)
    assert "n/a" not in [r[util] for label, r in rows.items() if "/" not in label]  # cards and whole GPUs


def test_a_hopper_instance_takes_its_gpu_instances_gpm_graphics_activity() -> None:
    spec = yaml.safe_load(H100_MIG.read_text())["devices"][0]
    body, page = _served(H100_MIG)
    card = next(g for g in body["gpus"] if g["instances"])
    by_gi = {m["gpu_instance_id"]: m["gpm"]["graphics_active"] for m in spec["mig_devices"] if "gpm" in m}
    assert by_gi and card["instances"]
    for inst in card["instances"]:
        assert inst["utilization_source"] == "gpm"
        assert inst["utilization_percent"] == pytest.approx(100 * by_gi[inst["mig"]["gpu_instance_id"]])
    assert "utilisation not available" not in page


def test_a_lost_gpu_is_lost_not_without_utilisation() -> None:
    from exporter.exposition.health_notes import utilization_note

    assert utilization_note({"utilization_source": "unavailable", "state": "up"})
    assert utilization_note({"utilization_source": "unavailable", "state": "lost"}) is None
    assert utilization_note({"state": "up"}) is None  # an older exporter's entry: unknown, no claim


def test_top_prometheus_has_a_table_for_allocations_of_unknown_use() -> None:
    from dataclasses import fields

    from exporter.top.app import ClusterApp
    from exporter.top.prom import ClusterView

    assert "unknown" in ClusterApp.TABLES and set(ClusterApp.TABLES) <= {f.name for f in fields(ClusterView)}
