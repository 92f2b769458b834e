"""The restructured rule bundle records what it recorded before: every public series, label set and value.

``tests/data/rules_restructure/<case>.rules.yaml`` is the bundle as rendered before its hot rules were
restructured (docs/rules.md, "How the rules are evaluated"), frozen, one file per option set of
:data:`CASES`. One Prometheus scrapes a synthetic fleet (bench/fleet*.py: three nodes of each kind,
MIG, inference, training, HAMi and gpushare, idle GPUs among them, in three clusters), one shard of it
scraped twice by a second job (duplicate scrapes) and every target carrying the exporter pod's own
``namespace``/``pod``/``container`` (as a ServiceMonitor scrapes it). Per case it evaluates ONE
group: the reference rules, every record renamed ``<case>_ref:<name>`` (references included), then
the current rendering, renamed ``<case>:<name>``, then a rule recording the group's evaluation
time. One group, so both halves evaluate at the same timestamp. The gauges are held still (the
fleet server's ``vary=0``); every sample carries the time of its request, which its counter values
are exactly linear in, so a ``rate()`` over a window the data spans is the counters' slope whichever
samples it sees (a scrape may land between the two halves). The rules are loaded once the data
spans the rate window; after one evaluation of every group, each public series of both halves is
read at that evaluation's timestamp: the same label sets, values within 1e-9 relative.
"""

from __future__ import annotations

import dataclasses
import math
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from bench.fleet import render_fleet, scrape_configs
from bench.fleet_model import KINDS, Node, build_block
from bench.fleet_render import rule_inputs
from bench.fleet_serve import CONTENT_TYPE, FleetServer, shards
from bench.prom import Prometheus, http, renamed_rules
from exporter.bundle.rules import RuleOptions, render_rules

pytestmark = pytest.mark.e2e  # every test here starts a server

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "rules_restructure"
WINDOW = "6s"  # rate window: 6 scrapes of 1 s, so rate() is the counters' slope once 8 s of data exist
REL_TOL = 1e-9  # the restructured sums add the same numbers in another order or scale before summing
# The option sets compared; each reference was rendered with these plus --interval=1s --rate-window=6s.
# Together they take every branch of the templates: pods from containers or from the helpers,
# workloads from pods, containers or the helpers, the cluster from the nodes or the device rows.
CASES: dict[str, RuleOptions] = {
    "default": RuleOptions(),
    "cluster": RuleOptions(cluster_label="cluster"),
    "pod": RuleOptions(cluster_label="cluster", levels=("pod",)),
    "workload-namespace-cluster": RuleOptions(cluster_label="cluster", levels=("workload", "namespace", "cluster")),
    "container-workload": RuleOptions(cluster_label="cluster", levels=("container", "workload")),
}
# A copy of one rule of the "cluster" case, 0.01 % off: the comparison must catch it (no vacuous run).
MUTANT = ("cluster", "k8s_pod_gpu_used")
TARGET_LABELS = {"namespace": "monitoring", "pod": "kube-gpu-exporter-x7k2p", "container": "exporter"}

Series = dict[frozenset[tuple[str, str]], float]


class StampedServer(FleetServer):
    """The fleet server, every sample stamped with the request's time (ms), the counters computed for it."""

    async def _shard(self, request: web.Request) -> web.Response:
        shard = self.shards[request.match_info["kind"]][int(request.match_info["k"])]
        ms = round(time.time() * 1000)  # elapsed in whole ms: exactly what the timestamp says
        body = shard.body((ms - round(self.started * 1000)) / 1000, self.vary)
        body = re.sub(rb"(?m)^([^#\n].*)$", rb"\1 " + str(ms).encode(), body)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def options(case: str) -> RuleOptions:
    return dataclasses.replace(CASES[case], interval="1s", rate_window=WINDOW)


def fleet() -> list[Node]:
    """Three nodes of the first block of each kind (bench/fleet_model.py: blocks alternate clusters)."""
    first: dict[str, int] = {}
    for b in range(20):
        first.setdefault(build_block(1, b)[0].kind, b)
    assert set(first) == {kind for kind, _ in KINDS}
    return [n for b in sorted(first.values()) for n in build_block(1, b)[:3]]


def renamed(text: str, tag: str) -> list[dict[str, str]]:
    """The group's rules with every record, and every reference to one, prefixed with ``tag``."""
    (group,) = yaml.safe_load(text)["groups"]
    names = sorted((r["record"] for r in group["rules"]), key=len, reverse=True)
    name = re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, names)) + r")(?![\w:])")
    rules = [{"record": r["record"], "expr": r["expr"]} for r in renamed_rules(group["rules"], tag)]
    assert not any(name.search(r["expr"]) for r in rules)  # no reference left unrenamed
    return rules


def public(text: str) -> list[str]:
    """The public (non-helper) records of a rendering, in order."""
    return [r["record"] for g in yaml.safe_load(text)["groups"] for r in g["rules"] if ":" not in r["record"]]


def prefix(case: str) -> str:
    return case.replace("-", "_")


