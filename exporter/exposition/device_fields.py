"""Per-device values declared once: the table every output of a GPU's scalar values reads.

One :class:`DeviceField` per model value of a device (a ``DeviceSample``, ``DeviceHealth`` or
``GpmSample`` field): the NVML read it comes from, its native family (name, type, unit, help, the
scale from the model's unit), its dcgm-exporter field(s), its ``/status.json`` key and ``top``
column, and its row in docs/metrics.md. ``rows.py`` and ``health_rows.py`` build the native scalar
families in table order, ``dcgm.py`` the ``DCGM_FI_*`` series, ``status.py`` the status keys, ``top``
and the status page the extra columns, and :func:`fields_markdown` the generated tables of
docs/metrics.md (tests/test_device_fields.py fails when it is stale).

Values with labels of their own (ECC by type, retired pages by cause, row remaps by type) and the
allocation rows keep their hand-built families (``family=""``); the table still carries their
DCGM fields and status keys. The NVML reads are functions in exporter/node/nvml/ (one error policy
per call): node/ may not import exposition/, so the table names the read (``nvml``) for the docs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from exporter.model import DeviceSample

MIB = 2**20


@dataclass(frozen=True, slots=True)
class Dcgm:
    """One dcgm-exporter field served from a model value (names, types, help: its default-counters.csv)."""

    name: str
    kind: str  # gauge | counter, as dcgm-exporter types it
    help: str
    factor: float = 1  # DCGM units per model unit (multiplied)
    card: bool = True  # the physical card's (once per card); False: each handle's own (MIG devices too)
    whole_mib: bool = False  # bytes reported as whole MiB, as DCGM does
    unit: str = ""  # DCGM's unit, for the docs
    note: str = ""  # docs/metrics.md: where it differs from dcgm-exporter's


@dataclass(frozen=True, slots=True)
class DeviceField:
    """One per-device value and every place it is served."""

    attr: str  # DeviceSample field, "health.<DeviceHealth field>" or "gpm.<GpmSample field>"
    nvml: str  # the NVML read (exporter/node/nvml/fields.py, health.py, gpm.py), for the docs
    group: str  # device (rows.py device families) | health (health_rows.py) | gpm | rows (hand-built)
    family: str = ""  # native family (counters without _total); "" = built by hand, with labels of its own
    kind: str = "gauge"
    unit: str = ""
    help: str = ""
    factor: float = 1  # native = model value * factor / divisor
    divisor: float = 1
    use: str = ""  # docs/metrics.md: what it tells, what the operator does with it
    dcgm: tuple[Dcgm, ...] = ()
    status: str = ""  # /status.json key of the GPU entry ("" = none or built by hand)
    status_divisor: float = 1
    column: str = ""  # extra column of `top` and the status page ("" = none)
    # the same value read straight through pynvml, for the fake NVML's tests and scripts/device-check.py
    # (exporter/node/nvml/direct.py: `call(CONSTANT, ...)` then `.attr`/`[i]`; "" = read by hand there)
    read: str = ""


def value(f: DeviceField, d: DeviceSample) -> int | float | None:
    """The model value of ``f`` on ``d`` (None: not supported, not read, no GPM)."""
    where, _, name = f.attr.rpartition(".")
    if where == "health":
        return getattr(d.health, name)
    if where == "gpm":
        return None if d.health.gpm is None else getattr(d.health.gpm, name)
    return getattr(d, name)


def native(f: DeviceField, v: int | float) -> float:
    """The native family's value: base units."""
    return v * f.factor / f.divisor


def status_value(f: DeviceField, v: int | float | None) -> int | float | None:
    return v if v is None or f.status_divisor == 1 else v / f.status_divisor


