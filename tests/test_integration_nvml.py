"""The real exporter process, real NVML backend, against the fake libnvidia-ml.so.1.

Each test starts ``python -m exporter`` with the fake NVML (LD_LIBRARY_PATH), a fake /proc, the
Kubernetes API double and a grpc pod-resources server, all built from one scenario file, and
asserts on what /metrics serves. The simulated node (``render --simulate``) of the same file is
the oracle: both backends go through the same pipeline, so their seed rows must be equal.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.integration_support import (
    EXAMPLES,
    Key,
    Node,
    exporter_node,
    generate_node,
    load_scenario_dict,
    parse_exposition,
    poll,
    render_simulated,
    seed_rows,
    select,
    value,
    write_scenario,
)

pytestmark = pytest.mark.e2e  # every test here starts python

READY_S = 30.0  # startup of a Python process on a loaded 2-core CI box
SETTLE_S = 20.0

MIXED = EXAMPLES / "mixed-4gpu-node.yaml"
MIG = EXAMPLES / "mig-a100-node.yaml"
# what the seed rows do not show of a MIG device, and what tells a lost one
MIG_FAMILIES = ("nvidia_gpu_mig_device_info", "nvidia_gpu_up")


def _mixed() -> dict[str, Any]:
    return load_scenario_dict(MIXED)


def _uuid(scenario: dict[str, Any], index: int) -> str:
    return scenario["devices"][index]["uuid"]


def _oracle(scenario: dict[str, Any], tmp_path: Path) -> dict[Key, float]:
    """The simulated node's seed rows for this scenario."""
    path = write_scenario(scenario, tmp_path / "oracle.yaml")
    rows = seed_rows(parse_exposition(render_simulated(path)))
    assert rows, "the oracle has no seed rows: the scenario is useless for comparing"
    return rows


def _without_uuid(rows: dict[Key, float], uuid: str) -> dict[Key, float]:
    return {k: v for k, v in rows.items() if ("uuid", uuid) not in k[1]}


def _samples_total(s: dict[Key, float]) -> float:
    return value(s, "kube_gpu_exporter_samples_total") or 0.0


def _nvml_errors(s: dict[Key, float], **labels: str) -> float:
    return sum(select(s, "kube_gpu_exporter_nvml_errors_total", **labels).values())


def _family_rows(s: dict[Key, float], families: tuple[str, ...] = MIG_FAMILIES) -> dict[Key, float]:
    return {k: v for k, v in s.items() if k[0] in families}


def _wait_equal(node: Node, want: dict[Key, float], timeout: float = SETTLE_S) -> dict[Key, float]:
    """Scrape until the seed rows equal ``want`` (node labels and pods arrive asynchronously)."""
    return node.exporter.wait_for(lambda s: seed_rows(s) == want, timeout, "seed rows equal to the oracle's")


# ---- agreement with the simulated node ------------------------------------------------------

@pytest.mark.parametrize("name", ["seed-cgpu-t4.yaml", "seed-exclusive-t4.yaml", "mixed-4gpu-node.yaml"])
def test_seed_rows_equal_the_simulated_node(name: str, tmp_path: Path) -> None:
    scenario = load_scenario_dict(EXAMPLES / name)
    want = seed_rows(parse_exposition(render_simulated(EXAMPLES / name)))
    modes = {dict(k[1]).get("allocate_mode") for k in want}
    assert modes & {"share", "exclusive"}, "the oracle attributes nothing"
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)
        got = _wait_equal(node, want)
        # it really was the NVML path: the fake's driver version, not the simulated node's
        info = select(got, "nvidia_gpu_info")
        assert info and all(("driver_version", "550.54.15") in k[1] for k in info)
        assert value(got, "kube_gpu_exporter_nvml_up") == 1
        assert _nvml_errors(got) == 0
        assert node.podres.calls > 0  # pod-resources were asked (the idle GPU 3 of mixed needs them)


