"""Every dashboard number against the truth of the scenario it shows.

tests/test_dashboards.py proves each panel query returns *something* on a real Prometheus; this
proves it returns the right thing. One simulated-node exporter per scenario (the MIG, mixed and
seed examples, and the seed with a process of an unknown pod, for the skips), each in a cluster
of its own, scraped by a Prometheus with the recording rules loaded and the target labels
kube-prometheus-stack's ServiceMonitor adds (``namespace``, ``pod``, ``container`` of the exporter
pod: extra labels no query may be broken by). The truth is computed from the scenario YAML by
:class:`Truth` (never read back from the exporter or Prometheus): physical cards and the devices
Kubernetes hands out (a MIG card is one card and one device per MIG device), which container
holds what (pod-resources, HAMi and gpushare annotations), and the usage each row reports.

Each panel's query is evaluated as Grafana would at the end of its range: variables resolved with
their own ``label_values()`` queries, ``$__range`` and ``$__rate_interval`` substituted, an instant
query per target (a time series' last value). Series are named by their legend, so two series
with one legend (every MIG device "GPU 0") fail; table columns must return exactly the table's
labels, or Grafana's merge would split their rows. Every panel of every board has an expectation,
and a panel the scenario leaves empty must say why (``noValue``), not "No data".
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.bundle.dashboards.options import DashboardOptions
from exporter.bundle.dashboards.render import render_dashboards
from exporter.bundle.rules import RuleOptions, render_rules
from tests.dashboards_hardware_truth import hardware_expected
from tests.dashboards_usage_truth import usage_expected
from tests.prom_support import PROMETHEUS, ROOT, http_get, poll, query, run_prometheus, start_exporter, stop
from tests.test_dashboards import KMSG, _label_values, _regex_escape, _substitute, with_stray_process

pytestmark = pytest.mark.e2e  # every test here starts a server

EXAMPLES = ROOT / "examples"
CLUSTER = DashboardOptions(cluster_label="cluster")
# scenario (= cluster) -> file; the workloads the workload dashboard is checked on, (namespace, name)
SCENARIOS: dict[str, Path] = {
    "mig": EXAMPLES / "mig-a100-node.yaml",
    "mixed": EXAMPLES / "mixed-4gpu-node.yaml",
    "seed-exclusive": EXAMPLES / "seed-exclusive-t4.yaml",
    "seed-cgpu": EXAMPLES / "seed-cgpu-t4.yaml",
}
WORKLOADS = {
    "mig": [("research", "train-large"), ("serving", "infer-small-6d5c4b3a2"), ("research", "notebook-ana")],
    "mixed": [("ml", "trainer"), ("serving", "infer-a"), ("ml", "nightly-eval")],
    "seed-exclusive": [("default", "app-3g-v1")],
    "seed-cgpu": [("default", "app-3g-v2")],
}
STRAY = "stray"  # seed-exclusive plus a process of an unknown pod: only its exporter-health row is checked
# every health signal of issue 18 (tests/scenarios/health_node.yaml): only the node board is checked
HEALTH = "health"
Expected = dict[str, Any]  # panel title -> {series name: value or predicate}, or Rows


class Rows(list):
    """A table's expected rows: (labels, {column header: value}) pairs."""


# ------------------------------------------------------------------ the truth, from the scenario YAML

GIB, MIB = 2**30, 2**20
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")
_XID = re.compile(r"Xid \(PCI:[0-9a-f]+:([0-9a-f]+:[0-9a-f]+)\): (\d+), pid=(\d+)")


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@dataclass(frozen=True)
class Card:
    """A physical GPU: a card in the scenario's ``devices``."""

    uuid: str
    minor: int
    power_mw: float
    temperature: float


@dataclass(frozen=True)
class Device:
    """What Kubernetes hands out: a whole card, or one MIG device of a card in MIG mode (its own memory,
    no utilization, the card's minor number, power and temperature)."""

    uuid: str
    card: Card
    gpu: str  # its name in the dashboards: the minor number, or <minor>/<profile> GI <gpu instance>
    memory_total: float
    memory_used: float
    utilization: float | None
    memory_util: float | None
    pci: str
    processes: tuple[dict[str, Any], ...]


@dataclass
class Container:
    ns: str
    pod: str
    name: str
    duty: float | None = None  # summed over its rows: the device's duty cycle (exclusive), its own SM (share)
    memory: float | None = None
    request: float | None = None  # compute allocated, % of one GPU
    memory_request: float | None = None

    @property
    def used_request(self) -> float | None:
        return None if self.duty is None or not self.request else self.duty * 100 / self.request


def _add(a: float | None, b: float | None) -> float | None:
    return a if b is None else (b if a is None else a + b)


def _total(values: Any) -> float | None:
    out = None
    for v in values:
        out = _add(out, v)
    return out


