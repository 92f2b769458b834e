"""/dev/kmsg records: a pure parser and framer, and a thin non-blocking reader.

Record format (Documentation/ABI/testing/dev-kmsg)::

    <prio>,<seq>,<ts_usec>,<flags>[,<more>...];<text>\\n
     KEY=value\\n          (optional continuation lines, each starting with a space)

The kernel escapes bytes < 0x20, >= 0x7f and the backslash as ``\\xNN``, so a record's text never
holds a raw newline and records can be framed line by line. On the device one ``read()`` returns
exactly one record; a regular file (``cat /dev/kmsg > file``) holds many, cut anywhere by reads.

Bounds: a record's text is cut to :data:`MAX_TEXT_BYTES` (``KmsgRecord.truncated``), and a file's
record is cut to :data:`MAX_RAW_RECORD_BYTES` before it is framed, so no input makes parsing slow.

History: :class:`KmsgReader` tells which records were already there when it was opened. For a regular
file that is its content at open (its size then); for the device, every record with a sequence
number below the one a second handle, put at the end (``SEEK_END``) when we opened, reads first.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exporter.model import EMPTY
from exporter.xid.kmsg_file import TAIL_BYTES, holds, open_marker, rewritten

KERNEL_FACILITY = 0
# The kernel's CONSOLE_EXT_LOG_MAX is 8 KiB; a smaller buffer makes read() fail with EINVAL.
DEVICE_READ_SIZE = 16384
FILE_READ_SIZE = 65536
# A printk record holds at most ~1 KiB of text (PRINTKRB_RECORD_MAX); 4 KiB leaves room and keeps
# every parse of a record's text short. Longer text is cut (counted as record_truncated).
MAX_TEXT_BYTES = 4096
# A device read returns at most 8 KiB; a record file's longer "record" (one endless line) is cut here
# while framing, so the framer's buffer stays bounded too.
MAX_RAW_RECORD_BYTES = 32768
# A record file's history is read at start: only its last this many bytes (a node's kernel ring buffer
# is a few MiB; a file grown for months need not be read through before the first live record).
MAX_FILE_HISTORY_BYTES = 64 << 20
KMSG_DEVICE = (1, 11)  # major, minor of /dev/kmsg: any other character device (/dev/zero) is refused

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One parsed kmsg record."""

    facility: int
    level: int
    seq: int
    ts_usec: int  # microseconds since boot (the kernel's local clock)
    flags: str  # '-' whole record, 'c'/'+' continuation fragments on old kernels
    text: str  # unescaped; may contain newlines when the kernel printed several lines at once
    fields: Mapping[str, str] = field(default_factory=lambda: EMPTY)  # SUBSYSTEM=, DEVICE=, ...
    truncated: bool = False  # text cut to MAX_TEXT_BYTES (or the raw record to MAX_RAW_RECORD_BYTES)

    @property
    def is_kernel(self) -> bool:
        """True for messages printed by the kernel (not written to /dev/kmsg from user space)."""
        return self.facility == KERNEL_FACILITY


def _unescape_bytes(raw: bytes) -> bytes:
    return _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), raw)


def unescape(raw: bytes) -> str:
    """Undo the kernel's ``\\xNN`` escaping and decode as UTF-8 (invalid bytes replaced)."""
    return _unescape_bytes(raw).decode("utf-8", "replace")


def _text(body: bytes) -> tuple[str, bool]:
    """The unescaped text, at most :data:`MAX_TEXT_BYTES`, and whether it was cut."""
    # An escape is 4 bytes for 1, so this much escaped text always yields the whole cap.
    limit = 4 * MAX_TEXT_BYTES
    data = _unescape_bytes(body[:limit])
    cut = len(body) > limit or len(data) > MAX_TEXT_BYTES
    return data[:MAX_TEXT_BYTES].decode("utf-8", "replace"), cut


def _nonneg_int(token: bytes) -> int | None:
    token = token.strip()
    return int(token) if token.isdigit() and len(token) <= 20 else None


def parse_record(raw: bytes) -> KmsgRecord | None:
    """Parse one record (header line plus continuation lines); ``None`` when it is not one."""
    lines = raw.split(b"\n")
    header, sep, body = lines[0].partition(b";")
    if not sep:
        return None
    parts = header.split(b",")
    if len(parts) < 4:
        return None
    prio, seq, ts = (_nonneg_int(p) for p in parts[:3])
    if prio is None or seq is None or ts is None:
        return None
    text, cut = _text(body)
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if not line.startswith(b" "):
            continue  # the trailing empty string after the final newline
        key, eq, value = line[1:].partition(b"=")
        if eq and key:
            fields[unescape(key)] = unescape(value)
    return KmsgRecord(
        facility=prio >> 3,
        level=prio & 7,
        seq=seq,
        ts_usec=ts,
        flags=parts[3].decode("ascii", "replace").strip(),
        text=text,
        fields=fields or EMPTY,
        truncated=cut or len(raw) >= MAX_RAW_RECORD_BYTES,
    )


