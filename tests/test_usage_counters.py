"""Per-container busy seconds and energy (exporter/attribution/usage_counters.py, exposition/usage_rows.py).

Properties: for any sequence of attributions, container rows + unattributed == the device's busy
seconds and the card's measured energy; every counter is monotonic; the state stays bounded. Unit
cases for each rule of the module docstring, the rendering, and the pipeline on a simulated node.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.core import Metric

from exporter.attribution import usage_counters as uc
from exporter.attribution.attribute import (
    EXCLUSIVE,
    NONE,
    SHARE,
    ContainerUsage,
    DeviceAttribution,
    NodeAttribution,
)
from exporter.attribution.usage_counters import RETAIN_CYCLES, UsageCounters, advance
from exporter.attribution.utilization import device_utilization
from exporter.exposition.rows import ExporterStats, LabelNames, build_families
from exporter.exposition.usage_rows import usage_families
from exporter.model import DeviceHealth, DeviceSample, GpmSample, NodeSample, PodInfo

ROOT = Path(__file__).resolve().parents[1]
CAP = 5.0  # max_period in these tests


def pod(i: int, ns: str = "ns") -> PodInfo:
    return PodInfo(uid=f"uid-{i}", name=f"pod-{i}", namespace=ns, node_name="n", phase="Running", containers=())


def user(i: int, sm: float | None, container: str = "c") -> ContainerUsage:
    return ContainerUsage(pod(i), container, sm, None, None)


def dev(uuid: str = "GPU-0", util: int | None = 50, energy: int | None = None, parent: str | None = None,
        memory: int | None = None, minor: int = 0) -> DeviceSample:
    return DeviceSample(index=minor, uuid=uuid, name="A100", minor_number=minor, utilization_gpu=util,
                        memory_total_bytes=memory, parent_uuid=parent,
                        health=DeviceHealth(energy_millijoules=energy))


def da(d: DeviceSample, mode: str = NONE, *users: ContainerUsage) -> DeviceAttribution:
    return DeviceAttribution(d, mode, tuple(users), (), ())


def step(prev: UsageCounters, t: float, *das: DeviceAttribution) -> UsageCounters:
    return advance(prev, NodeAttribution(tuple(das), (), (), {}), NodeSample(t, tuple(x.device for x in das)), CAP)


def rows_of(rows: dict, uuid: str = "GPU-0") -> dict[tuple[str, str, str], float]:
    """{(namespace, pod, container): value} of one device."""
    return {k[3:]: v for k, v in rows.items() if k[0] == uuid}


REST = ("", "", "")
C1, C2 = ("ns", "pod-1", "c"), ("ns", "pod-2", "c")


def approx(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(math.isclose(got[k], want[k], abs_tol=1e-9) for k in want)


# ------------------------------------------------------------------ rule 1: periods


def test_first_cycle_accrues_nothing_but_creates_the_rows() -> None:
    c = step(UsageCounters(), 100.0, da(dev(util=80, energy=5_000), EXCLUSIVE, user(1, 80)))
    assert rows_of(c.busy) == {C1: 0.0, REST: 0.0}
    assert rows_of(c.energy) == {C1: 0.0, REST: 0.0}
    assert c.device_busy == {("GPU-0", "0", "A100"): 0.0}
    assert c.skips == {}


@pytest.mark.parametrize(("t2", "reason"), [(100.0, "usage_period_backwards"), (99.0, "usage_period_backwards"),
                                            (100.0 + CAP + 0.01, "usage_period_too_long")])
def test_a_period_not_positive_or_too_long_is_skipped_and_counted(t2: float, reason: str) -> None:
    a = step(UsageCounters(), 100.0, da(dev(util=80, energy=0), EXCLUSIVE, user(1, 80)))
    b = step(a, t2, da(dev(util=80, energy=9_000), EXCLUSIVE, user(1, 80)))
    assert b.skips == {reason: 1}
    assert rows_of(b.busy) == {C1: 0.0, REST: 0.0} and rows_of(b.energy) == {C1: 0.0, REST: 0.0}
    # and the energy baseline moved: the next period accrues only its own delta
    c = step(b, t2 + 1, da(dev(util=80, energy=10_000), EXCLUSIVE, user(1, 80)))
    assert approx(rows_of(c.energy), {C1: 1.0, REST: 0.0}) and approx(rows_of(c.busy), {C1: 0.8, REST: 0.0})


# ------------------------------------------------------------------ rules 2 and 3: busy and energy


def test_exclusive_holder_gets_the_device() -> None:
    a = step(UsageCounters(), 0.0, da(dev(util=60, energy=1_000_000), EXCLUSIVE, user(1, 60)))
    b = step(a, 2.0, da(dev(util=60, energy=1_010_000), EXCLUSIVE, user(1, 60)))
    assert approx(rows_of(b.busy), {C1: 1.2, REST: 0.0})
    assert approx(rows_of(b.energy), {C1: 10.0, REST: 0.0})  # idle power included: the GPU is its alone
    assert b.device_busy[("GPU-0", "0", "A100")] == pytest.approx(1.2)


def test_shared_device_splits_by_sm_with_the_rest_unattributed() -> None:
    def cycle(t: float, e: int) -> DeviceAttribution:
        return da(dev(util=60, energy=e), SHARE, user(1, 20), user(2, 30))

    b = step(step(UsageCounters(), 0.0, cycle(0, 0)), 2.0, cycle(2, 10_000))
    assert approx(rows_of(b.busy), {C1: 0.4, C2: 0.6, REST: 0.2})
    assert approx(rows_of(b.energy), {C1: 2.0, C2: 3.0, REST: 5.0})


def test_oversubscribed_shares_are_scaled_down_to_the_device() -> None:
    def cycle(e: int) -> DeviceAttribution:
        return da(dev(util=50, energy=e), SHARE, user(1, 40), user(2, 40))

    b = step(step(UsageCounters(), 0.0, cycle(0)), 2.0, cycle(10_000))
    assert approx(rows_of(b.busy), {C1: 0.5, C2: 0.5, REST: 0.0})
    assert approx(rows_of(b.energy), {C1: 2.5, C2: 2.5, REST: 5.0})


def test_unknown_sm_is_not_given_to_anyone_and_is_counted() -> None:
    def cycle(e: int) -> DeviceAttribution:
        return da(dev(util=50, energy=e), SHARE, user(1, None), user(2, 30))

    b = step(step(UsageCounters(), 0.0, cycle(0)), 1.0, cycle(1_000))
    assert approx(rows_of(b.busy), {C1: 0.0, C2: 0.3, REST: 0.2})
    assert approx(rows_of(b.energy), {C1: 0.0, C2: 0.3, REST: 0.7})
    assert b.skips == {"usage_sm_unknown": 1}


def test_unheld_device_is_all_unattributed() -> None:
    b = step(step(UsageCounters(), 0.0, da(dev(util=30, energy=0))), 1.0, da(dev(util=30, energy=4_000)))
    assert approx(rows_of(b.busy), {REST: 0.3}) and approx(rows_of(b.energy), {REST: 4.0})


def test_no_utilization_means_no_busy_rows_but_energy_still_splits() -> None:
    def cycle(e: int) -> DeviceAttribution:
        return da(dev(util=None, energy=e), EXCLUSIVE, user(1, None))

    b = step(step(UsageCounters(), 0.0, cycle(0)), 1.0, cycle(3_000))
    assert b.busy == {} and b.device_busy == {}
    assert approx(rows_of(b.energy), {C1: 3.0, REST: 0.0})


def test_a_device_without_an_energy_counter_has_no_energy_rows_and_no_skips() -> None:
    b = step(step(UsageCounters(), 0.0, da(dev(energy=None))), 1.0, da(dev(energy=None)))
    assert b.energy == {} and b.skips == {}


def test_unreadable_energy_skips_once_and_rebaselines() -> None:
    a = step(UsageCounters(), 0.0, da(dev(energy=1_000)))
    b = step(a, 1.0, da(dev(energy=None)))
    assert b.skips == {"usage_energy_unreadable": 1}
    c = step(b, 2.0, da(dev(energy=None)))
    assert c.skips == {}  # counted when it becomes unreadable, not every cycle after
    d = step(c, 3.0, da(dev(energy=50_000)))
    e = step(d, 4.0, da(dev(energy=52_000)))
    assert approx(rows_of(e.energy), {REST: 2.0})  # only the period after the new baseline


def test_a_decreasing_energy_counter_is_a_reset_skipped_and_counted() -> None:
    a = step(UsageCounters(), 0.0, da(dev(energy=9_000_000)))
    b = step(a, 1.0, da(dev(energy=1_000)))  # driver reloaded: the counter restarts
    assert b.skips == {"usage_energy_reset": 1} and rows_of(b.energy) == {REST: 0.0}
    c = step(b, 2.0, da(dev(energy=3_000)))
    assert approx(rows_of(c.energy), {REST: 2.0})


# ------------------------------------------------------------------ rule 4: MIG


def test_mig_energy_is_the_cards_split_by_memory_slice() -> None:
    def cycle(e: int) -> tuple[DeviceAttribution, ...]:
        small = dev("MIG-a", util=None, energy=e, parent="GPU-card", memory=10, minor=0)
        large = dev("MIG-b", util=None, energy=e, parent="GPU-card", memory=30, minor=0)
        return da(small, EXCLUSIVE, user(1, None)), da(large, SHARE, user(2, None))

    b = step(step(UsageCounters(), 0.0, *cycle(0)), 1.0, *cycle(8_000))
    assert approx(rows_of(b.energy, "MIG-a"), {C1: 2.0, REST: 0.0})
    # no SM utilization on a MIG device: a shared one's energy stays unattributed
    assert approx(rows_of(b.energy, "MIG-b"), {C2: 0.0, REST: 6.0})
    assert sum(b.energy.values()) == pytest.approx(8.0)  # the card's delta, once
    assert b.busy == {}


def test_a_mig_device_with_gpm_accrues_its_gpu_instance_graphics_activity() -> None:
    """NVML has no utilization for MIG devices; on Hopper the GPU instance's GPM (GRAPHICS_UTIL) stands in."""
    def cycle() -> tuple[DeviceAttribution, ...]:
        gpm = DeviceHealth(gpm=GpmSample(graphics_active=0.25))
        held = replace(dev("MIG-a", util=None, parent="GPU-card"), health=gpm)
        free = replace(dev("MIG-b", util=None, parent="GPU-card"), health=gpm)
        blind = dev("MIG-c", util=None, parent="GPU-card")  # no GPM (A100): no busy rows, unknown is not idle
        return da(held, EXCLUSIVE, user(1, 25.0)), da(free, NONE), da(blind, EXCLUSIVE, user(2, None))

    b = step(step(UsageCounters(), 0.0, *cycle()), 2.0, *cycle())
    assert approx(rows_of(b.busy, "MIG-a"), {C1: 0.5, REST: 0.0})
    assert approx(rows_of(b.busy, "MIG-b"), {REST: 0.5})
    assert rows_of(b.busy, "MIG-c") == {}
    assert approx(dict(b.device_busy), {("MIG-a", "0", "A100"): 0.5, ("MIG-b", "0", "A100"): 0.5})