@dataclass
class Pod:
    ns: str
    name: str
    uid: str
    workload: tuple[str, str]  # (kind, name)
    containers: list[Container] = field(default_factory=list)

    used = property(lambda self: _total(c.duty for c in self.containers))
    memory = property(lambda self: _total(c.memory for c in self.containers))
    request = property(lambda self: _total(c.request for c in self.containers))
    memory_request = property(lambda self: _total(c.memory_request for c in self.containers))

    @property
    def used_request(self) -> float | None:  # only the containers with a request, as the rule
        used = _total(c.duty for c in self.containers if c.request)
        return None if used is None or not self.request else used * 100 / self.request

    @property
    def memory_request_ratio(self) -> float | None:
        used = _total(c.memory for c in self.containers if c.memory_request)
        return None if used is None or not self.memory_request else used * 100 / self.memory_request

    def columns(self, t: Truth) -> dict[str, float]:
        cols = {
            "GPU used": _div(self.used, 100), "GPU requested": _div(self.request, 100),
            "Used / requested": self.used_request, "% of node GPUs": _div(self.used, len(t.devices)),
            "Memory used": self.memory, "Memory requested": self.memory_request,
            "Memory used / requested": self.memory_request_ratio,
            "% of node GPU memory": _div(self.memory, t.memory_total / 100),
        }  # fmt: skip
        return _some(**cols)


@dataclass
class Usage:
    """A namespace's or a workload's containers together."""

    used: float | None = None
    memory: float | None = None
    request: float | None = None
    memory_request: float | None = None

    def add(self, c: Container) -> None:
        self.used, self.memory = _add(self.used, c.duty), _add(self.memory, c.memory)
        self.request, self.memory_request = _add(self.request, c.request), _add(self.memory_request, c.memory_request)

    def columns(self, devices: int, memory_total: float) -> dict[str, float]:
        return _some(**{
            "GPU used": _div(self.used, 100), "GPU allocated": _div(self.request, 100),
            "% of cluster GPUs": _div(self.used, devices), "Memory used": self.memory,
            "Memory allocated": self.memory_request, "% of cluster memory": _div(self.memory, memory_total / 100),
        })  # fmt: skip


@dataclass(frozen=True)
class Allocation:
    ctr: Container
    device: Device
    compute: float | None
    memory: float | None
    share: bool  # by a sharing scheme (HAMi, gpushare), not a whole device from the kubelet


@dataclass(frozen=True)
class Row:
    """One row of the exporter's device families (docs/metrics.md)."""

    device: Device
    mode: str
    ctr: Container | None
    duty: float | None
    memory_used: float
    granted: float | None = None

    ns = property(lambda self: self.ctr.ns if self.ctr else "")
    pod = property(lambda self: self.ctr.pod if self.ctr else "")

    def labels(self, dev: dict[str, dict[str, str]]) -> dict[str, str]:
        c = self.ctr
        return {**dev[self.device.uuid], "allocate_mode": self.mode, "namespace_name": self.ns,
                "pod_name": self.pod, "container_name": c.name if c else ""}  # fmt: skip

    def columns(self) -> dict[str, float]:
        return _some(**{"Duty cycle": self.duty, "Memory used": self.memory_used,
                        "Memory total": self.device.memory_total})  # fmt: skip


@dataclass(frozen=True)
class Process:
    device: Device
    pid: int
    memory: float
    sm: float


@dataclass(frozen=True)
class Xid:
    minor: int
    xid: int
    ns: str
    pod: str
    ctr: str


