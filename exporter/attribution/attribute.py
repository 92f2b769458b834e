"""Attribution rules: which container uses which GPU, and each GPU's ``allocate_mode``.

This module is the one place that decides. Inputs are one :class:`NodeSample`, the
pid -> cgroup placement from /proc, the node's pods and the allocations of
:mod:`exporter.attribution.allocations`. The rules:

1. A process belongs to the container whose ID its cgroup names; a pod-level cgroup or an
   unknown container ID gives the pod but no container; no pod cgroup = host process.
2. Per-process SM utilization over one interval is the **mean** of the process's samples newer
   than the device's lastSeenTimeStamp (NVML may return several per interval; the mean keeps
   the unit "percent of the interval"). A listed process with no sample was idle (0).
3. A container's usage on a GPU is the sum over its processes: SM utilization capped at 100,
   memory in bytes (unknown if any of its processes reports NVML_VALUE_NOT_AVAILABLE). The
   exclusive holder's is the device's own (:func:`device_utilization`: on a MIG device its GPU
   instance's GPM, NVML having no utilization for MIG devices, per process neither).
4. Holders of a GPU: containers allocated it by a known placement, plus containers with an
   allocation whose GPU is not known yet (e.g. no pod-resources socket) that run a process on
   it (placement inferred, at most as many GPUs as allocated).
5. ``exclusive``: exactly one holder, allocated the GPU whole, and no process of another pod
   container on it. ``share``: otherwise, whenever the GPU has a holder, or processes of two or
   more pod containers. Share rows go to every holder and every other pod container running on
   it. ``None``: no holder and at most one pod container running on it.
6. Processes on a GPU that do not belong to one of its holders (host processes, containers
   started with ``NVIDIA_VISIBLE_DEVICES=all``) are "unaccounted": they count in the device
   totals and are reported separately, with pod labels when they run in a pod.
7. A whole GPU is not an annotation's to share: when pod-resources assigns a GPU whole to a
   container (the kubelet, the authority), or, without the kubelet's answer, a container allocated
   a whole GPU by a device plugin (not an annotation) runs its processes on it (rule 4), no other
   container's annotation (gpushare, vcuda, HAMi) can hold it or turn it shared; such an
   allocation is left unplaced and counted in ``disagreements``. Without the kubelet, an annotated
   container that runs on that GPU itself keeps its annotation (NVML shows it shares the GPU), and
   a whole GPU whose holder runs nothing yet is unplaced, so nothing protects it
   (docs/sharing.md, "Trust model per setting").
8. Annotations can lie (scheduler bugs). When a container whose GPU comes from an annotation runs
   processes on a GPU the annotation does not name, and leaves a claimed GPU without any, the
   processes are believed for usage: the container holds the GPU it runs on instead of the
   claimed one (its usage rows, with its grant, are there, once), while its allocation row stays
   on the claimed GPU with the mode its scheme gives. Such containers are counted per scheme in
   ``disagreements``. The kubelet's own answer (pod-resources) is never second-guessed:
   processes outside it stay unaccounted (rule 6).
9. An MPS daemon of the host or of an infrastructure namespace is neither user nor unaccounted
   (:mod:`exporter.attribution.infrastructure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exporter.attribution import infrastructure
from exporter.attribution.schemes.base import Allocation
from exporter.attribution.utilization import device_utilization
from exporter.model import CgroupRef, ContainerInfo, DeviceSample, NodeSample, PodInfo, UtilSample

EXCLUSIVE = "exclusive"
SHARE = "share"
NONE = "None"


class PodLookup(Protocol):
    """What attribution needs of the pod cache (``exporter.node.pod_store.PodView`` satisfies it)."""

    @property
    def pods(self) -> Mapping[str, PodInfo]: ...

    @property
    def by_container_id(self) -> Mapping[str, tuple[PodInfo, ContainerInfo]]: ...


@dataclass(frozen=True, slots=True)
class ProcessAttribution:
    """One GPU process and where it runs."""

    pid: int
    uuid: str
    used_memory_bytes: int | None
    sm_util: float | None  # None when utilization could not be read for the device
    pod: PodInfo | None
    container: str | None
    host: bool = False  # its cgroup names no pod (not: a pod the cache does not know yet)


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container's usage of one GPU (a share row, or the exclusive holder)."""

    pod: PodInfo
    container: str
    sm_util: float | None
    memory_used_bytes: int | None
    allocation: Allocation | None  # None: running on the GPU without an allocation


