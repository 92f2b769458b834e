"""/dev/kmsg records: a pure parser and framer, and a thin non-blocking reader.

Record format (Documentation/ABI/testing/dev-kmsg)::

    <prio>,<seq>,<ts_usec>,<flags>[,<more>...];<text>\\n
     KEY=value\\n          (optional continuation lines, each starting with a space)

The kernel escapes bytes < 0x20, >= 0x7f and the backslash as ``\\xNN``, so a record's text never
holds a raw newline and records can be framed line by line. On the device one ``read()`` returns
exactly one record; a regular file (``cat /dev/kmsg > file``) holds many, cut anywhere by reads.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from exporter.model import EMPTY

KERNEL_FACILITY = 0
# The kernel's CONSOLE_EXT_LOG_MAX is 8 KiB; a smaller buffer makes read() fail with EINVAL.
DEVICE_READ_SIZE = 16384
FILE_READ_SIZE = 65536

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

    @property
    def is_kernel(self) -> bool:
        """True for messages printed by the kernel (not written to /dev/kmsg from user space)."""
        return self.facility == KERNEL_FACILITY


def unescape(raw: bytes) -> str:
    """Undo the kernel's ``\\xNN`` escaping and decode as UTF-8 (invalid bytes replaced)."""
    return _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), raw).decode("utf-8", "replace")


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
        text=unescape(body),
        fields=fields or EMPTY,
    )


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


class KmsgReader:
    """Adapter over an opened kmsg device or record file: non-blocking, record-framed."""

    def __init__(self, raw: RawSource, *, record_per_read: bool, fileno: int | None = None) -> None:
        self._raw = raw
        self._record_per_read = record_per_read
        self._fileno = fileno
        self._read_size = DEVICE_READ_SIZE if record_per_read else FILE_READ_SIZE
        self._buffer = b""

    @classmethod
    def open(cls, path: str) -> KmsgReader:
        """Open ``path`` non-blocking; a character device is read one record per ``read()``."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            is_device = stat.S_ISCHR(os.fstat(fd).st_mode)
            raw = os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        return cls(raw, record_per_read=is_device, fileno=fd)

    @property
    def is_device(self) -> bool:
        """True when reads return one record each (the kmsg character device)."""
        return self._record_per_read

    def read_available(self, max_records: int = 1000) -> ReadBatch:
        """Read what is available now, up to about ``max_records`` records; never blocks."""
        records: list[bytes] = []
        epipe = 0
        drained = False
        # Bounded so a source that raises EPIPE forever cannot spin here.
        for _ in range(max_records * 2 + 2):
            if len(records) >= max_records:
                break
            try:
                data = self._raw.read(self._read_size)
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
                done, self._buffer = split_records(self._buffer, final=True)
                records.extend(done)
                drained = True
                break
            done, self._buffer = split_records(self._buffer + data, final=self._record_per_read)
            records.extend(done)
        return ReadBatch(tuple(records), epipe, drained)

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
        self._raw.close()
