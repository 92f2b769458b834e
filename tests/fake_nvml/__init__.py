"""Build and drive the fake libnvidia-ml.so.1 (fake_nvml.c) from scenario files.

The library reads a line-based config named by ``$FAKE_NVML_CONFIG`` at ``nvmlInitWithFlags``;
:func:`write_config` writes it from a scenario mapping (the YAML that also drives
``exporter/node/simulate.py``). docs/testing.md, section "Fake NVML", documents the keys.

Two ways to put the fake under pynvml:

* a subprocess: :func:`subprocess_env` sets ``LD_LIBRARY_PATH`` and ``FAKE_NVML_CONFIG``, and
  pynvml's ``CDLL("libnvidia-ml.so.1")`` finds the fake by its soname;
* in this process: :func:`fake_nvml_loaded` assigns ``pynvml.nvmlLib`` and restores pynvml's
  module state afterwards; the returned :class:`FakeNvml` reaches the test hooks.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.fake_nvml.checks import FakeNvmlError, as_int, as_seq, as_text, check_keys
from tests.fake_nvml.health_config import HEALTH_KEYS, gpm_lines, health_lines, reserved_lines

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
CONFIG_ENV = "FAKE_NVML_CONFIG"
TICK_US = 1_000_000  # util sample timeStamp of tick t is t * TICK_US, as in exporter/node/simulate.py
UTIL_BUFFER_TICKS = 8  # ticks of util samples the fake keeps, like the driver's bounded buffer

# not_supported names, shared with exporter/node/simulate.py: the health keys are names too
NOT_SUPPORTED_NAMES = frozenset({
    "power", "temperature", "utilization", "clocks", "ecc", "encoder", "decoder",
    "clocks_event_reasons", "process_utilization", "memory",
}) | HEALTH_KEYS
# not_supported names of the fake alone: NVML calls the simulated node does not stand in for
FAKE_ONLY_NOT_SUPPORTED = frozenset({"events", "mig"})
# scenario device key -> config key for the plain integer values
_DEVICE_INTS = (
    "memory_total_bytes", "utilization_gpu", "utilization_memory", "power_usage_milliwatts",
    "temperature_celsius", "sm_clock_mhz", "memory_clock_mhz", "encoder_utilization",
    "decoder_utilization", "ecc_corrected", "ecc_uncorrected", "clocks_event_reasons",
)
_DEVICE_KEYS = frozenset(_DEVICE_INTS) | HEALTH_KEYS | {
    "uuid", "name", "minor_number", "pci_bus_id", "memory_used_bytes", "processes", "not_supported",
    "lost_after_ticks", "process_growth", "xid_events", "mig_devices",
}
# the keys of a MIG device, as exporter/node/simulate.py reads them
_MIG_KEYS = frozenset({"uuid", "profile", "gpu_instance_id", "compute_instance_id", "memory_total_bytes",
                       "memory_used_bytes", "memory_reserved_bytes", "processes", "gpm"})
_PROCESS_KEYS = frozenset({"pid", "used_memory_bytes", "sm_util", "cgroup", "type", "comm"})  # comm: /proc only
_NVML_KEYS = frozenset({"init_failures", "init_delay_ms", "old_driver", "driver_version", "clock", "timestamps",
                        "growth_every_tick", "cuda_driver_version", "idle_after_ticks"})
_TOP_KEYS = frozenset({"node", "node_labels", "node_capacity", "devices", "pods", "pod_resources", "nvml",
                       "description", "resource_slices", "resource_claims"})


# ---- build ----------------------------------------------------------------------------------

def _compiler() -> str:
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate and (path := shutil.which(candidate)):
            return path
    raise FakeNvmlError("no C compiler found to build the fake NVML library: "
                        "install gcc (apt-get install gcc)")


def _flags(old_driver: bool) -> list[str]:
    flags = ["-shared", "-fPIC", "-fvisibility=hidden", "-pthread", "-O2", "-std=c11", "-Wall", "-Wextra",
             f"-Wl,-soname,{LIBRARY_NAME}"]
    return [*flags, "-DOLD_DRIVER"] if old_driver else flags


def _cache_root() -> Path:
    return Path(tempfile.gettempdir()) / f"kube-gpu-exporter-fake-nvml-{os.getuid()}"


def build_fake_nvml(dest_dir: Path, *, old_driver: bool = False) -> Path:
    """Build the fake into ``dest_dir/libnvidia-ml.so.1`` and return that path.

    Builds are cached by a hash of the source, flags and compiler, in a per-user temp
    directory, so a test session compiles each variant once. ``old_driver`` builds the
    variant without the symbols drivers before 510 lack (``*_v3`` process lists,
    ``nvmlDeviceGetCurrentClocksEventReasons``, ``nvmlDeviceGetMemoryInfo_v2``, ``nvmlGpm*``).
    Put the two variants in different directories: both must be named ``libnvidia-ml.so.1``.
    """
    cc = _compiler()
    flags = _flags(old_driver)
    digest = hashlib.sha256(SOURCE.read_bytes() + "\0".join([cc, *flags]).encode()).hexdigest()[:16]
    cached = _cache_root() / digest / LIBRARY_NAME
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        # compile to a private name and rename: concurrent sessions may build the same digest
        tmp = cached.with_name(f".{LIBRARY_NAME}.{os.getpid()}.tmp")
        proc = subprocess.run([cc, *flags, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise FakeNvmlError(f"building the fake NVML library failed:\n{proc.stderr}")
        os.replace(tmp, cached)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / LIBRARY_NAME
    stamp = dest_dir / f"{LIBRARY_NAME}.digest"
    if not (dest.exists() and stamp.exists() and stamp.read_text() == digest):
        tmp = dest_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
        shutil.copyfile(cached, tmp)
        # rename, never rewrite in place: a process may have the old file mapped
        os.replace(tmp, dest)
        stamp.write_text(digest)
    return dest


# ---- scenario -> config ---------------------------------------------------------------------

def _device_lines(raw: object, index: int) -> list[str]:
    where = f"devices[{index}]"
    d = check_keys(raw, _DEVICE_KEYS, where)
    for key in ("uuid", "name"):
        if key not in d:
            raise FakeNvmlError(f"{where}: '{key}' is required")
    lines = [
        "device",
        f"uuid {as_text(d['uuid'], f'{where}.uuid')}",
        f"name {as_text(d['name'], f'{where}.name')}",
        # the same defaults as exporter/node/simulate.py
        f"minor_number {as_int(d.get('minor_number', index), f'{where}.minor_number')}",
        f"pci_bus_id {as_text(d.get('pci_bus_id', f'00000000:{index + 1:02X}:00.0'), f'{where}.pci_bus_id')}",
    ]
    for key in _DEVICE_INTS:
        if d.get(key) is not None:
            lines.append(f"{key} {as_int(d[key], f'{where}.{key}')}")
    if "memory_used_bytes" in d:  # null: NVML_VALUE_NOT_AVAILABLE (absent reads the same)
        used = d["memory_used_bytes"]
        used_text = "NA" if used is None else str(as_int(used, f"{where}.memory_used_bytes"))
        lines.append(f"memory_used_bytes {used_text}")
    lines.extend(reserved_lines(d, where))
    lines.extend(health_lines(d, where))
    allowed = NOT_SUPPORTED_NAMES | FAKE_ONLY_NOT_SUPPORTED
    not_supported = as_seq(d.get("not_supported"), f"{where}.not_supported")
    for name in not_supported:
        if not isinstance(name, str) or name not in allowed:
            raise FakeNvmlError(f"{where}.not_supported: unknown field {name!r}; "
                                f"allowed: {', '.join(sorted(allowed))}")
        lines.append(f"not_supported {name}")
    for key in ("lost_after_ticks", "process_growth"):
        if d.get(key) is not None:
            lines.append(f"{key} {as_int(d[key], f'{where}.{key}')}")
    for i, x in enumerate(as_seq(d.get("xid_events"), f"{where}.xid_events")):
        xw = f"{where}.xid_events[{i}]"
        x = check_keys(x, frozenset({"tick", "xid"}), xw)
        lines.append(f"xid {as_int(x.get('tick'), f'{xw}.tick')} {as_int(x.get('xid'), f'{xw}.xid')}")
    lines.extend(_process_lines(d.get("processes"), f"{where}.processes"))
    if "mig_devices" in d:
        if d.get("processes"):
            raise FakeNvmlError(f"{where}: a GPU with mig_devices has its processes on them, not on itself")
        if "mig" in not_supported:
            raise FakeNvmlError(f"{where}: not_supported mig contradicts mig_devices")
        migs = as_seq(d["mig_devices"], f"{where}.mig_devices")
        if not migs:
            raise FakeNvmlError(f"{where}.mig_devices: MIG mode with no MIG device; leave the key out instead")
        mig_lines = [line for j, m in enumerate(migs) for line in _mig_lines(m, f"{where}.mig_devices[{j}]", d["name"])]
        if _mig_gpm(d, migs, where):  # after the MIG devices' own checks: their values are known good
            lines.append("gpm")  # the card is GPM-capable: its GPU instances are sampled
        lines.extend(mig_lines)
    return lines


def _mig_gpm(d: Mapping[str, Any], migs: list[Any], where: str) -> bool:
    """Whether a MIG card's GPU instances have GPM; the rules exporter/node/simulate.py applies too."""
    if d.get("gpm") is not None:
        raise FakeNvmlError(f"{where}: a GPU with mig_devices has its GPM on them (gpm: per MIG device)")
    given = [m.get("gpm") is not None for m in migs]
    if any(given) and not all(given):
        raise FakeNvmlError(f"{where}.mig_devices: gpm on every MIG device or on none (GPM is the card's)")
    by_instance: dict[object, object] = {}
    for j, m in enumerate(migs):
        if m.get("gpm") is not None:
            if m.get("gpu_instance_id") is None:
                raise FakeNvmlError(f"{where}.mig_devices[{j}]: gpm needs gpu_instance_id (GPM is per GPU instance)")
            if by_instance.setdefault(m["gpu_instance_id"], m["gpm"]) != m["gpm"]:
                raise FakeNvmlError(f"{where}.mig_devices[{j}]: MIG devices of one GPU instance share its gpm")
    return any(given)