@dataclass(frozen=True, slots=True)
class DeviceAttribution:
    device: DeviceSample
    mode: str
    users: tuple[ContainerUsage, ...]  # one for exclusive, the share rows for share, () for None
    unaccounted: tuple[ProcessAttribution, ...]
    processes: tuple[ProcessAttribution, ...]
    infrastructure: tuple[ProcessAttribution, ...] = ()  # rule 9: in `processes`, in no other list


@dataclass(frozen=True, slots=True)
class PlacedAllocation:
    """An allocation with its GPU resolved ("" if still unknown) and whole-GPU memory filled in."""

    pod: PodInfo
    container: str
    uuid: str
    minor_number: int | None
    allocate_mode: str
    scheme: str
    compute_percent: float | None
    memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class NodeAttribution:
    devices: tuple[DeviceAttribution, ...]
    allocations: tuple[PlacedAllocation, ...]
    pods: tuple[PodInfo, ...]  # pods holding or using a GPU on this node
    skips: Mapping[str, int]
    disagreements: Mapping[str, int] = field(default_factory=dict)  # scheme -> containers (rules 7, 8)


def combine_util_samples(samples: Sequence[UtilSample]) -> dict[int, float]:
    """Mean SM utilization per pid over the samples of one interval (rule 2)."""
    sums: dict[int, list[float]] = {}
    for s in samples:
        acc = sums.setdefault(s.pid, [0.0, 0.0])
        acc[0] += s.sm_util
        acc[1] += 1
    return {pid: total / n for pid, (total, n) in sums.items()}


def _locate(ref: CgroupRef | None, pods: PodLookup, skip: Callable[[str], None]) -> tuple[PodInfo | None, str | None]:
    if ref is None:
        return None, None
    if ref.container_id is not None:
        hit = pods.by_container_id.get(ref.container_id)
        if hit is not None:
            return hit[0], hit[1].name
    pod = pods.pods.get(ref.pod_uid)
    if pod is None:
        skip("process_pod_not_in_cache")
    elif ref.container_id is not None:
        skip("process_container_not_in_cache")
    return pod, None


class SkipCounter(dict[str, int]):
    """Counted skips by reason: what attribution could not use, and why."""

    def __call__(self, reason: str) -> None:
        self[reason] = self.get(reason, 0) + 1


ContainerKey = tuple[str, str]  # (pod uid, container name)


def attribute(
    sample: NodeSample,
    pids: Mapping[int, CgroupRef | None],
    pods: PodLookup,
    allocations: Sequence[Allocation],
    comms: Mapping[int, str] | None = None,
    infra_namespaces: frozenset[str] = frozenset(infrastructure.DEFAULT_NAMESPACES),
) -> NodeAttribution:
    """Apply the rules in the module docstring to one sampling cycle (``comms``: /proc/<pid>/comm)."""
    skip = SkipCounter()
    devices = {d.uuid: d for d in sample.devices}
    procs = {d.uuid: _device_processes(d, pids, pods, skip) for d in sample.devices}
    placed, conflicts = _defer_to_kubelet(_place(allocations, devices, procs), _running(procs))
    holders: dict[str, dict[ContainerKey, Allocation]] = {u: {} for u in devices}
    for a, uuid in placed:
        if uuid is not None:
            holders[uuid].setdefault((a.pod_uid, a.container), a)
    disagreements, moved = _believe_processes(placed, procs, holders)
    for scheme, n in conflicts.items():
        disagreements[scheme] = disagreements.get(scheme, 0) + n

    pods_used: dict[str, PodInfo] = {}
    results = [_device(d, procs[d.uuid], holders[d.uuid], pods, pods_used, skip, comms or {}, infra_namespaces)
               for d in sample.devices]
    modes = {r.device.uuid: r.mode for r in results}
    placed_out = _placed_allocations(placed, devices, modes, pods, pods_used, moved)
    return NodeAttribution(tuple(results), placed_out,
                           tuple(sorted(pods_used.values(), key=lambda p: (p.namespace, p.name))),
                           skip, disagreements)


