"""``kube-gpu-exporter top``: the pure rows (exporter/top/rows.py), the Textual app driven by its Pilot
against a local HTTP server (top_app.py), the error paths and the message without textual (top.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.exposition.status import status_json, status_view
from exporter.shell import cli
from exporter.shell.cli import build_daemon
from exporter.shell.config import SUBCOMMANDS, load_config
from exporter.top import command as top
from exporter.top.rows import GPU_COLUMNS, FetchError, build_view, fetch_status, gpu_row, problem_row, status_url

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "examples" / "mixed-4gpu-node.yaml"
MIG = ROOT / "examples" / "mig-a100-node.yaml"


def status_of(scenario: Path) -> dict:
    """The served status tree of one simulated cycle, as /status.json has it."""
    daemon = build_daemon(load_config(["--simulate", str(scenario)]))
    try:
        snapshot, _ = daemon.pipeline.step()
    finally:
        daemon.close()
    view = status_view(snapshot.status, snapshot.sample_failures_total, snapshot.built_at + 2, True)
    return json.loads(status_json(view))


@pytest.fixture(scope="module")
def mixed() -> dict:
    return status_of(MIXED)


def test_rows_of_the_mixed_node(mixed: dict) -> None:
    view = build_view(mixed)
    assert view.message == "" and view.header.startswith(f"node {mixed['node']} | ready | 1 warning, 1 info | "
                                                         "age 2.0s | NVML up")
    assert [r[0] for r in view.gpus] == ["0", "1", "2", "3"]
    assert [r[3] for r in view.gpus] == ["exclusive", "exclusive", "share", "exclusive"]
    gpu = mixed["gpus"][2]
    assert view.gpus[2][4] == f"{gpu['utilization_percent']:.0f}"
    assert view.gpus[2][8] == str(gpu["temperature_celsius"])
    rows = {r[2]: r for r in view.containers}
    infer, trainer = rows["infer-a-7c6b5d4f3-qwert"], rows["trainer-5d8f7c9b4-x2k9p"]
    assert infer[:2] == ("2", "serving") and infer[4:] == ("share", "hami", "30", "22", "19.5", "18.0")
    assert trainer[4:7] == ("exclusive", "nvidia", "100") and trainer[8] == "80.0"
    assert rows["nightly-eval-29012345-k7m2p"][0] == "3"
    assert view.unaccounted == [("2", "2003", "ollama", "5", "2.0", "-", "-", "-")]  # ollama on the host
    assert [r[:2] for r in view.problems] == [("warning", "2"), ("info", "3")]  # ollama; nightly-eval idle
    assert view.xids == []


def test_the_mps_daemons_have_their_own_table() -> None:
    view = build_view(status_of(MIXED.parent / "realworld-nvidia-mps.yaml"))
    assert view.unaccounted == []
    assert [r[:3] + r[5:7] for r in view.infrastructure] == [
        (gpu, "3301", "nvidia-cuda-mps", "nvidia-device-plugin", "nvidia-device-plugin-mps-control-daemon-6xq4t")
        for gpu in ("0", "1")]


def test_rows_of_the_mig_node() -> None:
    view = build_view(status_of(MIG))
    labels = [r[0] for r in view.gpus]
    assert labels == ["0", "0/MIG 3g.40gb GI 2", "0/MIG 2g.20gb GI 3", "0/MIG 2g.20gb GI 4", "1"]
    by_pod = {r[2]: r for r in view.containers}
    assert by_pod["train-large-0"][0] == "0/MIG 3g.40gb GI 2" and by_pod["train-large-0"][7] == "-"  # no MIG SM use
    assert by_pod["notebook-ana"][0] == "1"


def test_rows_tell_the_health_an_operator_acts_on() -> None:
    """Energy and the Health column, like the status page (tests/scenarios/health_node.yaml: GPU 6 failed
    a row remap, GPU 7 has one pending, GPU 2's clocks are held by sw_power_cap + sw_thermal_slowdown)."""
    status = status_of(ROOT / "tests" / "scenarios" / "health_node.yaml")
    view = build_view(status)
    health = {r[0]: r[GPU_COLUMNS.index("Health")] for r in view.gpus}
    assert health["6"] == "!! row remap failed: replace the GPU"
    assert health["7"] == "!! row remap pending: reset the GPU"
    assert health["2"] == "clocks held: sw_power_cap, sw_thermal_slowdown"
    assert health["0"] == "ok"
    joules = status["gpus"][0]["energy_joules"]
    assert joules > 0 and view.gpus[0][GPU_COLUMNS.index("Energy kWh")] == f"{joules / 3.6e6:.2f}"
    # an older exporter's tree without these fields: dashes, no error
    bare = {**status, "gpus": [{k: v for k, v in status["gpus"][0].items()
                                if k not in ("energy_joules", "remapped_rows", "clocks_event_reasons")}]}
    assert build_view(bare).gpus[0][-2:] == ("-", "-")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=12)


