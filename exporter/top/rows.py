"""``kube-gpu-exporter top``'s data: fetch a node's ``/status.json`` and turn it into table rows.

Pure apart from :func:`fetch_status` (one bounded HTTP GET); the Textual app (top_app.py) only displays
what :func:`build_view` returns. See docs/status.md for the fields read here.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.exposition.device_fields import COLUMNS
from exporter.exposition.health_notes import health_notes, utilization_note
from exporter.exposition.problems import counts, find_problems, iso_time

GIB = 1024**3
MAX_BODY = 16 * 1024 * 1024  # a status tree is kilobytes; refuse anything absurd
Row = tuple[str, ...]

# the device field table's columns (exporter/exposition/device_fields.py) go before Health
GPU_COLUMNS: Row = ("GPU", "Model", "State", "Mode", "Util %", "Mem util %", "Memory GiB", "Power W", "Temp C",
                    "Energy kWh", *(f.column for f in COLUMNS), "Health")
CONTAINER_COLUMNS: Row = ("GPU", "Namespace", "Pod", "Container", "Mode", "Scheme",
                          "Grant SM %", "Use SM %", "Grant mem GiB", "Use mem GiB")
UNACCOUNTED_COLUMNS: Row = ("GPU", "PID", "Command", "SM %", "Memory GiB", "Namespace", "Pod", "Container")
PROBLEM_COLUMNS: Row = ("Severity", "GPU", "Problem", "Action")
XID_COLUMNS: Row = ("GPU", "Xid", "Count", "Last", "Pods", "Severity", "Meaning")


class FetchError(Exception):
    """The status could not be read: the message is one line for the UI."""


@dataclass(frozen=True)
class View:
    """What the app shows: a header line, an optional message, and the rows of each table."""

    header: str
    message: str = ""
    problems: list[Row] = field(default_factory=list)  # worst first; the first cell is the severity
    gpus: list[Row] = field(default_factory=list)
    containers: list[Row] = field(default_factory=list)
    unaccounted: list[Row] = field(default_factory=list)
    infrastructure: list[Row] = field(default_factory=list)  # the GPUs' MPS daemons (attribution rule 9)
    xids: list[Row] = field(default_factory=list)


def status_url(url: str) -> str:
    """An exporter's base URL (or its ``/status.json``) -> the ``/status.json`` URL."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url if url.rstrip("/").endswith("/status.json") else url.rstrip("/") + "/status.json"


def get_body(url: str, shown: str, timeout: float, context: str = "") -> bytes:
    """GET ``url`` (at most MAX_BODY bytes) within ``timeout``; FetchError with a one-line reason
    starting with ``shown`` (``context`` follows an HTTP error, e.g. the query that failed)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(MAX_BODY + 1)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{shown}: HTTP {e.code} {e.reason}{context}") from None
    except urllib.error.URLError as e:
        raise FetchError(f"{shown}: unreachable: {e.reason}") from None
    except (TimeoutError, OSError, ValueError) as e:
        raise FetchError(f"{shown}: {type(e).__name__}: {e}") from None
    if len(body) > MAX_BODY:
        raise FetchError(f"{shown}: response larger than {MAX_BODY} bytes")
    return body


def fetch_status(url: str, timeout: float) -> dict[str, Any]:
    """GET ``url``'s status tree within ``timeout`` seconds; raises FetchError with a one-line reason."""
    target = status_url(url)
    body = get_body(target, target, timeout)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise FetchError(f"{target}: not JSON (is this a kube-gpu-exporter?)") from None
    if not isinstance(data, dict):
        raise FetchError(f"{target}: not a status tree (a JSON {type(data).__name__})")
    return data


def _num(value: Any, digits: int = 0) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}f}"


def _gib(value: Any) -> str:
    return _num(value / GIB, 1) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _text(value: Any) -> str:
    return "-" if value is None else " ".join(str(value).split())  # one line, whatever a name holds


def _gpu_label(gpu: Mapping[str, Any]) -> str:
    mig = gpu.get("mig")
    if isinstance(mig, Mapping):
        gi = mig.get("gpu_instance_id")
        return f"MIG {_text(mig.get('profile'))}" + ("" if gi is None else f" GI {gi}")
    return _text(gpu.get("index", gpu.get("minor")))


