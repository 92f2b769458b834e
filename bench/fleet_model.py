"""The synthetic fleet as plain data: nodes x 8 GPUs in blocks of 10 nodes, deterministic by seed.

Every block of ``BLOCK`` nodes is drawn from ``random.Random(f"{seed}/{block}")`` alone, so node
``i`` of a 5,000-node fleet is node ``i`` of the 100-node fleet too (the smaller fleets are
prefixes of the larger). Blocks go round-robin to the clusters and each is one kind:

- ``train``: H100/A100 SXM (NVLink) nodes, multi-node trainers (StatefulSet or Job, one pod of 8
  or two of 4 GPUs per node) spanning 1-4 nodes, some nodes or half-nodes idle;
- ``infer``: L4/A10/L40S nodes, Deployments of one-GPU replicas spread over the block's nodes;
- ``gpushare``: T4/A10 cards shared by 2-4 Alibaba gpushare pods (memory grants in GiB, half of
  them with a cGPU core percentage);
- ``hami``: A100 PCIe/L40S cards shared by 2-4 HAMi pods (``gpucores`` + ``gpumem``);
- ``mig``: A100/H100 SXM cards all in MIG mode (1g/2g/3g layouts), each MIG device held by a
  Deployment replica or free.

A few idle or shared GPUs run a host process (usage no pod accounts for) and a few idle GPUs are
lost (NVML GPU_IS_LOST). Namespace names repeat across clusters; workload and node names do not.
Values are integers as NVML reports them; shared GPUs never sum over 100 % SM.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

BLOCK = 10  # nodes per block: the unit of determinism and of one workload mix
GPUS_PER_NODE = 8
CLUSTERS = ("prod-east", "prod-west", "research")
MIB, GIB = 1 << 20, 1 << 30
KINDS = (("train", 0.35), ("infer", 0.20), ("gpushare", 0.15), ("hami", 0.15), ("mig", 0.15))


@dataclass(frozen=True)
class Product:
    """A GPU model: what NVML reports for the card and which health fields it has."""

    name: str
    memory: int  # bytes (nvmlDeviceGetMemoryInfo total)
    power_idle_w: int
    power_limit_w: int
    nvlinks: int = 0  # NVLink count (SXM boards)
    hbm: bool = False  # memory temperature and row remapping (A100/H100)
    gpm: bool = False  # Hopper GPM ratios
    fan: bool = False  # PCIe cards report a fan speed; SXM boards answer NotSupported
    pre_ampere: bool = False  # retired pages instead of row remapping


PRODUCTS = {
    "h100": Product("NVIDIA H100 80GB HBM3", 85520809984, 70, 700, nvlinks=18, hbm=True, gpm=True),
    "a100": Product("NVIDIA A100-SXM4-80GB", 85899345920, 60, 400, nvlinks=12, hbm=True),
    "a100pcie": Product("NVIDIA A100 80GB PCIe", 85899345920, 45, 300, hbm=True, fan=True),
    "l40s": Product("NVIDIA L40S", 48305799168, 35, 350, fan=True),
    "l4": Product("NVIDIA L4", 24152899584, 16, 72, fan=True),
    "a10": Product("NVIDIA A10", 23836229632, 20, 150, fan=True),
    "t4": Product("Tesla T4", 15842934784, 10, 70, fan=True, pre_ampere=True),
}
# MIG profiles (A100/H100 80GB): memory of the MIG device; layouts of one card (7 compute slices)
MIG_MEMORY = {"1g.10gb": 10200547328, "2g.20gb": 20937965568, "3g.40gb": 42094034944}
MIG_LAYOUTS = (("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"), ("1g.10gb",) * 7, ("3g.40gb", "3g.40gb"),
               ("2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"))


@dataclass(frozen=True)
class Use:
    """One container's use of one device: SM percent (None: unknown, MIG), memory used, grants."""

    device: int  # index into Node.devices
    sm: int | None
    memory: int
    compute: float | None  # granted percent of one GPU (None: the scheme grants no compute)
    memory_grant: int | None  # granted bytes (None: none)


@dataclass(frozen=True)
class Container:
    name: str
    uses: tuple[Use, ...]


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    workload_kind: str  # Deployment | StatefulSet | Job
    workload_name: str
    scheme: str  # nvidia | mig | gpushare | hami
    containers: tuple[Container, ...]
    owner: tuple[str, str]  # the controller ownerReference (ReplicaSet for a Deployment)
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Device:
    """A GPU, or a MIG device standing in its card's place (``parent`` = the card's index)."""

    uuid: str
    product: Product
    minor: int
    memory_total: int
    util: int | None  # device utilization (None on MIG devices: NVML has none)
    memory_used: int
    power_mw: int
    temperature: int
    lost: bool = False
    parent: str | None = None  # parent card uuid (MIG)
    profile: str = ""
    gi: int | None = None
    host_sm: int = 0  # a host process on it (no pod)
    host_memory: int = 0


@dataclass(frozen=True)
class Node:
    name: str
    cluster: str
    kind: str
    devices: tuple[Device, ...]
    pods: tuple[Pod, ...] = field(default=())

    @property
    def instance(self) -> str:
        return f"{self.name}:9445"


