"""The Grafana dashboards: freshness, structure (dashboard-linter's rules), what the queries read,
and every panel query evaluated for real.

No Grafana can run here, so the last tests do what Grafana would: a real Prometheus scrapes four
simulated-node exporters (examples/mixed-4gpu-node.yaml with a kmsg file holding an Xid and a
process of an unknown pod, and the three rules e2e nodes in two clusters) with the recording rules
loaded; each dashboard's variables are resolved with their own label_values() queries,
substituted, and every panel query must return a non-empty result. That the results are right,
not only there, is tests/test_dashboards_truth.py.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.bundle.dashboards import cli as dashboards_cli
from exporter.bundle.dashboards.options import DashboardOptions, DashboardOptionsError
from exporter.bundle.dashboards.panels import DATASOURCE, UNITS
from exporter.bundle.dashboards.render import DASHBOARDS, render_configmaps, render_dashboards
from exporter.bundle.rules import RuleOptions, render_rules
from exporter.shell.generate import BANNER
from tests.prom_support import (
    PROMETHEUS,
    ROOT,
    SCENARIOS,
    assert_cli_error,
    exporter_families,
    http_get,
    poll,
    query,
    recorded_series,
    rule_health,
    run_prometheus,
    series_read,
    start_exporter,
    stop,
    undocumented_flags,
)

DASHBOARD_DIR = ROOT / "dashboards"
CONFIGMAP = "dashboards/kube-gpu-exporter.dashboards.configmap.yaml"
LABEL_VALUES = r"label_values\((.+), ([a-zA-Z_][a-zA-Z0-9_]*)\)"
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table"}
GRAFANA_VARIABLES = {"__rate_interval", "__range"}  # Grafana's own: never defined by a dashboard
CUSTOM = DashboardOptions(
    pod_label="pod", namespace_label="namespace", container_label="container", node_label="node",
    cluster_label="k8s_cluster",
)  # fmt: skip


def _boards(opts: DashboardOptions) -> dict[str, dict[str, Any]]:
    return {name: json.loads(text) for name, text in render_dashboards(opts).items()}


RENDERINGS = {
    "default": DashboardOptions(),
    "cluster": DashboardOptions(cluster_label="cluster"),
    "custom": CUSTOM,
}


def _all_boards() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for rendering, opts in RENDERINGS.items():
        for name, board in _boards(opts).items():
            yield rendering, name, board


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(board) for t in p["targets"]]


def _variables(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in board["templating"]["list"] if v["type"] == "query"]


def _reads(expr: str) -> set[str]:
    """Metric names a panel query or a label_values() variable query reads."""
    m = re.fullmatch(LABEL_VALUES, expr)
    return series_read(m.group(1) if m else expr)


# ------------------------------------------------------------------ committed files


def test_committed_json_is_fresh(tmp_path: Path) -> None:
    assert dashboards_cli.main(["-o", str(tmp_path)]) == 0
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_text() for p in DASHBOARD_DIR.glob("*.json")}
    assert sorted(fresh) == sorted(committed) == sorted(f"kube-gpu-{n}.json" for n in DASHBOARDS)
    for name in fresh:
        assert committed[name] == fresh[name], (
            f"dashboards/{name} is stale: run scripts/generate.sh"
        )


def test_committed_configmaps_are_fresh(tmp_path: Path) -> None:
    out = tmp_path / "cm.yaml"
    assert dashboards_cli.main(["--format=configmap", "-o", str(out)]) == 0
    assert (ROOT / CONFIGMAP).read_text() == BANNER + out.read_text(), f"{CONFIGMAP} is stale: run scripts/generate.sh"


def test_configmaps_carry_the_json_files_for_the_grafana_sidecar() -> None:
    docs = list(yaml.safe_load_all((ROOT / CONFIGMAP).read_text()))
    assert len(docs) == len(DASHBOARDS)
    for doc in docs:
        assert (doc["apiVersion"], doc["kind"]) == ("v1", "ConfigMap")
        assert doc["metadata"]["labels"] == {"grafana_dashboard": "1"}
        assert re.fullmatch(r"[a-z0-9-]{1,63}", doc["metadata"]["name"])
        ((file_name, text),) = doc["data"].items()
        assert text == (DASHBOARD_DIR / file_name).read_text()
        # under kubectl's client-side apply annotation limit, and far under a ConfigMap's 1 MiB
        assert len(text.encode()) < 256 * 1024
    custom = list(yaml.safe_load_all(render_configmaps(DashboardOptions(), "monitoring",
                                                       {"team": "ml"})))  # fmt: skip
    assert all(d["metadata"]["namespace"] == "monitoring" for d in custom)
    assert all(d["metadata"]["labels"] == {"grafana_dashboard": "1", "team": "ml"} for d in custom)


# ------------------------------------------------------------------ structure


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_dashboard_model(rendering: str) -> None:
    boards = _boards(RENDERINGS[rendering])
    uids = [b["uid"] for b in boards.values()]
    titles = [b["title"] for b in boards.values()]
    assert len(set(uids)) == len(uids) and len(set(titles)) == len(titles)
    for board in boards.values():
        assert len(board["uid"]) <= 40 and re.fullmatch(r"[a-z0-9-]+", board["uid"])
        assert board["schemaVersion"] >= 39 and board["id"] is None
        assert board["tags"] and board["refresh"] and board["time"]["from"].startswith("now-")
        assert "Generated by `kube-gpu-exporter dashboards" in board["description"]
        first = board["templating"]["list"][0]
        assert (first["type"], first["name"], first["query"]) == ("datasource", "datasource", "prometheus")
        for var in _variables(board):
            assert var["datasource"] == DATASOURCE, var["name"]
            assert var["refresh"] == 2 and var["query"] == var["definition"], var["name"]
            assert re.fullmatch(LABEL_VALUES, var["query"]), var["query"]
        assert board["links"] and board["links"][0]["tags"] == [board["tags"][0]]


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_panels_follow_the_linter_rules(rendering: str) -> None:
    for name, board in _boards(RENDERINGS[rendering]).items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        titles = [p["title"] for p in _panels(board)]
        assert len(titles) == len(set(titles)), f"{name}: duplicate panel titles"
        boxes = []
        for p in board["panels"]:
            assert p["type"] in PANEL_TYPES, (name, p["type"])  # no Angular graph/singlestat
            g = p["gridPos"]
            assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, (name, p["title"])
            boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"], p["title"]))
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
                assert not overlap, f"{name}: {a[4]!r} overlaps {b[4]!r}"
        for p in _panels(board):
            where = f"{name}: {p['title']}"
            assert p["datasource"] == DATASOURCE, where
            assert p["description"], where
            assert p["targets"], where
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), where
            for t in p["targets"]:
                assert t["datasource"] == DATASOURCE, where
                assert t["expr"].strip(), where
                for fn in re.findall(r"\b(rate|irate|increase|delta)\(", t["expr"]):
                    # an increase() may also total the dashboard's time range (a table of totals)
                    window = r"\$__rate_interval|\$__range" if fn == "increase" else r"\$__rate_interval"
                    assert re.search(rf"{fn}\([^\[]*\[({window})\]", t["expr"]), f"{where}: {fn}"
            assert p["fieldConfig"]["defaults"]["unit"] in UNITS, where
            for o in p["fieldConfig"]["overrides"]:
                for prop in o["properties"]:
                    if prop["id"] == "unit":
                        assert prop["value"] in UNITS, where


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_every_variable_is_defined_and_used(rendering: str) -> None:
    for name, board in _boards(RENDERINGS[rendering]).items():
        defined = [v["name"] for v in board["templating"]["list"]]
        text = json.dumps([board["panels"], board["templating"]["list"]])
        used = set(re.findall(r"\$\{?([a-z_]+)", text)) - GRAFANA_VARIABLES
        assert used <= set(defined), f"{name}: undefined {used - set(defined)}"
        for var in defined:
            assert var in used, f"{name}: ${var} is never used"
        # a variable's query only refers to variables defined before it
        for i, var in enumerate(board["templating"]["list"][1:], start=1):
            refs = set(re.findall(r"\$([a-z_]+)", var["query"]))
            assert refs <= set(defined[:i]), (name, var["name"], refs)


def test_cluster_label_reaches_every_selector() -> None:
    for name, board in _boards(RENDERINGS["cluster"]).items():
        exprs = _exprs(board) + [v["query"] for v in _variables(board) if v["name"] != "cluster"]
        for expr in exprs:
            for metric in _reads(expr):
                for m in re.finditer(rf"\b{metric}\b(\{{[^}}]*\}})?", expr):
                    assert m.group(1) and 'cluster="$cluster"' in m.group(1), f"{name}: {metric} in {expr}"
            for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
                labels = [s.strip() for s in clause.split(",")]
                assert "cluster" in labels or labels == ["allocate_mode"], f"{name}: {clause} in {expr}"
        assert board["templating"]["list"][1]["name"] == "cluster"
    for board in _boards(RENDERINGS["default"]).values():
        assert "cluster" not in json.dumps(board["templating"]) + "".join(_exprs(board)).replace("_cluster", "")


def test_custom_label_names_replace_the_defaults() -> None:
    for board in _boards(CUSTOM).values():
        text = "\n".join(_exprs(board) + [v["query"] for v in _variables(board)])
        text += json.dumps([p.get("transformations") for p in board["panels"]])
        for default in ("pod_name", "namespace_name", "container_name", "node_name"):
            assert not re.search(rf"\b{default}\b", text), default
        assert 'k8s_cluster="$cluster"' in text


def test_queries_read_only_exporter_families_and_recorded_series() -> None:
    known = exporter_families() | recorded_series()
    used: set[str] = set()
    for rendering, name, board in _all_boards():
        for expr in _exprs(board) + [v["query"] for v in _variables(board)]:
            read = _reads(expr)
            assert read, (rendering, name, expr)
            assert read <= known, f"{rendering}/{name} reads {read - known}: {expr}"
            used |= read
    # the seed's monitoring views (seed 000 node/pod views, seed 003 allocation views) are all there
    for series in ("nvidia_gpu_temperature_celsius", "nvidia_gpu_power_usage_milliwatts", "nvidia_gpu_duty_cycle",
                   "nvidia_gpu_memory_used_bytes", "nvidia_gpu_num_devices", "k8s_node_gpu_allocated_devices",
                   "k8s_pod_gpu_allocated_compute", "k8s_card_gpu_allocated_compute",
                   "k8s_node_rate_gpu_memory_allocated", "nvidia_gpu_gpu_sharing_memory",
                   "nvidia_gpu_xid_errors_total", "k8s_pod_rate_gpu_used_request",
                   "k8s_namespace_rate_gpu_used_cluster", "k8s_workload_rate_gpu_used_cluster"):  # fmt: skip
        assert series in used, series


# ------------------------------------------------------------------ options and CLI


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pod-label", "pod-name"], "--pod-label"),
        (["--cluster-label", "uuid"], "--cluster-label"),
        (["--uid-prefix", "Kube GPU"], "--uid-prefix"),
        (["--refresh", "soon"], "--refresh"),
        (["--time-from", "yesterday"], "--time-from"),
        (["--tag", " "], "--tag"),
        (["--format", "configmap", "--namespace", "Bad_NS"], "--namespace"),
        (["--format", "configmap", "--label", "novalue"], "--label"),
        (["--format", "configmap", "--only", "node"], "--only"),
        (["--namespace", "monitoring"], "--format configmap"),
        (["-o", "-"], "--only"),
        (["-o", "/nonexistent/dir"], "not a directory"),
    ],
)
def test_bad_options_exit_2_naming_the_option(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert_cli_error(dashboards_cli.main, "dashboards", argv, message, capsys)


def test_options_change_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.shell import cli

    argv = ["dashboards", "--only", "node", "-o", "-", "--uid-prefix", "gpu", "--title-prefix", "ML / ",
            "--tag", "ml", "--tag", "gpu", "--refresh", "1m", "--time-from", "now-1d"]  # fmt: skip
    assert cli.main(argv) == 0
    board = json.loads(capsys.readouterr().out)
    assert (board["uid"], board["title"], board["tags"], board["refresh"], board["time"]["from"]) == (
        "gpu-node", "ML / Node", ["ml", "gpu"], "1m", "now-1d"
    )
    assert board["links"][0]["tags"] == ["ml"]
    assert ("Generated by `kube-gpu-exporter dashboards --uid-prefix=gpu '--title-prefix=ML / ' --refresh=1m "
            "--time-from=now-1d --tag=ml --tag=gpu`") in board["description"]  # fmt: skip
    assert DashboardOptions(uid_prefix="x" * 30).to_args() == ["--uid-prefix=" + "x" * 30]
    with pytest.raises(DashboardOptionsError):
        render_dashboards(DashboardOptions(uid_prefix="x" * 31))


# ------------------------------------------------------------------ every query on a real Prometheus

MIXED = ROOT / "examples" / "mixed-4gpu-node.yaml"
# GPU 0 of the mixed node is at 00000000:07:00.0; pid 1001 is the trainer's process on it.
KMSG = "4,10,1000000,-;NVRM: Xid (PCI:0000:07:00): 31, pid=1001, name=python, Ch 00000008, intr 00000000. MMU Fault\n"
# A process in a pod the API does not know: counted as a skip (the node dashboard's Skips by reason).
STRAY_PROCESS = {
    "pid": 9001, "used_memory_bytes": 1048576, "sm_util": 0,
    "cgroup": "0::/kubepods.slice/kubepods-pod0badc0de_0000_4000_8000_000000000000.slice/"
              "cri-containerd-" + "9" * 64 + ".scope\n",
}  # fmt: skip
# (scenario, node, cluster, extra flags)
NODES = [
    (MIXED, "gpu-node-mixed-1", "east", ("--kmsg-replay", "--no-events")),
    (SCENARIOS / "rules_e2e_east_node1.yaml", "e2e-node-1", "east", ()),
    (SCENARIOS / "rules_e2e_east_node2.yaml", "e2e-node-2", "east", ()),
    (SCENARIOS / "rules_e2e_west_node3.yaml", "e2e-node-3", "west", ()),
]
# The value picked for a single-value variable (it must be one its query returns); multi-value
# variables take Grafana's "All": every value, as a regex alternation.
CHOICES = {"cluster": "east", "node": "gpu-node-mixed-1", "namespace": "ml", "workload": "trainer"}
RATE_INTERVAL = "10s"  # Grafana: max(4 x scrape interval, step + scrape interval); scrapes are 1 s here
RANGE = "1h"  # $__range: the dashboard's time range (an instant query at its end sees the last hour)


@dataclass(frozen=True)
class Target:
    address: str
    cluster: str


HEALTH_NODE = SCENARIOS / "health_node.yaml"
# The keys of a device that are its health (issue 18), not its identity, usage or processes.
HEALTH_KEYS = ("energy_millijoules", "power_limit_milliwatts", "fan_speed_percent", "performance_state",
               "memory_temperature_celsius", "pcie_tx_kilobytes_per_second", "pcie_rx_kilobytes_per_second",
               "pcie_replay_count", "pcie_link_generation", "pcie_link_width", "retired_pages_single_bit",
               "retired_pages_double_bit", "retired_pages_pending", "remapped_rows_correctable",
               "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure", "nvlinks", "gpm",
               "clocks_event_reasons")  # fmt: skip


def with_health(doc: dict[str, Any], minor: int = 2) -> dict[str, Any]:
    """``doc`` with the health of health_node.yaml's GPU ``minor`` (throttling: 0x24) on every device,
    plus retired pages (which that H100 lacks): every hardware-health panel has a series."""
    source = next(d for d in yaml.safe_load(HEALTH_NODE.read_text())["devices"] if d["minor_number"] == minor)
    health = {k: source[k] for k in HEALTH_KEYS if k in source}
    health |= {"retired_pages_single_bit": 2, "retired_pages_double_bit": 1, "retired_pages_pending": 0}
    for device in doc["devices"]:
        device.update(health)
    return doc


def with_stray_process(scenario: Path, out: Path) -> Path:
    """``scenario`` plus a process of a pod the API does not know (a skip: process_pod_not_in_cache) on its last GPU."""
    doc = yaml.safe_load(scenario.read_text())
    doc["devices"][-1].setdefault("processes", []).append(STRAY_PROCESS)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def exporters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Target]]:
    tmp = tmp_path_factory.mktemp("dashboards-exporters")
    (tmp / "kmsg").write_text(KMSG)
    procs: list[subprocess.Popen] = []
    targets = []
    try:
        for scenario, node, cluster, extra in NODES:
            if scenario == MIXED:  # the node the node dashboard shows: something in every panel
                scenario = with_stray_process(scenario, tmp / scenario.name)
                scenario.write_text(yaml.safe_dump(with_health(yaml.safe_load(scenario.read_text())), sort_keys=False))
            kmsg = ("--kmsg-path", str(tmp / "kmsg")) if extra else ()
            proc, address = start_exporter(scenario, node, tmp, *kmsg, *extra)
            procs.append(proc)
            targets.append(Target(address, cluster))
        yield targets
    finally:
        for proc in procs:
            stop(proc)


def _regex_escape(value: str) -> str:
    # Grafana's Prometheus datasource escapes multi-value variables like this
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", value)


def _substitute(text: str, values: dict[str, str]) -> str:
    text = text.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE)
    for name in sorted(values, key=len, reverse=True):
        text = text.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    return text


def _label_values(base: str, var_query: str) -> list[str]:
    m = re.fullmatch(LABEL_VALUES, var_query)
    assert m, var_query
    selector, label = m.groups()
    url = f"{base}/api/v1/series?{urllib.parse.urlencode({'match[]': selector})}"
    body = json.loads(http_get(url))
    assert body["status"] == "success", body
    return sorted({s[label] for s in body["data"] if s.get(label)})


def _resolve(base: str, board: dict[str, Any]) -> dict[str, str] | None:
    """Each variable's value as Grafana would set it; None while a variable has no value yet."""
    values: dict[str, str] = {}
    for var in _variables(board):
        options = _label_values(base, _substitute(var["query"], values))
        if not options:
            return None
        if var["multi"]:
            values[var["name"]] = "(" + "|".join(_regex_escape(o) for o in options) + ")"
        else:
            choice = CHOICES[var["name"]]
            if choice not in options:
                return None
            values[var["name"]] = choice
    return values


