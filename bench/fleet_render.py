"""One fleet node through the exporter's real path: scenario -> simulated NVML -> attribute -> render.

:func:`scenario` writes the node in the simulated node's scenario format (docs/testing.md); the
exporter's own parser, pod store, allocation schemes, attribution, usage counters and
``build_families``/``render`` turn it into the exposition, so the series shapes are the
exporter's by construction. The pipeline runs two cycles one fake second apart (the counter rows
are created at 0 by the first): the difference is each counter's rate per second, which the
server extrapolates (bench/fleet_serve.py).
"""

from __future__ import annotations

import functools
import itertools
import re
import time
import uuid as _uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.fleet_model import GIB, MIB, Device, Node, Pod
from exporter.bundle.rules import RuleOptions, render_rules
from exporter.exposition.pod_labels import parse_allowlist
from exporter.exposition.rows import LabelNames
from exporter.node.pod_store import PodStore
from exporter.node.simulate import ScenarioProc, SimulatedBackend, parse_scenario
from exporter.pipeline.cycle import Pipeline, PodState, Settings, Sources
from tests.k8s_double import make_container, make_pod

T0 = 1_700_000_000.0  # the fake clock's start: the rendered bodies carry it, the server moves counters on


@dataclass(frozen=True)
class Sample:
    """One exposition line: ``key`` is ``name{labels}`` (bytes, no value); ``rate`` per second (counters)."""

    key: bytes
    value: float
    rate: float = 0.0


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # gauge | counter | untyped
    help: str
    samples: tuple[Sample, ...]


def pod_uid(node: Node, pod: Pod) -> str:
    return str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"{node.cluster}/{pod.namespace}/{pod.name}"))