def _devices(status: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, device) for every GPU and, under its card, every MIG instance."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    for gpu in status.get("gpus") or []:
        if not isinstance(gpu, Mapping):
            continue
        card = _gpu_label(gpu)
        out.append((card, gpu))
        for inst in gpu.get("instances") or []:
            if isinstance(inst, Mapping):
                out.append((f"{card}/{_gpu_label(inst)}", inst))
    return out


def _health(gpu: Mapping[str, Any]) -> str:
    notes = health_notes(gpu)
    if notes is None:
        return "-"  # NVML told nothing
    return _text("; ".join(("!! " if bad else "") + text for text, bad in notes)) or "ok"


def _util(gpu: Mapping[str, Any]) -> str:
    """NVML's or GPM's percent; ``n/a`` where NVML gives this GPU none (unknown, not idle: docs/status.md)."""
    return "n/a" if utilization_note(gpu) else _num(gpu.get("utilization_percent"))


CARD = "card"  # a MIG instance's column of a card-level value (shown once, on the card's row)


def gpu_row(label: str, gpu: Mapping[str, Any]) -> Row:
    """One GPU or MIG instance: utilization, memory used/total, power draw/limit, temperature, energy
    since the driver loaded, and what needs an operator (row remapping, clocks held; ``!!``: act)."""
    memory = f"{_gib(gpu.get('memory_used_bytes'))}/{_gib(gpu.get('memory_total_bytes'))}"
    if isinstance(gpu.get("mig"), Mapping):  # the card's power, temperature, energy and health: on its row only
        return (label, _text(gpu.get("model")), _text(gpu.get("state")), _text(gpu.get("allocate_mode")),
                _util(gpu), _num(gpu.get("memory_utilization_percent")), memory,
                *(CARD for _ in range(3 + len(COLUMNS))), CARD)
    power = _num(gpu.get("power_watts"), 0)
    if gpu.get("power_limit_watts") is not None:
        power += f"/{_num(gpu.get('power_limit_watts'), 0)}"
    joules = gpu.get("energy_joules")
    energy = _num(joules / 3.6e6, 2) if isinstance(joules, int | float) and not isinstance(joules, bool) else "-"
    return (label, _text(gpu.get("model")), _text(gpu.get("state")), _text(gpu.get("allocate_mode")),
            _util(gpu), _num(gpu.get("memory_utilization_percent")), memory, power,
            _num(gpu.get("temperature_celsius")), energy, *(_num(gpu.get(f.status), 1) for f in COLUMNS),
            _health(gpu))


def container_row(label: str, c: Mapping[str, Any]) -> Row:
    """One container: where it runs, how it was allocated, what it was granted and what it uses."""
    grant = c.get("grant") if isinstance(c.get("grant"), Mapping) else {}
    use = c.get("use") if isinstance(c.get("use"), Mapping) else {}
    return (label, _text(c.get("namespace")), _text(c.get("pod")), _text(c.get("container")),
            _text(c.get("allocate_mode")), _text(c.get("scheme")), _num(grant.get("compute_percent")),
            _num(use.get("sm_percent")), _gib(grant.get("memory_bytes")), _gib(use.get("memory_bytes")))


def unaccounted_row(label: str, p: Mapping[str, Any]) -> Row:
    """One process nobody accounts for (namespace/pod/container ``-`` for a host process)."""
    return (label, _text(p.get("pid")), _text(p.get("comm")), _num(p.get("sm_percent")), _gib(p.get("memory_bytes")),
            _text(p.get("namespace")), _text(p.get("pod")), _text(p.get("container")))


def xid_row(label: str, x: Mapping[str, Any]) -> Row:
    """One Xid code on a GPU with its count, its latest time (ISO 8601), the pods that raised it, its meaning."""
    pods = [f"{_text(p.get('namespace'))}/{_text(p.get('pod'))}" for p in x.get("pods") or [] if isinstance(p, Mapping)]
    last = iso_time(x["last_at"]) if x.get("last_at") is not None else "-"
    return (label, _text(x.get("xid")), _text(x.get("count")), last, ", ".join(pods) or "-",
            _text(x.get("severity")), _text(x.get("meaning")))