def _mig_lines(raw: object, where: str, card_name: str) -> list[str]:
    """A MIG device's lines; they follow its card's (``mig`` starts one)."""
    m = check_keys(raw, _MIG_KEYS, where)
    for key in ("uuid", "profile"):
        if key not in m:
            raise FakeNvmlError(f"{where}: '{key}' is required")
    uuid = as_text(m["uuid"], f"{where}.uuid")
    if not uuid.startswith("MIG-"):
        raise FakeNvmlError(f"{where}.uuid: a MIG device uuid starts with MIG-, got {uuid!r}")
    # NVML names a MIG device "<card name> MIG <profile>"
    lines = ["mig", f"uuid {uuid}", f"name {card_name} MIG {as_text(m['profile'], f'{where}.profile')}"]
    for key in ("gpu_instance_id", "compute_instance_id", "memory_total_bytes"):
        if m.get(key) is not None:
            lines.append(f"{key} {as_int(m[key], f'{where}.{key}')}")
    if "memory_used_bytes" in m:
        used = m["memory_used_bytes"]
        lines.append(f"memory_used_bytes {'NA' if used is None else as_int(used, f'{where}.memory_used_bytes')}")
    lines.extend(reserved_lines(m, where))
    lines.extend(gpm_lines(m.get("gpm"), f"{where}.gpm"))
    lines.extend(_process_lines(m.get("processes"), f"{where}.processes"))
    return lines


