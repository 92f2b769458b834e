"""The embedded simulated node: a scenario file stands in for NVML, /proc and the API.

Only the outermost edge is simulated: device values come from the file instead of NVML,
``/proc/<pid>/cgroup`` text comes from the file and goes through the real cgroup parser,
pods go through the real pod store. Everything after that is the production pipeline.
The same file drives the fake libnvidia-ml.so.1 (tests/fake_nvml), so fault keys
(``not_supported``, ``lost_after_ticks``) mean the same in both. The health keys are parsed in
scenario_health.py, the generic value checks live in scenario_parse.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exporter.attribution.cgroup import parse_cgroup
from exporter.model import (
    CgroupRef,
    ClaimResource,
    DeviceSample,
    DynamicResource,
    NodeSample,
    PodResources,
    PodResourcesContainer,
    ProcessUsage,
    UtilSample,
)
from exporter.node.scenario_health import HEALTH_KEYS, check_mig_gpm, energy_at, parse_gpm, parse_health
from exporter.node.scenario_parse import (
    ScenarioError,
    as_int,
    as_list,
    as_mapping,
    as_str,
    check_memory,
    quantity_text,
    read_scenario_text,
    reject_unknown,
)

TICK_US = 1_000_000  # simulated sampling period between util sample timestamps

_INT_FIELDS = {
    "minor_number", "memory_total_bytes", "memory_used_bytes", "utilization_gpu", "utilization_memory",
    "power_usage_milliwatts", "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz",
    "encoder_utilization", "decoder_utilization", "ecc_corrected", "ecc_uncorrected",
    "clocks_event_reasons", "lost_after_ticks", "process_growth", "memory_reserved_bytes",
}
_DEVICE_KEYS = _INT_FIELDS | HEALTH_KEYS | {"uuid", "name", "pci_bus_id", "processes", "not_supported",
                                            "xid_events", "mig_devices"}
# memory_reserved_bytes is per handle (nvmlDeviceGetMemoryInfo answers on a MIG handle too); gpm is the GPU
# instance's (nvmlGpmMigSampleGet), the same five ratios as a card's.
_MIG_KEYS = {"uuid", "profile", "gpu_instance_id", "compute_instance_id", "memory_total_bytes",
             "memory_used_bytes", "memory_reserved_bytes", "processes", "gpm"}
# What a MIG device reads from its physical GPU (NVML answers these on the parent handle only).
_MIG_FROM_PARENT = ("power_usage_milliwatts", "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz",
                    "ecc_corrected_total", "ecc_uncorrected_total", "clocks_event_reasons", "health")
_PROCESS_KEYS = {"pid", "used_memory_bytes", "sm_util", "cgroup", "type", "comm"}  # comm: /proc/<pid>/comm
_TOP_KEYS = {"node", "node_labels", "node_capacity", "devices", "pods", "pod_resources", "nvml", "description",
             "resource_slices", "resource_claims"}
# not_supported names (shared with the fake NVML library) -> the DeviceSample fields they blank;
# the health keys (HEALTH_KEYS) are not_supported names as well and blank their DeviceHealth field.
NOT_SUPPORTED_FIELDS: dict[str, tuple[str, ...]] = {
    "power": ("power_usage_milliwatts",), "temperature": ("temperature_celsius",),
    "utilization": ("utilization_gpu", "utilization_memory"), "clocks": ("sm_clock_mhz", "memory_clock_mhz"),
    "ecc": ("ecc_corrected_total", "ecc_uncorrected_total"),
    "encoder": ("encoder_utilization",), "decoder": ("decoder_utilization",),
    "clocks_event_reasons": ("clocks_event_reasons",), "process_utilization": (),
    "memory": ("memory_total_bytes", "memory_used_bytes", "memory_reserved_bytes"),  # the whole memory-info call
    "memory_reserved_bytes": ("memory_reserved_bytes",),
    # Fake-NVML faults with no field to blank here: accepted so one scenario serves both backends.
    "events": (), "mig": (),
}


@dataclass(frozen=True, slots=True)
class ScenarioProcess:
    pid: int
    used_memory_bytes: int | None
    sm_util: int
    cgroup: str
    kind: str
    comm: str | None = None  # /proc/<pid>/comm (the fake /proc of the tests writes it too)


@dataclass(frozen=True, slots=True)
class ScenarioDevice:
    sample: DeviceSample  # values as configured, processes included, no util samples
    processes: tuple[ScenarioProcess, ...]
    not_supported: frozenset[str]
    lost_after_ticks: int | None


@dataclass(frozen=True, slots=True)
class Scenario:
    node: str
    node_labels: Mapping[str, str]
    devices: tuple[ScenarioDevice, ...]
    pods: tuple[Mapping[str, Any], ...]
    pod_resources: tuple[PodResources, ...] | None
    node_capacity: Mapping[str, str] = field(default_factory=dict)  # the Node's status.capacity
    # DRA: resource.k8s.io/v1 objects exactly as the API returns them (untrusted: parsed by attribution)
    resource_slices: tuple[Mapping[str, Any], ...] = ()
    resource_claims: tuple[Mapping[str, Any], ...] = ()


def _process(raw: object, where: str) -> ScenarioProcess:
    p = as_mapping(raw, where)
    reject_unknown(p, _PROCESS_KEYS, where)
    if "pid" not in p:
        raise ScenarioError(f"{where}: 'pid' is required")
    mem = p.get("used_memory_bytes")
    kind = as_str(p.get("type", "compute"), f"{where}.type")
    if kind not in ("compute", "graphics", "mps"):
        raise ScenarioError(f"{where}.type: must be compute, graphics or mps, got {kind!r}")
    sm = as_int(p.get("sm_util", 0), f"{where}.sm_util")
    if sm > 100:
        raise ScenarioError(f"{where}.sm_util: must be <= 100, got {sm}")
    return ScenarioProcess(
        pid=as_int(p["pid"], f"{where}.pid", 1),
        used_memory_bytes=None if mem is None else as_int(mem, f"{where}.used_memory_bytes"),
        sm_util=sm,
        cgroup=as_str(p.get("cgroup", "0::/\n"), f"{where}.cgroup"),
        kind=kind,
        comm=" ".join(as_str(p.get("comm", ""), f"{where}.comm").split())[:64] or None,  # as ProcReader.comm
    )


def _device(raw: object, index: int) -> tuple[ScenarioDevice, ...]:
    """A physical GPU, or the MIG devices it is partitioned into."""
    where = f"devices[{index}]"
    d = as_mapping(raw, where)
    reject_unknown(d, _DEVICE_KEYS, where)
    for key in ("uuid", "name"):
        if key not in d:
            raise ScenarioError(f"{where}: '{key}' is required")
    ints = {k: as_int(d[k], f"{where}.{k}") for k in _INT_FIELDS if d.get(k) is not None}
    for k in ("utilization_gpu", "utilization_memory", "encoder_utilization", "decoder_utilization"):
        if ints.get(k, 0) > 100:
            raise ScenarioError(f"{where}.{k}: a percentage must be <= 100, got {ints[k]}")
    check_memory(ints, where)
    not_supported = _not_supported(d.get("not_supported"), f"{where}.not_supported")
    processes = _processes(d.get("processes"), f"{where}.processes")
    for i, x in enumerate(as_list(d.get("xid_events"), f"{where}.xid_events")):
        as_mapping(x, f"{where}.xid_events[{i}]")
    sample = DeviceSample(
        index=index,
        uuid=as_str(d["uuid"], f"{where}.uuid"),
        name=as_str(d["name"], f"{where}.name"),
        minor_number=ints.get("minor_number", index),
        pci_bus_id=as_str(d.get("pci_bus_id", f"00000000:{index + 1:02X}:00.0"), f"{where}.pci_bus_id"),
        memory_total_bytes=ints.get("memory_total_bytes"),
        memory_used_bytes=ints.get("memory_used_bytes"),
        memory_reserved_bytes=ints.get("memory_reserved_bytes"),
        utilization_gpu=ints.get("utilization_gpu"),
        utilization_memory=ints.get("utilization_memory"),
        power_usage_milliwatts=ints.get("power_usage_milliwatts"),
        temperature_celsius=ints.get("temperature_celsius"),
        sm_clock_mhz=ints.get("sm_clock_mhz"),
        memory_clock_mhz=ints.get("memory_clock_mhz"),
        encoder_utilization=ints.get("encoder_utilization"),
        decoder_utilization=ints.get("decoder_utilization"),
        ecc_corrected_total=ints.get("ecc_corrected"),
        ecc_uncorrected_total=ints.get("ecc_uncorrected"),
        clocks_event_reasons=ints.get("clocks_event_reasons"),
        processes=tuple(ProcessUsage(p.pid, p.used_memory_bytes, p.kind) for p in processes),
        health=parse_health(d, where, not_supported),
    )
    blank = {f: None for name in not_supported for f in NOT_SUPPORTED_FIELDS.get(name, ())}  # health: parse_health
    if blank:
        sample = replace(sample, **blank)
    sample = _reserved_default(sample, not_supported)
    lost_after = ints.get("lost_after_ticks")
    if "mig_devices" not in d:
        return (ScenarioDevice(sample, processes, not_supported, lost_after),)
    if processes:
        raise ScenarioError(f"{where}: a GPU with mig_devices has its processes on them, not on itself")
    if "mig" in not_supported:
        raise ScenarioError(f"{where}: not_supported lists mig, but the GPU has mig_devices")
    migs = as_list(d["mig_devices"], f"{where}.mig_devices")
    if not migs:
        raise ScenarioError(f"{where}.mig_devices: MIG mode with no MIG device; leave the key out instead")
    out = tuple(_mig_device(m, f"{where}.mig_devices[{j}]", sample, not_supported, lost_after)
                for j, m in enumerate(migs))
    check_mig_gpm(d, migs, where)
    return out


def _reserved_default(sample: DeviceSample, not_supported: frozenset[str]) -> DeviceSample:
    """No reserved key reads 0 where memory info answers, as drivers since 515 (and the fake) report it."""
    if (sample.memory_reserved_bytes is None and sample.memory_total_bytes is not None
            and not not_supported & {"memory", "memory_reserved_bytes"}):
        return replace(sample, memory_reserved_bytes=0)
    return sample


def _not_supported(raw: object, where: str) -> frozenset[str]:
    names = frozenset(as_str(x, where) for x in as_list(raw, where))
    allowed = set(NOT_SUPPORTED_FIELDS) | HEALTH_KEYS
    bad = sorted(names - allowed)
    if bad:
        raise ScenarioError(f"{where}: unknown field(s) {', '.join(bad)}; allowed: {', '.join(sorted(allowed))}")
    return names


def _processes(raw: object, where: str) -> tuple[ScenarioProcess, ...]:
    processes = tuple(_process(p, f"{where}[{i}]") for i, p in enumerate(as_list(raw, where)))
    pids = [p.pid for p in processes]
    if len(set(pids)) != len(pids):
        raise ScenarioError(f"{where}: duplicate pid")
    return processes


def _mig_device(raw: object, where: str, parent: DeviceSample, parent_not_supported: frozenset[str],
                lost_after: int | None) -> ScenarioDevice:
    m = as_mapping(raw, where)
    reject_unknown(m, _MIG_KEYS, where)
    for key in ("uuid", "profile"):
        if key not in m:
            raise ScenarioError(f"{where}: '{key}' is required")
    uuid = as_str(m["uuid"], f"{where}.uuid")
    if not uuid.startswith("MIG-"):
        raise ScenarioError(f"{where}.uuid: a MIG device uuid starts with MIG-, got {uuid!r}")
    ints = {k: as_int(m[k], f"{where}.{k}") for k in _MIG_KEYS - {"uuid", "profile", "processes", "gpm"}
            if m.get(k) is not None}
    check_memory(ints, where)
    processes = _processes(m.get("processes"), f"{where}.processes")
    profile = as_str(m["profile"], f"{where}.profile")
    sample = DeviceSample(
        index=parent.index, uuid=uuid, name=f"{parent.name} MIG {profile}", minor_number=parent.minor_number,
        pci_bus_id=parent.pci_bus_id, memory_total_bytes=ints.get("memory_total_bytes"),
        memory_used_bytes=ints.get("memory_used_bytes"), memory_reserved_bytes=ints.get("memory_reserved_bytes"),
        processes=tuple(ProcessUsage(p.pid, p.used_memory_bytes, p.kind) for p in processes),
        parent_uuid=parent.uuid, gpu_instance_id=ints.get("gpu_instance_id"),
        compute_instance_id=ints.get("compute_instance_id"), mig_profile=profile,
        # card_memory_total_bytes stays unknown, as NVML answers it (the aggregate needs privileges in MIG mode)
        **{f: getattr(parent, f) for f in _MIG_FROM_PARENT},
    )
    gpm = None if m.get("gpm") is None else parse_gpm(m["gpm"], f"{where}.gpm")
    # the card's health but GPM, its GPU instance's: none where the card has none (not_supported)
    sample = replace(sample, health=replace(sample.health, gpm=None if "gpm" in parent_not_supported else gpm))
    # NVML has neither device nor per-process utilization for MIG devices.
    not_supported = frozenset(parent_not_supported - {"memory"}) | {"process_utilization", "utilization"}
    return ScenarioDevice(_reserved_default(sample, not_supported - {"memory_reserved_bytes"}), processes,
                          not_supported, lost_after)


def _pod_resources(raw: object) -> tuple[PodResources, ...]:
    out = []
    for i, p in enumerate(as_list(raw, "pod_resources")):
        where = f"pod_resources[{i}]"
        p = as_mapping(p, where)
        containers = []
        for j, c in enumerate(as_list(p.get("containers"), f"{where}.containers")):
            cw = f"{where}.containers[{j}]"
            c = as_mapping(c, cw)
            devices = []
            for k, dev in enumerate(as_list(c.get("devices"), f"{cw}.devices")):
                dev = as_mapping(dev, f"{cw}.devices[{k}]")
                name = dev.get("resource_name", dev.get("resourceName"))
                ids = dev.get("device_ids", dev.get("deviceIds"))
                devices.append((as_str(name, f"{cw}.devices[{k}].resource_name"),
                                tuple(as_str(x, f"{cw}.devices[{k}].device_ids")
                                      for x in as_list(ids, f"{cw}.devices[{k}].device_ids"))))
            containers.append(PodResourcesContainer(as_str(c.get("name"), f"{cw}.name"), tuple(devices),
                                                    _dynamic_resources(c.get("dynamic_resources"), cw)))
        out.append(PodResources(as_str(p.get("name"), f"{where}.name"),
                                as_str(p.get("namespace"), f"{where}.namespace"), tuple(containers)))
    return tuple(out)


def _dynamic_resources(raw: object, cw: str) -> tuple[DynamicResource, ...]:
    """``dynamic_resources`` of a pod-resources container, with the proto's field names."""
    out = []
    for k, d in enumerate(as_list(raw, f"{cw}.dynamic_resources")):
        dw = f"{cw}.dynamic_resources[{k}]"
        d = as_mapping(d, dw)
        rw = f"{dw}.claim_resources"
        rs = [as_mapping(r, rw) for r in as_list(d.get("claim_resources"), rw)]
        fields = ("driver_name", "pool_name", "device_name", "share_id")
        out.append(DynamicResource(as_str(d.get("claim_name"), f"{dw}.claim_name"),
                                   as_str(d.get("claim_namespace"), f"{dw}.claim_namespace"),
                                   tuple(ClaimResource(*(as_str(r.get(f, ""), f"{dw}.{f}") for f in fields))
                                         for r in rs)))
    return tuple(out)


