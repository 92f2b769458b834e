"""The converter's value checks: a bad scenario value is one FakeNvmlError naming where it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class FakeNvmlError(RuntimeError):
    """The fake library cannot be built, or a scenario cannot be converted."""


def as_int(value: object, where: str, maximum: int | None = None) -> int:
    """A non-negative integer (not a bool), at most ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FakeNvmlError(f"{where}: expected a non-negative integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise FakeNvmlError(f"{where}: must be <= {maximum}, got {value}")
    return value


def as_ratio(value: object, where: str) -> float:
    """A finite number 0..1 (YAML's 0 and 1 load as integers, so those count too)."""
    # the range test also refuses NaN and the infinities
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise FakeNvmlError(f"{where}: expected a number 0..1, got {value!r}")
    return float(value)


def as_text(value: object, where: str) -> str:
    """A non-blank one-line string."""
    if not isinstance(value, str) or "\n" in value or not value.strip():
        raise FakeNvmlError(f"{where}: expected a one-line string, got {value!r}")
    return value


def check_keys(obj: object, allowed: frozenset[str], where: str) -> Mapping[str, Any]:
    """``obj`` as a mapping with no key outside ``allowed``."""
    if not isinstance(obj, Mapping):
        raise FakeNvmlError(f"{where}: expected a mapping, got {type(obj).__name__}")
    extra = sorted(set(obj) - allowed, key=str)
    if extra:  # a key that is no plain name is quoted: the message stays on one line
        names = (k if isinstance(k, str) and k.isidentifier() else repr(k) for k in extra)
        raise FakeNvmlError(f"{where}: unknown key(s) {', '.join(names)}")
    return obj


def as_seq(value: object, where: str) -> list[Any]:
    """A list; null reads as an empty one."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FakeNvmlError(f"{where}: expected a list, got {type(value).__name__}")
    return value