def _process_lines(raw: object, where: str) -> list[str]:
    lines = []
    for i, p in enumerate(as_seq(raw, where)):
        pw = f"{where}[{i}]"
        p = check_keys(p, _PROCESS_KEYS, pw)
        kind = p.get("type", "compute")
        if kind not in ("compute", "graphics", "mps"):
            raise FakeNvmlError(f"{pw}.type: must be compute, graphics or mps, got {kind!r}")
        mem = p.get("used_memory_bytes")
        mem_text = "NA" if mem is None else str(as_int(mem, f"{pw}.used_memory_bytes"))
        lines.append(f"process {as_int(p.get('pid'), f'{pw}.pid')} {mem_text} "
                     f"{as_int(p.get('sm_util', 0), f'{pw}.sm_util')} {kind}")
    return lines


def config_text(scenario: Mapping[str, Any]) -> str:
    """The fake's config for a scenario mapping (raises FakeNvmlError naming a bad key)."""
    top = check_keys(scenario, _TOP_KEYS, "scenario")
    nvml = check_keys(top.get("nvml") or {}, _NVML_KEYS, "nvml")
    lines = ["# generated by tests/fake_nvml from a scenario; see docs/testing.md", "fake_nvml_config 1"]
    if "driver_version" in nvml:
        lines.append(f"driver_version {as_text(nvml['driver_version'], 'nvml.driver_version')}")
    lines.append(f"init_failures {as_int(nvml.get('init_failures', 0), 'nvml.init_failures')}")
    if "init_delay_ms" in nvml:
        lines.append(f"init_delay_ms {as_int(nvml['init_delay_ms'], 'nvml.init_delay_ms', maximum=600_000)}")
    lines.append(f"old_driver {1 if nvml.get('old_driver') else 0}")
    clock = nvml.get("clock", "auto")
    if clock not in ("auto", "manual"):
        raise FakeNvmlError(f"nvml.clock: must be auto or manual, got {clock!r}")
    lines.append(f"clock {clock}")
    timestamps = nvml.get("timestamps", "ticks")
    if timestamps not in ("ticks", "wallclock"):
        raise FakeNvmlError(f"nvml.timestamps: must be ticks or wallclock, got {timestamps!r}")
    lines.append(f"timestamps {timestamps}")
    lines.append(f"growth_every_tick {1 if nvml.get('growth_every_tick') else 0}")
    if nvml.get("idle_after_ticks") is not None:
        lines.append(f"idle_after_ticks {as_int(nvml['idle_after_ticks'], 'nvml.idle_after_ticks')}")
    if "cuda_driver_version" in nvml:
        lines.append(f"cuda_driver_version {as_int(nvml['cuda_driver_version'], 'nvml.cuda_driver_version')}")
    for i, d in enumerate(as_seq(top.get("devices"), "devices")):
        lines.extend(_device_lines(d, i))
    return "\n".join(lines) + "\n"


