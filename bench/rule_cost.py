"""What the recording rules cost at fleet scale: our bundle and the seed's TKE group, side by side.

    python -m bench.rule_cost --nodes 100,1000,5000            # 4-15 min per size, plus rendering
    python -m bench.rule_cost --nodes 50 --interval 10s --evaluations 2 --full-up-to 0   # a quick look

For each size (and profile) a fresh Prometheus on a loopback port scrapes the synthetic fleet
(bench/fleet.py) with both rule files loaded: ours rendered with ``--cluster-label cluster``, the
seed's group renamed ``tke:*``. Once every target was scraped twice it records ``--evaluations``
evaluations of both groups (/api/v1/rules: group and per-rule evaluation times), Prometheus' own
metrics (head series, RSS, samples appended per second, CPU), and the series each bundle created;
then it holds the fleet's gauges still, waits for a fresh evaluation and compares both bundles
with the model's truth (bench/rule_compare.py). Writes ``rule_cost.json`` and ``rule_cost.md``
into ``--out``. Profiles: ``rules`` (only the families the bundle reads; every size) and ``full``
(everything the exporter emits; sizes up to ``--full-up-to``). A size whose Prometheus would not fit
in the free memory (estimated from the last run's RSS per head series) runs our bundle alone, or
not at all. See bench/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.fleet import render_fleet, scrape_configs, series_summary, serve_fleet
from bench.fleet_model import Node, build_fleet
from bench.fleet_render import Family, rule_inputs
from bench.fleet_serve import FleetServer
from bench.fleet_tke import PREFIX, seed_rule_file
from bench.prom import Prometheus, http, renamed_rules, rule_reads
from bench.rule_compare import compare
from bench.rule_cost_report import OURS_GROUP, SEED_GROUP, machine, markdown, scaling
from exporter.bundle.rules import RuleOptions, render_rules


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in sorted(units, key=len, reverse=True):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)


def _wait(predicate: Any, timeout: float, what: str, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(every)


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _memory_needed(runs: Sequence[dict[str, Any]], profile: str, nodes: int, seed_group: bool) -> float | None:
    """Prometheus' RSS for ``nodes``, from the last finished run of ``profile`` (bytes per head series)."""
    done = [r for r in runs if r["profile"] == profile and "error" not in r]
    if not done:
        return None
    r = done[-1]
    per_series = r["prometheus"]["peak_rss_bytes"] / r["prometheus"]["head_series"]
    series = r["scraped_series"]["exporter"] + sum(r["recorded_series"][OURS_GROUP].values())
    if seed_group:
        series += r["scraped_series"]["tke"] + sum(r["recorded_series"].get(SEED_GROUP, {}).values())
    return 1.1 * per_series * series * nodes / r["nodes"]


def _scraped_twice(server: FleetServer, prom: Prometheus, targets: int) -> bool:
    scrapes = [s.scrapes for kind in server.shards.values() for s in kind]
    return min(scrapes) >= 2 and prom.value('count(up{job=~"kube-gpu-exporter|tke"} == 1)') == targets


def _collect(prom: Prometheus, groups: Sequence[str], evaluations: int, interval: float,
             sleep: Callable[[float], None] = time.sleep) -> dict[str, list[dict[str, Any]]]:
    """``evaluations`` fresh evaluations of each group: group and per-rule times, health.

    A group slower than its interval skips iterations: the wait grows with the slowest evaluation seen.
    A faster group's evaluations past ``evaluations`` (it goes on while a slower one is awaited) are not
    kept: each group is summarised over as many as asked.
    """
    seen: dict[str, list[dict[str, Any]]] = {g: [] for g in groups}
    last: dict[str, str] = {g: v["lastEvaluation"] for g, v in prom.groups().items()}
    started, slowest = time.monotonic(), interval
    while any(len(v) < evaluations for v in seen.values()):
        if time.monotonic() - started > (evaluations + 2) * 2 * slowest + 120:
            break
        for name, g in prom.groups().items():
            if name in seen and len(seen[name]) < evaluations and g["lastEvaluation"] != last.get(name):
                last[name] = g["lastEvaluation"]
                slowest = max(slowest, g["evaluationTime"])
                seen[name].append({"seconds": g["evaluationTime"], "rules": {
                    r["name"]: r["evaluationTime"] for r in g["rules"]},
                    "unhealthy": {r["name"]: r.get("lastError", "") for r in g["rules"] if r["health"] != "ok"}})
        sleep(max(1.0, interval / 15))
    return seen


