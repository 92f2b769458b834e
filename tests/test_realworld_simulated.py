"""Real-world sharing setups end to end on the simulated node: one examples/realworld-*.yaml per platform.

Each scenario's ``description`` says what it models. It runs through the production pipeline in process
(sample -> attribute -> snapshot -> render) as tests/test_simulate.py does, and the expected rows are what
the situation means, worked out from the scenario's cards, pods and processes.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest
import yaml

from exporter.exposition.snapshot import Snapshot
from exporter.exposition.status import status_view
from exporter.exposition.status_html import render_html
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from tests.integration_support import ExporterProcess, Key, free_port, parse_exposition, seed_rows

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCENARIOS = sorted(EXAMPLES.glob("realworld-*.yaml"))
MIB, GIB = 1 << 20, 1 << 30
Samples = dict[Key, float]


def step(name: str, *flags: str) -> Snapshot:
    """One sampling cycle of ``examples/<name>`` with the exporter's ``flags``."""
    daemon = build_daemon(load_config(["--simulate", str(EXAMPLES / name), *flags]))
    try:
        snapshot, _ = daemon.pipeline.step()
    finally:
        daemon.close()
    return snapshot


@functools.cache
def scrape(name: str) -> Samples:
    """Every sample one sampling cycle of ``examples/<name>`` renders (per-process rows included)."""
    return parse_exposition(step(name, "--per-process-metrics").body.decode())


def rows(s: Samples, metric: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``metric`` whose labels include ``labels``."""
    want = set(labels.items())
    return [(dict(lbl), v) for (name, lbl), v in s.items() if name == metric and want <= lbl]


def one(s: Samples, metric: str, **labels: str) -> float:
    """The value of the single sample of ``metric`` whose labels include ``labels``."""
    hits = rows(s, metric, **labels)
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0][1]


def modes(s: Samples, uuid: str) -> set[str]:
    """The allocate_mode values of a device's memory-used rows."""
    return {lbl["allocate_mode"] for lbl, _ in rows(s, "nvidia_gpu_memory_used_bytes", uuid=uuid)}


def who(namespace: str, pod: str, container: str) -> dict[str, str]:
    return {"namespace_name": namespace, "pod_name": pod, "container_name": container}


# ---- every scenario --------------------------------------------------------------------------

def test_every_realworld_scenario_has_its_checks() -> None:
    """A scenario file without its test below would only be checked for running at all."""
    checked = {name.removeprefix("test_").replace("_", "-") + ".yaml" for name in globals()
               if name.startswith("test_realworld_")}
    assert {p.name for p in SCENARIOS} == checked


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_scenario_is_described_skips_nothing_and_lists_every_pod(scenario: Path) -> None:
    doc = yaml.safe_load(scenario.read_text())
    assert isinstance(doc.get("description"), str) and len(doc["description"]) > 80
    s = scrape(scenario.name)
    assert rows(s, "kube_gpu_exporter_skips_total") == []
    listed = {(lbl["namespace_name"], lbl["pod_name"], lbl["pod_uid"]) for lbl, _ in rows(s, "nvidia_gpu_pod_info")}
    assert listed == {(p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["uid"]) for p in doc["pods"]}


# ---- 1. containerd's colon form under cgroup v1 ---------------------------------------------

A10 = 24146608128


def test_realworld_containerd_colon() -> None:
    s = scrape("realworld-containerd-colon.yaml")
    held = [  # uuid, the pod's container, the card's utilization and memory used, its process and memory
        ("GPU-5c0d6a3e-8f41-2b97-e1a4-7d2f90b36c18", who("genai", "sd-finetune-7f9c6d5b8-m4wq2", "trainer"),
         93, 18213765120, "28814", 17716740096),
        ("GPU-a83f1e27-40c6-9d5b-37e2-b1c84a6f0d93", who("speech", "whisper-api-5b7d8c9f6-tj8xz", "server"),
         41, 9328132096, "31207", 8831107072),
        ("GPU-e14b7c09-6a2d-f385-c0d7-59a3e812b4f6", who("perf", "bench-resnet50-0", "bench"),
         99, 21722808320, "40913", 21225783296),
    ]
    for uuid, pod, util, used, pid, process_memory in held:
        assert modes(s, uuid) == {"exclusive"}
        assert one(s, "nvidia_gpu_duty_cycle", uuid=uuid, allocate_mode="exclusive", **pod) == util
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=uuid, allocate_mode="exclusive", **pod) == used
        assert one(s, "nvidia_gpu_allocated_memory_bytes", uuid=uuid, allocate_mode="exclusive",
                   scheme="nvidia", **pod) == A10
        assert one(s, "nvidia_gpu_allocated_compute_percent", uuid=uuid, scheme="nvidia", **pod) == 100
        assert one(s, "nvidia_gpu_process_memory_used_bytes", uuid=uuid, pid=pid, **pod) == process_memory
    assert modes(s, "GPU-0b9e2d71-c3f8-46a0-8e15-d27a6c94f3e2") == {"None"}
    assert rows(s, "nvidia_gpu_unaccounted_process_memory_used_bytes") == []