def write_config(scenario: Mapping[str, Any], path: Path) -> Path:
    """Write the fake's config for ``scenario`` to ``path`` and return ``path``."""
    path = Path(path)
    path.write_text(config_text(scenario))
    return path


def load_scenario_file(path: Path) -> Mapping[str, Any]:
    """Load a scenario YAML file into a mapping."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, Mapping):
        raise FakeNvmlError(f"{path}: a scenario is a mapping")
    return data


def wants_old_driver(scenario: Mapping[str, Any]) -> bool:
    """Whether the scenario asks for the library variant without the ``_v3`` symbols."""
    return bool((scenario.get("nvml") or {}).get("old_driver"))


# ---- using it -------------------------------------------------------------------------------

def subprocess_env(lib_dir: Path, config: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process whose pynvml should load the fake from ``lib_dir``."""
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib_dir), env.get("LD_LIBRARY_PATH")]))
    env[CONFIG_ENV] = str(config)
    return env


class FakeNvml:
    """The fake's test hooks (symbols outside the NVML API) on a loaded library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.fakeNvmlGetTick.restype = ctypes.c_ulonglong
        lib.fakeNvmlLastSeenTimeStamp.restype = ctypes.c_ulonglong
        lib.fakeNvmlCallCount.restype = ctypes.c_ulong
        lib.fakeNvmlCallCount.argtypes = [ctypes.c_char_p]
        lib.fakeNvmlDeviceCallCount.restype = ctypes.c_ulong

    def advance(self, ticks: int = 1) -> None:
        """Advance every device's tick (the only clock under ``nvml: {clock: manual}``)."""
        self.lib.fakeNvmlAdvanceTicks(ctypes.c_uint(ticks))

    def tick(self, index: int) -> int:
        """The device's current tick."""
        return int(self.lib.fakeNvmlGetTick(ctypes.c_uint(index)))

    def last_seen(self, index: int) -> int:
        """lastSeenTimeStamp of the latest nvmlDeviceGetProcessUtilization call on the device."""
        return int(self.lib.fakeNvmlLastSeenTimeStamp(ctypes.c_uint(index)))

    def calls(self, function: str) -> int:
        """Calls of an NVML function since the last reset, failed calls included."""
        return int(self.lib.fakeNvmlCallCount(function.encode()))

    def device_calls(self, index: int) -> int:
        """Calls that reached the device (by handle, or by index in GetHandleByIndex)."""
        return int(self.lib.fakeNvmlDeviceCallCount(ctypes.c_uint(index)))

    def reset(self) -> None:
        """Uninitialise the fake and clear its counters and init-failure count."""
        self.lib.fakeNvmlReset()


@contextmanager
def fake_nvml_loaded(lib_path: Path, config: Path) -> Iterator[FakeNvml]:
    """Make pynvml in this process use the fake at ``lib_path`` with ``config``.

    pynvml keeps the loaded library, a function-pointer cache and an init refcount in module
    globals; they are replaced here and restored on exit, and the fake is reset on both ends,
    so tests can switch variants and scenarios freely.
    """
    import pynvml

    lib = ctypes.CDLL(str(lib_path))
    fake = FakeNvml(lib)
    saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount,
             os.environ.get(CONFIG_ENV))
    os.environ[CONFIG_ENV] = str(config)
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0
    fake.reset()
    try:
        yield fake
    finally:
        fake.reset()
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
        pynvml._nvmlLib_refcount = saved[2]
        if saved[3] is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = saved[3]
