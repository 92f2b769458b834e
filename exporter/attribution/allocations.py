"""GPU sharing schemes: what each container was allocated, and on which GPU.

Pure functions over pod objects, node labels, the device list and (when available) the
kubelet pod-resources answer. The result feeds :mod:`exporter.attribution.attribute`, which decides
``allocate_mode``. Schemes recognised (see docs/metrics.md and the reference table):

- NVIDIA device plugin, whole GPUs: ``nvidia.com/gpu`` / ``nvidia.com/mig-*``.
- NVIDIA time-slicing and MPS: ``nvidia.com/gpu`` on a node whose
  ``nvidia.com/gpu.sharing-strategy`` label is ``time-slicing``/``mps``, the renamed
  ``nvidia.com/gpu.shared``, or pod-resources device ids ``GPU-<uuid>::<replica>``.
- Alibaba gpushare / cGPU: ``aliyun.com/gpu-mem`` (GiB) and ``aliyun.com/gpu-core.percentage``.
- Tencent GPU Manager: ``tencent.com/vcuda-core`` (100 = one GPU), ``tencent.com/vcuda-memory``
  (units of 256 MiB).
- HAMi: annotation ``hami.io/vgpu-devices-allocated`` or ``nvidia.com/gpumem``/``gpucores``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporter.model import ContainerInfo, DeviceSample, PodInfo, PodResources

GIB = 1 << 30
MIB = 1 << 20
VCUDA_MEMORY_UNIT = 256 * MIB

SCHEME_NVIDIA = "nvidia"
SCHEME_TIME_SLICING = "nvidia-time-slicing"
SCHEME_MPS = "nvidia-mps"
SCHEME_GPUSHARE = "aliyun-gpushare"
SCHEME_VCUDA = "tencent-vcuda"
SCHEME_HAMI = "hami"

NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_GPU_SHARED = "nvidia.com/gpu.shared"
NVIDIA_MIG = "nvidia.com/mig-"  # prefix: nvidia.com/mig-1g.10gb, ...
ALIYUN_MEM = "aliyun.com/gpu-mem"
ALIYUN_CORE = "aliyun.com/gpu-core.percentage"
VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEM = "tencent.com/vcuda-memory"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_ANNOTATION = "hami.io/vgpu-devices-allocated"
ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ALIYUN_ALLOCATION = "scheduler.framework.gpushare.allocation"
VCUDA_IDX_PREFIX = "tencent.com/predicate-gpu-idx-"
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "m": 1e-3,
}


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one container was allocated on one GPU (``uuid=None``: GPU not known yet).

    ``whole`` means the container got the card to itself. ``compute_percent`` is percent
    of one GPU; ``memory_bytes`` None means the scheme grants no memory (a whole GPU's
    memory is filled in as the card's total once the GPU is known).
    """

    pod_uid: str
    container: str
    scheme: str
    whole: bool
    uuid: str | None
    compute_percent: float | None
    memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class AllocationResult:
    allocations: tuple[Allocation, ...]
    skips: Mapping[str, int]


