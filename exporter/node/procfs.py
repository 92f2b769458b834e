"""Thin /proc adapter: map host PIDs (as NVML reports them) to cgroup refs, with a reuse-safe cache.

The cache key is (pid, start time): start time (field 22 of ``/proc/<pid>/stat``, clock ticks
since boot) changes when the kernel hands a PID to a new process, so a reused PID is re-read
while an unchanged process costs one small ``stat`` read per call. The cgroup of a live
process can in principle change (a migration), but kubelet-managed workloads stay put; we
accept that staleness in exchange for not re-parsing every cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from exporter.attribution.cgroup import parse_cgroup
from exporter.model import CgroupRef

# Reasons reported by ProcReader.skips(); always present so a metric per reason starts at 0.
SKIP_REASONS = ("exited", "malformed_stat", "malformed_cgroup_line", "permission", "read_error")

_STARTTIME_INDEX = 22 - 3  # field 22, counted in the fields after "pid (comm)" which start at 3


def parse_stat_starttime(text: str) -> int | None:
    """Start time from the text of ``/proc/<pid>/stat``, or None when malformed.

    comm may contain spaces and parentheses (it is any 15 bytes the process chose), so the
    fields are taken after the *last* ``)``.
    """
    close = text.rfind(")")
    if close < 0:
        return None
    fields = text[close + 1 :].split()
    if len(fields) <= _STARTTIME_INDEX:
        return None
    value = fields[_STARTTIME_INDEX]
    if not (value.isascii() and value.isdigit()):
        return None
    return int(value)


# The kernel's stat and cgroup files are a few hundred bytes; anything this large is not one of them.
MAX_PROC_FILE_BYTES = 1 << 20


class _Gone(Exception):
    """The process's /proc files could not be read; ``reason`` is a SKIP_REASONS key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProcReader:
    """Resolve PIDs to :class:`CgroupRef` through ``<host_proc>/<pid>/{stat,cgroup}``.

    Call :meth:`resolve` once per sampling cycle with *all* PIDs of the cycle: entries for
    PIDs absent from a call are evicted, which keeps memory bounded by the live GPU
    processes. Thread-safe.
    """

    def __init__(self, host_proc: Path = Path("/proc"), max_cache: int = 65536) -> None:
        self._proc = Path(host_proc)
        self._max_cache = max(0, max_cache)
        self._cache: dict[int, tuple[int, CgroupRef | None, str | None]] = {}  # pid -> (start time, ref, comm)
        self._comms: dict[int, str] = {}  # the last resolve's command names
        self._skips: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        self._lock = threading.Lock()

    def _read(self, pid: int, name: str) -> str:
        try:
            with (self._proc / str(pid) / name).open("rb") as f:
                data = f.read(MAX_PROC_FILE_BYTES + 1)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError) as exc:
            raise _Gone("exited") from exc
        except PermissionError as exc:
            raise _Gone("permission") from exc
        except OSError as exc:  # e.g. EIO; not worth failing a whole cycle for
            raise _Gone("read_error") from exc
        if len(data) > MAX_PROC_FILE_BYTES:  # not the kernel's (a --host-proc of files): counted, skipped
            raise _Gone("read_error")
        # comm and cgroup names are arbitrary bytes; a bad byte must not lose the process
        return data.decode("utf-8", errors="replace")

    def _resolve_one(self, pid: int) -> tuple[int | None, CgroupRef | None, str | None]:
        """Return (start time or None if unparsable, ref, comm); raise _Gone if the process left."""
        stat = self._read(pid, "stat")
        if not stat:
            # a process being reaped can show an empty stat before its directory disappears
            raise _Gone("exited")
        start = parse_stat_starttime(stat)
        if start is None:
            self._skips["malformed_stat"] += 1
        else:
            cached = self._cache.get(pid)
            if cached is not None and cached[0] == start:
                return cached
        parsed = parse_cgroup(self._read(pid, "cgroup"))
        self._skips["malformed_cgroup_line"] += parsed.malformed_lines
        # Read with the cgroup, once per process: the status page names what an unaccounted process is.
        return start, parsed.ref, self.comm(pid)

    def resolve(self, pids: Iterable[int]) -> dict[int, CgroupRef | None]:
        """Map each live PID to its ref (None: not in a pod); PIDs that exited are omitted."""
        with self._lock:
            result: dict[int, CgroupRef | None] = {}
            fresh: dict[int, tuple[int, CgroupRef | None, str | None]] = {}
            comms: dict[int, str] = {}
            for pid in pids:
                if pid in result:
                    continue
                try:
                    start, ref, comm = self._resolve_one(pid)
                except _Gone as gone:
                    self._skips[gone.reason] += 1
                    continue
                result[pid] = ref
                if comm is not None:
                    comms[pid] = comm
                # without a start time we cannot tell reuse apart, so such a PID is never cached
                if start is not None and len(fresh) < self._max_cache:
                    fresh[pid] = (start, ref, comm)
            self._cache, self._comms = fresh, comms
            return result

    def comms(self) -> Mapping[int, str]:
        """The command name (``/proc/<pid>/comm``) of each PID the last :meth:`resolve` placed, where readable."""
        with self._lock:
            return MappingProxyType(dict(self._comms))

    def skips(self) -> Mapping[str, int]:
        """Cumulative count of skipped reads by reason (see SKIP_REASONS)."""
        with self._lock:
            return MappingProxyType(dict(self._skips))

    def comm(self, pid: int) -> str | None:
        """The process's command name (``/proc/<pid>/comm``, one line of at most 64 characters), or None."""
        try:
            text = self._read(pid, "comm").rstrip("\n")
        except _Gone:
            return None
        return " ".join(text.split())[:64] or None  # the kernel's is 15 bytes; whatever the file holds, one line
