"""Xid line parsing, "fallen off the bus" detection, PCI normalisation and the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.xid.kmsg import parse_record, split_records
from exporter.xid.parse import (
    CATALOG,
    GpuAnnouncement,
    ScanState,
    XidReport,
    bus_id_from_nvml,
    lookup,
    normalize_pci,
    parse_gpu_announcement,
    parse_xid_line,
    scan_line,
)

DATA = Path(__file__).parent / "data" / "kmsg"


@pytest.mark.parametrize(
    ("given_id", "want"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("0000:3b:00", "0000:3b:00"),
        ("PCI:0000:3B:00.0", "0000:3b:00"),
        ("00010000:AF:1F.0", "0000:af:1f"),  # NVML's 8 domain digits: the driver keeps the low 4
        ("0000000A:C1:00.0", "000a:c1:00"),
        ("0009:00", "0000:09:00"),  # old drivers: no domain
        ("3b:00.1", "0000:3b:00"),
    ],
)
def test_normalize_pci(given_id: str, want: str) -> None:
    assert normalize_pci(given_id) == want


@pytest.mark.parametrize(
    "bad", ["", "zz:00:00", "0000:3b", "0000:3b:00.x", "1:2:3:4", "0000:100:00", "0000:3b:20"]
)
def test_normalize_pci_rejects(bad: str) -> None:
    assert normalize_pci(bad) is None


def test_bus_id_from_nvml_matches_log_form() -> None:
    assert bus_id_from_nvml("00000000:3B:00.0") == "0000:3b:00"
    assert bus_id_from_nvml("  weird ") == "weird"


LINES = {
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.":
        XidReport(79, "0000:3b:00", pid=1234, process_name="python", message="GPU has fallen off the bus."),
    "NVRM: Xid (PCI:0000:86:00 GPU-I:01): 31, pid=2345, name=train.py, Ch 00000008, intr 00000000.":
        XidReport(31, "0000:86:00", gpu_instance=1, pid=2345, process_name="train.py",
                  message="Ch 00000008, intr 00000000."),
    "NVRM: Xid (PCI:0000:86:00 GPU-I:02 GPU-CI:01): 13, pid='<unknown>', name=<unknown>, Graphics SM":
        XidReport(13, "0000:86:00", gpu_instance=2, compute_instance=1, message="Graphics SM"),
    "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.":
        XidReport(79, "0000:2b:00", message="GPU has fallen off the bus."),
    "NVRM: Xid (PCI:0000:2b:00): 79, pid=0, GPU has fallen off the bus.":
        XidReport(79, "0000:2b:00", pid=0, message="GPU has fallen off the bus."),
    "NVRM: Xid (0000:01:00): 13, 0005 00000000 0000c597":
        XidReport(13, "0000:01:00", message="0005 00000000 0000c597"),
    "NVRM: Xid (0009:00): 53, CMDre 00000000 00000080":
        XidReport(53, "0000:09:00", message="CMDre 00000000 00000080"),
    "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
    "(Node Reboot Required)":
        XidReport(154, "0000:3b:00",
                  message="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
                  recovery_action="Node Reboot Required"),
    "[ 1843.308145] NVRM: Xid (PCI:000a:c1:00): 48, pid=777, name=caf\u00e9, DBE":
        XidReport(48, "000a:c1:00", pid=777, process_name="caf\u00e9", message="DBE"),
    "NVRM: Xid (PCI:0000:3b:00): 43, pid=12ab, name=x, bad pid":
        XidReport(43, "0000:3b:00", pid=None, process_name="x", message="bad pid"),
    "NVRM: Xid (PCI:0000:3b:00): 45":
        XidReport(45, "0000:3b:00"),
}


@pytest.mark.parametrize("line", list(LINES))
def test_parse_xid_line_variants(line: str) -> None:
    assert parse_xid_line(line) == LINES[line]


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (garbage): 79, pid=1",
        "NVRM: Xid (PCI:zzzz:3b:00): 79",
        "NVRM: Xid (PCI:0000:3b:00): notanumber",
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:xx): 31",
        "NVRM: Xid (PCI:0000:3b:00): 99999999, too many digits",
        "NVRM: Xid ",
        "Xid (PCI:0000:3b:00): 79",
    ],
)
def test_parse_xid_line_rejects(line: str) -> None:
    assert parse_xid_line(line) is None


def scan_all(lines: list[str]) -> list[XidReport | GpuAnnouncement]:
    state, found = ScanState(), []
    for line in lines:
        state, item = scan_line(state, line)
        if item is not None:
            found.append(item)
    return found


def test_gpu_announcement() -> None:
    assert scan_all(["NVRM: GPU at PCI:0000:3b:00: GPU-5fd4f0d9-3d3a-4b4c-9c0a-0b2d8b6f7a10"]) == [
        GpuAnnouncement("0000:3b:00", "GPU-5fd4f0d9-3d3a-4b4c-9c0a-0b2d8b6f7a10")
    ]
    assert scan_all(["NVRM: GPU at PCI:0000:3b:00: not-a-uuid"]) == []


def test_fallen_off_bus_single_line() -> None:
    (rep,) = scan_all(["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."])
    assert isinstance(rep, XidReport)
    assert (rep.xid, rep.pci, rep.numbered, rep.pid) == (79, "0000:3b:00", False, None)


def test_fallen_off_bus_multi_line_header_then_text() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:af:00.0",
        "NVRM: (PCI ID: 10de:20b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    (rep,) = scan_all(lines)
    assert isinstance(rep, XidReport) and rep.pci == "0000:af:00" and not rep.numbered


def test_fallen_off_bus_header_expires() -> None:
    lines = ["NVRM: The NVIDIA GPU 0000:af:00.0", *["NVRM: filler"] * 6, "NVRM: GPU has fallen off the bus."]
    (rep,) = scan_all(lines)
    assert isinstance(rep, XidReport) and rep.pci is None  # too far from the header to trust it


def test_fallen_off_bus_uses_record_device_field() -> None:
    _, rep = scan_line(ScanState(), "NVRM: GPU has fallen off the bus.", device_pci="0000:3b:00")
    assert isinstance(rep, XidReport) and rep.pci == "0000:3b:00"


def test_unrelated_lines_are_ignored() -> None:
    assert scan_all(["usb 1-1: new device", "pcieport: link down", "NVRM: loading NVIDIA UNIX"]) == []


def test_variants_fixture_every_report() -> None:
    """The fixture's records, scanned like the watcher does: the right PCI/xid/pid/name each."""
    done, rest = split_records((DATA / "variants.kmsg").read_bytes(), final=True)
    assert rest == b""
    state, found = ScanState(), []
    for raw in done:
        rec = parse_record(raw)
        assert rec is not None
        if not rec.is_kernel:
            continue
        for line in rec.text.split("\n"):
            state, item = scan_line(state, line)
            if item is not None:
                found.append(item)
    summary = [
        (f.xid, f.pci, f.gpu_instance, f.compute_instance, f.pid, f.process_name, f.numbered)
        if isinstance(f, XidReport) else ("gpu", f.pci, f.uuid)
        for f in found
    ]
    assert summary == [
        ("gpu", "0000:3b:00", "GPU-5fd4f0d9-3d3a-4b4c-9c0a-0b2d8b6f7a10"),
        ("gpu", "0000:d8:00", "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"),
        (79, "0000:3b:00", None, None, 1234, "python", True),
        (79, "0000:3b:00", None, None, None, None, False),
        (31, "0000:86:00", 1, None, 2345, "train.py", True),
        (13, "0000:86:00", 2, 1, None, None, True),
        (79, "0000:2b:00", None, None, None, None, True),
        (79, "0000:2b:00", None, None, 0, None, True),
        (13, "0000:01:00", None, None, None, None, True),
        (53, "0000:09:00", None, None, None, None, True),
        (154, "0000:3b:00", None, None, None, None, True),
        (48, "000a:c1:00", None, None, 777, "caf\u00e9\\bin", True),
        (94, "0000:3b:00", None, None, 4242, "python3", True),
        (79, "0000:d8:00", None, None, None, None, False),
        (79, "0000:af:00", None, None, None, None, False),
    ]


