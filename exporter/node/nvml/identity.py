"""Device identity: what a GPU or MIG handle says about itself, MIG mode and MIG enumeration.

* Devices are enumerated once per successful init (count, then a handle per index), and
  their identity (UUID, name, minor number, PCI bus id) is cached: NVML does not hot-plug
  devices within a session, so re-enumerating every cycle would only cost calls.

MIG (docs/metrics.md, "MIG"):

* ``nvmlDeviceGetMigMode`` is asked every cycle (a GPU's MIG mode can change within a session).
  NotSupported means the GPU is not MIG-capable and it is not asked again this session; a driver
  without the MIG calls (FunctionNotFound, before R450) means no GPU is in MIG mode. Neither is an
  error. Any other failure is counted and the mode last read is kept.
* MIG devices are enumerated every cycle (MIG devices can be created and destroyed at any time):
  ``nvmlDeviceGetMaxMigDeviceCount``, then ``nvmlDeviceGetMigDeviceHandleByIndex`` for each slot,
  where NotFound is an empty slot. The UUID of each handle is read every cycle; name, GPU and
  compute instance ids once per UUID. The profile is the name's suffix after " MIG "
  (``NVIDIA A100-SXM4-80GB MIG 3g.40gb``). A slot whose handle cannot be had this cycle keeps the
  MIG device found there before, without values; a failed count keeps the last enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

from exporter.model import DeviceSample
from exporter.node.nvml.errors import CallErrors, FunctionMissing, error_name


def mig_profile(name: str) -> str:
    """``3g.40gb`` of ``NVIDIA A100-SXM4-80GB MIG 3g.40gb``; "" for a name without " MIG "."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() if sep else ""


@dataclass
class Mig:
    """A MIG device of a card, as the latest enumeration found it."""

    slot: int
    handle: Any = None  # None: the slot's handle could not be had this cycle
    uuid: str = ""
    name: str = ""
    profile: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    identity_ok: bool = False
    last_seen_us: int = 0


@dataclass
class Device:
    """What the backend keeps about one device index (a physical GPU) between cycles."""

    index: int
    handle: Any = None
    uuid: str = ""
    name: str = ""
    minor_number: int | None = None
    pci_bus_id: str = ""
    identity_ok: bool = False
    last_seen_us: int = 0
    lost: bool = False
    lost_failures: int = 0
    next_probe_at: float = 0.0
    mig_capable: bool = True  # False once nvmlDeviceGetMigMode said NotSupported
    mig_mode: bool = False  # as last read
    migs: list[Mig] = field(default_factory=list)  # in MIG mode: its MIG devices, by slot


def absent_mig(dev: Device, m: Mig, *, lost: bool) -> DeviceSample:
    """A MIG device's row with its identity and no values."""
    return DeviceSample(index=dev.index, uuid=m.uuid, name=m.name, minor_number=dev.minor_number,
                        pci_bus_id=dev.pci_bus_id, lost=lost, processes_ok=False, util_samples_ok=False,
                        parent_uuid=dev.uuid, gpu_instance_id=m.gpu_instance_id,
                        compute_instance_id=m.compute_instance_id, mig_profile=m.profile)


def absent(dev: Device, *, lost: bool) -> tuple[DeviceSample, ...]:
    """Rows without values: the MIG devices last found on a card in MIG mode, else the card."""
    if dev.mig_mode and dev.migs:
        return tuple(absent_mig(dev, m, lost=lost) for m in dev.migs)
    return (DeviceSample(index=dev.index, uuid=dev.uuid, name=dev.name, minor_number=dev.minor_number,
                         pci_bus_id=dev.pci_bus_id, lost=lost, processes_ok=False, util_samples_ok=False),)