def _group_summary(evals: list[dict[str, Any]]) -> dict[str, Any]:
    secs = [e["seconds"] for e in evals]
    rules = {n: statistics.median(e["rules"][n] for e in evals) for n in evals[0]["rules"]} if evals else {}
    return {"evaluations": len(evals), "seconds_median": statistics.median(secs) if secs else None,
            "seconds_max": max(secs, default=None), "rule_seconds_median": rules,
            "unhealthy": evals[-1]["unhealthy"] if evals else {}}


def _own_metrics(prom: Prometheus) -> dict[str, Any]:
    m = prom.metrics()

    def one(name: str, **labels: str) -> float | None:
        for lbl, v in m.get(name, []):
            if all(lbl.get(k) == want for k, want in labels.items()):
                return v
        return None

    groups = {lbl["rule_group"].rsplit(";", 1)[1]: v for lbl, v in m.get("prometheus_rule_group_last_duration_seconds",
                                                                         [])}
    rules = {lbl["rule_group"].rsplit(";", 1)[1]: v for lbl, v in m.get("prometheus_rule_group_rules", [])}
    failures = {lbl["rule_group"].rsplit(";", 1)[1]: v for lbl, v in m.get("prometheus_rule_evaluation_failures_total",
                                                                           [])}
    return {"time": time.time(), "head_series": one("prometheus_tsdb_head_series"),
            "samples_appended_total": one("prometheus_tsdb_head_samples_appended_total"),
            "cpu_seconds_total": one("process_cpu_seconds_total"),
            "resident_memory_bytes": one("process_resident_memory_bytes"),
            "go_heap_inuse_bytes": one("go_memstats_heap_inuse_bytes"),
            "rule_group_last_duration_seconds": groups, "rule_group_rules": rules,
            "rule_evaluation_failures_total": failures}


