"""The status page (``/``): :func:`render_html` turns a status view (exporter/exposition/status.py) into HTML.

The problems come first (a banner: one green line when nothing is wrong), then the subsystems and one
section per GPU, its rows with a problem highlighted. Self-contained (inline CSS, no scripts, no
external assets), light and dark by ``prefers-color-scheme``, reloads itself every few seconds.
Every value goes through :func:`html.escape`: pod names, namespaces and the rest come from the API
and are hostile input.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.exposition.device_fields import COLUMNS
from exporter.exposition.health_notes import health_notes, utilization_note
from exporter.exposition.problems import SEVERITIES, counts, when

REFRESH_SECONDS = 5

CSS = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f24;--mute:#5b636e;--line:#d8dde3;--head:#f3f5f7;
--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--info:#0969da;--badbg:#ffebe9;--warnbg:#fff8c5;--okbg:#dafbe1;
--infobg:#ddf4ff}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mute:#8d96a0;--line:#30363d;
--head:#161b22;--ok:#3fb950;--bad:#f85149;--warn:#d29922;--info:#58a6ff;--badbg:#3c1618;--warnbg:#3a2e05;
--okbg:#0f2e1a;--infobg:#0c2d4b}}
body{background:var(--bg);color:var(--fg);font:14px/1.4 system-ui,sans-serif;margin:1em 1.5em}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.2em 0 .3em}
h3{font-size:1em;margin:.8em 0 .2em;color:var(--mute)}
a{color:inherit}nav,.mute{color:var(--mute)}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.2em 0 .6em}
th,td{border:1px solid var(--line);padding:.2em .55em;text-align:left;vertical-align:top}
th{background:var(--head);font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:var(--ok);font-weight:600}.bad{color:var(--bad);font-weight:600}.warn{color:var(--warn)}
tr.critical td{background:var(--badbg)}tr.warning td{background:var(--warnbg)}tr.info td{background:var(--infobg)}
section.gpu{border-left:3px solid var(--line);padding-left:.8em;margin:.8em 0}
section.gpu.critical{border-left-color:var(--bad)}section.gpu.warning{border-left-color:var(--warn)}
section.mig{margin-left:1.5em}code{font-size:.92em}td.n,code{white-space:nowrap}
#problems{margin:.6em 0 1em;padding:.5em .8em;border-radius:6px;border:1px solid var(--line)}
#problems.ok{background:var(--okbg);border-color:var(--ok)}#problems.warning{background:var(--warnbg);
border-color:var(--warn);font-weight:normal}#problems.critical{background:var(--badbg);border-color:var(--bad);
font-weight:normal}#problems p{margin:0}#problems ul{margin:.3em 0 0;padding-left:1.2em}
#problems li{margin:.15em 0}.sev{font-weight:700;text-transform:uppercase;font-size:.8em;margin-right:.4em}
.sev.critical{color:var(--bad)}.sev.warning{color:var(--warn)}.sev.info{color:var(--info)}
.act{color:var(--mute)}details summary{cursor:pointer}.health{min-width:10em}.nw{white-space:nowrap}
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


def _util(g: Mapping[str, Any]) -> str:
    """The Util cell: NVML's or GPM's percent; where NVML gives this GPU none, say so (unknown, not idle)."""
    note = utilization_note(g)
    return f'<span class="mute" title="{esc(note)}">n/a</span>' if note else _pct(g["utilization_percent"])


def _flag(good: bool, yes: str, no: str) -> str:
    return f'<span class="ok">{esc(yes)}</span>' if good else f'<span class="bad">{esc(no)}</span>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[int] = frozenset(),
           marks: Sequence[str | None] = ()) -> str:
    """A table of pre-escaped cells (``numeric``: column indexes aligned right; ``marks``: each row's
    worst problem severity, which highlights it). Wide tables scroll on their own, not the page."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        (f'<tr class="{marks[j]}">' if j < len(marks) and marks[j] else "<tr>")
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
        + "</tr>" for j, r in enumerate(rows))
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _worst(problems: Sequence[Mapping[str, Any]]) -> str | None:
    return min((p["severity"] for p in problems), key=SEVERITIES.index, default=None)


