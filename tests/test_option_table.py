"""Options and thresholds declared once (exporter/bundle/option_table.py, the alerts' ALERT_OPTIONS).

Changing an entry's value changes every place that shows it (the expression or the text of the
alerts it names, its docs row, the flag's default) and nothing else.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from exporter.bundle.alerts import cli as alerts_cli
from exporter.bundle.alerts.cli import build_alerts
from exporter.bundle.alerts.options import ALERT_OPTIONS, AlertOptions
from exporter.bundle.option_table import Option, docs_row, splice_rows

ROOT = Path(__file__).resolve().parents[1]


def _bumped(value: object) -> tuple[object, list[str]]:
    """Another value of the same kind, and the texts an alert showing it may carry."""
    if isinstance(value, bool):
        raise TypeError("a switch, not a threshold")
    if isinstance(value, int | float):
        new = value + 1
        return new, [f"{new:g}", f"{new * 300:g}"]  # 300: a per-second limit shown over a 5m window
    if isinstance(value, str) and (m := re.fullmatch(r"(\d+)([smhd])", value)):
        n = int(m.group(1)) + 1
        unit = {"s": "second", "m": "minute", "h": "hour", "d": "day"}[m.group(2)]
        return f"{n}{m.group(2)}", [f"{n}{m.group(2)}", f"{n} {unit}s"]
    raise TypeError(value)


THRESHOLDS = [o for o in ALERT_OPTIONS if o.alerts and not isinstance(o.default, bool | tuple)
              and re.fullmatch(r"[\d.]+|\d+[smhd]", str(o.default))]


def _alerts(opts: AlertOptions) -> dict[str, tuple[str, str, str, str]]:
    return {a.name: (a.expr, a.for_, a.summary, a.description) for a in build_alerts(opts)}


def test_the_table_holds_the_thresholds() -> None:
    names = {o.attr for o in THRESHOLDS}
    assert {"temperature_celsius", "retired_pages_limit", "nvlink_crc_errors_per_second", "idle_for",
            "temperature_for", "snapshot_stale_seconds", "idle_percent"} <= names
    assert len(THRESHOLDS) >= 15


@pytest.mark.parametrize("entry", THRESHOLDS, ids=lambda o: o.attr)
def test_a_threshold_is_one_edit(entry: Option) -> None:
    default = AlertOptions()
    assert getattr(default, entry.attr) == entry.default  # the dataclass's default is the entry's
    new, texts = _bumped(entry.default)
    before, after = _alerts(default), _alerts(dataclasses.replace(default, **{entry.attr: new}))
    changed = {name for name in before if before[name] != after[name]}
    assert changed == set(entry.alerts), "the value shows in other alerts than the entry names, or in none"
    for name in changed:
        shown = " ".join(after[name])
        assert any(t in shown for t in texts), (name, texts, shown)
    if entry.flag is None:
        return
    moved = dataclasses.replace(entry, default=new)
    old_row, new_row = docs_row(entry), docs_row(moved)
    assert old_row != new_row and old_row.split(" | ")[0] == new_row.split(" | ")[0]
    assert old_row.split(" | ")[2:] == new_row.split(" | ")[2:], "only the default cell changes"
    action = next(a for a in alerts_cli.build_parser()._actions if a.dest == entry.attr)
    assert action.default == entry.default and entry.flag in action.option_strings


def test_docs_rows_are_the_tables() -> None:
    """docs/alerts.md's options rows are written from the entries (scripts/generate.sh)."""
    doc = (ROOT / "docs" / "alerts.md").read_text(encoding="utf-8")
    assert splice_rows(doc, ALERT_OPTIONS) == doc
    moved = tuple(dataclasses.replace(o, default=86.0) if o.attr == "temperature_celsius" else o
                  for o in ALERT_OPTIONS)
    spliced = splice_rows(doc, moved)
    diff = [(a, b) for a, b in zip(doc.split("\n"), spliced.split("\n"), strict=True) if a != b]
    assert diff == [(docs_row(ALERT_OPTIONS[[o.attr for o in ALERT_OPTIONS].index("temperature_celsius")]),
                     "| `--temperature-celsius` | `86` | KubeGpuTemperatureHigh threshold |")]


def test_every_flag_of_the_table_reaches_the_options() -> None:
    """Each entry's flag, parsed, lands in its field (the CLI reads the table, not a second list)."""
    args = alerts_cli.build_parser().parse_args(["--temperature-celsius=70", "--idle-for=3h", "--xid-window=1h",
                                                 "--no-recording-rules-alert", "--alert-label=team=ml"])
    opts = alerts_cli.options_from_args(args)
    assert (opts.temperature_celsius, opts.idle_for, opts.xid_window) == (70.0, "3h", "1h")
    assert opts.recording_rules_alert is False and opts.extra_labels == {"team": "ml"}
    assert opts.to_args() == ["--xid-window=1h", "--temperature-celsius=70", "--idle-for=3h",
                              "--no-recording-rules-alert", "--alert-label=team=ml"]
