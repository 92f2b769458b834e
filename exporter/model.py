"""Immutable data passed along the pipeline: sample -> attribute -> snapshot -> render.

Every stage takes and returns these frozen values; nothing here does I/O. Backends
(real NVML, simulated scenario) produce :class:`NodeSample`; the /proc reader produces
``{pid: CgroupRef | None}``; the pod watcher produces :class:`PodInfo` values.
:class:`OneLineError` is the base of every refused input's error (scenario, flags, web config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

EMPTY: Mapping = MappingProxyType({})

# Control characters (C0, DEL, C1) and the Unicode line and paragraph separators: each one a
# str.splitlines() break or a terminal escape when an error echoes a key, a value or a path.
_ESCAPES = str.maketrans({c: c.encode("unicode_escape").decode("ascii")
                          for c in map(chr, [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029])})


def one_line(text: str) -> str:
    """``text`` with control characters escaped as Python writes them (``\\n``, ``\\x1b``): one line."""
    return text.translate(_ESCAPES)


class OneLineError(ValueError):
    """A refused input, told in one line whatever the input holds: the message is made :func:`one_line`."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process holding a context on a device (NVML running-process lists)."""

    pid: int  # host PID: NVML is not PID-namespace aware
    used_memory_bytes: int | None  # None = NVML_VALUE_NOT_AVAILABLE
    kind: str = "compute"  # compute | graphics | mps


@dataclass(frozen=True, slots=True)
class UtilSample:
    """One nvmlProcessUtilizationSample_t newer than the device's lastSeenTimeStamp."""

    pid: int
    timestamp_us: int
    sm_util: int
    mem_util: int = 0
    enc_util: int = 0
    dec_util: int = 0


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    """One NVLink of a GPU as NVML reports it. ``None`` = not supported / not read."""

    link: int  # link index, 0 .. NVML_NVLINK_MAX_LINKS-1
    active: bool | None = None  # nvmlDeviceGetNvLinkState
    tx_bytes: int | None = None  # data bytes sent since driver load (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)
    rx_bytes: int | None = None  # data bytes received since driver load (..._DATA_RX)
    crc_errors: int | None = None  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    replay_errors: int | None = None  # NVML_NVLINK_ERROR_DL_REPLAY
    recovery_errors: int | None = None  # NVML_NVLINK_ERROR_DL_RECOVERY


@dataclass(frozen=True, slots=True)
class GpmSample:
    """GPM profiling ratios (0..1) over the last sampling period; Hopper and newer only."""

    graphics_active: float | None = None  # NVML_GPM_METRIC_GRAPHICS_UTIL / 100
    sm_active: float | None = None  # NVML_GPM_METRIC_SM_UTIL / 100
    sm_occupancy: float | None = None  # NVML_GPM_METRIC_SM_OCCUPANCY / 100
    tensor_active: float | None = None  # NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100
    dram_active: float | None = None  # NVML_GPM_METRIC_DRAM_BW_UTIL / 100


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """The card's health and power signals (read on the physical GPU, repeated on its MIG devices).

    ``None`` = not supported or not read this cycle; ``gpm`` is ``None`` where the device has no
    GPM (before Hopper) or before the second sample, never zeros. On a MIG device ``gpm`` is its
    GPU instance's own (nvmlGpmMigSampleGet), not the card's.
    """

    energy_millijoules: int | None = None  # since driver load
    power_limit_milliwatts: int | None = None  # enforced limit
    fan_speed_percent: int | None = None
    performance_state: int | None = None  # 0 (P0, max) .. 15
    memory_temperature_celsius: int | None = None
    pcie_tx_kilobytes_per_second: int | None = None
    pcie_rx_kilobytes_per_second: int | None = None
    pcie_replay_count: int | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: int | None = None  # 0/1
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: int | None = None  # 0/1: reset the GPU to apply
    remapped_rows_failure: int | None = None  # 0/1: a remap failed, replace the GPU
    power_violation_nanoseconds: int | None = None  # clocks held down by the power limit, since driver load
    nvlinks: tuple[NvLinkSample, ...] = ()
    gpm: GpmSample | None = None


