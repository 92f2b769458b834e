"""The device field table (exporter/exposition/device_fields.py): consistent with the model, dcgm-exporter's
CSV and the docs, whose generated section it writes.

``UPDATE_DOCS=1 .venv/bin/python -m pytest tests/test_device_fields.py`` rewrites the generated table of
docs/metrics.md after a change of the table.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from pathlib import Path

import pytest

from exporter.exposition.device_fields import DEVICE_FIELDS, DOC_SECTIONS, fields_markdown
from exporter.model import DeviceHealth, DeviceSample, GpmSample
from tests.test_dcgm_compat import csv_fields

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "metrics.md"
GOLDEN = ROOT / "tests" / "golden" / "families.txt"


def generated(section: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- BEGIN generated from exporter/exposition/device_fields.py: {section} [^\n]*-->\n)(.*?)"
                      r"(<!-- END generated -->)", re.S)


@pytest.mark.parametrize("section", sorted(DOC_SECTIONS))
def test_docs_tables_are_generated_from_the_table(section: str) -> None:
    text = DOC.read_text()
    m = generated(section).search(text)
    assert m, f"docs/metrics.md lost its generated {section} table (BEGIN/END markers)"
    if os.environ.get("UPDATE_DOCS"):
        text = text[:m.start(2)] + fields_markdown(section) + text[m.end(2):]
        DOC.write_text(text)
        m = generated(section).search(text)
        assert m
    assert m.group(2) == fields_markdown(section), "stale: rerun with UPDATE_DOCS=1 (see this module's docstring)"


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
