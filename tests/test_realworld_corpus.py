"""Real-world inputs (tests/data/realworld/): cgroup files, kernel-log lines and pod specs from public sources.

Every case was taken from another project's fixtures, documentation or bug reports and records where it
came from (see tests/data/realworld/README.md for the format). Expected values say what the input means
on the real system, not what the exporter happens to return; a failing case is a real-world input the
exporter gets wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.attribute import attribute
from exporter.attribution.cgroup import parse_cgroup
from exporter.attribution.schemes.base import MIB
from exporter.model import (
    CgroupRef,
    ClaimResource,
    DeviceSample,
    DynamicResource,
    NodeSample,
    PodResources,
    PodResourcesContainer,
    ProcessUsage,
)
from exporter.node.dra_source import static_dra
from exporter.node.pod_store import PodStore
from exporter.node.pods import parse_pod
from exporter.xid.dedup import FallenEchoFilter
from exporter.xid.parse import (
    Finding,
    GpuAnnouncement,
    ScanState,
    XidReport,
    parse_gpu_announcement,
    parse_xid_line,
    scan_line,
)

DATA = Path(__file__).parent / "data" / "realworld"
KINDS = ("cgroup", "kmsg", "pod", "dra")
MIN_CASES = 198
# dmesg's "[  219.470994]" boot-relative timestamp, wherever the line carries one.
_DMESG_TS = re.compile(r"\[\s*(?P<sec>\d+)\.(?P<usec>\d{1,6})\]")

Case = dict[str, Any]


def _load() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(DATA.glob("*.yaml")):
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        for case in loaded if isinstance(loaded, list) else [loaded]:
            case["_file"] = path.name
            cases.append(case)
    return cases


CASES = _load()


def test_corpus_is_large_enough_and_sourced() -> None:
    assert len(CASES) >= MIN_CASES
    ids = [c.get("id") for c in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    for case in CASES:
        assert isinstance(case.get("id"), str) and case["id"], case
        assert case.get("kind") in KINDS, case["id"]
        source = case.get("source")
        assert isinstance(source, Mapping), case["id"]
        assert source.get("repo") or source.get("url"), f"{case['id']}: source needs a repo or url"
        assert source.get("note"), f"{case['id']}: source needs a note"
        assert "input" in case, case["id"]
        assert "expected" in case, case["id"]


# ---------------------------------------------------------------- cgroup


def _check_cgroup(case: Case) -> None:
    parsed = parse_cgroup(case["input"])
    want = case["expected"]
    if want is None:
        assert parsed.ref is None, f"expected no pod, got {parsed.ref}"
        return
    expected = CgroupRef(want["pod_uid"], want.get("container_id"), want.get("runtime"))
    assert parsed.ref == expected


# ---------------------------------------------------------------- kmsg


def _line_time(line: str, index: int) -> int:
    """kmsg time in microseconds: dmesg's bracket when present, else one microsecond per line."""
    m = _DMESG_TS.search(line)
    if m is None:
        return index
    return int(m.group("sec")) * 1_000_000 + int(m.group("usec").ljust(6, "0"))


def _findings(text: str) -> Iterator[Finding]:
    """What the kernel-log watcher reports for these lines: Xids (fallen-off-the-bus echoes dropped)
    and the driver's PCI -> UUID announcements, in log order."""
    state = ScanState()
    echoes = FallenEchoFilter()
    for index, line in enumerate(text.split("\n")):
        state, found = scan_line(state, line)
        if "NVRM: Xid" in line:
            assert found == parse_xid_line(line)  # the scanner hands Xid lines to the line parser
        if isinstance(found, GpuAnnouncement):
            assert found == parse_gpu_announcement(line)
            yield found
        elif isinstance(found, XidReport) and not echoes.is_echo(found, _line_time(line, index)):
            yield found


def _finding_dict(found: Finding) -> dict[str, Any]:
    if isinstance(found, GpuAnnouncement):
        return {"type": "gpu", "pci": found.pci, "uuid": found.uuid}
    return {
        "type": "xid", "xid": found.xid, "pci": found.pci, "pid": found.pid, "process_name": found.process_name,
        "gpu_instance": found.gpu_instance, "compute_instance": found.compute_instance,
        "recovery_action": found.recovery_action, "numbered": found.numbered,
    }


def _check_kmsg(case: Case) -> None:
    got = [_finding_dict(f) for f in _findings(case["input"])]
    want: list[dict[str, Any]] = case["expected"] or []
    # Only the keys a case states are compared (type defaults to xid).
    trimmed = [{k: g.get(k) for k in ("type", *w)} for g, w in zip(got, want, strict=False)]
    assert trimmed == [{"type": "xid", **w} for w in want] and len(got) == len(want), f"got {got}"


# ---------------------------------------------------------------- pod


def _devices(node: Mapping[str, Any]) -> list[DeviceSample]:
    out = []
    for d in node.get("devices", []):
        total = d.get("memory_total_bytes")
        if total is None and d.get("memory_total_mib") is not None:
            total = int(d["memory_total_mib"]) * MIB
        out.append(DeviceSample(
            index=int(d["index"]), uuid=str(d["uuid"]), name=str(d.get("name", "")),
            minor_number=d.get("minor_number"), memory_total_bytes=total,
            parent_uuid=d.get("parent_uuid"), gpu_instance_id=d.get("gpu_instance_id"),
            compute_instance_id=d.get("compute_instance_id"), mig_profile=str(d.get("mig_profile", "")),
            processes=tuple(ProcessUsage(int(p["pid"]), p.get("used_memory_bytes")) for p in d.get("processes", [])),
        ))
    return out


