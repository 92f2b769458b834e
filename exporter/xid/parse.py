"""NVIDIA Xid reports in kernel log text: line parser, "fallen off the bus" detection, catalog.

Everything here is pure. Line forms handled (see docs/xid.md)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 31, pid='<unknown>', name=<unknown>, ...
    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.        (no pid/name)
    NVRM: Xid (0000:01:00): 13, 0005 ...  /  NVRM: Xid (0009:00): 53, ...  (old drivers)
    NVRM: GPU at PCI:0000:01:00: GPU-<uuid>                            (PCI -> UUID)
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.                (no Xid number)
    NVRM: The NVIDIA GPU 0000:3b:00.0 / (PCI ID: ...) ... / fallen off the bus ...  (multi-line)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.model import DeviceSample

FALLEN_OFF_BUS_XID = 79
# Codes that become series: NVIDIA's catalog goes to about 160 today and grows by a few codes a
# driver branch; three digits leave that room while bounding the `xid` label (and the Events).
XID_MIN, XID_MAX = 1, 999
# The longest line the parser looks at (a kmsg record's text is cut to 4 KiB before it gets here).
MAX_LINE_CHARS = 4096

# Every pattern below is linear: bounded quantifiers, or one unbounded run that nothing after it
# competes for, so no input makes the regex engine backtrack over the line.
_XID = re.compile(r"NVRM: Xid \((?P<loc>[^)]{1,80})\): (?P<xid>[0-9]{1,6})\b,?")
_LOC = re.compile(
    r"\s{0,8}(?:PCI:)?(?P<pci>[0-9A-Fa-f:.]{1,24})"
    r"(?:\s{1,8}GPU-I:\s{0,8}(?P<gi>[0-9]{1,3}))?(?:\s{1,8}GPU-CI:\s{0,8}(?P<ci>[0-9]{1,3}))?\s{0,8}"
)
_GPU_AT = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9A-Fa-f:.]{1,24}): (?P<uuid>GPU-[0-9A-Fa-f-]{8,64})")
_PCI_IN_TEXT = re.compile(r"\b(?P<pci>(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\b")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>[0-9A-Fa-f:.]{1,24})")
_FALLEN = re.compile(r"fallen off the bus", re.IGNORECASE)
# Xid 154: "... recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)". The part
# after "from" is found by str.find, and this is matched only where a candidate " to 0x" starts.
_RECOVERY_FROM = "recovery action changed from "
_RECOVERY_TO = re.compile(r" to (?P<code>0x[0-9A-Fa-f]{1,16})\s{0,8}\((?P<text>[^)]{0,128})\)")
_RECOVERY_SPAN = len(" to 0x") + 16 + 8 + 1 + 128  # from " to" to the closing parenthesis, at most
_UNKNOWN = {"<unknown>", "'<unknown>'", "unknown", ""}
# A "The NVIDIA GPU <pci>" header and the line saying it fell off are a few lines apart.
_MULTILINE_SPAN = 4


def normalize_pci(text: str) -> str | None:
    """Normalise a PCI address to the driver's log form ``dddd:bb:dd`` (lowercase).

    Accepts NVML's ``00000000:3B:00.0``, the log's ``0000:3b:00``, ``0000:3b:00.0`` and the old
    drivers' domain-less ``0009:00`` (bus 0x09, device 0x00, domain 0). ``None`` if not an address.
    """
    text = text.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    addr, dot, func = text.partition(".")
    if dot and not (func.isdigit() and len(func) == 1):
        return None
    parts = addr.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or not all(parts) or len(parts[0]) > 8 or len(parts[1]) > 4 or len(parts[2]) > 2:
        return None
    try:
        domain, bus, dev = (int(p, 16) for p in parts)
    except ValueError:
        return None
    if bus > 0xFF or dev > 0x1F:
        return None
    # NVML prints 8 domain digits, the driver 4: keep the low 16 bits as the driver does.
    return f"{domain & 0xFFFF:04x}:{bus:02x}:{dev:02x}"


def bus_id_from_nvml(pci_bus_id: str) -> str:
    """NVML's ``pciBusId`` (``00000000:3B:00.0``) in the log's form (``0000:3b:00``).

    Unparseable input comes back lowercased, so it can still be used as a (never matching) key.
    """
    return normalize_pci(pci_bus_id) or pci_bus_id.strip().lower()


def gpu_for_xid(devices: Sequence[DeviceSample], pci: str, gpu_instance: int | None) -> tuple[str, int | None] | None:
    """The (uuid, minor number) an Xid at log-form address ``pci`` is about, from the node's devices.

    On a card in MIG mode every MIG device shares the card's address: the report's GPU instance
    (``GPU-I``) picks the MIG device; without one (a card-wide error) the card itself is meant.
    """
    at = [d for d in devices if bus_id_from_nvml(d.pci_bus_id) == pci]
    if not at:
        return None
    migs = [d for d in at if d.parent_uuid is not None]
    if not migs:
        return at[0].uuid, at[0].minor_number
    for d in migs:
        if gpu_instance is not None and d.gpu_instance_id == gpu_instance:
            return d.uuid, d.minor_number
    return str(migs[0].parent_uuid), migs[0].minor_number


@dataclass(frozen=True, slots=True)
class XidReport:
    """One Xid, or one "fallen off the bus" report (``numbered=False``, counted as Xid 79)."""

    xid: int
    pci: str | None  # normalised; None when the report names no usable address
    gpu_instance: int | None = None  # MIG GPU-I
    compute_instance: int | None = None  # MIG GPU-CI
    pid: int | None = None  # None when missing or '<unknown>'; 0 is kept (no process)
    process_name: str | None = None
    message: str = ""  # the driver's text after pid/name
    recovery_action: str | None = None  # Xid 154: the new action, e.g. "Node Reboot Required"
    numbered: bool = True


@dataclass(frozen=True, slots=True)
class GpuAnnouncement:
    """``NVRM: GPU at PCI:<addr>: GPU-<uuid>``: the driver's own PCI -> UUID map."""

    pci: str
    uuid: str


