"""Restart safety for any history length: history is decided by sequence number or file size, not by count.

Also the shutdown guarantee: NVML Xids still held at stop() are counted even when the thread outlives
the join.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.xid.history import LookbackWindow, replay_start
from exporter.xid.kmsg import KmsgReader, history_prefix, parse_record, record_seq
from exporter.xid.nvml_events import NvmlXid
from exporter.xid.watcher import XidWatcher
from tests.k8s_double import poll_until

NODE = "gpu-node-1"
UUID = "GPU-3b"


def resolve_bus(pci: str, gpu_instance: int | None = None) -> tuple[str, int | None] | None:
    return (UUID, 0) if pci == "0000:3b:00" else None


def no_pod(pid: int) -> None:
    return None


def xid_record(seq: int, ts_usec: int, xid: int = 31) -> bytes:
    return b"4,%d,%d,-;NVRM: Xid (PCI:0000:3b:00): %d, pid=1, name=x, MMU Fault\n" % (seq, ts_usec, xid)


def start(path: Path | str, **kw: object) -> XidWatcher:
    kw.setdefault("poll_interval", 0.02)
    w = XidWatcher(str(path), NODE, resolve_bus, no_pod, None, **kw)  # type: ignore[arg-type]
    w.start()
    return w


def counts_by_xid(w: XidWatcher) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, n in w.stats().xid_counts.items():
        out[key[2]] = out.get(key[2], 0) + n
    return out


# ---------------------------------------------------------------- a regular file: its content at open


def test_a_history_of_250000_records_is_never_counted_again(tmp_path: Path) -> None:
    """The old rule took the first 200,000 records as history and counted the rest on every restart."""
    n = 250_000
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(xid_record(i, i * 10) for i in range(n)))
    w = start(path)
    try:
        assert w.stats().history_skipped == n
        with path.open("ab") as f:  # after start: new
            f.write(xid_record(n, n * 10, xid=43))
        poll_until(lambda: w.stats().records_read == n + 1 and w.stats().xid_counts, timeout=30)
        assert counts_by_xid(w) == {43: 1}
    finally:
        w.stop()


def test_reading_a_long_history_keeps_memory_bounded(tmp_path: Path) -> None:
    """Only the lookback's Xids are kept, not the records: 20,000 records, 6 of them in a 0.5 s lookback.

    The old reader kept every record and its parse: 7.7 MiB here, about 96 MiB for 250,000 records.
    """
    n = 20_000
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(xid_record(i, i * 100_000) for i in range(n)))
    tracemalloc.start()
    try:
        w = start(path, lookback_seconds=0.5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert peak < 3 * 2**20, f"start() peaked at {peak / 2**20:.1f} MiB"
        assert w.stats().history_skipped == n - 6
        poll_until(lambda: counts_by_xid(w) == {31: 6})
    finally:
        w.stop()


# ---------------------------------------------------------------- the device: sequence numbers


class KernelLog:
    """The kernel's ring buffer; each handle reads it from its own position, like /dev/kmsg."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = list(records)
        self.lock = threading.Lock()

    def printk(self, raw: bytes) -> None:
        with self.lock:
            self.records.append(raw)

    def handle(self, *, at_end: bool = False, on_read: Callable[[int], None] | None = None) -> Handle:
        with self.lock:
            return Handle(self, len(self.records) if at_end else 0, on_read)


class Handle:
    def __init__(self, log: KernelLog, pos: int, on_read: Callable[[int], None] | None) -> None:
        self.log, self.pos, self.on_read, self.closed = log, pos, on_read, False

    def read(self, size: int = -1) -> bytes | None:
        with self.log.lock:
            if self.pos >= len(self.log.records):
                return None
            raw = self.log.records[self.pos]
            self.pos += 1
        if self.on_read is not None:
            self.on_read(self.pos)
        return raw

    def close(self) -> None:
        self.closed = True


def device_opener(log: KernelLog, **main: object) -> Callable[[str], KmsgReader]:
    def opener(_: str) -> KmsgReader:
        marker = log.handle(at_end=True)  # opened first, as KmsgReader.open does
        return KmsgReader(log.handle(**main), record_per_read=True, marker=marker)  # type: ignore[arg-type]
    return opener


def test_a_record_printed_while_history_is_read_is_new() -> None:
    """The old rule (history until the first empty read) swallowed it."""
    log = KernelLog([xid_record(i, i) for i in range(1, 4)])
    printed = []

    def storm_once(pos: int) -> None:
        if pos == 2 and not printed:
            printed.append(1)
            log.printk(xid_record(4, 4, xid=43))

    w = start("/dev/kmsg-double", opener=device_opener(log, on_read=storm_once))
    try:
        assert w.stats().history_skipped == 3
        poll_until(lambda: counts_by_xid(w) == {43: 1})
    finally:
        w.stop()


def test_a_storm_during_start_ends_history_at_the_first_new_sequence_number() -> None:
    """A device that never runs dry: history still ends where the records present at open end."""
    history = 1200
    log = KernelLog([xid_record(i, i) for i in range(history)])
    seq = [history]

    def storm(pos: int) -> None:  # the kernel prints two records for each one read
        for _ in range(2):
            if seq[0] < 50_000:
                log.printk(xid_record(seq[0], seq[0], xid=43))
                seq[0] += 1

    w = start("/dev/kmsg-double", opener=device_opener(log, on_read=storm))
    try:
        assert w.stats().history_skipped == history
        poll_until(lambda: counts_by_xid(w).get(43, 0) >= 1000)
        assert 31 not in counts_by_xid(w)
    finally:
        w.stop()