def test_mig_devices_stand_in_for_their_card_as_in_the_simulated_node(tmp_path: Path) -> None:
    scenario = load_scenario_dict(MIG)
    per_process = "--per-process-metrics"
    families = (*MIG_FAMILIES, "nvidia_gpu_process_memory_used_bytes")
    oracle = parse_exposition(render_simulated(MIG, per_process))
    want, want_mig = seed_rows(oracle), _family_rows(oracle, families)
    migs = {m["uuid"] for m in scenario["devices"][0]["mig_devices"]}
    assert {dict(k[1])["uuid"] for k in select(want_mig, "nvidia_gpu_mig_device_info")} == migs
    with exporter_node(scenario, tmp_path, extra_args=[per_process]) as node:
        node.exporter.wait_ready(READY_S)
        got = node.exporter.wait_for(lambda s: seed_rows(s) == want and _family_rows(s, families) == want_mig,
                                     SETTLE_S, "seed, MIG device and per-process rows equal to the oracle's")
        # each process on its MIG device and container: read from the MIG handles' process lists
        procs = select(got, "nvidia_gpu_process_memory_used_bytes", container_name="trainer")
        assert [dict(k[1])["uuid"] for k in procs] == ["MIG-3a1b2c3d-0000-5000-8000-000000000001"]
        assert not select(got, "nvidia_gpu_duty_cycle", uuid=next(iter(migs)))  # NVML has none for MIG
        assert value(got, "kube_gpu_exporter_nvml_up") == 1
        assert _nvml_errors(got) == 0  # NotSupported and empty MIG slots are answers, not errors


# ---- fault modes ------------------------------------------------------------------------------

def test_not_supported_field_is_absent_not_zero_and_not_an_error(tmp_path: Path) -> None:
    scenario = _mixed()
    scenario["devices"][1]["not_supported"] = ["power", "temperature"]
    lost_uuid = _uuid(scenario, 1)
    want = _oracle(scenario, tmp_path)  # the simulated node blanks the same fields
    assert not select(want, "nvidia_gpu_power_usage_milliwatts", uuid=lost_uuid)
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)
        got = _wait_equal(node, want)
        got = node.exporter.wait_for(lambda s: _samples_total(s) >= 3, SETTLE_S, "three cycles")
        for family in ("nvidia_gpu_power_usage_milliwatts", "nvidia_gpu_temperature_celsius"):
            assert not select(got, family, uuid=lost_uuid), f"{family} row for a NotSupported field"
            assert select(got, family, uuid=_uuid(scenario, 0)), f"{family} lost on a healthy device"
        assert select(got, "nvidia_gpu_memory_used_bytes", uuid=lost_uuid)  # the rest still reported
        assert value(got, "nvidia_gpu_up", node_name=scenario["node"], uuid=lost_uuid, minor_number="1",
                     name=scenario["devices"][1]["name"]) == 1
        assert _nvml_errors(got) == 0


def test_lost_gpu_reported_while_the_others_keep_reporting(tmp_path: Path) -> None:
    scenario = _mixed()
    scenario["devices"][2]["lost_after_ticks"] = 3
    lost = _uuid(scenario, 2)
    healthy_rows = _without_uuid(_oracle(_mixed(), tmp_path), lost)
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)

        def lost_and_settled(s: dict[Key, float]) -> bool:
            up = select(s, "nvidia_gpu_up", uuid=lost)
            others = _without_uuid(seed_rows(s), lost)
            return bool(up) and set(up.values()) == {0.0} and others == healthy_rows

        got = node.exporter.wait_for(lost_and_settled, SETTLE_S, "GPU 2 lost, the others' rows intact")
        ups = select(got, "nvidia_gpu_up")
        assert sorted(v for k, v in ups.items() if ("uuid", lost) not in k[1]) == [1.0, 1.0, 1.0]
        lost_errors = _nvml_errors(got, code="NVMLError_GpuIsLost")
        assert lost_errors >= 1
        # sampling goes on: later cycles still carry the healthy devices' rows
        before = _samples_total(got)
        later = node.exporter.wait_for(lambda s: _samples_total(s) >= before + 3, SETTLE_S, "more cycles")
        # the lost GPU is re-probed after a 10 s backoff, not in every cycle (one probe may fall in here)
        assert _nvml_errors(later, code="NVMLError_GpuIsLost") - lost_errors <= 1
        assert _without_uuid(seed_rows(later), lost) == healthy_rows
        assert set(select(later, "nvidia_gpu_up", uuid=lost).values()) == {0.0}
        assert value(later, "kube_gpu_exporter_sample_failures_total") == 0
        assert node.exporter.alive()


