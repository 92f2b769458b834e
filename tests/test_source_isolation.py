"""Every source of a cycle isolated (exporter/pipeline/source_guard.py): one that raises keeps its last good
answer, is counted by source and kind, is logged once per change of state, and the cycle goes on.

The reproduction of issue 26's item 3: a truncated pod-resources ``List`` answer failed every cycle (the
snapshot aged for every GPU) with a traceback logged per cycle.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.node.podresources import PodResourcesDecodeError, decode_list_response, encode_list_response
from exporter.pipeline import cycle
from exporter.pipeline.cycle import Pipeline
from exporter.pipeline.sampler import SamplerThread
from exporter.pipeline.source_guard import MAX_KINDS, SOURCES, SourceGuard, transition
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.shell.sources import PodResourcesSource
from tests.test_podresources import Handler, kubelet, sock_dir  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "scenarios" / "rules_e2e_east_node1.yaml"  # pod_resources, several pods


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    daemon = build_daemon(load_config(["--simulate", str(SCENARIO), "--dcgm-compat"], environ={}))
    try:
        yield daemon.pipeline
    finally:
        daemon.close()


def _errors(body: bytes) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == "kube_gpu_exporter_source_errors_total":
                out[(s.labels["source"], s.labels["kind"])] = s.value
    return out


def _spy_inputs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    real = cycle.compute_allocations

    def spy(inputs: Any) -> Any:
        seen.append(inputs)
        return real(inputs)

    monkeypatch.setattr(cycle, "compute_allocations", spy)
    return seen


def test_a_truncated_pod_resources_answer_keeps_the_last_good_one(
        pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    good = encode_list_response(pipeline.sources.pod_resources() or ())
    answers = [good, good[:-3], b"\x0a\xff\xff\xff\xff\x0fgarbage", good[:-1], good]
    feed = iter(answers)
    pipeline.sources = dataclasses.replace(pipeline.sources, pod_resources=lambda: decode_list_response(next(feed)))
    seen = _spy_inputs(monkeypatch)
    caplog.set_level(logging.INFO)
    snapshots = [pipeline.step()[0] for _ in answers]  # before the fix the second step raised
    first = decode_list_response(good)
    assert first and all(inputs.pod_resources == first for inputs in seen)
    assert _errors(snapshots[-1].body) == {("pod_resources", "PodResourcesDecodeError"): 3}
    assert pipeline.samples_total == len(answers) and pipeline.failures_total == 0
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "source pod_resources" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.ERROR, logging.INFO], lines  # once failing, once back
    assert "PodResourcesDecodeError" in lines[0][1] and "\n" not in lines[0][1]
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.WARNING)  # no traceback


class Boom(RuntimeError):
    pass


def _raise() -> Any:
    raise Boom("a source's bug\nover two lines")


# Each source as Sources names it, and the metric's source label.
FIELDS = [("node_labels", "node"), ("node_capacity", "node"), ("pod_resources", "pod_resources"),
          ("resource_slices", "dra"), ("resource_claims", "dra"), ("pod_claims", "dra"), ("xids", "xid"),
          ("pods", "pods")]


@pytest.mark.parametrize(("field", "source"), FIELDS)
def test_any_source_that_raises_is_counted_and_the_cycle_goes_on(pipeline: Pipeline, field: str,
                                                                 source: str) -> None:
    before = pipeline.step()[0]
    pipeline.sources = dataclasses.replace(pipeline.sources, **{field: _raise})
    after = pipeline.step()[0]
    assert _errors(after.body) == {(source, "Boom"): 1}
    assert pipeline.failures_total == 0 and after.built_at >= before.built_at
    assert b"nvidia_gpu_duty_cycle{" in after.body  # the other sources and every output still served


def test_proc_keeps_its_last_good_answer(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    _, attr = pipeline.step()
    monkeypatch.setattr(pipeline.sources.proc, "resolve", lambda pids: _raise())
    second, attr2 = pipeline.step()
    assert _errors(second.body) == {("proc", "Boom"): 1}
    assert [d.processes for d in attr2.devices] == [d.processes for d in attr.devices]  # placed as before
    assert b"nvidia_gpu_duty_cycle{" in second.body


def test_nvml_raising_fails_the_cycle_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """NVML's values are the measurement: never served again under a newer timestamp."""
    daemon = build_daemon(load_config(["--simulate", str(SCENARIO)], environ={}))
    try:
        daemon.sampler.run_once()
        good = daemon.holder.get()
        daemon.pipeline.sources.backend.sample = _raise  # type: ignore[method-assign]
        sampler = SamplerThread(daemon.pipeline, daemon.holder, 1.0)
        caplog.set_level(logging.INFO)
        for _ in range(4):
            sampler.run_once()
    finally:
        daemon.close()
    assert daemon.pipeline.failures_total == 4 and daemon.pipeline.reads.errors() == {("nvml", "Boom"): 4}
    assert daemon.holder.get().built_at == good.built_at  # the last good snapshot, its age growing
    failed = [r for r in caplog.records if "sampling cycle failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info  # the traceback once, not per cycle
    assert not [r for r in caplog.records if "source nvml" in r.getMessage()]  # the sampler's line says it


def test_transition_is_the_whole_logging_decision() -> None:
    assert transition(None, None) is None
    assert transition(None, "Boom") == "failing"
    assert transition("Boom", "Boom") is None
    assert transition("Boom", "OSError") == "failing"  # a new kind of trouble is news
    assert transition("Boom", None) == "recovered"


def test_kinds_are_bounded_per_source() -> None:
    guard = SourceGuard()
    for i in range(MAX_KINDS * 3):
        kind = type(f"E{i}", (Exception,), {})
        guard.read("dra", "claims", lambda k=kind: (_ for _ in ()).throw(k()), ())
    kinds = {k for _, k in guard.errors()}
    assert len(kinds) == MAX_KINDS and "other" in kinds and sum(guard.errors().values()) == MAX_KINDS * 3


def test_every_source_label_is_documented() -> None:
    docs = (ROOT / "docs" / "metrics.md").read_text()
    row = next(line for line in docs.splitlines() if "`kube_gpu_exporter_source_errors_total`" in line)
    assert all(f"`{s}`" in row for s in SOURCES), row


@pytest.mark.e2e
def test_a_kubelet_answering_garbage_over_grpc_keeps_the_last_good_answer(
        kubelet: Callable[[Handler], str], pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    good = encode_list_response(pipeline.sources.pod_resources() or ())
    answers = iter([good] + [good[: len(good) // 2]] * 8 + [good])

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        return next(answers)

    source = PodResourcesSource(kubelet(handler), timeout=5.0)
    pipeline.sources = dataclasses.replace(pipeline.sources, pod_resources=source)
    seen = _spy_inputs(monkeypatch)
    caplog.set_level(logging.INFO)
    for _ in range(10):
        pipeline.step()
    assert pipeline.failures_total == 0 and pipeline.reads.errors() == {("pod_resources", "PodResourcesDecodeError"): 8}
    assert all(i.pod_resources == decode_list_response(good) for i in seen) and source.state == "ok"
    assert sum("source pod_resources" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(PodResourcesDecodeError):
        decode_list_response(good[: len(good) // 2])