class Truth:
    """What a scenario says its node has, holds and uses, in the dashboards' terms."""

    def __init__(self, doc: dict[str, Any], kmsg: str = "") -> None:
        self.doc = doc
        self.node: str = doc["node"]
        self.cards: list[Card] = []
        self.devices: list[Device] = []
        for d in doc["devices"]:
            self._card(d)
        self.pods: dict[str, Pod] = {}
        self._by_uid: dict[str, Pod] = {}
        self._by_id: dict[str, Container] = {}
        for p in doc.get("pods", []):
            self._pod(p)
        self.allocations = self._allocations(doc)
        self.rows: list[Row] = [r for d in self.devices for r in self._rows(d)]
        for r in self.rows:
            if r.ctr is not None:
                r.ctr.duty, r.ctr.memory = _add(r.ctr.duty, r.duty), _add(r.ctr.memory, r.memory_used)
        self.xids = [self._xid(m) for m in _XID.finditer(kmsg)]

    def _card(self, d: dict[str, Any]) -> None:
        card = Card(d["uuid"], d["minor_number"], d["power_usage_milliwatts"], d["temperature_celsius"])
        self.cards.append(card)
        for m in d.get("mig_devices") or ():
            gpu = f"{card.minor}/{m['profile']} GI {m['gpu_instance_id']}"
            self.devices.append(Device(m["uuid"], card, gpu, m["memory_total_bytes"], m["memory_used_bytes"], None,
                                       None, d["pci_bus_id"], tuple(m.get("processes") or ())))  # fmt: skip
        if not d.get("mig_devices"):
            self.devices.append(Device(d["uuid"], card, str(card.minor), d["memory_total_bytes"],
                                       d["memory_used_bytes"], d.get("utilization_gpu"), d.get("utilization_memory"),
                                       d["pci_bus_id"], tuple(d.get("processes") or ())))  # fmt: skip

    def _pod(self, p: dict[str, Any]) -> None:
        meta = p["metadata"]
        pod = Pod(meta["namespace"], meta["name"], meta["uid"], _workload(meta))
        ids = {s["name"]: s.get("containerID", "").split("://")[-1] for s in p["status"].get("containerStatuses", [])}
        for c in p["spec"]["containers"]:
            ctr = Container(pod.ns, pod.name, c["name"])
            pod.containers.append(ctr)
            self._by_id[ids.get(c["name"], "")] = ctr
        self.pods[pod.name] = pod
        self._by_uid[pod.uid] = pod

    def _allocations(self, doc: dict[str, Any]) -> list[Allocation]:
        """Who holds what: the kubelet's whole devices, HAMi's and gpushare's grants."""
        out = []
        for entry in doc.get("pod_resources", []):
            pod = self.pods[entry["name"]]
            for c in entry["containers"]:
                ctr = next(x for x in pod.containers if x.name == c["name"])
                for dev in c["devices"]:
                    for uuid in dev["device_ids"]:
                        d = self.device(uuid)
                        out.append(Allocation(ctr, d, 100, d.memory_total, share=False))
        for p in doc.get("pods", []):
            pod, notes = self.pods[p["metadata"]["name"]], p["metadata"].get("annotations") or {}
            hami = notes.get("hami.io/vgpu-devices-allocated", "")
            for ctr, devices in zip(pod.containers, hami.split(";"), strict=False):
                for entry in filter(None, devices.split(":")):
                    uuid, _, mem_mib, cores = entry.split(",")
                    out.append(Allocation(ctr, self.device(uuid), float(cores), float(mem_mib) * MIB, share=True))
            if "ALIYUN_COM_GPU_MEM_IDX" in notes:  # gpushare: memory in GiB, no compute
                d = next(x for x in self.devices if x.card.minor == int(notes["ALIYUN_COM_GPU_MEM_IDX"]))
                for ctr, c in zip(pod.containers, p["spec"]["containers"], strict=True):
                    gib = c["resources"]["limits"].get("aliyun.com/gpu-mem")
                    if gib:
                        out.append(Allocation(ctr, d, None, float(gib) * GIB, share=True))
        for a in out:
            a.ctr.request = _add(a.ctr.request, a.compute)
            a.ctr.memory_request = _add(a.ctr.memory_request, a.memory)
        return out

    def _container(self, cgroup: str) -> Container | None:
        m = _CONTAINER_ID.search(cgroup)
        return self._by_id.get(m.group(1)) if m else None

    def _rows(self, d: Device) -> list[Row]:
        held = [a for a in self.allocations if a.device == d]
        if any(a.share for a in held):
            rows = [Row(d, "None", None, d.utilization, d.memory_used)]
            for a in held:
                mine = [p for p in d.processes if self._container(p["cgroup"]) is a.ctr]
                sm = min(100, sum(p.get("sm_util", 0) for p in mine))
                rows.append(Row(d, "share", a.ctr, sm, sum(p["used_memory_bytes"] for p in mine), a.memory))
            return rows
        if len(held) == 1:
            return [Row(d, "exclusive", held[0].ctr, d.utilization, d.memory_used)]
        return [Row(d, "None", None, d.utilization, d.memory_used)]

    def _xid(self, m: re.Match[str]) -> Xid:
        (d,) = (x for x in self.devices if x.pci.lower().endswith(f"{m.group(1)}.0"))
        (proc,) = (p for p in d.processes if p["pid"] == int(m.group(3)))
        c = self._container(proc["cgroup"])
        return Xid(d.card.minor, int(m.group(2)), c.ns if c else "", c.pod if c else "", c.name if c else "")

    def device(self, uuid: str) -> Device:
        (d,) = (x for x in self.devices if x.uuid == uuid)
        return d

    # -------------------------------------------------------------- what the panels show

    @cached_property
    def unaccounted(self) -> list[Process]:
        """Processes on a device their container holds nothing on (host processes: no container)."""
        out = []
        for d in self.devices:
            holders = {id(a.ctr) for a in self.allocations if a.device == d}
            for p in d.processes:
                c = self._container(p["cgroup"])
                if c is None or id(c) not in holders:
                    out.append(Process(d, p["pid"], p["used_memory_bytes"], p.get("sm_util", 0)))
        return out

    @cached_property
    def skips(self) -> set[str]:
        """Reasons the exporter skips an input for: a process whose pod the API does not know."""
        uids = {m.group(1).replace("_", "-") for d in self.devices for p in d.processes
                if (m := _POD_UID.search(p["cgroup"]))}  # fmt: skip
        return {"process_pod_not_in_cache"} if uids - set(self._by_uid) else set()

    allocated_devices = property(lambda self: {a.device.uuid for a in self.allocations})
    compute_allocated = property(lambda self: sum(a.compute or 0 for a in self.allocations))
    memory_allocated = property(lambda self: sum(a.memory or 0 for a in self.allocations))
    memory_total = property(lambda self: sum(d.memory_total for d in self.devices))
    memory_used = property(lambda self: sum(d.memory_used for d in self.devices))
    utilized = property(lambda self: [d for d in self.devices if d.utilization is not None])
    utilization_sum = property(lambda self: sum(d.utilization for d in self.utilized))
    mean_utilization = property(lambda self: self.utilization_sum / len(self.utilized))

    def device_compute(self, d: Device) -> float:
        return sum(a.compute or 0 for a in self.allocations if a.device == d)

    def device_memory(self, d: Device) -> float:
        return sum(a.memory or 0 for a in self.allocations if a.device == d)

    @cached_property
    def pod_device_compute(self) -> dict[tuple[str, str, str], float]:
        out: dict[tuple[str, str, str], float] = {}
        for a in self.allocations:
            if a.compute is not None:
                key = (a.ctr.ns, a.ctr.pod, a.device.uuid)
                out[key] = out.get(key, 0) + a.compute
        return out

    def devices_of(self, pod: Pod) -> list[Device]:
        """The devices whose rows name the pod."""
        return [d for d in self.devices if any(r.device == d and r.pod == pod.name for r in self.rows)]

    @cached_property
    def namespaces(self) -> dict[str, Usage]:
        out: dict[str, Usage] = {}
        for pod in self.pods.values():
            for c in pod.containers:
                if c.memory is not None or c.request is not None:
                    out.setdefault(pod.ns, Usage()).add(c)
        return out

    @cached_property
    def workloads(self) -> dict[tuple[str, str, str], Usage]:
        out: dict[tuple[str, str, str], Usage] = {}
        for pod in self.pods.values():
            for c in pod.containers:
                if c.memory is not None or c.request is not None:
                    out.setdefault((pod.ns, *pod.workload), Usage()).add(c)
        return out

    def node_columns(self) -> dict[str, float]:
        n = len(self.devices)
        return _some(**{
            "Devices": n, "Physical GPUs": len(self.cards), "Healthy": n,
            "GPUs allocated": len(self.allocated_devices), "Compute allocated": self.compute_allocated / 100,
            "GPU used %": self.mean_utilization if self.utilized else None,
            "Without utilization": n - len(self.utilized), "Memory used %": self.memory_used * 100 / self.memory_total,
            "Memory allocated %": self.memory_allocated * 100 / self.memory_total,
        })  # fmt: skip