def read(prom: Prometheus, record: str, at: float) -> Series:
    got = prom.api("query", query=record, time=f"{at:.3f}")["result"]
    return {frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"): float(r["value"][1]) for r in got}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """{case: (reference series, current series) by public record, read at one evaluation}; "mutant"; health."""
    texts = {case: ((REFERENCE / f"{case}.rules.yaml").read_text(), render_rules(options(case))) for case in CASES}
    groups = []
    for case, (ref, new) in texts.items():
        p = prefix(case)
        rules = renamed(ref, f"{p}_ref:") + renamed(new, f"{p}:")
        if case == MUTANT[0]:
            (rule,) = (r for r in rules if r["record"] == f"{p}:{MUTANT[1]}")
            rules.append({"record": f"mutant:{MUTANT[1]}", "expr": f"1.0001 * (\n{rule['expr']}\n)"})
        # last: its timestamp is that of the group's latest complete evaluation
        rules.append({"record": f"{p}_end:evaluated", "expr": "vector(1)"})
        groups.append({"name": f"restructure-{case}", "interval": "2s", "rules": rules})

    nodes = fleet()
    server = StampedServer({"shard": shards(render_fleet(nodes, "rules", workers=1), 5)}).start()
    try:
        http(f"{server.url}/control?vary=0", data=b"")
        (job,) = scrape_configs(server, "1s", "1s")
        for target in job["static_configs"]:
            target["labels"].update(TARGET_LABELS)
        again = {**job, "job_name": "kube-gpu-exporter-again", "static_configs": job["static_configs"][:1]}
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "2s"}, "scrape_configs": [job, again]}
        tmp = tmp_path_factory.mktemp("restructure")
        with Prometheus(tmp, config, {"restructure.rules.yaml": "groups: []\n"}) as prom:
            # The rules come once the data spans the rate window with a margin: no evaluation of a
            # rate() over data younger than its window, and the first evaluation counts.
            deadline = time.monotonic() + 90
            while not prom.value("min(count_over_time(up[10s]))") >= 9 and time.monotonic() < deadline:
                time.sleep(0.5)
            (tmp / "restructure.rules.yaml").write_text(yaml.safe_dump({"groups": groups}, width=1000))
            prom.proc.send_signal(signal.SIGHUP)
            at: dict[str, float] = {}
            while len(at) < len(CASES) and time.monotonic() < deadline:
                for case in CASES:
                    got = prom.api("query", query=f"timestamp({prefix(case)}_end:evaluated)")["result"]
                    if got:
                        at[case] = float(got[0]["value"][1])
                time.sleep(0.5)
            unhealthy = [(g["name"], r["name"], r.get("lastError")) for g in prom.groups().values()
                         for r in g["rules"] if r["health"] != "ok"]
            (tmp / "restructure.rules.yaml").write_text("groups: []\n")  # done: the CPU back to the reads
            prom.proc.send_signal(signal.SIGHUP)
            out: dict[str, Any] = {"unhealthy": unhealthy, "evaluated": sorted(at)}
            for case, (ref, new) in texts.items():
                p, t = prefix(case), at.get(case, time.time())
                out[case] = ({r: read(prom, f"{p}_ref:{r}", t) for r in public(ref)},
                             {r: read(prom, f"{p}:{r}", t) for r in public(new)})
                if case == MUTANT[0]:
                    out["mutant"] = read(prom, f"mutant:{MUTANT[1]}", t)
    finally:
        server.stop()
    return out


def differences(ref: dict[str, Series], new: dict[str, Series]) -> dict[str, str]:
    """{record: what differs} for every public record whose series are not the same in ``new``."""
    out = {}
    for record in ref.keys() | new.keys():
        want, got = ref.get(record), new.get(record)
        if want is None or got is None:
            out[record] = "only in the reference" if got is None else "only in the current rendering"
        elif want.keys() != got.keys():
            missing, extra = (sorted(sorted(k) for k in a.keys() - b.keys())[:2] for a, b in ((want, got), (got, want)))
            out[record] = f"label sets: missing {missing}, extra {extra}"
        else:
            off = [(dict(k), want[k], got[k]) for k in want if not math.isclose(want[k], got[k], rel_tol=REL_TOL)]
            if off:
                out[record] = f"{len(off)} of {len(want)} values differ, e.g. {off[0]}"
    return out


def test_the_references_are_the_option_sets_tested() -> None:
    """Each frozen reference was rendered with the options the test gives the current rendering."""
    for case in CASES:
        ref = (REFERENCE / f"{case}.rules.yaml").read_text().splitlines()
        assert ref[0].startswith("# Reference for tests/test_rules_restructure.py")
        generated = next(line for line in ref if line.startswith("# Generated by"))
        assert generated == render_rules(options(case)).splitlines()[0], case
        assert set(re.findall(r"\bnvidia_gpu_[a-z_]+\b", "\n".join(ref))) <= rule_inputs(), case  # all served


def test_every_rule_evaluates(recorded: dict[str, Any]) -> None:
    assert recorded["unhealthy"] == []
    assert recorded["evaluated"] == sorted(CASES)  # each group evaluated over data spanning the window


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_series_and_values_as_before(case: str, recorded: dict[str, Any]) -> None:
    ref, new = recorded[case]
    empty = sorted(r for r, s in ref.items() if not s)
    assert not empty, f"the fleet leaves these reference series empty: {empty}"  # every rule exercised
    assert differences(ref, new) == {}


def test_the_comparison_catches_a_changed_rule(recorded: dict[str, Any]) -> None:
    case, record = MUTANT
    ref, new = recorded[case]
    assert differences({record: ref[record]}, {record: new[record]}) == {}
    assert list(differences({record: ref[record]}, {record: recorded["mutant"]})) == [record]
