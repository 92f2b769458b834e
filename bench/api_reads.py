#!/usr/bin/env python3
"""Kubernetes API requests of one node's exporter, counted by the API double: before and after issue 26.

One node, ``--pods`` pods each naming ``--refs`` ResourceClaims (every second one exists, reserved for
its pod; the others do not: a 404 each), then ``--steady-s`` seconds with nothing changing, then one pod
more a second for ``--churn-s`` seconds. The double (tests/k8s_double) records every request; the
counts per phase are the result, nothing is timed but the phases' lengths.

- ``after``: the daemon's own wiring (``exporter.shell.cli._cluster_sources``: the pod watch, the
  Node, the DRA slice watch and claim reader, all behind the one rate limit) with the default flags
  unless ``--qps``/``--burst``/``--cap`` say otherwise.
- ``before``: the claim reader as it was at 8a20538 (every claim the pods name read every 15 s and all
  again whenever the set of names changes, no limit, no cap beyond the parser's 32), restated below
  over the same pod watch and store.

    python -m bench.api_reads                      # 50 pods x 32 references, 60 s steady, 30 s churn
    python -m bench.api_reads --only after --json /tmp/api_reads.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: tests.* are the harness

from exporter.node.dra_source import ClaimAwarePodStore  # noqa: E402
from exporter.node.kube_api import KubeApi  # noqa: E402
from exporter.node.pod_watcher import PodWatcher  # noqa: E402
from exporter.shell import cli  # noqa: E402
from exporter.shell.config import load_config  # noqa: E402
from tests.k8s_double import ApiServerDouble, make_node, poll_until  # noqa: E402
from tests.test_dra_shapes import claim, gpu_device, pod, resource_slice  # noqa: E402

NODE = "gpu-node-1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/"


def _uid(i: int) -> str:
    return f"d7a00000-0000-4000-8000-{i:012x}"


def add_pod(api: ApiServerDouble, i: int, refs: int, claims: list[dict[str, Any]]) -> None:
    """Pod ``i`` naming ``refs`` claims; every even one exists (appended to ``claims`` and stored)."""
    names = {f"g{j}": ("claim", f"p{i}-c{j}") for j in range(refs)}
    claims.extend(claim("ml", f"p{i}-c{j}", [("gpu", NODE, "gpu-0")], [(f"p{i}", _uid(i))])
                  for j in range(0, refs, 2))
    api.set_resource_claims(claims)
    api.add_pod(pod("ml", f"p{i}", _uid(i), NODE, {"c": [(n, "") for n in names]}, names))


def _kind(path: str) -> str:
    if path.startswith(CLAIMS):
        return "resourceclaims"
    return path.rstrip("/").split("/")[-1] if "/nodes/" not in path else "nodes"


class _Before:
    """The claim reader of 8a20538 (exporter/node/dra_source.py), restated: same requests, same timing."""

    def __init__(self, api: KubeApi, pod_claims: Callable[[], Any], refresh: float = 15.0) -> None:
        self._api, self._pod_claims, self._refresh = api, pod_claims, refresh
        self._stop = threading.Event()
        self.claims: dict[tuple[str, str], Any] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        dns = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
        last: set[tuple[str, str]] = set()
        due = 0.0
        while not self._stop.is_set():
            wanted = {(pc.namespace, name) for pc in self._pod_claims().values() for name in pc.claims.values()
                      if dns.fullmatch(name) and dns.fullmatch(pc.namespace)}
            if wanted != last or time.monotonic() >= due:
                self.claims = {key: obj for key in sorted(wanted) if (obj := self._get(*key)) is not None}
                last, due = wanted, time.monotonic() + self._refresh
            self._stop.wait(1.0)

    def _get(self, ns: str, name: str) -> Any:
        try:
            return self._api.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
        except Exception:
            return None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def _start(reader: str, api: ApiServerDouble, qps: float, burst: int, cap: int
           ) -> tuple[Callable[[], int], list[Callable[[], None]]]:
    """The exporter's API side as ``reader`` had it: (claims it holds now, closers)."""
    closers: list[Callable[[], None]] = []
    if reader == "after":
        cfg = load_config(["--kube-api-url", api.url, "--node-name", NODE, "--kube-api-qps", str(qps),
                           "--kube-api-burst", str(burst), "--dra-max-claims-per-pod", str(cap)], environ={})
        pods, _, _ = cli._cluster_sources(cfg, NODE, closers)
        dra = pods.dra  # type: ignore[attr-defined]
        return lambda: len(dra.resource_claims()), closers
    kube = KubeApi(api.url)
    store = ClaimAwarePodStore()
    watcher = PodWatcher(NODE, kube, store=store)
    before = _Before(kube, store.pod_claims)
    watcher.start()
    before.start()
    closers += [watcher.stop, before.stop]
    return lambda: len(before.claims), closers


