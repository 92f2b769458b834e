"""Helpers to run the real exporter (real NVML backend) against fakes of everything it reads.

One scenario file (the simulated node's format, see docs/testing.md) drives all of them:

* the fake ``libnvidia-ml.so.1`` (tests/fake_nvml), through ``LD_LIBRARY_PATH`` + ``FAKE_NVML_CONFIG``;
* a fake ``/proc`` tree (:func:`build_fake_proc`) with ``stat`` and ``cgroup`` per GPU process;
* the Kubernetes API (:class:`tests.k8s_double.ApiServerDouble`) serving the pods and the node;
* the kubelet pod-resources API (:class:`PodResourcesServer`, real grpcio on a unix socket).

:func:`exporter_node` starts them all plus ``python -m exporter`` and yields a :class:`Node`;
:func:`nvitop_exporter` starts the peer, ``nvitop-exporter`` from PyPI, on the same fake NVML;
:class:`ExporterProcess` scrapes either. Also used by ``bench/`` (:func:`generate_node`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.model import PodResources
from exporter.node.podresources import encode_list_response
from exporter.node.simulate import parse_scenario
from tests.fake_nvml import build_fake_nvml, subprocess_env, wants_old_driver, write_config
from tests.k8s_double import ApiServerDouble, make_container, make_node, make_pod
from tests.k8s_double.server import poll_until

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# The seed's metric families (plus the allocation views): rows both backends must agree on.
SEED_FAMILIES = (
    "nvidia_gpu_duty_cycle", "nvidia_gpu_memory_used_bytes", "nvidia_gpu_memory_total_bytes",
    "nvidia_gpu_gpu_sharing_memory", "nvidia_gpu_power_usage_milliwatts",
    "nvidia_gpu_temperature_celsius", "nvidia_gpu_num_devices",
)
ALLOCATED_PREFIX = "nvidia_gpu_allocated_"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
# comm may hold spaces and ")" (any 15 bytes the process chose); readers must split at the last ")"
TRICKY_COMM = "py (gpu) job) 1"
BOOT_START_TICKS = 4_200_000  # field 22 of stat: clock ticks after boot, some hours in

Key = tuple[str, frozenset[tuple[str, str]]]


# ---- polling and parsing --------------------------------------------------------------------

def poll(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Call ``fn`` until it returns something truthy and return that; fail at the deadline."""
    return poll_until(fn, timeout, interval, what)


def parse_exposition(text: str) -> dict[Key, float]:
    """Every sample of an exposition as {(name, labels): value}."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def seed_rows(samples: Mapping[Key, float]) -> dict[Key, float]:
    """The samples of the seed families and the allocation views."""
    return {k: v for k, v in samples.items()
            if k[0] in SEED_FAMILIES or k[0].startswith(ALLOCATED_PREFIX)}


def select(samples: Mapping[Key, float], metric: str, /, **labels: str) -> dict[Key, float]:
    """Samples of ``metric`` whose labels include ``labels``."""
    want = set(labels.items())
    return {k: v for k, v in samples.items() if k[0] == metric and want <= k[1]}


def value(samples: Mapping[Key, float], metric: str, /, **labels: str) -> float | None:
    """The single sample of ``metric`` with exactly these labels, or None."""
    return samples.get((metric, frozenset(labels.items())))


def render_simulated(scenario: Path, *flags: str) -> str:
    """What ``python -m exporter render --simulate SCENARIO`` prints."""
    out = subprocess.run([sys.executable, "-m", "exporter", "render", "--simulate", str(scenario), *flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise AssertionError(f"render failed ({out.returncode}): {out.stderr}")
    return out.stdout


# ---- scenarios -------------------------------------------------------------------------------

def load_scenario_dict(path: Path) -> dict[str, Any]:
    """A scenario file as a mutable dict."""
    data = yaml.safe_load(Path(path).read_text())
    assert isinstance(data, dict), f"{path}: a scenario is a mapping"
    return data


def scenario_processes(scenario: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every process entry of the scenario, in file order: a GPU's, or its MIG devices'."""
    for d in scenario.get("devices") or []:
        yield from d.get("processes") or []
        for m in d.get("mig_devices") or []:
            yield from m.get("processes") or []