def _workload(meta: dict[str, Any]) -> tuple[str, str]:
    """The owner as docs/metrics.md resolves it: a Deployment's ReplicaSet and a CronJob's Job by their names."""
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None:
        return "Pod", meta["name"]
    labels, kind, name = meta.get("labels") or {}, owner["kind"], owner["name"]
    if kind == "ReplicaSet" and labels.get("pod-template-hash") and name.endswith("-" + labels["pod-template-hash"]):
        return "Deployment", name.removesuffix("-" + labels["pod-template-hash"])
    m = re.fullmatch(r"(.+)-[0-9]{8,10}", name)
    if kind == "Job" and m and name in (labels.get("batch.kubernetes.io/job-name"), labels.get("job-name")):
        return "CronJob", m.group(1)
    return kind, name


# ------------------------------------------------------------------ Prometheus and the boards


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Truth]]]:
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    tmp = tmp_path_factory.mktemp("dashboards-truth")
    (tmp / "kmsg").write_text(KMSG)
    files = {**SCENARIOS, STRAY: with_stray_process(SCENARIOS["seed-exclusive"], tmp / "stray.yaml"),
             HEALTH: ROOT / "tests" / "scenarios" / "health_node.yaml"}  # fmt: skip
    truths = {name: Truth(load(path), kmsg=KMSG if name == "mixed" else "") for name, path in files.items()}
    procs, static = [], []
    try:
        for name, path in files.items():
            extra = ("--kmsg-path", str(tmp / "kmsg"), "--kmsg-replay", "--no-events") if name == "mixed" else ()
            proc, address = start_exporter(path, truths[name].node, tmp, *extra)
            procs.append(proc)
            labels = {"cluster": name, "namespace": "monitoring", "pod": f"kube-gpu-exporter-{name}",
                      "container": "exporter"}  # fmt: skip
            static.append({"targets": [address], "labels": labels})
        # a 20 s rate window: the counters' window averages are full (and right) 20 s after the first scrape
        rules = render_rules(RuleOptions(cluster_label="cluster", interval="1s", rate_window="20s"))
        proc, base = run_prometheus(tmp, rules, static)
        procs.append(proc)
        yield base, truths
    finally:
        for proc in procs:
            stop(proc)


