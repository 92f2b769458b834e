"""Hostile input limits: linear-time parsing, capped records, and a bounded ``xid`` label."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.xid import parse
from exporter.xid.events import CreateEvent, EventWrite, PlannerConfig, WriterCounts
from exporter.xid.kmsg import MAX_RAW_RECORD_BYTES, MAX_TEXT_BYTES, KmsgReader, parse_record
from exporter.xid.nvml_events import NvmlXid
from exporter.xid.parse import XID_MAX, ScanState, parse_xid_line, scan_line, xid_in_range
from exporter.xid.watcher import XidWatcher
from tests.k8s_double import poll_until

NODE = "gpu-node-1"
XID154 = ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
          "(GPU Reset Required)")


def resolve_bus(pci: str, gpu_instance: int | None = None) -> tuple[str, int | None] | None:
    return ("GPU-3b", 0) if pci == "0000:3b:00" else None


def no_pod(pid: int) -> None:
    return None


def seconds(fn: Callable[[], object], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def fill(unit: str, size: int, head: str = "") -> str:
    return head + unit * (size // len(unit) + 1)


# ---------------------------------------------------------------- Xid 154: the backtracking regex


def test_xid154_with_a_very_long_tail_parses_at_once() -> None:
    """The old recovery regex (``from .*? to 0x.. \\(([^)]*)\\)``) took 23 s for 329 KB, minutes for 1 MB."""
    for size in (329_000, 1_000_000):
        unclosed = fill(" to 0x1 (GPU Reset Required", size, XID154[:-1])  # no ")" anywhere after "to"
        closed = fill(" to 0x1 (GPU Reset Required", size, XID154)
        for line, action in ((unclosed, None), (closed, "GPU Reset Required")):
            assert seconds(lambda line=line: parse_xid_line(line)) < 0.05, size
            report = parse_xid_line(line)
            assert report is not None and report.xid == 154 and report.recovery_action == action
            assert seconds(lambda line=line: scan_line(ScanState(), line)) < 0.05, size


def test_recovery_action_is_the_first_well_formed_one() -> None:
    line = ("NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0xZ (bad) "
            "to 0x2 (Node Reboot")
    assert parse_xid_line(line + " Required)").recovery_action == "Node Reboot Required"  # type: ignore[union-attr]
    assert parse_xid_line(line).recovery_action is None  # type: ignore[union-attr]
    far = "NVRM: Xid (PCI:0000:3b:00): 154, recovery action changed from x to 0x1 (" + "a" * 200 + ") to 0x3 (Ok)"
    assert parse_xid_line(far).recovery_action == "Ok"  # type: ignore[union-attr]


def test_a_non_ascii_digit_pid_is_unknown_not_an_error() -> None:
    # "\u00b2".isdigit() is True but int() rejects it: the parser used to raise here.
    report = parse_xid_line("NVRM: Xid (PCI:0000:3b:00): 31, pid=\u00b2, name=x, MMU Fault")
    assert report is not None and report.pid is None and report.process_name == "x"


_ADVERSARIAL = st.sampled_from(
    ["NVRM: Xid (PCI:0000:", "NVRM: Xid (", "NVRM: GPU at PCI:", "NVRM: The NVIDIA GPU ", "0", "9", "3b", "1, ",
     ",", " ", ":", ".", "(", ")", " to 0x0 (", "recovery action changed from ", " GPU-I:", "fallen off the bus",
     "pid=", "name=", "GPU-", "\\x"]
)
_HEADS = st.sampled_from(["", XID154[:-1], "NVRM: Xid (PCI:0000:3b:00): 31, ", "NVRM: GPU 0000:3b:00.0: "])


@settings(max_examples=12, deadline=None)
@given(st.lists(_ADVERSARIAL, min_size=1, max_size=6), _HEADS)
def test_parse_time_grows_linearly(parts: list[str], head: str) -> None:
    unit = "".join(parts)
    lines = {size: fill(unit, size, head) for size in (10_000, 100_000, 1_000_000)}
    pending = ScanState("0000:3b:00", 3)  # a multi-line "fallen off the bus" report in progress
    # As the watcher parses: the record's text is capped, so even 1 MB of input is quick.
    raw = b"4,1,1,-;" + lines[1_000_000].encode() + b"\n"
    assert seconds(lambda: [scan_line(pending, ln) for ln in parse_record(raw).text.split("\n")]) < 0.05  # type: ignore[union-attr]
    assert seconds(lambda: scan_line(pending, lines[1_000_000])) < 0.05
    # Every pattern on its own, without the cap: linear, so 10x the text takes about 10x (quadratic: 100x).
    with mock.patch.object(parse, "MAX_LINE_CHARS", 10**9):
        took = {size: seconds(lambda line=line: (scan_line(pending, line), scan_line(ScanState(), line),
                                                 parse_xid_line(line), parse.parse_gpu_announcement(line)), 2)
                for size, line in lines.items()}
    assert took[1_000_000] < 1.0, took
    assert took[1_000_000] < 30 * took[100_000] + 0.01, took
    assert took[100_000] < 30 * took[10_000] + 0.01, took


# ---------------------------------------------------------------- caps on a record


def test_record_text_is_capped_and_marked() -> None:
    line = b"NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, " + b"A" * 1_000_000
    rec = parse_record(b"4,1,1,-;" + line + b"\n")
    assert rec is not None and rec.truncated and len(rec.text.encode()) == MAX_TEXT_BYTES
    assert parse_xid_line(rec.text) is not None  # the head is still parsed
    escaped = parse_record(b"4,1,1,-;" + b"\\x41" * 5000)
    assert escaped is not None and escaped.truncated and escaped.text == "A" * MAX_TEXT_BYTES
    exact = parse_record(b"4,1,1,-;" + b"\\x41" * MAX_TEXT_BYTES)
    assert exact is not None and not exact.truncated and len(exact.text) == MAX_TEXT_BYTES


def test_an_endless_line_in_a_file_is_cut_and_the_next_records_survive(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    long = b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, " + b"B" * 1_000_000 + b"\n"
    after = b"4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 43, after\n"
    path.write_bytes(long + after)
    reader = KmsgReader.open(str(path))
    try:
        records: list[bytes] = []
        while not (batch := reader.read_available()).drained:
            records.extend(batch.records)
        records.extend(batch.records)
    finally:
        reader.close()
    assert [len(r) for r in records] == [MAX_RAW_RECORD_BYTES, len(after)]
    first, second = (parse_record(r) for r in records)
    assert first is not None and first.truncated and second is not None and second.seq == 2


def test_the_watcher_counts_a_cut_record_and_still_counts_its_xid(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, " + b"C" * 400_000 + b"\n"
                     b"4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 43, pid=1, name=x, fine\n")
    w = XidWatcher(str(path), NODE, resolve_bus, no_pod, None, replay_from_start=True, poll_interval=0.02)
    w.start()
    try:
        poll_until(lambda: sum(w.stats().xid_counts.values()) == 2)
        assert w.stats().skips == {"record_truncated": 1}
    finally:
        w.stop()


# ---------------------------------------------------------------- the xid label


class RecordingSink:
    def __init__(self) -> None:
        self.writes: list[EventWrite] = []

    def submit(self, write: EventWrite) -> bool:
        self.writes.append(write)
        return True

    def counts(self) -> WriterCounts:
        return WriterCounts()


def test_xid_range() -> None:
    assert [xid_in_range(c) for c in (0, 1, 154, XID_MAX, XID_MAX + 1, 999_999)] == [
        False, True, True, True, False, False]


def test_only_plausible_codes_become_series_or_events(tmp_path: Path) -> None:
    """The old watcher made a series of every code: 100,000 codes, 100,000 series."""
    codes = [*range(0, 3000), 65_535, 999_999]
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(b"4,%d,%d,-;NVRM: Xid (PCI:0000:3b:00): %d, pid=1, name=x\n" % (i, i, c)
                              for i, c in enumerate(codes)))
    sink = RecordingSink()
    w = XidWatcher(str(path), NODE, resolve_bus, no_pod, sink, replay_from_start=True, poll_interval=0.02,
                   event_config=PlannerConfig(burst=10_000))
    w.start()
    try:
        poll_until(lambda: w.stats().records_read == len(codes), timeout=30)
        stats = w.stats()
    finally:
        w.stop()
    assert sorted(k[2] for k in stats.xid_counts) == list(range(1, XID_MAX + 1))
    assert stats.skips == {"xid_out_of_range": len(codes) - XID_MAX}
    reasons = {w.body["reason"] for w in sink.writes if isinstance(w, CreateEvent)}
    assert reasons == {f"NvidiaXid{c}" for c in range(1, XID_MAX + 1)}


class NoNvml:
    def start(self, handoff: object) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def errors(self) -> dict:
        return {}


def test_an_nvml_xid_out_of_range_is_skipped() -> None:
    w = XidWatcher(None, NODE, resolve_bus, no_pod, None, poll_interval=0.02, nvml_source=NoNvml())  # type: ignore[arg-type]
    w.start()
    try:
        w.offer_nvml(NvmlXid(100_000, "0000:3b:00", "GPU-3b", 0, None, None, time.time()))
        w.offer_nvml(NvmlXid(2**64 - 1, "0000:3b:00", "GPU-3b", 0, None, None, time.time()))
        assert w.stats().skips == {"xid_out_of_range": 2} and w.stats().nvml_held == 0
    finally:
        w.stop()
    assert w.stats().xid_counts == {}
