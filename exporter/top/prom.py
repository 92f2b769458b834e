"""``kube-gpu-exporter top --prometheus``'s data: the cluster view from the recorded series of docs/rules.md.

Pure apart from :func:`fetch_cluster` (bounded instant queries to ``/api/v1/query``). The Textual app
(top_app.py) only displays what :func:`build_cluster_view` returns.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from exporter.top.rows import GIB, FetchError, Row, get_body

TOP = 10  # rows per ranking
IDLE_BELOW = 1.0  # % of one GPU: an allocated container using less is idle
_CONTAINER = "on(node_name, namespace_name, pod_name, container_name)"

QUERIES: dict[str, str] = {
    "workload_used": "k8s_workload_gpu_used",
    "workload_memory": "k8s_workload_gpu_memory_used_bytes",
    "namespace_used": "k8s_namespace_gpu_used",
    "namespace_memory": "k8s_namespace_gpu_memory_used_bytes",
    "node_capacity": "kube_node_status_capacity_gpu",
    "node_used": "k8s_node_gpu_used",
    "node_allocated": "k8s_node_gpu_allocated_compute",
    "node_memory": "k8s_node_gpu_memory_used_bytes",
    "node_allocated_memory": "k8s_node_gpu_allocated_memory_bytes",
    "cluster_used": "k8s_cluster_rate_gpu_used_cluster",
    "cluster_request": "k8s_cluster_rate_gpu_request_cluster",
    "cluster_total": "k8s_cluster_gpu_total",
    # Idle: a usage series, below the threshold, as KubeGpuAllocatedIdle reads it. No usage series at all is
    # not idle but unknown: NVML has no utilization for it (a MIG device before Hopper, NotSupported).
    "idle": f"(k8s_container_gpu_request > 0) and {_CONTAINER} (k8s_container_gpu_used < {IDLE_BELOW})",
    "unknown": f"(k8s_container_gpu_request > 0) unless {_CONTAINER} k8s_container_gpu_used",
}

WORKLOAD_COLUMNS: Row = ("Namespace", "Kind", "Workload", "GPU used %", "Memory GiB")
NAMESPACE_COLUMNS: Row = ("Namespace", "GPU used %", "Memory GiB")
NODE_COLUMNS: Row = ("Node", "GPUs", "Used %", "Allocated %", "Used/alloc %", "Memory GiB", "Alloc mem GiB")
IDLE_COLUMNS: Row = ("Node", "Namespace", "Pod", "Container", "Allocated %")

Results = dict[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True)
class ClusterView:
    """The cluster header line, an optional message, and the rows of each table."""

    header: str
    message: str = ""
    workloads: list[Row] = field(default_factory=list)
    namespaces: list[Row] = field(default_factory=list)
    nodes: list[Row] = field(default_factory=list)
    idle: list[Row] = field(default_factory=list)
    unknown: list[Row] = field(default_factory=list)  # allocations without a usage series (IDLE_COLUMNS)


def query(base: str, promql: str, timeout: float) -> list[tuple[dict[str, str], float]]:
    """One instant query -> [(labels, value)]; raises FetchError with a one-line reason."""
    base = base.strip().rstrip("/")
    if "://" not in base:
        base = "http://" + base
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = get_body(url, base, timeout, f" for {promql}")
    try:
        data = json.loads(body)
        if not isinstance(data, dict) or data.get("status") not in ("success", "error"):
            raise ValueError(data)
        if data["status"] == "error":
            raise FetchError(f"{base}: query failed: {' '.join(str(data.get('error')).split())}")
        return [(dict(r["metric"]), float(r["value"][1])) for r in data["data"]["result"]]
    except FetchError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        raise FetchError(f"{base}: not a Prometheus query API answer (is this Prometheus?)") from None


def fetch_cluster(base: str, timeout: float) -> Results:
    """Every query of :data:`QUERIES` against ``base``."""
    return {name: query(base, promql, timeout) for name, promql in QUERIES.items()}


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _by(results: Results, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(m.get(lb, "") for lb in labels): v for m, v in results.get(name, [])}


def _ranked(used: dict[tuple[str, ...], float]) -> list[tuple[str, ...]]:
    return sorted(used, key=lambda k: (-used[k], k))[:TOP]


def build_cluster_view(results: Results) -> ClusterView:
    """Query results -> the header (cluster use vs allocation) and the four tables, top :data:`TOP` first."""
    wl_keys = ("namespace_name", "workload_kind", "workload_name")
    wl_used, wl_mem = _by(results, "workload_used", *wl_keys), _by(results, "workload_memory", *wl_keys)
    workloads = [(*k, _num(wl_used[k]), _num(wl_mem.get(k, math.nan) / GIB, 1)) for k in _ranked(wl_used)]
    ns_used, ns_mem = _by(results, "namespace_used", "namespace_name"), _by(results, "namespace_memory",
                                                                             "namespace_name")
    namespaces = [(*k, _num(ns_used[k]), _num(ns_mem.get(k, math.nan) / GIB, 1)) for k in _ranked(ns_used)]
    nodes = _node_rows(results)
    idle, unknown = (_allocations(results, name) for name in ("idle", "unknown"))
    total = sum(v for _, v in results.get("cluster_total", []))
    used = [v for _, v in results.get("cluster_used", [])]
    request = [v for _, v in results.get("cluster_request", [])]
    header = (f"cluster: {_num(total / 100)} healthy GPUs | used {_num(sum(used) / len(used) if used else None)}%"
              f" | allocated {_num(sum(request) / len(request) if request else None)}% | {len(idle)} idle allocations"
              + (f" | {len(unknown)} with use unknown (no utilisation from NVML)" if unknown else ""))
    message = "" if total or nodes else "no kube-gpu-exporter recorded series in this Prometheus (docs/rules.md)"
    return ClusterView(header=header, message=message, workloads=workloads, namespaces=namespaces, nodes=nodes,
                       idle=idle, unknown=unknown)


def _allocations(results: Results, name: str) -> list[Row]:
    """Rows of IDLE_COLUMNS: the allocations one query returned, sorted."""
    return sorted((m.get("node_name", ""), m.get("namespace_name", ""), m.get("pod_name", ""),
                   m.get("container_name", ""), _num(v)) for m, v in results.get(name, []))


def _node_rows(results: Results) -> list[Row]:
    capacity = _by(results, "node_capacity", "node_name")
    used, allocated = _by(results, "node_used", "node_name"), _by(results, "node_allocated", "node_name")
    memory, alloc_mem = _by(results, "node_memory", "node_name"), _by(results, "node_allocated_memory", "node_name")
    rows = []
    for k in sorted(set(capacity) | set(used), key=lambda k: (-used.get(k, 0.0), k)):
        u, a = used.get(k, math.nan), allocated.get(k, math.nan)
        ratio = 100 * u / a if a and not math.isnan(a) else math.nan
        rows.append((*k, _num(capacity.get(k, math.nan) / 100), _num(u), _num(a), _num(ratio),
                     _num(memory.get(k, math.nan) / GIB, 1), _num(alloc_mem.get(k, math.nan) / GIB, 1)))
    return rows
