"""Synthetic GPU fleet for the scaling benchmarks: generate, render through the exporter, serve.

    python -m bench.fleet node --nodes 100 --index 7            # one node's exposition, as the exporter serves it
    python -m bench.fleet node --nodes 100 --index 7 --tke      # the same node's TKE inputs
    python -m bench.fleet summary --nodes 200                   # series per node and per GPU, by node kind
    python -m bench.fleet serve --nodes 1000 --port 9400        # serve it; prints the scrape configs

The model is bench/fleet_model.py (deterministic by ``--seed``; smaller fleets are prefixes of
larger ones), the rendering bench/fleet_render.py (every node through the exporter's real
attribute -> build_families -> render path), the TKE inputs bench/fleet_tke.py, the server
bench/fleet_serve.py. See bench/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import yaml

from bench.fleet_model import CLUSTERS, Node, build_fleet
from bench.fleet_render import Family, node_exposition, node_families
from bench.fleet_serve import FleetServer, shards
from bench.fleet_tke import tke_families

PROFILES = ("full", "rules")


def render_fleet(nodes: Sequence[Node], profile: str = "full", workers: int = 2, **kw: Any) -> list[list[Family]]:
    """Every node's exporter families (bench.fleet_render.node_families), over ``workers`` processes."""
    fn = functools.partial(node_families, profile=profile, **kw)
    if workers <= 1 or len(nodes) < 20:
        return [fn(n) for n in nodes]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.map(fn, nodes, chunksize=10)


def serve_fleet(nodes: Sequence[Node], exporter: Sequence[list[Family]], nodes_per_shard: int = 50,
                port: int = 0, tke: bool = True, interval: float | None = None) -> FleetServer:
    """A started server with ``/shard/<k>`` (``exporter``) and ``/tke/<k>`` (the TKE inputs of ``nodes``)."""
    paths = {"shard": shards(exporter, nodes_per_shard)}
    if tke:
        paths["tke"] = shards([tke_families(n) for n in nodes], nodes_per_shard)
    return FleetServer(paths, port=port, interval=interval).start()


def scrape_configs(server: FleetServer, interval: str = "30s", timeout: str = "25s") -> list[dict[str, Any]]:
    """Prometheus scrape configs for the server's shards, one target per path.

    ``honor_labels``: the scraped series keep their node's ``instance``; the target's own
    ``instance`` (``shard-<k>``) only names the ``up``/``scrape_*`` series of that path.
    """
    address = f"{server.host}:{server.port}"
    return [{"job_name": job, "honor_labels": True, "scrape_interval": interval, "scrape_timeout": timeout,
             "static_configs": [{"targets": [address], "labels": {"__metrics_path__": path,
                                                                  "instance": path.strip("/").replace("/", "-")}}
                                for path in server.paths(kind)]}
            for job, kind in (("kube-gpu-exporter", "shard"), ("tke", "tke")) if kind in server.shards]


def series_summary(nodes: Sequence[Node], per_node: Sequence[list[Family]]) -> dict[str, Any]:
    """Series per node and per GPU (devices as the exporter counts them: MIG devices included), by kind."""
    by_kind: dict[str, list[tuple[int, int]]] = defaultdict(list)
    families: dict[str, int] = defaultdict(int)
    for node, fams in zip(nodes, per_node, strict=True):
        by_kind[node.kind].append((sum(len(f.samples) for f in fams), len(node.devices)))
        for f in fams:
            families[f.name] += len(f.samples)
    total = sum(s for rows in by_kind.values() for s, _ in rows)
    size = sum(len(s.key) + len(repr(s.value)) + 2 for fams in per_node for f in fams for s in f.samples)
    return {
        "nodes": len(nodes), "series": total, "series_per_node": total / len(nodes),
        "sample_bytes_per_node": size / len(nodes),
        "series_per_gpu": total / (8 * len(nodes)),
        "by_kind": {k: {"nodes": len(v), "series_per_node": statistics.fmean(s for s, _ in v),
                        "devices_per_node": statistics.fmean(d for _, d in v)} for k, v in sorted(by_kind.items())},
        "top_families_per_node": {f: n / len(nodes) for f, n in sorted(families.items(), key=lambda x: -x[1])[:12]},
    }


def _exposition(fams: Sequence[Family]) -> str:
    out = []
    for f in fams:
        out.append(f"# HELP {f.name} {f.help}\n# TYPE {f.name} {f.kind}\n")
        out += [f"{s.key.decode()} {s.value!r}\n" for s in f.samples]
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("node", "summary", "serve"):
        s = sub.add_parser(name)
        s.add_argument("--nodes", type=int, default=100)
        s.add_argument("--seed", type=int, default=1)
        s.add_argument("--clusters", default=",".join(CLUSTERS), help="comma-separated cluster names")
        s.add_argument("--profile", choices=PROFILES, default="full",
                       help="full: everything the exporter emits; rules: only the families the rule bundle reads")
    node = sub.choices["node"]
    node.add_argument("--index", type=int, default=0)
    node.add_argument("--tke", action="store_true", help="the node's TKE inputs instead")
    node.add_argument("--per-process", action="store_true", help="as with the exporter's --per-process-metrics")
    node.add_argument("--allowlist", default="", help="as the exporter's --pod-labels-allowlist (e.g. team,app)")
    summary = sub.choices["summary"]
    summary.add_argument("--json", action="store_true")
    summary.add_argument("--per-process", action="store_true", help="as with the exporter's --per-process-metrics")
    summary.add_argument("--allowlist", default="", help="as the exporter's --pod-labels-allowlist")
    serve = sub.choices["serve"]
    serve.add_argument("--port", type=int, default=9400)
    serve.add_argument("--nodes-per-shard", type=int, default=50)
    serve.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    fleet = build_fleet(args.nodes, args.seed, tuple(args.clusters.split(",")))
    if args.cmd == "node":
        n = fleet[args.index]
        if args.tke:
            sys.stdout.write(_exposition(tke_families(n)))
        elif args.profile == "rules":
            sys.stdout.write(_exposition(node_families(n, profile="rules")))
        else:
            sys.stdout.write(node_exposition(n, per_process=args.per_process, allowlist=args.allowlist).decode())
        return 0
    knobs = {"per_process": args.per_process, "allowlist": args.allowlist} if args.cmd == "summary" else {}
    rendered = render_fleet(fleet, args.profile, getattr(args, "workers", 2), **knobs)
    if args.cmd == "summary":
        summary = series_summary(fleet, rendered)
        print(json.dumps(summary, indent=2) if args.json else yaml.safe_dump(summary, sort_keys=False))
        return 0
    server = serve_fleet(fleet, rendered, args.nodes_per_shard, args.port)
    print(yaml.safe_dump({"scrape_configs": scrape_configs(server)}, sort_keys=False))
    print(f"# serving {len(fleet)} nodes on {server.url} (Ctrl-C stops)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
