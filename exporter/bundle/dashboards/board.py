"""A dashboard: rows of panels placed on Grafana's grid, its variables, and the JSON model around them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter.bundle.dashboards.panels import DATASOURCE, Json, Panel

SCHEMA_VERSION = 39  # Grafana 10.4 / 11
GRID_COLUMNS = 24


@dataclass(frozen=True)
class Row:
    """A row header and the panels under it, laid out left to right."""

    title: str
    panels: Sequence[Panel]


@dataclass(frozen=True)
class QueryVariable:
    """A ``label_values()`` variable, refreshed when the time range changes; ``multi`` also offers All."""

    name: str
    label: str
    query: str
    multi: bool = False

    def to_json(self) -> Json:
        return {
            "type": "query",
            "name": self.name,
            "label": self.label,
            "datasource": dict(DATASOURCE),
            "definition": self.query,
            "query": self.query,
            "current": {},
            "hide": 0,
            "includeAll": self.multi,
            "multi": self.multi,
            "options": [],
            "refresh": 2,  # on time range change: a new node or pod shows up without a reload
            "regex": "",
            "sort": 1,
        }


def datasource_variable() -> Json:
    """The ``datasource`` variable every panel and variable query reads: any Prometheus data source."""
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
    }


@dataclass(frozen=True)
class Board:
    """What a board module writes: its title, what it shows, its variables and rows."""

    title: str
    description: str
    variables: Sequence[QueryVariable]
    rows: Sequence[Row]


def layout(rows: Sequence[Row]) -> list[Json]:
    """The panels' JSON with ids and grid positions: each row on a new line, its panels left to right, wrapping."""
    out: list[Json] = []
    x = y = line_h = 0
    for row in rows:
        y, x, line_h = y + line_h, 0, 0
        out.append(
            {
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "panels": [],
                "gridPos": _pos(GRID_COLUMNS, 1, 0, y),
            }
        )
        y += 1
        for panel in row.panels:
            if x + panel.w > GRID_COLUMNS:
                y, x, line_h = y + line_h, 0, 0
            out.append({**panel.to_json(), "gridPos": _pos(panel.w, panel.h, x, y)})
            x += panel.w
            line_h = max(line_h, panel.h)
    # ids in reading order; Grafana only needs them unique
    return [{"id": i, **p} for i, p in enumerate(out, start=1)]


def _pos(w: int, h: int, x: int, y: int) -> Json:
    return {"h": h, "w": w, "x": x, "y": y}


@dataclass(frozen=True)
class Dashboard:
    """The dashboard model around a :class:`Board`, with the settings of one rendering."""

    board: Board
    uid: str
    title: str
    description: str
    tags: Sequence[str]
    refresh: str
    time_from: str
    leading_variables: Sequence[QueryVariable] = ()  # before the board's own (the cluster selector)

    def to_json(self) -> Json:
        variables = [datasource_variable(), *(v.to_json() for v in (*self.leading_variables, *self.board.variables))]
        return {
            "annotations": {"list": [_annotations()]},
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,  # shared crosshair: line up a spike across panels
            "id": None,
            "links": [self._link()],
            "panels": layout(self.board.rows),
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": variables},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "browser",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            "weekStart": "",
        }

    def _link(self) -> Json:
        # a drop-down of the dashboards sharing the first tag, keeping time range and variables
        return {
            "title": "GPU dashboards",
            "type": "dashboards",
            "tags": [self.tags[0]],
            "asDropdown": True,
            "includeVars": True,
            "keepTime": True,
            "icon": "external link",
            "targetBlank": False,
            "tooltip": "",
            "url": "",
        }


def _annotations() -> Json:
    # Grafana's built-in annotations (alerts and dashboard annotations), as Grafana writes them itself
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
