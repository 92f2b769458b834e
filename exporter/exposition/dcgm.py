"""dcgm-exporter compatible series (``--dcgm-compat``): ``DCGM_FI_*`` families for existing dashboards and alerts.

Pure: one attributed sample in, metric families out, with dcgm-exporter's names, types, units and
labels (its etc/default-counters.csv and render template, release 4.5.3-4.8.2; docs/metrics.md
"DCGM compatibility"). Units are DCGM's: framebuffer in MiB, power in W, energy in mJ, clocks in
MHz, temperatures in C, PROF_* as ratios. Counters keep DCGM's bare names (no ``_total``).

Where it differs from dcgm-exporter, on purpose:

* a shared GPU's series appear once, without pod labels (dcgm-exporter repeats the device value
  for every pod); each container's share is in the native ``nvidia_gpu_*`` per-container series;
* ``Hostname`` is the node name (dcgm-exporter's is its own host name: the pod's, in a cluster);
* on a MIG card the card's own fields (power, temperatures, clocks, energy, health) appear once
  per card, without ``GPU_I_*``; the MIG devices carry their memory, utilization and GPM
  (``DCGM_FI_PROF_*``, their GPU instance's: Hopper and newer) and the pod labels of their holder.
  ``UUID`` is the card's on both, as dcgm-exporter's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.attribution.attribute import EXCLUSIVE, NodeAttribution
from exporter.exposition.device_fields import DEVICE_FIELDS, Dcgm, DeviceField, dcgm_value, ordered, value
from exporter.model import DeviceSample, NodeSample, NvLinkSample

MIB = 2**20
Value = Callable[[DeviceSample], float | None]


@dataclass(frozen=True, slots=True)
class Field:
    """One DCGM field as dcgm-exporter exposes it."""

    name: str
    kind: str  # gauge | counter, as dcgm-exporter's CSV types it
    help: str
    value: Value
    unit: str = ""  # docs/metrics.md's table (dcgm_markdown)
    source: str = ""


def _used_mib(d: DeviceSample) -> float | None:
    """DCGM's FB_USED excludes the reserved memory (nvmlMemory_v2_t.used); our used is v1's, which includes it."""
    if d.memory_used_bytes is None:
        return None
    return float(max(0, d.memory_used_bytes - (d.memory_reserved_bytes or 0)) // MIB)  # DCGM reports whole MiB


def _free_mib(d: DeviceSample) -> float | None:
    if d.memory_total_bytes is None or d.memory_used_bytes is None:
        return None
    return float(max(0, d.memory_total_bytes - d.memory_used_bytes) // MIB)


def _link_sum(links: Iterable[NvLinkSample], *attrs: str) -> float | None:
    """The sum of ``attrs`` over the links that report them; None when none does."""
    values = [getattr(n, a) for n in links for a in attrs if getattr(n, a) is not None]
    return float(sum(values)) if values else None


def _spec_field(f: DeviceField, d: Dcgm) -> Field:
    native = f"`{f.family}_total`" if f.family and f.kind == "counter" else f"`{f.family}`" if f.family else f.nvml
    source = f"{native} ({d.note})" if d.note else native
    return Field(d.name, d.kind, d.help, lambda sample: dcgm_value(d, value(f, sample)), d.unit, source)


_LINK_ERRORS = "`nvidia_gpu_nvlink_errors_total` of its `type`, summed over the links"
# Fields computed from more than one model value; the others come from the device field table.
_COMPUTED: tuple[tuple[bool, Field], ...] = (  # (the card's, field)
    (False, Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _free_mib, "MiB (whole)",
                  "total - used")),
    (False, Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _used_mib, "MiB (whole)",
                  "used without the reserved memory (`nvmlMemory_v2` `used`)")),
    (True, Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for "
                 "all lanes (data bytes sent and received).",
                 lambda d: _link_sum(d.health.nvlinks, "tx_bytes", "rx_bytes"), "bytes",
                 "NVLink data sent plus received, summed over the links")),
    (True, Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink flow-control "
                 "CRC errors.", lambda d: _link_sum(d.health.nvlinks, "crc_errors"), "errors", _LINK_ERRORS)),
    (True, Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.",
                 lambda d: _link_sum(d.health.nvlinks, "replay_errors"), "errors", _LINK_ERRORS)),
    (True, Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery "
                 "errors.", lambda d: _link_sum(d.health.nvlinks, "recovery_errors"), "errors", _LINK_ERRORS)),
)
# The order the series were served in before the table (kept: the text stays byte for byte); a field
# the table adds follows these, in table order.
_INSTANCE_ORDER = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
                   "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_TOTAL")
_CARD_ORDER = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_FAN_SPEED", "DCGM_FI_DEV_PSTATE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)


def _fields(card: bool, order: tuple[str, ...], gpm: bool = False) -> tuple[Field, ...]:
    by_name = {d.name: _spec_field(f, d) for f in DEVICE_FIELDS for d in f.dcgm
               if d.card == card and (f.group == "gpm") == gpm}
    by_name |= {f.name: f for c, f in _COMPUTED if c == card and not gpm}
    return tuple(by_name[n] for n in ordered(by_name, order))


# What each handle answers for itself: a MIG device its own memory and utilization.
INSTANCE_FIELDS: tuple[Field, ...] = _fields(False, _INSTANCE_ORDER)
# What the physical GPU answers (a MIG device repeats its card's: exposed once per card).
CARD_FIELDS: tuple[Field, ...] = _fields(True, _CARD_ORDER)
# GPM (DCGM_FI_PROF_*): each handle's own, a MIG device's its GPU instance's; served after the card's fields.
GPM_FIELDS: tuple[Field, ...] = _fields(False, (), gpm=True)
XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = "Value of the last XID error encountered."
XID_SOURCE = ("the last Xid the watcher counted on the card or one of its MIG devices (label `err_code`), 0 before "
              "the first; absent with `--no-xid` or no Xid source")
FAMILY_NAMES = (*(f.name for f in INSTANCE_FIELDS), *(f.name for f in CARD_FIELDS), *(f.name for f in GPM_FIELDS),
                XID_FAMILY)
# Labels every series carries, in dcgm-exporter's order; MIG devices add GPU_I_PROFILE, GPU_I_ID after modelName.
BASE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
               "container", "namespace", "pod")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")

Labels = dict[str, str]


def _labels(d: DeviceSample, host: str, driver: str, holder: tuple[str, str, str], mig: bool) -> Labels:
    """One series' labels; ``holder`` is (container, namespace, pod), empty when no one holds it whole."""
    card_uuid = d.parent_uuid or d.uuid
    model = d.name.removesuffix(f" MIG {d.mig_profile}") if d.mig_profile else d.name
    out = {"gpu": str(d.index), "UUID": card_uuid, "pci_bus_id": d.pci_bus_id, "device": f"nvidia{d.index}",
           "modelName": model}
    if mig:
        out |= {"GPU_I_PROFILE": d.mig_profile, "GPU_I_ID": "" if d.gpu_instance_id is None else
                str(d.gpu_instance_id)}
    container, namespace, pod = holder
    return out | {"Hostname": host, "DCGM_FI_DRIVER_VERSION": driver, "container": container,
                  "namespace": namespace, "pod": pod}