def _hex(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def gpu_uuid(text: str) -> str:
    h = _hex(text, 32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


class _Block:
    """Builds one block's nodes; devices are filled in as pods take them."""

    def __init__(self, seed: int, block: int, clusters: tuple[str, ...]) -> None:
        self.rng = random.Random(f"{seed}/{block}")
        self.block = block
        self.cluster = clusters[block % len(clusters)]
        self.kind = self.rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        cidx = block % len(clusters)
        self.names = [f"10.{cidx}.{block // 25}.{(block % 25) * BLOCK + i + 1}" for i in range(BLOCK)]
        self.pods: list[list[Pod]] = [[] for _ in range(BLOCK)]

    def workload(self, base: str) -> str:
        return f"{base}-{self.block:04d}{_suffix(self.rng, 2)}"

    def pod(self, node: int, name: str, namespace: str, kind: str, workload: str, scheme: str,
            containers: list[Container]) -> None:
        labels = {"team": namespace.split("-")[0], "app": workload}
        if kind == "Deployment":  # <deployment>-<pod-template-hash>-<suffix>
            rs = name.rsplit("-", 1)[0]
            owner = ("ReplicaSet", rs)
            labels["pod-template-hash"] = rs.rsplit("-", 1)[1]
        else:
            owner = (kind, workload)
        self.pods[node].append(Pod(name, namespace, kind, workload, scheme, tuple(containers), owner,
                                   tuple(sorted(labels.items()))))


def _device(node: str, i: int, p: Product, util: int | None, mem: int, *, minor: int | None = None,
            parent: str | None = None, profile: str = "", gi: int | None = None, total: int | None = None,
            lost: bool = False, host: tuple[int, int] = (0, 0)) -> Device:
    util_all = None if util is None else min(100, util + host[0])
    busy = 0.0 if util_all is None else util_all / 100
    power = int((p.power_idle_w + (p.power_limit_w - p.power_idle_w) * 0.85 * busy) * 1000)
    return Device(gpu_uuid(f"{node}/{i}/{profile}/{gi}") if parent is None else "MIG-" + gpu_uuid(
        f"{parent}/{gi}")[4:], p, i if minor is None else minor, total or p.memory, util_all, mem + host[1],
                  power, 30 + int(40 * busy), lost=lost, parent=parent, profile=profile, gi=gi,
                  host_sm=host[0], host_memory=host[1])


def _whole(b: _Block, node: int, devs: list[int], pod: str, ns: str, kind: str, wl: str, p: Product,
           usage: dict[int, tuple[int, int]], container: str = "main") -> None:
    uses = [Use(d, usage[d][0], usage[d][1], 100.0, p.memory) for d in devs]
    b.pod(node, pod, ns, kind, wl, "nvidia", [Container(container, tuple(uses))])


def _train(b: _Block, p: Product) -> list[dict[int, tuple[int, int]]]:
    """Trainers spanning nodes; returns per node {device: (sm, mem)} of the held GPUs."""
    rng, held = b.rng, [dict() for _ in range(BLOCK)]
    node = 0
    while node < BLOCK:
        span = min(rng.choice((1, 2, 2, 4, 4)), BLOCK - node)
        if rng.random() < 0.1:  # an idle node waiting for the next job
            node += 1
            continue
        kind = rng.choice(("StatefulSet", "Job"))
        wl = b.workload(rng.choice(("llm-pretrain", "finetune", "vision-train", "rl-policy")))
        ns = rng.choice(("ml-train", "research", "llm"))
        per_pod = rng.choice((8, 8, 4))
        rank = 0
        for n in range(node, node + span):
            pods_here = GPUS_PER_NODE // per_pod if n < node + span - 1 or rng.random() < 0.8 else 1
            for k in range(pods_here):
                devs = list(range(k * per_pod, (k + 1) * per_pod))
                name = f"{wl}-{rank}" if kind == "StatefulSet" else f"{wl}-{rank}-{_suffix(rng)}"
                usage = {d: (rng.randint(70, 99), int(p.memory * rng.uniform(0.6, 0.95))) for d in devs}
                _whole(b, n, devs, name, ns, kind, wl, p, usage, "trainer")
                held[n].update(usage)
                rank += 1
        node += span
    return held


def _infer(b: _Block, p: Product) -> list[dict[int, tuple[int, int]]]:
    rng, held = b.rng, [dict() for _ in range(BLOCK)]
    deployments = [(b.workload(rng.choice(("llm-serve", "embed", "asr", "ocr", "ranker"))),
                    rng.choice(("ml-infer", "search", "recsys")), _suffix(rng, 9)) for _ in range(rng.randint(2, 5))]
    for n in range(BLOCK):
        for d in range(GPUS_PER_NODE):
            if rng.random() < 0.2:
                continue
            wl, ns, rs = rng.choice(deployments)
            usage = {d: (rng.randint(15, 80), int(p.memory * rng.uniform(0.3, 0.9)))}
            _whole(b, n, [d], f"{wl}-{rs}-{_suffix(rng)}", ns, "Deployment", wl, p, usage, "server")
            held[n].update(usage)
    return held


def _shared(b: _Block, p: Product, scheme: str) -> list[dict[int, list[tuple[int, int]]]]:
    """2-4 pods per card; returns per node {device: [(sm, mem), ...]} of its users."""
    rng, users = b.rng, [dict() for _ in range(BLOCK)]
    names = ("ranker", "embed", "ocr", "tts", "detector", "captioner")
    deployments = [(b.workload(rng.choice(names)), rng.choice(("recsys", "vision", "speech", "ml-infer")),
                    _suffix(rng, 9)) for _ in range(rng.randint(3, 6))]
    for n in range(BLOCK):
        for d in range(GPUS_PER_NODE):
            if rng.random() < 0.1:
                continue
            k = rng.randint(2, 4)
            cores = [100 // k] * k
            mem_units = max(1, int(p.memory / GIB) // k)  # GiB per pod, all fit on the card
            users[n][d] = []
            for j in range(k):
                wl, ns, rs = rng.choice(deployments)
                sm = rng.randint(2, cores[j] - 2)
                used = int(mem_units * GIB * rng.uniform(0.4, 0.95))
                if scheme == "hami":
                    grant_mem, compute = mem_units * 1024 * MIB, float(cores[j])
                else:  # gpushare memory in GiB; cGPU core percentage on half of the pods
                    grant_mem, compute = mem_units * GIB, (float(cores[j]) if rng.random() < 0.5 else None)
                b.pod(n, f"{wl}-{rs}-{_suffix(rng)}", ns, "Deployment", wl, scheme,
                      [Container("app", (Use(d, sm, used, compute, grant_mem),))])
                users[n][d].append((sm, used))
    return users


def _mig(b: _Block, p: Product, node: int, name: str) -> list[Device]:
    rng, devices = b.rng, []
    deployments = [(b.workload(rng.choice(("notebook", "embed-small", "classifier"))),
                    rng.choice(("notebooks", "ml-infer", "research")), _suffix(rng, 9)) for _ in range(3)]
    for card in range(GPUS_PER_NODE):
        parent = gpu_uuid(f"{name}/{card}")
        for gi, profile in enumerate(rng.choice(MIG_LAYOUTS), start=1):
            total, idx = MIG_MEMORY[profile], len(devices)
            used = 0
            if rng.random() < 0.75:
                wl, ns, rs = rng.choice(deployments)
                used = int(total * rng.uniform(0.3, 0.9))
                b.pod(node, f"{wl}-{rs}-{_suffix(rng)}", ns, "Deployment", wl, "mig",
                      [Container("main", (Use(idx, None, used, 100.0, total),))])
            devices.append(_device(name, idx, p, None, used, minor=card, parent=parent, profile=profile, gi=gi,
                                   total=total))
    return devices


def _host(rng: random.Random, rate: float) -> tuple[int, int]:
    return (3, 300 * MIB) if rng.random() < rate else (0, 0)


def build_block(seed: int, block: int, clusters: tuple[str, ...] = CLUSTERS) -> list[Node]:
    """The ``BLOCK`` nodes of one block."""
    b = _Block(seed, block, clusters)
    rng = b.rng
    product = PRODUCTS[rng.choice({"train": ("h100", "a100"), "infer": ("l4", "a10", "l40s"),
                                   "gpushare": ("t4", "a10"), "hami": ("a100pcie", "l40s"),
                                   "mig": ("a100", "h100")}[b.kind])]
    nodes: list[Node] = []
    if b.kind in ("train", "infer"):
        held = (_train if b.kind == "train" else _infer)(b, product)
        for n, name in enumerate(b.names):
            devs = []
            for d in range(GPUS_PER_NODE):
                sm, mem = held[n].get(d, (0, 0))
                lost = d not in held[n] and rng.random() < 0.02
                host = (0, 0) if d in held[n] or lost else _host(rng, 0.05)
                devs.append(_device(name, d, product, None if lost else sm, mem, lost=lost, host=host))
            nodes.append(Node(name, b.cluster, b.kind, tuple(devs), tuple(b.pods[n])))
    elif b.kind in ("gpushare", "hami"):
        users = _shared(b, product, b.kind)
        for n, name in enumerate(b.names):
            devs = []
            for d in range(GPUS_PER_NODE):
                us = users[n].get(d, [])
                devs.append(_device(name, d, product, sum(s for s, _ in us), sum(m for _, m in us),
                                    host=_host(rng, 0.05)))
            nodes.append(Node(name, b.cluster, b.kind, tuple(devs), tuple(b.pods[n])))
    else:
        for n, name in enumerate(b.names):
            devices = tuple(_mig(b, product, n, name))
            nodes.append(Node(name, b.cluster, b.kind, devices, tuple(b.pods[n])))
    return nodes


def build_fleet(nodes: int, seed: int = 1, clusters: tuple[str, ...] = CLUSTERS) -> list[Node]:
    """``nodes`` nodes (rounded up to whole blocks, then cut), deterministic in ``seed``."""
    out: list[Node] = []
    for block in range(-(-nodes // BLOCK)):
        out.extend(build_block(seed, block, clusters))
    return out[:nodes]
