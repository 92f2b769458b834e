"""Measure restructured versions of the bundle's hot rules next to the current ones, same output.

    python -m bench.rule_variants --nodes 1000          # about 6 min on 2 cores

One Prometheus scrapes the fleet (``rules`` profile) with the current bundle and a ``proposal``
group loaded; the proposal records ``alt:<name>`` for the rules it restructures:

- **one join per container instead of one per rule**: a helper ``cinfo`` (one series per
  container: workload labels and the ``namespace``/``pod``/``container`` copies, value 1) built
  once; each container-level series is then ``<helper> * on (<container key>) group_left (...) cinfo``,
  with no ``label_replace`` of its own (the current rules each join the pod-info helper and copy
  three labels);
- **container ratios from the container series**: ``used / request`` divides the two recorded
  container series (identical label sets) instead of recomputing and re-joining both;
- **each counter's rate() once**: ``rate(busy[5m])`` and ``rate(energy[5m])`` per counter row are
  recorded once and summed for the container, node and cluster series (today: twice and three times).

The gauges are held still (the server's ``vary=0``). Once both groups recorded a few times,
Prometheus is reloaded without targets and rules, and every rule expression of both groups is
replayed as an instant query at that moment (best of ``--reps`` inner evaluation times): the cost of
each expression without contention from ingestion, the other group or the machine's other work.
Every ``alt:`` series is checked against the current one (same label sets, values within 1e-3
relative: the counters' rates move a little between the two groups' evaluations). Writes
``rule_variants.json`` and prints a table. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.fleet import render_fleet, scrape_configs, serve_fleet
from bench.fleet_model import build_fleet
from bench.prom import Prometheus, http
from exporter.bundle.common import with_k8s_labels
from exporter.bundle.rules import RuleOptions, _context, render_rules

CINFO = "node_namespace_pod_container:nvidia_gpu_workload_info:join"
BUSY = "node_uuid:nvidia_gpu_busy_seconds:rate"
ENERGY = "node_uuid_pod_container:nvidia_gpu_container_energy_joules:rate"


def proposal(opts: RuleOptions) -> tuple[str, dict[str, list[str]]]:
    """The proposal group (rule file text) and, per restructured series, the current rules it replaces."""
    c = _context(opts)
    L, by, H, D, w = c["L"], c["by"], c["H"], c["D"], c["RW"]
    k8s = c["K8S"]["container"]
    wl = "(workload_kind, workload_name" + "".join(f", {n}" for n, _ in k8s) + ")"
    copies = [n for n, _ in c["K8S"]["pod"]]
    pod_by = f"by ({', '.join([L['P'], 'workload_kind', 'workload_name', *copies])}) "
    wl_by = f"by ({', '.join([L['W'], *(n for n, _ in c['K8S']['namespace'])])}) "
    ns_by = f"by ({', '.join([L['NS'], *(n for n, _ in c['K8S']['namespace'])])}) "
    union = " or ".join(H[k] for k in ("duty", "mem", "req", "mreq", "busy", "energy"))
    join = f"* on ({L['C']}) group_left {wl} {CINFO}"
    rules: list[tuple[str, str]] = [
        (CINFO, with_k8s_labels(f"group {by['C']}({union})\n* on ({L['PI']}) group_left (workload_kind, "
                                f"workload_name) {H['info']}", k8s)),
        (BUSY, f"max {by['NU']}(rate(nvidia_gpu_busy_seconds_total[{w}]))"),
        (ENERGY, f"max {by['NUC']}(rate(nvidia_gpu_container_energy_joules_total[{w}]))"),
        ("alt:k8s_container_gpu_used", f"{H['duty']} {join}"),
        ("alt:k8s_container_gpu_request", f"{H['req']} {join}"),
        ("alt:k8s_container_gpu_memory_used_bytes", f"{H['mem']} {join}"),
        ("alt:k8s_container_gpu_memory_request_bytes", f"{H['mreq']} {join}"),
        ("alt:k8s_container_rate_gpu_used_request",
         "alt:k8s_container_gpu_used * 100 / (alt:k8s_container_gpu_request > 0)"),
        ("alt:k8s_container_rate_gpu_memory_used_request",
         "alt:k8s_container_gpu_memory_used_bytes * 100 / (alt:k8s_container_gpu_memory_request_bytes > 0)"),
        ("alt:k8s_container_rate_gpu_used_node",
         f"alt:k8s_container_gpu_used * 100 / on ({L['N']}) group_left () {D['cap_gpu']}"),
        ("alt:k8s_container_rate_gpu_memory_used_node",
         f"alt:k8s_container_gpu_memory_used_bytes * 100 / on ({L['N']}) group_left () {D['cap_mem']}"),
        ("alt:k8s_container_gpu_busy", f"{H['busy']} * 100 {join}"),
        ("alt:" + H["energy"], f'sum {by["C"]}({ENERGY}{{{opts.pod_label}!=""}})'),
        ("alt:k8s_container_gpu_power_watts", f"alt:{H['energy']} {join}"),
        # pod, workload and namespace series summed from the container series: they carry the labels
        ("alt:k8s_pod_gpu_used", f"sum {pod_by}(alt:k8s_container_gpu_used)"),
        ("alt:k8s_pod_gpu_request", f"sum {pod_by}(alt:k8s_container_gpu_request)"),
        ("alt:k8s_pod_gpu_memory_used_bytes", f"sum {pod_by}(alt:k8s_container_gpu_memory_used_bytes)"),
        ("alt:k8s_pod_rate_gpu_used_request", f"sum {pod_by}(alt:k8s_container_gpu_used and "
         "(alt:k8s_container_gpu_request > 0)) * 100 / (alt:k8s_pod_gpu_request > 0)"),
        ("alt:k8s_workload_gpu_used", f"sum {wl_by}(alt:k8s_container_gpu_used{{workload_name!=\"\"}})"),
        ("alt:k8s_namespace_gpu_used", f"sum {ns_by}(alt:k8s_container_gpu_used)"),
        # cluster usage from the node series (each GPU once there already)
        ("alt:k8s_cluster_gpu_used", f"sum {by['CL']}(k8s_node_gpu_used)"),
        ("alt:k8s_cluster_gpu_memory_used_bytes", f"sum {by['CL']}(k8s_node_gpu_memory_used_bytes)"),
        ("alt:k8s_node_gpu_busy", f"sum {by['N']}({BUSY}) * 100"),
        ("alt:k8s_cluster_gpu_busy", f"sum {by['CL']}({BUSY}) * 100"),
        ("alt:k8s_node_gpu_power_watts", f"sum {by['N']}({ENERGY})"),
        ("alt:k8s_cluster_gpu_power_watts", f"sum {by['CL']}({ENERGY})"),
    ]
    group = {"name": "proposal", "interval": opts.interval, "rules": [{"record": r, "expr": e} for r, e in rules]}
    helpers = [CINFO, BUSY, ENERGY]
    replaces = {r.removeprefix("alt:"): [r] for r, _ in rules if r.startswith("alt:")}
    replaces["(helpers)"] = helpers
    return yaml.safe_dump({"groups": [group]}, sort_keys=False, width=1000), replaces


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Both groups evaluate until each recorded twice; then, with Prometheus idle, every rule is replayed."""
    opts = RuleOptions(cluster_label="cluster", interval=args.interval)
    current, (prop, replaces) = render_rules(opts), proposal(opts)
    fleet = build_fleet(args.nodes, args.seed)
    interval = float(args.interval.rstrip("s"))
    server = serve_fleet(fleet, render_fleet(fleet, "rules", args.workers), tke=False, interval=interval)
    try:
        with tempfile.TemporaryDirectory(prefix="kge-variants-") as tmp:
            http(f"{server.url}/control?vary=0", data=b"")
            config = {"global": {"scrape_interval": args.interval, "evaluation_interval": args.interval},
                      "scrape_configs": scrape_configs(server, args.interval, "25s")}
            with Prometheus(Path(tmp), config, {"ours.yaml": current, "proposal.yaml": prop}) as prom:
                seen: dict[str, int] = {}
                last: dict[str, str] = {}
                deadline = time.monotonic() + 3600
                started = time.monotonic()  # rates are exact once the data spans the rate window
                while (min(seen.get(g, 0) for g in ("k8s-gpu", "proposal")) < 3
                       or time.monotonic() - started < args.min_age) and time.monotonic() < deadline:
                    for name, g in prom.groups().items():
                        if g["lastEvaluation"] != last.get(name) and g["lastEvaluation"] > "2000":
                            last[name], seen[name] = g["lastEvaluation"], seen.get(name, 0) + 1
                    time.sleep(2)
                t0 = prom.quiesce()
                timed = prom.timed({r["record"]: r["expr"] for text in (current, prop)
                                    for r in yaml.safe_load(text)["groups"][0]["rules"]}, t0, args.reps)
                checks = {}
                for name in replaces:
                    if name.startswith("("):
                        continue
                    diff = f"abs({name} - alt:{name}) > 1e-3 * abs({name})"

                    def at(expr: str) -> float:
                        got = prom.api("query", query=expr, time=f"{t0:.3f}")["result"]
                        return float(got[0]["value"][1]) if got else 0.0

                    checks[name] = {"current": at(f"count({name})"), "alt": at(f"count(alt:{name})"),
                                    "matched": at(f"count({name} - alt:{name})"), "different": at(f"count({diff})")}
    finally:
        server.stop()
    return {"nodes": args.nodes, "interval": args.interval, "reps": args.reps,
            "rules_seconds": {k: v[0] for k, v in timed.items()}, "rules_series": {k: v[1] for k, v in timed.items()},
            "checks": checks, "helpers": [CINFO, BUSY, ENERGY]}


