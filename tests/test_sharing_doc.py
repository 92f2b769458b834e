"""docs/sharing.md's scheme table: one row for every scheme the code reports, and only skip reasons it counts."""

from __future__ import annotations

import re
from pathlib import Path

from exporter.attribution import dra_sharing
from exporter.attribution.dra import SCHEME_BY_STRATEGY, SCHEME_DRA, SCHEME_DRA_CONSUMABLE, SCHEME_DRA_SHARED
from exporter.attribution.schemes import gke, gpushare, hami, nvidia, vcuda

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "sharing.md"
# skip("reason") / node.skip("reason") calls, and literals on a line that sets a `reason` for a later skip(reason)
_SKIP_CALL = re.compile(r"""skip\(\s*["']([a-z0-9_]+)["']\s*\)""")
_REASON_LINE = re.compile(r"""\breason\b.*?=.*""")
_LITERAL = re.compile(r"""["']([a-z][a-z0-9]*(?:_[a-z0-9]+)+)["']""")
_SNAKE = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")
_ROW_SCHEMES = re.compile(r"`([a-z]+(?:-[a-z]+)*)`")

SCHEMES = {
    SCHEME_DRA, SCHEME_DRA_SHARED, SCHEME_DRA_CONSUMABLE, *SCHEME_BY_STRATEGY.values(), hami.SCHEME_HAMI,
    gpushare.SCHEME_GPUSHARE, vcuda.SCHEME_VCUDA, gke.SCHEME_GKE, gke.SCHEME_GKE_TIME_SHARING, gke.SCHEME_GKE_MPS,
    nvidia.SCHEME_NVIDIA, nvidia.SCHEME_TIME_SLICING, nvidia.SCHEME_MPS, nvidia.SCHEME_SHARED,
}


def table_rows(doc: str) -> list[list[str]]:
    """The cells of the scheme table's body rows (the table whose header starts with the `scheme` column)."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `scheme`"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def counted_reasons() -> set[str]:
    """Every skip reason the attribution code counts."""
    found = {dra_sharing.INVALID}
    for path in (ROOT / "exporter" / "attribution").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found |= set(_SKIP_CALL.findall(text))
        for line in _REASON_LINE.findall(text):
            found |= set(_LITERAL.findall(line))
    return found


def test_every_scheme_has_a_row_and_every_row_a_scheme() -> None:
    rows = table_rows(DOC.read_text(encoding="utf-8"))
    assert all(len(r) == 7 for r in rows), "each row: scheme, claimed when, compute, memory, mode, source, missing"
    named = {s for r in rows for s in _ROW_SCHEMES.findall(r[0])}
    assert named >= SCHEMES, f"schemes without a row in docs/sharing.md: {sorted(SCHEMES - named)}"
    assert named <= SCHEMES, f"rows naming no scheme of the code: {sorted(named - SCHEMES)}"
    assert all(r[5] for r in rows), "every row names the source of its rule"


def _reason_like(token: str, reasons: set[str]) -> bool:
    """A backticked name that starts like a reason (dra_, hami_, malformed_, pod_resources_, ...); API fields don't."""
    prefixes = {r.split("_", 1)[0] for r in reasons} - {"pod", "process", "allocation"}
    return token.split("_", 1)[0] in prefixes or token.startswith("pod_resources_")


def unknown_reasons(doc: str, reasons: set[str]) -> list[str]:
    """Reason-like names in ``doc`` that the code never counts."""
    return sorted({t for t in _SNAKE.findall(doc) if _reason_like(t, reasons)} - reasons)


def test_the_skip_reasons_the_doc_names_are_counted_by_the_code() -> None:
    reasons = counted_reasons()
    doc = DOC.read_text(encoding="utf-8")
    in_table = {t for r in table_rows(doc) for t in _SNAKE.findall(r[6]) if _reason_like(t, reasons)}
    assert len(in_table) >= 20, "the table's last column names the skip reasons"
    unknown = unknown_reasons(doc, reasons)
    assert not unknown, f"docs/sharing.md names skip reasons the code never counts: {unknown}"


def test_the_check_sees_an_unknown_reason() -> None:
    reasons = counted_reasons()
    assert "dra_claim_not_reserved" in reasons and "dra_device_not_in_nvml" in reasons  # a call, and a reason= line
    assert unknown_reasons("`dra_claim_made_up` and `dra_claim_not_reserved`, `resource_claims`", reasons) == [
        "dra_claim_made_up"]
