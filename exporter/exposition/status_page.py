"""The status page stored like /metrics: ``/status.json`` and ``/`` rendered once per cycle, filled in per request.

:func:`build_page` runs on the sampler thread, once per cycle: it judges the problems of the cycle's
status tree (exporter/exposition/problems.py) at the time the snapshot was built, cuts each list to its
first :data:`MAX_ROWS` rows (the rest counted in ``omitted``), and renders the JSON and the HTML twice
each, fresh and stale (with the ``snapshot_stale`` problem), into stored documents
(exporter/exposition/stored_doc.py) with their gzip segments. The snapshot's age is a slot in each.
:func:`page_parts` is all a request does: the age, the variant it asks for (over the stale threshold or
not) and the slots filled, in constant time whatever the node's pods.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.exposition import thresholds as judge
from exporter.exposition.problems import Problem, counts, order, stale_problem
from exporter.exposition.status import Status, XidCatalog, status_view
from exporter.exposition.status_html import banner, esc, page_text
from exporter.exposition.stored_doc import Chunk, StoredDoc, compile_doc, fill, fill_gzip

MAX_ROWS = 100  # per list: a GPU's containers, its processes, an Xid's pods, the unplaced, the problems
OMITTED_KEYS = ("problems", "containers", "unaccounted", "infrastructure", "unplaced", "xid_pods")


@dataclass(frozen=True, slots=True)
class StatusPage:
    """One cycle's ``/status.json`` and ``/``, each fresh (``[0]``) and stale (``[1]``)."""

    built_at: float
    json: tuple[StoredDoc, StoredDoc]
    html: tuple[StoredDoc, StoredDoc]
    tree: Status  # the status tree and failure count it was rendered from (a snapshot serves it only with them)
    failures: int | None

    def renders(self, tree: Status, failures: int | None) -> bool:
        """Whether this page is ``tree`` with ``failures`` (by identity: constant time)."""
        return tree is self.tree and failures == self.failures


def _cut(entry: dict[str, Any], key: str, limit: int, omitted: dict[str, int], counted: str) -> None:
    rows = entry.get(key) or []
    if len(rows) > limit:
        entry[key] = rows[:limit]
        entry[f"{key}_omitted"] = len(rows) - limit
        omitted[counted] += len(rows) - limit


def cap_view(view: dict[str, Any], limit: int = MAX_ROWS) -> dict[str, int]:
    """Cut every per-pod list of ``view`` (in place) to ``limit`` rows; the rows left out, by list.

    A cut list's owner says how many it left out (``containers_omitted``, ``unaccounted_omitted``,
    ``pods_omitted`` on an Xid); the problems are cut by :func:`build_page`, after they are judged on
    everything."""
    omitted = dict.fromkeys(OMITTED_KEYS, 0)
    entries = [*view["gpus"], *(i for g in view["gpus"] for i in g.get("instances", ()))]
    for e in entries:
        _cut(e, "containers", limit, omitted, "containers")
        _cut(e, "unaccounted", limit, omitted, "unaccounted")
        _cut(e, "infrastructure", limit, omitted, "infrastructure")
    for x in [*view["other_xids"], *(x for e in entries for x in e["xids"])]:
        _cut(x, "pods", limit, omitted, "xid_pods")
    rows = view["unplaced"]
    if len(rows) > limit:
        view["unplaced"], omitted["unplaced"] = rows[:limit], len(rows) - limit
    return omitted


def _variant(problems: list[Problem], omitted: Mapping[str, int], limit: int) -> tuple[list[Problem], dict, dict]:
    """The problems listed, their counts by severity and the omitted counts of one variant."""
    shown = problems[:limit]
    return shown, counts(problems), {**omitted, "problems": len(problems) - len(shown)}


def _json_text(value: Any) -> str:
    # indented one level: it takes the place of a top-level value (json escapes every newline in a string)
    return json.dumps(value, indent=1, allow_nan=False).replace("\n", "\n ")


def build_page(status: Status, failures: int | None, catalog: XidCatalog | None,
               limit: int = MAX_ROWS) -> StatusPage | None:
    """The stored page of a status tree (None for the empty tree: the page before the first cycle)."""
    if not status:
        return None
    built_at = float(status["built_at"])
    view = status_view(status, failures, built_at, True, catalog)
    problems = view.pop("problems")
    stale_token = "kge" + secrets.token_hex(12)  # the stale problem's age; hex: nothing escapes it
    stale = sorted([*problems, stale_problem(stale_token)], key=order)
    omitted = cap_view(view, limit)
    fresh_v, stale_v = _variant(problems, omitted, limit), _variant(stale, omitted, limit)
    cache: dict[bytes, Chunk] = {}
    tok = {k: "kge" + secrets.token_hex(12) for k in ("problems", "counts", "omitted", "age", "banner")}
    # /status.json: problems first, as on the page; the summary (counts, omitted, the cut) after them
    doc = {"problems": tok["problems"], "problem_counts": tok["counts"], "omitted": tok["omitted"],
           "max_rows": limit, **view, "snapshot_age_seconds": tok["age"]}  # the age keeps its place
    text = json.dumps(doc, indent=1, allow_nan=False)
    slots = {f'"{tok["age"]}"': "age_json", stale_token: "age_s"}
    json_docs = tuple(compile_doc(_replace(text, {f'"{tok["problems"]}"': _json_text(shown),
                                                  f'"{tok["counts"]}"': _json_text(n),
                                                  f'"{tok["omitted"]}"': _json_text(cut)}), slots, cache)
                      for shown, n, cut in (fresh_v, stale_v))
    page = page_text({**view, "problems": fresh_v[0], "snapshot_age_seconds": tok["age"]}, tok["banner"])
    html_docs = tuple(compile_doc(page.replace(tok["banner"], banner(shown, view["node"], n, cut["problems"])),
                                  {tok["age"]: "age_html", stale_token: "age_s"}, cache)
                      for shown, n, cut in (fresh_v, stale_v))
    return StatusPage(built_at, json_docs, html_docs, status, failures)  # type: ignore[arg-type]


def _replace(text: str, subs: Mapping[str, str]) -> str:
    for old, new in subs.items():
        text = text.replace(old, new, 1)
    return text


def page_parts(page: StatusPage, now: float, html: bool, gzipped: bool) -> tuple[bytes, ...]:
    """What a request for the page (``html``) or the JSON returns at unix time ``now``: a few slots filled."""
    age = max(0.0, now - page.built_at)
    doc = (page.html if html else page.json)[age > judge.SNAPSHOT_STALE_SECONDS]
    values = {"age_json": repr(age).encode(), "age_html": esc(age).encode(), "age_s": f"{age:.0f}".encode()}
    return fill_gzip(doc, values) if gzipped else fill(doc, values)