def _records(text: str) -> list[str]:
    return [r["record"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def _count(prom: Prometheus, names: Sequence[str]) -> dict[str, int]:
    """Series per recorded name (0 for a rule that recorded nothing)."""
    got = {m["__name__"]: int(v) for m, v in prom.query(f'count by (__name__) ({{__name__=~"{"|".join(names)}"}})')}
    return {name: got.get(name, 0) for name in names}


def run_size(nodes: Sequence[Node], exporter: Sequence[list[Family]], profile: str,
             args: argparse.Namespace) -> dict[str, Any]:
    """One Prometheus over ``nodes``: costs, series, comparison (``args.seed_group``: with the TKE side)."""
    interval = _seconds(args.interval)
    rules = {"ours.rules.yaml": render_rules(RuleOptions(cluster_label="cluster", interval=args.interval))}
    groups = [OURS_GROUP]
    if args.seed_group:
        rules["tke.rules.yaml"] = seed_rule_file(group=SEED_GROUP)
        groups.append(SEED_GROUP)
    for name, text in args.also if len(nodes) <= args.also_up_to else ():
        rules[f"{name}.rules.yaml"] = renamed_rule_file(text, f"{name}:", name)
        groups.append(name)
    result: dict[str, Any] = {"profile": profile, "nodes": len(nodes), "gpus": sum(len(n.devices) for n in nodes),
                              "bundles": groups, "load_average_before": os.getloadavg(),
                              "rules_sha256": {k: hashlib.sha256(v.encode()).hexdigest()[:16]
                                               for k, v in rules.items()},
                              "scraped_series": {"exporter": sum(len(f.samples) for fams in exporter for f in fams)},
                              "mem_available_before_bytes": _mem_available()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kge-rule-cost-") as tmp:
        server = serve_fleet(nodes, exporter, args.nodes_per_shard, tke=args.seed_group, interval=interval)
        try:
            result["scraped_series"]["tke"] = sum(s.series for s in server.shards.get("tke", ()))
            targets = sum(len(v) for v in server.shards.values())
            config = {"global": {"scrape_interval": args.interval, "evaluation_interval": args.interval},
                      "scrape_configs": scrape_configs(server, args.interval, args.scrape_timeout)}
            with Prometheus(Path(tmp), config, rules) as prom:
                _wait(lambda: _scraped_twice(server, prom, targets), interval * 4 + 180, "two scrapes of every target")
                before = _own_metrics(prom)
                evals = _collect(prom, groups, args.evaluations, interval)
                after = _own_metrics(prom)
                dt = after["time"] - before["time"]
                result |= {
                    "targets": targets, "shards": len(server.shards["shard"]),
                    "groups": {g: _group_summary(evals[g]) for g in groups},
                    "prometheus": {**after, **prom.rss(),
                                   "samples_appended_per_second": (after["samples_appended_total"]
                                                                   - before["samples_appended_total"]) / dt,
                                   "cpu_cores_used": (after["cpu_seconds_total"] - before["cpu_seconds_total"]) / dt,
                                   "scrape_duration_seconds_max": prom.value("max(scrape_duration_seconds)"),
                                   "window_seconds": dt, "load_average_after": os.getloadavg()},
                    "recorded_series": {g: _count(prom, _records(text)) for g, text in zip(groups, rules.values(),
                                                                                         strict=True)},
                    # which of our records each of ours reads: the helpers an equivalent series costs
                    "rule_reads": rule_reads(yaml.safe_load(rules["ours.rules.yaml"])["groups"][0]["rules"]),
                }
                slowest = max([interval] + [e["seconds"] for g in groups for e in evals[g]])
                compared = args.seed_group and not args.no_compare
                result["comparison"] = _compare(prom, server, nodes, groups, slowest) if compared else None
                if args.replay_reps:
                    result["replay"] = _replay(prom, dict(zip(groups, rules.values(), strict=True)), args.replay_reps)
        finally:
            server.stop()
    result["wall_seconds"] = time.monotonic() - started
    return result


def _compare(prom: Prometheus, server: FleetServer, nodes: Sequence[Node], groups: Sequence[str],
             slowest: float) -> dict[str, Any]:
    """Hold the gauges at the model's values, wait for a rescrape and a fresh evaluation, compare."""
    http(f"{server.url}/control?vary=0", data=b"")
    counts = {id(s): s.scrapes for kind in server.shards.values() for s in kind}
    # Two rescrapes of every target: a scrape's samples carry its start time but land when a large
    # body has been ingested, which at thousands of nodes can be after an evaluation began. After the
    # second, every sample an evaluation can see is held still (the first rescrape's, or later ones).
    _wait(lambda: all(s.scrapes > counts[id(s)] + 1 for kind in server.shards.values() for s in kind),
          slowest * 4 + 90, "two rescrapes of every target")
    fresh = time.time()

    def evaluated() -> bool:
        current = prom.groups()
        return all(_epoch(current[g]["lastEvaluation"]) > fresh for g in groups)

    _wait(evaluated, slowest * 3 + 60, "fresh evaluations of every group")
    out = compare(prom.query, nodes)
    http(f"{server.url}/control?vary=1", data=b"")
    return out


def _replay(prom: Prometheus, texts: dict[str, str], reps: int) -> dict[str, Any]:
    """Every rule again as an instant query on an idle Prometheus (no targets, no rules) at the last data."""
    t0 = prom.quiesce()
    out: dict[str, Any] = {"reps": reps}
    exprs = {(group, r["record"]): r["expr"] for group, text in texts.items()
             for g in yaml.safe_load(text)["groups"] for r in g["rules"]}
    # The floor: one pass over every series the bundle reads (the least any bundle reading them pays).
    floor = f'count({{__name__=~"{"|".join(sorted(rule_inputs()))}"}})'
    timed = prom.timed({**{f"{g}\0{n}": e for (g, n), e in exprs.items()}, "\0floor": floor}, t0, reps)
    for group in texts:
        rules = {n: timed[f"{g}\0{n}"][0] for g, n in exprs if g == group}
        out[group] = {"seconds": sum(rules.values()), "rule_seconds": rules}
    out["floor"] = {"expr": floor, "seconds": timed["\0floor"][0]}
    return out


def renamed_rule_file(text: str, prefix: str, group: str) -> str:
    """A rule file as one group ``group``, every recorded name renamed ``<prefix><name>`` in records and exprs."""
    doc = yaml.safe_load(text)
    rules = renamed_rules([r for g in doc["groups"] for r in g["rules"]], prefix)
    out = {"groups": [{**doc["groups"][0], "name": group, "rules": rules}]}
    return yaml.safe_dump(out, sort_keys=False, width=1000)


def _also(spec: str) -> tuple[str, str]:
    """``NAME=FILE`` of --also: a group name and the rule file's text."""
    name, eq, path = spec.partition("=")
    if not eq or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"expected NAME=FILE with a lower-case NAME, got {spec!r}")
    return name, Path(path).read_text()


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rule_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="100,1000,5000", help="comma-separated fleet sizes (8 GPUs per node)")
    p.add_argument("--full-up-to", type=int, default=1000,
                   help="also run the full exposition for sizes up to this (0: never)")
    p.add_argument("--interval", default="30s", help="scrape and evaluation interval (default %(default)s)")
    p.add_argument("--scrape-timeout", default="25s")
    p.add_argument("--evaluations", type=int, default=4, help="evaluations of each group timed per size")
    p.add_argument("--nodes-per-shard", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="processes rendering the fleet")
    p.add_argument("--no-compare", action="store_true", help="skip the comparison with the model's truth")
    p.add_argument("--replay-reps", type=int, default=2,
                   help="at the end, replay every rule on the idle Prometheus this many times (0: no replay)")
    p.add_argument("--ours-only-above", type=int, default=0,
                   help="sizes above this run our bundle alone, without the TKE inputs and the seed's group "
                        "(0: never); for a size both cannot fit in memory")
    p.add_argument("--also", type=_also, action="append", default=[], metavar="NAME=FILE",
                   help="another rule file evaluated beside the bundles as group NAME, its records renamed "
                        "NAME:<record> (e.g. an earlier bundle, for a same-run before/after)")
    p.add_argument("--also-up-to", type=int, default=1000, help="sizes up to which --also groups run")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "kge-rule-cost")
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.nodes.split(",") if s.strip()})
    fleet = build_fleet(max(sizes), args.seed)
    config = {**{k: str(v) for k, v in vars(args).items() if k != "also"}, "also": [n for n, _ in args.also]}
    report: dict[str, Any] = {"machine": machine(), "config": {**config, "sizes": sizes, "seed_prefix": PREFIX},
                              "runs": []}
    runs = [("rules", n) for n in sizes] + [("full", n) for n in sizes if n <= args.full_up_to]
    rendered: dict[str, list[list[Family]]] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for profile, n in runs:
        if profile not in rendered:
            t0 = time.monotonic()
            biggest = max(m for pr, m in runs if pr == profile)
            rendered[profile] = render_fleet(fleet[:biggest], profile, args.workers)
            report.setdefault("render_seconds", {})[profile] = time.monotonic() - t0
            report.setdefault("series_summary", {})[profile] = series_summary(fleet[:biggest], rendered[profile])
        print(f"# {profile} profile, {n} nodes ...", file=sys.stderr, flush=True)
        args.seed_group = not (args.ours_only_above and n > args.ours_only_above)
        need = _memory_needed(report["runs"], profile, n, args.seed_group)
        room = _mem_available() - 1.5 * 2**30
        note = None
        if need and need > room and args.seed_group:  # the largest that fits: our bundle alone
            alone = _memory_needed(report["runs"], profile, n, False)
            if alone and alone <= room:
                args.seed_group = False
                note = (f"both bundles would need about {need / 2**30:.1f} GiB, {room / 2**30:.1f} GiB free: "
                        "ran our bundle alone")
                need = alone
        try:
            if need and need > room:
                raise RuntimeError(f"would need about {need / 2**30:.1f} GiB (RSS per head series of the last run), "
                                   f"{_mem_available() / 2**30:.1f} GiB available: not started")
            run = run_size(fleet[:n], rendered[profile][:n], profile, args)
            if note:
                run["note"] = note
        except (TimeoutError, RuntimeError, OSError) as e:
            run = {"profile": profile, "nodes": n, "error": f"{type(e).__name__}: {e}",
                   "mem_available_bytes": _mem_available()}
        report["runs"].append(run)
        (args.out / "rule_cost.json").write_text(json.dumps(report, indent=2) + "\n")
        g = {k: v.get("seconds_median") for k, v in run.get("groups", {}).items()}
        rss = run.get("prometheus", {}).get("rss_bytes", 0) / 2**30
        print(f"#   eval seconds {g or run.get('error')}, RSS {rss:.2f} GiB", file=sys.stderr, flush=True)
    report["scaling"] = scaling(report["runs"])
    (args.out / "rule_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "rule_cost.md").write_text(markdown(report))
    print(markdown(report))
    print(f"JSON: {args.out / 'rule_cost.json'}", file=sys.stderr)
    return 0 if all("error" not in r for r in report["runs"]) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