# ---- 2. Tencent vcuda: predicate-gpu-idx names the device minor ------------------------------

V100 = 34359738368
MINOR_2 = "GPU-7d3f2a91-5c8e-0b46-e2d1-9a6c4f8b3e57"  # NVML index 0
MINOR_0 = "GPU-c2e8b05f-91a4-7d63-4fb0-6e1d83a2c9f4"  # NVML index 1
VCUDA_UNIT = 256 * MIB


def test_realworld_vcuda_minor() -> None:
    s = scrape("realworld-vcuda-minor.yaml")
    bert = who("nlp", "bert-train-worker-0", "worker")
    assert modes(s, MINOR_2) == {"exclusive"}
    assert one(s, "nvidia_gpu_duty_cycle", uuid=MINOR_2, minor_number="2", allocate_mode="exclusive", **bert) == 97
    assert one(s, "nvidia_gpu_allocated_compute_percent", uuid=MINOR_2, minor_number="2", allocate_mode="exclusive",
               scheme="tencent-vcuda", **bert) == 100
    assert one(s, "nvidia_gpu_allocated_memory_bytes", uuid=MINOR_2, scheme="tencent-vcuda", **bert) == V100
    assert modes(s, MINOR_0) == {"None", "share"}
    shared = [(who("vision", "ocr-serving-6c8d9f7b5-h2kq9", "ocr"), 50, 32, 44, 6 * GIB),
              (who("vision", "face-embed-0", "embed"), 30, 20, 13, 3 * GIB)]
    for pod, cores, units, sm, used in shared:
        alloc = {"uuid": MINOR_0, "minor_number": "0", "allocate_mode": "share", "scheme": "tencent-vcuda", **pod}
        assert one(s, "nvidia_gpu_allocated_compute_percent", **alloc) == cores
        assert one(s, "nvidia_gpu_allocated_memory_bytes", **alloc) == units * VCUDA_UNIT
        assert one(s, "nvidia_gpu_gpu_sharing_memory", uuid=MINOR_0, allocate_mode="share", **pod) == units * VCUDA_UNIT
        assert one(s, "nvidia_gpu_duty_cycle", uuid=MINOR_0, allocate_mode="share", **pod) == sm
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=MINOR_0, allocate_mode="share", **pod) == used
        assert rows(s, "nvidia_gpu_allocated_compute_percent", uuid=MINOR_2, **pod) == []
    assert rows(s, "kube_gpu_exporter_allocation_disagreements") == []
    assert rows(s, "nvidia_gpu_unaccounted_process_memory_used_bytes") == []


# ---- 3. Alibaba gpushare with --memory-unit=MiB --------------------------------------------