def _defer_to_kubelet(placed: list[tuple[Allocation, str | None]], running: Mapping[ContainerKey, list[str]]
                      ) -> tuple[list[tuple[Allocation, str | None]], dict[str, int]]:
    """Rule 7: annotation placements on a GPU another container holds whole are dropped.

    A whole holder is a non-annotation whole allocation placed by the kubelet or, without its
    answer, by where the container's processes run; the kubelet's placement wins a tie. Against
    a holder inferred from processes, an annotated container that runs on the GPU itself is kept:
    NVML says it really shares it (and a pod running where it was not allocated, e.g.
    NVIDIA_VISIBLE_DEVICES=all, must not push the GPU's HAMi tenants off it).
    """
    whole: dict[str, tuple[ContainerKey, bool]] = {}  # uuid -> (holder, placed by the kubelet)
    for a, uuid in placed:
        if uuid is not None and a.whole and not a.from_annotation and (a.uuid == uuid or uuid not in whole):
            whole[uuid] = ((a.pod_uid, a.container), a.uuid == uuid)
    out: list[tuple[Allocation, str | None]] = []
    conflicts: dict[str, int] = {}
    for a, uuid in placed:
        owner, by_kubelet = whole.get(uuid, (None, False)) if uuid is not None else (None, False)
        key = (a.pod_uid, a.container)
        if (a.from_annotation and owner is not None and owner != key
                and (by_kubelet or uuid not in running.get(key, ()))):
            conflicts[a.scheme] = conflicts.get(a.scheme, 0) + 1
            out.append((a, None))
        else:
            out.append((a, uuid))
    return out, conflicts


def _believe_processes(placed: list[tuple[Allocation, str | None]], procs: Mapping[str, list[ProcessAttribution]],
                       holders: dict[str, dict[ContainerKey, Allocation]]) -> tuple[dict[str, int], set[int]]:
    """Rule 8: a container running where its annotation does not say holds that GPU instead.

    Returns the disagreements by scheme and the ids of the allocations whose holding moved.
    """
    running = _running(procs)
    claimed: dict[ContainerKey, list[Allocation]] = {}
    for a, uuid in placed:
        if uuid is not None and a.from_annotation:
            claimed.setdefault((a.pod_uid, a.container), []).append(a)
    out: dict[str, int] = {}
    moved: set[int] = set()
    for key, allocs in claimed.items():
        gpus = running.get(key, [])
        unused = [a for a in allocs if a.uuid not in gpus]
        elsewhere = [u for u in gpus if key not in holders[u]]
        if not unused or not elsewhere:
            continue
        for a, uuid in zip(unused, elsewhere, strict=False):
            if a.uuid is not None and holders[a.uuid].get(key) is a:
                del holders[a.uuid][key]
            holders[uuid][key] = a
            moved.add(id(a))
        out[allocs[0].scheme] = out.get(allocs[0].scheme, 0) + 1
    return out, moved


def _device_processes(d: DeviceSample, pids: Mapping[int, CgroupRef | None], pods: PodLookup,
                      skip: SkipCounter) -> list[ProcessAttribution]:
    """One device's processes with their container (rules 1 and 2)."""
    util = combine_util_samples(d.util_samples) if d.util_samples_ok else None
    rows = []
    for p in d.processes:
        if p.pid not in pids:
            skip("process_exited")  # gone before /proc could be read
            continue
        pod, container = _locate(pids[p.pid], pods, skip)
        sm = None if util is None else min(100.0, util.get(p.pid, 0.0))
        rows.append(ProcessAttribution(p.pid, d.uuid, p.used_memory_bytes, sm, pod, container, pids[p.pid] is None))
    return rows


def _running(procs: Mapping[str, list[ProcessAttribution]]) -> dict[ContainerKey, list[str]]:
    """The GPUs each pod container has processes on, in device order."""
    running: dict[ContainerKey, list[str]] = {}
    for uuid, rows in procs.items():
        for r in rows:
            if r.pod is not None and r.container is not None:
                gpus = running.setdefault((r.pod.uid, r.container), [])
                if uuid not in gpus:
                    gpus.append(uuid)
    return running


def _place(allocations: Sequence[Allocation], devices: Mapping[str, DeviceSample],
           procs: Mapping[str, list[ProcessAttribution]]) -> list[tuple[Allocation, str | None]]:
    """Each allocation with its GPU: the known placement, else a GPU its container runs on (rule 4)."""
    running = _running(procs)
    placed: list[tuple[Allocation, str | None]] = []
    taken: dict[ContainerKey, set[str]] = {}
    for a in allocations:
        if a.uuid is not None:
            if a.uuid in devices:
                taken.setdefault((a.pod_uid, a.container), set()).add(a.uuid)
                placed.append((a, a.uuid))
            else:
                placed.append((a, None))
    for a in allocations:
        if a.uuid is None:
            key = (a.pod_uid, a.container)
            have = taken.setdefault(key, set())
            free = [u for u in running.get(key, ()) if u not in have]
            target = free[0] if free else None
            if target is not None:
                have.add(target)
            placed.append((a, target))
    return placed


