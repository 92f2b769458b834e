#!/usr/bin/env python3
"""One short check of the real NVML backend on real hardware (run it where a GPU is lent).

It needs only the exporter's runtime modules (no cluster, no compiler, no CUDA toolkit):

1. samples every GPU a few times through :class:`exporter.node.nvml.backend.NvmlBackend` and records
   what the driver answers (values, NotSupported fields, NVML errors by call and code, MIG mode);
   then reads every health call (issue 18: energy, power limit, fan, P-state, memory temperature,
   reserved memory, PCIe, retired pages, row remapping, NVLink per link, GPM) straight through
   pynvml, each on its own, prints each answer, and checks that the backend's DeviceSample.health
   has a value exactly where the direct read has one (and GPM ratios from the second cycle on; a card
   in MIG mode is sampled per GPU instance, nvmlGpmMigSampleGet, as the backend does);
2. starts a GPU load in a child process through the CUDA driver API (ctypes on libcuda.so.1, a
   PTX spin kernel JIT-compiled by the driver) and checks that the backend sees the child's pid
   with memory and, over the following cycles, SM utilization samples that are returned once
   (lastSeenTimeStamp advances) - the per-process path the exporter exists for;
3. renders one full exposition through the real pipeline (--host-proc /proc, no pod watch) and
   checks the child appears as an unaccounted host process with its pid.

Writes ``device-check.json`` (and the exposition) to ``$OUT`` or the current directory and prints
a summary; exit status 0 when every check passed, 1 otherwise. Usage::

    python scripts/device-check.py            # the checks
    python scripts/device-check.py --load 20  # (internal) the child: spin kernels for 20 s
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A kernel with a side effect, so that the driver's compiler cannot drop the loop.
PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 out, .param .u64 n)
{
    .reg .u64 %rd<6>;
    .reg .pred %p;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [n];
    mov.u64 %rd3, 0;
LOOP:
    add.u64 %rd3, %rd3, 1;
    setp.lt.u64 %p, %rd3, %rd2;
    @%p bra LOOP;
    cvta.to.global.u64 %rd4, %rd1;
    st.global.u64 [%rd4], %rd3;
    ret;
}
"""