def test_device_utilization_is_nvmls_else_a_mig_devices_gpm() -> None:
    gpm = DeviceHealth(gpm=GpmSample(graphics_active=0.5))
    assert device_utilization(dev(util=40)) == 40.0
    assert device_utilization(replace(dev(util=None, parent="GPU-card"), health=gpm)) == 50.0
    assert device_utilization(replace(dev(util=None), health=gpm)) is None  # a whole GPU: NVML's, or nothing
    assert device_utilization(dev(util=None, parent="GPU-card")) is None


def test_mig_slices_of_unknown_size_split_equally() -> None:
    assert uc._slices([dev("MIG-a", memory=None), dev("MIG-b", memory=5)]) == [0.5, 0.5]
    assert uc._slices([dev("GPU-0", memory=None)]) == [1.0]


# ------------------------------------------------------------------ rule 5: bounded state


def test_a_vanished_container_is_kept_for_retain_cycles_then_dropped() -> None:
    c = step(UsageCounters(), 0.0, da(dev(util=50), SHARE, user(1, 50)))
    c = step(c, 1.0, da(dev(util=50), SHARE, user(1, 50)))
    assert rows_of(c.busy)[C1] == pytest.approx(0.5)
    for i in range(RETAIN_CYCLES):
        c = step(c, 2.0 + i, da(dev(util=50)))
        assert rows_of(c.busy)[C1] == pytest.approx(0.5), i  # still there, standing still
    c = step(c, 2.0 + RETAIN_CYCLES, da(dev(util=50)))
    assert C1 not in rows_of(c.busy)
    assert REST in rows_of(c.busy)