@given(st.dictionaries(st.sampled_from(["remapped_rows", "clocks_event_reasons", "energy_joules", "power_watts",
                                        "model", "index"]), json_values))
@settings(max_examples=300, deadline=None)
def test_gpu_rows_of_any_json_never_raise(gpu: dict) -> None:
    """A remote status tree is data, not trusted code: any JSON in these fields gives a row of strings."""
    row = gpu_row("0", gpu)
    assert len(row) == len(GPU_COLUMNS) and all(isinstance(c, str) and "\n" not in c for c in row)


def test_rows_of_odd_trees(mixed: dict) -> None:
    assert build_view({"ready": False, "node": None, "gpus": [], "subsystems": None}).message.startswith(
        "the exporter has not published")
    assert build_view({**mixed, "gpus": [], "unplaced": []}).message == f"no GPUs on node {mixed['node']}"
    assert "not a kube-gpu-exporter status" in build_view({"hello": 1}).message
    xids = build_view({**mixed, "gpus": [{**mixed["gpus"][0], "xids": [{"xid": 79, "count": 2, "severity": "node",
                                                                          "meaning": "fell off\nthe bus"}]}]}).xids
    assert xids == [("0", "79", "2", "-", "-", "node", "fell off the bus")]


def test_problems_come_first_the_same_as_the_page(tmp_path: Path) -> None:
    """The served list as is; an older exporter's tree without one is judged by the same code."""
    from exporter.exposition.problems import find_problems

    status = status_of(ROOT / "examples" / "trouble-node.yaml")
    view = build_view(status)
    assert [r[0] for r in view.problems][:3] == ["critical"] * 3 and view.problems[-1][0] == "info"
    assert view.problems == [problem_row(p) for p in status["problems"]]
    assert view.problems[0][:2] == ("critical", "0") and "is lost" in view.problems[0][2]
    assert "| 4 critical, 7 warning, 2 info |" in view.header  # without its kernel log: no Xids
    older = {k: v for k, v in status.items() if k != "problems"}
    assert build_view(older).problems == view.problems
    assert find_problems(older, status["built_at"] + status["snapshot_age_seconds"]) == status["problems"]
    healthy = build_view(status_of(ROOT / "examples" / "dra-sharing-node.yaml"))
    assert healthy.problems == [] and "| nothing wrong |" in healthy.header
    culprit = {"namespace": "ml", "pod": "t-0", "container": "main", "count": 1, "last_at": 0}
    xid = {"xid": 31, "count": 1, "last_at": 0, "pods": [culprit], "severity": "application", "meaning": "m"}
    row = build_view({**status, "gpus": [{**status["gpus"][1], "xids": [xid]}]}).xids[0]
    assert row == ("1", "31", "1", "1970-01-01T00:00:00Z", "ml/t-0", "application", "m")


def test_status_url() -> None:
    assert status_url("http://h:9400") == "http://h:9400/status.json"
    assert status_url("h:9400/") == "http://h:9400/status.json"
    assert status_url("http://h/x/status.json") == "http://h/x/status.json"