def _split_field(rest: str, key: str) -> tuple[str | None, str]:
    """Take ``key=value`` off the front of ``rest`` (value up to the next ``", "``)."""
    if not rest.startswith(key + "="):
        return None, rest
    value, _, tail = rest[len(key) + 1 :].partition(", ")
    return value.strip(), tail


def xid_in_range(code: int) -> bool:
    """Whether ``code`` is a plausible Xid (:data:`XID_MIN`..:data:`XID_MAX`): only those become series."""
    return XID_MIN <= code <= XID_MAX


def _recovery_action(rest: str) -> str | None:
    """Xid 154's new recovery action (the text in parentheses after ``to 0x..``), in linear time."""
    start = rest.find(_RECOVERY_FROM)
    if start < 0:
        return None
    pos, close = start + len(_RECOVERY_FROM), -1
    while (pos := rest.find(" to 0x", pos)) >= 0:
        if close < pos:
            close = rest.find(")", pos)  # a match ends at the first ")" after its start
            if close < 0:
                return None
        if close - pos > _RECOVERY_SPAN:
            pos = close - _RECOVERY_SPAN  # candidates this far before the ")" cannot match: skip them
            continue
        match = _RECOVERY_TO.match(rest, pos)
        if match:
            return match.group("text").strip()
        pos += 1
    return None


def parse_xid_line(line: str) -> XidReport | None:
    """Parse one ``NVRM: Xid (...)`` line; ``None`` when the line is not a well-formed one."""
    match = _XID.search(line)
    if not match:
        return None
    loc = _LOC.fullmatch(match.group("loc"))
    if not loc:
        return None
    pci = normalize_pci(loc.group("pci"))
    if pci is None:
        return None
    rest = line[match.end() :].lstrip().partition("\n")[0].strip()
    pid_text, rest = _split_field(rest, "pid")
    name, rest = _split_field(rest, "name")
    pid: int | None = None
    if pid_text is not None and pid_text not in _UNKNOWN:
        # isascii: str.isdigit() also accepts digits such as "²" that int() rejects
        ok = pid_text.isascii() and pid_text.isdigit() and len(pid_text) <= 10
        pid = int(pid_text) if ok else None
    if name is not None and name in _UNKNOWN:
        name = None
    return XidReport(
        xid=int(match.group("xid")),
        pci=pci,
        gpu_instance=int(loc.group("gi")) if loc.group("gi") else None,
        compute_instance=int(loc.group("ci")) if loc.group("ci") else None,
        pid=pid,
        process_name=name,
        message=rest,
        recovery_action=_recovery_action(rest),
    )


def parse_gpu_announcement(line: str) -> GpuAnnouncement | None:
    """Parse ``NVRM: GPU at PCI:0000:01:00: GPU-<uuid>``."""
    match = _GPU_AT.search(line)
    if not match:
        return None
    pci = normalize_pci(match.group("pci"))
    return GpuAnnouncement(pci, match.group("uuid")) if pci else None


@dataclass(frozen=True, slots=True)
class ScanState:
    """Carry-over between lines: a pending ``The NVIDIA GPU <pci>`` header of a multi-line report."""

    pending_pci: str | None = None
    lines_left: int = 0


Finding = XidReport | GpuAnnouncement