def test_state_stays_bounded_under_container_churn() -> None:
    c = UsageCounters()
    for i in range(3 * RETAIN_CYCLES):
        c = step(c, float(i), da(dev(util=50, energy=i * 1000), SHARE, user(i, 10), user(i + 10_000, 10)))
        # per cycle: 2 containers + 1 unattributed row in each table, 1 device
        assert c.held() <= (RETAIN_CYCLES + 1) * (2 * 3 + 1)
    assert len(c.busy) == (RETAIN_CYCLES + 1) * 2 + 1


# ------------------------------------------------------------------ properties

_USERS = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.floats(0, 100))), max_size=4,
                  unique_by=lambda t: t[0])
_DEVICE = st.fixed_dictionaries({
    "mode": st.sampled_from([EXCLUSIVE, SHARE, NONE]),
    "util": st.one_of(st.none(), st.integers(0, 100)),
    "users": _USERS,
    "energy_step": st.one_of(st.none(), st.integers(-5_000, 400_000)),
})
_CYCLE = st.tuples(st.floats(-1.0, 2 * CAP), st.lists(_DEVICE, min_size=3, max_size=3))


def _attributions(cycle: list[dict], energy: dict[str, int | None]) -> list[DeviceAttribution]:
    """Three devices: a whole GPU and two MIG devices of one card (energy per card)."""
    out = []
    specs = [("GPU-0", None, None), ("MIG-a", "GPU-card", 10), ("MIG-b", "GPU-card", 30)]
    for (uuid, parent, memory), spec in zip(specs, cycle, strict=True):
        card = parent or uuid
        users = [user(i, sm) for i, sm in spec["users"]]
        if spec["mode"] == EXCLUSIVE:
            users = users[:1]
        elif spec["mode"] == NONE:
            users = []
        out.append(da(dev(uuid, spec["util"], energy[card], parent, memory), spec["mode"], *users))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(_CYCLE, min_size=1, max_size=30))