def _resources(node: Node, pod: Pod, uses: tuple) -> dict[str, str]:
    if pod.scheme == "nvidia":
        return {"nvidia.com/gpu": str(len(uses))}
    if pod.scheme == "mig":
        return {f"nvidia.com/mig-{node.devices[uses[0].device].profile}": "1"}
    u = uses[0]
    if pod.scheme == "hami":
        return {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(u.memory_grant // MIB),
                "nvidia.com/gpucores": str(int(u.compute))}
    out = {"aliyun.com/gpu-mem": str(u.memory_grant // GIB)}
    if u.compute is not None:
        out["aliyun.com/gpu-core.percentage"] = str(int(u.compute))
    return out


def _annotations(node: Node, pod: Pod) -> dict[str, str]:
    u = pod.containers[0].uses[0]
    dev = node.devices[u.device]
    if pod.scheme == "hami":
        return {"hami.io/vgpu-devices-allocated": f"{dev.uuid},NVIDIA,{u.memory_grant // MIB},{int(u.compute)}:;",
                "hami.io/vgpu-node": node.name, "hami.io/bind-phase": "success"}
    if pod.scheme == "gpushare":
        gib = str(u.memory_grant // GIB)
        return {"ALIYUN_COM_GPU_MEM_IDX": str(u.device), "ALIYUN_COM_GPU_MEM_POD": gib,
                "ALIYUN_COM_GPU_MEM_CONTAINER": gib, "ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}
    return {}


def _health(d: Device, seed: int, lean: bool) -> dict[str, Any]:
    p = d.product
    out: dict[str, Any] = {
        "energy_millijoules": 10**11 + seed * 10**7, "power_limit_milliwatts": p.power_limit_w * 1000,
        "performance_state": 0 if d.util else 8, "pcie_tx_kilobytes_per_second": 120_000 + seed,
        "pcie_rx_kilobytes_per_second": 340_000 + seed, "pcie_replay_count": 0, "pcie_link_generation": 4,
        "pcie_link_width": 16}
    if p.fan:
        out["fan_speed_percent"] = 30 + (d.util or 0) // 2
    if p.hbm:
        out |= {"memory_temperature_celsius": d.temperature + 6, "remapped_rows_correctable": 0,
                "remapped_rows_uncorrectable": 0, "remapped_rows_pending": 0, "remapped_rows_failure": 0}
    if p.pre_ampere:
        out |= {"retired_pages_single_bit": 0, "retired_pages_double_bit": 0, "retired_pages_pending": 0}
    if lean:  # no family the rules read comes from NVLink or GPM
        return out
    if p.nvlinks:
        out["nvlinks"] = [{"link": n, "active": 1, "tx_kibibytes": 10**6 * (n + 1), "rx_kibibytes": 10**6 * (n + 2),
                           "crc_errors": 0, "replay_errors": 0, "recovery_errors": 0} for n in range(p.nvlinks)]
    if p.gpm and d.util is not None:
        r = d.util / 100
        out["gpm"] = {"graphics_active": r, "sm_active": round(r * 0.9, 3), "sm_occupancy": round(r * 0.4, 3),
                      "tensor_active": round(r * 0.6, 3), "dram_active": round(r * 0.5, 3)}
    return out


def _card(d: Device, seed: int, lean: bool) -> dict[str, Any]:
    """The NVML device entry (a whole GPU, or a card in MIG mode before its mig_devices are added)."""
    out: dict[str, Any] = {
        "uuid": d.uuid if d.parent is None else d.parent, "name": d.product.name, "minor_number": d.minor,
        "pci_bus_id": f"00000000:{0x18 + 0x10 * d.minor:02X}:00.0", "memory_total_bytes": d.product.memory,
        "power_usage_milliwatts": d.power_mw, "temperature_celsius": d.temperature,
        "sm_clock_mhz": 1980 if d.util else 345, "memory_clock_mhz": 2619, "ecc_corrected": 0, "ecc_uncorrected": 0,
        "clocks_event_reasons": 0 if d.util else 1, **_health(d, seed, lean), "processes": []}
    if d.parent is None:
        out |= {"memory_used_bytes": d.memory_used, "utilization_gpu": d.util or 0,
                "utilization_memory": (d.util or 0) // 2}
        if d.lost:
            out["lost_after_ticks"] = 0
    return out


def scenario(node: Node, lean: bool = False) -> dict[str, Any]:
    """The node as a scenario mapping for ``exporter.node.simulate.parse_scenario`` (``lean``: no NVLink, GPM)."""
    pid = itertools.count(1000)
    cards: dict[str, dict[str, Any]] = {}  # card uuid -> entry
    where: dict[int, list[dict[str, Any]]] = {}  # device index -> its process list
    for i, d in enumerate(node.devices):
        if d.parent is None:
            cards[d.uuid] = _card(d, i, lean)
            where[i] = cards[d.uuid]["processes"]
            continue
        card = cards.setdefault(d.parent, _card(d, i, lean) | {"memory_used_bytes": 0, "mig_devices": []})
        mig = {"uuid": d.uuid, "profile": d.profile, "gpu_instance_id": d.gi, "compute_instance_id": 0,
               "memory_total_bytes": d.memory_total, "memory_used_bytes": d.memory_used, "processes": []}
        card["mig_devices"].append(mig)
        card["memory_used_bytes"] += d.memory_used
        where[i] = mig["processes"]
    pods, resources = [], []
    for pod in node.pods:
        uid = pod_uid(node, pod)
        conts = [make_container(c.name, limits=_resources(node, pod, c.uses)) for c in pod.containers]
        obj = make_pod(pod.name, namespace=pod.namespace, node=node.name, uid=uid, containers=conts,
                       labels=dict(pod.labels), annotations=_annotations(node, pod), owner=pod.owner)
        pods.append(obj)
        entries = []
        for c, status in zip(pod.containers, obj["status"]["containerStatuses"], strict=True):
            cid = status["containerID"].partition("://")[2]
            cgroup = (f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
                      f"cri-containerd-{cid}.scope\n")
            for u in c.uses:
                proc: dict[str, Any] = {"pid": next(pid), "used_memory_bytes": u.memory, "cgroup": cgroup}
                if u.sm is not None:
                    proc["sm_util"] = u.sm
                where[u.device].append(proc)
            if pod.scheme in ("nvidia", "mig"):  # the kubelet lists whole GPUs and MIG devices
                res = next(iter(_resources(node, pod, c.uses)))
                entries.append({"name": c.name, "devices": [
                    {"resource_name": res, "device_ids": [node.devices[u.device].uuid for u in c.uses]}]})
        if entries:
            resources.append({"name": pod.name, "namespace": pod.namespace, "containers": entries})
    for i, d in enumerate(node.devices):
        if d.host_sm or d.host_memory:
            where[i].append({"pid": next(pid), "used_memory_bytes": d.host_memory, "sm_util": d.host_sm,
                             "cgroup": "0::/system.slice/gpu-burn-probe.service\n"})
    capacity = {}
    if node.kind == "gpushare":
        per_card = node.devices[0].product.memory // GIB
        capacity = {"aliyun.com/gpu-mem": str(per_card * len(cards)), "aliyun.com/gpu-count": str(len(cards))}
    return {"node": node.name, "node_capacity": capacity, "devices": list(cards.values()), "pods": pods,
            "pod_resources": resources}


def _fake_clock(start: float) -> Iterator[float]:
    return itertools.count(start, 1.0)


def run_pipeline(node: Node, *, per_process: bool = False, allowlist: str = "", cycles: int = 2,
                 lean: bool = False) -> list[bytes]:
    """The exporter's bodies for ``cycles`` sampling cycles, one fake second apart."""
    sc = parse_scenario(scenario(node, lean))
    store = PodStore()
    store.replace(list(sc.pods), "1")
    view, skips = store.view(), dict(store.skips())
    ticks, stamps = _fake_clock(T0), _fake_clock(T0)
    sources = Sources(
        SimulatedBackend(sc, clock=lambda: next(ticks)), ScenarioProc(sc),
        lambda: PodState(view=view, synced=True, last_sync=time.time(), skips=skips),
        node_labels=lambda: sc.node_labels, pod_resources=lambda: sc.pod_resources,
        node_capacity=lambda: sc.node_capacity)
    pipeline = Pipeline(sources, Settings(node.name, LabelNames(), per_process, parse_allowlist(allowlist),
                                          clock=lambda: next(stamps)))
    return [pipeline.step()[0].body for _ in range(cycles)]


def parse_body(body: bytes) -> dict[bytes, tuple[str, str, str, float]]:
    """{sample key: (family, kind, help, value)} of a text exposition, in order."""
    out: dict[bytes, tuple[str, str, str, float]] = {}
    fam, kind, doc = "", "untyped", ""
    for line in body.splitlines():
        if line.startswith(b"# HELP "):
            fam, _, doc = line[7:].decode().partition(" ")
        elif line.startswith(b"# TYPE "):
            fam, _, kind = line[7:].decode().partition(" ")
        elif line and not line.startswith(b"#"):
            key, _, value = line.rpartition(b" ")
            out[key] = (fam, kind, doc, float(value))
    return out


def with_labels(key: bytes, extra: bytes) -> bytes:
    """``key`` with ``extra`` (``a="x",b="y"``) appended to its label set."""
    if key.endswith(b"}"):
        return key[:-1] + b"," + extra + b"}"
    return key + b"{" + extra + b"}"


def families(prev: bytes, last: bytes, extra: bytes) -> list[Family]:
    """The families of ``last``; counters (and timestamps) that moved since ``prev`` carry their rate."""
    before, after = parse_body(prev), parse_body(last)
    out: dict[str, tuple[str, str, list[Sample]]] = {}
    for key, (fam, kind, doc, value) in after.items():
        old = before.get(key, (None, None, None, value))[3]
        moving = value != old and (kind == "counter" or fam.endswith("_timestamp_seconds"))
        sample = Sample(with_labels(key, extra), value, value - old if moving else 0.0)
        out.setdefault(fam, (kind, doc, []))[2].append(sample)
    result = [Family(f, k, d, tuple(s)) for f, (k, d, s) in out.items()]
    age = b"kube_gpu_exporter_snapshot_age_seconds"  # computed per scrape by the real server
    result.append(Family(age.decode(), "gauge", "Age of the served snapshot at scrape time",
                         (Sample(with_labels(age, extra), 0.25),)))
    return result


@functools.cache
def rule_inputs() -> frozenset[str]:
    """The exporter families the recording-rule bundle reads."""
    return frozenset(re.findall(r"\bnvidia_gpu_[a-z_]+\b", render_rules(RuleOptions(cluster_label="cluster"))))


def node_families(node: Node, *, profile: str = "full", per_process: bool = False,
                  allowlist: str = "") -> list[Family]:
    """The exporter's exposition of ``node`` as families, with its ``cluster`` and ``instance`` labels.

    ``profile="rules"`` keeps only the families the rule bundle reads (what a Prometheus that keeps
    the rule inputs with a ``metric_relabel_configs`` keep rule stores); it renders without NVLink and
    GPM, which none of them depends on.
    """
    lean = profile == "rules"
    bodies = run_pipeline(node, per_process=per_process, allowlist=allowlist, lean=lean)
    out = families(bodies[-2], bodies[-1], f'cluster="{node.cluster}",instance="{node.instance}"'.encode())
    return [f for f in out if f.name in rule_inputs()] if lean else out


def node_exposition(node: Node, *, per_process: bool = False, allowlist: str = "") -> bytes:
    """What the exporter serves for ``node`` (the last cycle's body), without the target labels."""
    return run_pipeline(node, per_process=per_process, allowlist=allowlist)[-1]