def scenario_pids(scenario: Mapping[str, Any]) -> list[int]:
    """Every process pid of the scenario, in file order, without duplicates."""
    pids: list[int] = []
    for p in scenario_processes(scenario):
        if p["pid"] not in pids:
            pids.append(p["pid"])
    return pids


def _cgroup_text(pod_uid: str, container_id: str) -> str:
    runtime, _, cid = container_id.partition("://")
    prefix = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[runtime]
    uid = pod_uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"{prefix}-{cid}.scope\n")


def generate_node(gpus: int = 8, processes: int = 30, *, shared_every: int = 2,
                  node: str = "bench-node-1", seed_pid: int = 10_000) -> dict[str, Any]:
    """A node scenario: ``gpus`` A100s, every ``shared_every``-th one HAMi-shared by several pods,
    the others held whole (nvidia.com/gpu, listed by pod-resources); ``processes`` GPU processes
    spread over them, each in a pod container. Deterministic."""
    gib = 1 << 30
    devices: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    pod_resources: list[dict[str, Any]] = []
    per_gpu = [processes // gpus + (1 if i < processes % gpus else 0) for i in range(gpus)]
    pid = seed_pid
    for i in range(gpus):
        uuid = f"GPU-{i:08x}-b3c4-4d5e-8f60-{i:012x}"
        shared = shared_every > 0 and i % shared_every == shared_every - 1
        procs: list[dict[str, Any]] = []
        used = 0
        if shared:
            # one pod per process: a shared GPU with several containers on it
            for j in range(per_gpu[i]):
                name = f"infer-{i}-{j}"
                mem_mib = 8192
                pod = make_pod(name, namespace="serving", node=node, owner=("ReplicaSet", f"infer-{i}-rs"),
                               containers=[make_container("infer", limits={
                                   "nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem_mib),
                                   "nvidia.com/gpucores": "20"})],
                               annotations={HAMI_ALLOCATED: f"{uuid},NVIDIA,{mem_mib},20:;"})
                cid = pod["status"]["containerStatuses"][0]["containerID"]
                pods.append(pod)
                mem = (2 + j % 3) * gib
                used += mem
                procs.append({"pid": pid, "used_memory_bytes": mem, "sm_util": 5 + 3 * j,
                              "cgroup": _cgroup_text(pod["metadata"]["uid"], cid)})
                pid += 1
        else:
            name = f"train-{i}"
            pod = make_pod(name, namespace="ml", node=node, owner=("Job", f"train-{i}"),
                           containers=[make_container("trainer", limits={"nvidia.com/gpu": "1"})])
            cid = pod["status"]["containerStatuses"][0]["containerID"]
            pods.append(pod)
            pod_resources.append({"name": name, "namespace": "ml", "containers": [
                {"name": "trainer", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [uuid]}]}]})
            for j in range(per_gpu[i]):  # a trainer and its data-loader workers
                mem = (20 if j == 0 else 1) * gib
                used += mem
                procs.append({"pid": pid, "used_memory_bytes": mem, "sm_util": 80 if j == 0 else 2,
                              "cgroup": _cgroup_text(pod["metadata"]["uid"], cid)})
                pid += 1
        devices.append({
            "uuid": uuid, "name": "NVIDIA A100-SXM4-80GB", "minor_number": i,
            "pci_bus_id": f"00000000:{0x10 + i:02X}:00.0", "memory_total_bytes": 80 * gib,
            "memory_used_bytes": used + (512 << 20), "utilization_gpu": min(100, 10 + 10 * len(procs)),
            "utilization_memory": 30, "power_usage_milliwatts": 250_000 + 1000 * i,
            "temperature_celsius": 50 + i, "sm_clock_mhz": 1410, "memory_clock_mhz": 1593,
            "ecc_corrected": 0, "ecc_uncorrected": 0, "processes": procs,
        })
    return {"node": node, "devices": devices, "pods": pods, "pod_resources": pod_resources}


# ---- the fake /proc ----------------------------------------------------------------------------

def stat_line(pid: int, comm: str, start_ticks: int) -> str:
    """A ``/proc/<pid>/stat`` line in the kernel's format (52 fields), field 22 = ``start_ticks``."""
    # fields 3..52 after "pid (comm)": state ppid pgrp session tty_nr tpgid flags minflt cminflt
    # majflt cmajflt utime stime cutime cstime priority nice num_threads itrealvalue starttime ...
    after = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "5120", "0", "12", "0", "831", "97",
             "0", "0", "20", "0", "24", "0", str(start_ticks), "39582052352", "812345",
             "18446744073709551615", "1", "1", "0", "0", "0", "0", "0", "16781312", "17630",
             "0", "0", "0", "17", "3", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0"]
    assert len(after) == 50 and after[22 - 3] == str(start_ticks)
    return f"{pid} ({comm}) {' '.join(after)}\n"


