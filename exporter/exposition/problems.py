"""What is wrong on the node, worst first: :func:`find_problems` judges a status view. Pure.

One list for the status page's banner, ``/status.json``'s ``problems`` and ``kube-gpu-exporter top``.
The judgements are the alerts' (their thresholds come from exporter/exposition/thresholds.py, each
problem names the alert that fires on it, whose runbook in docs/alerts.md says more); the page judges one
snapshot, so a problem shows at once where the alert waits for its ``for:``. Reads the JSON form too
(``top`` on a remote exporter): any field may be missing or of another type, and nothing raises. No
imports beyond the standard library and thresholds.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

from exporter.exposition import thresholds as judge

SEVERITIES = ("critical", "warning", "info")
GIB = 1024 ** 3
Problem = dict[str, Any]


def _num(value: Any) -> float | None:
    """A finite number, or None (bool, NaN, strings and the rest)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list | tuple) else []


def _text(value: Any) -> str:
    return " ".join(str(value).split())  # one line, whatever a name holds


def iso_time(ts: Any) -> str:
    """Unix time -> ISO 8601 in UTC (``2026-12-03T16:58:01Z``); ``?`` when not a time."""
    t = _num(ts)
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t is not None else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def ago(ts: Any, now: float) -> str:
    """How long before ``now`` ``ts`` was: ``12 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``."""
    t = _num(ts)
    if t is None:
        return "?"
    s = max(0.0, now - t)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def when(ts: Any, now: float) -> str:
    """``2026-12-03T16:58:01Z (5 min ago)``."""
    return f"{iso_time(ts)} ({ago(ts, now)})"


def _problem(severity: str, kind: str, gpu: Mapping[str, Any] | None, text: str, action: str,
             alert: str | None = None, who: Mapping[str, Any] | None = None, xid: Any = None) -> Problem:
    gpu, who = gpu or {}, who or {}
    return {"severity": severity, "kind": kind, "uuid": _str(gpu.get("uuid")), "minor": _int(gpu.get("minor")),
            "namespace": _str(who.get("namespace")), "pod": _str(who.get("pod")),
            "container": _str(who.get("container")), "xid": _int(xid), "text": _text(text), "action": _text(action),
            "alert": alert}


