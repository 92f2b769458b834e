"""kmsg record parsing, framing and the non-blocking reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.xid import kmsg
from exporter.xid.kmsg import KmsgReader, parse_record, split_records, unescape

DATA = Path(__file__).parent / "data" / "kmsg"


def test_parse_record_header_text_and_fields() -> None:
    raw = (b"3,1017,2300000000,-,caller=T42;NVRM: Xid (PCI:0000:3b:00): 94\n"
           b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
    rec = parse_record(raw)
    assert rec is not None
    assert (rec.facility, rec.level, rec.seq, rec.ts_usec, rec.flags) == (0, 3, 1017, 2300000000, "-")
    assert rec.text == "NVRM: Xid (PCI:0000:3b:00): 94"
    assert dict(rec.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert rec.is_kernel


def test_user_space_facility_is_not_kernel() -> None:
    rec = parse_record(b"12,5,6,-;NVRM: Xid (PCI:0000:3b:00): 79, spoofed\n")
    assert rec is not None and rec.facility == 1 and rec.level == 4 and not rec.is_kernel


def test_unescape_handles_utf8_backslash_and_newline() -> None:
    assert unescape(rb"caf\xc3\xa9\x5cbin") == "caf\u00e9\\bin"
    assert unescape(rb"a\x0ab") == "a\nb"
    assert unescape(rb"\xzz\x") == "\\xzz\\x"  # not an escape: kept
    assert unescape(b"\xff") == "\ufffd"


def test_parse_record_rejects_malformed_headers() -> None:
    for raw in (b"", b"no separator", b"x,1,2,-;t", b"4,-1,2,-;t", b"4,1;t", b"4,1,2;t"):
        assert parse_record(raw) is None, raw


def test_split_records_groups_continuations_and_waits_for_final() -> None:
    buf = b"6,1,1,-;a\n SUBSYSTEM=pci\n6,2,2,-;b\n DEVICE=+pci:0000:3b:00.0\n"
    done, rest = split_records(buf, final=False)
    assert done == [b"6,1,1,-;a\n SUBSYSTEM=pci\n"]
    assert rest == b"6,2,2,-;b\n DEVICE=+pci:0000:3b:00.0\n"  # more continuation lines may follow
    done, rest = split_records(rest, final=True)
    assert done == [b"6,2,2,-;b\n DEVICE=+pci:0000:3b:00.0\n"] and rest == b""


def test_split_records_keeps_partial_line() -> None:
    done, rest = split_records(b"6,1,1,-;a\n6,2,2,-;par", final=True)
    assert done == [b"6,1,1,-;a\n"] and rest == b"6,2,2,-;par"


@given(st.binary(max_size=400), st.booleans())
def test_split_records_loses_no_bytes(data: bytes, final: bool) -> None:
    done, rest = split_records(data, final=final)
    assert b"".join(done) + rest == data


@given(st.binary(max_size=400))
def test_parse_record_never_raises(data: bytes) -> None:
    rec = parse_record(data)
    if rec is not None:
        assert rec.seq >= 0 and rec.ts_usec >= 0 and 0 <= rec.level <= 7


@given(st.lists(st.tuples(st.integers(0, 191), st.integers(0, 2**40), st.integers(0, 2**50),
                          st.text(max_size=60)), max_size=8),
       st.integers(1, 64))
def test_file_chunking_reassembles_records(items: list[tuple[int, int, int, str]], chunk: int) -> None:
    """Escaped records survive any read-chunk size: the framer is independent of read boundaries."""
    def esc(text: str) -> bytes:
        out = bytearray()
        for b in text.encode():
            out += b"\\x%02x" % b if b < 0x20 or b >= 0x7F or b == 0x5C else bytes((b,))
        return bytes(out)

    data = b"".join(b"%d,%d,%d,-;%s\n SUBSYSTEM=pci\n" % (p, s, t, esc(x)) for p, s, t, x in items)

    class Chunked:
        def __init__(self) -> None:
            self.pos = 0

        def read(self, size: int = -1) -> bytes:
            out = data[self.pos : self.pos + min(size, chunk)]
            self.pos += len(out)
            return out

        def close(self) -> None:
            pass

    reader = KmsgReader(Chunked(), record_per_read=False)
    records: list[bytes] = []
    while True:
        batch = reader.read_available(max_records=3)
        records.extend(batch.records)
        if batch.drained:
            break
    parsed = [parse_record(r) for r in records]
    assert [(r.facility * 8 + r.level, r.seq, r.ts_usec, r.text) for r in parsed if r] == items
    assert all(r is not None and r.fields == {"SUBSYSTEM": "pci"} for r in parsed)


class PipeThenRecords:
    """A device double: one record per read, EPIPE where the ring buffer overwrote records."""

    def __init__(self, script: list[bytes | BaseException | None]) -> None:
        self.script = list(script)

    def read(self, size: int = -1) -> bytes | None:
        if not self.script:
            return None
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        pass


def test_reader_survives_and_counts_epipe() -> None:
    src = PipeThenRecords([b"6,1,1,-;a\n", BrokenPipeError(), BrokenPipeError(), b"6,9,9,-;b\n", None])
    batch = KmsgReader(src, record_per_read=True).read_available()
    assert batch.records == (b"6,1,1,-;a\n", b"6,9,9,-;b\n")
    assert batch.epipe == 2 and batch.drained


def test_reader_endless_epipe_returns() -> None:
    class Always:
        def read(self, size: int = -1) -> bytes:
            raise BrokenPipeError

        def close(self) -> None:
            pass

    batch = KmsgReader(Always(), record_per_read=True).read_available(max_records=5)
    assert batch.records == () and batch.epipe > 0 and not batch.drained


def test_reader_opens_regular_file_and_follows_appends(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes((DATA / "variants.kmsg").read_bytes())
    reader = KmsgReader.open(str(path))
    try:
        assert not reader.is_device
        batch = reader.read_available(max_records=10_000)
        assert batch.drained and len(batch.records) == 23
        assert reader.read_available().records == ()
        with path.open("ab") as f:
            f.write(b"4,2000,1,-;NVRM: Xid (PCI:0000:3b:00): 43, later\n")
        assert len(reader.read_available().records) == 1
    finally:
        reader.close()


def test_reader_on_a_pipe_reports_drained_when_empty(tmp_path: Path) -> None:
    """A FIFO is non-blocking too: an empty pipe reads as 'nothing now', not an error."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer_fd = os.open(fifo, os.O_RDWR)  # keep a writer so reads see EAGAIN, not EOF
    try:
        reader = KmsgReader.open(str(fifo))
        os.write(writer_fd, b"6,1,1,-;x\n")
        assert reader.read_available().records == (b"6,1,1,-;x\n",)
        batch = reader.read_available()
        assert batch.records == () and batch.drained
        reader.close()
    finally:
        os.close(writer_fd)