def _board(opts: DashboardOptions, name: str) -> dict[str, Any]:
    return json.loads(render_dashboards(opts)[f"kube-gpu-{name}.json"])


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _variables(base: str, board: dict[str, Any], chosen: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Each variable's value as Grafana sets it: ``chosen`` for single ones (which must be offered), All otherwise."""
    values: dict[str, str] = {}
    problems = []
    for var in board["templating"]["list"][1:]:
        options = _label_values(base, _substitute(var["query"], values))
        if var["multi"]:
            values[var["name"]] = "(" + "|".join(_regex_escape(o) for o in options) + ")"
        else:
            values[var["name"]] = chosen[var["name"]]
            if chosen[var["name"]] not in options:
                problems.append(f"${var['name']}: {chosen[var['name']]!r} not among {options}")
    return values, problems


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def _series(base: str, panel: dict[str, Any], values: dict[str, str]) -> tuple[dict[str, float], list[str]]:
    """{series name: value}: the legend, or the query letter of an unnamed (single-series) target."""
    out: dict[str, float] = {}
    problems = []
    for t in panel["targets"]:
        result = query(base, _substitute(t["expr"], values))
        if t["legendFormat"] == "__auto" and len(result) > 1:
            problems.append(f"[{t['refId']}] unnamed target returned {len(result)} series")
        for labels, value in result.items():
            name = t["refId"] if t["legendFormat"] == "__auto" else _legend(t["legendFormat"], dict(labels))
            if name in out:
                problems.append(f"two series named {name!r}")
            out[name] = value
    return out, problems


def _table(base: str, panel: dict[str, Any], values: dict[str, str]) -> tuple[dict[tuple, dict], list[str], list]:
    """{row key: {header: value}}, problems, and the label fields a row key is made of."""
    organize = panel["transformations"][1]["options"]
    fields = sorted((k for k in organize["renameByName"] if not k.startswith("Value #")),
                    key=lambda k: organize["indexByName"][k])  # fmt: skip
    rows: dict[tuple, dict[str, float]] = {}
    problems = []
    for t in panel["targets"]:
        header = organize["renameByName"][f"Value #{t['refId']}"]
        for labels, value in query(base, _substitute(t["expr"], values)).items():
            extra = {k for k, _ in labels} - set(fields)
            if extra:
                problems.append(f"{header}: labels {sorted(extra)} beyond the table's: its rows would not merge")
            key = tuple(dict(labels).get(f, "") for f in fields)
            if header in rows.setdefault(key, {}):
                problems.append(f"{header}: two values for row {key}")
            rows[key][header] = value
    return rows, problems, fields


def _close(got: float, want: float | Callable[[float], bool]) -> bool:
    if callable(want):
        return bool(want(got))
    return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)


def _compare(got: dict, want: dict, where: str) -> list[str]:
    problems = [f"{where}: missing {k!r} (want {want[k]})" for k in want if k not in got]
    problems += [f"{where}: unexpected {k!r} = {got[k]}" for k in got if k not in want]
    for k in want.keys() & got.keys():
        if isinstance(want[k], dict):
            problems += _compare(got[k], want[k], f"{where} {k}")
        elif not _close(got[k], want[k]):
            problems.append(f"{where}: {k!r} = {got[k]}, want {want[k]}")
    return problems


def _problems(base: str, board: dict[str, Any], chosen: dict[str, str], expected: Expected) -> list[str]:
    values, problems = _variables(base, board, chosen)
    titles = [p["title"] for p in _panels(board)]
    problems += [f"{t}: no expectation" for t in titles if t not in expected]
    problems += [f"{t}: expected, but no such panel" for t in expected if t not in titles]
    for panel in _panels(board):
        want = expected.get(panel["title"])
        if want is None:
            continue
        if panel["type"] == "table":
            got, more, fields = _table(base, panel, values)
            want = {tuple(labels.get(f, "") for f in fields): row for labels, row in want}
        else:
            got, more = _series(base, panel, values)
        problems += [f"{panel['title']}: {p}" for p in more] + _compare(got, want, panel["title"])
        if not want and not panel["fieldConfig"]["defaults"].get("noValue"):
            problems.append(f"{panel['title']}: empty here, and Grafana would only say 'No data' (no noValue)")
    return problems


def _check(base: str, board: dict[str, Any], chosen: dict[str, str], expected: Expected) -> None:
    # the rules need a few evaluations after the first scrapes: poll until the board is right
    ok = poll(lambda: not _problems(base, board, chosen, expected), deadline_s=45)
    assert ok, f"{board['title']} {chosen}:\n" + "\n".join(_problems(base, board, chosen, expected))


# ------------------------------------------------------------------ the boards' truth


