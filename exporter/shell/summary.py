"""The one start-up line: what the exporter sees once its first cycle has run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from exporter.model import DeviceSample
from exporter.pipeline.cycle import Pipeline
from exporter.shell.config import Config


def gpus_text(devices: Sequence[DeviceSample]) -> str:
    """``2 GPUs (2x NVIDIA A100-SXM4-80GB), MIG on 1 (7 MIG devices)``: cards, models, MIG mode."""
    cards: dict[str, str] = {}
    migs: Counter[str] = Counter()
    for d in devices:
        card = d.parent_uuid or d.uuid
        cards.setdefault(card, (d.name or "unknown model").split(" MIG ")[0])
        if d.parent_uuid:
            migs[card] += 1
    models = ", ".join(f"{n}x {name}" for name, n in sorted(Counter(cards.values()).items()))
    text = f"{len(cards)} GPU{'s' if len(cards) != 1 else ''}" + (f" ({models})" if models else "")
    if migs:
        return text + f", MIG on {len(migs)} of them ({sum(migs.values())} MIG devices)"
    return text + ", MIG off"


def profiling_text(gpm_capable: Mapping[str, bool]) -> str:
    """Whether the GPUs offer GPM (profiling: the ``*_ratio`` families and ``DCGM_FI_PROF_*``): NVML has
    it on Hopper and newer only, so on an older node those panels stay empty by design."""
    n, on = len(gpm_capable), sum(gpm_capable.values())
    if not n:
        return "profiling (GPM): unknown"
    if not on:
        return "profiling (GPM): unavailable on this node (NVML offers it on Hopper and newer only)"
    return "profiling (GPM): available" + ("" if on == n else f" on {on} of {n} GPUs")


def nvml_version(simulated: bool) -> str:
    """NVML's own version string ("simulated" for the simulated node, "unknown" when NVML will not say)."""
    if simulated:
        return "simulated"
    try:
        import pynvml

        return str(pynvml.nvmlSystemGetNVMLVersion())
    except Exception:  # a summary must not fail the start
        return "unknown"


def schemes_text(pipeline: Pipeline) -> str:
    """The sharing schemes this node's pods and labels use now ("none detected" without any)."""
    from exporter.attribution.allocations import AllocationInputs, compute_allocations

    sample, src = pipeline.last_sample, pipeline.sources
    try:  # without the kubelet's answer and DRA: a summary asks no source that does I/O per call
        result = compute_allocations(AllocationInputs(tuple(src.pods().view.pods.values()),
                                                      sample.devices if sample else (), src.node_labels(), None,
                                                      src.node_capacity()))
        schemes = sorted({a.scheme for a in result.allocations})
    except Exception:  # a summary must not fail the start
        return "unknown"
    return ", ".join(schemes) or "none detected"


def pods_text(cfg: Config, pipeline: Pipeline) -> str:
    """The pod source: off, the scenario's, or the watch's sync state."""
    state = pipeline.sources.pods()
    if cfg.simulate:
        return f"scenario ({len(state.view.pods)} pods)"
    if not cfg.pod_watch:
        return "off (--no-pod-watch)"
    if state.synced:
        return f"synced ({len(state.view.pods)} pods)"
    return f"not synced yet ({state.sync_errors} errors)"


def startup_summary(cfg: Config, node: str, pipeline: Pipeline, kernel_log: str) -> str:
    """One line: version, driver and NVML, GPUs and MIG, profiling, sharing schemes, pods, pod-resources,
    kernel log."""
    from exporter import __version__

    sample = pipeline.last_sample
    parts = [f"kube-gpu-exporter {__version__} on node {node}"]
    if sample is not None and sample.nvml_up:
        parts.append(f"driver {sample.driver_version or 'unknown'}, NVML {nvml_version(bool(cfg.simulate))}")
        parts.append(gpus_text(sample.devices))
        parts.append(profiling_text(sample.gpm_capable))
    else:
        parts.append("NVML down (see the error above): no GPUs seen")
    parts.append(f"sharing: {schemes_text(pipeline)}")
    parts.append(f"pod watch: {pods_text(cfg, pipeline)}")
    resources = "scenario" if cfg.simulate else getattr(pipeline.sources.pod_resources, "state", "unknown")
    parts.append(f"pod-resources: {resources}")
    parts.append(f"kernel log: {kernel_log}")
    return "; ".join(parts)
