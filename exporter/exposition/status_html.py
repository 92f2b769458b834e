"""The status page (``/``): :func:`render_html` turns a status view (exporter/exposition/status.py) into HTML.

Self-contained (inline CSS, no scripts, no external assets), light and dark by
``prefers-color-scheme``, reloads itself every few seconds. Every value goes through
:func:`html.escape`: pod names, namespaces and the rest come from the API and are hostile input.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.exposition.device_fields import COLUMNS
from exporter.exposition.health_notes import health_notes

REFRESH_SECONDS = 5

CSS = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--mute:#5b636e;--line:#d8dde3;--head:#f3f5f7;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mute:#8d96a0;--line:#30363d;
--head:#161b22;--ok:#3fb950;--bad:#f85149;--warn:#d29922}}
body{background:var(--bg);color:var(--fg);font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.2em 0 .3em}
h3{font-size:1em;margin:.8em 0 .2em;color:var(--mute)}
a{color:inherit}nav,.mute{color:var(--mute)}
table{border-collapse:collapse;margin:.2em 0 .6em;min-width:40em}
th,td{border:1px solid var(--line);padding:.2em .55em;text-align:left;vertical-align:top}
th{background:var(--head);font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:var(--ok);font-weight:600}.bad{color:var(--bad);font-weight:600}.warn{color:var(--warn)}
section.gpu{border-left:3px solid var(--line);padding-left:.8em;margin:.8em 0}
section.mig{margin-left:1.5em}code{font-size:.92em}td.n,code{white-space:nowrap}
"""

GIB = 1024 ** 3


def esc(value: Any) -> str:
    """``value`` as escaped text (an en dash for unknown)."""
    if value is None:
        return "&ndash;"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        value = f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    return html.escape(str(value), quote=True)


def _gib(n: int | None) -> str:
    return "&ndash;" if n is None else f"{n / GIB:.1f}&nbsp;GiB"


def _pct(v: float | None) -> str:
    return "&ndash;" if v is None else f"{esc(float(v))}&nbsp;%"


