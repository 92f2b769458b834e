"""End to end: the per-container counters rolled up by real Prometheus, against values by hand.

The three rules e2e nodes (tests/scenarios/rules_e2e_*.yaml, clusters "east" and "west"), each
device given an energy counter: the simulated node advances it by its power (100 W) each 1 s
cycle, so the card draws 100 W. Prometheus scrapes every second and evaluates the bundle rendered
with ``--interval 1s --rate-window 20s`` (the only differences from the committed one).

By hand (docs/metrics.md, "Per-container counters"): a container's busy rate is the SM value of
its duty-cycle row (the device's utilization when exclusive) and its power the card's 100 W times
that SM share (all of it when exclusive); node and cluster series are the devices' totals.

Tolerance: the counters advance once per exporter cycle and are read once per scrape, so a
``rate()`` over 20 s sees a staircase; its worst case is one cycle in 20 s (5 %), the usual case
well under 1 % (cycle and scrape keep their phase). The test polls until every series is within
3 % at once. Separately, on one instant, the rows of each device add up to the device's own
counters exactly (same cycles, same scrapes: the staircase cancels).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from exporter.bundle.rules import RuleOptions, render_rules
from tests.prom_support import PROMETHEUS, SCENARIOS, Labels, query, rule_health, run_prometheus, start_exporter, stop
from tests.test_rules import COUNTER_SERIES
from tests.test_rules_e2e import CONTAINERS, INFER_A, INFER_B, NB_A, NB_B, NODES, TRAIN0, TRAIN1, with_k8s_copies

pytestmark = pytest.mark.e2e  # every test here starts a server

WINDOW = "20s"
REL_TOL = 0.03
WATTS = 100.0  # every e2e device's power_usage_milliwatts / 1000
BUSY = {  # % of one GPU, per container (CONTAINERS order): exclusive = the device's, share = its SM
    id(TRAIN0): 65, id(INFER_A): 20, id(INFER_B): 35, id(TRAIN1): 85 + 75, id(NB_A): 15, id(NB_B): 25,
}  # fmt: skip
POWER = {id(TRAIN0): 100, id(INFER_A): 20, id(INFER_B): 35, id(TRAIN1): 200, id(NB_A): 15, id(NB_B): 25}


def expected() -> dict[str, dict[Labels, float]]:
    exp: dict[str, dict[Labels, float]] = {}

    def put(record: str, labels: dict[str, str], value: float, *drop: str) -> None:
        kept = {k: v for k, v in labels.items() if k not in drop}
        exp.setdefault(record, {})[frozenset(with_k8s_copies(record, kept).items())] = value

    for c in CONTAINERS:
        for level, drop in (("container", ()), ("pod", ("container_name",))):
            put(f"k8s_{level}_gpu_busy", c, BUSY[id(c)], *drop)
            put(f"k8s_{level}_gpu_power_watts", c, POWER[id(c)], *drop)
    # nodes and clusters: the devices (node 1: 65 + 60 busy; each GPU's 100 W, idle share included)
    for node, cl, busy, watts in [("e2e-node-1", "east", 65 + 60, 200), ("e2e-node-2", "east", 85 + 75, 200),
                                  ("e2e-node-3", "west", 45, 100)]:
        put("k8s_node_gpu_busy", {"cluster": cl, "node_name": node}, busy)
        put("k8s_node_gpu_power_watts", {"cluster": cl, "node_name": node}, watts)
    for cl, busy, watts in [("east", 125 + 160, 400), ("west", 45, 100)]:
        put("k8s_cluster_gpu_busy", {"cluster": cl}, busy)
        put("k8s_cluster_gpu_power_watts", {"cluster": cl}, watts)
    for cl, ns, kind, name, busy, watts in [
        ("east", "ml", "StatefulSet", "train", 65 + 160, 300),  # pods on two nodes
        ("east", "serving", "Deployment", "infer", 20 + 35, 55),
        ("west", "dev", "Pod", "nb-a", 15, 15),
        ("west", "dev", "Pod", "nb-b", 25, 25),
    ]:
        w = {"cluster": cl, "namespace_name": ns, "workload_kind": kind, "workload_name": name}
        put("k8s_workload_gpu_busy", w, busy)
        put("k8s_workload_gpu_power_watts", w, watts)
    for cl, ns, busy, watts in [("east", "ml", 225, 300), ("east", "serving", 55, 55), ("west", "dev", 40, 40)]:
        put("k8s_namespace_gpu_busy", {"cluster": cl, "namespace_name": ns}, busy)
        put("k8s_namespace_gpu_power_watts", {"cluster": cl, "namespace_name": ns}, watts)
    return exp


def with_energy(scenario: Path, out: Path) -> Path:
    """``scenario`` with an energy counter on every device (it advances by the device's power)."""
    doc = yaml.safe_load(scenario.read_text())
    for d in doc["devices"]:
        d["energy_millijoules"] = 7_000_000_000
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, rules text): three exporters with energy and a Prometheus with the cluster rendering."""
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    tmp = tmp_path_factory.mktemp("usage-e2e")
    procs: list[subprocess.Popen] = []
    targets: dict[str, list[str]] = {}
    try:
        for scenario, node, cluster in NODES:
            proc, address = start_exporter(with_energy(SCENARIOS / scenario, tmp / scenario), node, tmp)
            procs.append(proc)
            targets.setdefault(cluster, []).append(address)
        rules = render_rules(RuleOptions(cluster_label="cluster", interval="1s", rate_window=WINDOW))
        static = [{"targets": addresses, "labels": {"cluster": cl}} for cl, addresses in targets.items()]
        proc, base = run_prometheus(tmp, rules, static)
        procs.append(proc)
        yield base, rules
    finally:
        for proc in procs:
            stop(proc)


def _off(got: dict[Labels, float], want: dict[Labels, float]) -> list[str]:
    if got.keys() != want.keys():
        return [f"labels: got {sorted(map(sorted, got))}, want {sorted(map(sorted, want))}"]
    return [f"{dict(sorted(k))}: {got[k]:.4f}, want {want[k]}" for k in want
            if not math.isclose(got[k], want[k], rel_tol=REL_TOL)]


def test_rolled_up_rates_equal_the_hand_computed_values(prometheus: tuple[str, str]) -> None:
    base, rules = prometheus
    want = expected()
    records = [r["record"] for g in yaml.safe_load(rules)["groups"] for r in g["rules"]]
    assert sorted(r for r in records if r in want) == sorted(s for names in COUNTER_SERIES.values() for s in names)
    deadline = time.monotonic() + 120  # the first full 20 s window, then polling
    problems: dict[str, list[str]] = {"": ["no evaluation yet"]}
    while problems and time.monotonic() < deadline:
        problems = {r: p for r in want if (p := _off(query(base, r), want[r]))}
        if problems:
            time.sleep(0.5)
    assert not problems, json.dumps(problems, indent=1)[:6000]
    assert not rule_health(base)


def test_rows_add_up_to_the_device_on_prometheus(prometheus: tuple[str, str]) -> None:
    """Container rows + the unattributed row == the device, busy and energy, each device (one query, one instant)."""
    base, _ = prometheus
    ratios = {
        "busy": f"sum by (uuid) (rate(nvidia_gpu_container_busy_seconds_total[{WINDOW}]))\n"
                f"/ sum by (uuid) (rate(nvidia_gpu_busy_seconds_total[{WINDOW}]))",
        "energy": f"sum by (uuid) (rate(nvidia_gpu_container_energy_joules_total[{WINDOW}]))\n"
                  f"/ sum by (uuid) (rate(nvidia_gpu_energy_consumption_joules_total[{WINDOW}]))",
        "power": f"sum by (uuid) (rate(nvidia_gpu_energy_consumption_joules_total[{WINDOW}])) / {WATTS}",
    }

    def off() -> dict[str, dict[str, float]]:
        bad = {}
        for what, expr in ratios.items():
            got = {dict(k)["uuid"]: v for k, v in query(base, expr).items()}
            tol = REL_TOL if what == "power" else 1e-9  # the staircase cancels in the first two
            if len(got) != 5 or not all(math.isclose(v, 1.0, rel_tol=tol) for v in got.values()):
                bad[what] = got
        return bad

    deadline = time.monotonic() + 90  # until the rows' windows are past their start
    while (problems := off()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not problems, problems
