"""The stored status page (exporter/exposition/status_page.py, stored_doc.py): rendered once per cycle, served as is.

What a request gets equals what the per-request rendering gave (JSON and HTML, fresh and stale, gzip
and identity); the lists are cut to MAX_ROWS and counted; and a request calls none of the builders.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.exposition import status as status_mod
from exporter.exposition import status_html, status_page
from exporter.exposition.problems import find_problems
from exporter.exposition.status import status_view
from exporter.exposition.status_html import render_html
from exporter.exposition.status_page import MAX_ROWS, build_page, page_parts
from exporter.exposition.stored_doc import compile_doc, crc_shift, fill, fill_gzip
from exporter.pipeline.holder import SnapshotHolder
from exporter.server.app import make_app
from exporter.server.wire import Request
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.xid.parse import catalog_entry
from tests.integration_support import generate_node

ROOT = Path(__file__).resolve().parent.parent
TROUBLE = ROOT / "examples" / "trouble-node.yaml"
MIG = ROOT / "examples" / "mig-a100-node.yaml"


def _cycle(scenario: Path):
    daemon = build_daemon(load_config(["--simulate", str(scenario)]))
    try:
        return daemon.pipeline.step()[0]
    finally:
        daemon.close()


def _crowded(tmp_path: Path, pods: int) -> Path:
    """One GPU shared by ``pods`` pods (each a process, a container row and an idle-allocation problem)."""
    node = generate_node(1, pods, shared_every=1)
    for d in node["devices"]:
        for p in d["processes"]:
            p["used_memory_bytes"], p["sm_util"] = 1 << 20, 0
        d["memory_used_bytes"] = (1 << 20) * len(d["processes"])
    path = tmp_path / f"crowded-{pods}.json"
    path.write_text(json.dumps(node))
    return path


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=3000), st.sampled_from(["a", "b"])), max_size=8),
       st.binary(max_size=40), st.binary(max_size=40))
def test_filled_gzip_is_one_member_of_the_filled_bytes(parts, a: bytes, b: bytes) -> None:
    text = "".join(p.hex() if isinstance(p, bytes) else f"<{p}>" for p in parts)
    doc = compile_doc(text, {"<a>": "a", "<b>": "b"})
    values = {"a": a, "b": b}
    plain = b"".join(fill(doc, values))
    assert plain == text.replace("<a>", "\0A").replace("<b>", "\0B").encode().replace(b"\0A", a).replace(b"\0B", b)
    member = zlib.decompressobj(31)  # one gzip member, checked (CRC and size) by zlib, nothing after it
    assert member.decompress(b"".join(fill_gzip(doc, values))) == plain and member.eof and not member.unused_data


@given(st.binary(max_size=200), st.binary(max_size=200))
def test_crc_shift_combines_crcs(x: bytes, y: bytes) -> None:
    op = crc_shift(len(y))
    combined = 0
    for i in range(32):
        if zlib.crc32(x) >> i & 1:
            combined ^= op[i]
    assert combined ^ zlib.crc32(y) == zlib.crc32(x + y)


def _served(page, now: float, html: bool, gz: bool = False) -> bytes:
    body = b"".join(page_parts(page, now, html, gz))
    return gzip.decompress(body) if gz else body


@pytest.mark.parametrize("scenario", [TROUBLE, MIG], ids=["trouble", "mig"])
@pytest.mark.parametrize("age", [0.5, 61.0, 4000.0])
def test_stored_json_is_the_per_request_view(scenario: Path, age: float) -> None:
    snapshot = _cycle(scenario)
    page = build_page(snapshot.status, None, catalog_entry)
    assert page is not None
    now = snapshot.built_at + age
    for gz in (False, True):
        served = json.loads(_served(page, now, html=False, gz=gz))
        fresh = status_view(snapshot.status, None, snapshot.built_at, True, catalog_entry)
        # judged at the snapshot's time, its age (and the stale problem with it) at the request's
        expected = {**fresh, "snapshot_age_seconds": age, "problems": find_problems({**fresh, "snapshot_age_seconds":
                                                                                    age}, snapshot.built_at)}
        summary = {k: served.pop(k) for k in ("problem_counts", "omitted", "max_rows")}
        assert served == json.loads(json.dumps(expected))
        assert list(served) == list(expected)  # problems first, the age in its place
        assert ("snapshot_stale" in {p["kind"] for p in served["problems"]}) is (age > 60)
        assert summary["max_rows"] == MAX_ROWS and set(summary["omitted"].values()) == {0}
        assert sum(summary["problem_counts"].values()) == len(served["problems"])


@pytest.mark.parametrize("age", [0.25, 75.0])
def test_stored_page_is_the_per_request_page(age: float) -> None:
    snapshot = _cycle(TROUBLE)
    page = build_page(snapshot.status, None, catalog_entry)
    assert page is not None
    now = snapshot.built_at + age
    view = status_view(snapshot.status, None, now, True, catalog_entry)
    # the Xids' "N min ago" is the snapshot's: the per-request page's, judged at its build time
    view["problems"] = find_problems(view, snapshot.built_at)
    old = render_html(view)
    for gz in (False, True):
        assert _served(page, now, html=True, gz=gz) == old


def test_failed_cycle_count_is_on_the_stored_page() -> None:
    daemon = build_daemon(load_config(["--simulate", str(MIG)]))
    try:
        snapshot = daemon.pipeline.step()[0]
        daemon.pipeline.failures_total = 3
        failed = daemon.pipeline.failed(snapshot)
    finally:
        daemon.close()
    assert failed.page is not None and failed.page.renders(failed.status, 3)
    served = json.loads(_served(failed.page, failed.built_at, html=False))
    assert served["subsystems"]["sampler"]["sample_failures_total"] == 3
    assert "sample_failures" in {p["kind"] for p in served["problems"]}


def test_lists_are_cut_and_counted_and_the_size_is_bounded(tmp_path: Path) -> None:
    small, big = (_cycle(_crowded(tmp_path, n)) for n in (MAX_ROWS + 20, 6 * MAX_ROWS))
    sizes = []
    for snapshot, pods in ((small, MAX_ROWS + 20), (big, 6 * MAX_ROWS)):
        page = build_page(snapshot.status, None, catalog_entry)
        assert page is not None
        body = _served(page, snapshot.built_at, html=False)
        served = json.loads(body)
        gpu = served["gpus"][0]
        assert len(gpu["containers"]) == MAX_ROWS and gpu["containers_omitted"] == pods - MAX_ROWS
        assert served["omitted"]["containers"] == pods - MAX_ROWS
        idle = served["problem_counts"]["info"]
        assert idle >= pods and len(served["problems"]) == MAX_ROWS  # every container's idle grant, counted
        assert served["omitted"]["problems"] == sum(served["problem_counts"].values()) - MAX_ROWS
        html = _served(page, snapshot.built_at, html=True).decode()
        assert f"and {pods - MAX_ROWS} more containers, not listed" in html
        assert f"and {served['omitted']['problems']} more, not listed" in html
        sizes.append(len(body))
    assert sizes[1] < sizes[0] * 1.1  # five times the pods, the same page


def test_a_request_does_no_per_pod_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every builder of the tree, the view, the problems and the page counted: a request calls none."""
    snapshot = _cycle(_crowded(tmp_path, 300))
    holder = SnapshotHolder(snapshot)
    holder.publish(snapshot)
    calls: list[str] = []

    def counted(module, name: str) -> None:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(name), real(*a, **k))[1])

    for module, names in ((status_mod, ("status_view", "find_problems", "thaw", "build_status", "status_json")),
                          (status_html, ("render_html", "page_text", "banner")),
                          (status_page, ("build_page", "status_view", "cap_view", "page_text", "banner")),
                          (json, ("dumps",)), (gzip, ("compress",)), (zlib, ("compressobj",))):
        for name in names:
            counted(module, name)
    import exporter.server.app as app_mod
    for name in ("status_view", "render_html", "status_json"):
        if hasattr(app_mod, name):
            counted(app_mod, name)
    app = make_app(holder, 60)
    for path in ("/status.json", "/"):
        for enc in ((), (("accept-encoding", "gzip"),)):
            response = app.handler(Request("GET", path, (1, 1), enc, "test"))(
                Request("GET", path, (1, 1), enc, "test"))
            assert response.status == 200 and response.length > 1000
            body = response.body + b"".join(response.more)
            assert json.loads(gzip.decompress(body) if enc else body) if path != "/" else body
    assert calls == []
