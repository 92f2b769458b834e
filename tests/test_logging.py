"""Fail loud, recover quietly: the start-up summary, NVML down (log and /readyz), state changes logged once,
Xids at warning level rate-limited, and the JSON log format."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter import __version__
from exporter.exposition.snapshot import empty_snapshot
from exporter.model import NodeSample
from exporter.node.pod_store import PodStore
from exporter.pipeline.cycle import Pipeline, PodState, Settings, Sources
from exporter.pipeline.holder import SnapshotHolder
from exporter.pipeline.sampler import SamplerThread
from exporter.server.app import make_app
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.shell.logging_setup import JsonFormatter, StateLog
from exporter.shell.sources import PodResourcesSource, XidSource, pod_resources_state
from exporter.shell.status import CycleMonitor, XidLog
from exporter.shell.summary import profiling_text
from exporter.xid.stats import XidStats
from tests.http_support import AppClient
from tests.integration_support import PodResourcesServer, free_port, poll

ROOT = Path(__file__).resolve().parent.parent
MIG = ROOT / "examples" / "mig-a100-node.yaml"
SEED = ROOT / "examples" / "seed-cgpu-t4.yaml"


# ------------------------------------------------------------------ helpers


class Backend:
    """NVML down while ``errors`` grow, up once ``up`` is set."""

    def __init__(self) -> None:
        self.up, self.attempts = False, 0

    def sample(self) -> NodeSample:
        if not self.up:
            self.attempts += 1
        return NodeSample(timestamp=1.0, nvml_up=self.up,
                          errors={("nvmlInit", "NVMLError_LibraryNotFound"): self.attempts})


class Proc:
    def resolve(self, pids):
        return dict.fromkeys(pids)

    def skips(self):
        return {}


class Pods:
    def __init__(self) -> None:
        self.synced, self.errors = False, 0
        self.view = PodStore().view()

    def __call__(self) -> PodState:
        return PodState(view=self.view, synced=self.synced, last_sync=None, sync_errors=self.errors)


def records(caplog: pytest.LogCaptureFixture, level: int, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and words in r.getMessage()]


def serving_exporter(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "exporter", *argv], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def stop_all() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# ------------------------------------------------------------------ the start-up summary


def test_one_summary_line_after_the_first_cycle(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    daemon = build_daemon(load_config(["--simulate", str(MIG), "--no-xid"], environ={}))
    try:
        daemon.start()
        lines = [r.getMessage() for r in caplog.records if f"kube-gpu-exporter {__version__} on node" in r.getMessage()]
        assert len(lines) == 1, lines
        (line,) = lines
        for part in ("on node gpu-node-mig-1", "driver ", "NVML ", "2 GPUs (2x NVIDIA A100-SXM4-80GB)",
                     "MIG on 1 of them (3 MIG devices)",
                     "profiling (GPM): unavailable on this node (NVML offers it on Hopper and newer only)",
                     "sharing: nvidia", "pod watch: scenario (3 pods)",
                     "pod-resources: scenario", "kernel log: off (--no-xid)"):
            assert part in line, (part, line)
        daemon.sampler.run_once()
        assert sum("on node" in r.getMessage() for r in caplog.records) == 1  # once, not every cycle
    finally:
        daemon.close()


@pytest.mark.parametrize(("scenario", "says"), [
    ("mig-h100-node.yaml", "profiling (GPM): available; sharing:"),
    ("mixed-4gpu-node.yaml", "profiling (GPM): unavailable on this node"),
])
def test_summary_says_whether_the_node_has_profiling(caplog: pytest.LogCaptureFixture, scenario: str,
                                                     says: str) -> None:
    caplog.set_level(logging.INFO)
    daemon = build_daemon(load_config(["--simulate", str(ROOT / "examples" / scenario), "--no-xid"], environ={}))
    try:
        daemon.start()
        assert records(caplog, logging.INFO, says), caplog.text
    finally:
        daemon.close()


def test_profiling_text_counts_the_gpus_with_gpm() -> None:
    assert profiling_text({}) == "profiling (GPM): unknown"  # NVML has not answered for any card yet
    assert profiling_text({"GPU-a": True, "GPU-b": True}) == "profiling (GPM): available"
    assert profiling_text({"GPU-a": True, "GPU-b": False, "GPU-c": False}) == (
        "profiling (GPM): available on 1 of 3 GPUs")
    assert profiling_text({"GPU-a": False}).startswith("profiling (GPM): unavailable on this node")


def test_summary_names_the_sharing_scheme_of_the_pods(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    daemon = build_daemon(load_config(["--simulate", str(SEED), "--no-xid"], environ={}))
    try:
        daemon.start()
        assert records(caplog, logging.INFO, "sharing: aliyun-gpushare;"), caplog.text
    finally:
        daemon.close()


# ------------------------------------------------------------------ NVML down: log once, /readyz 503


def nvml_down_pipeline() -> tuple[Backend, Pipeline, SnapshotHolder]:
    backend = Backend()
    return backend, Pipeline(Sources(backend, Proc(), Pods()), Settings("n1")), SnapshotHolder(empty_snapshot(0.0))


def test_nvml_down_is_one_error_naming_the_fix_and_recovery_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    backend, pipeline, holder = nvml_down_pipeline()
    monitor = CycleMonitor(pipeline, pod_watch=False)
    sampler = SamplerThread(pipeline, holder, 1.0, on_cycle=monitor)
    for _ in range(5):
        sampler.run_once()
    errors = records(caplog, logging.ERROR, "NVML cannot initialise (nvmlInit: NVMLError_LibraryNotFound)")
    assert len(errors) == 1, caplog.text
    assert "runtimeClassName: nvidia" in errors[0] and "NVIDIA_VISIBLE_DEVICES" in errors[0]
    assert monitor.not_ready_reason() == "NVML cannot initialise (nvmlInit: NVMLError_LibraryNotFound)"
    backend.up = True
    for _ in range(3):
        sampler.run_once()
    assert len(records(caplog, logging.INFO, "NVML initialised again")) == 1
    assert monitor.not_ready_reason() is None
    backend.up = False
    sampler.run_once()
    assert len(records(caplog, logging.ERROR, "NVML cannot initialise")) == 2  # a new outage is news again


@pytest.mark.e2e
@pytest.mark.parametrize("ready_without_nvml", [False, True])
def test_readyz_is_503_with_the_reason_while_nvml_is_down(ready_without_nvml: bool) -> None:
    backend, pipeline, holder = nvml_down_pipeline()
    monitor = CycleMonitor(pipeline, pod_watch=False, ready_without_nvml=ready_without_nvml)
    sampler = SamplerThread(pipeline, holder, 1.0, on_cycle=monitor)
    sampler.run_once()

    async def readyz() -> tuple[int, str]:
        app = make_app(holder, stale_after=60.0, not_ready=monitor.not_ready_reason)
        async with AppClient(app) as client:
            resp = await client.get("/readyz")
            return resp.status, await resp.text()

    status, text = asyncio.run(readyz())
    if ready_without_nvml:
        assert (status, text) == (200, "ok\n")
    else:
        assert status == 503 and "NVML cannot initialise (nvmlInit: NVMLError_LibraryNotFound)" in text
    backend.up = True
    sampler.run_once()
    assert asyncio.run(readyz()) == (200, "ok\n")


@pytest.fixture(scope="module")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fake_nvml import build_fake_nvml

    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml")).parent


@pytest.mark.e2e
def test_real_mode_without_nvml_then_recovery(tmp_path: Path, fake_nvml_dir: Path,
                                              stop_all: list[subprocess.Popen[bytes]]) -> None:
    """The real command line on the fake NVML: init fails twice, then works (backoff 1 s, 2 s)."""
    from tests.fake_nvml import subprocess_env, write_config

    config = write_config({"node": "n1", "devices": [{"uuid": "GPU-1", "name": "NVIDIA T4"}],
                           "nvml": {"init_failures": 2}}, tmp_path / "nvml.conf")
    port, log = free_port(), tmp_path / "out.log"
    stop_all.append(serving_exporter(["--no-pod-watch", "--no-xid", "--node-name", "n1", "--pod-resources-socket",
                                      "", "--listen", f"127.0.0.1:{port}"], subprocess_env(fake_nvml_dir, config),
                                     log))
    url = f"http://127.0.0.1:{port}/readyz"

    def answered() -> tuple[int, str] | None:
        try:
            return get(url)
        except (urllib.error.URLError, ConnectionError):
            return None

    status, text = poll(answered, 30, "/readyz to answer")
    assert status == 503 and "NVML cannot initialise" in text, (status, text)
    poll(lambda: get(url) == (200, "ok\n") or None, 30, "/readyz to turn 200 once NVML is up")
    output = poll(lambda: ((t := log.read_text()).count("NVML initialised again") and t) or None, 10, "recovery")
    assert output.count("ERROR kube_gpu_exporter: NVML cannot initialise") == 1, output
    assert output.count("NVML initialised again") == 1, output
    assert "runtimeClassName: nvidia" in output


def test_ready_without_nvml_flag_and_variable() -> None:
    assert load_config(["--ready-without-nvml"], environ={}).ready_without_nvml
    assert load_config([], environ={"KUBE_GPU_EXPORTER_READY_WITHOUT_NVML": "true"}).ready_without_nvml
    assert not load_config([], environ={}).ready_without_nvml


# ------------------------------------------------------------------ other subsystems: state changes once


def test_pod_watch_logs_sync_loss_and_return_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    pods = Pods()
    monitor = CycleMonitor(Pipeline(Sources(Backend(), Proc(), pods), Settings("n1")), pod_watch=True)
    for synced, errors in [(False, 0), (True, 0), (True, 0), (False, 1), (False, 2), (False, 3), (True, 3), (True, 3)]:
        pods.synced, pods.errors = synced, errors
        monitor()
    messages = [r.getMessage() for r in caplog.records if "pod watch" in r.getMessage()]
    assert messages == ["pod watch synced: 0 pods on this node",
                        "pod watch lost its sync with the API (1 errors so far): rows keep the last pod view "
                        "until it is back",
                        "pod watch synced again: 0 pods on this node"], messages


@pytest.mark.e2e
def test_pod_resources_trouble_once_and_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    server = PodResourcesServer()
    Path(server.socket_path).write_text("not a socket")
    source = PodResourcesSource(server.socket_path, timeout=5.0)
    for _ in range(4):
        assert source() is None
    assert len(records(caplog, logging.WARNING, "kubelet pod-resources unavailable")) == 1
    assert source.state.startswith("unavailable") and pod_resources_state(source) == (source.state, False)
    Path(server.socket_path).unlink()
    with server:
        for _ in range(3):
            assert source() == ()
    assert len(records(caplog, logging.INFO, "kubelet pod-resources available again")) == 1
    assert source.state == "ok" and pod_resources_state(source) == ("ok", True)


def test_source_states_for_the_status_page(tmp_path: Path) -> None:
    """ok: in use and answering; False: configured and failing (a problem); None: not in use (no problem)."""
    assert pod_resources_state(PodResourcesSource("")) == ("disabled (--pod-resources-socket '')", None)
    missing = PodResourcesSource(str(tmp_path / "none.sock"))
    assert missing() is None and pod_resources_state(missing)[1] is None  # the chart mounts it only when asked
    assert pod_resources_state(lambda: ()) == ("simulated (the scenario's answers)", None)
    for text, ok in (("reading /dev/kmsg", True), ("cannot read /dev/kmsg: Xid watcher disabled", False),
                     ("cannot read /dev/kmsg: Xids from NVML events only", False), ("off (--no-xid)", None),
                     ("none (--kmsg-path none): Xids from NVML events only, without pods", None), ("none", None),
                     ("not started", None)):
        assert XidSource(kernel_log=text).state() == (text, ok), text


def test_events_failing_and_back_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    stats = {"s": XidStats()}
    pipeline = Pipeline(Sources(Backend(), Proc(), Pods()), Settings("n1"))
    monitor = CycleMonitor(pipeline, pod_watch=False, xid_stats=lambda: stats["s"])
    for posted, failed in [(1, 0), (1, 1), (1, 2), (1, 5), (2, 5), (3, 5)]:
        stats["s"] = XidStats(events_posted=posted, events_failed=failed)
        monitor()
    assert len(records(caplog, logging.WARNING, "Kubernetes Events for Xids are not being written")) == 1
    assert len(records(caplog, logging.INFO, "Kubernetes Events for Xids are written again")) == 1


def test_state_log_logs_each_state_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    state = StateLog(logging.getLogger("t"))
    assert not state.good("ok", "back")  # the first good state is the summary's to tell
    assert state.bad("a", "trouble a") and not state.bad("a", "trouble a")
    assert state.bad("b", "trouble b")  # another reason is news
    assert state.good("ok", "back") and not state.good("ok", "back")
    assert [r.getMessage() for r in caplog.records] == ["trouble a", "trouble b", "back"]


def test_xids_are_warnings_rate_limited_per_gpu_and_xid(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    now = {"t": 0.0}
    xids = XidLog(clock=lambda: now["t"], interval=60.0)
    key79 = ("GPU-1", None, 79, "ml", "train", "main")
    key13 = ("GPU-1", None, 13, "", "", "")
    for second in range(0, 130, 10):  # one more Xid 79 every 10 s
        now["t"] = float(second)
        xids.update({key79: second // 10 + 1, key13: 1})
    warnings = [r for r in caplog.records if "Xid" in r.getMessage()]
    assert all(r.levelno == logging.WARNING for r in warnings)
    lines79 = [r.getMessage() for r in warnings if r.getMessage().startswith("Xid 79")]
    assert len(lines79) == 3, lines79  # at 0, 60 and 120 s
    assert lines79[0].startswith("Xid 79 on GPU GPU-1 (pod ml/train, container main): 1 new")
    assert "6 new" in lines79[1] and "6 new" in lines79[2]  # the Xids held back are counted in
    assert "fallen off the bus" in lines79[0].lower()
    assert len([r for r in warnings if r.getMessage().startswith("Xid 13")]) == 1


def test_an_xid_line_names_the_minor_number_and_the_gpu_instance(caplog: pytest.LogCaptureFixture) -> None:
    """Before, the minor number was printed as "GPU instance" and the GPU instance not at all."""
    caplog.set_level(logging.INFO)
    xids = XidLog(clock=lambda: 0.0)
    xids.update({("GPU-86", 1, 31, "team-b", "mig-job", "worker"): 1, ("GPU-86", 1, 13, "", "", ""): 1,
                 ("GPU-2b", 2, 79, "", "", ""): 1, ("", None, 48, "", "", ""): 1},
                {("GPU-86", 1, 31): 1, ("GPU-86", 1, 13): 2, ("GPU-2b", 2, 79): None})
    lines = sorted(r.getMessage().split(":")[0] for r in caplog.records)
    assert lines == ["Xid 13 on GPU GPU-86 (minor 1, GPU instance 2)",
                     "Xid 31 on GPU GPU-86 (minor 1, GPU instance 1) (pod team-b/mig-job, container worker)",
                     "Xid 48 on GPU unknown", "Xid 79 on GPU GPU-2b (minor 2)"]


# ------------------------------------------------------------------ the JSON log format


def test_json_formatter_one_object_per_line() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.getLogger("kube_gpu_exporter").makeRecord(
            "kube_gpu_exporter", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "ERROR" and doc["logger"] == "kube_gpu_exporter" and doc["message"] == "failed: a\nb"
    assert doc["time"].endswith("+00:00") and "ValueError: boom" in doc["exception"]


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["flag", "env"])
def test_json_log_format_end_to_end(tmp_path: Path, how: str, stop_all: list[subprocess.Popen[bytes]]) -> None:
    port, log = free_port(), tmp_path / "out.log"
    argv = ["--simulate", str(SEED), "--no-xid", "--listen", f"127.0.0.1:{port}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # as the image runs it: every write its own system call
    if how == "flag":
        argv += ["--log-format", "json"]
    else:
        env["KUBE_GPU_EXPORTER_LOG_FORMAT"] = "json"
    stop_all.append(serving_exporter(argv, env, log))
    poll(lambda: "serving http" in log.read_text() or None, 30, "the exporter to serve")
    text = log.read_text()
    text = text[:text.rfind("\n") + 1]  # complete lines only: the exporter goes on writing meanwhile
    lines = [line for line in text.splitlines() if not line.startswith("kube-gpu-exporter: node")]
    docs = [json.loads(line) for line in lines]
    assert docs and all({"time", "level", "logger", "message"} <= set(d) for d in docs), lines
    assert any("on node" in d["message"] for d in docs)


class _Writes(io.RawIOBase):
    """A raw stream that records each system-call-level write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.writes.append(bytes(b))
        return len(b)