def _flag(good: bool, yes: str, no: str) -> str:
    return f'<span class="ok">{esc(yes)}</span>' if good else f'<span class="bad">{esc(no)}</span>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int] = frozenset()) -> str:
    """A table of pre-escaped cells (``numeric``: column indexes aligned right)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _subsystems(view: Mapping[str, Any]) -> str:
    sub = view["subsystems"]
    nvml, pods, sampler = sub["nvml"], sub["pod_cache"], sub["sampler"]
    errors = ", ".join(f"{esc(e['call'])}: {esc(e['error'])} &times;{esc(e['count'])}" for e in nvml["errors"])
    rows = [
        ["NVML", _flag(nvml["up"], "up", "down"), f"driver {esc(nvml['driver_version'] or None)}"
         + (f"; errors: {errors}" if errors else "")],
        ["Pod cache", _flag(pods["synced"], "synced", "not synced"),
         f"age {esc(pods['age_seconds'])}&nbsp;s; sync errors {esc(pods['sync_errors'])}"],
        ["Snapshot", _flag(view["ready"], "ready", "not ready"),
         f"age {esc(view['snapshot_age_seconds'])}&nbsp;s; samples {esc(sampler['samples_total'])}; "
         f"cycle {esc(sampler['cycle_seconds'])}&nbsp;s"],
        ["Sample failures", _flag(not sampler["sample_failures_total"], "none", "failing"),
         f"{esc(sampler['sample_failures_total'])} since start"],
    ]
    skips = ", ".join(f"{esc(k)}&nbsp;{esc(v)}" for k, v in sub["skips"].items())
    rows.append(["Skips", _flag(True, "ok", "") if not skips else '<span class="warn">some</span>',
                 skips or "none"])
    return "<h2>Subsystems</h2>" + _table(["Subsystem", "State", "Details"], rows)


def _gpu_row(g: Mapping[str, Any]) -> list[str]:
    power = esc(g["power_watts"]) + "&nbsp;W" if g["power_watts"] is not None else "&ndash;"
    if g["power_limit_watts"] is not None:
        power += f" / {esc(g['power_limit_watts'])}&nbsp;W"
    temp = esc(g["temperature_celsius"]) + "&nbsp;&deg;C" if g["temperature_celsius"] is not None else "&ndash;"
    energy = "&ndash;" if g.get("energy_joules") is None else f"{g['energy_joules'] / 3.6e6:.2f}&nbsp;kWh"
    return [
        f"<code>{esc(g['uuid'])}</code>", esc(g["model"]), esc(g["minor"]),
        _flag(g["state"] == "up", "up", "lost"), esc(g["allocate_mode"]), _pct(g["utilization_percent"]),
        f"{_gib(g['memory_used_bytes'])} / {_gib(g['memory_total_bytes'])}", power, temp, energy,
        *(esc(g.get(f.status)) for f in COLUMNS), _health(g),
    ]


# the device field table's columns (exporter/exposition/device_fields.py) go before Health
GPU_HEADERS = ("UUID", "Model", "Minor", "State", "Mode", "Util", "Memory", "Power", "Temp", "Energy",
               *(f.column for f in COLUMNS), "Health")
_NUMERIC = frozenset(range(5, 10 + len(COLUMNS)))


def _health(g: Mapping[str, Any]) -> str:
    """Row remapping that needs an operator (reset, replace), then the clocks event reasons active."""
    notes = health_notes(g)
    if notes is None:
        return "&ndash;"  # NVML told nothing
    parts = [f'<span class="bad">{esc(text)}</span>' if bad else esc(text) for text, bad in notes]
    return "; ".join(parts) or '<span class="ok">ok</span>'


def _containers(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return '<p class="mute">No container holds or uses it.</p>'
    cells = []
    for c in rows:
        grant, use = c["grant"] or {}, c["use"] or {}
        cells.append([esc(c["namespace"]), esc(c["pod"]), esc(c["container"]), esc(c["allocate_mode"]),
                      esc(c["scheme"]), _pct(grant.get("compute_percent")), _gib(grant.get("memory_bytes")),
                      _pct(use.get("sm_percent")), _gib(use.get("memory_bytes"))])
    return _table(["Namespace", "Pod", "Container", "Mode", "Scheme", "Grant SM", "Grant memory",
                   "Use SM", "Use memory"], cells, frozenset({5, 6, 7, 8}))


def _unaccounted(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return ""
    cells = [[esc(p["pid"]), _gib(p["memory_bytes"]), _pct(p["sm_percent"]),
              esc(f"{p['namespace']}/{p['pod']}" if p["pod"] else "host"), esc(p["container"])] for p in rows]
    return "<h3>Unaccounted processes</h3>" + _table(["PID", "Memory", "SM", "Pod", "Container"], cells,
                                                      frozenset({0, 1, 2}))


def _xids(rows: Sequence[Mapping[str, Any]], last: float | None) -> str:
    if not rows:
        return ""
    cells = [[esc(x["xid"]), esc(x["count"]), esc(x.get("meaning")), esc(x.get("severity")), esc(x.get("action"))]
             for x in rows]
    when = f' <span class="mute">(last at unix {esc(last)})</span>' if last is not None else ""
    return f"<h3>Xid errors{when}</h3>" + _table(["Xid", "Count", "Meaning", "Severity", "Action"], cells,
                                                  frozenset({0, 1}))


def _device(g: Mapping[str, Any], mig: bool = False) -> str:
    title = f"MIG {esc(g['mig']['profile'])} (GI {esc(g['mig']['gpu_instance_id'])})" if mig else (
        f"GPU {esc(g['minor'])}: {esc(g['model'])}")
    parts = [f'<section class="{"gpu mig" if mig else "gpu"}"><h2>{title}</h2>',
             _table(GPU_HEADERS, [_gpu_row(g)], _NUMERIC),
             _containers(g["containers"]) if g["containers"] or not g.get("instances") else "",
             _unaccounted(g["unaccounted"]), _xids(g["xids"], g["last_xid_at"])]
    parts += [_device(i, mig=True) for i in g.get("instances", ())]
    return "".join(parts) + "</section>"


def _others(view: Mapping[str, Any]) -> str:
    out = []
    if view["unplaced"]:
        out.append("<h2>Allocations on a GPU not known yet</h2>" + _containers(view["unplaced"]))
    if view["other_xids"]:
        cells = [[f"<code>{esc(x['uuid'] or None)}</code>", esc(x["xid"]), esc(x["count"]), esc(x.get("meaning"))]
                 for x in view["other_xids"]]
        out.append("<h2>Xids of no GPU listed</h2>" + _table(["UUID", "Xid", "Count", "Meaning"], cells))
    if view["disagreements"]:
        cells = [[esc(k), esc(v)] for k, v in view["disagreements"].items()]
        out.append("<h2>Allocation disagreements</h2>" + _table(["Scheme", "Containers"], cells))
    return "".join(out)


def render_html(view: Mapping[str, Any]) -> bytes:
    """The whole page for ``view`` (see :func:`exporter.exposition.status.status_view`)."""
    nav = ('<nav><a href="/metrics">Metrics</a> &middot; <a href="/status.json">status.json</a> &middot; '
           '<a href="/healthz">Health</a> &middot; <a href="/readyz">Ready</a></nav>')
    if view["subsystems"] is None:
        body = '<p class="bad">No snapshot yet: the first sampling cycle has not completed.</p>'
        title = "kube-gpu-exporter"
    else:
        title = f"kube-gpu-exporter on {esc(view['node'])}"
        gpus = "".join(_device(g) for g in view["gpus"]) or '<p class="mute">No GPU on this node.</p>'
        body = _subsystems(view) + gpus + _others(view)
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{title}</title><style>{CSS}</style></head><body><h1>{title}</h1>{nav}{body}"
            f'<p class="mute">Refreshes every {REFRESH_SECONDS}&nbsp;s.</p></body></html>')
    return page.encode()