NO_HEALTH = DeviceHealth()


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """What one sampling cycle read from one GPU. ``None`` = not supported / not read."""

    index: int
    uuid: str
    name: str
    minor_number: int | None = None
    pci_bus_id: str = ""
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST seen: values below are absent
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # nvmlMemory_v2_t.reserved (driver and firmware)
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    power_usage_milliwatts: int | None = None
    temperature_celsius: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    encoder_utilization: int | None = None
    decoder_utilization: int | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    clocks_event_reasons: int | None = None
    processes: tuple[ProcessUsage, ...] = ()
    # False when the running-process list could not be read this cycle (then attribution
    # must not conclude "nobody uses this GPU").
    processes_ok: bool = True
    util_samples: tuple[UtilSample, ...] = ()
    util_samples_ok: bool = True
    # A MIG device (uuid ``MIG-...``) stands in the node's device list instead of its physical
    # GPU, which it names here; minor number and bus id are the parent's.
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str = ""
    health: DeviceHealth = NO_HEALTH
    # A MIG device: its card's frame buffer (None where NVML does not tell it: in MIG mode it answers the
    # card's memory to a privileged caller only). The card's own, not the sum of its instances'.
    card_memory_total_bytes: int | None = None

    def without_values(self, *, lost: bool) -> DeviceSample:
        """The same device (identity, MIG identity included) with nothing read this cycle."""
        return DeviceSample(index=self.index, uuid=self.uuid, name=self.name, minor_number=self.minor_number,
                            pci_bus_id=self.pci_bus_id, lost=lost, processes_ok=False, util_samples_ok=False,
                            parent_uuid=self.parent_uuid, gpu_instance_id=self.gpu_instance_id,
                            compute_instance_id=self.compute_instance_id, mig_profile=self.mig_profile)


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One completed sampling cycle of every device on the node."""

    timestamp: float  # unix seconds when the cycle finished
    devices: tuple[DeviceSample, ...] = ()
    nvml_up: bool = True
    duration_seconds: float = 0.0
    # Cumulative error counts since start, keyed by (NVML call, error name).
    errors: Mapping[tuple[str, str], int] = field(default_factory=lambda: EMPTY)
    driver_version: str = ""
    # card uuid -> whether NVML offers GPM (profiling) on it (nvmlGpmQueryDeviceSupport; for a MIG card its
    # GPU instances' too), known from the first cycle on, while GPM values need two; a card not asked yet
    # or whose answer failed is absent.
    gpm_capable: Mapping[str, bool] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """Where /proc/<pid>/cgroup places a process: a pod and (usually) a container."""

    pod_uid: str  # dashed, lowercase
    container_id: str | None  # 64 hex; None for a pod-level cgroup
    runtime: str | None = None  # containerd | cri-o | docker | None (bare cgroupfs id)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """A container of a pod as the API describes it."""

    name: str
    index: int  # position in spec.containers (or spec.initContainers); some schemes index annotations by it
    container_id: str | None  # 64 hex, runtime prefix stripped; None until started
    limits: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    requests: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    init: bool = False  # one of spec.initContainers (index counts there)
    sidecar: bool = False  # an init container with restartPolicy Always: runs beside the others
    terminated: bool = False  # its status says it has terminated


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a Pod object the exporter uses."""

    uid: str
    name: str
    namespace: str
    node_name: str
    phase: str
    containers: tuple[ContainerInfo, ...]
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    workload_kind: str = "Pod"
    workload_name: str = ""
    resource_version: str = ""
    # spec.initContainers, in order: not attributed, but some schemes number their annotations over them
    init_containers: tuple[ContainerInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimResource:
    """kubelet pod-resources v1 ClaimResource: one DRA device, named by (driver, pool, device)."""

    driver_name: str
    pool_name: str
    device_name: str
    share_id: str = ""  # 1.35+, DRAConsumableCapacity only


@dataclass(frozen=True, slots=True)
class DynamicResource:
    """kubelet pod-resources v1 DynamicResource: one ResourceClaim a container names, with its devices."""

    claim_name: str  # the ResourceClaim object's name, not the pod-local reference
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResourcesContainer:
    """kubelet pod-resources v1 ContainerResources, devices flattened."""

    name: str
    devices: tuple[tuple[str, tuple[str, ...]], ...]  # (resource_name, device_ids)
    dynamic_resources: tuple[DynamicResource, ...] = ()  # DRA claims (empty before the 1.34 gate default)


@dataclass(frozen=True, slots=True)
class PodResources:
    """kubelet pod-resources v1 PodResources."""

    name: str
    namespace: str
    containers: tuple[PodResourcesContainer, ...]


@dataclass(frozen=True, slots=True)
class XidSummary:
    """The Xid watcher's counts as one cycle's outputs read them (the status page, dcgm-compat)."""

    counts: Mapping[tuple[str, int], int] = field(default_factory=lambda: EMPTY)  # (uuid, xid) -> count, all pods
    latest: Mapping[str, tuple[float, int]] = field(default_factory=lambda: EMPTY)  # uuid -> (unix time, Xid)
    # (uuid, xid, namespace, pod, container) -> (count, unix time of the latest); "" where no pod is known
    by_pod: Mapping[tuple[str, int, str, str, str], tuple[int, float]] = field(default_factory=lambda: EMPTY)