T4_0, T4_1 = "GPU-4e9a7c21-0d3b-58f6-a1e2-6b7c9d0f3a85", "GPU-b1d5f8e3-6a27-c940-3e8d-05f2a7b9c416"


def test_realworld_gpushare_mib() -> None:
    s = scrape("realworld-gpushare-mib.yaml")
    placed = [(T4_0, who("recsys", "rec-ranker-8d7f6c5b4-q9w2e", "ranker"), 4000, 38, 3565158400),
              (T4_0, who("recsys", "rec-ranker-8d7f6c5b4-zx81k", "ranker"), 4000, 21, 3040870400),
              (T4_1, who("media", "video-transcode-5f4e3d2c1-b7n5m", "ffmpeg"), 7000, 46, 6301941760)]
    for uuid, pod, mib, sm, used in placed:
        assert one(s, "nvidia_gpu_allocated_memory_bytes", uuid=uuid, allocate_mode="share",
                   scheme="aliyun-gpushare", **pod) == mib * MIB
        assert one(s, "nvidia_gpu_gpu_sharing_memory", uuid=uuid, allocate_mode="share", **pod) == mib * MIB
        assert one(s, "nvidia_gpu_duty_cycle", uuid=uuid, allocate_mode="share", **pod) == sm
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=uuid, allocate_mode="share", **pod) == used
    assert modes(s, T4_0) == modes(s, T4_1) == {"None", "share"}
    assert rows(s, "nvidia_gpu_allocated_compute_percent") == []  # memory-only requests grant no compute


# ---- 4. NVIDIA device plugin with MPS (replicas 4) -------------------------------------------

H100 = 85520809984
H100_0, H100_1 = "GPU-8f2c6e4a-1b93-d705-4a8e-c6f19b2d7e30", "GPU-3a7d9b15-e2c4-68f0-b3d1-7f5e0a9c2b84"
MPS_CLIENTS = [(H100_0, who("llm", "llama3-8b-vllm-7c9f8d6b5-2kx7p", "vllm"), 24, 19327352832),
               (H100_0, who("llm", "llama3-8b-vllm-7c9f8d6b5-9mv3c", "vllm"), 25, 19327352832),
               (H100_0, who("llm", "llama3-8b-vllm-7c9f8d6b5-tq5wn", "vllm"), 19, 16106127360),
               (H100_1, who("search", "bge-embedder-6b5c4d3e2-lr6hd", "embedder"), 17, 5502926848)]


def test_realworld_nvidia_mps() -> None:
    s = scrape("realworld-nvidia-mps.yaml")
    for uuid, pod, sm, used in MPS_CLIENTS:
        alloc = {"uuid": uuid, "allocate_mode": "share", "scheme": "nvidia-mps", **pod}
        assert one(s, "nvidia_gpu_allocated_memory_bytes", **alloc) == H100 // 4
        assert one(s, "nvidia_gpu_allocated_compute_percent", **alloc) == 25
        assert one(s, "nvidia_gpu_duty_cycle", uuid=uuid, allocate_mode="share", **pod) == sm
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=uuid, allocate_mode="share", **pod) == used
    assert modes(s, H100_0) == modes(s, H100_1) == {"None", "share"}
    # The control daemon's nvidia-cuda-mps-server holds no GPU and runs in the device plugin's namespace: the
    # GPUs' infrastructure (attribution rule 9), neither a share user nor unaccounted, so
    # KubeGpuUnaccountedProcesses stays silent; its process rows keep its pod's labels.
    daemon = who("nvidia-device-plugin", "nvidia-device-plugin-mps-control-daemon-6xq4t", "mps-control-daemon-ctr")
    assert rows(s, "nvidia_gpu_unaccounted_process_memory_used_bytes") == []
    assert rows(s, "nvidia_gpu_duty_cycle", **daemon) == rows(s, "nvidia_gpu_allocated_memory_bytes", **daemon) == []
    for uuid in (H100_0, H100_1):
        assert one(s, "nvidia_gpu_process_memory_used_bytes", uuid=uuid, pid="3301", **daemon) == 31457280