def test_rows_add_up_to_the_device_are_monotonic_and_bounded(cycles: list) -> None:
    c = UsageCounters()
    t = 1000.0
    energy: dict[str, int | None] = {"GPU-0": 0, "GPU-card": 0}
    want_energy = {"GPU-0": 0.0, "GPU-card": 0.0}  # the oracle: measured deltas of the accrued periods
    before: dict[str, int | None] = {}
    max_rows = 0
    for i, (dt, devices) in enumerate(cycles):
        t_before, t = t, t + dt
        for spec, card in zip(devices[:2], ("GPU-0", "GPU-card"), strict=True):
            step_mj = spec["energy_step"]
            energy[card] = None if step_mj is None else max(0, (energy[card] or 0) + step_mj)
        das = _attributions(devices, energy)
        prev, c = c, step(c, t, *das)
        period_ok = i > 0 and 0 < t - t_before <= CAP
        for card in want_energy:
            now, was = energy[card], before.get(card)
            if period_ok and now is not None and was is not None and now >= was:
                want_energy[card] += (now - was) / 1000
            before[card] = now
        for cur, old in ((c.busy, prev.busy), (c.energy, prev.energy), (c.device_busy, prev.device_busy)):
            for key, value in old.items():  # monotonic while held (30 cycles < RETAIN_CYCLES)
                assert cur[key] >= value, key
        max_rows = max(max_rows, sum(len(x.users) + 1 for x in das) * 2 + len(das))
        assert c.held() <= (RETAIN_CYCLES + 1) * max_rows
    for dk, total in c.device_busy.items():
        got = sum(v for k, v in c.busy.items() if k[:3] == dk)
        assert math.isclose(got, total, rel_tol=1e-9, abs_tol=1e-9), dk
    for card, total in want_energy.items():
        got = sum(v for k, v in c.energy.items() if (k[0] == card if card == "GPU-0" else k[0].startswith("MIG-")))
        assert math.isclose(got, total, rel_tol=1e-9, abs_tol=1e-9), card
    assert all(v >= 0 for v in (*c.busy.values(), *c.energy.values()))


@given(st.lists(st.tuples(st.integers(0, 9), st.one_of(st.none(), st.floats(0, 100))), max_size=6,
                unique_by=lambda t: t[0]), st.one_of(st.none(), st.integers(0, 100)))
def test_sm_fractions_never_exceed_the_device(users: list, util: int | None) -> None:
    fr = uc.sm_fractions(da(dev(util=util), SHARE, *(user(i, sm) for i, sm in users)))
    cap = 1.0 if util is None else util / 100
    assert sum(f for _, f in fr) <= cap + 1e-12
    assert all(f >= 0 for _, f in fr)


# ------------------------------------------------------------------ rendering and the pipeline


def _samples(fams: list[Metric], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in fams for s in f.samples if s.name == name}


