"""Error accounting for NVML calls: each call wrapped on its own, failures counted, never raised.

* NotSupported leaves the field ``None`` and is not an error; any other failure leaves it
  ``None`` and is counted under (pynvml function name, error class name).
* ``GPU_IS_LOST`` is counted and raised as :class:`DeviceLost`, so that the caller stops reading
  that device for the cycle.
* A symbol the driver lacks (FunctionNotFound, or pynvml's library mismatch) is counted, unless
  the caller has a fallback for it: then it is raised as :class:`FunctionMissing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pynvml

# What pynvml raises for a symbol the loaded driver does not export.
MISSING = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLLibraryMismatchError)


class DeviceLost(Exception):
    """GPU_IS_LOST from a device: stop reading it this cycle."""


class FunctionMissing(Exception):
    """The driver lacks a symbol the caller has a fallback for."""


def error_name(e: BaseException) -> str:
    """The label an NVML error is counted under (the pynvml exception class name)."""
    name = type(e).__name__
    if name == "NVMLError":  # a code pynvml has no subclass for: keep the number
        return f"NVMLError_{getattr(e, 'value', 'unknown')}"
    return name


def capped_backoff(base: float, cap: float, failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive failures: base, doubling, at most cap."""
    # the exponent is bounded so that a long outage cannot overflow the float
    return min(cap, base * 2 ** min(max(failures - 1, 0), 32))


class CallErrors:
    """Error counts by (call, code), and the per-call wrapper that feeds them."""

    def __init__(self) -> None:
        """No error counted yet."""
        self._counts: dict[tuple[str, str], int] = {}
        self.events = 0  # total counted, to tell whether a group of calls was clean

    def count(self, call: str, code: str) -> None:
        """Count one failure of ``call`` with ``code``."""
        key = (call, code)
        self._counts[key] = self._counts.get(key, 0) + 1
        self.events += 1

    def lost(self, call: str) -> DeviceLost:
        """Count GPU_IS_LOST from ``call``; the exception to raise for it."""
        self.count(call, "NVMLError_GpuIsLost")
        return DeviceLost()

    def snapshot(self) -> Mapping[tuple[str, str], int]:
        """A read-only copy of the counts so far."""
        return MappingProxyType(dict(self._counts))

    def call(self, call: str, *args: Any, fallback: bool = False) -> Any:
        """``pynvml.<call>(*args)``; ``None`` when it failed. Raises only DeviceLost / FunctionMissing."""
        try:
            return getattr(pynvml, call)(*args)
        except MISSING as e:
            if fallback:
                raise FunctionMissing from None
            self.count(call, error_name(e))
        except pynvml.NVMLError_NotSupported:
            pass
        except pynvml.NVMLError_GpuIsLost:
            raise self.lost(call) from None
        except Exception as e:
            self.count(call, error_name(e))
        return None
