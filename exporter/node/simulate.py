"""The embedded simulated node: a scenario file stands in for NVML, /proc and the API.

Only the outermost edge is simulated: device values come from the file instead of NVML,
``/proc/<pid>/cgroup`` text comes from the file and goes through the real cgroup parser,
pods go through the real pod store. Everything after that is the production pipeline.
The same file drives the fake libnvidia-ml.so.1 (tests/fake_nvml), so fault keys
(``not_supported``, ``lost_after_ticks``) mean the same in both.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

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

TICK_US = 1_000_000  # simulated sampling period between util sample timestamps


class ScenarioError(ValueError):
    """The scenario file is unusable; the message names the offending key."""


_INT_FIELDS = {
    "minor_number", "memory_total_bytes", "memory_used_bytes", "utilization_gpu", "utilization_memory",
    "power_usage_milliwatts", "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz",
    "encoder_utilization", "decoder_utilization", "ecc_corrected", "ecc_uncorrected",
    "clocks_event_reasons", "lost_after_ticks", "process_growth",
}
_DEVICE_KEYS = _INT_FIELDS | {"uuid", "name", "pci_bus_id", "processes", "not_supported", "xid_events",
                              "mig_devices"}
_MIG_KEYS = {"uuid", "profile", "gpu_instance_id", "compute_instance_id", "memory_total_bytes",
             "memory_used_bytes", "processes"}
# What a MIG device reads from its physical GPU (NVML answers these on the parent handle only).
_MIG_FROM_PARENT = ("power_usage_milliwatts", "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz",
                    "ecc_corrected_total", "ecc_uncorrected_total", "clocks_event_reasons")
_PROCESS_KEYS = {"pid", "used_memory_bytes", "sm_util", "cgroup", "type"}
_TOP_KEYS = {"node", "node_labels", "node_capacity", "devices", "pods", "pod_resources", "nvml", "description",
             "resource_slices", "resource_claims"}
# not_supported names (shared with the fake NVML library) -> the DeviceSample fields they blank.
NOT_SUPPORTED_FIELDS: dict[str, tuple[str, ...]] = {
    "power": ("power_usage_milliwatts",),
    "temperature": ("temperature_celsius",),
    "utilization": ("utilization_gpu", "utilization_memory"),
    "clocks": ("sm_clock_mhz", "memory_clock_mhz"),
    "ecc": ("ecc_corrected_total", "ecc_uncorrected_total"),
    "encoder": ("encoder_utilization",),
    "decoder": ("decoder_utilization",),
    "clocks_event_reasons": ("clocks_event_reasons",),
    "memory": ("memory_total_bytes", "memory_used_bytes"),
    "process_utilization": (),
    # Fake-NVML faults with no field to blank here: accepted so one scenario serves both backends.
    "events": (),
    "mig": (),
}


@dataclass(frozen=True, slots=True)
class ScenarioProcess:
    pid: int
    used_memory_bytes: int | None
    sm_util: int
    cgroup: str
    kind: str


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


def _int(value: object, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}: must be >= {minimum}, got {value}")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: expected a string, got {value!r}")
    return value


def _quantity_text(value: object, where: str) -> str:
    """A capacity quantity as the API serves it (a string); YAML integers are accepted."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str(value, where)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _unknown(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(map(str, extra))}; "
                            f"allowed: {', '.join(sorted(allowed))}")


def _process(raw: object, where: str) -> ScenarioProcess:
    p = _mapping(raw, where)
    _unknown(p, _PROCESS_KEYS, where)
    if "pid" not in p:
        raise ScenarioError(f"{where}: 'pid' is required")
    mem = p.get("used_memory_bytes")
    kind = _str(p.get("type", "compute"), f"{where}.type")
    if kind not in ("compute", "graphics", "mps"):
        raise ScenarioError(f"{where}.type: must be compute, graphics or mps, got {kind!r}")
    sm = _int(p.get("sm_util", 0), f"{where}.sm_util")
    if sm > 100:
        raise ScenarioError(f"{where}.sm_util: must be <= 100, got {sm}")
    return ScenarioProcess(
        pid=_int(p["pid"], f"{where}.pid", 1),
        used_memory_bytes=None if mem is None else _int(mem, f"{where}.used_memory_bytes"),
        sm_util=sm,
        cgroup=_str(p.get("cgroup", "0::/\n"), f"{where}.cgroup"),
        kind=kind,
    )


