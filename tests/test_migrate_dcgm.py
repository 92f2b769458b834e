"""docs/migrate-from-dcgm-exporter.md: its counters table against dcgm-exporter's CSV, and every query in it.

The queries are read out of the page (its ```promql blocks, each with a ``# expect: empty`` or
``# expect: data`` line), so page and test cannot drift. A real Prometheus scrapes the simulated node
tests/scenarios/dcgm_node.yaml (``--dcgm-compat``, a kernel-log Xid) twice: as ``kube-gpu-exporter``
and, standing in for dcgm-exporter during the overlap, as ``dcgm-exporter``. The comparison queries
must then find no difference; the stand-in cannot show what only the real dcgm-exporter does (a
shared GPU's row repeated per pod), which the page's queries are written to leave out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from exporter.exposition.dcgm import BASE_LABELS, FAMILY_NAMES
from tests.prom_support import (
    PROMETHEUS,
    SCENARIOS,
    _launch,
    free_port,
    poll,
    query,
    start_exporter,
    stop,
)
from tests.test_dcgm_compat import NOT_EXPORTED, csv_fields

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "migrate-from-dcgm-exporter.md"
GOLDEN = ROOT / "tests" / "golden" / "families.txt"
CSV_BLOB = "2eed7a651db300797554cb91591908f410902f21"  # tests/data/dcgm/SOURCE.md
# Xid 48 on the H100 (00000000:1A:00.0), as tests/test_dcgm_dashboard.py
KMSG = "3,10,1000000,-;NVRM: Xid (PCI:0000:1a:00): 48, pid=0, name=python, An uncorrectable double bit error\n"
JOBS = ("kube-gpu-exporter", "dcgm-exporter")


def guide_queries() -> list[tuple[str, str]]:
    """(expectation, query) of every ```promql block of the guide."""
    out = []
    for block in re.findall(r"```promql\n(.*?)```", GUIDE.read_text(), re.S):
        (expect,) = re.findall(r"^# expect: (empty|data)$", block, re.M)
        expr = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("#")).strip()
        out.append((expect, expr))
    return out


def counters_table() -> dict[str, list[str]]:
    """dcgm-exporter field -> the other cells of its row in the guide's counters table."""
    text = GUIDE.read_text()
    table = text[text.index("<!-- counters table: start -->") : text.index("<!-- counters table: end -->")]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        assert name not in rows, f"{name} twice"
        rows[name] = cells[1:]
    return rows


def test_the_table_has_every_default_counter_once_with_its_type() -> None:
    rows = counters_table()
    default = csv_fields(include_commented=False)
    assert set(rows) == set(default)
    for name, (kind, *_rest) in rows.items():
        assert kind == default[name], name


def test_the_table_says_served_exactly_for_what_the_exporter_serves() -> None:
    for name, (_kind, served, _native, _notes) in counters_table().items():
        if name == "DCGM_FI_DRIVER_VERSION":
            assert name in BASE_LABELS and served.startswith("same")
        elif served == "not served":
            assert name not in FAMILY_NAMES and name in NOT_EXPORTED, name
        else:
            assert served.startswith("same") and name in FAMILY_NAMES, name


def test_the_native_equivalents_are_served_families() -> None:
    golden = {line.split()[0] for line in GOLDEN.read_text().splitlines() if line and not line.startswith("#")}
    named = set()
    for name, (_kind, _served, native, notes) in counters_table().items():
        for family in re.findall(r"`(nvidia_gpu_\w+)", native + notes):
            assert family in golden, (name, family)
            named.add(family)
    assert len(named) >= 25


def test_the_guide_records_the_csv_it_compared() -> None:
    text = GUIDE.read_text()
    assert CSV_BLOB in text and CSV_BLOB in (ROOT / "tests" / "data" / "dcgm" / "SOURCE.md").read_text()
    assert "d5e5f510a1b6b393f39a43293ccd9dc985defc79" in text


def test_every_query_block_has_one_expectation() -> None:
    queries = guide_queries()
    assert len(queries) == len(re.findall(r"```promql", GUIDE.read_text())) >= 15
    assert {e for e, _ in queries} == {"empty", "data"}


def test_readme_and_values_name_the_flag_and_link_the_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    try_it = readme[readme.index("## Try it") : readme.index("## Run the tests")]
    assert "--dcgm-compat" in try_it and "docs/migrate-from-dcgm-exporter.md" in try_it
    values = (ROOT / "helm" / "kube-gpu-exporter" / "values.yaml").read_text()
    comment = values[: values.index("  dcgmCompat: null")].rsplit("\n  # ", 3)
    assert "--dcgm-compat" in "".join(comment[1:]) and "docs/migrate-from-dcgm-exporter.md" in "".join(comment[1:])


@pytest.mark.e2e
def test_every_query_of_the_guide_on_the_simulated_node(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG)
    exporter, address = start_exporter(
        SCENARIOS / "dcgm_node.yaml", "dcgm-node", tmp_path, "--dcgm-compat",
        "--kmsg-path", str(kmsg), "--kmsg-replay", "--no-events", "--interval", "0.2",
    )  # fmt: skip
    prom = None
    try:
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                  "scrape_configs": [{"job_name": j, "static_configs": [{"targets": [address]}]} for j in JOBS]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        prom = _launch([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn"], tmp_path / "prometheus.log", f"{base}/-/ready", "prometheus")
        # Ready: both jobs have every GPU, two samples each (rates), and the Xid is counted.
        ready = poll(lambda: all(len(query(base, f'DCGM_FI_DEV_GPU_TEMP{{job="{j}"}}')) == 4 for j in JOBS)
                     and len(query(base, 'count_over_time(DCGM_FI_DEV_GPU_TEMP{job="dcgm-exporter"}[1m]) >= 3')) == 4
                     and query(base, "nvidia_gpu_xid_errors_total"), deadline_s=60)
        assert ready, "the series did not arrive"
        failed = []
        for expect, expr in guide_queries():
            # Rates over a few seconds of samples scraped at different phases differ by a sample
            # in a handful (~15 %); they settle as samples add up, so "empty" may take a while.
            if expect == "data":
                got = poll(lambda e=expr: query(base, e), 10)
            else:
                poll(lambda e=expr: not query(base, e), 60)
                got = query(base, expr)
            if bool(got) != (expect == "data"):
                failed.append((expect, expr, got))
        assert not failed, failed
        # The checks can fail: a difference the comparison queries must see.
        temp = next(e for x, e in guide_queries() if "DCGM_FI_DEV_GPU_TEMP" in e and "> 2" in e)
        assert query(base, temp.replace('{job="dcgm-exporter"}', '{job="dcgm-exporter"} - 10'))
    finally:
        if prom is not None:
            stop(prom)
        stop(exporter)