def _empty_queries(base: str, board: dict[str, Any], values: dict[str, str]) -> list[str]:
    empty = []
    for p in _panels(board):
        for t in p["targets"]:
            expr = _substitute(t["expr"], values)
            if not query(base, expr):
                empty.append(f"{p['title']} [{t['refId']}]: {expr}")
    return empty


def _check_on_prometheus(tmp_path: Path, exporters: list[Target], opts: DashboardOptions,
                         rule_opts: RuleOptions, cluster: bool) -> None:  # fmt: skip
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    if cluster:
        static = [{"targets": [t.address for t in exporters if t.cluster == cl], "labels": {"cluster": cl}}
                  for cl in ("east", "west")]  # fmt: skip
    else:
        static = [{"targets": [t.address for t in exporters]}]
    proc, base = run_prometheus(tmp_path, render_rules(rule_opts), static)
    try:
        boards = _boards(opts)
        for name, board in boards.items():
            # a dashboard without variables resolves to {}: poll on a non-empty tuple
            resolved = poll(lambda board=board: (v,) if (v := _resolve(base, board)) is not None else None, 60)
            assert resolved, f"{name}: variables {[v['name'] for v in _variables(board)]} got no value"
            (values,) = resolved
            empty = poll(lambda board=board, values=values: not _empty_queries(base, board, values), deadline_s=30)
            assert empty, f"{name}: empty queries:\n" + "\n".join(_empty_queries(base, board, values))
        # the check can fail: a query on a series nobody records is reported
        board = copy.deepcopy(next(iter(boards.values())))
        panel = _panels(board)[0]
        panel["targets"] = [{**panel["targets"][0], "expr": "k8s_node_gpu_usde{node_name!=\"\"}", "refId": "Z"}]
        board["panels"] = [panel]
        assert _empty_queries(base, board, {}) == [f"{panel['title']} [Z]: k8s_node_gpu_usde{{node_name!=\"\"}}"]
        assert not rule_health(base)
    finally:
        stop(proc)


