"""Issue 26 item 4: a pod's annotation never turns another tenant's whole GPU shared, in each setting.

The spoof (tests/scenarios/spoof_whole_gpu_node.yaml): team-b's pod requests HAMi's resources and
names team-a's two whole GPUs in ``hami.io/vgpu-devices-allocated``, 90 % each; one of team-a's
pods runs on its GPU, the other is idle. Run on the simulated node (the production pipeline in
process) with the kubelet's pod-resources answer (the chart's default) and without it
(``podResources.enabled=false``), then with the real exporter as the rendered chart runs it, for
both chart settings. The trust model per setting: docs/sharing.md "Trust model per setting".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from tests.integration_support import Key, parse_exposition

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "scenarios" / "spoof_whole_gpu_node.yaml"
BUSY, IDLE = "GPU-5a1c0e2f-7b3d-4c9e-8f10-00000000000a", "GPU-5a1c0e2f-7b3d-4c9e-8f10-00000000000b"
Samples = dict[Key, float]


def scenario_without_kubelet(tmp_path: Path) -> Path:
    """The same node with no pod-resources socket: the allocations come from pods and processes only."""
    raw = yaml.safe_load(SCENARIO.read_text())
    del raw["pod_resources"]
    out = tmp_path / "spoof_no_kubelet.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def scrape(scenario: Path) -> Samples:
    daemon = build_daemon(load_config(["--simulate", str(scenario)]))
    try:
        snapshot, _ = daemon.pipeline.step()
    finally:
        daemon.close()
    return parse_exposition(snapshot.body.decode())


def rows(s: Samples, metric: str, **labels: str) -> dict[tuple[str, str], float]:
    """``(pod, allocate_mode)`` -> value of ``metric``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return {(dict(lbl)["pod_name"], dict(lbl)["allocate_mode"]): v for (name, lbl), v in s.items()
            if name == metric and want <= lbl and "pod_name" in dict(lbl)}


def assert_busy_gpu_stays_the_victims(s: Samples) -> None:
    """Whatever the setting: the GPU team-a runs on is exclusive to it, the thief holds no grant there."""
    assert rows(s, "nvidia_gpu_memory_used_bytes", uuid=BUSY) == {("train-busy", "exclusive"): 21474836480}
    assert rows(s, "nvidia_gpu_allocated_compute_percent", uuid=BUSY) == {("train-busy", "exclusive"): 100}
    assert rows(s, "nvidia_gpu_duty_cycle", uuid=BUSY) == {("train-busy", "exclusive"): 88}


def test_with_the_kubelets_answer_no_annotation_shares_a_whole_gpu() -> None:
    s = scrape(SCENARIO)
    assert_busy_gpu_stays_the_victims(s)
    # the idle GPU is the kubelet's word too: exclusive to team-a, the thief refused there as well
    assert rows(s, "nvidia_gpu_allocated_compute_percent", uuid=IDLE) == {("train-idle", "exclusive"): 100}
    assert rows(s, "nvidia_gpu_memory_used_bytes", uuid=IDLE) == {("train-idle", "exclusive"): 536870912}
    assert rows(s, "nvidia_gpu_allocated_compute_percent", pod_name="thief") == {("thief", "share"): 180}
    assert s[("kube_gpu_exporter_allocation_disagreements", frozenset({("scheme", "hami")}))] == 2


def test_without_the_kubelet_the_gpu_a_tenant_runs_on_is_refused_to_annotations(tmp_path: Path) -> None:
    """Before issue 26 the busy GPU turned ``share`` and the thief got 90 % of it."""
    s = scrape(scenario_without_kubelet(tmp_path))
    assert_busy_gpu_stays_the_victims(s)
    assert s[("kube_gpu_exporter_allocation_disagreements", frozenset({("scheme", "hami")}))] == 1
    # The limit without an authority: nothing says the idle GPU is team-a's (its pod runs nothing
    # there), so the annotation is believed for it. docs/sharing.md states it; the chart's default
    # (pod-resources on) closes it.
    assert rows(s, "nvidia_gpu_allocated_compute_percent", uuid=IDLE) == {("thief", "share"): 90}
    assert rows(s, "nvidia_gpu_allocated_compute_percent", pod_name="train-idle", uuid="") == {
        ("train-idle", "exclusive"): 100}


@pytest.mark.e2e  # starts the exporter as the chart runs it
@pytest.mark.parametrize("pod_resources", [None, False], ids=["chart-default", "pod-resources-off"])
def test_the_rendered_chart_refuses_the_spoof(tmp_path: Path, pod_resources: bool | None) -> None:
    from tests.test_helm_rbac import READY_S, exporter_as_the_chart_runs_it

    values = {} if pod_resources is None else {"podResources": {"enabled": pod_resources}}
    with exporter_as_the_chart_runs_it(values, tmp_path, nvml_xids=False, scenario_path=SCENARIO) as run:
        assert (run.podres is not None) == (pod_resources is None)  # the default mounts the kubelet's socket
        s = run.exporter.wait_for(lambda s: any(k[0] == "kube_gpu_exporter_allocation_disagreements" for k in s),
                                  READY_S, "a cycle with the thief's allocations")
        assert_busy_gpu_stays_the_victims(s)
        idle = rows(s, "nvidia_gpu_allocated_compute_percent", uuid=IDLE)
        if pod_resources is None:
            assert idle == {("train-idle", "exclusive"): 100}
        else:
            assert idle == {("thief", "share"): 90}  # the documented limit without the kubelet
