"""Nothing silent (issue 26 item 7): a lost GPU and its recovery, a stuck sampler, NVML init that hangs at
start, each told in one log line when its state changes (exporter/shell/status.py, exporter/shell/cli.py)."""

from __future__ import annotations

import logging
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
from exporter.shell.status import CycleMonitor, lost_changes

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