def test_lost_mig_card_reports_its_mig_devices_down_while_the_other_card_continues(tmp_path: Path) -> None:
    scenario = load_scenario_dict(MIG)
    scenario["devices"][0]["lost_after_ticks"] = 3
    card, whole = _uuid(scenario, 0), _uuid(scenario, 1)
    migs = [m["uuid"] for m in scenario["devices"][0]["mig_devices"]]
    lost = copy.deepcopy(scenario)
    lost["devices"][0]["lost_after_ticks"] = 0  # the oracle: the simulated node with the card lost
    oracle = parse_exposition(render_simulated(write_scenario(lost, tmp_path / "oracle.yaml")))
    want, want_mig = seed_rows(oracle), _family_rows(oracle)
    assert {dict(k[1])["uuid"]: v for k, v in select(want_mig, "nvidia_gpu_up").items()} == {
        **dict.fromkeys(migs, 0.0), whole: 1.0}
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)
        got = node.exporter.wait_for(lambda s: seed_rows(s) == want and _family_rows(s) == want_mig, SETTLE_S,
                                     "the MIG devices down, with their MIG rows, card 1 intact")
        assert select(got, "nvidia_gpu_mig_device_info", parent_uuid=card)  # still known, and down
        assert not select(got, "nvidia_gpu_memory_total_bytes", uuid=migs[0])
        # counted once per look at the card, not once per MIG device: the cycle that found it lost plus
        # at most two re-probes (after 10 s, then 20 s more) fit in the time this test may wait
        lost_errors = _nvml_errors(got, code="NVMLError_GpuIsLost")
        assert 1 <= lost_errors <= 3
        before = _samples_total(got)
        later = node.exporter.wait_for(lambda s: _samples_total(s) >= before + 3, SETTLE_S, "more cycles")
        assert seed_rows(later) == want and _family_rows(later) == want_mig  # card 1 keeps reporting
        assert _nvml_errors(later, code="NVMLError_GpuIsLost") - lost_errors <= 1  # the card's backoff
        assert value(later, "kube_gpu_exporter_sample_failures_total") == 0
        assert node.exporter.alive()


def test_init_failures_then_recovery_while_metrics_keep_answering(tmp_path: Path) -> None:
    scenario = _mixed()
    # NvmlBackend retries init after 1 s, then 2 s (exponential backoff): up about 3 s after start
    scenario["nvml"] = {"init_failures": 2}
    want = _oracle(scenario, tmp_path)
    with exporter_node(scenario, tmp_path) as node:
        first = parse_exposition(node.exporter.wait_ready(READY_S))
        assert value(first, "kube_gpu_exporter_nvml_up") == 0
        # no device is known while NVML is down (allocation rows from the pods may already be there)
        for family in ("nvidia_gpu_info", "nvidia_gpu_up", "nvidia_gpu_memory_total_bytes"):
            assert not select(first, family), family
        seen: list[float] = [0.0]  # the first page: served while NVML was still down

        def recovered() -> dict[Key, float] | None:
            s = node.exporter.samples()  # raises if a scrape fails: the server must keep answering
            seen.append(value(s, "kube_gpu_exporter_nvml_up") or 0.0)
            return s if seen[-1] == 1 else None

        got = poll(recovered, SETTLE_S, "nvml_up to become 1", interval=0.1)
        assert seen == sorted(seen)  # down, then up, never down again
        assert _nvml_errors(got, call="nvmlInit") == 2
        _wait_equal(node, want)


