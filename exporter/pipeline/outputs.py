"""Each output of a cycle built in isolation: one that raises is counted and logged, the others are published.

An output is a function of the cycle's data (the attribution, the sample, the counters). A failing one
contributes nothing to that cycle's snapshot (no stale numbers under a fresh timestamp); the status page
keeps its last good tree, whose age then tells how old it is. Failures are counted by output name
(``kube_gpu_exporter_output_failures_total{output}``) and logged once when an output starts failing and
once when it recovers, not every cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# Every output a cycle builds, in the order their families are rendered; dcgm only with --dcgm-compat.
OUTPUTS = ("rows", "usage", "xid", "dcgm", "status")


class OutputGuard:
    """Runs each output, counts the ones that raise and logs each change of an output's state once."""

    def __init__(self, names: tuple[str, ...] = OUTPUTS) -> None:
        self._failures = dict.fromkeys(names, 0)
        self._failing: set[str] = set()

    def run(self, name: str, build: Callable[[], T], fallback: T) -> T:
        """``build()``, or ``fallback`` when it raises (counted under ``name``)."""
        try:
            result = build()
        except Exception:  # one output's bug must not cost the node its other outputs
            self._failures[name] = self._failures.get(name, 0) + 1
            if name not in self._failing:
                self._failing.add(name)
                log.exception("output %s failed: left out of the snapshot until it recovers", name)
            return fallback
        if name in self._failing:
            self._failing.discard(name)
            log.info("output %s recovered (%d failed cycles in all)", name, self._failures[name])
        return result

    def failures(self) -> Mapping[str, int]:
        """Failed cycles by output name (every known output, 0 when it never failed)."""
        return dict(self._failures)