def record_seq(raw: bytes) -> int | None:
    """The sequence number in a raw record's header; ``None`` when the header is malformed."""
    header, sep, _ = raw.partition(b"\n")[0].partition(b";")
    parts = header.split(b",", 3)
    return _nonneg_int(parts[1]) if sep and len(parts) == 4 else None


def history_prefix(records: Sequence[bytes], first_new_seq: int) -> int:
    """How many leading ``records`` come before sequence number ``first_new_seq`` (device order).

    A record whose header cannot be read goes with the record before it.
    """
    for i, raw in enumerate(records):
        seq = record_seq(raw)
        if seq is not None and seq >= first_new_seq:
            return i
    return len(records)


def split_records(buffer: bytes, *, final: bool) -> tuple[list[bytes], bytes]:
    """Cut ``buffer`` into complete raw records; return them and the unconsumed rest.

    A record ends where the next header line (one not starting with a space) begins. The last
    record is only complete when ``final`` (the writer is known to be between records: end of a
    device read, end of a file); a trailing line without its newline is never complete.
    """
    records: list[bytes] = []
    start = 0  # start of the record being assembled
    pos = 0  # start of the next unread line
    while True:
        nl = buffer.find(b"\n", pos)
        if nl < 0:
            break
        if pos > start and buffer[pos : pos + 1] != b" ":
            records.append(buffer[start:pos])
            start = pos
        pos = nl + 1
    if final and pos > start:
        records.append(buffer[start:pos])
        start = pos
    return records, buffer[start:]


class RawSource(Protocol):
    """What the reader needs from an opened kmsg: ``io.FileIO`` in non-blocking mode fits.

    ``read`` returns ``None`` when nothing is available yet, ``b""`` at the end of a regular file,
    and raises ``BrokenPipeError`` when the kernel overwrote records we had not read yet.
    """

    def read(self, size: int = -1, /) -> bytes | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """What one :meth:`KmsgReader.read_available` call got."""

    records: tuple[bytes, ...]
    epipe: int  # EPIPE errors survived (records lost to the ring buffer wrapping)
    drained: bool  # nothing more available right now (EAGAIN or end of file)
    history: int = 0  # how many leading records were already there when the reader was opened