def test_the_mps_server_is_listed_as_infrastructure_and_raises_no_problem() -> None:
    snapshot = step("realworld-nvidia-mps.yaml")
    tree = status_view(snapshot.status, 0, snapshot.status["built_at"], True)
    for gpu in tree["gpus"]:
        assert gpu["unaccounted"] == []
        assert [(p["pid"], p["comm"], p["namespace"]) for p in gpu["infrastructure"]] == [
            (3301, "nvidia-cuda-mps", "nvidia-device-plugin")]
    assert not [p for p in tree["problems"] if p["kind"] == "unaccounted_process"]
    page = render_html(tree).decode()
    assert page.count("<h3>Infrastructure (MPS daemons)</h3>") == 2 and "<h3>Unaccounted processes</h3>" not in page


def test_an_mps_daemon_outside_the_infrastructure_namespaces_stays_unaccounted() -> None:
    """The command name is its author's; the namespace is not: with the device plugin's namespace not
    listed, its server is a process no container was allocated the GPU for, as before rule 9."""
    s = parse_exposition(step("realworld-nvidia-mps.yaml", "--infrastructure-namespaces", "kube-system").body.decode())
    daemon = who("nvidia-device-plugin", "nvidia-device-plugin-mps-control-daemon-6xq4t", "mps-control-daemon-ctr")
    for uuid in (H100_0, H100_1):
        assert one(s, "nvidia_gpu_unaccounted_process_memory_used_bytes", uuid=uuid, pid="3301", **daemon) == 31457280



def test_mps_share_rows_carry_the_memory_each_client_was_allocated() -> None:
    s = scrape("realworld-nvidia-mps.yaml")
    for uuid, pod, _, _ in MPS_CLIENTS:
        assert one(s, "nvidia_gpu_gpu_sharing_memory", uuid=uuid, allocate_mode="share", **pod) == H100 // 4


# ---- 5. GKE's device plugin, time-sharing ---------------------------------------------------

L4_0, L4_1 = "GPU-2f6b8d14-a7c3-95e0-1d4f-b8e3c6a07d52", "GPU-9c4e1a73-05d8-b2f6-e7a9-3d1c5f8b6e20"


def test_realworld_gke_time_sharing() -> None:
    s = scrape("realworld-gke-time-sharing.yaml")
    for pod, sm, used in [(who("inference", "gemma-2b-tgi-5d9c7b8f4-wk2tn", "tgi"), 52, 11274289152),
                          (who("inference", "clip-embed-84f7c6d9b-5hrzq", "clip"), 23, 6006243328)]:
        assert one(s, "nvidia_gpu_duty_cycle", uuid=L4_1, minor_number="1", allocate_mode="share", **pod) == sm
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=L4_1, allocate_mode="share", **pod) == used
        assert rows(s, "nvidia_gpu_duty_cycle", uuid=L4_0, **pod) == []
    assert modes(s, L4_1) == {"None", "share"}
    assert modes(s, L4_0) == {"None"}
    # time-sharing grants no fixed compute or memory share
    assert rows(s, "nvidia_gpu_allocated_compute_percent") == rows(s, "nvidia_gpu_allocated_memory_bytes") == []
    assert rows(s, "nvidia_gpu_unaccounted_process_memory_used_bytes") == []


# ---- 6. HAMi: initContainer segment numbering and dynamic MIG --------------------------------