def test_catalog_covers_reference_table() -> None:
    codes = {13, 31, 32, 43, 45, 46, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 140, 143,
             154}
    assert set(CATALOG) == codes
    assert lookup(79).severity == "node" and lookup(79).marks_unhealthy
    assert lookup(31).severity == "application" and not lookup(31).marks_unhealthy
    assert not lookup(109).marks_unhealthy  # the device plugin treats it as application-level
    unknown = lookup(4242)
    assert unknown.code == 4242 and unknown.severity == "unknown" and unknown.marks_unhealthy


_NVRMISH = st.sampled_from(
    ["NVRM: Xid (", "PCI:", "0000:3b:00", " GPU-I:", " GPU-CI:", "): ", "79", ", pid=", ", name=",
     "<unknown>", "'", "NVRM: GPU at PCI:", "GPU-", "fallen off the bus", "NVRM: The NVIDIA GPU ", ".0",
     ")", "(", ":", ",", " ", "\n", "\x00", "\u00e9"]
)


@given(st.lists(st.one_of(_NVRMISH, st.text(max_size=8)), max_size=30))
def test_scan_line_never_raises_on_nvrm_like_garbage(parts: list[str]) -> None:
    line = "".join(parts)
    state, item = scan_line(ScanState(), line)
    assert isinstance(state, ScanState)
    if isinstance(item, XidReport):
        assert item.xid >= 0 and (item.pci is None or normalize_pci(item.pci) == item.pci)
    state2, _ = scan_line(state, line, device_pci="0000:3b:00")
    assert isinstance(state2, ScanState)


@given(st.text(max_size=200))
def test_line_parsers_never_raise_on_any_text(text: str) -> None:
    prefixes = ("", "NVRM: Xid (", "NVRM: Xid (PCI:0000:3b:00): 31, ", "NVRM: GPU at PCI:")
    for line in (p + text for p in prefixes):
        rep = parse_xid_line(line)
        assert rep is None or isinstance(rep, XidReport)
        ann = parse_gpu_announcement(line)
        assert ann is None or ann.uuid.startswith("GPU-")


@given(st.text(max_size=40))
def test_normalize_pci_never_raises_and_is_idempotent(text: str) -> None:
    out = normalize_pci(text)
    assert out is None or normalize_pci(out) == out