class KmsgReader:
    """Adapter over an opened kmsg device or record file: non-blocking, record-framed.

    It also tells history from new records (see the module docstring): ``history_bytes`` is a
    file's size at open; ``marker`` a second device handle opened at the end (``SEEK_END``) before
    ``raw``. Without either, history ends where the first read finds nothing more (``drained``).
    """

    def __init__(self, raw: RawSource, *, record_per_read: bool, fileno: int | None = None,
                 history_bytes: int | None = None, marker: RawSource | None = None) -> None:
        self._raw, self._record_per_read, self._fileno = raw, record_per_read, fileno
        self._read_size = DEVICE_READ_SIZE if record_per_read else FILE_READ_SIZE
        self._buffer = b""
        self._discarding = False  # inside a line longer than MAX_RAW_RECORD_BYTES: drop to its end
        self._history_left = history_bytes
        self._marker = marker
        self._first_new_seq: int | None = None  # the marker's first record: the first one after open
        self.history_done = False
        self.skipped_bytes = 0  # of a record file's history longer than MAX_FILE_HISTORY_BYTES, not read
        self.truncations = 0  # times a record file was found truncated in place (copytruncate) and re-read
        self._tail = b""  # the last bytes read live from a record file: still there unless it was rewritten

    @classmethod
    def open(cls, path: str) -> KmsgReader:
        """Open ``path`` non-blocking; a character device is read one record per ``read()``."""
        marker = open_marker(path)  # first: a record printed while we open is new, never history
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                raw = os.fdopen(fd, "rb", buffering=0)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            if marker is not None:
                marker.close()
            raise
        if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == KMSG_DEVICE:
            return cls(raw, record_per_read=True, fileno=fd, marker=marker)
        if marker is not None:
            marker.close()
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):  # /dev/zero would be read forever
            raw.close()
            raise OSError(errno.EINVAL, f"not /dev/kmsg: device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        size = st.st_size if stat.S_ISREG(st.st_mode) else None
        reader = cls(raw, record_per_read=False, fileno=fd, history_bytes=size)
        if size is not None and size > MAX_FILE_HISTORY_BYTES:
            reader.skip_to(size - MAX_FILE_HISTORY_BYTES)
        return reader

    def skip_to(self, offset: int) -> None:
        """Start a record file's history at ``offset`` (the record cut there is dropped)."""
        self._raw.seek(offset - 1)  # type: ignore[attr-defined]  # from the byte before: a newline there keeps
        self.skipped_bytes, self._discarding = offset, True  # the record that starts at offset whole
        self._history_left = None if self._history_left is None else self._history_left - offset + 1

    def _read_again_if_rewritten(self) -> None:
        """Read a record file read live again from its start when it was truncated in place (copytruncate)
        since the last read."""
        position = self._position()
        if position is not None and rewritten(self._fileno, position, self._tail):  # type: ignore[arg-type]
            self._read_again()

    def _read_again(self) -> None:
        """Read a record file rewritten under us from its new start; what was buffered of it is gone."""
        self._raw.seek(0)  # type: ignore[attr-defined]
        self._buffer, self._discarding, self._tail = b"", False, b""
        self.truncations += 1

    def _position(self) -> int | None:
        """Where the next read of a record file read live starts (None: not such a file, or untold)."""
        if self._record_per_read or self._fileno is None or self._history_left is not None:
            return None
        try:
            return self._raw.tell()  # type: ignore[attr-defined]
        except (OSError, AttributeError, ValueError):
            return None

    @property
    def is_device(self) -> bool:
        """True when reads return one record each (the kmsg character device)."""
        return self._record_per_read

    def read_available(self, max_records: int = 1000) -> ReadBatch:
        """Read what is available now, up to about ``max_records`` records; never blocks.

        Until :attr:`history_done`, ``history`` says how many of the leading records are history.
        """
        self._read_again_if_rewritten()
        records: list[bytes] = []
        epipe = 0
        drained = False
        boundary: int | None = None  # where a file's content at open ended, in this batch
        # Bounded so a source that raises EPIPE forever cannot spin here.
        for _ in range(max_records * 2 + 2):
            if len(records) >= max_records:
                break
            size = self._read_size
            if self._history_left is not None:
                if self._history_left <= 0:  # the file's content at open is read: frame its last record
                    records.extend(self._frame(b"", final=True))
                    boundary, self._history_left = len(records), None
                    continue
                size = min(size, self._history_left)
            tail, start = self._tail, self._position()
            try:
                data = self._raw.read(size)
            except BrokenPipeError:
                epipe += 1  # the next read returns the oldest record still present
                continue
            except BlockingIOError:
                data = None
            except OSError as err:
                if err.errno == errno.EPIPE:
                    epipe += 1
                    continue
                if err.errno in (errno.EAGAIN, errno.EINTR):
                    data = None
                else:
                    raise
            if not data:
                records.extend(self._frame(b"", final=True))
                drained = True
                break
            if start is not None and not holds(self._fileno, tail, start):  # type: ignore[arg-type]
                self._read_again()  # rewritten between the check and the read: data is from the middle
                continue
            if self._history_left is not None:
                self._history_left -= len(data)
            if not self._record_per_read:
                self._tail = (self._tail + data)[-TAIL_BYTES:]
            records.extend(self._frame(data, final=self._record_per_read))
        history = self._history_count(records, drained, boundary)
        return ReadBatch(tuple(records), epipe, drained, history)

    def _frame(self, data: bytes, *, final: bool) -> list[bytes]:
        """Frame ``data`` after the buffered rest; a record longer than the cap is cut."""
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return []
            data, self._discarding = data[nl + 1 :], False
        done, self._buffer = split_records(self._buffer + data, final=final)
        if len(self._buffer) > MAX_RAW_RECORD_BYTES:
            cut, rest = self._buffer[:MAX_RAW_RECORD_BYTES], self._buffer[MAX_RAW_RECORD_BYTES:]
            done.append(cut)  # parse_record marks a record this long as truncated
            nl = rest.find(b"\n")
            self._discarding = nl < 0
            self._buffer = b"" if nl < 0 else rest[nl + 1 :]
        return done

    def _history_count(self, records: list[bytes], drained: bool, boundary: int | None) -> int:
        """How many leading ``records`` are history; ends history where it ends (``boundary``: where
        a file's content at open ended; ``drained``: nothing more was there)."""
        if self.history_done:
            return 0
        if self._record_per_read and self._first_new_seq is None and self._marker is not None:
            # Polled after the reads: a record the marker has not seen yet was there at open.
            self._poll_marker()
        count = len(records) if boundary is None else boundary
        if self._first_new_seq is not None:
            count = history_prefix(records, self._first_new_seq)
        if drained or count < len(records) or boundary is not None:
            self.history_done = True
            self._close_marker()
        return count

    def _poll_marker(self) -> None:
        assert self._marker is not None
        for _ in range(2):  # EPIPE: the ring wrapped past the marker; the retry reads the oldest left
            try:
                data = self._marker.read(DEVICE_READ_SIZE)
            except BrokenPipeError:
                continue
            except BlockingIOError:
                return  # nothing printed since open
            except OSError:
                break
            if not data:
                return  # nothing printed since open
            self._first_new_seq = record_seq(data)
            break
        self._close_marker()  # known now, or the marker is no use: history ends at the first drain

    def _close_marker(self) -> None:
        if self._marker is not None:
            self._marker.close()
            self._marker = None

    @property
    def pollable(self) -> bool:
        """True when :meth:`wait_readable` can block on the kernel (an opened device)."""
        return self._record_per_read and self._fileno is not None

    def wait_readable(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a device record; ``False`` at once if not pollable."""
        if not self.pollable or self._fileno is None:
            return False
        poller = select.poll()
        poller.register(self._fileno, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))

    def close(self) -> None:
        """Close the underlying source."""
        self._close_marker()
        self._raw.close()
