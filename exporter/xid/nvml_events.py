"""Xid errors from NVML events: the optional second Xid source, next to the kernel log.

A thin thread around NVML's event API (see docs/xid.md, "Second source: NVML events"):

* It keeps its own NVML session (``nvmlInit`` is reference counted, so the sampler's session is
  not disturbed) and registers ``nvmlEventTypeXidCriticalError`` on every device that supports it.
  A device that cannot (NotSupported, lost, any error) is counted and skipped; the others work.
* No device registered, or NVML down: the session is closed and opened again later, with
  exponential backoff, as the sampler's init is.
* It blocks in ``nvmlEventSetWait_v2(set, wait_ms)``; a timeout just means no Xid, so
  :meth:`NvmlXidSource.stop` takes effect within ``wait_ms``. Any other wait error closes the
  session and reopens it after a backoff (e.g. GPU_IS_LOST once a GPU fell off the bus).
* Each Xid goes to the ``handoff`` callable as an :class:`NvmlXid` (GPU identity read at
  registration, Xid, MIG instance, time received). The watcher deduplicates it against the kernel
  log (``exporter.xid.dedup.XidDedup``). Events before registration are never delivered by NVML.

Per-device failures are not retried within a session: NotSupported is permanent and a lost GPU
does not come back without a reset.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pynvml

from exporter.node.nvml.errors import capped_backoff, error_name
from exporter.xid.parse import bus_id_from_nvml

log = logging.getLogger(__name__)

NO_INSTANCE = 0xFFFF_FFFF  # gpuInstanceId / computeInstanceId when MIG is off
DEFAULT_WAIT_MS = 500  # the longest stop() waits for a blocked nvmlEventSetWait_v2


@dataclass(frozen=True, slots=True)
class NvmlXid:
    """One Xid NVML delivered, with the GPU it came from."""

    xid: int
    pci: str | None  # the log's form (``0000:3b:00``); None when NVML could not tell
    uuid: str  # "" when NVML could not tell
    minor_number: int | None
    gpu_instance: int | None  # MIG GPU instance, None without MIG
    compute_instance: int | None
    observed: float  # when the event was received, on the source's clock


@dataclass(frozen=True, slots=True)
class _Gpu:
    uuid: str
    pci: str | None
    minor_number: int | None


def _instance(value: int) -> int | None:
    return None if value == NO_INSTANCE else int(value)


def _address(handle: Any) -> int | None:
    # Handles are opaque pointers; the event carries the same pointer the device was registered with.
    return ctypes.cast(handle, ctypes.c_void_p).value


class NvmlXidSource:
    """Registers Xid events on every GPU and hands each Xid to ``handoff`` (see the module doc)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        wait_ms: int = DEFAULT_WAIT_MS,
        backoff_s: float = 1.0,
        backoff_max_s: float = 300.0,
    ) -> None:
        """``clock`` stamps events (use the watcher's clock: dedup compares the two sources' times)."""
        self._clock = clock
        self._wait_ms = wait_ms
        self._backoff = (backoff_s, backoff_max_s)
        self._handoff: Callable[[NvmlXid], None] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: dict[tuple[str, str], int] = {}
        self._failures = 0
        # Owned by the thread: the open session.
        self._initialized = False
        self._set: Any = None
        self._gpus: dict[int | None, _Gpu] = {}
        self._registered = 0
        self._sessions = 0

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self, handoff: Callable[[NvmlXid], None]) -> None:
        """Start the thread; ``handoff`` is called on it for each Xid and must not block."""
        if self._thread is not None:
            raise RuntimeError("NvmlXidSource already started")
        self._handoff = handoff
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop within about ``wait_ms``; the thread frees its event set and NVML session."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def errors(self) -> Mapping[tuple[str, str], int]:
        """Failures by (NVML call, error), e.g. (``nvmlDeviceRegisterEvents``, ``NVMLError_NotSupported``)."""
        with self._lock:
            return MappingProxyType(dict(self._errors))

    @property
    def registered_devices(self) -> int:
        """Devices whose Xid events the open session receives (0 while none is open)."""
        with self._lock:
            return self._registered

    @property
    def sessions(self) -> int:
        """Sessions opened so far (more than one: NVML was down, or a wait failed)."""
        with self._lock:
            return self._sessions

    # ---- the thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    if self._set is None and not self._open():
                        self._retry_later()
                        continue
                    self._wait_once()
                except Exception as e:  # a bug must not end the source: count it, start over later
                    log.exception("NVML Xid source")
                    self._count("nvml_xid", error_name(e))
                    self._close()
                    self._retry_later()
        finally:
            self._close()

    def _retry_later(self) -> None:
        self._failures += 1
        self._stop.wait(capped_backoff(*self._backoff, self._failures))

    def _open(self) -> bool:
        """Init, create the set, register every device that can; False (all undone) when none could."""
        call = "nvmlInit"
        try:
            pynvml.nvmlInit()
            self._initialized = True
            call = "nvmlDeviceGetCount"
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                self._count(call, "no_devices")  # a driver without GPUs yet: look again later
                self._close()
                return False
            call = "nvmlEventSetCreate"
            self._set = pynvml.nvmlEventSetCreate()
        except Exception as e:  # DriverNotLoaded, LibraryNotFound, LibRmVersionMismatch, ...
            self._count(call, error_name(e))
            self._close()
            return False
        gpus = dict(found for index in range(count) if (found := self._register(index)) is not None)
        if not gpus:
            log.warning("NVML Xid events: none of %d GPUs could register; retrying later", count)
            self._close()
            return False
        self._gpus = gpus
        with self._lock:
            self._registered = len(gpus)
            self._sessions += 1
        log.info("NVML Xid events registered on %d of %d GPUs", len(gpus), count)
        return True

    def _register(self, index: int) -> tuple[int | None, _Gpu] | None:
        """Register one device; its (handle address, identity), or None (counted) when it cannot."""
        call = "nvmlDeviceGetHandleByIndex"
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            call = "nvmlDeviceGetSupportedEventTypes"
            types = pynvml.nvmlEventTypeXidCriticalError & pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            call = "nvmlDeviceRegisterEvents"
            if not types:
                self._count(call, "NVMLError_NotSupported")  # this GPU has no Xid events to give
                return None
            pynvml.nvmlDeviceRegisterEvents(handle, types, self._set)
        except Exception as e:  # NotSupported, GpuIsLost, ...: this GPU only
            self._count(call, error_name(e))
            return None
        return _address(handle), self._identity(handle)

    def _identity(self, handle: Any) -> _Gpu:
        """uuid, PCI address and minor number; a part NVML cannot tell stays empty (and counted)."""
        uuid, pci, minor = "", None, None
        for call in ("nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMinorNumber"):
            try:
                value = getattr(pynvml, call)(handle)
            except Exception as e:
                self._count(call, error_name(e))
                continue
            if call == "nvmlDeviceGetUUID":
                uuid = str(value)
            elif call == "nvmlDeviceGetPciInfo":
                pci = bus_id_from_nvml(str(value.busId))
            else:
                minor = int(value)
        return _Gpu(uuid, pci, minor)

    def _wait_once(self) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
        except pynvml.NVMLError_Timeout:
            self._failures = 0  # the session works; reset only here, so failing waits back off
            return  # no Xid within wait_ms: look at the stop flag, wait again
        except Exception as e:
            self._count("nvmlEventSetWait_v2", error_name(e))
            self._close()
            self._retry_later()
            return
        observed = self._clock()
        self._failures = 0
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return
        gpu = self._gpus.get(_address(data.device)) or self._identity(data.device)
        xid = NvmlXid(int(data.eventData), gpu.pci, gpu.uuid, gpu.minor_number,
                      _instance(data.gpuInstanceId), _instance(data.computeInstanceId), observed)
        assert self._handoff is not None
        self._handoff(xid)

    def _close(self) -> None:
        """Free the set and end this source's NVML session, if open (the sampler's stays up)."""
        with self._lock:
            self._registered = 0
        self._gpus = {}
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except Exception as e:
                self._count("nvmlEventSetFree", error_name(e))
            self._set = None
        if self._initialized:
            self._initialized = False
            try:
                pynvml.nvmlShutdown()  # balances our nvmlInit only: NVML counts references
            except Exception as e:
                self._count("nvmlShutdown", error_name(e))

    def _count(self, call: str, code: str) -> None:
        with self._lock:
            self._errors[(call, code)] = self._errors.get((call, code), 0) + 1