def parse_quantity(value: object) -> float | None:
    """Parse a Kubernetes quantity (``"2"``, ``"500m"``, ``"4Gi"``); None when malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value)
    if not m or m.group(2) not in _SUFFIX:
        return None
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _amount(c: ContainerInfo, resource: str) -> float | None:
    raw = c.limits.get(resource, c.requests.get(resource))
    return None if raw is None else parse_quantity(raw)


def _hami_entries(annotation: str) -> list[list[tuple[str, int, int]]]:
    """``UUID,NVIDIA,<memMiB>,<cores>:`` entries per container, containers split by ``;``."""
    per_container: list[list[tuple[str, int, int]]] = []
    for segment in annotation.split(";"):
        entries = []
        for entry in segment.split(":"):
            parts = entry.split(",")
            if len(parts) < 4 or not parts[0].strip():
                continue
            try:
                entries.append((parts[0].strip(), int(parts[2]), int(parts[3])))
            except ValueError:
                continue
        per_container.append(entries)
    return per_container


def _index_list(value: str) -> list[int] | None:
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        return None


def index_pod_resources(pod_resources: Iterable[PodResources]) -> dict:
    """Index the kubelet answer by (namespace, pod, container)."""
    out: dict[tuple[str, str, str], tuple[tuple[str, tuple[str, ...]], ...]] = {}
    for p in pod_resources:
        for c in p.containers:
            out[(p.namespace, p.name, c.name)] = c.devices
    return out


def node_sharing_strategy(node_labels: Mapping[str, str]) -> str:
    """``none`` / ``time-slicing`` / ``mps`` from the GPU feature discovery label."""
    value = node_labels.get(SHARING_STRATEGY_LABEL, "none").strip().lower()
    return value if value in ("time-slicing", "mps") else "none"


def compute_allocations(
    pods: Iterable[PodInfo],
    devices: Sequence[DeviceSample],
    node_labels: Mapping[str, str],
    pod_resources: Iterable[PodResources] | None = None,
) -> AllocationResult:
    """Every container's GPU allocations on this node, placed on a GPU where known."""
    by_index = {d.index: d.uuid for d in devices}
    uuids = {d.uuid for d in devices}
    pr = index_pod_resources(pod_resources or ())
    strategy = node_sharing_strategy(node_labels)
    replicas = parse_quantity(node_labels.get(REPLICAS_LABEL, "")) or 0
    out: list[Allocation] = []
    skips: dict[str, int] = {}

    def skip(reason: str) -> None:
        skips[reason] = skips.get(reason, 0) + 1

    for pod in pods:
        if pod.phase in ("Succeeded", "Failed"):
            continue  # a finished pod releases its devices
        hami = pod.annotations.get(HAMI_ANNOTATION)
        hami_entries = _hami_entries(hami) if hami else []
        for c in pod.containers:
            res_ids = dict(pr.get((pod.namespace, pod.name, c.name), ()))
            if hami is not None or _amount(c, HAMI_MEM) or _amount(c, HAMI_CORES) or _amount(
                    c, HAMI_MEM_PERCENT):
                out.extend(_hami(pod, c, hami_entries, devices, skip))
            elif _amount(c, ALIYUN_MEM):
                out.extend(_gpushare(pod, c, by_index, skip))
            elif _amount(c, VCUDA_CORE) is not None or _amount(c, VCUDA_MEM):
                out.extend(_vcuda(pod, c, by_index, skip))
            elif _amount(c, NVIDIA_GPU) or _amount(c, NVIDIA_GPU_SHARED) or any(
                    r.startswith(NVIDIA_MIG) for r in (*c.limits, *c.requests)):
                out.extend(_nvidia(pod, c, res_ids, uuids, strategy, replicas, skip))
    return AllocationResult(tuple(out), skips)


def _nvidia(pod: PodInfo, c: ContainerInfo, res_ids: Mapping[str, tuple[str, ...]],
            uuids: set[str], strategy: str, replicas: float, skip) -> list[Allocation]:
    shared_resource = bool(_amount(c, NVIDIA_GPU_SHARED))
    count = int(_amount(c, NVIDIA_GPU) or _amount(c, NVIDIA_GPU_SHARED) or 0)
    mig = {r for r in (*c.limits, *c.requests) if r.startswith(NVIDIA_MIG)}  # a set: limits repeat requests
    # MIG resources list MIG device UUIDs, which the backend reports as devices of their own.
    ids = [i for r, v in res_ids.items() if r in (NVIDIA_GPU, NVIDIA_GPU_SHARED) or r.startswith(NVIDIA_MIG)
           for i in v]
    replicated = any("::" in i for i in ids)
    if strategy == "mps":
        scheme = SCHEME_MPS
    elif strategy == "time-slicing" or shared_resource or replicated:
        scheme = SCHEME_TIME_SLICING
    else:
        scheme = SCHEME_NVIDIA
    whole = scheme == SCHEME_NVIDIA
    compute = 100.0 if whole else (100.0 / replicas if scheme == SCHEME_MPS and replicas >= 1 else None)
    placed: list[str] = []
    for i in ids:
        u = i.split("::", 1)[0]
        if u in uuids and u not in placed:
            placed.append(u)
        elif u not in uuids:
            skip("pod_resources_unknown_device")
    if mig:
        # Without pod-resources: count them, place them where the container's processes run.
        count = max(count, int(sum(_amount(c, r) or 0 for r in mig)))
    allocs = [Allocation(pod.uid, c.name, scheme, whole, u, compute, None) for u in placed]
    allocs += [Allocation(pod.uid, c.name, scheme, whole, None, compute, None)
               for _ in range(max(0, count - len(placed)))]
    return allocs