def scan_line(
    state: ScanState, line: str, device_pci: str | None = None
) -> tuple[ScanState, Finding | None]:
    """Classify one log line; ``device_pci`` is the record's ``DEVICE=+pci:`` address, if any.

    Returns the next state and what the line reports. Never raises. Only the first
    :data:`MAX_LINE_CHARS` characters are looked at.
    """
    line = line[:MAX_LINE_CHARS]
    pending = state.pending_pci if state.lines_left > 0 else None
    next_state = ScanState(pending, state.lines_left - 1) if pending else ScanState()
    if "NVRM" not in line and not (pending and _FALLEN.search(line)):
        return next_state, None
    if "NVRM: Xid" in line:
        return next_state, parse_xid_line(line)
    announcement = parse_gpu_announcement(line)
    if announcement:
        return next_state, announcement
    header = _THE_GPU.search(line)
    if header:
        pci = normalize_pci(header.group("pci"))
        if not _FALLEN.search(line):
            return ScanState(pci, _MULTILINE_SPAN), None
        pending = pci
    fallen = _FALLEN.search(line)
    if fallen:
        found = _PCI_IN_TEXT.search(line[: fallen.start()])
        pci = (normalize_pci(found.group("pci")) if found else None) or pending or device_pci
        return ScanState(), XidReport(
            xid=FALLEN_OFF_BUS_XID, pci=pci, message=line.partition("NVRM: ")[2].strip() or line.strip(),
            numbered=False,
        )
    return next_state, None


@dataclass(frozen=True, slots=True)
class XidInfo:
    """Catalog entry: what an Xid means and what to do (NVIDIA's Xid catalog, immediate action)."""

    code: int
    meaning: str
    action: str
    severity: str  # info | application | gpu | node | unknown
    # NVIDIA's device plugin marks the device unhealthy on this Xid (all but application errors).
    marks_unhealthy: bool = True


def _entry(code: int, meaning: str, action: str, severity: str) -> tuple[int, XidInfo]:
    return code, XidInfo(code, meaning, action, severity, code not in _APPLICATION_LEVEL)


# The device plugin's list of application-level Xids (it keeps the device healthy on these).
_APPLICATION_LEVEL = frozenset({13, 31, 43, 45, 68, 109})

CATALOG: dict[int, XidInfo] = dict(
    (
        _entry(13, "graphics engine exception", "restart the application", "application"),
        _entry(31, "GPU memory page fault", "restart the application", "application"),
        _entry(32, "invalid or corrupted push buffer", "restart the application", "application"),
        _entry(43, "GPU stopped processing", "none needed", "info"),
        _entry(45, "preemptive cleanup", "follow the other Xid reported with it", "info"),
        _entry(46, "GPU timeout", "reset the GPU", "gpu"),
        _entry(48, "double-bit ECC error", "ECC workflow: drain, then reset the GPU", "gpu"),
        _entry(61, "internal micro-controller breakpoint", "reset the GPU (pre-Ampere)", "gpu"),
        _entry(62, "internal micro-controller halt", "reset the GPU", "gpu"),
        _entry(63, "ECC page retirement / row remap event", "none needed; recorded", "info"),
        _entry(64, "ECC page retirement / row remap failure", "reset the GPU", "gpu"),
        _entry(68, "NVDEC error", "restart the application", "application"),
        _entry(69, "graphics engine class error", "restart the application", "application"),
        _entry(74, "NVLink error", "NVLink workflow", "gpu"),
        _entry(79, "GPU has fallen off the bus", "reboot the node / service the GPU", "node"),
        _entry(92, "high single-bit ECC rate", "none needed; recorded", "info"),
        _entry(94, "contained ECC error", "restart the application", "application"),
        _entry(95, "uncontained ECC error", "reset the GPU", "gpu"),
        _entry(109, "context switch timeout", "reset the GPU", "gpu"),
        _entry(119, "GSP RPC timeout", "reset the GPU", "gpu"),
        _entry(120, "GSP error", "reset the GPU", "gpu"),
        _entry(140, "unrecovered ECC error", "reset the GPU", "gpu"),
        _entry(143, "GPU initialization failure", "reset the GPU", "gpu"),
        _entry(154, "GPU recovery action changed", "the action the driver names in the message", "info"),
    )
)


def lookup(xid: int) -> XidInfo:
    """Catalog entry for ``xid``; a generic entry for codes the catalog does not list."""
    info = CATALOG.get(xid)
    if info is not None:
        return info
    return XidInfo(xid, "Xid not in the exporter's catalog", "see NVIDIA's Xid catalog", "unknown",
                   xid not in _APPLICATION_LEVEL)


def catalog_entry(xid: int) -> dict[str, str]:
    """What the status page says of ``xid``: its meaning, action and severity."""
    info = lookup(xid)
    return {"meaning": info.meaning, "action": info.action, "severity": info.severity}