def _node_expected(t: Truth, cl: dict[str, str]) -> Expected:
    node = {**cl, "node_name": t.node}
    dev = {d.uuid: {**node, "uuid": d.uuid, "gpu": d.gpu} for d in t.devices}
    gpu = {f"GPU {d.gpu}": d for d in t.devices}
    card = {f"GPU {c.minor}": c for c in t.cards}
    share = {f"GPU {r.device.gpu} {r.ns}/{r.pod}/{r.ctr.name}": r for r in t.rows if r.mode == "share"}
    return {
        "GPUs": {"devices": len(t.devices), "healthy": len(t.devices), "physical": len(t.cards)},
        "GPUs allocated": {"A": len(t.allocated_devices)},
        "Compute allocated": {"A": t.compute_allocated / 100},
        "Average temperature": {"A": sum(c.temperature for c in t.cards) / len(t.cards)},
        "Total power": {"A": sum(c.power_mw for c in t.cards)},
        "Without utilization": {"A": len(t.devices) - len(t.utilized)},
        "GPU used": {"A": t.mean_utilization} if t.utilized else {},
        "Memory used": {"A": t.memory_used * 100 / t.memory_total},
        "Memory allocated": {"A": t.memory_allocated * 100 / t.memory_total},
        "Duty cycle per GPU": {k: d.utilization for k, d in gpu.items() if d.utilization is not None},
        "Memory used per GPU": {k: d.memory_used for k, d in gpu.items()},
        "Power per GPU": {k: c.power_mw for k, c in card.items()},
        "Temperature per GPU": {k: c.temperature for k, c in card.items()},
        "Memory controller busy per GPU": {k: d.memory_util for k, d in gpu.items() if d.memory_util is not None},
        "Compute allocated per GPU": {k: t.device_compute(d) for k, d in gpu.items()},
        "Memory allocated per GPU": {k: t.device_memory(d) * 100 / d.memory_total for k, d in gpu.items()},
        "Rows by allocate_mode": {m: sum(r.mode == m for r in t.rows) for m in {r.mode for r in t.rows}},
        "GPU rows": Rows((r.labels(dev), r.columns()) for r in t.rows),
        "SM utilisation per container": {k: r.duty for k, r in share.items()},
        "Memory used per container": {k: r.memory_used for k, r in share.items()},
        "Memory used / granted per container": {
            k: r.memory_used * 100 / r.granted for k, r in share.items() if r.granted
        },
        "Compute allocated per pod and GPU": Rows(
            ({**dev[uuid], "namespace_name": ns, "pod_name": pod}, {"Compute allocated": v})
            for (ns, pod, uuid), v in t.pod_device_compute.items()
        ),
        "Xid errors": Rows(
            (
                {
                    **cl,
                    "minor_number": str(x.minor),
                    "xid": str(x.xid),
                    "namespace_name": x.ns,
                    "pod_name": x.pod,
                    "container_name": x.ctr,
                },
                {"Errors": 1},
            )
            for x in t.xids
        ),
        "Xid errors over time": {f"GPU {x.minor} Xid {x.xid}": lambda v: v >= 0 for x in t.xids},
        "Last Xid": {"A": lambda v: -60e3 < time.time() * 1000 - v < 3600e3} if t.xids else {},  # read at start
        "GPUs lost": {"A": 0},
        "Unaccounted GPU processes": Rows(
            ({**dev[p.device.uuid], "pid": str(p.pid)}, {"Memory used": p.memory, "SM utilisation": p.sm})
            for p in t.unaccounted
        ),
        **hardware_expected(t.doc, {**cl, "node_name": t.node}),
        **_health_expected(t),
    }


def _health_expected(t: Truth) -> Expected:
    return {
        "NVML": {"A": 1},
        "Pod cache": {"A": 1},
        "Snapshot age": {"A": lambda v: 0 <= v < 60},
        "Sample duration": {"sampling cycle": lambda v: 0 < v < 5},
        "Skips by reason": {reason: lambda v: v > 0 for reason in t.skips},
    }


@pytest.mark.parametrize("scenario", [*sorted(SCENARIOS), HEALTH])
def test_node_dashboard_shows_the_scenario(prom: tuple[str, dict[str, Truth]], scenario: str) -> None:
    base, truths = prom
    t = truths[scenario]
    _check(
        base, _board(CLUSTER, "node"), {"cluster": scenario, "node": t.node}, _node_expected(t, {"cluster": scenario})
    )


@pytest.mark.parametrize("scenario", ["mig", "mixed"])  # node names no other scenario has
def test_committed_node_dashboard_shows_the_scenario(prom: tuple[str, dict[str, Truth]], scenario: str) -> None:
    """The default rendering (the committed JSON) on series that carry a cluster label it does not know."""
    base, truths = prom
    t = truths[scenario]
    _check(base, _board(DashboardOptions(), "node"), {"node": t.node}, _node_expected(t, {}))


def test_exporter_health_counts_skips_by_reason(prom: tuple[str, dict[str, Truth]]) -> None:
    base, truths = prom
    t = truths[STRAY]
    assert t.skips == {"process_pod_not_in_cache"}  # what the scenario's stray process is
    board = _board(CLUSTER, "node")
    health = {p["title"] for p in _panels(board)[-len(_health_expected(t)) :]}
    assert health == set(_health_expected(t))
    board["panels"] = [p for p in board["panels"] if p.get("title") in health]
    _check(base, board, {"cluster": STRAY, "node": t.node}, _health_expected(t))