def measure(reader: str, *, pods: int = 50, refs: int = 32, steady_s: float = 60.0, churn_s: int = 30,
            qps: float = 5.0, burst: int = 10, cap: int = 8, settle_s: float = 600.0) -> dict[str, Any]:
    """One run: requests at start, per second in steady state, per pod change while pods come."""
    followed = refs if reader == "before" else min(refs, cap)
    claims: list[dict[str, Any]] = []
    with ApiServerDouble() as api:
        api.set_nodes([make_node(NODE)])
        api.set_resource_slices([resource_slice(NODE, [gpu_device(0, "GPU-00000000-0000-4000-8000-000000000001")])])
        for i in range(pods):
            add_pod(api, i, refs, claims)
        t0 = time.monotonic()
        held, closers = _start(reader, api, qps, burst, cap)
        try:
            want = pods * ((followed + 1) // 2)
            poll_until(lambda: held() >= want, settle_s, 0.05, f"{want} claims read")
            settle = time.monotonic() - t0
            n_start = len(api.requests)
            time.sleep(steady_s)
            steady = api.requests[n_start:]
            n_churn, t_churn = len(api.requests), time.monotonic()
            for k in range(churn_s):
                add_pod(api, pods + k, refs, claims)
                time.sleep(max(0.0, t_churn + k + 1 - time.monotonic()))  # one pod a second, whatever add_pod took
            churn = api.requests[n_churn:]
            churn_wall = time.monotonic() - t_churn
            # then until the new pods' claims are all read: what each pod change cost in the end
            want += churn_s * ((followed + 1) // 2)
            new_pods = {f"p{pods + k}-" for k in range(churn_s)}

            def new_reads() -> int:
                return sum(1 for r in api.requests[n_churn:] if r.path.startswith(CLAIMS)
                           and r.path.rsplit("/", 1)[-1].split("c", 1)[0] in new_pods)

            poll_until(lambda: held() >= want and new_reads() >= churn_s * followed, settle_s, 0.05,
                       f"{want} claims held, {churn_s * followed} of the new pods' read")
            drained = time.monotonic() - t_churn
            time.sleep(1.0)  # a read more would come within the reader's tick
            per_pod = new_reads()
        finally:
            for close in reversed(closers):
                close()
    return {
        "reader": reader, "pods": pods, "refs": refs, "claims_followed_per_pod": followed,
        "qps": qps if reader == "after" else None, "burst": burst if reader == "after" else None,
        "start": {"requests": n_start, "seconds_to_all_claims": round(settle, 2)},
        "steady": {"seconds": steady_s, "requests": len(steady),
                   "requests_per_second": round(len(steady) / steady_s, 3) if steady_s else None,
                   "by_kind": dict(Counter(_kind(r.path) for r in steady))},
        "churn": {"seconds": round(churn_wall, 2), "pods_added": churn_s, "requests": len(churn),
                  "requests_per_second": round(len(churn) / churn_wall, 2) if churn_s else None,
                  "by_kind": dict(Counter(_kind(r.path) for r in churn)),
                  "seconds_to_all_claims": round(drained, 2),
                  "claim_reads_per_pod_change": round(per_pod / churn_s, 2) if churn_s else None},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=50)
    p.add_argument("--refs", type=int, default=32)
    p.add_argument("--steady-s", type=float, default=60.0)
    p.add_argument("--churn-s", type=int, default=30)
    p.add_argument("--qps", type=float, default=5.0)
    p.add_argument("--burst", type=int, default=10)
    p.add_argument("--cap", type=int, default=8)
    p.add_argument("--only", choices=("before", "after"))
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    runs = [measure(r, pods=a.pods, refs=a.refs, steady_s=a.steady_s, churn_s=a.churn_s, qps=a.qps, burst=a.burst,
                    cap=a.cap) for r in (("before", "after") if a.only is None else (a.only,))]
    print("| reader | requests at start | s to all claims | steady req/s | churn req/s | claim reads per pod change |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in runs:
        print(f"| {r['reader']} | {r['start']['requests']} | {r['start']['seconds_to_all_claims']} | "
              f"{r['steady']['requests_per_second']} | {r['churn']['requests_per_second']} | "
              f"{r['churn']['claim_reads_per_pod_change']} |")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
