"""Validators for scenario documents: each returns the checked value or raises ScenarioError.

A scenario is user input to a long-running daemon, so every message is one line that names
the offending key (``where``); the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.model import OneLineError


class ScenarioError(OneLineError):
    """The scenario file is unusable; the message names the offending key (escaped: one line)."""


# A scenario of 5,000 pods is a few MiB: the cap keeps /dev/zero or a runaway file from filling the memory.
MAX_SCENARIO_BYTES = 64 << 20


def read_capped(path: str | Path, limit: int) -> bytes | None:
    """The file's bytes, or None when it holds more than ``limit`` (read no further: /dev/zero ends)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


def read_scenario_text(path: str | Path) -> str:
    """A scenario file's text; raises ScenarioError (one line) when it cannot be read, is too large or not UTF-8."""
    try:
        data = read_capped(path, MAX_SCENARIO_BYTES)
        text = None if data is None else data.decode("utf-8")  # YAML is UTF-8, whatever the locale says
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except ValueError as e:  # a NUL in the path
        raise ScenarioError(f"cannot read scenario {path!r}: {e}") from None
    if text is None:
        raise ScenarioError(f"{path}: larger than {MAX_SCENARIO_BYTES >> 20} MiB, the most a scenario may hold")
    return text


def as_int(value: object, where: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer (not a bool: YAML ``true`` is no count) within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected an integer, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ScenarioError(f"{where}: must be <= {maximum}, got {value}")
    return value


def as_ratio(value: object, where: str) -> float:
    """A finite number in 0..1 (YAML ``0`` and ``1`` load as integers, so those count too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where}: expected a number 0..1, got {value!r}")
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ScenarioError(f"{where}: must be a number 0..1, got {value!r}")
    return float(value)


def as_str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: expected a string, got {value!r}")
    return value


def quantity_text(value: object, where: str) -> str:
    """A capacity quantity as the API serves it (a string); YAML integers are accepted."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return as_str(value, where)


def as_mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def as_list(value: object, where: str) -> list[Any]:
    """A list; an absent (null) list is empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def reject_unknown(obj: Mapping[str, Any], allowed: set[str] | frozenset[str], where: str) -> None:
    """A misspelt key must fail loudly: silently ignoring it would simulate the wrong GPU."""
    extra = sorted(map(str, set(obj) - allowed))
    if extra:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def check_memory(ints: Mapping[str, int], where: str) -> None:
    """Memory values of a device that NVML could report together (used, reserved within total)."""
    total = ints.get("memory_total_bytes")
    for k in ("memory_used_bytes", "memory_reserved_bytes"):
        if total is not None and ints.get(k, 0) > total:
            raise ScenarioError(f"{where}: {k} exceeds memory_total_bytes")
    # NVML's v1 'used' includes the reserved memory (v2 splits them): used below reserved cannot be read
    if ints.get("memory_used_bytes", 0) < ints.get("memory_reserved_bytes", 0) and "memory_used_bytes" in ints:
        raise ScenarioError(f"{where}: memory_used_bytes is below memory_reserved_bytes (used includes reserved)")
