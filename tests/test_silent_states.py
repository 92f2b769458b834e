"""Nothing silent (issue 26 item 7): a lost GPU and its recovery, a stuck sampler, NVML init that hangs at
start, each told in one log line when its state changes (exporter/shell/status.py, exporter/shell/cli.py)."""

from __future__ import annotations

import logging
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.exposition.snapshot import empty_snapshot
from exporter.model import DeviceSample, NodeSample
from exporter.node.pod_store import PodStore
from exporter.pipeline.cycle import Pipeline, PodState, Settings, Sources
from exporter.pipeline.holder import SnapshotHolder
from exporter.pipeline.sampler import SamplerThread
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.shell.status import CycleMonitor, StuckWatch, lost_changes, stuck_after, stuck_transition
from tests.integration_support import free_port, poll
from tests.test_logging import get, serving_exporter

ROOT = Path(__file__).resolve().parent.parent
LOSES_A_GPU = ROOT / "tests" / "scenarios" / "alerts_e2e_node.yaml"  # a GPU lost after 3 ticks

CARD = DeviceSample(index=0, uuid="GPU-a", name="NVIDIA A100", minor_number=0)
MIGS = [DeviceSample(index=1, uuid=f"MIG-{i}", name="NVIDIA A100", minor_number=1, parent_uuid="GPU-b")
        for i in range(3)]


def _messages(caplog: pytest.LogCaptureFixture, words: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if words in r.getMessage()]


def test_lost_changes_one_line_per_card() -> None:
    lost_card = replace(CARD, lost=True)
    lost_migs = [replace(m, lost=True) for m in MIGS]
    now, lost, back = lost_changes({}, [lost_card, *lost_migs])
    assert lost == ["GPU GPU-a (minor 0)", "GPU GPU-b (minor 1)"] and back == []  # a MIG card once
    now, lost, back = lost_changes(now, [lost_card, *MIGS])
    assert lost == [] and back == ["GPU GPU-b (minor 1)"] and list(now) == ["GPU-a"]
    assert lost_changes(now, [lost_card])[1:] == ([], [])  # still lost: nothing new


class Backend:
    def __init__(self) -> None:
        self.devices = [CARD]
        self.up = True

    def sample(self) -> NodeSample:
        return NodeSample(timestamp=1.0, devices=tuple(self.devices), nvml_up=self.up)


class Proc:
    def resolve(self, pids):
        return dict.fromkeys(pids)

    def skips(self):
        return {}


def _pods() -> PodState:
    return PodState(PodStore().view(), True, 1.0)


def test_a_lost_gpu_is_logged_once_and_its_recovery_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    backend = Backend()
    pipeline = Pipeline(Sources(backend, Proc(), _pods), Settings("n1"))
    sampler = SamplerThread(pipeline, SnapshotHolder(empty_snapshot(0.0)), 1.0,
                            on_cycle=CycleMonitor(pipeline, pod_watch=False))
    for lost, up in [(False, True), (True, True), (True, True), (True, False), (True, True), (False, True),
                     (False, True)]:
        backend.devices, backend.up = [replace(CARD, lost=lost)], up
        sampler.run_once()
    assert [level for level, _ in _messages(caplog, "GPU GPU-a (minor 0)")] == [logging.ERROR, logging.INFO]
    (_, line), (_, back) = _messages(caplog, "GPU GPU-a (minor 0)")
    assert line.startswith("GPU GPU-a (minor 0) lost (NVML: GPU is lost)") and "reset" in line
    assert back == "GPU GPU-a (minor 0) answers again: its values are back"


def test_a_simulated_gpu_lost_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    daemon = build_daemon(load_config(["--simulate", str(LOSES_A_GPU), "--no-xid"], environ={}))
    try:
        for _ in range(6):
            daemon.sampler.run_once()
    finally:
        daemon.close()
    lines = _messages(caplog, "lost (NVML: GPU is lost)")
    assert len(lines) == 1 and lines[0][0] == logging.ERROR, caplog.text


# ------------------------------------------------------------------ a stuck sampler


def test_stuck_transition() -> None:
    assert stuck_transition(None, 10.0, False) is None
    assert stuck_transition(5.0, 10.0, False) is None
    assert stuck_transition(11.0, 10.0, False) == "stuck"
    assert stuck_transition(30.0, 10.0, True) is None  # still stuck: said once
    assert stuck_transition(None, 10.0, True) == "unstuck"
    assert stuck_after(1.0) == 10.0 and stuck_after(5.0) == 25.0


class Sampler:
    cycle_started: float | None = None


def test_a_stuck_cycle_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    now = [100.0]
    sampler = Sampler()
    watch = StuckWatch(sampler, 10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    sampler.cycle_started = 100.0
    for t in (101.0, 109.0, 111.0, 150.0, 400.0):  # one NVML call that does not return for minutes
        now[0] = t
        watch.check()
    sampler.cycle_started = 401.0  # it ended; the next cycle began before the watch looked again
    now[0] = 401.5
    watch.check()
    watch.check()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == [logging.ERROR, logging.INFO], lines
    assert lines[0][1].startswith("sampling cycle running for 11s (more than 10s): stuck")
    assert lines[1][1] == "the stuck sampling cycle ended after about 302s: sampling again"


# ------------------------------------------------------------------ NVML init that hangs at start

INIT_DELAY_S = 12.0


@pytest.fixture(scope="module")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fake_nvml import build_fake_nvml

    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml")).parent


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
        try:
            proc.wait(15)  # the fake's init may still hold the process for a few seconds
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.e2e
def test_the_listener_answers_while_nvml_init_hangs(tmp_path: Path, fake_nvml_dir: Path,
                                                   procs: list[subprocess.Popen[bytes]]) -> None:
    """Before, the port opened only once NVML's init returned, and nothing was logged meanwhile."""
    from tests.fake_nvml import subprocess_env, write_config

    config = write_config({"node": "n1", "devices": [{"uuid": "GPU-1", "name": "NVIDIA T4"}],
                           "nvml": {"init_delay_ms": int(INIT_DELAY_S * 1000)}}, tmp_path / "nvml.conf")
    port, log = free_port(), tmp_path / "out.log"
    started = time.monotonic()
    procs.append(serving_exporter(["--no-pod-watch", "--no-xid", "--node-name", "n1", "--pod-resources-socket",
                                   "", "--listen", f"127.0.0.1:{port}"], subprocess_env(fake_nvml_dir, config), log))
    base = f"http://127.0.0.1:{port}"

    def answered() -> tuple[int, str] | None:
        try:
            return get(f"{base}/readyz")
        except (urllib.error.URLError, ConnectionError):
            return None

    status, text = poll(answered, INIT_DELAY_S, "/readyz to answer while NVML initialises")
    listening_after = time.monotonic() - started
    assert status == 503 and text.startswith("NVML initialising: the first sampling cycle has run for"), text
    assert get(f"{base}/healthz") == (200, "ok\n")
    assert listening_after < INIT_DELAY_S, listening_after
    assert "NVML initialisation has not returned after 5s: listening now" in log.read_text()
    poll(lambda: get(f"{base}/readyz") == (200, "ok\n") or None, 30, "/readyz to turn 200 once NVML is up")
    status, body = get(f"{base}/metrics")
    assert status == 200 and 'uuid="GPU-1"' in body
    assert log.read_text().count("NVML initialisation has not returned") == 1