def build_fake_proc(root: Path, scenario: Mapping[str, Any], *, missing: Sequence[int] = ()) -> Path:
    """Write ``root/<pid>/{stat,cgroup,comm}`` for each scenario process (MIG devices' included)
    except ``missing``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for p in scenario_processes(scenario):
        pid = p["pid"]
        if pid in missing:
            continue
        pdir = root / str(pid)
        pdir.mkdir(exist_ok=True)
        (pdir / "stat").write_text(stat_line(pid, TRICKY_COMM, BOOT_START_TICKS + pid))
        (pdir / "cgroup").write_text(p.get("cgroup") or "0::/system.slice/host.service\n")
        (pdir / "comm").write_text((p.get("comm") or TRICKY_COMM) + "\n")
    return root


# ---- the kubelet pod-resources API ---------------------------------------------------------

class PodResourcesServer:
    """A real grpcio server speaking the kubelet's ``v1.PodResourcesLister/List`` on a unix socket."""

    def __init__(self, pods: Sequence[PodResources] = ()) -> None:
        # sun_path is 108 bytes; pytest's tmp_path can be longer, so a short directory under /tmp
        self._dir = Path(tempfile.mkdtemp(prefix="kge-podres-"))
        self.socket_path = str(self._dir / "kubelet.sock")
        self._body = encode_list_response(pods)
        self.calls = 0
        self._server: grpc.Server | None = None

    def set_pods(self, pods: Sequence[PodResources]) -> None:
        self._body = encode_list_response(pods)

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        return self._body

    def start(self) -> PodResourcesServer:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        # no (de)serializers: raw protobuf bytes on the wire, as a kubelet sends them
        rpc = grpc.unary_unary_rpc_method_handler(self._list)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": rpc}),))
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None)
            self._server = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- a process serving /metrics -------------------------------------------------------------

def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ExporterProcess:
    """A child process serving Prometheus metrics on 127.0.0.1:``port``; output goes to ``log``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], port: int, log: Path,
                 path: str = "/metrics") -> None:
        self.argv, self.env, self.port, self.log = list(argv), dict(env), port, Path(log)
        self.url = f"http://127.0.0.1:{port}{path}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ExporterProcess:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def scrape(self, timeout: float = 5.0) -> str:
        """GET the metrics page (raises on connection errors and non-200)."""
        with urllib.request.urlopen(self.url, timeout=timeout) as resp:
            assert resp.status == 200
            return resp.read().decode()

    def try_scrape(self) -> str | None:
        """The page, or None while nothing answers yet; fails if the process died."""
        if not self.alive():
            raise AssertionError(f"{self.argv[0]} exited ({self.proc and self.proc.returncode}):\n"
                                 f"{self.output()[-4000:]}")
        try:
            return self.scrape()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Poll until the page answers; return it."""
        return poll(self.try_scrape, timeout, f"{self.url} to answer")

    def samples(self) -> dict[Key, float]:
        return parse_exposition(self.scrape())

    def wait_for(self, pred: Callable[[dict[Key, float]], Any], timeout: float,
                 what: str) -> dict[Key, float]:
        """Scrape until ``pred(samples)`` is truthy; return those samples."""
        last: dict[str, dict[Key, float]] = {}

        def check() -> dict[Key, float] | None:
            text = self.try_scrape()
            if text is None:
                return None
            last["s"] = parse_exposition(text)
            return last["s"] if pred(last["s"]) else None

        try:
            return poll(check, timeout, what, interval=0.1)
        except AssertionError as e:
            shown = "\n".join(f"{k[0]}{dict(k[1])} {v}" for k, v in sorted(
                last.get("s", {}).items(), key=lambda kv: kv[0][0]) if not k[0].startswith("python_"))
            raise AssertionError(
                f"{e}\nlast scrape:\n{shown[-6000:]}\nlog:\n{self.output()[-3000:]}") from None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)


# ---- everything together ---------------------------------------------------------------------