class _Marks:
    """Which rows of the page a problem is about: a GPU's, a container's, a process's, an Xid's."""

    def __init__(self, problems: Sequence[Mapping[str, Any]]) -> None:
        self.problems = problems

    def gpu(self, uuid: Any) -> str | None:
        return _worst([p for p in self.problems if p["uuid"] == uuid and not p["pod"]
                       and p["kind"] not in ("xid", "gpu_fallen_off_bus", "unaccounted_process")])

    def section(self, g: Mapping[str, Any]) -> str | None:
        uuids = {g["uuid"], *(i["uuid"] for i in g.get("instances", ()))}
        return _worst([p for p in self.problems if p["uuid"] in uuids and p["severity"] != "info"])

    def who(self, uuid: Any, row: Mapping[str, Any], kinds: tuple[str, ...]) -> str | None:
        return _worst([p for p in self.problems if p["uuid"] == uuid and p["kind"] in kinds
                       and (p["namespace"], p["pod"], p["container"]) == (row.get("namespace"), row.get("pod"),
                                                                           row.get("container"))])

    def xid(self, uuid: Any, code: Any) -> str | None:
        return _worst([p for p in self.problems if p["uuid"] == uuid and p.get("xid") == code])


def banner(problems: Sequence[Mapping[str, Any]], node: Any, totals: Mapping[str, int] | None = None,
           more: int = 0) -> str:
    """The problems, worst first, above everything; one green line (notes folded under it) when none matters.

    ``totals``: the problems by severity when ``problems`` lists only the first of them (``more`` left out)."""
    n = dict(totals) if totals else counts(problems)
    items = "".join(f'<li class="{esc(p["severity"])}"><span class="sev {esc(p["severity"])}">'
                    f'{esc(p["severity"])}</span>{esc(p["text"])} <span class="act">&rarr; {esc(p["action"])}'
                    f"</span></li>" for p in problems)
    if more:
        items += (f'<li class="mute">and {esc(more)} more, not listed (<a href="/status.json">status.json</a> '
                  "counts them by severity)</li>")
    notes = f"{n['info']} note{'s' if n['info'] != 1 else ''}"
    if not n["critical"] and not n["warning"]:
        line = f'<span class="ok">&#10003; Nothing wrong on {esc(node)}</span>'
        if not problems:
            return f'<div id="problems" class="ok"><p>{line}</p></div>'
        return (f'<div id="problems" class="ok"><details><summary>{line} <span class="mute">({notes})</span>'
                f"</summary><ul>{items}</ul></details></div>")
    parts = [f"{n['critical']} critical"] if n["critical"] else []
    parts += [f"{n['warning']} warning{'s' if n['warning'] != 1 else ''}"] if n["warning"] else []
    parts += [notes] if n["info"] else []
    worst = "critical" if n["critical"] else "warning"
    return (f'<div id="problems" class="{worst}"><p><strong>{esc(", ".join(parts))}</strong></p>'
            f"<ul>{items}</ul></div>")