def _cluster_expected(t: Truth, cl: dict[str, str]) -> Expected:
    devices, mem = len(t.devices), t.memory_total
    ns, wl = t.namespaces, t.workloads
    wl_used = {k: v.used for k, v in wl.items() if v.used is not None}
    return {
        "GPUs": {"devices": devices, "healthy": devices, "physical": len(t.cards)},
        "Lost GPUs": {"A": 0},
        "GPUs allocated": {"A": len(t.allocated_devices)},
        "GPU memory": {"A": mem},
        "Without utilization": {"A": devices - len(t.utilized)},
        "Compute allocated": {"A": t.compute_allocated / devices},
        "Memory allocated": {"A": t.memory_allocated * 100 / mem},
        "GPU used": {"A": t.mean_utilization} if t.utilized else {},
        "Memory used": {"A": t.memory_used * 100 / mem},
        "GPUs: healthy, allocated, used": {
            "healthy": devices,
            "allocated": t.compute_allocated / 100,
            "used": t.utilization_sum / 100,
        },
        "GPU memory: healthy, allocated, used": {
            "healthy": mem,
            "allocated": t.memory_allocated,
            "used": t.memory_used,
        },
        "GPU used by namespace": {k: v.used / 100 for k, v in ns.items() if v.used is not None},
        "Share of the cluster's GPUs used": {k: v.used / devices for k, v in ns.items() if v.used is not None},
        "GPUs allocated by namespace": {k: v.request / 100 for k, v in ns.items() if v.request is not None},
        "GPU memory used by namespace": {k: v.memory for k, v in ns.items()},
        "Namespaces": Rows(({**cl, "namespace_name": k}, v.columns(devices, mem)) for k, v in ns.items()),
        "GPU used by workload (top 10)": {
            f"{k[0]}/{k[1]}/{k[2]}": v / 100 for k, v in sorted(wl_used.items(), key=lambda kv: -kv[1])[:10]
        },
        "Workloads": Rows(
            ({**cl, "namespace_name": k[0], "workload_kind": k[1], "workload_name": k[2]}, v.columns(devices, mem))
            for k, v in wl.items()
        ),
        "Nodes": Rows([({**cl, "node_name": t.node}, t.node_columns())]),
    }


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_cluster_dashboard_shows_the_scenario(prom: tuple[str, dict[str, Truth]], scenario: str) -> None:
    base, truths = prom
    _check(
        base,
        _board(CLUSTER, "cluster"),
        {"cluster": scenario},
        _cluster_expected(truths[scenario], {"cluster": scenario}),
    )


def _workload_expected(t: Truth, cl: dict[str, str], namespace: str, workload: str) -> Expected:
    devices, mem = len(t.devices), t.memory_total
    ns = t.namespaces[namespace]
    wls = {k: v for k, v in t.workloads.items() if k[0] == namespace}
    (wl,) = (v for k, v in wls.items() if k[2] == workload)
    pods = [p for p in t.pods.values() if p.ns == namespace and p.workload[1] == workload]
    ctrs = [c for p in pods for c in p.containers]
    on = [(p, d) for p in pods for d in t.devices_of(p)]
    return {
        "GPU used": {"A": ns.used / 100} if ns.used is not None else {},
        "GPU allocated": {"A": ns.request / 100} if ns.request is not None else {},
        "Share of the cluster's GPUs": {"A": ns.used / devices} if ns.used is not None else {},
        "GPU memory used": {"A": ns.memory},
        "GPU memory allocated": {"A": ns.memory_request} if ns.memory_request is not None else {},
        "Share of the cluster's GPU memory": {"A": ns.memory * 100 / mem},
        "GPU used by workload": {f"{k[1]}/{k[2]}": v.used / 100 for k, v in wls.items() if v.used is not None},
        "GPU memory used by workload": {f"{k[1]}/{k[2]}": v.memory for k, v in wls.items()},
        "GPU used vs allocated": _some(used=_div(wl.used, 100), allocated=_div(wl.request, 100)),
        "GPU memory used vs allocated": _some(used=wl.memory, allocated=wl.memory_request),
        "Share of the cluster": _some(GPU=_div(wl.used, devices), memory=wl.memory * 100 / mem),
        "GPU used / requested": _some(**{p.name: p.used_request for p in pods}),
        "GPU memory used / requested": _some(**{p.name: p.memory_request_ratio for p in pods}),
        "GPU used and requested": _some(
            **{f"{p.name} used": _div(p.used, 100) for p in pods},
            **{f"{p.name} request": _div(p.request, 100) for p in pods},
        ),
        "GPU memory used and requested": _some(
            **{f"{p.name} used": p.memory for p in pods}, **{f"{p.name} request": p.memory_request for p in pods}
        ),
        "Pods": Rows(({**cl, "node_name": t.node, "pod_name": p.name}, p.columns(t)) for p in pods),
        "Compute allocated per pod and GPU": {
            f"{pod} GPU {t.device(uuid).gpu}": v
            for (ns_, pod, uuid), v in t.pod_device_compute.items()
            if ns_ == namespace and pod in {p.name for p in pods}
        },
        "GPU used per container": _some(**{f"{c.pod}/{c.name}": _div(c.duty, 100) for c in ctrs}),
        "GPU used / requested per container": _some(**{f"{c.pod}/{c.name}": c.used_request for c in ctrs}),
        "GPU memory used per container": _some(**{f"{c.pod}/{c.name}": c.memory for c in ctrs}),
        "Device duty cycle": _some(**{f"{p.name} GPU {d.gpu}": d.utilization for p, d in on}),
        "Device power": {f"{p.name} GPU {d.gpu}": d.card.power_mw for p, d in on},
        "Device temperature": {f"{p.name} GPU {d.gpu}": d.card.temperature for p, d in on},
        **usage_expected(t, cl, namespace, pods),
    }