def test_rendering_uses_the_configured_label_names() -> None:
    a = step(UsageCounters(), 0.0, da(dev(util=60, energy=0), SHARE, user(1, 20)))
    b = step(a, 1.0, da(dev(util=60, energy=2_000), SHARE, user(1, 20)))
    names = LabelNames(pod="pod", namespace="namespace", container="container")
    fams = usage_families(b, "node-a", names)
    assert [f.name for f in fams] == ["nvidia_gpu_container_busy_seconds", "nvidia_gpu_container_energy_joules",
                                      "nvidia_gpu_busy_seconds"]
    assert all(f.type == "counter" for f in fams)
    dev_labels = (("minor_number", "0"), ("name", "A100"), ("node_name", "node-a"), ("uuid", "GPU-0"))
    busy = _samples(fams, "nvidia_gpu_container_busy_seconds_total")
    assert busy == pytest.approx({
        tuple(sorted((*dev_labels, ("namespace", "ns"), ("pod", "pod-1"), ("container", "c")))): 0.2,
        tuple(sorted((*dev_labels, ("namespace", ""), ("pod", ""), ("container", "")))): 0.4,
    })
    assert _samples(fams, "nvidia_gpu_busy_seconds_total") == pytest.approx({dev_labels: 0.6})
    energy = _samples(fams, "nvidia_gpu_container_energy_joules_total")
    assert sorted(energy.values()) == pytest.approx([0.4, 1.6])


def test_build_families_renders_counters_only_when_given() -> None:
    d = da(dev(util=60, energy=0), EXCLUSIVE, user(1, 60))
    attr = NodeAttribution((d,), (), (), {})
    sample = NodeSample(1.0, (d.device,))
    without = {f.name for f in build_families(attr, sample, "n", LabelNames(), ExporterStats())}
    assert "nvidia_gpu_busy_seconds" not in without
    fams = build_families(attr, sample, "n", LabelNames(), ExporterStats(), usage=step(UsageCounters(), 1.0, d))
    assert {"nvidia_gpu_container_busy_seconds", "nvidia_gpu_busy_seconds"} <= {f.name for f in fams}


def test_pipeline_integrates_a_simulated_node(tmp_path: Path) -> None:
    """rules_e2e node 1 with an energy counter: 1 s per cycle, 100 W per GPU."""
    from exporter.node.simulate import SimulatedBackend, load_scenario
    from exporter.pipeline.holder import SnapshotHolder
    from exporter.pipeline.sampler import SamplerThread
    from exporter.shell.cli import build_daemon
    from exporter.shell.config import load_config

    doc = yaml.safe_load((ROOT / "tests" / "scenarios" / "rules_e2e_east_node1.yaml").read_text())
    for d in doc["devices"]:
        d["energy_millijoules"] = 1_000_000
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc))
    daemon = build_daemon(load_config(["--simulate", str(path), "--interval", "2"]))
    clock = iter(float(t) for t in range(1000, 1100))
    pipeline = daemon.pipeline
    backend = SimulatedBackend(load_scenario(path), clock=lambda: next(clock))
    pipeline.sources = replace(pipeline.sources, backend=backend)
    SamplerThread(pipeline, SnapshotHolder(daemon.holder.get()), 2.0)  # tells the pipeline its interval
    assert pipeline.interval == 2.0
    for _ in range(4):  # 3 periods of 1 s, 100 J each per GPU
        pipeline.step()
    u = pipeline.usage
    train = ("ml", "train-0", "trainer")
    gpu0, gpu1 = "GPU-e2e00001-0000-4000-8000-000000000000", "GPU-e2e00001-0000-4000-8000-000000000001"
    assert approx(rows_of(u.busy, gpu0), {train: 3 * 0.65, REST: 0.0})
    infer_a, infer_b = ("serving", "infer-7c6b5d4f3-aaaaa", "infer"), ("serving", "infer-7c6b5d4f3-bbbbb", "infer")
    assert approx(rows_of(u.busy, gpu1), {infer_a: 3 * 0.20, infer_b: 3 * 0.35, REST: 3 * 0.05})
    assert approx(rows_of(u.energy, gpu0), {train: 300.0, REST: 0.0})
    assert approx(rows_of(u.energy, gpu1), {infer_a: 60.0, infer_b: 105.0, REST: 135.0})
    body = pipeline.step()[0].body.decode()
    assert "nvidia_gpu_container_energy_joules_total{" in body and "nvidia_gpu_busy_seconds_total{" in body
    daemon.close()