def test_old_driver_falls_back_to_v2_process_lists(tmp_path: Path) -> None:
    scenario = _mixed()
    scenario["nvml"] = {"old_driver": True}  # the library variant without the *_v3 symbols
    # nor nvmlDeviceGetCurrentClocksEventReasons: the bits come from the ThrottleReasons call then
    scenario["devices"][0]["clocks_event_reasons"] = 0x4
    want = _oracle(scenario, tmp_path)
    assert select(want, "nvidia_gpu_memory_used_bytes", allocate_mode="share")
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)
        got = _wait_equal(node, want)
        assert _nvml_errors(got) == 0
        assert list(select(got, "nvidia_gpu_clocks_event_reasons", uuid=_uuid(scenario, 0)).values()) == [4.0]


def test_process_growth_between_probe_and_fetch_loses_no_process(tmp_path: Path) -> None:
    # 8 processes of 8 pods on one shared GPU; in every cycle pynvml's size probe sees 1, so its
    # 7-entry fetch buffer is too small (INSUFFICIENT_SIZE) and the backend must probe again
    scenario = generate_node(gpus=1, processes=8, shared_every=1)
    scenario["devices"][0]["process_growth"] = 7
    scenario["nvml"] = {"growth_every_tick": True}
    want = _oracle(scenario, tmp_path)
    assert len(select(want, "nvidia_gpu_memory_used_bytes", allocate_mode="share")) == 8
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)
        got = node.exporter.wait_for(lambda s: _samples_total(s) >= 3 and seed_rows(s) == want, SETTLE_S,
                                     "three cycles with every process attributed")
        assert _nvml_errors(got) == 0


def test_an_idle_process_reads_zero_once_its_samples_were_seen(tmp_path: Path) -> None:
    # Every process stops computing after tick IDLE and keeps its memory. From cycle IDLE + 1 the
    # driver has no sample newer than lastSeenTimeStamp (NOT_FOUND: idle). A backend that asked with
    # a stale lastSeenTimeStamp would get the old samples again for the 7 more cycles that the
    # driver's buffer keeps them, and keep reporting the old utilization.
    idle = 5
    scenario = _mixed()
    scenario["nvml"] = {"idle_after_ticks": idle}
    want = _oracle(scenario, tmp_path)
    busy = {k: v for k, v in want.items() if v > 0 and (
        k[0] == "nvidia_gpu_unaccounted_process_duty_cycle"
        or (k[0] == "nvidia_gpu_duty_cycle" and ("allocate_mode", "share") in k[1]))}
    assert len(busy) == 2, "the shared GPU's two containers carry process utilization"
    with exporter_node(scenario, tmp_path, interval=1.0) as node:
        first = parse_exposition(node.exporter.wait_ready(READY_S))
        assert _samples_total(first) <= idle, "the first scrape came after the processes went idle"
        assert {k: first.get(k) for k in busy} == busy
        got = node.exporter.wait_for(lambda s: _samples_total(s) > idle, SETTLE_S, "a cycle after the idle tick")
        assert _samples_total(got) < idle + 8, "scraped too late: the driver's buffer would have aged out"
        assert {k: got.get(k) for k in busy} == dict.fromkeys(busy, 0.0)
        assert _nvml_errors(got) == 0
        # the memory rows do not change: the processes are still there
        memory = {k: v for k, v in want.items() if k[0] == "nvidia_gpu_memory_used_bytes"}
        assert {k: got.get(k) for k in memory} == memory