NO_HOLDER = ("", "", "")


def _holders(attr: NodeAttribution) -> dict[str, tuple[str, str, str]]:
    """uuid -> (container, namespace, pod) of the container holding that device whole."""
    out = {}
    for da in attr.devices:
        if da.mode == EXCLUSIVE and len(da.users) == 1:
            u = da.users[0]
            out[da.device.uuid] = (u.container, u.pod.namespace, u.pod.name)
    return out


class _Out:
    """Families by name, in first-use order; dcgm-exporter's counters keep their bare names.

    A label set is served once: the compute instances of one GPU instance, unheld (or held by one
    container), carry the same labels (``GPU_I_ID`` names the GPU instance) and the same values (its
    memory, its GPM), and a scrape with a series twice is refused by Prometheus."""

    def __init__(self) -> None:
        self.fams: dict[str, Metric] = {}
        self._seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def add(self, name: str, kind: str, doc: str, labels: Labels, value: float | None) -> None:
        if value is None:
            return  # not supported or not read: no series rather than a made-up 0
        key = (name, tuple(labels.items()))
        if key in self._seen:
            return
        self._seen.add(key)
        fam = self.fams.get(name)
        if fam is None:
            # Metric (not CounterMetricFamily) keeps the name; snapshot.render adds no _total to it.
            fam = self.fams[name] = Metric(name, doc, kind)
        fam.samples.append(Sample(name, labels, float(value)))


