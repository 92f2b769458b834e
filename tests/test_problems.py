"""What is wrong, worst first (exporter/exposition/problems.py): each kind from a status view, the order,
the alerts' thresholds shared (exporter/exposition/thresholds.py), and garbage that never crashes it."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exporter.bundle.alerts.cli import render_alerts
from exporter.bundle.alerts.gpu_hardware import HARDWARE_REASONS, POWER_CAP_REASONS, THERMAL_REASONS
from exporter.bundle.alerts.options import APPLICATION_XIDS, CRITICAL_XIDS, AlertOptions
from exporter.exposition import thresholds as judge
from exporter.exposition.problems import KINDS, SEVERITIES, ago, counts, find_problems, iso_time, when
from exporter.xid.parse import CATALOG

NOW = 1_796_227_921.0
GIB = 1024 ** 3


def gpu(minor: int = 0, **over: Any) -> dict[str, Any]:
    """A healthy GPU entry of a status view (the JSON form)."""
    base = {"uuid": f"GPU-{minor}", "model": "NVIDIA A100", "minor": minor, "index": minor, "state": "up",
            "temperature_celsius": 40, "clocks_event_reasons": [], "remapped_rows": None, "retired_pages": None,
            "ecc_errors": {"corrected": 0, "uncorrected": 0}, "allocate_mode": "None", "containers": [],
            "unaccounted": [], "xids": [], "last_xid_at": None, "instances": []}
    return base | over


def view(*gpus: dict[str, Any], **sub: Any) -> dict[str, Any]:
    subsystems = {"nvml": {"up": True, "driver_version": "550", "errors": []},
                  "pod_cache": {"synced": True, "age_seconds": 1.0, "sync_errors": 0},
                  "sampler": {"samples_total": 3, "sample_failures_total": 0, "cycle_seconds": 0.01},
                  "skips": {}, "pod_resources": {"state": "ok", "ok": True},
                  "kernel_log": {"state": "reading /dev/kmsg", "ok": True}, "output_failures": {}}
    for key, value in sub.items():
        subsystems[key] = subsystems[key] | value if isinstance(subsystems.get(key), dict) else value
    return {"node": "n", "ready": True, "built_at": NOW - 1, "snapshot_age_seconds": 1.0,
            "subsystems": subsystems, "gpus": list(gpus), "unplaced": [], "other_xids": [], "disagreements": {}}


def container(mode: str = "exclusive", compute: float | None = 100.0, grant_mem: int | None = None,
              sm: float | None = 50.0, mem: int | None = GIB, pod: str = "train-0") -> dict[str, Any]:
    return {"namespace": "ml", "pod": pod, "container": "main", "allocate_mode": mode, "scheme": "nvidia",
            "grant": {"compute_percent": compute, "memory_bytes": grant_mem},
            "use": None if sm is None and mem is None else {"sm_percent": sm, "memory_bytes": mem}}


def kinds(v: dict[str, Any], now: float = NOW) -> list[tuple[str, str, Any]]:
    return [(p["severity"], p["kind"], p["minor"]) for p in find_problems(v, now)]


def test_a_healthy_node_has_no_problem() -> None:
    assert find_problems(view(gpu(0, containers=[container()]), gpu(1)), NOW) == []


def test_before_the_first_snapshot_no_problem_is_made_up() -> None:
    assert find_problems({"ready": False, "subsystems": None, "gpus": []}, NOW) == []


def test_a_lost_gpu_is_critical_and_first() -> None:
    v = view(gpu(0, clocks_event_reasons=["sw_power_cap"]), gpu(1, state="lost", temperature_celsius=None))
    problems = find_problems(v, NOW)
    assert [(p["severity"], p["kind"], p["uuid"], p["minor"]) for p in problems] == [
        ("critical", "gpu_lost", "GPU-1", 1), ("info", "clocks_power", "GPU-0", 0)]
    assert problems[0]["alert"] == "KubeGpuLost" and "reset" in problems[0]["action"]


def xid(code: int, at: float, pods: list[dict] | None = None, count: int = 1) -> dict[str, Any]:
    info = CATALOG[code]
    return {"xid": code, "count": count, "last_at": at, "pods": pods or [], "meaning": info.meaning,
            "action": info.action, "severity": info.severity}


def test_xids_of_the_window_with_their_culprit_pod() -> None:
    culprit = {"namespace": "ml", "pod": "trainer-0", "container": "main", "count": 2, "last_at": NOW - 300}
    v = view(gpu(0, xids=[xid(79, NOW - 60)]), gpu(1, xids=[xid(31, NOW - 300, [culprit], 2),
                                                            xid(48, NOW - judge.XID_WINDOW_SECONDS - 1)]))
    problems = find_problems(v, NOW)
    assert [(p["severity"], p["kind"], p["minor"]) for p in problems] == [
        ("critical", "gpu_fallen_off_bus", 0), ("warning", "xid", 1)]  # Xid 48 is older than the window
    bus, app = problems
    assert bus["alert"] == "KubeGpuXidCritical" and "reboot" in bus["action"]
    assert (app["namespace"], app["pod"], app["container"], app["alert"]) == ("ml", "trainer-0", "main",
                                                                              "KubeGpuXidApplication")
    assert "Xid 31" in app["text"] and "ml/trainer-0" in app["text"] and "2 time(s)" in app["text"]
    assert iso_time(NOW - 300) in app["text"] and "5 min ago" in app["text"]
    assert app["action"] == CATALOG[31].action


def test_each_catalog_severity_is_the_alerts() -> None:
    for code in CATALOG:
        if code == 79:
            continue
        (p,) = find_problems(view(gpu(0, xids=[xid(code, NOW)])), NOW)
        expected = "critical" if code in CRITICAL_XIDS else "warning" if code in APPLICATION_XIDS else "info"
        assert p["severity"] == expected, code


def test_an_unknown_xid_is_a_warning_and_xids_of_no_gpu_count_too() -> None:
    unknown = {"xid": 999, "count": 1, "last_at": NOW, "pods": [], "severity": "unknown"}
    v = view(gpu(0, xids=[unknown]))
    v["other_xids"] = [{"uuid": "", **xid(48, NOW)}]
    assert kinds(v) == [("critical", "xid", None), ("warning", "xid", 0)]


def test_memory_repair_and_ecc() -> None:
    v = view(gpu(0, remapped_rows={"correctable": 0, "uncorrectable": 3, "pending": True, "failure": True}),
             gpu(1, remapped_rows={"correctable": 1, "uncorrectable": 0, "pending": True, "failure": False}),
             gpu(2, retired_pages={"single_bit": 50, "double_bit": 10, "pending": True}),
             gpu(3, retired_pages={"single_bit": 50, "double_bit": 9, "pending": False},
                 ecc_errors={"corrected": 5, "uncorrected": 2}))
    assert kinds(v) == [("critical", "row_remap_failed", 0), ("critical", "retired_pages_limit", 2),
                        ("critical", "ecc_uncorrected", 3), ("warning", "row_remap_pending", 1),
                        ("warning", "retired_pages_pending", 2)]  # a failed remap says "replace", not "reset"


def test_clocks_held_and_heat() -> None:
    v = view(gpu(0, clocks_event_reasons=["gpu_idle", "applications_clocks_setting"]),
             gpu(1, clocks_event_reasons=["hw_thermal_slowdown", "sw_power_cap", "hw_power_brake_slowdown"]),
             gpu(2, temperature_celsius=judge.TEMPERATURE_CELSIUS + 1), gpu(3, temperature_celsius=85))
    assert kinds(v) == [("warning", "clocks_thermal", 1), ("warning", "clocks_hardware", 1),
                        ("warning", "temperature_high", 2), ("info", "clocks_power", 1)]


def test_use_over_the_grant_idle_grants_and_unaccounted_processes() -> None:
    over = container("share", 30, 4 * GIB, 20, 5 * GIB, pod="infer-a")
    at_grant = container("share", 30, 4 * GIB, 20, 4 * GIB, pod="infer-b")
    idle = container("exclusive", 100, None, None, None, pod="nightly")
    busy = container("exclusive", 100, None, judge.IDLE_PERCENT, GIB, pod="busy")
    ollama = {"pid": 900, "comm": "ollama", "memory_bytes": 2 * GIB, "sm_percent": 5, "namespace": None,
              "pod": None, "container": None}
    v = view(gpu(0, allocate_mode="share", containers=[over, at_grant], unaccounted=[ollama]),
             gpu(1, allocate_mode="exclusive", containers=[idle]), gpu(2, containers=[busy]))
    problems = find_problems(v, NOW)
    assert [(p["severity"], p["kind"], p["pod"]) for p in problems] == [
        ("warning", "over_memory_grant", "infer-a"), ("warning", "unaccounted_process", None),
        ("info", "allocated_idle", "nightly")]
    assert "125 %" in problems[0]["text"] and problems[0]["alert"] == "KubeGpuContainerOverMemoryGrant"
    assert "PID 900 (ollama) on the host" in problems[1]["text"]
    assert "whole" in problems[2]["text"]


def test_mig_instances_are_judged_under_their_card() -> None:
    inst = gpu(0, uuid="MIG-a", mig={"profile": "3g.40gb"}, remapped_rows={"pending": True},
               containers=[container("exclusive", 100, None, None, None)])  # NVML gives no MIG utilization
    inst["unaccounted"] = [{"pid": 7, "comm": None, "memory_bytes": None, "sm_percent": None, "pod": "x",
                            "namespace": "ns", "container": "c"}]
    card = gpu(0, remapped_rows={"pending": True}, instances=[inst])
    problems = find_problems(view(card), NOW)
    assert [(p["kind"], p["uuid"]) for p in problems] == [("row_remap_pending", "GPU-0"),
                                                         ("unaccounted_process", "MIG-a")]
    assert "MIG 3g.40gb" in problems[1]["text"] and "of pod ns/x" in problems[1]["text"]


def test_degraded_subsystems() -> None:
    v = view(nvml={"up": False, "errors": [{"call": "nvmlInit", "error": "DriverNotLoaded", "count": 3}]},
             pod_cache={"synced": False}, pod_resources={"state": "unavailable (timeout)", "ok": False},
             kernel_log={"state": "cannot read /dev/kmsg: Xid watcher disabled", "ok": False},
             sampler={"sample_failures_total": 2}, output_failures={"status": 1, "rows": 0})
    v["snapshot_age_seconds"] = judge.SNAPSHOT_STALE_SECONDS + 1
    assert [k for _, k, _ in kinds(v)] == ["nvml_down", "pod_cache_not_synced", "pod_resources_unavailable",
                                           "kernel_log_unreadable", "snapshot_stale", "nvml_errors",
                                           "sample_failures", "output_failures"]
    quiet = view(pod_resources={"state": "no socket at /x", "ok": None}, kernel_log={"state": "none", "ok": None})
    assert find_problems(quiet, NOW) == []  # a source not in use is no problem


def test_times_in_iso_8601_and_ago() -> None:
    assert iso_time(0) == "1970-01-01T00:00:00Z" and iso_time(None) == "?" and iso_time(float("nan")) == "?"
    assert iso_time(1e300) == "?"
    assert [ago(NOW - s, NOW) for s in (12, 300, 7300, 200000)] == ["12 s ago", "5 min ago", "2 h ago", "2 d ago"]
    assert ago(NOW + 5, NOW) == "0 s ago" and when(NOW - 60, NOW).endswith("(1 min ago)")


def test_counts_by_severity() -> None:
    v = view(gpu(0, state="lost"), gpu(1, clocks_event_reasons=["sw_power_cap"]))
    assert counts(find_problems(v, NOW)) == {"critical": 1, "warning": 0, "info": 1}


def test_thresholds_are_the_alerts_defaults() -> None:
    """One declaration: the page's judgement is the default alerts' (thresholds.py feeds both)."""
    opts = AlertOptions()
    assert (opts.xid_window, opts.temperature_celsius, opts.retired_pages_limit, opts.idle_percent,
            opts.snapshot_stale_seconds) == (judge.XID_WINDOW, judge.TEMPERATURE_CELSIUS, judge.RETIRED_PAGES_LIMIT,
                                             judge.IDLE_PERCENT, judge.SNAPSHOT_STALE_SECONDS)
    assert (THERMAL_REASONS, HARDWARE_REASONS, POWER_CAP_REASONS) == (
        judge.THERMAL_REASONS, judge.HARDWARE_REASONS, judge.POWER_CAP_REASONS)
    text = render_alerts(opts)
    assert "[10m]" in text and "> 85" in text and ">= 60" in text and "< 1)" in text
    named = {p["alert"] for p in _every_kind()} - {None}
    assert all(f"alert: {name}" in text for name in named), sorted(named)


def _every_kind() -> list[dict[str, Any]]:
    """One view with a problem of each kind."""
    culprit = {"namespace": "ml", "pod": "t", "container": "c", "count": 1, "last_at": NOW}
    v = view(gpu(0, state="lost"), gpu(1, xids=[xid(79, NOW), xid(31, NOW, [culprit])],
                                       remapped_rows={"failure": True}, ecc_errors={"uncorrected": 1},
                                       retired_pages={"single_bit": 60, "pending": True}),
             gpu(2, remapped_rows={"pending": True}, temperature_celsius=99,
                 clocks_event_reasons=list(THERMAL_REASONS + HARDWARE_REASONS + POWER_CAP_REASONS),
                 containers=[container("share", 30, GIB, 0, 2 * GIB)],
                 unaccounted=[{"pid": 1, "comm": "x", "memory_bytes": 1, "sm_percent": 1}]),
             nvml={"up": False, "errors": [{"call": "c", "error": "e"}]}, pod_cache={"synced": False},
             pod_resources={"ok": False}, kernel_log={"ok": False}, sampler={"sample_failures_total": 1},
             output_failures={"rows": 1})
    v["snapshot_age_seconds"] = 1e4
    return find_problems(v, NOW)


def test_every_kind_has_its_fields() -> None:
    problems = _every_kind()
    assert {p["kind"] for p in problems} == set(KINDS)
    for p in problems:
        assert set(p) == {"severity", "kind", "uuid", "minor", "namespace", "pod", "container", "xid", "text",
                          "action", "alert"}
        assert (p["xid"] is not None) == (p["kind"] in ("xid", "gpu_fallen_off_bus"))
        assert p["text"] and p["action"] and "\n" not in p["text"] + p["action"]
    json.dumps(problems, allow_nan=False)


def test_the_view_is_left_unchanged() -> None:
    v = view(gpu(0, state="lost", xids=[xid(31, NOW)]))
    before = copy.deepcopy(v)
    find_problems(v, NOW)
    assert v == before


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=4), max_leaves=30)
_keys = st.sampled_from(["state", "xids", "containers", "unaccounted", "remapped_rows", "retired_pages", "mig",
                         "clocks_event_reasons", "temperature_celsius", "ecc_errors", "instances", "minor"])
_gpu = st.dictionaries(_keys, _json, max_size=8)
_view = st.fixed_dictionaries({"subsystems": st.one_of(_json, st.just(view()["subsystems"])),
                               "gpus": st.one_of(_json, st.lists(_gpu, max_size=3)),
                               "other_xids": _json, "snapshot_age_seconds": _json})


@given(v=_view, now=st.floats(allow_nan=True))
def test_any_tree_gives_a_sorted_list_and_never_raises(v: dict[str, Any], now: float) -> None:
    problems = find_problems(v, now)
    ranks = [SEVERITIES.index(p["severity"]) for p in problems]
    assert ranks == sorted(ranks)
    assert all(p["kind"] in KINDS and "\n" not in p["text"] for p in problems)
    json.dumps(problems, allow_nan=False)  # served as is in /status.json