def _gpushare(pod: PodInfo, c: ContainerInfo, by_index: Mapping[int, str], skip) -> list[Allocation]:
    gib = _amount(c, ALIYUN_MEM) or 0.0
    core = _amount(c, ALIYUN_CORE)
    placed: dict[int, float] = {}
    raw = pod.annotations.get(ALIYUN_ALLOCATION)
    if raw:
        try:
            per_container = json.loads(raw).get(str(c.index), {})
            placed = {int(k): float(v) for k, v in per_container.items()}
        except (ValueError, TypeError, AttributeError):
            skip("malformed_gpushare_annotation")
    if not placed and ALIYUN_IDX in pod.annotations:
        idx = _index_list(pod.annotations[ALIYUN_IDX])
        if idx is None:
            skip("malformed_gpushare_annotation")
        elif idx:
            placed = {i: gib / len(idx) for i in idx}
    if not placed:
        return [Allocation(pod.uid, c.name, SCHEME_GPUSHARE, False, None, core, int(gib * GIB))]
    out = []
    for i, g in placed.items():
        if i not in by_index:
            skip("annotation_unknown_gpu_index")
        out.append(Allocation(pod.uid, c.name, SCHEME_GPUSHARE, False, by_index.get(i),
                              None if core is None else core / len(placed), int(g * GIB)))
    return out


def _vcuda(pod: PodInfo, c: ContainerInfo, by_index: Mapping[int, str], skip) -> list[Allocation]:
    core = _amount(c, VCUDA_CORE) or 0.0
    mem_units = _amount(c, VCUDA_MEM)
    memory = int(mem_units * VCUDA_MEMORY_UNIT) if mem_units else None
    idx = _index_list(pod.annotations.get(f"{VCUDA_IDX_PREFIX}{c.index}", ""))
    if idx is None:
        skip("malformed_vcuda_annotation")
        idx = []
    whole = core >= 100
    count = max(1, int(core // 100)) if whole else 1
    if whole:
        targets: list[int | None] = [*idx[:count]] + [None] * max(0, count - len(idx))
        return [Allocation(pod.uid, c.name, SCHEME_VCUDA, True,
                           None if i is None else by_index.get(i), 100.0, None) for i in targets]
    gpu = by_index.get(idx[0]) if idx else None
    if idx and gpu is None:
        skip("annotation_unknown_gpu_index")
    return [Allocation(pod.uid, c.name, SCHEME_VCUDA, False, gpu, core or None, memory)]


def _hami(pod: PodInfo, c: ContainerInfo, entries: list[list[tuple[str, int, int]]],
          devices: Sequence[DeviceSample], skip) -> list[Allocation]:
    totals = {d.uuid: d.memory_total_bytes for d in devices}
    mine = entries[c.index] if c.index < len(entries) else []
    if not mine and entries:
        return []  # the scheduler allocated this pod and gave this container nothing
    if not mine:
        count = int(_amount(c, NVIDIA_GPU) or 0)
        if not count:
            return []
        cores = _amount(c, HAMI_CORES)
        mem = _amount(c, HAMI_MEM)
        return [Allocation(pod.uid, c.name, SCHEME_HAMI, False, None, cores or None,
                           int(mem * MIB) if mem else None) for _ in range(count)]
    out = []
    for uuid, mem_mib, cores in mine:
        if uuid not in totals:
            skip("annotation_unknown_gpu_uuid")
        total = totals.get(uuid)
        memory = mem_mib * MIB if mem_mib > 0 else None
        whole = cores >= 100 and (memory is None or (total is not None and memory >= total))
        # HAMi's cores=0 means "no core limit": it grants no compute share.
        out.append(Allocation(pod.uid, c.name, SCHEME_HAMI, whole, uuid if uuid in totals else None,
                              float(cores) if cores > 0 else None, memory))
    return out