def _some(**values: float | None) -> dict[str, float]:
    """The values that exist: no series at all for what a scenario does not report (a MIG device's utilization)."""
    return {k: v for k, v in values.items() if v is not None}


def _div(value: float | None, by: float) -> float | None:
    return None if value is None else value / by


@pytest.mark.parametrize(("scenario", "namespace", "workload"),
                         [(s, ns, wl) for s in sorted(WORKLOADS) for ns, wl in WORKLOADS[s]])  # fmt: skip
def test_workload_dashboard_shows_the_scenario(
    prom: tuple[str, dict[str, Truth]], scenario: str, namespace: str, workload: str
) -> None:
    base, truths = prom
    t = truths[scenario]
    chosen = {"cluster": scenario, "namespace": namespace, "workload": workload}
    _check(base, _board(CLUSTER, "workload"), chosen, _workload_expected(t, {"cluster": scenario}, namespace, workload))


# ------------------------------------------------------------------ ranking over the range


def _query_range(base: str, expr: str, seconds: int) -> list[dict[str, Any]]:
    now = time.time()
    args = {"query": expr, "start": now - seconds, "end": now, "step": 1}
    body = json.loads(http_get(f"{base}/api/v1/query_range?{urllib.parse.urlencode(args)}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_top_workloads_are_ranked_over_the_range(prom: tuple[str, dict[str, Truth]]) -> None:
    """The top-N panel shows at most N workloads over a whole range query: ranked once, at the range's end."""
    base, truths = prom
    (panel,) = (p for p in _panels(_board(CLUSTER, "cluster")) if p["title"] == "GPU used by workload (top 10)")
    expr = _substitute(panel["targets"][0]["expr"].replace("topk(10,", "topk(2,"), {"cluster": "mixed"})
    expr = expr.replace("[1h]", "[20s]")  # the range of the range query below
    used = {k: v.used for k, v in truths["mixed"].workloads.items() if v.used is not None}
    top = sorted(used, key=lambda k: -used[k])[:2]
    assert len(used) > 2
    result = poll(lambda: (r := _query_range(base, expr, 20)) and len(r[0]["values"]) > 10 and r, deadline_s=30)
    assert result, "no data over the range"
    assert sorted((s["metric"]["namespace_name"], s["metric"]["workload_kind"], s["metric"]["workload_name"])
                  for s in result) == sorted(top)  # fmt: skip
    for s in result:
        key = (s["metric"]["namespace_name"], s["metric"]["workload_kind"], s["metric"]["workload_name"])
        assert all(math.isclose(float(v), used[key] / 100) for _, v in s["values"]), s


def test_truth_is_what_the_scenarios_say() -> None:
    """A few of the truths by hand, so the model computing them is checked too (docs/dashboards.md quotes them)."""
    mig = Truth(load(SCENARIOS["mig"]))
    assert (len(mig.cards), len(mig.devices), len(mig.utilized)) == (2, 4, 1)
    assert sum(c.power_mw for c in mig.cards) == 462_000  # the two cards; 886 W when counted per MIG device
    assert sorted(d.gpu for d in mig.devices) == ["0/2g.20gb GI 3", "0/2g.20gb GI 4", "0/3g.40gb GI 2", "1"]
    assert mig.mean_utilization == 64 and mig.memory_total == 160 * GIB
    mixed = Truth(load(SCENARIOS["mixed"]), kmsg=KMSG)
    assert mixed.compute_allocated == 380 and mixed.pods["infer-a-7c6b5d4f3-qwert"].request == 30
    assert [(x.minor, x.xid, x.pod) for x in mixed.xids] == [(0, 31, "trainer-5d8f7c9b4-x2k9p")]
    cgpu = Truth(load(SCENARIOS["seed-cgpu"]))
    assert cgpu.memory_allocated == 10 * GIB and cgpu.compute_allocated == 0