@dataclass
class Node:
    """A running exporter and the fakes it reads; tests change the fakes through these."""

    exporter: ExporterProcess
    api: ApiServerDouble
    podres: PodResourcesServer
    scenario: dict[str, Any]
    scenario_path: Path
    proc_root: Path


def write_scenario(scenario: Mapping[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(dict(scenario), sort_keys=False))
    return path


@contextlib.contextmanager
def exporter_node(scenario: Mapping[str, Any], workdir: Path, *, missing_pids: Sequence[int] = (),
                  api_pods: Sequence[Mapping[str, Any]] | None = None, extra_args: Sequence[str] = (),
                  interval: float = 0.2, python: str = sys.executable,
                  api_setup: Callable[[ApiServerDouble], None] | None = None) -> Iterator[Node]:
    """Start the fakes and ``python -m exporter`` (real NVML backend) for ``scenario``.

    ``api_setup`` prepares the API double before the exporter starts (e.g. the versions it serves).

    ``api_pods`` overrides the pods the API double starts with (default: the scenario's);
    ``missing_pids`` get no /proc entry. The exporter is not waited for: call ``wait_ready``.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    scenario = copy.deepcopy(dict(scenario))
    path = write_scenario(scenario, workdir / "scenario.yaml")
    parsed = parse_scenario(scenario)  # validates it the way the simulated node does
    lib = build_fake_nvml(workdir / ("nvml-old" if wants_old_driver(scenario) else "nvml"),
                          old_driver=wants_old_driver(scenario))
    config = write_config(scenario, workdir / "fake_nvml.cfg")
    proc_root = build_fake_proc(workdir / "proc", scenario, missing=missing_pids)
    node_name = scenario.get("node") or "gpu-node-1"
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(ApiServerDouble())
        api.set_nodes([make_node(node_name, labels=scenario.get("node_labels") or {})])
        api.set_resource_slices(list(scenario.get("resource_slices") or []))  # DRA objects, as the API serves them
        api.set_resource_claims(list(scenario.get("resource_claims") or []))
        if api_setup is not None:
            api_setup(api)
        initial_pods = scenario.get("pods") or [] if api_pods is None else api_pods
        for pod in initial_pods:
            api.add_pod(pod)
        podres = stack.enter_context(PodResourcesServer(parsed.pod_resources or ()))
        port = free_port()
        argv = [python, "-m", "exporter", "--host-proc", str(proc_root), "--kube-api-url", api.url,
                "--node-name", node_name, "--pod-resources-socket", podres.socket_path, "--no-xid",
                "--no-events", "--interval", str(interval), "--listen", f"127.0.0.1:{port}",
                *extra_args]
        env = subprocess_env(lib.parent, config)
        env.pop("KUBECONFIG", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        exporter = ExporterProcess(argv, env, port, workdir / "exporter.log").start()
        stack.callback(exporter.stop)
        yield Node(exporter, api, podres, scenario, path, proc_root)


NVITOP_HOSTNAME = "fake-node"  # nvitop-exporter's "hostname" label (it defaults to an IP address)


@contextlib.contextmanager
def nvitop_exporter(scenario: Mapping[str, Any], workdir: Path, *, interval: float = 0.5,
                    python: str = sys.executable) -> Iterator[ExporterProcess]:
    """Start ``nvitop-exporter`` (the PyPI package, unchanged) on the fake NVML for ``scenario``.

    nvitop asks for utilization samples newer than "one second ago" in epoch microseconds, so
    the fake stamps samples with the wall clock (``nvml.timestamps: wallclock``) unless the
    scenario says otherwise. It reads NVML only: no /proc tree, no pods.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    scenario = copy.deepcopy(dict(scenario))
    scenario["nvml"] = {"timestamps": "wallclock", **(scenario.get("nvml") or {})}
    lib = build_fake_nvml(workdir / ("nvml-old" if wants_old_driver(scenario) else "nvml"),
                          old_driver=wants_old_driver(scenario))
    config = write_config(scenario, workdir / "fake_nvml.cfg")
    port = free_port()
    argv = [python, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(port),
            "--interval", str(interval), "--hostname", NVITOP_HOSTNAME]
    proc = ExporterProcess(argv, subprocess_env(lib.parent, config), port, workdir / "nvitop.log").start()
    try:
        yield proc
    finally:
        proc.stop()