def dcgm_families(attr: NodeAttribution, sample: NodeSample, hostname: str,
                  last_xid: Mapping[str, tuple[float, int]] | None = None) -> list[Metric]:
    """The DCGM_FI_* families of one cycle.

    ``last_xid``: uuid -> (unix time, Xid) of the latest Xid per device (a card's or one of its MIG
    devices'); None when no Xid watcher runs, then ``DCGM_FI_DEV_XID_ERRORS`` is absent rather than 0.
    """
    out = _Out()
    holders = _holders(attr)
    cards_seen: set[str] = set()
    for d in sample.devices:
        if d.lost:
            continue  # NVML_ERROR_GPU_IS_LOST: nothing was read
        mig = d.parent_uuid is not None
        own = _labels(d, hostname, sample.driver_version, holders.get(d.uuid, NO_HOLDER), mig)
        for f in INSTANCE_FIELDS:
            out.add(f.name, f.kind, f.help, own, f.value(d))
        card_uuid = d.parent_uuid or d.uuid
        if card_uuid in cards_seen:
            _add_all(out, GPM_FIELDS, own, d)
            continue
        cards_seen.add(card_uuid)
        # A MIG card is shared by its MIG devices' holders: its own series carry no pod.
        card = _labels(d, hostname, sample.driver_version, NO_HOLDER, False) if mig else own
        _add_all(out, CARD_FIELDS, card, d)
        _add_all(out, GPM_FIELDS, own, d)  # after the card's fields, where they were before MIG had them
        if last_xid is not None:
            xid = _card_xid(card_uuid, sample.devices, last_xid)
            out.add(XID_FAMILY, "gauge", XID_HELP, {**card, "err_code": str(xid)}, xid)
    return list(out.fams.values())


def _add_all(out: _Out, fields: Iterable[Field], labels: Labels, d: DeviceSample) -> None:
    for f in fields:
        out.add(f.name, f.kind, f.help, labels, f.value(d))


def _card_xid(card_uuid: str, devices: Iterable[DeviceSample], last_xid: Mapping[str, tuple[float, int]]) -> int:
    """The latest Xid of the card or any of its MIG devices; 0 (DCGM's "No Error") before the first."""
    uuids = {card_uuid} | {d.uuid for d in devices if d.parent_uuid == card_uuid}
    seen = [last_xid[u] for u in uuids if u in last_xid]
    return max(seen)[1] if seen else 0


def dcgm_markdown() -> str:
    """docs/metrics.md's table of the DCGM series (generated: tests/test_device_fields.py checks it)."""
    rows = [f"| `{f.name}` | {f.kind} | {f.unit} | {f.source}; per device and per MIG device |\n"
            for f in INSTANCE_FIELDS]
    rows += [f"| `{f.name}` | {f.kind} | {f.unit} | {f.source} |\n" for f in CARD_FIELDS]
    rows += [f"| `{f.name}` | {f.kind} | {f.unit} | {f.source}; per device and per MIG device (its GPU instance's) |\n"
             for f in GPM_FIELDS]
    rows.append(f"| `{XID_FAMILY}` | gauge | Xid | {XID_SOURCE} |\n")
    return "| series | type | unit | from |\n| --- | --- | --- | --- |\n" + "".join(rows)