def table(result: dict[str, Any]) -> str:
    cur = alt = result["rules_seconds"]
    checks = result["checks"]
    lines = ["| series | current ms | proposed ms | series (current / proposed) | same output |",
             "| --- | ---: | ---: | ---: | --- |"]
    tot_c = tot_a = 0.0
    for name, chk in checks.items():
        c, a = cur.get(name, 0.0), alt["alt:" + name]
        tot_c, tot_a = tot_c + c, tot_a + a
        same = chk["current"] == chk["alt"] == chk["matched"] and not chk["different"]
        lines.append(f"| `{name}` | {1000 * c:.0f} | {1000 * a:.0f} | {chk['current']:.0f} / {chk['alt']:.0f} | "
                     f"{'yes' if same else 'NO: ' + str(chk)} |")
    helpers = sum(alt[k] for k in result["helpers"])
    lines.append(f"| new helpers ({CINFO}, {BUSY}, {ENERGY}) | | {1000 * helpers:.0f} | | |")
    lines.append(f"| **total** | **{1000 * tot_c:.0f}** | **{1000 * (tot_a + helpers):.0f}** | | |")
    bundle = sum(v for k, v in cur.items() if not k.startswith("alt:") and k not in result["helpers"])
    lines += ["", f"Whole bundle, replayed: {bundle:.3f} s now, {bundle - tot_c + tot_a + helpers:.3f} s with the "
              f"proposal ({result['nodes']:,} nodes)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rule_variants", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--interval", default="30s")
    p.add_argument("--reps", type=int, default=5, help="replays of each rule; the fastest counts")
    p.add_argument("--min-age", type=float, default=480.0,
                   help="seconds of data before the replay: rate() over the 5m window is exact only once the "
                        "data spans it (the two groups evaluate at different moments)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "kge-rule-variants")
    p.add_argument("--print-rules", action="store_true", help="print the proposal group and exit")
    args = p.parse_args(argv)
    if args.print_rules:
        print(proposal(RuleOptions(cluster_label="cluster", interval=args.interval))[0])
        return 0
    result = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rule_variants.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