def dcgm_value(f: Dcgm, v: int | float | None) -> float | None:
    if v is None:
        return None
    return float(v // MIB) if f.whole_mib else v * f.factor


def _g(attr: str, nvml: str, family: str, unit: str, help: str, use: str, *dcgm: Dcgm, group: str = "health",
       **kw: object) -> DeviceField:
    return DeviceField(attr, nvml, group, family,
         unit=unit, help=help, use=use, dcgm=dcgm, **kw)  # type: ignore[arg-type]


def _c(attr: str, nvml: str, family: str, unit: str, help: str, use: str, *dcgm: Dcgm, group: str = "health",
       **kw: object) -> DeviceField:
    return DeviceField(attr, nvml, group, family, "counter", unit=unit, help=help, use=use, dcgm=dcgm,
                       **kw)  # type: ignore[arg-type]


def _gpm(attr: str, metric: str, family: str, help: str, use: str, dcgm: Dcgm) -> DeviceField:
    # each handle's own: a MIG device's GPM is its GPU instance's (nvmlGpmMigSampleGet), not its card's
    return DeviceField(f"gpm.{attr}", f"`nvmlGpmMetricsGet` `{metric}` / 100", "gpm", family, unit="ratio 0..1",
                       help=help, use=use, dcgm=(replace(dcgm, card=False),))


_PCIE_NOTE = "KB/s x 1024; DCGM's profiling counter also counts protocol headers"
# In the order the families are served: the allocation rows' values, the device families, the health
# families, GPM. A new field goes where its family should appear.
DEVICE_FIELDS: tuple[DeviceField, ...] = (
    # the allocation rows (rows.py build the nvidia_gpu_* rows per allocate_mode and container)
    _g("utilization_gpu", "`nvmlDeviceGetUtilizationRates` `.gpu`", "", "percent", "", "",
       Dcgm("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", card=False, unit="%"),
       group="rows", status="utilization_percent"),
    _g("memory_used_bytes", "`nvmlDeviceGetMemoryInfo`", "", "bytes", "", "", group="rows",
       status="memory_used_bytes"),
    _g("memory_total_bytes", "`nvmlDeviceGetMemoryInfo`", "", "bytes", "", "",
       Dcgm("DCGM_FI_DEV_FB_TOTAL", "gauge", "Total framebuffer memory (in MiB).", card=False, whole_mib=True,
            unit="MiB (whole)"),
       group="rows", status="memory_total_bytes"),
    _g("power_usage_milliwatts", "`nvmlDeviceGetPowerUsage`", "", "milliwatts", "", "",
       Dcgm("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", 1e-3, unit="W"),
       group="rows", status="power_watts", status_divisor=1000),
    _g("temperature_celsius", "`nvmlDeviceGetTemperature` GPU", "", "celsius", "", "",
       Dcgm("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
            unit="C"), group="rows", status="temperature_celsius"),
    _c("ecc_corrected_total", "`nvmlDeviceGetTotalEccErrors` corrected, volatile", "", "count", "", "",
       Dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
            unit="errors"),
       group="rows"),
    _c("ecc_uncorrected_total", "`nvmlDeviceGetTotalEccErrors` uncorrected, volatile", "", "count", "", "",
       Dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
            unit="errors"),
       group="rows"),
    # the device families (rows.py)
    _g("utilization_memory", "`nvmlDeviceGetUtilizationRates` `.memory`", "nvidia_gpu_memory_utilization",
       "percent", "Percent of time device memory was read or written", "memory-bandwidth-bound work",
       Dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", card=False, unit="%"),
       group="device", status="memory_utilization_percent"),
    _g("sm_clock_mhz", "`nvmlDeviceGetClockInfo` SM", "nvidia_gpu_sm_clock_hertz", "hertz", "SM clock in hertz",
       "a loaded GPU far below its boost clock is throttled (see the clocks event reasons)",
       Dcgm("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", unit="MHz"), group="device", factor=1e6),
    _g("memory_clock_mhz", "`nvmlDeviceGetClockInfo` MEM", "nvidia_gpu_memory_clock_hertz", "hertz",
       "Memory clock in hertz", "below the card's rated memory clock under load: memory throttled",
       Dcgm("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
            unit="MHz"), group="device", factor=1e6),
    _g("encoder_utilization", "`nvmlDeviceGetEncoderUtilization`", "nvidia_gpu_encoder_utilization", "percent",
       "Encoder utilization in percent", "video encoding (NVENC) load",
       Dcgm("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", card=False, unit="%"), group="device"),
    _g("decoder_utilization", "`nvmlDeviceGetDecoderUtilization`", "nvidia_gpu_decoder_utilization", "percent",
       "Decoder utilization in percent", "video decoding (NVDEC) load",
       Dcgm("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", card=False, unit="%"), group="device"),
    _g("clocks_event_reasons", "`nvmlDeviceGetCurrentClocksEventReasons`", "nvidia_gpu_clocks_event_reasons",
       "bitmask", "Bitmask of current clocks event (throttle) reasons",
       "the raw mask; decoded in `nvidia_gpu_clocks_event_reason` (below)",
       Dcgm("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event (throttle) reasons, a bitmask.",
            unit="bitmask"),
       # the field's name before DCGM 3.3; alerts in use still read it (tests/data/dcgm/SOURCE.md)
       Dcgm("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons, a bitmask.",
            unit="bitmask", note="the field's name before DCGM 3.3"),
       group="device"),
    # the health families (health_rows.py)
    _c("health.energy_millijoules", "`nvmlDeviceGetTotalEnergyConsumption` (mJ / 1000)",
       "nvidia_gpu_energy_consumption_joules", "joules",
       "Energy the GPU consumed since the driver loaded, in joules (nvmlDeviceGetTotalEnergyConsumption)",
       "`rate()` is the mean power in watts over the window; energy accounting",
       Dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
            unit="mJ"),
       divisor=1000, status="energy_joules", status_divisor=1000, read="nvmlDeviceGetTotalEnergyConsumption"),
    _g("memory_reserved_bytes", "`nvmlDeviceGetMemoryInfo` v2 `reserved` (per MIG device too)",
       "nvidia_gpu_memory_reserved_bytes", "bytes",
       "Device memory reserved by the driver and firmware, in bytes (nvmlDeviceGetMemoryInfo v2 reserved)",
       "memory held by driver and firmware, never usable by pods",
       Dcgm("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", card=False,
            whole_mib=True, unit="MiB (whole)")),
    _g("health.power_limit_milliwatts", "`nvmlDeviceGetEnforcedPowerLimit` (mW / 1000)",
       "nvidia_gpu_power_limit_watts", "watts", "Enforced power limit in watts (nvmlDeviceGetEnforcedPowerLimit)",
       "compare draw with the limit: a GPU pinned at its limit is power-capped",
       Dcgm("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Effective power limit the driver enforces (in W).", 1e-3,
            unit="W"),
       divisor=1000, status="power_limit_watts", status_divisor=1000, read="nvmlDeviceGetEnforcedPowerLimit"),
    _g("health.fan_speed_percent", "`nvmlDeviceGetFanSpeed` (% / 100)", "nvidia_gpu_fan_speed_ratio", "ratio 0..1",
       "Fan speed as a ratio of its maximum, 0..1 (nvmlDeviceGetFanSpeed)",
       "a fan at 0 on a hot air-cooled GPU is a failed fan: replace",
       Dcgm("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (in 0-100%).", unit="%"), divisor=100,
       read="nvmlDeviceGetFanSpeed"),
    _g("health.performance_state", "`nvmlDeviceGetPerformanceState` (unknown = no row)",
       "nvidia_gpu_performance_state", "0..15",
       "Performance state, 0 (P0, maximum) to 15 (nvmlDeviceGetPerformanceState)",
       "P0 is maximum performance; a loaded GPU stuck in a high P-state is throttled",
       Dcgm("DCGM_FI_DEV_PSTATE", "gauge", "Performance state (P-State) 0-15, 0 = highest.", unit="0-15"),
       read="nvmlDeviceGetPerformanceState"),
    _g("health.memory_temperature_celsius", "`nvmlDeviceGetFieldValues` `NVML_FI_DEV_MEMORY_TEMP`",
       "nvidia_gpu_memory_temperature_celsius", "celsius",
       "Memory (HBM) temperature in celsius (nvmlDeviceGetFieldValues NVML_FI_DEV_MEMORY_TEMP)",
       "HBM temperature: check cooling before the memory throttles",
       Dcgm("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", unit="C"),
       read="nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)"),
    _g("health.pcie_tx_kilobytes_per_second", "`nvmlDeviceGetPcieThroughput` TX (KB/s * 1024)",
       "nvidia_gpu_pcie_transmit_bytes_per_second", "bytes/s",
       "PCIe transmit throughput in bytes per second (nvmlDeviceGetPcieThroughput TX_BYTES)",
       "host-to-device traffic: a data loader starving the GPU",
       Dcgm("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus, in bytes per "
            "second (NVML PCIe throughput).", 1024, unit="bytes/s", note=_PCIE_NOTE), factor=1024,
       read="nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)"),
    _g("health.pcie_rx_kilobytes_per_second", "`nvmlDeviceGetPcieThroughput` RX (KB/s * 1024)",
       "nvidia_gpu_pcie_receive_bytes_per_second", "bytes/s",
       "PCIe receive throughput in bytes per second (nvmlDeviceGetPcieThroughput RX_BYTES)",
       "device-to-host traffic",
       Dcgm("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus, in bytes per "
            "second (NVML PCIe throughput).", 1024, unit="bytes/s", note=_PCIE_NOTE), factor=1024,
       read="nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)"),
    _g("health.pcie_link_generation", "`nvmlDeviceGetCurrPcieLinkGeneration`", "nvidia_gpu_pcie_link_generation",
       "generation", "Current PCIe link generation (nvmlDeviceGetCurrPcieLinkGeneration)",
       "lower than the card's maximum under load: a degraded link, reseat",
       Dcgm("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", unit="generation"),
       read="nvmlDeviceGetCurrPcieLinkGeneration"),
    _g("health.pcie_link_width", "`nvmlDeviceGetCurrPcieLinkWidth`", "nvidia_gpu_pcie_link_width", "lanes",
       "Current PCIe link width in lanes (nvmlDeviceGetCurrPcieLinkWidth)",
       "narrower than the card's maximum: a degraded link, reseat",
       Dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.", unit="lanes"),
       read="nvmlDeviceGetCurrPcieLinkWidth"),
    _g("health.retired_pages_pending", "`nvmlDeviceGetRetiredPagesPendingStatus`", "nvidia_gpu_retired_pages_pending",
       "0/1", "1 while retired pages wait for a GPU reset to take effect (nvmlDeviceGetRetiredPagesPendingStatus)",
       "1: drain and **reset** the GPU so the retirement takes effect",
       Dcgm("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement.", unit="pages"),
       read="nvmlDeviceGetRetiredPagesPendingStatus"),
    _g("health.remapped_rows_pending", "`nvmlDeviceGetRemappedRows` `isPending`", "nvidia_gpu_remapped_rows_pending",
       "0/1", "1 while a row remap waits for a GPU reset: reset the GPU (nvmlDeviceGetRemappedRows isPending)",
       "1: drain and **reset** the GPU to apply the remap",
       Dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending (reset the GPU)",
            unit="0/1"), read="nvmlDeviceGetRemappedRows[2]"),
    _g("health.remapped_rows_failure", "`nvmlDeviceGetRemappedRows` `failureOccurred`",
       "nvidia_gpu_remapped_rows_failure", "0/1",
       "1 once a row remap failed: replace the GPU (nvmlDeviceGetRemappedRows failureOccurred)",
       "1: remapping failed, the GPU is out of spare rows: **replace** it",
       Dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", unit="0/1"),
       read="nvmlDeviceGetRemappedRows[3]"),
    _c("health.pcie_replay_count", "`nvmlDeviceGetPcieReplayCounter`", "nvidia_gpu_pcie_replays", "count",
       "PCIe replays since the driver loaded (nvmlDeviceGetPcieReplayCounter)",
       "a rising rate is a bad PCIe link (riser, slot, cable): reseat or replace",
       Dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", unit="retries"),
       read="nvmlDeviceGetPcieReplayCounter"),
    _c("health.power_violation_nanoseconds", "`nvmlDeviceGetViolationStatus` `NVML_PERF_POLICY_POWER` (ns / 1e9)",
       "nvidia_gpu_power_violation_seconds", "seconds",
       "Time the power limit held the clocks down since the driver loaded, in seconds (nvmlDeviceGetViolationStatus)",
       "`rate()` is the fraction of time the GPU was power-capped: raise the limit or spread the load",
       Dcgm("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns).",
            unit="ns"),
       divisor=1e9, status="power_capped_seconds", status_divisor=1e9, column="Power capped s",
       read="nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER).violationTime"),
    # labelled health families, built by hand (health_rows.py): retired pages by cause, rows by type
    _c("health.retired_pages_single_bit", "`nvmlDeviceGetRetiredPages`", "", "pages", "", "",
       Dcgm("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors.",
            unit="pages")),
    _c("health.retired_pages_double_bit", "`nvmlDeviceGetRetiredPages`", "", "pages", "", "",
       Dcgm("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors.",
            unit="pages")),
    _c("health.remapped_rows_uncorrectable", "`nvmlDeviceGetRemappedRows`", "", "rows", "", "",
       Dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors",
            unit="rows"), read="nvmlDeviceGetRemappedRows[1]"),
    _c("health.remapped_rows_correctable", "`nvmlDeviceGetRemappedRows`", "", "rows", "", "",
       Dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
            unit="rows"), read="nvmlDeviceGetRemappedRows[0]"),
    # GPM (Hopper and newer): DCGM's profiling fields, absent elsewhere (never 0)
    _gpm("graphics_active", "GRAPHICS_UTIL", "nvidia_gpu_graphics_engine_active_ratio",
         "Ratio of time the graphics or compute engine was active (nvmlGpmMetricsGet GRAPHICS_UTIL)",
         "time the graphics/compute engine was busy",
         Dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
              unit="ratio 0-1")),
    _gpm("sm_active", "SM_UTIL", "nvidia_gpu_sm_active_ratio",
         "Ratio of time the SMs were active (nvmlGpmMetricsGet SM_UTIL)",
         "the SM-level truth `nvidia_gpu_duty_cycle` approximates",
         Dcgm("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
              unit="ratio 0-1")),
    _gpm("sm_occupancy", "SM_OCCUPANCY", "nvidia_gpu_sm_occupancy_ratio",
         "Ratio of resident warps to the SMs' maximum (nvmlGpmMetricsGet SM_OCCUPANCY)",
         "resident warps per SM maximum; low with high SM activity = small kernels",
         Dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
              unit="ratio 0-1")),
    _gpm("tensor_active", "ANY_TENSOR_UTIL", "nvidia_gpu_tensor_pipe_active_ratio",
         "Ratio of time any tensor pipe was active (nvmlGpmMetricsGet ANY_TENSOR_UTIL)",
         "how much of the tensor cores the job uses",
         Dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
              unit="ratio 0-1")),
    _gpm("dram_active", "DRAM_BW_UTIL", "nvidia_gpu_dram_active_ratio",
         "Ratio of time device memory was read or written (nvmlGpmMetricsGet DRAM_BW_UTIL)",
         "memory-bandwidth-bound jobs sit near 1",
         Dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending "
              "or receiving data.", unit="ratio 0-1")),
)