def parse_scenario(data: object) -> Scenario:
    """Validate a loaded scenario document (raises ScenarioError naming the bad key)."""
    top = as_mapping(data, "scenario")
    reject_unknown(top, _TOP_KEYS, "scenario")
    labels = as_mapping(top.get("node_labels") or {}, "node_labels")
    capacity = as_mapping(top.get("node_capacity") or {}, "node_capacity")
    devices = tuple(sd for i, d in enumerate(as_list(top.get("devices"), "devices")) for sd in _device(d, i))
    uuids = [d.sample.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise ScenarioError("devices: duplicate uuid")
    pods = tuple(as_mapping(p, f"pods[{i}]") for i, p in enumerate(as_list(top.get("pods"), "pods")))
    return Scenario(
        node=as_str(top.get("node", ""), "node"),
        node_labels={as_str(k, "node_labels"): as_str(v, f"node_labels.{k}") for k, v in labels.items()},
        devices=devices,
        pods=pods,
        pod_resources=_pod_resources(top["pod_resources"]) if "pod_resources" in top else None,
        node_capacity={as_str(k, "node_capacity"): quantity_text(v, f"node_capacity.{k}")
                       for k, v in capacity.items()},
        resource_slices=tuple(as_mapping(o, k) for k in ["resource_slices"] for o in as_list(top.get(k), k)),
        resource_claims=tuple(as_mapping(o, k) for k in ["resource_claims"] for o in as_list(top.get(k), k)),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    text = read_scenario_text(path)
    import yaml  # only a simulated node reads YAML

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        # A YAML error's text spans several lines (context, caret); its problem and place are enough.
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise ScenarioError(f"{path}: not valid YAML{where}: {problem}") from None
    try:
        return parse_scenario(data)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


class SimulatedBackend:
    """Stands in for :class:`exporter.node.nvml.backend.NvmlBackend`: one NodeSample per call."""

    def __init__(self, scenario: Scenario, clock=time.time, *, nvlink: bool = True) -> None:
        """``nvlink``: report the scenario's NVLinks (off: none, as NvmlBackend then reads none)."""
        self._scenario = scenario
        self._clock = clock
        self._tick = 0
        self.nvlink = nvlink  # --nvlink-metrics

    def sample(self) -> NodeSample:
        self._tick += 1
        devices = []
        for sd in self._scenario.devices:
            if sd.lost_after_ticks is not None and self._tick > sd.lost_after_ticks:
                devices.append(sd.sample.without_values(lost=True))
                continue
            # Cycle 1 reads the configured energy, as from the fake NVML, where every call before
            # the utilization probe of cycle k sees tick k - 1.
            health = energy_at(sd.sample.health, sd.sample.power_usage_milliwatts, self._tick - 1)
            if not self.nvlink and health.nvlinks:
                health = replace(health, nvlinks=())
            if "process_utilization" in sd.not_supported:
                devices.append(replace(sd.sample, health=health, util_samples_ok=False))
                continue
            ts = self._tick * TICK_US
            samples = tuple(UtilSample(p.pid, ts, p.sm_util) for p in sd.processes if p.sm_util > 0)
            devices.append(replace(sd.sample, health=health, util_samples=samples))
        # a card has GPM where its scenario gives it (on its MIG devices: all or none)
        gpm = {sd.sample.parent_uuid or sd.sample.uuid: sd.sample.health.gpm is not None
               for sd in self._scenario.devices}
        return NodeSample(timestamp=self._clock(), devices=tuple(devices), nvml_up=True,
                          driver_version="simulated", gpm_capable=gpm)

    def close(self) -> None:
        """Nothing to release."""


class ScenarioProc:
    """Stands in for :class:`exporter.node.procfs.ProcReader` with the scenario's cgroup texts."""

    def __init__(self, scenario: Scenario) -> None:
        parsed = {p.pid: parse_cgroup(p.cgroup) for d in scenario.devices for p in d.processes}
        self._refs = {pid: r.ref for pid, r in parsed.items()}
        self._comms = {p.pid: p.comm for d in scenario.devices for p in d.processes if p.comm}
        malformed = sum(r.malformed_lines for r in parsed.values())
        self._skips: dict[str, int] = {"malformed_cgroup_line": malformed} if malformed else {}

    def resolve(self, pids: Iterable[int]) -> dict[int, CgroupRef | None]:
        out: dict[int, CgroupRef | None] = {}
        for pid in pids:
            if pid in self._refs:
                out[pid] = self._refs[pid]
            else:
                self._skips["exited"] = self._skips.get("exited", 0) + 1
        return out

    def skips(self) -> Mapping[str, int]:
        return dict(self._skips)

    def comms(self) -> Mapping[int, str]:
        return dict(self._comms)
