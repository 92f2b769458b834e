"""What /proc says about a process: its CPU time and its resident memory (the benchmarks' meters)."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (fields 14 and 15, after the comm)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory(pid: int) -> dict[str, int]:
    """Resident set size now and at its peak, in bytes (VmRSS, VmHWM)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss_bytes" if key == "VmRSS" else "peak_rss_bytes"] = int(rest.split()[0]) * 1024
    return out


def open_fds(pid: int) -> int:
    """Open file descriptors of a process (entries of /proc/<pid>/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    """Threads of a process (``Threads:`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no Threads line")