def test_gpu_process_without_proc_entry_is_skipped_as_exited(tmp_path: Path) -> None:
    scenario = _mixed()
    gone = 2002  # infer-b's process on the shared GPU 2: exited between NVML and /proc
    healthy = _without_uuid(_oracle(scenario, tmp_path), _uuid(scenario, 2))
    with exporter_node(scenario, tmp_path, missing_pids=[gone]) as node:
        node.exporter.wait_ready(READY_S)
        exited = {"reason": "exited"}
        got = node.exporter.wait_for(
            lambda s: _without_uuid(seed_rows(s), _uuid(scenario, 2)) == healthy
            and sum(select(s, "kube_gpu_exporter_skips_total", **exited).values()) >= 1,
            SETTLE_S, "rows of the other GPUs and an 'exited' skip")
        first = sum(select(got, "kube_gpu_exporter_skips_total", **exited).values())
        later = node.exporter.wait_for(
            lambda s: sum(select(s, "kube_gpu_exporter_skips_total", **exited).values()) >= first + 2,
            SETTLE_S, "the skip counted again in later cycles")
        assert value(later, "kube_gpu_exporter_sample_failures_total") == 0
        shared = select(later, "nvidia_gpu_memory_used_bytes", uuid=_uuid(scenario, 2))
        by_pod = {dict(k[1])["pod_name"]: v for k, v in shared.items()}
        # infer-b keeps its allocation's share row, but its process is no longer attributed to it
        assert by_pod == {"": 49123688448, "infer-a-7c6b5d4f3-qwert": 19327352832,
                          "infer-b-6b5a4c3d2-asdfg": 0}
        assert node.exporter.alive()


def test_pod_added_after_start_appears_in_the_rows(tmp_path: Path) -> None:
    scenario = _mixed()
    late = next(p for p in scenario["pods"] if p["metadata"]["name"] == "infer-b-6b5a4c3d2-asdfg")
    early = [p for p in scenario["pods"] if p is not late]
    want = _oracle(scenario, tmp_path)
    late_rows = {k for k in want if ("pod_name", "infer-b-6b5a4c3d2-asdfg") in k[1]}
    assert late_rows
    with exporter_node(scenario, tmp_path, api_pods=early) as node:
        node.exporter.wait_ready(READY_S)
        before = node.exporter.wait_for(
            lambda s: value(s, "kube_gpu_exporter_pod_cache_synced") == 1
            and select(s, "nvidia_gpu_duty_cycle", pod_name="infer-a-7c6b5d4f3-qwert"),
            SETTLE_S, "the pod cache synced without infer-b")
        assert not late_rows & set(before)
        lists = len(node.api.requests_to("GET", "/api/v1/pods"))
        node.api.add_pod(copy.deepcopy(late))
        _wait_equal(node, want)
        # it came through the watch, not through a relist
        assert not [r for r in node.api.requests_to("GET", "/api/v1/pods")[lists:]
                    if r.query.get("watch") not in ("true", "1")]


def test_api_outage_keeps_the_last_rows(tmp_path: Path) -> None:
    scenario = _mixed()
    want = _oracle(scenario, tmp_path)
    with exporter_node(scenario, tmp_path) as node:
        node.exporter.wait_ready(READY_S)
        _wait_equal(node, want)
        node.api.go_offline()
        try:
            down = node.exporter.wait_for(
                lambda s: (value(s, "kube_gpu_exporter_pod_sync_errors_total") or 0) >= 1
                and value(s, "kube_gpu_exporter_pod_cache_synced") == 0,
                SETTLE_S, "the outage noticed")
            assert seed_rows(down) == want
            before = _samples_total(down)
            during = node.exporter.wait_for(lambda s: _samples_total(s) >= before + 5, SETTLE_S, "cycles")
            assert seed_rows(during) == want
        finally:
            node.api.come_back()
        node.exporter.wait_for(lambda s: value(s, "kube_gpu_exporter_pod_cache_synced") == 1, 60.0,
                               "the pod cache synced again")
