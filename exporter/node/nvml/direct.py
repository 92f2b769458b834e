"""A device field's ``read`` (exporter/exposition/device_fields.py) made straight through pynvml.

The exporter's own reads stay in fields.py and health.py (one error policy per call); this one has
none and serves the consumers that check them from outside: the fake NVML's tests
(tests/fake_nvml/health_readers.py) and the real-GPU check (scripts/device-check.py). A read is
``call``, ``call(CONSTANT, ...)`` with pynvml constant names after the handle, then any ``.attribute``
or ``[index]`` steps into the answer; ``nvmlDeviceGetFieldValues(FIELD_ID)`` answers that one field's
value (scope 0) or raises its own ``nvmlReturn``.
"""

from __future__ import annotations

import re
from typing import Any

_READ = re.compile(r"(?P<call>\w+)(?:\((?P<args>[\w, ]*)\))?(?P<steps>(?:\.\w+|\[\d+\])*)")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")
# nvmlValue_t's member per NVML_VALUE_TYPE_* (the suffix of the constant's name)
_MEMBERS = {"DOUBLE": "dVal", "UNSIGNED_INT": "uiVal", "UNSIGNED_LONG": "ulVal", "UNSIGNED_LONG_LONG": "ullVal",
            "SIGNED_LONG_LONG": "sllVal", "SIGNED_INT": "siVal", "UNSIGNED_SHORT": "usVal"}


def parse_read(read: str) -> tuple[str, tuple[str, ...], tuple[str | int, ...]]:
    """``read`` as (call, constant names, steps: attribute names and indices); ValueError when malformed."""
    m = _READ.fullmatch(read)
    if m is None:
        raise ValueError(f"not a direct read: {read!r}")
    args = tuple(a.strip() for a in (m["args"] or "").split(",") if a.strip())
    steps = tuple(attr if attr else int(index) for attr, index in _STEP.findall(m["steps"]))
    return m["call"], args, steps


def field_value(nvml: Any, handle: Any, field_id: int, scope: int = 0) -> Any:
    """One field of nvmlDeviceGetFieldValues: its value in the member its valueType names."""
    (v,) = nvml.nvmlDeviceGetFieldValues(handle, [(field_id, scope)])
    if v.nvmlReturn != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(v.nvmlReturn)
    members = {getattr(nvml, f"NVML_VALUE_TYPE_{name}"): member for name, member in _MEMBERS.items()}
    return getattr(v.value, members[v.valueType])


def direct_read(nvml: Any, handle: Any, read: str) -> Any:
    """The value ``read`` names on ``handle``, through the pynvml module ``nvml``; its NVMLError escapes."""
    call, args, steps = parse_read(read)
    constants = [getattr(nvml, a) for a in args]
    if call == "nvmlDeviceGetFieldValues":
        value = field_value(nvml, handle, *constants)
    else:
        value = getattr(nvml, call)(handle, *constants)
    for step in steps:
        value = value[step] if isinstance(step, int) else getattr(value, step)
    return value