HAMI_0, HAMI_1 = "GPU-6e1f3b8a-2d47-c59e-a0b3-8f4d1c7e9a26", "GPU-d08a5c2e-7b19-4f63-e8d1-2a6c9b3f5e74"
MIG_PARENT = "GPU-4a7c0e93-b16d-28f5-c3e7-9d2b5f8a1c60"
MIG_JOB, MIG_IDLE = "MIG-5d2e8b41-9c03-5a7f-b6e1-04d9c3a8f217", "MIG-b8f1c6d3-2e7a-5940-8d5c-a3e9f0b7c182"
MIG_3G_20GB = 19968 * MIB


def test_realworld_hami() -> None:
    s = scrape("realworld-hami.yaml")
    rag = ("ai-apps", "rag-serving-7b6d5c9f8-p4n2x")
    for uuid, container, mib, cores, sm, used in [(HAMI_0, "llm", 4000, 30, 27, 3758096384),
                                                  (HAMI_1, "reranker", 8000, 50, 44, 7516192768)]:
        pod = who(*rag, container)
        alloc = {"uuid": uuid, "allocate_mode": "share", "scheme": "hami", **pod}
        assert one(s, "nvidia_gpu_allocated_memory_bytes", **alloc) == mib * MIB
        assert one(s, "nvidia_gpu_allocated_compute_percent", **alloc) == cores
        assert one(s, "nvidia_gpu_gpu_sharing_memory", uuid=uuid, allocate_mode="share", **pod) == mib * MIB
        assert one(s, "nvidia_gpu_duty_cycle", uuid=uuid, allocate_mode="share", **pod) == sm
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=uuid, allocate_mode="share", **pod) == used
    assert rows(s, "nvidia_gpu_duty_cycle", container_name="fetch-model") == []
    assert rows(s, "nvidia_gpu_allocated_memory_bytes", container_name="fetch-model") == []
    assert rows(s, "kube_gpu_exporter_allocation_disagreements") == []

    job = who("batch", "nightly-embed-backfill-28641600-7xqkd", "backfill")
    alloc = {"uuid": MIG_JOB, "minor_number": "2", "allocate_mode": "exclusive", "scheme": "hami", **job}
    assert one(s, "nvidia_gpu_allocated_memory_bytes", **alloc) == MIG_3G_20GB
    assert one(s, "nvidia_gpu_allocated_compute_percent", **alloc) == 100
    assert modes(s, MIG_JOB) == {"exclusive"}
    assert one(s, "nvidia_gpu_memory_used_bytes", uuid=MIG_JOB, allocate_mode="exclusive", **job) == 17465081856
    assert rows(s, "nvidia_gpu_duty_cycle", uuid=MIG_JOB) == []  # NVML has no utilization for MIG devices
    assert modes(s, MIG_IDLE) == {"None"}
    assert rows(s, "nvidia_gpu_allocated_memory_bytes", uuid=MIG_PARENT) == []
    assert rows(s, "nvidia_gpu_memory_used_bytes", uuid=MIG_PARENT) == []


# ---- 7. A gpushare annotation that lies --------------------------------------------------------

CLAIMED, RUNS_ON = "GPU-1c8f4a6d-93e2-b057-d4a1-6e9b2c7f0d38", "GPU-e7a2d9c5-4b16-3f80-a9e4-1d5c8b6f2a97"
OCR = who("docs", "ocr-batch-4v8kq", "ocr")


def test_realworld_lying_annotation() -> None:
    s = scrape("realworld-lying-annotation.yaml")
    assert one(s, "kube_gpu_exporter_allocation_disagreements", scheme="aliyun-gpushare") == 1
    assert rows(s, "nvidia_gpu_allocated_memory_bytes", **OCR) == [
        ({"node_name": "cn-shanghai.10.0.1.8", "uuid": CLAIMED, "minor_number": "0", "allocate_mode": "share",
          "scheme": "aliyun-gpushare", **OCR}, 6 * GIB)]
    asr = who("speech", "asr-stream-6f5d4c3b2-gq7vn", "asr")
    assert one(s, "nvidia_gpu_allocated_memory_bytes", uuid=RUNS_ON, scheme="aliyun-gpushare", **asr) == 4 * GIB
    for pod, sm, used in [(OCR, 61, 5771362304), (asr, 22, 3145728000)]:
        assert one(s, "nvidia_gpu_duty_cycle", uuid=RUNS_ON, minor_number="1", allocate_mode="share", **pod) == sm
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=RUNS_ON, allocate_mode="share", **pod) == used
    assert rows(s, "nvidia_gpu_unaccounted_process_memory_used_bytes") == []
    # usage only where the processes run: no row for the liar on the claimed GPU, which nobody uses
    assert rows(s, "nvidia_gpu_duty_cycle", uuid=CLAIMED, **OCR) == []
    assert modes(s, CLAIMED) == {"None"}