def in_group(group: str) -> tuple[DeviceField, ...]:
    """The fields of ``group`` that have a native family of their own, in table order."""
    return tuple(f for f in DEVICE_FIELDS if f.group == group and f.family)


def ordered(names: Iterable[str], first: Iterable[str]) -> list[str]:
    """``names`` with those of ``first`` first, in that order (an output's order before this table), the rest
    in table order."""
    names, first = list(names), list(first)
    return [n for n in first if n in names] + [n for n in names if n not in first]


COLUMNS: tuple[DeviceField, ...] = tuple(f for f in DEVICE_FIELDS if f.column)


DOC_SECTIONS = {"device": ("device",), "health": ("health", "gpm")}  # docs/metrics.md's generated tables


def fields_markdown(section: str) -> str:
    """A generated table of docs/metrics.md: the native families of the groups of ``section``."""
    head = ("| family | type | unit | NVML read | dcgm-exporter (`--dcgm-compat`) | what it tells |\n"
            "| --- | --- | --- | --- | --- | --- |\n")
    rows = []
    for f in DEVICE_FIELDS:
        if not f.family or f.group not in DOC_SECTIONS[section]:
            continue
        name = f"{f.family}_total" if f.kind == "counter" else f.family
        dcgm = ", ".join(f"`{d.name}`" for d in f.dcgm)
        rows.append(f"| `{name}` | {f.kind} | {f.unit} | {f.nvml} | {dcgm} | {f.use} |\n")
    return head + "".join(rows)
