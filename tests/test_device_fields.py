"""The device field table (exporter/exposition/device_fields.py): consistent with the model, dcgm-exporter's
CSV and the docs, whose generated section it writes.

scripts/generate.sh rewrites the generated tables of docs/metrics.md (exporter/shell/generate.py lists them)
after a change of the table; ``UPDATE_DOCS=1 .venv/bin/python -m pytest tests/test_device_fields.py`` the fake
NVML's key table of docs/testing.md.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from pathlib import Path

import pytest

from exporter.exposition.device_fields import DEVICE_FIELDS
from exporter.model import DeviceHealth, DeviceSample, GpmSample
from exporter.shell.generate import METRICS_TABLES, section_pattern
from tests.test_dcgm_compat import csv_fields

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "metrics.md"
GOLDEN = ROOT / "tests" / "golden" / "families.txt"
TESTING_DOC = ROOT / "docs" / "testing.md"


@pytest.mark.parametrize("section", sorted(METRICS_TABLES))
def test_docs_tables_are_generated_from_the_table(section: str) -> None:
    m = section_pattern(section).search(DOC.read_text())
    assert m, f"docs/metrics.md lost its generated {section} table (BEGIN/END markers)"
    assert m.group(2) == METRICS_TABLES[section](), "stale: run scripts/generate.sh"


def test_fake_keys_of_the_testing_docs_are_generated() -> None:
    """docs/testing.md's table of the fake NVML's integer health keys follows the table (UPDATE_DOCS=1 rewrites)."""
    from tests.fake_nvml.health_config import keys_markdown

    pattern = re.compile(r"(<!-- BEGIN generated from tests/fake_nvml/health_config.py: keys [^\n]*-->\n)(.*?)"
                         r"(<!-- END generated -->)", re.S)
    text = TESTING_DOC.read_text()
    m = pattern.search(text)
    assert m, "docs/testing.md lost its generated keys table (BEGIN/END markers)"
    if os.environ.get("UPDATE_DOCS"):
        TESTING_DOC.write_text(text[:m.start(2)] + keys_markdown() + text[m.end(2):])
        m = pattern.search(TESTING_DOC.read_text())
        assert m
    assert m.group(2) == keys_markdown(), "stale: rerun with UPDATE_DOCS=1 (see this module's docstring)"

def test_every_field_names_a_model_value() -> None:
    model = {"": {f.name for f in fields(DeviceSample)}, "health": {f.name for f in fields(DeviceHealth)},
             "gpm": {f.name for f in fields(GpmSample)}}
    for f in DEVICE_FIELDS:
        where, _, name = f.attr.rpartition(".")
        assert name in model[where], f"{f.attr}: no such model field"
        assert f.group in ("rows", "device", "health", "gpm"), f.group
        assert f.kind in ("gauge", "counter") and all(d.kind in ("gauge", "counter") for d in f.dcgm)
    assert len({f.attr for f in DEVICE_FIELDS}) == len(DEVICE_FIELDS)


def test_names_are_unique_and_served() -> None:
    families = [f.family for f in DEVICE_FIELDS if f.family]
    dcgm = [d.name for f in DEVICE_FIELDS for d in f.dcgm]
    status = [f.status for f in DEVICE_FIELDS if f.status]
    for names in (families, dcgm, status):
        assert len(set(names)) == len(names)
    served = {line.split(" ")[0] for line in GOLDEN.read_text().splitlines() if not line.startswith("#")}
    for f in DEVICE_FIELDS:
        if f.family:
            assert (f.family + "_total" if f.kind == "counter" else f.family) in served, f.family
    assert set(dcgm) <= served


def test_dcgm_types_are_dcgm_exporters() -> None:
    """A DCGM field of dcgm-exporter's CSV (its default set or its commented rows) has the CSV's type; the
    others (FB_TOTAL, PSTATE, ...) come from its other sources (tests/data/dcgm/SOURCE.md)."""
    csv = csv_fields(include_commented=True)
    wrong = [(d.name, d.kind, csv[d.name]) for f in DEVICE_FIELDS for d in f.dcgm
             if d.name in csv and csv[d.name] != d.kind]
    assert not wrong


def test_native_families_carry_help_and_docs() -> None:
    for f in DEVICE_FIELDS:
        if f.family:
            assert f.help and f.unit and f.nvml, f.family



def test_direct_reads_name_pynvml_calls_and_constants() -> None:
    """A field's ``read`` drives the fake's readers and the real-GPU check: a typo fails here, not on a GPU."""
    import pynvml

    from exporter.node.nvml.direct import parse_read

    reads = [f for f in DEVICE_FIELDS if f.read]
    assert reads, "no field declares its direct read"
    for f in reads:
        call, args, _ = parse_read(f.read)
        assert callable(getattr(pynvml, call, None)), f"{f.attr}: pynvml has no {call}"
        assert all(isinstance(getattr(pynvml, a, None), int) for a in args), f"{f.attr}: {args}"
    with pytest.raises(ValueError):
        parse_read("nvmlDeviceGetFanSpeed(")

def test_one_table_line_serves_every_output() -> None:
    """The power-limit violation time (one line of the table, read by health.py, a scenario key): native
    family, DCGM field, /status.json key and top column, from tests/scenarios/dcgm_node.yaml (2.5 s)."""
    import json

    from exporter.exposition.status import status_json, status_view
    from exporter.shell.cli import build_daemon
    from exporter.shell.config import load_config
    from exporter.top.rows import GPU_COLUMNS, build_view

    daemon = build_daemon(load_config(["--simulate", str(ROOT / "tests" / "scenarios" / "dcgm_node.yaml"),
                                       "--dcgm-compat", "--no-xid"], environ={}))
    try:
        snapshot, _ = daemon.pipeline.step()
    finally:
        daemon.close()
    body = snapshot.body.decode()
    uuid = "GPU-dc600000-0000-4000-8000-000000000000"
    assert re.search(rf'^nvidia_gpu_power_violation_seconds_total\{{[^}}]*uuid="{uuid}"[^}}]*\}} 2\.5$', body, re.M)
    assert re.search(rf'^DCGM_FI_DEV_POWER_VIOLATION\{{[^}}]*UUID="{uuid}"[^}}]*\}} 2\.5e\+09$', body, re.M)
    assert body.count("DCGM_FI_DEV_POWER_VIOLATION{") == 1  # the other GPUs' drivers answered nothing
    view = json.loads(status_json(status_view(snapshot.status, snapshot.sample_failures_total, 0.0, True)))
    gpu = next(g for g in view["gpus"] if g["uuid"] == uuid)
    assert gpu["power_capped_seconds"] == 2.5
    row = next(r for r in build_view(view).gpus if r[0] == str(gpu["index"]))
    assert row[GPU_COLUMNS.index("Power capped s")] == "2.5"