def test_a_lying_annotations_grant_is_counted_once() -> None:
    s = scrape("realworld-lying-annotation.yaml")
    assert sum(v for _, v in rows(s, "nvidia_gpu_gpu_sharing_memory", **OCR)) == 6 * GIB


# ---- 9. NVIDIA time-slicing: several replicas of one GPU, time-sliced MIG devices (issue 25) ---

TS_CARD = "GPU-7c3e5a91-d2b4-4f86-a0c8-1e9b3d5f7a20"
TS_MIG_A, TS_MIG_B = "MIG-4b8d2f6a-1c3e-5a7b-9d0f-2e4a6c8b0d10", "MIG-4b8d2f6a-1c3e-5a7b-9d0f-2e4a6c8b0d11"


def test_realworld_timeslicing_replicas() -> None:
    s = scrape("realworld-timeslicing-replicas.yaml")
    held = [(TS_CARD, who("research", "llm-eval-packed-0", "eval"), 22 * GIB),  # replicas ::0 and ::1: one GPU
            (TS_CARD, who("research", "notebook-ts-7f9c8", "jupyter"), 8 * GIB),
            (TS_MIG_A, who("serving", "whisper-mig-both-5d6e", "whisper"), 6 * GIB),  # both replicas of one MIG
            (TS_MIG_B, who("serving", "embed-mig-one-8a9b", "embed"), 3 * GIB)]
    for uuid, pod, used in held:
        assert one(s, "nvidia_gpu_memory_used_bytes", allocate_mode="share", **pod) == used
        assert one(s, "nvidia_gpu_memory_used_bytes", uuid=uuid, allocate_mode="share", **pod) == used
    assert modes(s, TS_CARD) == modes(s, TS_MIG_A) == modes(s, TS_MIG_B) == {"None", "share"}
    # time-slicing grants no fixed share, and nothing is refused as out of range
    assert rows(s, "nvidia_gpu_allocated_compute_percent") == rows(s, "nvidia_gpu_allocated_memory_bytes") == []
    assert rows(s, "kube_gpu_exporter_skips_total") == []
    assert rows(s, "nvidia_gpu_unaccounted_process_memory_used_bytes") == []
    # replicas of one device are that device: no second, unplaced allocation for eval or whisper
    daemon = build_daemon(load_config(["--simulate", str(EXAMPLES / "realworld-timeslicing-replicas.yaml")]))
    try:
        snapshot, _ = daemon.pipeline.step()
    finally:
        daemon.close()
    assert list(snapshot.status["unplaced"]) == []


# ---- through the real CLI --------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_scenario_serves_through_the_cli(scenario: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("kube-gpu-exporter")
    assert exe.exists(), "the console script is missing: pip install -e ."
    port = free_port()
    want = seed_rows(scrape(scenario.name))
    proc = ExporterProcess([str(exe), "--simulate", str(scenario), "--listen", f"127.0.0.1:{port}",
                            "--interval", "0.2"], os.environ, port, tmp_path / "exporter.log").start()
    try:
        proc.wait_for(lambda s: seed_rows(s) == want, 30, "the served rows to equal the in-process ones")
    finally:
        proc.stop()