def _str(value: Any) -> str | None:
    """A name as one line, or None: whatever a remote tree holds, a problem stays JSON (no NaN, no objects)."""
    return None if value is None else _text(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _name(gpu: Mapping[str, Any]) -> str:
    mig = _map(gpu.get("mig"))
    minor = gpu.get("minor")
    card = f"GPU {_text(minor if minor is not None else gpu.get('uuid') or '?')}"
    return f"{card} MIG {_text(mig.get('profile'))}" if mig else f"{card} ({_text(gpu.get('model'))})"


def _pod(who: Mapping[str, Any]) -> str:
    if not who.get("pod"):
        return "a host process"
    ctr = f", container {_text(who.get('container'))}" if who.get("container") else ""
    return f"pod {_text(who.get('namespace'))}/{_text(who.get('pod'))}{ctr}"


def _lost(gpu: Mapping[str, Any]) -> Iterator[Problem]:
    if gpu.get("state") == "lost":
        yield _problem("critical", "gpu_lost", gpu, f"{_name(gpu)} is lost: NVML reports GPU_IS_LOST, every "
                       "workload on it fails", "Cordon the node; drain it and reset the GPU (nvidia-smi -r) or "
                       "reboot the node", "KubeGpuLost")


def _memory(gpu: Mapping[str, Any]) -> Iterator[Problem]:
    """Memory repair and ECC, as the hardware alerts judge them."""
    rows, pages, ecc = _map(gpu.get("remapped_rows")), _map(gpu.get("retired_pages")), _map(gpu.get("ecc_errors"))
    name = _name(gpu)
    if rows.get("failure") is True:
        yield _problem("critical", "row_remap_failed", gpu, f"{name} failed to remap a memory row (NVIDIA's RMA "
                       "criterion)", "Drain it, run the field diagnostic and have the GPU replaced",
                       "KubeGpuRowRemapFailure")
    elif rows.get("pending") is True:
        yield _problem("warning", "row_remap_pending", gpu, f"{name} has memory rows remapped, applied only at the "
                       "next reset", "Drain the GPU and reset it (nvidia-smi -r) or reboot the node",
                       "KubeGpuRowRemapPending")
    retired = sum(n for n in (_num(pages.get("single_bit")), _num(pages.get("double_bit"))) if n is not None)
    if retired >= judge.RETIRED_PAGES_LIMIT:
        yield _problem("critical", "retired_pages_limit", gpu, f"{name} has retired {retired:.0f} memory pages "
                       f"(limit {judge.RETIRED_PAGES_LIMIT})", "Drain it and have the GPU replaced",
                       "KubeGpuRetiredPagesLimit")
    if pages.get("pending") is True:
        yield _problem("warning", "retired_pages_pending", gpu, f"{name} has memory pages waiting to be retired "
                       "at the next reset", "Drain the GPU and reset it or reboot the node",
                       "KubeGpuPageRetirementPending")
    uncorrected = _num(ecc.get("uncorrected"))
    if uncorrected:
        yield _problem("critical", "ecc_uncorrected", gpu, f"{name} has counted {uncorrected:.0f} uncorrected ECC "
                       "error(s) since the driver loaded", "Drain the node and reset the GPU",
                       "KubeGpuEccUncorrectedErrors")


def _clocks(gpu: Mapping[str, Any]) -> Iterator[Problem]:
    """Clocks held by heat, the hardware or the power cap (the slowdown alerts' reasons), and heat itself."""
    reasons = gpu.get("clocks_event_reasons")
    held = [str(r) for r in reasons] if isinstance(reasons, list | tuple) else []
    name = _name(gpu)
    for severity, kind, watched, why, action, alert in (
        ("warning", "clocks_thermal", judge.THERMAL_REASONS, "slows its clocks for heat",
         "Check its fans, airflow and the node's cooling", "KubeGpuThermalThrottling"),
        ("warning", "clocks_hardware", judge.HARDWARE_REASONS, "has its clocks cut by the hardware",
         "Check the node's power supply and cooling", "KubeGpuHardwareSlowdown"),
        ("info", "clocks_power", judge.POWER_CAP_REASONS, "holds its clocks down at its power limit",
         "Its jobs are power-bound; check that the power limit was not lowered", "KubeGpuPowerThrottling"),
    ):
        active = [r for r in held if r in watched]
        if active:
            yield _problem(severity, kind, gpu, f"{name} {why} ({', '.join(active)})", action, alert)
    temp = _num(gpu.get("temperature_celsius"))
    if temp is not None and temp > judge.TEMPERATURE_CELSIUS:
        yield _problem("warning", "temperature_high", gpu, f"{name} is at {temp:.0f} °C (over "
                       f"{judge.TEMPERATURE_CELSIUS:g} °C)", "Expect clock throttling; check its cooling",
                       "KubeGpuTemperatureHigh")


_XID_SEVERITY = {**dict.fromkeys(judge.CRITICAL_XID_SEVERITIES, "critical"),
                 **dict.fromkeys(judge.APPLICATION_XID_SEVERITIES, "warning"), "info": "info"}


def _xid_problem(gpu: Mapping[str, Any], x: Mapping[str, Any], who: Mapping[str, Any], count: Any,
                 at: Any, now: float) -> Problem:
    code = _text(x.get("xid"))
    severity = _XID_SEVERITY.get(str(x.get("severity")), "warning")  # unknown codes: look at them
    alert = {"critical": "KubeGpuXidCritical", "warning": "KubeGpuXidApplication"}.get(severity)
    meaning = f" ({_text(x['meaning'])})" if x.get("meaning") else ""
    by = f", raised by {_pod(who)}" if who else ""
    n = _num(count)
    times = f" {n:.0f} time(s)" if n is not None else ""
    action = _text(x.get("action") or "Look the code up in docs/xid.md")
    if code == "79":
        return _problem("critical", "gpu_fallen_off_bus", gpu, f"{_name(gpu)} has fallen off the bus (Xid 79), "
                        f"last {when(at, now)}", action, "KubeGpuXidCritical", who, x.get("xid"))
    return _problem(severity, "xid", gpu, f"Xid {code}{meaning} on {_name(gpu)}{times}{by}, last {when(at, now)}",
                    action, alert, who, x.get("xid"))


def _xids(gpu: Mapping[str, Any], now: float) -> Iterator[Problem]:
    """Each Xid of the recent window (the Xid alerts'), one per pod that raised it."""
    for x in _list(gpu.get("xids")):
        at = _num(x.get("last_at"))
        if at is None or now - at > judge.XID_WINDOW_SECONDS:
            continue
        pods = [p for p in _list(x.get("pods")) if (t := _num(p.get("last_at"))) is not None
                and now - t <= judge.XID_WINDOW_SECONDS]
        if not pods:
            yield _xid_problem(gpu, x, {}, x.get("count"), at, now)
        for p in pods:
            yield _xid_problem(gpu, x, p, p.get("count"), p.get("last_at"), now)


def _use(gpu: Mapping[str, Any]) -> Iterator[Problem]:
    """Containers over their memory grant or holding an idle grant; processes nobody was granted the GPU."""
    name = _name(gpu)
    for c in _list(gpu.get("containers")):
        grant, use = _map(c.get("grant")), _map(c.get("use"))
        granted_mem, used_mem = _num(grant.get("memory_bytes")), _num(use.get("memory_bytes"))
        if c.get("allocate_mode") == "share" and granted_mem and used_mem is not None and used_mem > granted_mem:
            yield _problem("warning", "over_memory_grant", gpu, f"{_pod(c)} uses {used_mem / GIB:.1f} GiB of "
                           f"{name}, {used_mem * 100 / granted_mem:.0f} % of its {granted_mem / GIB:.1f} GiB grant",
                           "Raise its grant or lower its memory use: it can push its neighbours out of memory",
                           "KubeGpuContainerOverMemoryGrant", c)
        compute, sm = _num(grant.get("compute_percent")), _num(use.get("sm_percent"))
        if sm is None and gpu.get("mig"):
            continue  # NVML has no utilization of a MIG instance: nothing tells idle from busy (nor does the alert)
        if c.get("allocate_mode") in ("exclusive", "share") and compute and (sm or 0.0) < judge.IDLE_PERCENT:
            held = f"{name} whole" if compute >= 100 else f"{compute:.0f} % of {name}"
            yield _problem("info", "allocated_idle", gpu, f"{_pod(c)} holds {held} and uses {sm or 0.0:.0f} % SM",
                           "Free the allocation if it stays idle: another pod could use the GPU",
                           "KubeGpuAllocatedIdle", c)
    for p in _list(gpu.get("unaccounted")):
        comm = f" ({_text(p['comm'])})" if p.get("comm") else ""
        mem, sm = _num(p.get("memory_bytes")), _num(p.get("sm_percent"))
        uses = ", ".join(([f"{mem / GIB:.1f} GiB"] if mem is not None else [])
                         + ([f"{sm:.0f} % SM"] if sm is not None else [])) or "it"
        where = f"of {_pod(p)}" if p.get("pod") else "on the host"
        yield _problem("warning", "unaccounted_process", gpu, f"PID {_text(p.get('pid'))}{comm} {where} uses "
                       f"{uses} on {name} without an allocation", "Find who runs it (the PID on the node): it "
                       "competes with the pods that were granted the GPU", "KubeGpuUnaccountedProcesses", p)


def _device(gpu: Mapping[str, Any], now: float, card: bool) -> Iterator[Problem]:
    if card or gpu.get("state") == "lost":
        yield from _lost(gpu)
    if card:  # a MIG instance repeats its card's health
        yield from _memory(gpu)
        yield from _clocks(gpu)
    yield from _xids(gpu, now)
    yield from _use(gpu)


def _subsystems(view: Mapping[str, Any]) -> Iterator[Problem]:
    """The exporter's own sources degraded: NVML, the pod cache, pod-resources, the kernel log, sampling."""
    sub = _map(view.get("subsystems"))
    nvml, pods, sampler = _map(sub.get("nvml")), _map(sub.get("pod_cache")), _map(sub.get("sampler"))
    if nvml and nvml.get("up") is not True:
        yield _problem("critical", "nvml_down", None, "NVML is down: no GPU is read", "Check the NVIDIA driver "
                       "on the node (nvidia-smi) and the exporter's logs", "KubeGpuNvmlDown")
    errors = [f"{_text(e.get('call'))}: {_text(e.get('error'))}" for e in _list(nvml.get("errors"))]
    if errors:
        yield _problem("info", "nvml_errors", None, f"NVML calls fail: {', '.join(errors[:3])}"
                       + (f" and {len(errors) - 3} more" if len(errors) > 3 else ""),
                       "The values of those calls are missing; see kube_gpu_exporter_nvml_errors_total")
    if pods and pods.get("synced") is not True:
        yield _problem("warning", "pod_cache_not_synced", None, "The pod cache is not synced: GPU use cannot be "
                       "attributed to pods", "Check the exporter's access to the API server (RBAC, network)",
                       "KubeGpuExporterPodCacheNotSynced")
    for key, kind, what, action in (
        ("pod_resources", "pod_resources_unavailable", "The kubelet's pod-resources API",
         "Check the pod-resources socket mount (--pod-resources-socket)"),
        ("kernel_log", "kernel_log_unreadable", "The kernel log",
         "Give the exporter CAP_SYSLOG or read access to /dev/kmsg, or use --kmsg-path none"),
    ):
        state = _map(sub.get(key))
        if state.get("ok") is False:
            yield _problem("warning", kind, None, f"{what} is degraded: {_text(state.get('state'))}", action)
    age = _num(view.get("snapshot_age_seconds"))
    if age is not None and age > judge.SNAPSHOT_STALE_SECONDS:
        yield stale_problem(f"{age:.0f}")
    failures = _num(sampler.get("sample_failures_total"))
    if failures:
        yield _problem("info", "sample_failures", None, f"{failures:.0f} sampling cycle(s) failed since start",
                       "See the exporter's logs for the error")
    failing = [f"{_text(k)} {_text(v)} time(s)" for k, v in _map(sub.get("output_failures")).items() if _num(v)]
    if failing:
        yield _problem("info", "output_failures", None, f"Outputs failed in some cycles: {', '.join(failing)}",
                       "See the exporter's logs for the error")


def stale_problem(age: str) -> Problem:
    """The snapshot is ``age`` seconds old (the text given: the stored status page puts its age in per request)."""
    return _problem("warning", "snapshot_stale", None, f"The snapshot is {age} s old: the values are stale",
                    "Check the exporter's logs for a stuck or failing sampling cycle", "KubeGpuExporterSnapshotStale")


def order(p: Problem) -> tuple:
    """The sort key of the problems: severity, kind, GPU, pod, text."""
    minor = p.get("minor")
    return (SEVERITIES.index(p["severity"]), KIND_ORDER.get(p["kind"], len(KIND_ORDER)),
            minor if minor is not None else math.inf,
            str(p.get("uuid")), str(p.get("namespace")), str(p.get("pod")), str(p.get("container")), p["text"])


# Within a severity: the GPU itself, then what runs on it, then the exporter.
KIND_ORDER = {k: i for i, k in enumerate((
    "gpu_lost", "gpu_fallen_off_bus", "nvml_down", "row_remap_failed", "retired_pages_limit", "ecc_uncorrected",
    "xid", "row_remap_pending", "retired_pages_pending", "clocks_thermal", "clocks_hardware", "temperature_high",
    "over_memory_grant", "unaccounted_process", "pod_cache_not_synced", "pod_resources_unavailable",
    "kernel_log_unreadable", "snapshot_stale", "allocated_idle", "clocks_power", "nvml_errors", "sample_failures",
    "output_failures"))}
KINDS = tuple(KIND_ORDER)


def find_problems(view: Mapping[str, Any], now: float) -> list[Problem]:
    """Every problem the status view ``view`` shows at unix time ``now``, worst first (see docs/status.md)."""
    if not isinstance(view, Mapping) or not _map(view.get("subsystems")):
        return []  # no snapshot yet: the page says so itself
    found: list[Problem] = list(_subsystems(view))
    for gpu in _list(view.get("gpus")):
        found += _device(gpu, now, card=True)
        for inst in _list(gpu.get("instances")):
            found += _device(inst, now, card=False)
    for x in _list(view.get("other_xids")):
        found += _xids({"uuid": x.get("uuid"), "minor": None, "model": "unknown", "xids": [x]}, now)
    return sorted(found, key=order)


def counts(problems: list[Mapping[str, Any]]) -> dict[str, int]:
    """Problems by severity, every severity present."""
    out = dict.fromkeys(SEVERITIES, 0)
    for p in problems:
        if p.get("severity") in out:
            out[p["severity"]] += 1
    return out
