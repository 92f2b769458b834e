"""The production sampler: reads every GPU through NVML (pynvml) into a NodeSample.

Composes the package's parts (device identity, per-field reads, health reads with GPM, error
accounting; each module's docstring has its rules) under these rules:

* ``sample()`` never raises. Each NVML call is wrapped on its own (``errors.py``): a failure
  costs that field, and the counts show in ``NodeSample.errors``.
* NVML is initialised once. If init fails (no library, driver not loaded, RM version
  mismatch, ...) the sample says ``nvml_up=False`` and later calls retry with exponential
  backoff on an injectable monotonic clock.
* ``GPU_IS_LOST`` marks that device lost (``DeviceSample.lost``) for the cycle and the rest
  of its reads are skipped; the other devices keep reporting. A lost device is re-probed
  with exponential backoff, not every cycle; its GPM sample buffers are freed (a new pair is
  allocated when it is back), as are every device's in ``close()``, before nvmlShutdown.
* Each GPU sample carries the card's ``health`` (``health.py``), read before its other values.
* An unexpected exception outside NVML's error classes is counted under ``("sample_device",
  name)`` (that device reports no values this cycle) or ``("sample", name)``.

MIG (docs/metrics.md, "MIG"): a GPU in MIG mode is not reported itself; its MIG devices take its
place, with the same fields as the simulated node gives them.

* Minor number and PCI bus id are the card's; power, temperature, clocks, ECC, clocks event
  reasons and health are read once per cycle on the card and repeated on each of its MIG devices
  (a MIG device without values this cycle gets no health either); NVLink thus once per card, and
  the rows put a MIG card's links on the card (exporter/exposition/health_rows.py).
* GPM is the exception: on a card in MIG mode each MIG device's ``health.gpm`` is its GPU instance's
  (``nvmlGpmMigSampleGet``, once per instance and cycle, shared by its compute instances); the card's
  own GPM is not read (no row stands for the card). Without GPM (before Hopper) it stays None.
* A failing MIG call costs that field, or that MIG device when unexpected; ``GPU_IS_LOST`` from
  the card or any of its MIG devices marks the card lost, reported as its last known MIG devices,
  all lost (or as the card when none was ever found), re-probed with the card's backoff.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pynvml

from exporter.model import NO_HEALTH, DeviceHealth, DeviceSample, GpmSample, NodeSample
from exporter.node.nvml.errors import CallErrors, DeviceLost, capped_backoff, error_name
from exporter.node.nvml.fields import FieldReader
from exporter.node.nvml.health import HealthReader
from exporter.node.nvml.identity import Device, IdentityReader, Mig, absent, absent_mig


class NvmlBackend:
    """Samples every GPU on the node through NVML; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        init_backoff_s: float = 1.0,
        init_backoff_max_s: float = 300.0,
        lost_backoff_s: float = 10.0,
        lost_backoff_max_s: float = 600.0,
        nvlink: bool = True,
    ) -> None:
        """``clock`` times backoff and durations; ``wall_clock`` stamps samples; ``nvlink``: read NVLink."""
        self._clock = clock
        self._wall_clock = wall_clock
        self._init_backoff = (init_backoff_s, init_backoff_max_s)
        self._lost_backoff = (lost_backoff_s, lost_backoff_max_s)
        self._lock = threading.Lock()
        self._initialized = False
        self._closed = False
        self._init_failures = 0
        self._next_init_at = float("-inf")
        self._devices: list[Device] = []
        self._driver_version = ""
        self._errors = CallErrors()
        self._identity = IdentityReader(self._errors)
        self._fields = FieldReader(self._errors)
        self.nvlink = nvlink  # --nvlink-metrics: read NVLink at all
        self._health = HealthReader(self._errors, nvlink=nvlink)

    @property
    def nvml_up(self) -> bool:
        """Whether NVML is initialised now."""
        return self._initialized

    def sample(self) -> NodeSample:
        """Read every device once. Never raises; failures show in the sample's fields."""
        with self._lock:
            start = self._clock()
            try:
                devices = self._sample_devices(start)
            except Exception as e:  # the contract is a sample, whatever went wrong
                self._errors.count("sample", error_name(e))
                devices = ()
            return NodeSample(
                timestamp=self._wall_clock(),
                devices=devices,
                nvml_up=self._initialized,
                duration_seconds=max(0.0, self._clock() - start),
                errors=self._errors.snapshot(),
                driver_version=self._driver_version,
                gpm_capable=self._gpm_capable(),
            )

    def close(self) -> None:
        """Shut NVML down; later samples report ``nvml_up=False``. Idempotent."""
        with self._lock:
            self._closed = True
            if self._initialized:
                self._initialized = False
                self._health.close()  # GPM buffers belong to this NVML session
                try:
                    pynvml.nvmlShutdown()
                except Exception as e:
                    self._errors.count("nvmlShutdown", error_name(e))

    def _gpm_capable(self) -> dict[str, bool]:
        """card uuid -> whether it has GPM, for the cards whose answer is known."""
        out = {}
        for dev in self._devices:
            known = self._health.gpm.supported(dev.index, mig=dev.mig_mode and bool(dev.migs))
            if dev.uuid and known is not None:
                out[dev.uuid] = known
        return out

    # ---- init ----------------------------------------------------------------------------

    def _sample_devices(self, now: float) -> tuple[DeviceSample, ...]:
        if self._closed:
            return ()
        if not self._initialized and (now < self._next_init_at or not self._init(now)):
            return ()
        return tuple(s for dev in self._devices for s in self._sample_device(dev, now))

    def _init(self, now: float) -> bool:
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_DriverNotLoaded, _LibraryNotFound, _LibRmVersionMismatch, ...
            self._init_failed("nvmlInit", e, now)
            return False
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            self._init_failed("nvmlDeviceGetCount", e, now)
            try:
                pynvml.nvmlShutdown()  # keep NVML's init refcount balanced for the retry
            except Exception as shutdown_error:
                self._errors.count("nvmlShutdown", error_name(shutdown_error))
            return False
        self._initialized = True
        self._init_failures = 0
        self._devices = [Device(i) for i in range(count)]
        try:
            self._driver_version = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception as e:
            self._errors.count("nvmlSystemGetDriverVersion", error_name(e))
            self._driver_version = ""
        return True

    def _init_failed(self, call: str, e: Exception, now: float) -> None:
        self._errors.count(call, error_name(e))
        self._init_failures += 1
        self._next_init_at = now + capped_backoff(*self._init_backoff, self._init_failures)

    # ---- one device ------------------------------------------------------------------------

    def _sample_device(self, dev: Device, now: float) -> tuple[DeviceSample, ...]:
        """The GPU's sample, or its MIG devices' samples when it is in MIG mode."""
        if dev.lost and now < dev.next_probe_at:
            return absent(dev, lost=True)
        try:
            samples = self._read_device(dev)
        except DeviceLost:
            self._health.forget(dev.index)
            dev.lost = True
            dev.lost_failures += 1
            dev.next_probe_at = now + capped_backoff(*self._lost_backoff, dev.lost_failures)
            return absent(dev, lost=True)
        except Exception as e:  # a surprise on one device must not cost the others their rows
            self._errors.count("sample_device", error_name(e))
            return absent(dev, lost=False)
        dev.lost = False
        dev.lost_failures = 0
        return samples

    def _read_device(self, dev: Device) -> tuple[DeviceSample, ...]:
        if not self._identity.open(dev):
            return absent(dev, lost=False)
        if self._identity.in_mig_mode(dev):
            return self._read_mig_card(dev)
        dev.migs = []
        return (self._read_gpu(dev),)

    def _read_gpu(self, dev: Device) -> DeviceSample:
        # Health first: a driver does not mind the order, and the fake's clock moves at the
        # utilization probe, so its energy counter then reads as the simulated node's.
        health = self._health.read(dev)
        self._health.gpm.retain(dev.index, {None})  # out of MIG mode: its instances' buffers go
        return DeviceSample(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            minor_number=dev.minor_number,
            pci_bus_id=dev.pci_bus_id,
            **self._fields.handle_values(dev),
            **self._fields.card_values(dev.handle),
            health=health,
        )

    # ---- MIG -------------------------------------------------------------------------------

    def _read_mig_card(self, dev: Device) -> tuple[DeviceSample, ...]:
        card = self._fields.card_values(dev.handle)
        dev.migs = self._identity.enumerate_migs(dev)
        # once for the card, before its MIG devices as on a whole GPU; none to carry it: not read
        health = self._health.read(dev, card_gpm=False) if dev.migs else NO_HEALTH
        gpm = self._instance_gpm(dev)
        samples = []
        for m in dev.migs:
            # the card's health carries no GPM in MIG mode: a MIG device's is its GPU instance's
            own = replace(health, gpm=gpm.get(m.gpu_instance_id)) if health is not NO_HEALTH else health
            try:
                samples.append(self._read_mig(dev, m, card, own))
            except DeviceLost:
                raise  # the whole card
            except Exception as e:  # a surprise on one MIG device costs only its values
                self._errors.count("sample_device", error_name(e))
                samples.append(absent_mig(dev, m, lost=False))
        return tuple(samples)

    def _instance_gpm(self, dev: Device) -> dict[int | None, GpmSample | None]:
        """GPM of each GPU instance of the card's MIG devices this cycle (once per instance). Raises DeviceLost."""
        for m in dev.migs:  # identity first: the GPU instance id names the GPM sample
            if m.handle is not None and not m.identity_ok:
                self._identity.read_mig_identity(m)
        instances: set[int | None] = {m.gpu_instance_id for m in dev.migs
                                      if m.handle is not None and m.gpu_instance_id is not None}
        gpm = self._health.gpm
        gpm.retain(dev.index, instances)  # instances destroyed (and the card's own) free their buffers
        return {gi: gpm.read(dev.index, dev.handle, gi) for gi in sorted(i for i in instances if i is not None)}

    def _read_mig(self, dev: Device, m: Mig, card: dict[str, int | None], health: DeviceHealth) -> DeviceSample:
        if m.handle is None:
            return absent_mig(dev, m, lost=False)
        return DeviceSample(
            index=dev.index,
            uuid=m.uuid,
            name=m.name,
            minor_number=dev.minor_number,
            pci_bus_id=dev.pci_bus_id,
            **self._fields.handle_values(m),
            parent_uuid=dev.uuid,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            mig_profile=m.profile,
            **card,
            health=health,
        )