def _pod_resources(pod_obj: Mapping[str, Any], node: Mapping[str, Any]) -> list[PodResources] | None:
    raw = node.get("pod_resources")
    if raw is None:
        return None
    meta = pod_obj["metadata"]
    containers = tuple(
        PodResourcesContainer(name, tuple((res, tuple(ids)) for res, ids in resources.items()))
        for name, resources in raw.items())
    return [PodResources(meta["name"], meta["namespace"], containers)]


_ALLOC_KEYS = ("pod", "container", "scheme", "uuid", "compute_percent", "memory_bytes", "whole", "memory_fraction")


def _norm(value: Any) -> Any:
    return round(float(value), 6) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _alloc_rows(allocs: list[dict[str, Any]], want: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    keys = [k for k in _ALLOC_KEYS if any(k in w for w in want)]
    rows = [tuple(_norm(a.get(k)) for k in keys) for a in allocs]
    return sorted(rows, key=repr)


def _check_pod(case: Case) -> None:
    obj = case["input"]
    node = case.get("node") or {}
    pod, _issues = parse_pod(obj)
    devices = _devices(node)
    labels = node.get("labels") or {}
    result = compute_allocations(AllocationInputs([pod], devices, labels, _pod_resources(obj, node)))
    want: list[dict[str, Any]] = [dict(w) for w in case["expected"] or []]
    if node.get("running"):
        # The truth is only visible at run time (which GPU the container's processes use):
        # compare the allocations as attribution places them.
        pids: dict[int, CgroupRef | None] = {}
        by_name = {c.name: c for c in pod.containers}
        for r in node["running"]:
            c = by_name[r["container"]]
            pids[int(r["pid"])] = CgroupRef(pod.uid, c.container_id, "containerd")
        store = PodStore()
        store.replace([obj], "1")
        attr = attribute(NodeSample(1.0, tuple(devices)), pids, store.view(), result.allocations)
        got = [{"container": p.container, "scheme": p.scheme, "uuid": p.uuid or None,
                "compute_percent": p.compute_percent, "memory_bytes": p.memory_bytes} for p in attr.allocations]
        # Where usage is reported (the processes' GPU), and the disagreements counted on the way.
        usage = sorted((u.container, d.device.uuid) for d in attr.devices for u in d.users)
        assert usage == sorted((u["container"], u["uuid"]) for u in case.get("expected_usage", [])), usage
        assert dict(attr.disagreements) == (case.get("expected_disagreements") or {})
    else:
        got = [{"container": a.container, "scheme": a.scheme, "uuid": a.uuid, "compute_percent": a.compute_percent,
                "memory_bytes": a.memory_bytes, "whole": a.whole, "memory_fraction": a.memory_fraction}
               for a in result.allocations]
    for w in want:
        if "memory_mib" in w:
            w["memory_bytes"] = int(w.pop("memory_mib") * MIB)
    assert _alloc_rows(got, want) == _alloc_rows(want, want), f"got {got}"


# ---------------------------------------------------------------- dra


def _kubelet_dra(raw: list[Mapping[str, Any]] | None) -> list[PodResources] | None:
    """The kubelet's pod-resources answer with its DRA entries (proto field names), None without a socket."""
    if raw is None:
        return None
    return [PodResources(p["name"], p["namespace"], tuple(
        PodResourcesContainer(c["name"], (), tuple(
            DynamicResource(d["claim_name"], d["claim_namespace"], tuple(
                ClaimResource(r["driver_name"], r["pool_name"], r["device_name"]) for r in d["claim_resources"]))
            for d in c.get("dynamic_resources", [])))
        for c in p["containers"])) for p in raw]


def _check_dra(case: Case) -> None:
    """Pods, ResourceClaims and ResourceSlices through the same sources and parsers as the daemon's."""
    objs, node = case["input"], case.get("node") or {}
    pods = [parse_pod(o)[0] for o in objs["pods"]]
    dra = static_dra(objs.get("resource_slices") or [], objs.get("resource_claims") or [], objs["pods"])
    result = compute_allocations(AllocationInputs(
        pods, _devices(node), node.get("labels") or {}, _kubelet_dra(node.get("pod_resources")),
        resource_slices=dra.resource_slices(), resource_claims=dra.resource_claims(), pod_claims=dra.pod_claims(),
        node_name=node["name"]))
    names = {p.uid: p.name for p in pods}
    got = [{"pod": names[a.pod_uid], "container": a.container, "scheme": a.scheme, "uuid": a.uuid,
            "compute_percent": a.compute_percent, "memory_bytes": a.memory_bytes, "whole": a.whole,
            "memory_fraction": a.memory_fraction} for a in result.allocations]
    want: list[dict[str, Any]] = [dict(w) for w in case["expected"] or []]
    for w in want:
        if "memory_mib" in w:
            w["memory_bytes"] = int(w.pop("memory_mib") * MIB)
    assert _alloc_rows(got, want) == _alloc_rows(want, want), f"got {got}"
    assert dict(result.skips) == (case.get("expected_skips") or {})


_CHECKS = {"cgroup": _check_cgroup, "kmsg": _check_kmsg, "pod": _check_pod, "dra": _check_dra}


@pytest.mark.parametrize("case", CASES, ids=[str(c.get("id")) for c in CASES])
def test_realworld_case(case: Case) -> None:
    _CHECKS[case["kind"]](case)