def _device(raw: object, index: int) -> tuple[ScenarioDevice, ...]:
    """A physical GPU, or the MIG devices it is partitioned into."""
    where = f"devices[{index}]"
    d = _mapping(raw, where)
    _unknown(d, _DEVICE_KEYS, where)
    for key in ("uuid", "name"):
        if key not in d:
            raise ScenarioError(f"{where}: '{key}' is required")
    ints = {k: _int(d[k], f"{where}.{k}") for k in _INT_FIELDS if d.get(k) is not None}
    for k in ("utilization_gpu", "utilization_memory", "encoder_utilization", "decoder_utilization"):
        if ints.get(k, 0) > 100:
            raise ScenarioError(f"{where}.{k}: a percentage must be <= 100, got {ints[k]}")
    if "memory_used_bytes" in ints and "memory_total_bytes" in ints and (
            ints["memory_used_bytes"] > ints["memory_total_bytes"]):
        raise ScenarioError(f"{where}: memory_used_bytes exceeds memory_total_bytes")
    not_supported = frozenset(_str(x, f"{where}.not_supported") for x in _list(
        d.get("not_supported"), f"{where}.not_supported"))
    bad = sorted(not_supported - set(NOT_SUPPORTED_FIELDS))
    if bad:
        raise ScenarioError(f"{where}.not_supported: unknown field(s) {', '.join(bad)}; "
                            f"allowed: {', '.join(sorted(NOT_SUPPORTED_FIELDS))}")
    processes = _processes(d.get("processes"), f"{where}.processes")
    for i, x in enumerate(_list(d.get("xid_events"), f"{where}.xid_events")):
        _mapping(x, f"{where}.xid_events[{i}]")
    sample = DeviceSample(
        index=index,
        uuid=_str(d["uuid"], f"{where}.uuid"),
        name=_str(d["name"], f"{where}.name"),
        minor_number=ints.get("minor_number", index),
        pci_bus_id=_str(d.get("pci_bus_id", f"00000000:{index + 1:02X}:00.0"), f"{where}.pci_bus_id"),
        memory_total_bytes=ints.get("memory_total_bytes"),
        memory_used_bytes=ints.get("memory_used_bytes"),
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
    )
    blank = {f: None for name in not_supported for f in NOT_SUPPORTED_FIELDS[name]}
    if blank:
        sample = replace(sample, **blank)
    lost_after = ints.get("lost_after_ticks")
    if "mig_devices" not in d:
        return (ScenarioDevice(sample, processes, not_supported, lost_after),)
    if processes:
        raise ScenarioError(f"{where}: a GPU with mig_devices has its processes on them, not on itself")
    if "mig" in not_supported:
        raise ScenarioError(f"{where}: not_supported lists mig, but the GPU has mig_devices")
    migs = _list(d["mig_devices"], f"{where}.mig_devices")
    if not migs:
        raise ScenarioError(f"{where}.mig_devices: MIG mode with no MIG device; leave the key out instead")
    return tuple(_mig_device(m, f"{where}.mig_devices[{j}]", sample, not_supported, lost_after)
                 for j, m in enumerate(migs))


def _processes(raw: object, where: str) -> tuple[ScenarioProcess, ...]:
    processes = tuple(_process(p, f"{where}[{i}]") for i, p in enumerate(_list(raw, where)))
    pids = [p.pid for p in processes]
    if len(set(pids)) != len(pids):
        raise ScenarioError(f"{where}: duplicate pid")
    return processes


def _mig_device(raw: object, where: str, parent: DeviceSample, parent_not_supported: frozenset[str],
                lost_after: int | None) -> ScenarioDevice:
    m = _mapping(raw, where)
    _unknown(m, _MIG_KEYS, where)
    for key in ("uuid", "profile"):
        if key not in m:
            raise ScenarioError(f"{where}: '{key}' is required")
    uuid = _str(m["uuid"], f"{where}.uuid")
    if not uuid.startswith("MIG-"):
        raise ScenarioError(f"{where}.uuid: a MIG device uuid starts with MIG-, got {uuid!r}")
    ints = {k: _int(m[k], f"{where}.{k}") for k in _MIG_KEYS - {"uuid", "profile", "processes"}
            if m.get(k) is not None}
    if "memory_total_bytes" in ints and ints.get("memory_used_bytes", 0) > ints["memory_total_bytes"]:
        raise ScenarioError(f"{where}: memory_used_bytes exceeds memory_total_bytes")
    processes = _processes(m.get("processes"), f"{where}.processes")
    profile = _str(m["profile"], f"{where}.profile")
    sample = DeviceSample(
        index=parent.index, uuid=uuid, name=f"{parent.name} MIG {profile}", minor_number=parent.minor_number,
        pci_bus_id=parent.pci_bus_id, memory_total_bytes=ints.get("memory_total_bytes"),
        memory_used_bytes=ints.get("memory_used_bytes"),
        processes=tuple(ProcessUsage(p.pid, p.used_memory_bytes, p.kind) for p in processes),
        parent_uuid=parent.uuid, gpu_instance_id=ints.get("gpu_instance_id"),
        compute_instance_id=ints.get("compute_instance_id"), mig_profile=profile,
        **{f: getattr(parent, f) for f in _MIG_FROM_PARENT},
    )
    # NVML has neither device nor per-process utilization for MIG devices.
    not_supported = frozenset(parent_not_supported - {"memory"}) | {"process_utilization", "utilization"}
    return ScenarioDevice(sample, processes, not_supported, lost_after)