@pytest.mark.e2e
def test_every_panel_query_returns_data(exporters: list[Target], tmp_path: Path) -> None:
    """The committed (default) dashboards on the default recording rules."""
    _check_on_prometheus(tmp_path, exporters, DashboardOptions(), RuleOptions(interval="1s"), cluster=False)


@pytest.mark.e2e
def test_every_panel_query_returns_data_with_a_cluster_label(exporters: list[Target], tmp_path: Path) -> None:
    _check_on_prometheus(tmp_path, exporters, DashboardOptions(cluster_label="cluster"),
                         RuleOptions(cluster_label="cluster", interval="1s"), cluster=True)  # fmt: skip


# ------------------------------------------------------------------ docs


def test_docs_describe_every_panel_variable_and_option() -> None:
    doc = (ROOT / "docs" / "dashboards.md").read_text(encoding="utf-8")
    for name, board in _boards(DashboardOptions()).items():
        assert f"`dashboards/{name}`" in doc and f"`{board['uid']}`" in doc
        section = doc.split(f"## {board['title']}\n", 1)
        assert len(section) == 2, f"no section for {board['title']}"
        section_text = re.sub(r"\s+", " ", section[1].split("\n## ", 1)[0])
        for p in board["panels"]:
            assert f"**{p['title']}**" in section_text, f"{board['title']}: panel {p['title']!r} undocumented"
        for var in _variables(board):
            assert f"`{var['query']}`" in doc, var["query"]
    assert not undocumented_flags(dashboards_cli.build_parser(), doc)
    assert "scripts/generate.sh\n" in doc and f"`{CONFIGMAP}`" in doc
    assert "kube-gpu-exporter dashboards -o dashboards\n" not in doc  # the one command, not one per file