class IdentityReader:
    """Reads and caches identity, MIG mode and MIG devices; failures go to ``errors``."""

    def __init__(self, errors: CallErrors) -> None:
        """Count failed calls in ``errors``."""
        self._errors = errors
        self._no_mig = False  # driver predates the MIG calls

    def open(self, dev: Device) -> bool:
        """Get the device's handle and identity unless known; False when there is no handle this cycle."""
        if dev.handle is None:
            dev.handle = self._errors.call("nvmlDeviceGetHandleByIndex", dev.index)
            if dev.handle is None:
                return False
        if not dev.identity_ok:
            self.read_identity(dev)
        return True

    def read_identity(self, dev: Device) -> None:
        """UUID, name, minor number and PCI bus id of a GPU; values that failed keep what was known."""
        h = dev.handle
        errors_before = self._errors.events
        uuid = self._errors.call("nvmlDeviceGetUUID", h)
        name = self._errors.call("nvmlDeviceGetName", h)
        minor = self._errors.call("nvmlDeviceGetMinorNumber", h)
        pci = self._errors.call("nvmlDeviceGetPciInfo", h)
        dev.uuid = uuid or dev.uuid
        dev.name = name or dev.name
        dev.minor_number = minor if minor is not None else dev.minor_number
        dev.pci_bus_id = pci.busId if pci is not None else dev.pci_bus_id
        # identity never changes within a session; read again only after a failed read
        dev.identity_ok = uuid is not None and self._errors.events == errors_before

    def in_mig_mode(self, dev: Device) -> bool:
        """Whether the GPU is in MIG mode now (the mode last read when this cycle's read failed)."""
        if self._no_mig or not dev.mig_capable:
            return False
        errors_before = self._errors.events
        try:
            mode = self._errors.call("nvmlDeviceGetMigMode", dev.handle, fallback=True)
        except FunctionMissing:
            self._no_mig = True  # a driver before MIG: every GPU is whole
            return False
        if mode is None:
            if self._errors.events == errors_before:
                dev.mig_capable = False  # NotSupported: not a MIG-capable GPU, no need to ask again
                return False
            return dev.mig_mode  # unknown this cycle (counted): keep what was last read
        dev.mig_mode = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE  # (current, pending)
        return dev.mig_mode

    def enumerate_migs(self, dev: Device) -> list[Mig]:
        """The card's MIG devices this cycle, by slot. Raises DeviceLost."""
        count = self._errors.call("nvmlDeviceGetMaxMigDeviceCount", dev.handle)
        if count is None:
            return dev.migs  # not this cycle (counted): the MIG devices found last time
        known = {m.slot: m for m in dev.migs}
        found: list[Mig] = []
        call = "nvmlDeviceGetMigDeviceHandleByIndex"
        for slot in range(count):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot
            except pynvml.NVMLError_NotSupported:
                return []  # MIG mode went off since it was read: no MIG device
            except pynvml.NVMLError_GpuIsLost:
                raise self._errors.lost(call) from None
            except Exception as e:
                self._errors.count(call, error_name(e))
                if slot in known:  # still there, as far as anyone knows: reported without values
                    known[slot].handle = None
                    found.append(known[slot])
                continue
            found.append(self._mig_at(known.get(slot), slot, handle))
        return found

    def _mig_at(self, before: Mig | None, slot: int, handle: Any) -> Mig:
        """The MIG device behind ``handle``: the one found in that slot before, unless its UUID changed."""
        uuid = self._errors.call("nvmlDeviceGetUUID", handle)
        if before is not None and (uuid is None or uuid == before.uuid):
            before.handle = handle
            return before
        return Mig(slot, handle, uuid or "")

    def read_mig_identity(self, m: Mig) -> None:
        """Name, profile, GPU and compute instance ids of a MIG device; failed values keep what was known."""
        errors_before = self._errors.events
        name = self._errors.call("nvmlDeviceGetName", m.handle)
        gpu_instance = self._errors.call("nvmlDeviceGetGpuInstanceId", m.handle)
        compute_instance = self._errors.call("nvmlDeviceGetComputeInstanceId", m.handle)
        m.name = name or m.name
        m.profile = mig_profile(m.name)
        m.gpu_instance_id = gpu_instance if gpu_instance is not None else m.gpu_instance_id
        m.compute_instance_id = compute_instance if compute_instance is not None else m.compute_instance_id
        m.identity_ok = bool(m.uuid) and self._errors.events == errors_before
