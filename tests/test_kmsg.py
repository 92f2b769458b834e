"""kmsg record parsing, framing and the non-blocking reader."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

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