def test_device_history_rule_on_the_reader() -> None:
    log = KernelLog([b"6,5,5,-;old\n", b"6,6,6,-;old\n"])
    marker = log.handle(at_end=True)
    reader = KmsgReader(log.handle(), record_per_read=True, marker=marker)  # type: ignore[arg-type]
    batch = reader.read_available(max_records=1)
    assert (batch.history, reader.history_done) == (1, False)  # nothing printed since open yet
    log.printk(b"6,7,7,-;new\n")
    batch = reader.read_available()
    assert batch.records == (b"6,6,6,-;old\n", b"6,7,7,-;new\n") and batch.history == 1
    assert reader.history_done and marker.closed
    assert reader.read_available().history == 0


def test_without_a_marker_history_ends_at_the_first_empty_read() -> None:
    log = KernelLog([b"6,1,1,-;a\n"])
    reader = KmsgReader(log.handle(), record_per_read=True)  # type: ignore[arg-type]
    batch = reader.read_available()
    assert batch.history == 1 and batch.drained and reader.history_done


def test_real_dev_kmsg_history_ends() -> None:
    try:
        reader = KmsgReader.open("/dev/kmsg")
    except OSError as err:
        pytest.skip(f"/dev/kmsg not readable here: {err}")
    try:
        history = 0
        for _ in range(10_000):
            batch = reader.read_available()
            history += batch.history
            if reader.history_done:
                break
        assert reader.history_done and history > 0
    finally:
        reader.close()


def test_record_seq_and_history_prefix() -> None:
    assert record_seq(b"6,42,1,-;x\n") == 42
    assert record_seq(b"6,42,1;x") is None and record_seq(b"garbage") is None
    assert record_seq(b"6,x,1,-;a\n6,1,1,-;b") is None
    recs = [b"6,1,1,-;a\n", b"junk\n", b"6,2,2,-;b\n", b"6,3,3,-;c\n"]
    assert history_prefix(recs, 3) == 3 and history_prefix(recs, 2) == 2
    assert history_prefix(recs, 1) == 0 and history_prefix(recs, 9) == 4


# ---------------------------------------------------------------- the lookback, streamed


@given(st.lists(st.one_of(st.none(), st.integers(0, 50_000_000)), max_size=60), st.floats(0, 60))
def test_streamed_lookback_is_replay_start(stamps: list[int | None], lookback: float) -> None:
    recs = [None if ts is None else parse_record(b"4,%d,%d,-;x" % (i, ts)) for i, ts in enumerate(stamps)]
    window: LookbackWindow[int] = LookbackWindow(lookback)
    for i, ts in enumerate(stamps):
        window.add(ts, [i] if ts is not None else [])
    first = replay_start(recs, lookback)
    assert window.first_new == first
    assert window.replay() == [i for i, ts in enumerate(stamps) if i >= first and ts is not None]


def test_lookback_keeps_only_the_newest_xids_within_its_bounds() -> None:
    window: LookbackWindow[int] = LookbackWindow(1000, max_xids=3, max_starts=5)
    for i in range(10):
        window.add(i, [i])
    assert window.replay() == [7, 8, 9]
    assert window.first_new == 5  # the oldest candidate starts were dropped: it starts later, never earlier


# ---------------------------------------------------------------- stop() after a join timeout


class HeldNvml:
    """An NVML source double: the test hands its Xids to the watcher itself."""

    def start(self, handoff: Callable[[NvmlXid], None]) -> None:
        self.handoff = handoff

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def errors(self) -> dict:
        return {}


def test_stop_counts_held_nvml_xids_even_when_the_join_times_out(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    in_resolver, release = threading.Event(), threading.Event()

    def slow_pod(pid: int) -> None:
        if pid == 999:
            in_resolver.set()
            release.wait(10)

    w = XidWatcher(str(path), NODE, resolve_bus, slow_pod, None, poll_interval=0.02,
                   nvml_source=HeldNvml())  # type: ignore[arg-type]
    w.start()
    try:
        w.offer_nvml(NvmlXid(13, "0000:3b:00", UUID, 0, None, None, time.time()))
        poll_until(lambda: w.stats().nvml_held == 1)
        with path.open("ab") as f:  # another GPU's Xid: it keeps the thread busy, pairs with nothing
            f.write(b"4,1,1,-;NVRM: Xid (PCI:0000:86:00): 31, pid=999, name=x, slow\n")
        assert in_resolver.wait(10)
        w.stop(timeout=0.1)
        assert w.stats().nvml_events.get("counted") == 1 and w.stats().nvml_held == 0
    finally:
        release.set()
    poll_until(lambda: sum(w.stats().xid_counts.values()) == 2)  # the thread ends; nothing twice
    assert counts_by_xid(w) == {13: 1, 31: 1} and w.stats().nvml_events.get("counted") == 1


def test_stop_counts_held_nvml_xids_on_a_prompt_join(tmp_path: Path) -> None:
    w = XidWatcher(None, NODE, resolve_bus, no_pod, None, poll_interval=0.02,
                   nvml_source=HeldNvml())  # type: ignore[arg-type]
    w.start()
    w.offer_nvml(NvmlXid(13, "0000:3b:00", UUID, 0, None, None, time.time()))
    w.stop()
    assert counts_by_xid(w) == {13: 1}
