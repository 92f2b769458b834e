"""The panels the dashboards are built from: typed, frozen, each rendering its Grafana JSON.

Grafana 10/11 core panels only (time series, stat, gauge, bar gauge, table). A panel knows its
size on the 24-column grid (``w``, ``h``); :mod:`.board` places it. Every panel and query reads
the ``$datasource`` variable. Options Grafana would default anyway are still written out, so the
JSON means the same in every Grafana version that imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

Json = dict[str, Any]
# Threshold steps, lowest first: (value the colour starts at, None for the base colour; colour).
Steps = Sequence[tuple[float | None, str]]

DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
# Grafana unit ids the dashboards use (tests check every panel against this list).
UNITS: frozenset[str] = frozenset({"percent", "bytes", "mwatt", "celsius", "short", "none", "dateTimeFromNow", "s"})
# the hardware-health rows': counts and bytes per second, watts, joules
UNITS |= {"cps", "Bps", "watt", "joule"}

GREEN: Steps = ((None, "green"),)
RED_FROM_ONE: Steps = ((None, "green"), (1, "red"))
BUSY: Steps = ((None, "green"), (80, "orange"), (95, "red"))  # the gauges' default: nearly full


def ref_id(i: int) -> str:
    """Grafana's query letter of the ``i``-th target (A, B, ...); table columns are named after it."""
    return chr(ord("A") + i)


@dataclass(frozen=True)
class Target:
    """One PromQL query; an empty ``legend`` lets Grafana name the series (``__auto``)."""

    expr: str
    legend: str = ""

    def to_json(self, i: int, *, instant: bool = False, table: bool = False) -> Json:
        out: Json = {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "range": not instant,
            "instant": instant,
            "refId": ref_id(i),
        }
        if table:
            out["format"] = "table"
        return out


def _targets(targets: Sequence[Target], *, instant: bool = False, table: bool = False) -> list[Json]:
    return [t.to_json(i, instant=instant, table=table) for i, t in enumerate(targets)]


def _thresholds(steps: Steps) -> Json:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def _last_value() -> Json:
    # stat, gauge and bar gauge show the latest value of each series
    return {"calcs": ["lastNotNull"], "fields": "", "values": False}


def _optional(**values: float | None) -> Json:
    """The keyword arguments that are set (min, max, decimals Grafana would otherwise compute)."""
    return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Panel:
    """What every panel has: a title, a description (the panel's tooltip) and its grid size.

    ``no_value`` is what the panel says instead of Grafana's "No data" when its queries return
    nothing: why that is normal (no shared GPU, no Xid since the exporter started).
    """

    title: str
    description: str
    _: KW_ONLY
    w: int
    h: int
    no_value: str | None = None

    def to_json(self) -> Json:
        raise NotImplementedError

    def _json(
        self, kind: str, unit: str, targets: list[Json], options: Json, defaults: Mapping[str, Any] | None = None
    ) -> Json:
        if self.no_value is not None:
            defaults = {**(defaults or {}), "noValue": self.no_value}
        return {
            "type": kind,
            "title": self.title,
            "description": self.description,
            "datasource": dict(DATASOURCE),
            "fieldConfig": {"defaults": {"unit": unit, **(defaults or {})}, "overrides": []},
            "options": options,
            "targets": targets,
        }


@dataclass(frozen=True)
class TimeSeries(Panel):
    """Lines over time, legend as a table with the last and highest value; ``stack`` stacks them."""

    unit: str
    targets: Sequence[Target]
    _: KW_ONLY
    minimum: float | None = 0  # usage never goes below 0: keep the axis anchored there
    maximum: float | None = None
    stack: bool = False

    def to_json(self) -> Json:
        custom: Json = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,  # a gap is a missed scrape or a gone container: show it
            "stacking": {"mode": "normal" if self.stack else "none", "group": "A"},
        }
        defaults = {"custom": custom, "color": {"mode": "palette-classic"}}
        options = {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
                "calcs": ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
        defaults |= _optional(min=self.minimum, max=self.maximum)
        return self._json("timeseries", self.unit, _targets(self.targets), options, defaults)


@dataclass(frozen=True)
class Stat(Panel):
    """The latest value, coloured by ``steps``, with a sparkline; ``texts`` shows values as words (1: "up")."""

    unit: str
    targets: Sequence[Target]
    _: KW_ONLY
    steps: Steps = GREEN
    decimals: int | None = None
    texts: Sequence[tuple[int, str]] = ()

    def to_json(self) -> Json:
        defaults: Json = {"thresholds": _thresholds(self.steps), "color": {"mode": "thresholds"}}
        if self.texts:
            options = {str(v): {"text": text, "index": i} for i, (v, text) in enumerate(self.texts)}
            defaults["mappings"] = [{"type": "value", "options": options}]
        options = {
            "reduceOptions": _last_value(),
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        }
        defaults |= _optional(decimals=self.decimals)
        return self._json("stat", self.unit, _targets(self.targets), options, defaults)


@dataclass(frozen=True)
class Gauge(Panel):
    """A 0-100 % gauge of the latest (instant) value, coloured by ``steps``."""

    targets: Sequence[Target]
    _: KW_ONLY
    steps: Steps = BUSY

    def to_json(self) -> Json:
        defaults = {"min": 0, "max": 100, "thresholds": _thresholds(self.steps), "color": {"mode": "thresholds"}}
        options = {"reduceOptions": _last_value(), "showThresholdLabels": False, "showThresholdMarkers": True}
        return self._json("gauge", "percent", _targets(self.targets, instant=True), options, defaults)


@dataclass(frozen=True)
class BarGauge(Panel):
    """Horizontal bars, one per series (instant), green to red along the scale."""

    unit: str
    targets: Sequence[Target]
    _: KW_ONLY
    maximum: float | None = None

    def to_json(self) -> Json:
        defaults = {"min": 0, "thresholds": _thresholds(GREEN), "color": {"mode": "continuous-GrYlRd"}}
        options = {
            "reduceOptions": _last_value(),
            "displayMode": "gradient",
            "orientation": "horizontal",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
        }
        defaults |= _optional(max=self.maximum)
        return self._json("bargauge", self.unit, _targets(self.targets, instant=True), options, defaults)


@dataclass(frozen=True)
class Column:
    """One table column: an instant query, its header and unit."""

    expr: str
    header: str
    unit: str


@dataclass(frozen=True)
class Table(Panel):
    """An instant table: one row per label set, the ``labels`` (label, header) first, then one column per query.

    Every column's expr must return the same label set (aggregate ``by`` exactly ``labels``) so the
    queries' rows merge into one.
    """

    labels: Sequence[tuple[str, str]]
    columns: Sequence[Column]

    def to_json(self) -> Json:
        targets = _targets([Target(c.expr) for c in self.columns], instant=True, table=True)
        options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
        panel = self._json("table", "short", targets, options, {"custom": {"align": "auto", "filterable": True}})
        rename = dict(self.labels)
        order = {label: i for i, (label, _) in enumerate(self.labels)}
        overrides = []
        for i, column in enumerate(self.columns):
            value = f"Value #{ref_id(i)}"  # what Grafana names query i's value after the merge
            rename[value] = column.header
            order[value] = len(self.labels) + i
            overrides.append(
                {"matcher": {"id": "byName", "options": value}, "properties": [{"id": "unit", "value": column.unit}]}
            )
        panel["fieldConfig"]["overrides"] = overrides
        panel["transformations"] = [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "indexByName": order, "renameByName": rename},
            },
        ]
        return panel