def gpu_load(seconds: float) -> int:
    """The child: keep device 0 busy with spin kernels for ``seconds`` (CUDA driver API)."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(name: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{name} returned CUDA error {rc}")

    check("cuInit", cuda.cuInit(0))
    dev = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    check("cuCtxCreate_v2", cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
    module = ctypes.c_void_p()
    check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)))
    func = ctypes.c_void_p()
    check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(func), module, b"spin"))
    out = ctypes.c_uint64()
    check("cuMemAlloc_v2", cuda.cuMemAlloc_v2(ctypes.byref(out), ctypes.c_size_t(256 << 20)))
    n = ctypes.c_uint64(20_000_000)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
                                   ctypes.cast(ctypes.byref(n), ctypes.c_void_p))
    print("load: running", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check("cuLaunchKernel", cuda.cuLaunchKernel(func, 1024, 1, 1, 256, 1, 1, 0, None, params, None))
        check("cuCtxSynchronize", cuda.cuCtxSynchronize())
    return 0


def _device_summary(d: Any) -> dict[str, Any]:
    out = asdict(d)
    out["processes"] = [asdict(p) for p in d.processes]
    out["util_samples"] = [asdict(s) for s in d.util_samples]
    return out


def run_checks(out_dir: Path, load_seconds: float | None) -> int:
    """All checks; ``load_seconds`` None skips the GPU load (steps 2 and 3)."""
    from exporter.node.nvml.backend import NvmlBackend
    from exporter.shell.cli import build_daemon
    from exporter.shell.config import load_config

    report: dict[str, Any] = {"checks": {}, "samples": []}
    checks: dict[str, Any] = report["checks"]

    def check(name: str, ok: bool, detail: Any = None) -> None:
        checks[name] = {"ok": bool(ok), "detail": detail}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    backend = NvmlBackend()
    try:
        first = backend.sample()
        report["driver_version"] = first.driver_version
        report["samples"].append([_device_summary(d) for d in first.devices])
        check("nvml up", first.nvml_up, dict(first.errors))
        check("devices found", len(first.devices) > 0, [(d.uuid, d.name, d.pci_bus_id) for d in first.devices])
        for d in first.devices:
            absent = [k for k in ("memory_total_bytes", "memory_used_bytes", "power_usage_milliwatts",
                                  "temperature_celsius", "utilization_gpu") if getattr(d, k) is None]
            check(f"{d.uuid} core fields", d.uuid.startswith(("GPU-", "MIG-")) and not d.lost
                  and "memory_total_bytes" not in absent, {"absent": absent, "mig_parent": d.parent_uuid})
        time.sleep(1.0)  # GPM ratios need a second sample, and the energy counter some time
        second = backend.sample()
        report["samples"].append([_device_summary(d) for d in second.devices])
        report["sample_seconds"] = [first.duration_seconds, second.duration_seconds]  # init, then a plain cycle
        print(f"sampling cycle took {second.duration_seconds:.3f} s with the health reads", flush=True)
        health_checks(first, second, report, check)

        if load_seconds is None:
            return _finish(report, backend, out_dir)
        # the per-process path, with a GPU process of our own
        child = subprocess.Popen([sys.executable, __file__, "--load", str(load_seconds)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = child.stdout.readline() if child.stdout else ""
        check("cuda load started", line.strip() == "load: running", line.strip() or child.poll())
        seen_pid = seen_util = False
        stamps: list[int] = []
        repeated = False
        if line.strip() == "load: running":
            deadline = time.monotonic() + load_seconds - 2
            while time.monotonic() < deadline:
                time.sleep(1.0)
                s = backend.sample()
                report["samples"].append([_device_summary(d) for d in s.devices])
                for d in s.devices:
                    if any(p.pid == child.pid for p in d.processes):
                        seen_pid = True
                    mine = [u for u in d.util_samples if u.pid == child.pid]
                    if any(u.sm_util > 0 for u in mine):
                        seen_util = True
                    new = [u.timestamp_us for u in mine]
                    repeated |= bool(set(new) & set(stamps))
                    stamps.extend(new)
                if seen_pid and seen_util and len(stamps) >= 3:
                    break
            check("child pid in running processes", seen_pid, child.pid)
            check("child SM utilization sampled", seen_util, stamps[-5:])
            check("samples returned once (lastSeenTimeStamp)", seen_util and not repeated, len(stamps))

            # the whole pipeline: the child is a host process, so it must be reported unaccounted
            daemon = build_daemon(load_config(["--no-pod-watch", "--no-xid", "--node-name", "device-check",
                                               "--per-process-metrics"], environ={}))
            try:
                daemon.pipeline.step()
                time.sleep(1.0)
                snapshot, _ = daemon.pipeline.step()
            finally:
                daemon.close()
            body = snapshot.body.decode()
            (out_dir / "device-check.prom").write_text(body)
            unaccounted = [ln for ln in body.splitlines()
                           if ln.startswith("nvidia_gpu_unaccounted_process_memory_used_bytes")
                           and f'pid="{child.pid}"' in ln]
            check("pipeline reports the child as unaccounted", bool(unaccounted), unaccounted[:1])
        child.kill()
        child.wait(timeout=10)
        return _finish(report, backend, out_dir)
    finally:
        backend.close()


# ---- health (issue 18): every new NVML call read straight, each on its own -------------------

# DeviceHealth field -> the direct read by hand that feeds it (the others: spec_reads())
HAND_READS = {
    "retired_pages_single_bit": "nvmlDeviceGetRetiredPages(SINGLE_BIT)",
    "retired_pages_double_bit": "nvmlDeviceGetRetiredPages(DOUBLE_BIT)",
}
# values that do not move within a few seconds: backend and direct read must agree on them
STABLE = ("power_limit_milliwatts", "retired_pages_single_bit", "retired_pages_double_bit",
          "remapped_rows_correctable")
# answers that say we call NVML wrongly, not that the device lacks something
CALLING_MISTAKES = ("NVMLError_InvalidArgument", "NVMLError_ArgumentVersionMismatch")


def _read(fn: Any) -> dict[str, Any]:
    """One direct call: {"value": ...} or {"error": the pynvml error class name, or "python: ..."}."""
    import pynvml

    try:
        return {"value": fn()}
    except pynvml.NVMLError as e:
        return {"error": type(e).__name__}
    except Exception as e:  # a wrong signature or type: our mistake, reported as such
        return {"error": f"python: {type(e).__name__}: {e}"}


def spec_reads() -> dict[str, str]:
    """DeviceHealth field -> its device field's own direct read (DeviceField.read, exporter/node/nvml/direct.py)."""
    from exporter.exposition.device_fields import DEVICE_FIELDS

    return {f.attr.removeprefix("health."): f.read for f in DEVICE_FIELDS if f.read and f.attr.startswith("health.")}


