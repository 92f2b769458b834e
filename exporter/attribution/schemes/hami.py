"""HAMi: annotation ``hami.io/vgpu-devices-allocated`` or ``nvidia.com/gpumem``/``gpucores``.

The annotation holds ``UUID,NVIDIA,<memMiB>,<cores>:`` entries per container, containers
separated by ``;``.
"""

from __future__ import annotations

from functools import lru_cache

from exporter.attribution.schemes.base import MIB, Allocation, NodeContext, Scheme, amount
from exporter.attribution.schemes.nvidia import NVIDIA_GPU
from exporter.model import ContainerInfo, PodInfo

SCHEME_HAMI = "hami"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_ANNOTATION = "hami.io/vgpu-devices-allocated"

Entry = tuple[str, int, int]  # (GPU uuid, memory MiB, cores percent)


@lru_cache(maxsize=1024)  # one parse per pod annotation, not per container
def hami_entries(annotation: str) -> tuple[tuple[Entry, ...], ...]:
    """``UUID,NVIDIA,<memMiB>,<cores>:`` entries per container, containers split by ``;``."""
    per_container: list[tuple[Entry, ...]] = []
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
        per_container.append(tuple(entries))
    return tuple(per_container)


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    return HAMI_ANNOTATION in pod.annotations or bool(
        amount(c, HAMI_MEM) or amount(c, HAMI_CORES) or amount(c, HAMI_MEM_PERCENT))


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    raw = pod.annotations.get(HAMI_ANNOTATION)
    entries = hami_entries(raw) if raw else ()
    totals = {d.uuid: d.memory_total_bytes for d in node.devices}
    mine = entries[c.index] if c.index < len(entries) else ()
    if not mine and entries:
        return []  # the scheduler allocated this pod and gave this container nothing
    if not mine:
        return _unscheduled(pod, c)
    out = []
    for uuid, mem_mib, cores in mine:
        if uuid not in totals:
            node.skip("annotation_unknown_gpu_uuid")
        total = totals.get(uuid)
        memory = mem_mib * MIB if mem_mib > 0 else None
        whole = cores >= 100 and (memory is None or (total is not None and memory >= total))
        # HAMi's cores=0 means "no core limit": it grants no compute share.
        out.append(Allocation(pod.uid, c.name, SCHEME_HAMI, whole, uuid if uuid in totals else None,
                              float(cores) if cores > 0 else None, memory))
    return out


def _unscheduled(pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    """No annotation yet: the requested count, GPUs placed later by the container's processes."""
    count = int(amount(c, NVIDIA_GPU) or 0)
    if not count:
        return []
    cores = amount(c, HAMI_CORES)
    mem = amount(c, HAMI_MEM)
    return [Allocation(pod.uid, c.name, SCHEME_HAMI, False, None, cores or None,
                       int(mem * MIB) if mem else None) for _ in range(count)]


SCHEME = Scheme("HAMi", claims, allocate)
