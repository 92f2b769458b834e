"""The sampling cycle (exporter/pipeline/): every output built in isolation, counted and logged once per change."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.pipeline import cycle
from exporter.pipeline.cycle import Pipeline
from exporter.pipeline.outputs import OUTPUTS, OutputGuard
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "scenarios" / "rules_e2e_east_node1.yaml"  # usage counters, several pods


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    daemon = build_daemon(load_config(["--simulate", str(SCENARIO), "--dcgm-compat"]))
    try:
        yield daemon.pipeline
    finally:
        daemon.close()


def _families(body: bytes) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _failures(body: bytes) -> dict[str, float]:
    rows = _families(body).get("kube_gpu_exporter_output_failures_total", {})
    return {dict(k)["output"]: v for k, v in rows.items()}


class Boom(RuntimeError):
    pass


def _raise(*_a: object, **_k: object) -> None:
    raise Boom("an output's bug")


def test_every_output_is_counted_from_the_first_cycle(pipeline: Pipeline) -> None:
    assert _failures(pipeline.step()[0].body) == dict.fromkeys(OUTPUTS, 0.0)


@pytest.mark.parametrize(("output", "target", "gone", "kept"), [
    ("rows", "workload_families", "nvidia_gpu_duty_cycle", "DCGM_FI_DEV_GPU_UTIL"),
    ("dcgm", "dcgm_families", "DCGM_FI_DEV_GPU_UTIL", "nvidia_gpu_duty_cycle"),
    ("usage", "usage_families", "nvidia_gpu_container_busy_seconds_total", "nvidia_gpu_duty_cycle"),
])
def test_a_failing_output_leaves_the_others_served(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
                                                   output: str, target: str, gone: str, kept: str) -> None:
    assert gone in _families(pipeline.step()[0].body)
    monkeypatch.setattr(cycle, target, _raise)
    snapshot, _ = pipeline.step()
    served = _families(snapshot.body)
    assert gone not in served and kept in served, sorted(served)
    assert _failures(snapshot.body)[output] == 1 and snapshot.status["subsystems"]["sampler"]["samples_total"] == 2
    assert "kube_gpu_exporter_samples_total" in served  # the exporter's own state is always there


def test_a_failed_usage_output_leaves_the_counters_where_they_were(pipeline: Pipeline,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline.step()
    before = pipeline.usage
    monkeypatch.setattr(cycle, "usage_families", _raise)
    pipeline.step()
    assert pipeline.usage is before


def test_a_failing_status_keeps_the_last_good_tree_whose_age_tells(pipeline: Pipeline,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = pipeline.step()
    monkeypatch.setattr(cycle, "build_status", _raise)
    second, _ = pipeline.step()
    assert second.status == first.status and second.status["built_at"] == first.built_at
    assert _failures(second.body)["status"] == 1 and "nvidia_gpu_duty_cycle" in _families(second.body)


def test_a_failing_xid_source_is_an_output_failure(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    pipeline.sources = dataclasses.replace(pipeline.sources, xid_families=_raise)
    assert _failures(pipeline.step()[0].body)["xid"] == 1


def test_an_output_logs_once_when_it_starts_failing_and_once_when_it_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    guard = OutputGuard(("a", "b"))
    states = [True, False, False, False, True, True, False, True]
    got = [guard.run("a", (lambda ok=ok: "built" if ok else _raise()), "fallback") for ok in states]
    assert got == ["built" if ok else "fallback" for ok in states]
    assert guard.failures() == {"a": 4, "b": 0}
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert messages == [
        (logging.ERROR, "output a failed: left out of the snapshot until it recovers"),
        (logging.INFO, "output a recovered (3 failed cycles in all)"),
        (logging.ERROR, "output a failed: left out of the snapshot until it recovers"),
        (logging.INFO, "output a recovered (4 failed cycles in all)"),
    ]
    assert all(r.exc_info for r in caplog.records if r.levelno == logging.ERROR)  # the traceback, once


def test_dcgm_is_not_counted_when_it_is_off() -> None:
    daemon = build_daemon(load_config(["--simulate", str(SCENARIO)]))
    try:
        assert "dcgm" not in _failures(daemon.pipeline.step()[0].body)
    finally:
        daemon.close()
