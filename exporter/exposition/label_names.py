"""The configurable names of the pod, namespace and container labels (``--pod-label`` and friends)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LabelNames:
    """Names of the pod labels (configurable to dodge target-label collisions)."""

    pod: str = "pod_name"
    namespace: str = "namespace_name"
    container: str = "container_name"