def _field(pynvml: Any, h: Any, field_id: int, scope: int = 0) -> Any:
    """One field of nvmlDeviceGetFieldValues: its value, or its own nvmlReturn raised."""
    from exporter.node.nvml.direct import field_value

    return field_value(pynvml, h, field_id, scope)


def _direct_card(pynvml: Any, h: Any) -> dict[str, dict[str, Any]]:
    """The card-level reads, each on its own."""
    def memory_v2() -> dict[str, int]:
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        return {"total": m.total, "reserved": m.reserved, "used": m.used, "free": m.free}

    def pages(cause: int) -> int:
        return len(pynvml.nvmlDeviceGetRetiredPages(h, cause))

    from exporter.node.nvml.direct import direct_read

    calls = {
        **{read: (lambda read=read: direct_read(pynvml, h, read)) for read in spec_reads().values()},
        "nvmlDeviceGetMemoryInfo_v2": memory_v2,
        "nvmlDeviceGetRetiredPages(SINGLE_BIT)": lambda: pages(
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        "nvmlDeviceGetRetiredPages(DOUBLE_BIT)": lambda: pages(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "nvmlGpmQueryDeviceSupport": lambda: pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice,
    }
    return {name: _read(fn) for name, fn in calls.items()}


def _direct_links(pynvml: Any, h: Any) -> dict[str, dict[str, Any]]:
    """Every link index's state; for the links that exist, their data and error counters."""
    out: dict[str, dict[str, Any]] = {}
    counters = {"crc": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = _read(lambda link=link: pynvml.nvmlDeviceGetNvLinkState(h, link))
        if state.get("error") in ("NVMLError_NotSupported", "NVMLError_InvalidArgument"):
            continue  # no such link: the answer the backend skips
        out[f"nvlink {link} state"] = state
        for name, fid in (("tx KiB", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
                          ("rx KiB", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)):
            out[f"nvlink {link} {name}"] = _read(lambda fid=fid, link=link: _field(pynvml, h, fid, link))
        for name, counter in counters.items():
            out[f"nvlink {link} {name} errors"] = _read(
                lambda counter=counter, link=link: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
    return out


def _direct_gpm(pynvml: Any, h: Any, gi: int | None = None) -> dict[str, dict[str, Any]]:
    """Two GPM samples half a second apart and the five metrics between them (GPM devices only); with ``gi``
    of that GPU instance of the card in MIG mode (nvmlGpmMigSampleGet), each key suffixed with it."""
    from exporter.node.nvml.gpm import METRICS

    out: dict[str, dict[str, Any]] = {}
    buffers: list[Any] = []
    get_call = "nvmlGpmSampleGet" if gi is None else "nvmlGpmMigSampleGet"

    def sample(buffer: Any) -> str:
        if gi is None:
            return pynvml.nvmlGpmSampleGet(h, buffer) and "ok"
        return pynvml.nvmlGpmMigSampleGet(h, gi, buffer) and "ok"

    def alloc() -> str:
        buffers.append(pynvml.nvmlGpmSampleAlloc())
        return "ok"

    try:
        out["nvmlGpmSampleAlloc"] = _read(alloc)
        out["nvmlGpmSampleAlloc (second)"] = _read(alloc)
        if len(buffers) < 2:
            return out
        out[get_call] = _read(lambda: sample(buffers[0]))
        time.sleep(0.5)
        out[f"{get_call} (second)"] = _read(lambda: sample(buffers[1]))
        get = pynvml.c_nvmlGpmMetricsGet_t()
        get.version, get.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, len(METRICS)
        get.sample1, get.sample2 = buffers
        for i, (_, metric_id) in enumerate(METRICS):
            get.metrics[i].metricId = metric_id
        result = _read(lambda: pynvml.nvmlGpmMetricsGet(get) and "ok")
        out["nvmlGpmMetricsGet"] = result
        if "error" not in result:
            for i, (name, _) in enumerate(METRICS):
                m = get.metrics[i]
                out[f"gpm {name} (percent)"] = ({"value": m.value} if m.nvmlReturn == pynvml.NVML_SUCCESS
                                                else {"error": type(pynvml.NVMLError(m.nvmlReturn)).__name__})
    finally:
        for buffer in buffers:
            out.setdefault("nvmlGpmSampleFree", _read(lambda b=buffer: pynvml.nvmlGpmSampleFree(b) or "ok"))
    return out if gi is None else {f"{k} (GPU instance {gi})": v for k, v in out.items()}


def _health_mismatches(direct: dict[str, dict[str, Any]], rows: list[Any]) -> list[str]:
    """Where the backend's health (two cycles of one card) disagrees with the direct reads."""
    first, second = rows[0].health, rows[-1].health
    wrong = []
    for field, call in (spec_reads() | HAND_READS).items():
        answer = direct.get(call, {})
        has = "value" in answer and not (field == "performance_state" and answer["value"] == 32)
        if (getattr(second, field) is not None) != has:
            wrong.append(f"{field}: backend {getattr(second, field)!r}, direct {answer}")
        elif has and field in STABLE:
            want = answer["value"]
            if getattr(second, field) != want:
                wrong.append(f"{field}: backend {getattr(second, field)!r} != direct {want!r}")
    memory = "value" in direct.get("nvmlDeviceGetMemoryInfo_v2", {})
    if rows[-1].parent_uuid is None and (rows[-1].memory_reserved_bytes is not None) != memory:
        wrong.append(f"memory_reserved_bytes: backend {rows[-1].memory_reserved_bytes!r}, direct {memory}")
    if first.energy_millijoules is not None and second.energy_millijoules is not None \
            and second.energy_millijoules < first.energy_millijoules:
        wrong.append("energy_millijoules went backwards")
    links = sorted(int(k.split()[1]) for k in direct if k.endswith(" state"))
    if [n.link for n in second.nvlinks] != links:
        wrong.append(f"nvlinks: backend {[n.link for n in second.nvlinks]}, direct {links}")
    gpm_supported = direct.get("nvmlGpmQueryDeviceSupport", {}).get("value") == 1
    if first.gpm is not None or (second.gpm is not None) != gpm_supported:
        wrong.append(f"gpm: first cycle {first.gpm}, second {second.gpm}, device support {gpm_supported}")
    return wrong


def health_checks(first: Any, second: Any, report: dict[str, Any], check: Any) -> None:
    """Read every health call straight for each card, print it, and check the backend against it."""
    import pynvml

    report["health_direct"] = {}
    pynvml.nvmlInit()  # a second reference next to the backend's
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            direct = _direct_card(pynvml, h) | _direct_links(pynvml, h)
            if direct["nvmlGpmQueryDeviceSupport"].get("value") == 1:
                # in MIG mode per GPU instance, as the backend reads it; else the card's
                instances = sorted({d.gpu_instance_id for d in second.devices
                                    if d.parent_uuid == uuid and d.gpu_instance_id is not None})
                for gi in instances or [None]:
                    direct |= _direct_gpm(pynvml, h, gi)
            report["health_direct"][uuid] = direct
            for name, answer in direct.items():
                print(f"  {uuid} {name}: {answer.get('value', answer.get('error'))}", flush=True)
            mistakes = {k: v["error"] for k, v in direct.items()
                        if v.get("error", "").startswith("python:") or v.get("error") in CALLING_MISTAKES}
            check(f"{uuid} health calls", not mistakes, mistakes or f"{len(direct)} reads")
            rows = [next((d for d in s.devices if uuid in (d.uuid, d.parent_uuid)), None) for s in (first, second)]
            if None in rows or any(r.lost for r in rows):
                check(f"{uuid} backend health agrees", False, "no row of the card in both cycles")
                continue
            wrong = _health_mismatches(direct, rows)
            check(f"{uuid} backend health agrees", not wrong, wrong or _health_text(rows[-1].health))
    finally:
        pynvml.nvmlShutdown()


def _health_text(value: Any) -> str:
    """A short one-line rendering of a DeviceHealth for the summary."""
    d = asdict(value)
    d["nvlinks"] = len(d["nvlinks"])
    return str({k: v for k, v in d.items() if v is not None})


def _finish(report: dict[str, Any], backend: Any, out_dir: Path) -> int:
    report["nvml_errors"] = {f"{c}/{e}": n for (c, e), n in backend.sample().errors.items()}
    (out_dir / "device-check.json").write_text(json.dumps(report, indent=1, default=str))
    checks = report["checks"]
    failed = [k for k, v in checks.items() if not v["ok"]]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed; report in {out_dir}", flush=True)
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", type=float, help="(internal) run the GPU load for this many seconds")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the GPU load runs")
    p.add_argument("--no-load", action="store_true", help="NVML checks only, no CUDA load")
    args = p.parse_args()
    if args.load is not None:
        return gpu_load(args.load)
    out_dir = Path(os.environ.get("OUT") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    return run_checks(out_dir, None if args.no_load else args.seconds)


if __name__ == "__main__":
    raise SystemExit(main())