def _subsystems(view: Mapping[str, Any]) -> str:
    sub = view["subsystems"]
    nvml, pods, sampler = sub["nvml"], sub["pod_cache"], sub["sampler"]
    errors = ", ".join(f"{esc(e['call'])}: {esc(e['error'])} &times;{esc(e['count'])}" for e in nvml["errors"])
    rows = [
        ["NVML", _flag(nvml["up"], "up", "down"), f"driver {esc(nvml['driver_version'] or None)}"
         + (f"; errors: {errors}" if errors else "")],
        ["Pod cache", _flag(pods["synced"], "synced", "not synced"),
         f"age {esc(pods['age_seconds'])}&nbsp;s; sync errors {esc(pods['sync_errors'])}"],
    ]
    for name, key in (("Pod resources", "pod_resources"), ("Kernel log", "kernel_log")):
        state = sub.get(key) or {}
        ok = state.get("ok")
        flag = '<span class="mute">not in use</span>' if ok is None else _flag(ok, "ok", "degraded")
        rows.append([name, flag, esc(state.get("state"))])
    rows += [
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


def _short_uuid(uuid: Any) -> str:
    """The UUID cut to its first group (``GPU-2c9e3174…``), the whole one on hover."""
    if not isinstance(uuid, str) or len(uuid) <= 14:
        return f"<code>{esc(uuid or None)}</code>"
    return f'<code title="{esc(uuid)}">{esc(uuid[:12])}&hellip;</code>'


CARDS = '<span class="mute" title="a value of the whole card: shown once, on its row">card</span>'


def _gpu_row(g: Mapping[str, Any]) -> list[str]:
    if g.get("mig"):  # an instance: the card's power, temperature, energy and health are on the card's row
        return [_flag(g["state"] == "up", "up", "lost"), CARDS, esc(g["minor"]), f'<span class="nw">{esc(g["model"])}'
                "</span>", _util(g), f"{_gib(g['memory_used_bytes'])} / "
                f"{_gib(g['memory_total_bytes'])}", CARDS, CARDS, esc(g["allocate_mode"]), _short_uuid(g["uuid"]),
                CARDS, *(CARDS for _ in COLUMNS)]
    power = esc(g["power_watts"]) + "&nbsp;W" if g["power_watts"] is not None else "&ndash;"
    if g["power_limit_watts"] is not None:
        power += f" / {esc(g['power_limit_watts'])}&nbsp;W"
    temp = esc(g["temperature_celsius"]) + "&nbsp;&deg;C" if g["temperature_celsius"] is not None else "&ndash;"
    energy = "&ndash;" if g.get("energy_joules") is None else f"{g['energy_joules'] / 3.6e6:.2f}&nbsp;kWh"
    memory = f"{_gib(g['memory_used_bytes'])} / {_gib(g['memory_total_bytes'])}"
    if g["memory_total_bytes"] is None and g.get("instances_memory_total_bytes") is not None:
        memory += f" (instances {_gib(g['instances_memory_total_bytes'])})"  # NVML kept the card's total from us
    return [
        _flag(g["state"] == "up", "up", "lost"), f'<div class="health">{_health(g)}</div>', esc(g["minor"]),
        f'<span class="nw">{esc(g["model"])}</span>', _util(g), memory, temp, power,
        esc(g["allocate_mode"]), _short_uuid(g["uuid"]), energy, *(esc(g.get(f.status)) for f in COLUMNS),
    ]


# State and Health first, then what a GPU does: at 800 px what an operator acts on stays on screen (the
# table scrolls on its own for the rest); the device field table's columns (exporter/exposition/device_fields.py) last
GPU_HEADERS = ("State", "Health", "Minor", "Model", "Util", "Memory", "Temp", "Power", "Mode", "UUID", "Energy",
               *(f.column for f in COLUMNS))
_NUMERIC = frozenset({2, 4, 5, 6, 7, *range(10, 11 + len(COLUMNS))})


def _health(g: Mapping[str, Any]) -> str:
    """Row remapping that needs an operator (reset, replace), then the clocks event reasons active."""
    notes = health_notes(g)
    if notes is None:
        return "&ndash;"  # NVML told nothing
    parts = [f'<span class="bad">{esc(text)}</span>' if bad else esc(text) for text, bad in notes]
    return "; ".join(parts) or '<span class="ok">ok</span>'


def _omitted(n: Any, what: str) -> str:
    """The line under a list cut to its first rows (the page's size is bounded, docs/status.md)."""
    return f'<p class="mute">and {esc(n)} more {what}, not listed</p>' if n else ""


def _containers(rows: Sequence[Mapping[str, Any]], marks: Sequence[str | None] = (), omitted: Any = 0) -> str:
    if not rows:
        return '<p class="mute">No container holds or uses it.</p>'
    cells = []
    for c in rows:
        grant, use = c["grant"] or {}, c["use"] or {}
        cells.append([esc(c["namespace"]), esc(c["pod"]), esc(c["container"]), esc(c["allocate_mode"]),
                      esc(c["scheme"]), _pct(grant.get("compute_percent")), _gib(grant.get("memory_bytes")),
                      _pct(use.get("sm_percent")), _gib(use.get("memory_bytes"))])
    return _table(["Namespace", "Pod", "Container", "Mode", "Scheme", "Grant SM", "Grant memory",
                   "Use SM", "Use memory"], cells, frozenset({5, 6, 7, 8}), marks) + _omitted(omitted, "containers")


def _processes(rows: Sequence[Mapping[str, Any]], marks: Sequence[str | None], omitted: Any = 0,
               heading: str = "Unaccounted processes") -> str:
    """A table of GPU processes: the unaccounted ones, or (``heading``) the GPU's infrastructure."""
    if not rows:
        return ""
    cells = [[esc(p["pid"]), f"<code>{esc(p.get('comm'))}</code>", _gib(p["memory_bytes"]), _pct(p["sm_percent"]),
              esc(f"{p['namespace']}/{p['pod']}" if p["pod"] else "host"), esc(p["container"])] for p in rows]
    return f"<h3>{heading}</h3>" + _table(["PID", "Command", "Memory", "SM", "Pod", "Container"], cells,
                                                      frozenset({0, 2, 3}), marks) + _omitted(omitted, "processes")


def _culprits(x: Mapping[str, Any]) -> str:
    pods = x.get("pods") or []
    if not pods:
        return '<span class="mute">none known</span>'
    return "<br>".join(f"{esc(p['namespace'])}/{esc(p['pod'])}" + (f" ({esc(p['container'])})" if p["container"]
                                                                  else "") + f" &times;{esc(p['count'])}"
                       for p in pods)


def _xids(rows: Sequence[Mapping[str, Any]], now: float, marks: Sequence[str | None]) -> str:
    if not rows:
        return ""
    cells = [[esc(x["xid"]), esc(x["count"]), esc(when(x.get("last_at"), now)), _culprits(x), esc(x.get("meaning")),
              esc(x.get("severity")), esc(x.get("action"))] for x in rows]
    return "<h3>Xid errors</h3>" + _table(["Xid", "Count", "Last", "Pods", "Meaning", "Severity", "Action"], cells,
                                          frozenset({0, 1}), marks)


def _device(g: Mapping[str, Any], now: float, marks: _Marks, mig: bool = False) -> str:
    title = f"MIG {esc(g['mig']['profile'])} (GI {esc(g['mig']['gpu_instance_id'])})" if mig else (
        f"GPU {esc(g['minor'])}: {esc(g['model'])}")
    worst = None if mig else marks.section(g)
    uuid = g["uuid"]
    containers = [marks.who(uuid, c, ("over_memory_grant", "allocated_idle", "xid")) for c in g["containers"]]
    processes = [marks.who(uuid, p, ("unaccounted_process",)) for p in g["unaccounted"]]
    parts = [f'<section class="{"gpu mig" if mig else "gpu"}{" " + worst if worst else ""}"><h2>{title}</h2>',
             _table(GPU_HEADERS, [_gpu_row(g)], _NUMERIC, [marks.gpu(uuid)]),
             _containers(g["containers"], containers, g.get("containers_omitted"))
             if g["containers"] or not g.get("instances") else "",
             _processes(g["unaccounted"], processes, g.get("unaccounted_omitted")),
             _processes(g.get("infrastructure") or [], (), g.get("infrastructure_omitted"),
                        "Infrastructure (MPS daemons)"),
             _xids(g["xids"], now, [marks.xid(uuid, x["xid"]) for x in g["xids"]])]
    parts += [_device(i, now, marks, mig=True) for i in g.get("instances", ())]
    return "".join(parts) + "</section>"


def _others(view: Mapping[str, Any], now: float) -> str:
    out = []
    if view["unplaced"]:
        out.append("<h2>Allocations on a GPU not known yet</h2>"
                   + _containers(view["unplaced"], (), _map(view.get("omitted")).get("unplaced")))
    if view["other_xids"]:
        cells = [[f"<code>{esc(x['uuid'] or None)}</code>", esc(x["xid"]), esc(x["count"]),
                  esc(when(x.get("last_at"), now)), _culprits(x), esc(x.get("meaning"))] for x in view["other_xids"]]
        out.append("<h2>Xids of no GPU listed</h2>" + _table(["UUID", "Xid", "Count", "Last", "Pods", "Meaning"],
                                                             cells))
    if view["disagreements"]:
        cells = [[esc(k), esc(v)] for k, v in view["disagreements"].items()]
        out.append("<h2>Allocation disagreements</h2>" + _table(["Scheme", "Containers"], cells))
    return "".join(out)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def render_html(view: Mapping[str, Any]) -> bytes:
    """The whole page for ``view`` (see :func:`exporter.exposition.status.status_view`)."""
    return page_text(view).encode()


def page_text(view: Mapping[str, Any], banner_html: str | None = None) -> str:
    """:func:`render_html` as text; ``banner_html`` in place of the problems' banner (the stored page puts
    a slot there, exporter/exposition/status_page.py)."""
    nav = ('<nav><a href="/metrics">Metrics</a> &middot; <a href="/status.json">status.json</a> &middot; '
           '<a href="/healthz">Health</a> &middot; <a href="/readyz">Ready</a></nav>')
    if view["subsystems"] is None:
        body = '<p class="bad">No snapshot yet: the first sampling cycle has not completed.</p>'
        title = "kube-gpu-exporter"
    else:
        title = f"kube-gpu-exporter on {esc(view['node'])}"
        age = view.get("snapshot_age_seconds")
        now = (view.get("built_at") or 0.0) + (age if isinstance(age, int | float) else 0.0)
        problems = view.get("problems") or []
        marks = _Marks(problems)
        gpus = "".join(_device(g, now, marks) for g in view["gpus"]) or '<p class="mute">No GPU on this node.</p>'
        if banner_html is None:
            banner_html = banner(problems, view["node"], view.get("problem_counts"),
                                 _map(view.get("omitted")).get("problems") or 0)
        body = banner_html + _subsystems(view) + gpus + _others(view, now)
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{title}</title><style>{CSS}</style></head><body><h1>{title}</h1>{nav}{body}"
            f'<p class="mute">Refreshes every {REFRESH_SECONDS}&nbsp;s.</p></body></html>')
    return page
