"""What the kmsg reader asks of the files it opens: the device's second handle, a record file rewritten.

A record file (``cat /dev/kmsg > file``, rotated by logrotate's ``copytruncate``) can be truncated in
place under the open handle; the reader then starts again from its new start. :func:`rewritten` tells:
the file is now shorter than where we read to, or the last bytes we read are not there any more (it was
truncated and written past our position again before we looked). :func:`holds` asks the same of the
bytes before a read once it returned: a rewrite between the check and the read would otherwise hand on
the new content from the old position and lose what the writer put before it.
"""

from __future__ import annotations

import os
import stat
from typing import Any

TAIL_BYTES = 64  # compared with what the file holds before the read position


def rewritten(fd: int, position: int, tail: bytes) -> bool:
    """Whether the regular file ``fd``, read up to ``position``, no longer holds what was read of it (``tail``)."""
    try:
        st = os.fstat(fd)
    except OSError:  # a closed file
        return False
    return stat.S_ISREG(st.st_mode) and (st.st_size < position or not holds(fd, tail, position))


def holds(fd: int, tail: bytes, end: int) -> bool:
    """Whether the file ``fd`` still holds ``tail`` just before ``end`` (nothing to compare: it does)."""
    if not tail or end < len(tail):
        return True
    try:
        return os.pread(fd, len(tail), end - len(tail)) == tail
    except OSError:
        return True  # the next read's check tells


def open_marker(path: str) -> Any:
    """A second handle on a kmsg device, at its end: the first record it reads is the first new one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.lseek(fd, 0, os.SEEK_END)
        return os.fdopen(fd, "rb", buffering=0)
    except OSError:
        os.close(fd)
        return None
