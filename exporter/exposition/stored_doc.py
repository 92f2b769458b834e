"""A document rendered once per cycle and served with a few bytes filled in per request (the status page).

A :class:`StoredDoc` is constant chunks with named slots between them. Each chunk is also stored as a
raw deflate segment of its own (a fresh compressor, ended by a sync flush: byte aligned, no reference
into another chunk), with its CRC-32 and zlib's ``crc32_combine`` operator for its length. A request
fills the slots (the snapshot's age: a few bytes) and gets either the chunks and values joined, or one
gzip member (RFC 1952): the segments, each value in a stored deflate block between them, an empty
final block and the CRC-32 of the whole, combined from the chunks' in 32 steps a chunk. One member,
not several concatenated (which /metrics sends): every browser and ``curl`` reads it. No request
compresses or reads more than the slot values, whatever the document's size.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, no mtime, OS unknown
_FINAL_EMPTY = b"\x01\x00\x00\xff\xff"  # a final stored block of no bytes: ends the deflate stream

CrcShift = tuple[int, ...]  # the images of the 32 bits: a linear map over GF(2)


def _apply(op: CrcShift, crc: int) -> int:
    out, i = 0, 0
    while crc:
        if crc & 1:
            out ^= op[i]
        crc >>= 1
        i += 1
    return out


def _compose(a: CrcShift, b: CrcShift) -> CrcShift:
    """``a`` after ``b``."""
    return tuple(_apply(a, x) for x in b)


_IDENTITY: CrcShift = tuple(1 << i for i in range(32))
# crc32(Y, c) = M(c) ^ crc32(Y, 0), M depending only on len(Y): M for one byte, read off zlib itself
_POWERS: list[CrcShift] = [tuple(zlib.crc32(b"\0", 1 << i) ^ zlib.crc32(b"\0") for i in range(32))]


def crc_shift(length: int) -> CrcShift:
    """The operator M with ``crc32(X + Y) == M(crc32(X)) ^ crc32(Y)`` for every Y of ``length`` bytes."""
    op, k = _IDENTITY, 0
    while length:
        while len(_POWERS) <= k:  # M for 2**k bytes; the sampler thread alone appends
            _POWERS.append(_compose(_POWERS[-1], _POWERS[-1]))
        if length & 1:
            op = _compose(_POWERS[k], op)
        length >>= 1
        k += 1
    return op


@dataclass(frozen=True, slots=True)
class Chunk:
    """A constant part of a document, with what its gzip form needs."""

    data: bytes
    segment: bytes  # raw deflate, sync-flushed
    crc: int
    shift: CrcShift


@dataclass(frozen=True, slots=True)
class StoredDoc:
    """Constant chunks and slot names (``str``), in document order."""

    parts: tuple[Chunk | str, ...]

    @property
    def constant_bytes(self) -> int:
        return sum(len(p.data) for p in self.parts if isinstance(p, Chunk))


def chunk(data: bytes, cache: dict[bytes, Chunk] | None = None) -> Chunk:
    """``data`` compressed once (``cache``: chunks shared between the variants of one cycle's documents)."""
    if cache is not None and (hit := cache.get(data)) is not None:
        return hit
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    made = Chunk(data, c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH), zlib.crc32(data), crc_shift(len(data)))
    if cache is not None:
        cache[data] = made
    return made


def compile_doc(text: str, tokens: Mapping[str, str], cache: dict[bytes, Chunk] | None = None) -> StoredDoc:
    """``text`` with each token of ``tokens`` (token -> slot name) made that slot."""
    if not tokens:
        return StoredDoc((chunk(text.encode(), cache),))
    pieces = re.split("(" + "|".join(re.escape(t) for t in tokens) + ")", text)
    parts: list[Chunk | str] = []
    for i, piece in enumerate(pieces):
        if i % 2:
            parts.append(tokens[piece])
        elif piece:
            parts.append(chunk(piece.encode(), cache))
    return StoredDoc(tuple(parts))


def fill(doc: StoredDoc, values: Mapping[str, bytes]) -> tuple[bytes, ...]:
    """The document's bytes with ``values`` in its slots (parts, to be sent without joining them)."""
    return tuple(values[p] if isinstance(p, str) else p.data for p in doc.parts)


def _stored(data: bytes) -> Iterable[bytes]:
    for start in range(0, len(data), 0xFFFF):
        block = data[start:start + 0xFFFF]
        yield struct.pack("<BHH", 0, len(block), len(block) ^ 0xFFFF) + block


def fill_gzip(doc: StoredDoc, values: Mapping[str, bytes]) -> tuple[bytes, ...]:
    """:func:`fill` as one gzip member: the stored segments, the values in stored blocks, the combined CRC."""
    out, crc, size = [_GZIP_HEADER], 0, 0
    for p in doc.parts:
        if isinstance(p, str):
            value = values[p]
            out.extend(_stored(value))
            crc, size = zlib.crc32(value, crc), size + len(value)
        else:
            out.append(p.segment)
            crc, size = _apply(p.shift, crc) ^ p.crc, size + len(p.data)
    out += [_FINAL_EMPTY, struct.pack("<II", crc, size & 0xFFFF_FFFF)]
    return tuple(out)
