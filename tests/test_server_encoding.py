"""Accept-Encoding by RFC 9110 (12.5.3): properties of the parser, and what /metrics sends (Vary)."""

from __future__ import annotations

import asyncio
import gzip

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.exposition.snapshot import Snapshot, empty_snapshot
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.app import make_app
from exporter.server.encoding import parse_accept_encoding, wants_gzip
from exporter.server.stats import HttpStats
from tests.http_support import AppClient

CODINGS = ["gzip", "x-gzip", "identity", "*", "br", "deflate", "compress", "zstd"]


@pytest.mark.parametrize("field,gz", [
    ("gzip", True), ("GZip", True), ("x-gzip", True), ("gzip;q=0.001", True), ("*", True),
    ("gzip;q=0", False), ("gzip; q=0.000", False), ("GZIP;Q=0", False), ("*;q=0", False),
    ("gzip;q=0, *", False),  # the specific member beats the wildcard
    ("deflate, *;q=0.1", True), ("br, deflate", False), ("", False), (None, False), ("identity", False),
    ("identity;q=1, gzip;q=0.5", False), ("gzip;q=0.5, identity;q=0.5", True), ("gzip, identity;q=0", True),
    ("gzip;q=0.5, *", False),  # "*" gives identity q=1: preferred
    ("gzip;q=1.5", False), ("gzip;q=abc", False), ("gzip;q=0.1234", False), ("gzip;level=9", False),
    ("gzip;q=", False), (" ,, gzip ,", True), ("gzip\t;\tq=1.000", True), ("gz ip", False),
    ("gzip;q=0, gzip", False),  # duplicates: the first member counts
])
def test_examples(field, gz):
    assert wants_gzip(field) is gz


def test_several_header_lines_combine():
    assert wants_gzip(["br", "gzip"]) and not wants_gzip(["gzip;q=0", "*"]) and not wants_gzip([])


qvalues = st.integers(0, 1000)


def q_text(thousandths: int, style: int) -> str:
    """A qvalue as clients write it: 1, 1.0, 0.5, 0.500, 0. (all the same number)."""
    if thousandths == 1000:
        return ["1", "1.", "1.0", "1.000"][style]
    if thousandths == 0 and style == 0:
        return "0"
    digits = f"{thousandths:03d}".rstrip("0") if style < 2 else f"{thousandths:03d}"
    return "0." + digits


members = st.lists(st.tuples(st.sampled_from(CODINGS), st.one_of(st.none(), qvalues)), max_size=8,
                   unique_by=lambda m: "gzip" if m[0] == "x-gzip" else m[0])


@st.composite
def rendered(draw, items):
    """``items`` as a field value: random case, optional whitespace, any qvalue spelling, empty members."""
    out = []
    for coding, q in items:
        name = "".join(c.upper() if draw(st.booleans()) else c for c in coding)
        ows = draw(st.sampled_from(["", " ", "\t", "  "]))
        text = name
        if q is not None:
            p = draw(st.sampled_from(["q", "Q"]))
            text += f"{ows};{ows}{p}={q_text(q, draw(st.integers(0, 3)))}"
        out.append(ows + text + ows)
        if draw(st.booleans()):
            out.append(draw(st.sampled_from(["", " "])))  # the #rule allows empty list members
    return ",".join(out)


def model(items) -> bool:
    """What RFC 9110 says, written out: gzip acceptable (q>0) and at least as preferred as identity."""
    weights = {("gzip" if c == "x-gzip" else c): (1000 if q is None else q) for c, q in items}
    gz = weights.get("gzip", weights.get("*"))
    identity = weights.get("identity", weights.get("*"))
    return bool(gz) and (identity is None or gz >= identity)


@given(st.data(), members)
def test_decision_follows_the_rfc_whatever_the_spelling(data, items):
    field = data.draw(rendered(items))
    assert wants_gzip(field) is model(items)


@given(st.data(), members)
def test_parser_reads_every_member_exactly(data, items):
    field = data.draw(rendered(items))
    want = {("gzip" if c == "x-gzip" else c): (1.0 if q is None else q / 1000) for c, q in items}
    assert parse_accept_encoding(field) == pytest.approx(want)


@given(members, st.randoms())
def test_order_of_distinct_codings_does_not_matter(items, rnd):
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert wants_gzip(",".join(f"{c};q={q / 1000}" if q is not None else c for c, q in items)) is wants_gzip(
        ",".join(f"{c};q={q / 1000}" if q is not None else c for c, q in shuffled))


@given(st.data(), members)
def test_gzip_q0_is_never_served_gzip(data, items):
    others = [m for m in items if m[0] not in ("gzip", "x-gzip")]
    position = data.draw(st.integers(0, len(others)))
    field = data.draw(rendered([*others[:position], ("gzip", 0), *others[position:]]))
    assert wants_gzip(field) is False


@given(st.text())
def test_any_text_is_an_answer_never_an_error(field):
    assert wants_gzip(field) in (True, False)
    assert all(0 <= q <= 1 for q in parse_accept_encoding(field).values())


@given(st.data(), members)
def test_a_long_field_decides_as_its_short_form(data, items):
    """Short fields are remembered, long ones (over 256 characters) decided each time: the same answer."""
    field = data.draw(rendered(items))
    padded = field + "," * data.draw(st.integers(257, 600))  # empty list elements change nothing
    assert wants_gzip(padded) is wants_gzip(field) is wants_gzip(field)


def scrape(headers: list[tuple[str, str]]):
    body = b"# HELP x test\n# TYPE x gauge\nx 1\n"
    holder = SnapshotHolder(empty_snapshot(0.0))
    holder.publish(Snapshot(body, gzip.compress(body), 100.0))

    async def go():
        app = make_app(holder, stale_after=60, clock=lambda: 102.0, stats=HttpStats())
        async with AppClient(app) as client:
            r = await client.get("/metrics", headers=headers, auto_decompress=False)
            return r.status, r.headers, await r.read()

    return asyncio.run(go())


@pytest.mark.e2e
@pytest.mark.parametrize("headers,gz", [
    ([("Accept-Encoding", "gzip")], True),
    ([("Accept-Encoding", "gzip;q=0")], False),
    ([("Accept-Encoding", "identity;q=1, gzip;q=0.5")], False),
    ([("Accept-Encoding", "br"), ("Accept-Encoding", "GZIP")], True),
    ([("Accept-Encoding", "identity")], False),
])
def test_metrics_sends_vary_and_gzip_only_when_wanted(headers, gz):
    status, h, raw = scrape(headers)
    assert status == 200 and h["Vary"] == "Accept-Encoding"
    assert h.get("Content-Encoding") == ("gzip" if gz else None)
    text = (gzip.decompress(raw) if gz else raw).decode()
    assert text.startswith("# HELP x test\n") and "kube_gpu_exporter_snapshot_age_seconds 2\n" in text
    # the server's own counters, appended at scrape time, in both variants
    assert 'kube_gpu_exporter_http_errors_total{reason="bad_request"} 0\n' in text