def _pod_resources(raw: object) -> tuple[PodResources, ...]:
    out = []
    for i, p in enumerate(_list(raw, "pod_resources")):
        where = f"pod_resources[{i}]"
        p = _mapping(p, where)
        containers = []
        for j, c in enumerate(_list(p.get("containers"), f"{where}.containers")):
            cw = f"{where}.containers[{j}]"
            c = _mapping(c, cw)
            devices = []
            for k, dev in enumerate(_list(c.get("devices"), f"{cw}.devices")):
                dev = _mapping(dev, f"{cw}.devices[{k}]")
                name = dev.get("resource_name", dev.get("resourceName"))
                ids = dev.get("device_ids", dev.get("deviceIds"))
                devices.append((_str(name, f"{cw}.devices[{k}].resource_name"),
                                tuple(_str(x, f"{cw}.devices[{k}].device_ids")
                                      for x in _list(ids, f"{cw}.devices[{k}].device_ids"))))
            containers.append(PodResourcesContainer(_str(c.get("name"), f"{cw}.name"), tuple(devices),
                                                    _dynamic_resources(c.get("dynamic_resources"), cw)))
        out.append(PodResources(_str(p.get("name"), f"{where}.name"),
                                _str(p.get("namespace"), f"{where}.namespace"), tuple(containers)))
    return tuple(out)


def _dynamic_resources(raw: object, cw: str) -> tuple[DynamicResource, ...]:
    """``dynamic_resources`` of a pod-resources container, with the proto's field names."""
    out = []
    for k, d in enumerate(_list(raw, f"{cw}.dynamic_resources")):
        dw = f"{cw}.dynamic_resources[{k}]"
        d = _mapping(d, dw)
        rs = [_mapping(r, f"{dw}.claim_resources") for r in _list(d.get("claim_resources"), f"{dw}.claim_resources")]
        fields = ("driver_name", "pool_name", "device_name", "share_id")
        out.append(DynamicResource(_str(d.get("claim_name"), f"{dw}.claim_name"),
                                   _str(d.get("claim_namespace"), f"{dw}.claim_namespace"),
                                   tuple(ClaimResource(*(_str(r.get(f, ""), f"{dw}.{f}") for f in fields))
                                         for r in rs)))
    return tuple(out)


def parse_scenario(data: object) -> Scenario:
    """Validate a loaded scenario document (raises ScenarioError naming the bad key)."""
    top = _mapping(data, "scenario")
    _unknown(top, _TOP_KEYS, "scenario")
    labels = _mapping(top.get("node_labels") or {}, "node_labels")
    capacity = _mapping(top.get("node_capacity") or {}, "node_capacity")
    devices = tuple(sd for i, d in enumerate(_list(top.get("devices"), "devices")) for sd in _device(d, i))
    uuids = [d.sample.uuid for d in devices]
    if len(set(uuids)) != len(uuids):
        raise ScenarioError("devices: duplicate uuid")
    pods = tuple(_mapping(p, f"pods[{i}]") for i, p in enumerate(_list(top.get("pods"), "pods")))
    return Scenario(
        node=_str(top.get("node", ""), "node"),
        node_labels={_str(k, "node_labels"): _str(v, f"node_labels.{k}") for k, v in labels.items()},
        devices=devices,
        pods=pods,
        pod_resources=_pod_resources(top["pod_resources"]) if "pod_resources" in top else None,
        node_capacity={_str(k, "node_capacity"): _quantity_text(v, f"node_capacity.{k}") for k, v in capacity.items()},
        resource_slices=tuple(_mapping(o, k) for k in ["resource_slices"] for o in _list(top.get(k), k)),
        resource_claims=tuple(_mapping(o, k) for k in ["resource_claims"] for o in _list(top.get(k), k)),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    try:
        text = Path(path).read_text(encoding="utf-8")  # YAML is UTF-8, whatever the locale says
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except ValueError as e:  # a NUL in the path
        raise ScenarioError(f"cannot read scenario {path!r}: {e}") from None
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

    def __init__(self, scenario: Scenario, clock=time.time) -> None:
        self._scenario = scenario
        self._clock = clock
        self._tick = 0

    def sample(self) -> NodeSample:
        self._tick += 1
        devices = []
        for sd in self._scenario.devices:
            if sd.lost_after_ticks is not None and self._tick > sd.lost_after_ticks:
                devices.append(sd.sample.without_values(lost=True))
                continue
            if "process_utilization" in sd.not_supported:
                devices.append(replace(sd.sample, util_samples_ok=False))
                continue
            ts = self._tick * TICK_US
            samples = tuple(UtilSample(p.pid, ts, p.sm_util) for p in sd.processes if p.sm_util > 0)
            devices.append(replace(sd.sample, util_samples=samples))
        return NodeSample(timestamp=self._clock(), devices=tuple(devices), nvml_up=True,
                          driver_version="simulated")

    def close(self) -> None:
        """Nothing to release."""


class ScenarioProc:
    """Stands in for :class:`exporter.node.procfs.ProcReader` with the scenario's cgroup texts."""

    def __init__(self, scenario: Scenario) -> None:
        parsed = {p.pid: parse_cgroup(p.cgroup) for d in scenario.devices for p in d.processes}
        self._refs = {pid: r.ref for pid, r in parsed.items()}
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
