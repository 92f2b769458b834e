"""Options and thresholds declared once (exporter/bundle/option_table.py: the label flags' LABEL_OPTIONS, the
rules' RULE_OPTIONS, the alerts' ALERT_OPTIONS, the dashboards' DASHBOARD_OPTIONS).

Changing an entry's value changes every place that shows it (the expression or the text of the
alerts it names, its docs row, the flag's default) and nothing else; every flag of every generator is
an entry, whose --help, parsed value, header argument and docs row come from it.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from exporter.bundle import rules_cli
from exporter.bundle.alerts import cli as alerts_cli
from exporter.bundle.alerts.cli import build_alerts, render_alerts
from exporter.bundle.alerts.options import ALERT_OPTIONS, ALERT_TABLE, AlertOptions
from exporter.bundle.common import LABEL_OPTIONS
from exporter.bundle.dashboards import cli as dashboards_cli
from exporter.bundle.dashboards.options import DASHBOARD_OPTIONS, DASHBOARD_TABLE
from exporter.bundle.dashboards.render import render_dashboards
from exporter.bundle.option_table import Option, docs_row, splice_rows
from exporter.bundle.rules import RULE_OPTIONS, RULE_TABLE, render_rules
from exporter.shell.generate import OPTION_ROWS

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


# ------------------------------------------------------------------ every generator's table

GENERATORS: dict[str, tuple[tuple[Option, ...], ModuleType, Callable[[Any], str]]] = {
    "rules": (RULE_TABLE, rules_cli, render_rules),
    "alerts": (ALERT_TABLE, alerts_cli, render_alerts),
    "dashboards": (DASHBOARD_TABLE, dashboards_cli, lambda o: "".join(render_dashboards(o).values())),
}
# A value other than the default for the flag of every entry (None: a switch).
SAMPLES: dict[str, str | None] = {
    "pod_label": "p", "namespace_label": "ns", "container_label": "c", "node_label": "n", "cluster_label": "cl",
    "interval": "1m", "rate_window": "10m", "levels": "pod,node",
    "instance_label": "inst", "exporter_selector": 'job="gpu"', "runbook_url": "https://example.com/runbook",
    "xid_window": "1h", "critical_xids": "46,48", "application_xids": "13", "temperature_celsius": "70",
    "idle_for": "3h", "retired_pages_limit": "61", "pcie_replays_per_minute": "9", "throttling_for": "1h",
    "power_capped_for": "2h", "nvlink_crc_errors_per_second": "5", "recording_rules_alert": None,
    "extra_labels": "team=ml",
    "uid_prefix": "ab", "title_prefix": "X ", "tags": "team", "refresh": "1m", "time_from": "now-1d",
}
FLAGGED = [(cmd, o) for cmd, (table, _, _) in GENERATORS.items() for o in table if o.flag is not None]


def test_the_tables_are_each_generator_s_options() -> None:
    """Each table is the label flags, then the generator's own entries; every flag has a sample below."""
    for table, own in ((RULE_TABLE, RULE_OPTIONS), (ALERT_TABLE, ALERT_OPTIONS), (DASHBOARD_TABLE, DASHBOARD_OPTIONS)):
        assert [o.attr for o in table] == [*(o.attr for o in LABEL_OPTIONS), *(o.attr for o in own)]
    assert {o.attr for _, o in FLAGGED} == set(SAMPLES)


def _body(text: str) -> list[str]:
    return [line for line in text.splitlines() if "Generated by" not in line]  # all but the command line


@pytest.mark.parametrize(("cmd", "entry"), FLAGGED, ids=lambda x: x if isinstance(x, str) else x.flag)
def test_every_flag_is_its_entry(cmd: str, entry: Option) -> None:
    """--help, default, parsed value, the rendering's header argument: all from the entry."""
    _, cli, render = GENERATORS[cmd]
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.dest == entry.attr)
    assert action.option_strings == [entry.flag] and action.help == entry.help
    sample = SAMPLES[entry.attr]
    arg = entry.flag if sample is None else f"{entry.flag}={sample}"
    opts = cli.options_from_args(parser.parse_args([arg]))
    default = type(opts)()
    assert getattr(default, entry.attr) == (entry.factory() if entry.factory else entry.default)
    assert getattr(opts, entry.attr) != getattr(default, entry.attr)
    assert opts.to_args() == [arg]
    out = render(opts)
    assert f"kube-gpu-exporter {cmd} {shlex.quote(arg)}`" in out or f"kube-gpu-exporter {cmd} {arg}`" in out
    assert _body(out) != _body(render(default)), "the value shows nowhere but in the command line"


@pytest.mark.parametrize("doc", sorted(OPTION_ROWS))
def test_every_docs_row_is_its_entry(doc: str) -> None:
    """The doc is fresh, and changing one entry's meaning changes its row there and nothing else."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    table = OPTION_ROWS[doc]
    assert splice_rows(text, table) == text
    for i, o in enumerate(table):
        if o.flag is None:
            continue
        moved = (*table[:i], dataclasses.replace(o, doc="CHANGED"), *table[i + 1:])
        diff = [(a, b) for a, b in zip(text.split("\n"), splice_rows(text, moved).split("\n"), strict=True) if a != b]
        assert diff == [(docs_row(o), docs_row(moved[i]))], (doc, o.flag)
        assert diff[0][1].endswith("| CHANGED |")