def problems_of(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The served ``problems``; an exporter older than them gets them judged here, by the same code."""
    served = status.get("problems")
    if isinstance(served, list):
        return [p for p in served if isinstance(p, Mapping)]
    built, age = status.get("built_at"), status.get("snapshot_age_seconds")
    now = sum(v for v in (built, age) if isinstance(v, int | float) and not isinstance(v, bool))
    return find_problems(status, float(now))


def problem_row(p: Mapping[str, Any]) -> Row:
    """One problem: its severity (the app colours the row by it), the GPU, what is wrong and what to do."""
    gpu = "-" if p.get("minor") is None else _text(p.get("minor"))
    return (_text(p.get("severity")), gpu, _text(p.get("text")), _text(p.get("action")))


def problems_line(problems: list[Mapping[str, Any]]) -> str:
    """``5 critical, 7 warning, 2 info`` or ``nothing wrong``."""
    n = counts(problems)
    return ", ".join(f"{v} {k}" for k, v in n.items() if v) or "nothing wrong"


def subsystem_line(status: Mapping[str, Any]) -> str:
    """node, readiness, snapshot age and each subsystem's state in one line."""
    parts = [f"node {_text(status.get('node'))}", "ready" if status.get("ready") else "NOT READY"]
    if isinstance(status.get("subsystems"), Mapping):
        parts.append(problems_line(problems_of(status)))
    if status.get("snapshot_age_seconds") is not None:
        parts.append(f"age {_num(status.get('snapshot_age_seconds'), 1)}s")
    sub = status.get("subsystems")
    if isinstance(sub, Mapping):
        nvml = sub.get("nvml") or {}
        errors = sum(e.get("count", 0) for e in nvml.get("errors") or [] if isinstance(e, Mapping))
        parts.append(f"NVML {'up' if nvml.get('up') else 'DOWN'} {_text(nvml.get('driver_version'))}"
                     + (f" ({errors} errors)" if errors else ""))
        pods = sub.get("pod_cache") or {}
        parts.append(f"pods {'synced' if pods.get('synced') else 'NOT SYNCED'}"
                     + (f" ({pods.get('sync_errors')} sync errors)" if pods.get("sync_errors") else ""))
        sampler = sub.get("sampler") or {}
        parts.append(f"samples {_text(sampler.get('samples_total'))}"
                     f" failures {_text(sampler.get('sample_failures_total'))}"
                     f" cycle {_num(sampler.get('cycle_seconds'), 3)}s")
        skips = sub.get("skips") or {}
        if skips:
            parts.append("skips " + ", ".join(f"{k}={v}" for k, v in sorted(skips.items())))
    return " | ".join(parts)


def build_view(status: Mapping[str, Any]) -> View:
    """The status tree -> the header line, the message (why tables are empty) and the four tables' rows."""
    if not isinstance(status.get("gpus"), list) or "node" not in status:
        return View(header="-", message="not a kube-gpu-exporter status (no 'node' and 'gpus' fields)")
    devices = _devices(status)
    containers = [container_row(label, c) for label, d in devices for c in d.get("containers") or []
                  if isinstance(c, Mapping)]
    containers += [container_row("unplaced", c) for c in status.get("unplaced") or [] if isinstance(c, Mapping)]
    unaccounted = [unaccounted_row(label, p) for label, d in devices for p in d.get("unaccounted") or []
                   if isinstance(p, Mapping)]
    infrastructure = [unaccounted_row(label, p) for label, d in devices for p in d.get("infrastructure") or []
                      if isinstance(p, Mapping)]  # an older exporter's tree has none
    xids = [xid_row(label, x) for label, d in devices for x in d.get("xids") or [] if isinstance(x, Mapping)]
    xids += [xid_row(_text(x.get("uuid")) or "?", x) for x in status.get("other_xids") or []
             if isinstance(x, Mapping)]
    message = ""
    if not status.get("ready"):
        message = "the exporter has not published a snapshot yet"
    elif not devices:
        message = f"no GPUs on node {_text(status.get('node'))}"
    problems = [problem_row(p) for p in problems_of(status)]
    return View(header=subsystem_line(status), message=message, problems=problems,
                gpus=[gpu_row(lb, d) for lb, d in devices],
                containers=containers, unaccounted=unaccounted, infrastructure=infrastructure, xids=xids)