def _device(d: DeviceSample, every: list[ProcessAttribution], held: Mapping[ContainerKey, Allocation],
            pods: PodLookup, pods_used: dict[str, PodInfo], skip: SkipCounter, comms: Mapping[int, str],
            infra_namespaces: frozenset[str]) -> DeviceAttribution:
    """One GPU's mode, its users and its unaccounted processes (rules 3, 5, 6 and 9)."""
    rows, infra = infrastructure.split(every, held, comms, infra_namespaces)
    per_container: dict[ContainerKey, list[ProcessAttribution]] = {}
    for r in rows:
        if r.pod is not None and r.container is not None:
            per_container.setdefault((r.pod.uid, r.container), []).append(r)
    others = [k for k in per_container if k not in held]
    only = next(iter(held.values())) if len(held) == 1 else None
    if only is not None and only.whole and not others:
        mode = EXCLUSIVE
    elif held or len(per_container) >= 2:
        mode = SHARE
    else:
        mode = NONE
    users: list[ContainerUsage] = []
    if mode != NONE:
        for key in [*held, *others]:
            pod = pods.pods.get(key[0])
            if pod is None:
                skip("allocation_pod_missing")
                continue
            sm, mem = _usage(d, mode, per_container.get(key, []))
            users.append(ContainerUsage(pod, key[1], sm, mem, held.get(key)))
            pods_used[pod.uid] = pod
        users.sort(key=lambda u: (u.pod.namespace, u.pod.name, u.container))
    unaccounted = tuple(r for r in rows if r.pod is None or r.container is None or
                        (r.pod.uid, r.container) not in held)
    for r in (*unaccounted, *infra):
        if r.pod is not None:
            pods_used[r.pod.uid] = r.pod
    return DeviceAttribution(d, mode, tuple(users), unaccounted, tuple(every), infra)


def _usage(d: DeviceSample, mode: str, mine: list[ProcessAttribution]) -> tuple[float | None, int | None]:
    """A container's SM utilization and memory on one GPU (rule 3; the device's own figures if exclusive)."""
    if mode == EXCLUSIVE:
        return device_utilization(d), d.memory_used_bytes
    if not d.processes_ok:
        return None, None  # unknown is not idle: omit rather than report 0
    sm = None if any(r.sm_util is None for r in mine) else min(100.0, sum(r.sm_util or 0.0 for r in mine))
    mem = None if any(r.used_memory_bytes is None for r in mine) else sum(r.used_memory_bytes or 0 for r in mine)
    return sm, mem


def granted_memory(a: Allocation, dev: DeviceSample | None) -> int | None:
    """The memory ``a`` grants on ``dev``: the scheme's figure, a whole GPU's total, or its share of the card."""
    total = dev.memory_total_bytes if dev is not None else None
    if a.memory_bytes is not None or total is None:
        return a.memory_bytes
    if a.whole:
        return total
    return int(total * a.memory_fraction) if a.memory_fraction is not None else None


def _placed_allocations(placed: list[tuple[Allocation, str | None]], devices: Mapping[str, DeviceSample],
                        modes: Mapping[str, str], pods: PodLookup, pods_used: dict[str, PodInfo],
                        moved: set[int]) -> tuple[PlacedAllocation, ...]:
    """The allocation rows: GPU resolved, granted memory filled in, the GPU's mode."""
    out: list[PlacedAllocation] = []
    for a, uuid in placed:
        pod = pods.pods.get(a.pod_uid)
        if pod is None:
            continue
        dev = devices.get(uuid) if uuid else None
        memory = granted_memory(a, dev)
        scheme_mode = EXCLUSIVE if a.whole else SHARE
        # A moved holding (rule 8) says nothing of the claimed GPU's mode: the scheme's mode stands.
        mode = modes.get(uuid, scheme_mode) if uuid and id(a) not in moved else scheme_mode
        out.append(PlacedAllocation(pod, a.container, uuid or "", dev.minor_number if dev else None, mode,
                                    a.scheme, a.compute_percent, memory))
        pods_used[pod.uid] = pod
    out.sort(key=lambda p: (p.pod.namespace, p.pod.name, p.container, p.uuid))
    return tuple(out)