def test_a_file_truncated_in_place_is_read_again_from_its_new_start(tmp_path: Path) -> None:
    """logrotate's copytruncate empties the file under the open handle; before, nothing was ever read again."""
    path = tmp_path / "kmsg"
    path.write_bytes(b"6,1,1,-;old one\n6,2,2,-;old two\n")
    reader = KmsgReader.open(str(path))
    try:
        assert len(reader.read_available().records) == 2
        with path.open("r+b") as f:
            f.truncate(0)
        with path.open("ab") as f:
            f.write(b"4,3,3,-;NVRM: Xid (PCI:0000:3b:00): 43, after the rotation\n")
        batch = reader.read_available()
        assert batch.records == (b"4,3,3,-;NVRM: Xid (PCI:0000:3b:00): 43, after the rotation\n",)
        assert reader.truncations == 1 and reader.read_available().records == ()
        with path.open("ab") as f:  # appends after it are followed as before
            f.write(b"6,4,4,-;next\n")
        assert reader.read_available().records == (b"6,4,4,-;next\n",) and reader.truncations == 1
    finally:
        reader.close()


def test_a_file_rewritten_between_the_check_and_the_read_is_read_from_its_new_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotation lands after the reader found the file unchanged and before its read: the new content,
    as long as the old by then, was read from the old position and its first record lost (the watcher's
    rotation test failed so once on a loaded machine)."""
    old = b"4,1,1000000,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python, test\n"
    new = [old.replace(b"1,1000000", b"2,2000000").replace(b" 31,", b" 43,"),
           old.replace(b"1,1000000", b"3,3000000").replace(b" 31,", b" 62,")]
    assert len(new[0]) == len(old)  # the rest of the file starts exactly where the reader stands
    path = tmp_path / "kmsg"
    path.write_bytes(old)
    reader = KmsgReader.open(str(path))
    try:
        assert reader.read_available().records == (old,)
        checked = kmsg.rewritten

        def rotate_after_the_check(*args: object) -> bool:
            answer = checked(*args)  # type: ignore[arg-type]
            with path.open("r+b") as f:  # copytruncate, and the writer goes on at once
                f.truncate(0)
                f.write(b"".join(new))
            monkeypatch.setattr(kmsg, "rewritten", checked)
            return answer

        monkeypatch.setattr(kmsg, "rewritten", rotate_after_the_check)
        assert reader.read_available().records == tuple(new)  # before: only the second
        assert reader.truncations == 1 and reader.read_available().records == ()
    finally:
        reader.close()


def test_a_device_that_is_not_kmsg_is_refused_in_one_line() -> None:
    """/dev/zero as --kmsg-path was read as records forever."""
    try:
        KmsgReader.open("/dev/zero").close()
    except OSError as e:
        assert "not /dev/kmsg: device 1:5" in str(e) and "\n" not in str(e)
    else:
        raise AssertionError("/dev/zero was opened as a kernel log")


def test_only_the_last_part_of_a_huge_file_is_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kmsg"
    lines = [f"6,{i},{i},-;line {i:04d}\n".encode() for i in range(100, 150)]  # 22 bytes each
    path.write_bytes(b"".join(lines))
    for limit, kept in ((110, 5), (100, 4)):  # at a record's start it is kept; a record cut there is dropped
        monkeypatch.setattr(kmsg, "MAX_FILE_HISTORY_BYTES", limit)
        reader = KmsgReader.open(str(path))
        try:
            batch = reader.read_available()
            assert reader.skipped_bytes == len(lines) * 22 - limit and batch.history == len(batch.records)
            assert batch.records == tuple(lines[-kept:])
        finally:
            reader.close()
