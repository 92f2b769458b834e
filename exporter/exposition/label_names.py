"""The configurable label names (``--pod-label`` and friends) and the one check every command makes of them.

The exporter's flags (exporter/shell/config.py) and the rules, alerts and dashboards generators
(exporter/bundle/common.py) call the same :func:`check_label_names`: a name one of them accepts,
the others accept, and every refusal is one line naming the flag (or variable) to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Used with fullmatch only: "$" would let "pod\n" through (and break a generated file's header).
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# Every fixed label name of the exported families (exporter/exposition/rows.py, exporter/xid/stats.py).
# A configurable pod/namespace/container label named like one of them gives a series the same label
# twice, or makes rows of different families join on the wrong thing; tests/test_startup_errors.py
# renders every example and fails when a family gains a label missing here.
FIXED_LABELS: frozenset[str] = frozenset({
    "allocate_mode", "call", "cause", "code", "compute_instance_id", "driver_version", "gpu_instance_id",
    "link", "minor_number", "name", "node_name", "output", "parent_uuid", "pci_bus_id", "pid", "pod_uid",
    "profile", "reason", "result", "scheme", "type", "uuid", "version", "workload_kind", "workload_name", "xid",
})


class LabelNameError(ValueError):
    """A configured label name is no label name, reserved, one of the exporter's own, or taken twice."""


@dataclass(frozen=True, slots=True)
class LabelNames:
    """Names of the pod labels (configurable to dodge target-label collisions)."""

    pod: str = "pod_name"
    namespace: str = "namespace_name"
    container: str = "container_name"


def label_name_error(source: str, name: str) -> str | None:
    """Why ``name`` (given by ``source``) is no usable Prometheus label name, in one line; None if it is."""
    if not LABEL_NAME.fullmatch(name):
        return f"{source} must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*), got {name!r}"
    if name.startswith("__"):
        return (f"{source} must be a Prometheus label name, got {name!r}: "
                "names starting with __ are reserved for Prometheus")
    return None


def check_label_names(named: Sequence[tuple[str, str]], error: type[Exception] = LabelNameError,
                      renames: Mapping[str, str] | None = None) -> None:
    """Raise ``error`` (one line, ``repr`` of the value) for the first bad (source, name) pair.

    Refused: no label name, the ``__`` prefix, a name in :data:`FIXED_LABELS`, a name two sources
    share. ``renames`` maps a source to the fixed label it stands for (the generators'
    ``--node-label`` is ``node_name``, perhaps relabelled): that source may keep the fixed name.
    """
    renames = renames or {}
    seen: dict[str, str] = {}
    for source, name in named:
        problem = label_name_error(source, name)
        if problem:
            raise error(problem)
        if name in FIXED_LABELS and renames.get(source) != name:
            raise error(f"{source} {name!r} collides with the exporter's own {name!r} label")
        if name in seen:
            raise error(f"{seen[name]} and {source} both name the label {name!r}: they must differ")
        seen[name] = source