def test_the_banner_is_one_write_even_unbuffered() -> None:
    """Unbuffered (PYTHONUNBUFFERED, as in the image), print() makes the text and its newline two writes
    and a log line from another thread can land between them; say() makes one."""
    from exporter.shell.cli import say

    raw = _Writes()
    stream = io.TextIOWrapper(raw, write_through=True)  # what PYTHONUNBUFFERED gives sys.stdout
    print("kube-gpu-exporter: node n1, serving", file=stream, flush=True)
    assert raw.writes == [b"kube-gpu-exporter: node n1, serving", b"\n"]  # the hazard, as CPython has it
    raw.writes.clear()
    say("kube-gpu-exporter: node n1, serving", stream)
    assert raw.writes == [b"kube-gpu-exporter: node n1, serving\n"]


def test_bad_log_format_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.shell.cli import main

    assert main(["render", "--simulate", str(SEED), "--log-format", "xml"]) == 2
    err = capsys.readouterr().err
    assert err == "kube-gpu-exporter: error: --log-format must be text or json, got 'xml'\n"


@pytest.mark.parametrize("readable", [True, False])
def test_summary_says_whether_the_kernel_log_is_read(tmp_path: Path, readable: bool,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    kmsg = tmp_path / "kmsg"
    if readable:
        kmsg.write_text("")
    daemon = build_daemon(load_config(["--simulate", str(SEED), "--kmsg-path", str(kmsg), "--no-events"],
                                      environ={}))
    try:
        daemon.start()
        expected = f"kernel log: reading {kmsg}" if readable else f"kernel log: cannot read {kmsg}"
        assert len(records(caplog, logging.INFO, expected)) == 1, caplog.text
    finally:
        daemon.close()


def test_the_listener_waits_for_the_late_starts() -> None:
    """The first cycle's end is not enough: the Xid watcher's start and the summary line come first, so
    the banner follows the summary (a CI-like run under load printed it before)."""
    daemon = build_daemon(load_config(["--simulate", str(SEED), "--no-xid", "--no-events"], environ={}))
    release, order = threading.Event(), []
    daemon.late_starts.insert(0, lambda: (release.wait(30), order.append("late starts")))
    starter = threading.Thread(target=lambda: (daemon.start(wait_first=30), order.append("listening")))
    try:
        starter.start()
        poll(lambda: daemon.sampler.first_done.is_set() or None, 10, "the first cycle")
        assert starter.is_alive()
        release.set()
        starter.join(30)
        assert order == ["late starts", "listening"]
    finally:
        release.set()
        daemon.close()


def test_late_starts_that_hang_hold_the_listener_only_for_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    daemon = build_daemon(load_config(["--simulate", str(SEED), "--no-xid", "--no-events"], environ={}))
    release = threading.Event()
    daemon.late_starts.insert(0, lambda: release.wait(30))
    try:
        daemon.start(wait_first=2.0)  # the first cycle (milliseconds) within it, the late starts not
        assert daemon.sampler.first_done.is_set() and not daemon.sampler.settled.is_set()
        assert records(caplog, logging.WARNING, "the Xid watcher has not started after 2s: listening now")
        assert not records(caplog, logging.WARNING, "NVML initialisation")
    finally:
        release.set()
        daemon.close()