class Server:
    """A local HTTP server whose /status.json body (and status code) the test sets."""

    def __init__(self) -> None:
        self.body, self.code = b"{}", 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(outer.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.mark.e2e
def test_fetch_errors(server: Server) -> None:
    server.body = b"<html>"
    with pytest.raises(FetchError, match="not JSON"):
        fetch_status(server.url, 2)
    server.body = b"[1]"
    with pytest.raises(FetchError, match="not a status tree"):
        fetch_status(server.url, 2)
    server.code, server.body = 503, b"{}"
    with pytest.raises(FetchError, match="HTTP 503"):
        fetch_status(server.url, 2)
    with pytest.raises(FetchError, match="unreachable"):
        fetch_status("http://127.0.0.1:1", 2)


def _cells(app, table_id: str) -> list[list[str]]:
    from textual.widgets import DataTable
    table = app.query_one(f"#{table_id}", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def _text(app, widget_id: str) -> str:
    from textual.widgets import Static
    return str(app.query_one(f"#{widget_id}", Static).render())


@pytest.mark.e2e
def test_app_shows_the_node_and_survives_errors(server: Server, mixed: dict) -> None:
    pytest.importorskip("textual")
    from textual.widgets import DataTable

    from exporter.top.app import TopApp

    server.body = json.dumps(mixed).encode()

    async def drive() -> None:
        app = TopApp(server.url, interval=60, timeout=2)
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.press("r")
            await pilot.pause()
            pods = [row[2] for row in _cells(app, "containers")]
            assert "infer-a-7c6b5d4f3-qwert" in pods and "trainer-5d8f7c9b4-x2k9p" in pods
            infer = next(r for r in _cells(app, "containers") if r[2] == "infer-a-7c6b5d4f3-qwert")
            assert infer[4:8] == ["share", "hami", "30", "22"]
            assert [r[0] for r in _cells(app, "gpus")] == ["0", "1", "2", "3"]
            assert _cells(app, "unaccounted")[0][1:3] == ["2003", "ollama"]
            problems = app.query_one("#problems", DataTable)
            assert [str(c) for c in problems.get_row_at(0)][:2] == ["WARNING", "2"]
            assert problems.get_row_at(0)[0].style == "bold yellow"  # coloured by severity
            assert app.query("DataTable")[0].id == "problems"  # the first table
            assert mixed["node"] in _text(app, "header") and _text(app, "message") == ""

            server.body = b"not json"
            await pilot.press("r")
            await pilot.pause()
            assert "not JSON" in _text(app, "message") and app.last_error
            assert len(_cells(app, "containers")) >= 2  # the last tables stay

            server.body = json.dumps({**mixed, "gpus": [], "unplaced": []}).encode()
            await pilot.press("r")
            await pilot.pause()
            assert _text(app, "message") == f"no GPUs on node {mixed['node']}" and _cells(app, "gpus") == []
            await pilot.press("q")
        assert app.return_code == 0

    asyncio.run(drive())


def test_app_on_an_unreachable_url() -> None:
    pytest.importorskip("textual")
    from exporter.top.app import TopApp

    async def drive() -> None:
        app = TopApp("http://127.0.0.1:1", interval=60, timeout=1)
        async with app.run_test() as pilot:
            await pilot.press("r")
            await pilot.pause()
            assert "unreachable" in _text(app, "message")
            await pilot.press("q")

    asyncio.run(drive())


def test_without_textual_top_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "textual", None)  # import textual -> ImportError
    monkeypatch.delitem(sys.modules, "exporter.top.app", raising=False)
    for name in [m for m in sys.modules if m.startswith("textual.")]:
        monkeypatch.delitem(sys.modules, name)
    assert cli.main(["top", "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err == top.INSTALL_HINT + "\n" and "pip install '.[top]' from a checkout" in err


def test_top_is_a_subcommand_with_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert SUBCOMMANDS["top"][0] == top.__name__
    with pytest.raises(SystemExit) as exit_:
        cli.main(["top", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kube-gpu-exporter top ") and "--interval" in out and "--url" in out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["top", "--interval", "0"])
    assert exit_.value.code == 2


@pytest.mark.e2e
def test_the_daemon_does_not_import_textual() -> None:
    import subprocess
    code = ("import sys, exporter.shell.cli, exporter.top.command, exporter.top.rows; "
            "print(any(m == 'textual' or m.startswith('textual.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def _vector(*samples: tuple[dict[str, str], float]) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1700000000.0, str(v)]} for m, v in samples]}}


GI = 1024**3
PROM = {
    "workload_used": _vector(({"namespace_name": "ml", "workload_kind": "Deployment", "workload_name": "trainer"}, 93),
                             ({"namespace_name": "serving", "workload_kind": "Deployment", "workload_name": "infer-a"},
                              22)),
    "workload_memory": _vector(({"namespace_name": "ml", "workload_kind": "Deployment", "workload_name": "trainer"},
                                60 * GI),),
    "namespace_used": _vector(({"namespace_name": "serving"}, 63), ({"namespace_name": "ml"}, 93)),
    "namespace_memory": _vector(({"namespace_name": "ml"}, 60 * GI),),
    "node_capacity": _vector(({"node_name": "gpu-a"}, 400), ({"node_name": "gpu-b"}, 100)),
    "node_used": _vector(({"node_name": "gpu-a"}, 160), ({"node_name": "gpu-b"}, 0)),
    "node_allocated": _vector(({"node_name": "gpu-a"}, 320), ({"node_name": "gpu-b"}, 100)),
    "node_memory": _vector(({"node_name": "gpu-a"}, 100 * GI),),
    "node_allocated_memory": _vector(({"node_name": "gpu-a"}, 200 * GI),),
    "cluster_used": _vector(({}, 32),),
    "cluster_request": _vector(({}, 84),),
    "cluster_total": _vector(({}, 500),),
    "idle": _vector(({"node_name": "gpu-b", "namespace_name": "batch", "pod_name": "nightly-eval-0",
                      "container_name": "eval"}, 100),),
    "unknown": _vector(({"node_name": "gpu-a", "namespace_name": "research", "pod_name": "mig-train-0",
                         "container_name": "trainer"}, 100),),
}


class FakePrometheus(Server):
    """/api/v1/query answering each query of top_prom.QUERIES with PROM's vector."""

    def __init__(self) -> None:
        from urllib.parse import parse_qs, urlparse

        from exporter.top.prom import QUERIES
        by_query = {q: json.dumps(PROM[name]).encode() for name, q in QUERIES.items()}
        super().__init__()
        outer = self

        def body_for(path: str) -> bytes:
            url = urlparse(path)
            if url.path != "/api/v1/query":
                return b"404"
            return by_query.get(parse_qs(url.query)["query"][0], json.dumps(_vector()).encode())

        self.body_for = body_for

        class Handler(self.httpd.RequestHandlerClass):  # type: ignore[misc,name-defined]
            def do_GET(self) -> None:
                outer.body = outer.body_for(self.path) if outer.code == 200 else outer.body
                super().do_GET()

        self.httpd.RequestHandlerClass = Handler


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    s = FakePrometheus()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.mark.e2e
def test_cluster_rows(prometheus: FakePrometheus) -> None:
    from exporter.top.prom import build_cluster_view, fetch_cluster
    view = build_cluster_view(fetch_cluster(prometheus.url, 2))
    assert view.header == ("cluster: 5 healthy GPUs | used 32% | allocated 84% | 1 idle allocations"
                           " | 1 with use unknown (no utilisation from NVML)")
    assert view.message == ""
    assert view.workloads == [("ml", "Deployment", "trainer", "93", "60.0"),
                              ("serving", "Deployment", "infer-a", "22", "-")]
    assert view.namespaces == [("ml", "93", "60.0"), ("serving", "63", "-")]
    assert view.nodes == [("gpu-a", "4", "160", "320", "50", "100.0", "200.0"),
                          ("gpu-b", "1", "0", "100", "0", "-", "-")]
    assert view.idle == [("gpu-b", "batch", "nightly-eval-0", "eval", "100")]
    assert view.unknown == [("gpu-a", "research", "mig-train-0", "trainer", "100")]  # not counted idle
    assert "no kube-gpu-exporter recorded series" in build_cluster_view({}).message
    assert "use unknown" not in build_cluster_view({}).header  # said only where there is one


@pytest.mark.e2e
def test_cluster_view_tells_idle_from_use_unknown_on_real_prometheus(tmp_path: Path) -> None:
    """The recorded series of two simulated nodes in a real Prometheus: the A100's MIG holders have no usage
    series (NVML has no MIG utilization before Hopper): use unknown, not idle; its notebook at 0% is idle;
    the H100's MIG holders have their GPU instance's GPM, so they are neither."""
    from exporter.bundle.rules import RuleOptions, render_rules
    from exporter.top.prom import build_cluster_view, fetch_cluster
    from tests.prom_support import PROMETHEUS, poll, query, run_prometheus, start_exporter, stop

    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    doc = yaml.safe_load(MIG.read_text())
    whole = doc["devices"][1]
    whole["utilization_gpu"] = 0
    whole["processes"][0]["sm_util"] = 0
    a100 = tmp_path / "mig-a100-idle.yaml"
    a100.write_text(yaml.safe_dump(doc))
    logs = tmp_path / "logs"
    logs.mkdir()
    procs, addresses = [], []
    try:
        for scenario, node in ((a100, "gpu-node-mig-1"), (ROOT / "examples" / "mig-h100-node.yaml",
                                                          "gpu-node-mig-h100")):
            proc, address = start_exporter(scenario, node, logs, "--no-xid", "--interval", "0.2")
            procs.append(proc)
            addresses.append(address)
        prom, base = run_prometheus(tmp_path, render_rules(RuleOptions(interval="1s")), [{"targets": addresses}])
        procs.append(prom)
        assert poll(lambda: len(query(base, "k8s_container_gpu_request")) == 6, deadline_s=60)
        assert poll(lambda: len(query(base, "k8s_container_gpu_used")) == 4, deadline_s=30)
        view = build_cluster_view(fetch_cluster(base, 5))
        assert view.idle == [("gpu-node-mig-1", "research", "notebook-ana", "lab", "100")]
        assert view.unknown == [("gpu-node-mig-1", "research", "train-large-0", "trainer", "100"),
                                ("gpu-node-mig-1", "serving", "infer-small-6d5c4b3a2-xk2lp", "server", "100")]
        assert "| 1 idle allocations | 2 with use unknown" in view.header
    finally:
        for proc in reversed(procs):
            stop(proc)


@pytest.mark.e2e
def test_cluster_fetch_errors(server: Server) -> None:
    from exporter.top.prom import query
    server.body = b'{"status": "error", "error": "parse error"}'
    with pytest.raises(FetchError, match="query failed: parse error"):
        query(server.url, "up", 2)
    server.body = b"{}"
    with pytest.raises(FetchError, match="not a Prometheus"):
        query(server.url, "up", 2)
    with pytest.raises(FetchError, match="unreachable"):
        query("http://127.0.0.1:1", "up", 2)


@pytest.mark.e2e
def test_cluster_app(prometheus: FakePrometheus) -> None:
    pytest.importorskip("textual")
    from exporter.top.app import ClusterApp

    async def drive() -> None:
        app = ClusterApp(prometheus.url, interval=60, timeout=2)
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.press("r")
            await pilot.pause()
            assert [r[2] for r in _cells(app, "workloads")] == ["trainer", "infer-a"]
            assert _cells(app, "nodes")[0] == ["gpu-a", "4", "160", "320", "50", "100.0", "200.0"]
            assert _cells(app, "idle")[0][2] == "nightly-eval-0"
            assert "5 healthy GPUs" in _text(app, "header")
            prometheus.code, prometheus.body = 502, b"bad gateway"
            await pilot.press("r")
            await pilot.pause()
            assert "HTTP 502" in _text(app, "message")
            await pilot.press("q")

    asyncio.run(drive())
