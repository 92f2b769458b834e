"""HAMi: annotation ``hami.io/vgpu-devices-allocated`` or ``nvidia.com/gpumem``/``gpucores``.

The annotation holds ``UUID,NVIDIA,<memMiB>,<cores>:`` entries per container, containers
separated by ``;`` (``hami.io/vgpu-devices-to-allocate``, the scheduler's copy, stands in while
the first is absent). HAMi >= 2.9 numbers the segments over ``spec.initContainers`` first, then
``spec.containers``; older HAMi over ``spec.containers`` only. The layout is read from the pod
itself (see :func:`segment_offset`), never from a version flag.

Dynamic MIG: the devices annotation names the parent GPU, while the MIG instance the container
runs on is in ``hami.io/vgpu-mig-allocations`` (JSON list of ``containerIndex``, ``deviceIndex``,
``gpuUUID``, ``profile``, ``migUUID``, ``gpuInstanceID``, ``computeInstanceID``; the device
plugin fills ``migUUID`` in once the instance exists). ``containerIndex`` counts as the devices
annotation's segments do, ``deviceIndex`` is the entry's place in its segment. NVML lists the
MIG device, so the allocation is placed on it, whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache

from exporter.attribution.schemes.base import (
    MIB,
    Allocation,
    NodeContext,
    Scheme,
    amount,
    card_memory_limit,
    within,
)
from exporter.attribution.schemes.nvidia import NVIDIA_GPU
from exporter.model import ContainerInfo, PodInfo

SCHEME_HAMI = "hami"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_ANNOTATION = "hami.io/vgpu-devices-allocated"
HAMI_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
HAMI_MIG_ANNOTATION = "hami.io/vgpu-mig-allocations"
HAMI_NODE = "hami.io/vgpu-node"  # the node the scheduler bound the pod to
HAMI_BIND_PHASE = "hami.io/bind-phase"  # allocating / success / failed
HAMI_VGPU = "nvidia.com/vgpu"  # the vGPU count under another common resource name
GPU_RESOURCES = (NVIDIA_GPU, HAMI_VGPU, HAMI_MEM, HAMI_MEM_PERCENT, HAMI_CORES)
MAX_ANNOTATION_BYTES = 64 * 1024  # a pod's author writes annotations: bound what is parsed
MAX_MIG_ENTRIES = 64

Entry = tuple[str, int, int]  # (GPU uuid, memory MiB, cores percent)


@lru_cache(maxsize=1024)  # one parse per pod annotation, not per container
def hami_entries(annotation: str) -> tuple[tuple[Entry, ...], ...]:
    """``UUID,NVIDIA,<memMiB>,<cores>:`` entries per segment, segments split by ``;``.

    The text after the last ``;`` is no segment (HAMi ends every segment with ``;``); without any
    ``;`` the whole text is one segment.
    """
    segments = annotation.split(";")
    if len(segments) > 1 and not segments[-1].strip():
        segments = segments[:-1]
    per_segment: list[tuple[Entry, ...]] = []
    for segment in segments:
        entries = []
        for entry in segment.split(":"):
            parts = entry.split(",")
            if len(parts) < 4 or not parts[0].strip():
                continue
            if len(parts[2]) > 12 or len(parts[3]) > 12:
                entries.append((parts[0].strip()[:128], -1, -1))  # absurd: out of range, refused by allocate
                continue
            try:
                entries.append((parts[0].strip()[:128], int(parts[2]), int(parts[3])))
            except ValueError:
                continue
        per_segment.append(tuple(entries))
    return tuple(per_segment)


def _requests_gpu(c: ContainerInfo) -> bool:
    return any(amount(c, r) for r in GPU_RESOURCES)


def segment_offset(pod: PodInfo, segments: Sequence[Sequence[Entry]]) -> int | None:
    """Where ``spec.containers[0]``'s segment is: 0 (containers only) or len(initContainers); None if unknown.

    The segment count tells the layouts apart (init + containers, or containers alone); when it
    fits neither, the layout whose non-empty segments all belong to containers that request GPU
    resources wins, and when both or neither do, the annotation cannot be read safely.
    """
    n_init, n_main = len(pod.init_containers), len(pod.containers)
    if not n_init:
        return 0
    if len(segments) == n_init + n_main:
        return n_init
    if len(segments) == n_main:
        return 0

    def fits(owners: Sequence[ContainerInfo]) -> bool:
        """Every non-empty segment belongs to a container of ``owners`` that requests GPU resources."""
        return all(not seg or (i < len(owners) and _requests_gpu(owners[i])) for i, seg in enumerate(segments))

    new, old = fits((*pod.init_containers, *pod.containers)), fits(pod.containers)
    if new != old:
        return n_init if new else 0
    return None


def segment_owners(pod: PodInfo, segments: Sequence[Sequence[Entry]]) -> dict[tuple[bool, int], int] | None:
    """Which segment each container owns, keyed by (init, index); None when the layout is unknown.

    Positions first (the layout from :func:`segment_offset`). HAMi's device plugin, though, hands
    each container it allocates for the next non-empty segment, whatever its position: when a
    non-empty segment sits on a container that requests no GPU, and the non-empty segments match
    the GPU-requesting containers one to one, that order is what the containers really got.
    """
    offset = segment_offset(pod, segments)
    if offset is None:
        return None
    ordered = (*pod.init_containers, *pod.containers) if offset else pod.containers
    used = [i for i, seg in enumerate(segments) if seg]
    positional = {(c.init, c.index): i for i, c in enumerate(ordered) if i < len(segments)}
    if all(i < len(ordered) and _requests_gpu(ordered[i]) for i in used):
        return positional
    requesting = [c for c in (*pod.init_containers, *pod.containers) if _requests_gpu(c)]
    if len(requesting) != len(used):
        return positional
    return {(c.init, c.index): i for c, i in zip(requesting, used, strict=True)}


def _bound_elsewhere(pod: PodInfo) -> bool:
    """HAMi's own binding marks say the annotation is not this node's, or the binding failed."""
    node = pod.annotations.get(HAMI_NODE, "")
    return (bool(node) and bool(pod.node_name) and node != pod.node_name) or (
        pod.annotations.get(HAMI_BIND_PHASE, "").strip().lower() == "failed")


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    # The annotation counts only for containers that request HAMi's resources, and only where HAMi's
    # binding marks (when present) say it was bound here: a tenant cannot claim a GPU by annotating alone.
    if _bound_elsewhere(pod):
        return False
    if amount(c, HAMI_MEM) or amount(c, HAMI_CORES) or amount(c, HAMI_MEM_PERCENT):
        return True
    return _requests_gpu(c) and (HAMI_ANNOTATION in pod.annotations or HAMI_TO_ALLOCATE in pod.annotations)


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    raw = pod.annotations.get(HAMI_ANNOTATION) or pod.annotations.get(HAMI_TO_ALLOCATE)
    if raw and len(raw) > MAX_ANNOTATION_BYTES:
        node.skip("hami_annotation_too_large")
        raw = None
    segments = hami_entries(raw) if raw else ()
    if not segments:
        return _unscheduled(node, pod, c)
    owners = segment_owners(pod, segments)
    if owners is None:
        node.skip("hami_annotation_layout_unknown")
        return _unscheduled(node, pod, c)
    position = owners.get((c.init, c.index))
    mine = segments[position] if position is not None else ()
    if not mine or position is None:
        return []  # the scheduler allocated this pod and gave this container nothing
    migs = _mig_instances(node, pod, position)
    totals = {d.uuid: d.memory_total_bytes for d in node.devices}
    limit_mib = card_memory_limit(node) // MIB
    # A dynamic-MIG entry names the parent card (not listed by NVML): its figures are not used.
    plain = [e for i, e in enumerate(mine) if i not in migs]
    if not within(node, len(mine), len(node.devices)) or not all(
            0 <= mem <= limit_mib and 0 <= cores <= 100 for _, mem, cores in plain):
        node.skip("hami_annotation_out_of_range")
        return []  # more devices, memory or cores than the node has: hostile or broken
    out = []
    for device_index, (uuid, mem_mib, cores) in enumerate(mine):
        mig = migs.get(device_index)
        if mig is not None:
            out.append(_on_mig(node, pod, c, mig))
            continue
        if uuid not in totals:
            node.skip("annotation_unknown_gpu_uuid")
        total = totals.get(uuid)
        memory = mem_mib * MIB if mem_mib > 0 else None
        whole = cores >= 100 and (memory is None or (total is not None and memory >= total))
        # HAMi's cores=0 means "no core limit": it grants no compute share.
        out.append(Allocation(pod.uid, c.name, SCHEME_HAMI, whole, uuid if uuid in totals else None,
                              float(cores) if cores > 0 else None, memory, from_annotation=True))
    return out


def _on_mig(node: NodeContext, pod: PodInfo, c: ContainerInfo, mig: Mapping[str, object]) -> Allocation:
    """The MIG instance HAMi created for this device: whole (its memory is the instance's)."""
    mig_uuid = mig.get("migUUID")
    if isinstance(mig_uuid, str) and mig_uuid in node.uuids:
        return Allocation(pod.uid, c.name, SCHEME_HAMI, True, mig_uuid, 100.0, None, from_annotation=True)
    # Not created yet, or NVML does not list it: placed later by the container's processes.
    node.skip("hami_mig_instance_unknown")
    return Allocation(pod.uid, c.name, SCHEME_HAMI, True, None, 100.0, None)


def _mig_instances(node: NodeContext, pod: PodInfo, position: int) -> dict[int, Mapping[str, object]]:
    """This segment's MIG reservations by device index (its place within the segment)."""
    raw = pod.annotations.get(HAMI_MIG_ANNOTATION)
    if not raw:
        return {}
    entries = _parse_mig(raw)
    if entries is None:
        node.skip("malformed_hami_mig_annotation")
        return {}
    # HAMi decodes with Go's encoding/json: an absent index is 0.
    mine = [e for e in entries if e.get("containerIndex", 0) == position]
    out: dict[int, Mapping[str, object]] = {}
    for e in mine:
        index = e.get("deviceIndex", 0)
        out[index if isinstance(index, int) else 0] = e
    return out


@lru_cache(maxsize=256)
def _parse_mig(raw: str) -> tuple[Mapping[str, object], ...] | None:
    """The MIG reservations, or None when the annotation is not a bounded JSON list of objects."""
    if len(raw) > MAX_ANNOTATION_BYTES:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) > MAX_MIG_ENTRIES or not all(isinstance(e, dict) for e in value):
        return None
    for e in value:
        for key in ("containerIndex", "deviceIndex"):
            index = e.get(key, 0)
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                return None
    return tuple(value)


def _unscheduled(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    """No annotation yet: the requested count, GPUs placed later by the container's processes."""
    count = int(amount(c, NVIDIA_GPU) or amount(c, HAMI_VGPU) or 0)
    if not count:
        return []
    cores = amount(c, HAMI_CORES)
    mem = amount(c, HAMI_MEM)
    if not within(node, count, len(node.devices)) or not within(node, cores or 0, 100) or not within(
            node, (mem or 0) * MIB, card_memory_limit(node)):
        return []
    return [Allocation(pod.uid, c.name, SCHEME_HAMI, False, None, cores or None,
                       int(mem * MIB) if mem else None) for _ in range(count)]


SCHEME = Scheme("HAMi", claims, allocate, annotations=(HAMI_ANNOTATION, HAMI_TO_ALLOCATE, HAMI_MIG_ANNOTATION))
