#!/usr/bin/env python3
"""One short check of the real NVML backend on real hardware (run it where a GPU is lent).

It needs only the exporter's runtime modules (no cluster, no compiler, no CUDA toolkit):

1. samples every GPU a few times through :class:`exporter.node.nvml.backend.NvmlBackend` and records
   what the driver answers (values, NotSupported fields, NVML errors by call and code, MIG mode);
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
