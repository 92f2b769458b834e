"""What a GPU's status entry tells an operator to do: shared by the status page and ``top``. Pure.

No imports beyond the standard library: ``kube-gpu-exporter top`` uses it on a remote exporter's
``/status.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def health_notes(gpu: Mapping[str, Any]) -> list[tuple[str, bool]] | None:
    """What a GPU's status entry says an operator acts on: (text, bad) pairs; ``[]`` when all is well.

    Row remapping first (failed: replace the GPU; pending: reset it), then the clocks event reasons
    held other than ``gpu_idle`` (idle clocks are no news). ``None`` when NVML told neither. Reads
    the JSON form too (``kube-gpu-exporter top``), so any field may be missing or of another type.
    """
    rows = gpu.get("remapped_rows")
    rows = rows if isinstance(rows, Mapping) else {}
    reasons = gpu.get("clocks_event_reasons")
    notes: list[tuple[str, bool]] = []
    if rows.get("failure") is True:
        notes.append(("row remap failed: replace the GPU", True))
    elif rows.get("pending") is True:
        notes.append(("row remap pending: reset the GPU", True))
    held = [str(r) for r in reasons if r != "gpu_idle"] if isinstance(reasons, list) else []
    if held:
        notes.append(("clocks held: " + ", ".join(held), False))
    if not notes and not isinstance(reasons, list) and not rows:
        return None
    return notes


# attribution.utilization.UTILIZATION_UNAVAILABLE, the value of a GPU entry's ``utilization_source`` (this
# module imports nothing of ours: ``top`` reads a remote exporter's JSON with it)
_UNAVAILABLE = "unavailable"
NO_UTILIZATION = "utilisation not available from NVML on this GPU"


def utilization_note(gpu: Mapping[str, Any]) -> str | None:
    """:data:`NO_UTILIZATION` where the entry says NVML gives this GPU no utilization (a MIG device
    before Hopper: no device, process or GPM utilization); None otherwise, and for an older exporter's
    entry without the key, and for a lost GPU (its state says more). A missing value is then unknown, not idle."""
    return NO_UTILIZATION if gpu.get("utilization_source") == _UNAVAILABLE and gpu.get("state") != "lost" else None
