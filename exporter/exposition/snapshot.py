"""The immutable snapshot a scrape serves, and its rendering.

A snapshot is rendered once per sampling cycle, off the event loop; a scrape only appends
the snapshot's age (and, for gzip clients, a tiny second gzip member: concatenated gzip
members are one valid stream, which Go's and Python's readers accept). That member is stored,
not compressed: a kilobyte more on the wire, and no compressor set up per scrape.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from exporter.model import EMPTY, DeviceSample

if TYPE_CHECKING:
    from exporter.exposition.status_page import StatusPage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
AGE_FAMILY = "kube_gpu_exporter_snapshot_age_seconds"
FAILURES_FAMILY = "kube_gpu_exporter_sample_failures_total"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the server hands out until the next cycle replaces it."""

    body: bytes
    body_gzip: bytes
    built_at: float  # unix seconds
    devices: tuple[DeviceSample, ...] = ()
    # pid -> (namespace, pod, container, pod uid) of the GPU processes seen in this cycle,
    # so the Xid watcher can name the pod of a pid without touching /proc itself.
    pid_owners: Mapping[int, tuple[str, str, str, str]] = field(default_factory=lambda: EMPTY)
    # The status page's tree of the same cycle (exporter/exposition/status.py), empty before the first.
    status: Mapping[str, object] = field(default_factory=lambda: EMPTY)
    # Set by a failed cycle (the tree above is the last good cycle's): the failure count to show with it.
    sample_failures_total: int | None = None
    # ``/status.json`` and ``/`` of that tree, rendered once (exporter/exposition/status_page.py); None before
    # the first cycle
    page: StatusPage | None = None


def go_float(value: float) -> str:
    """Format like Go's ``strconv.FormatFloat(v, 'g', -1, 64)``, as Prometheus' own exporters do.

    (``26000`` not ``26000.0``; ``1.5811477504e+10``): the seed's rows are compared byte for byte.
    """
    value = float(value)
    if 1e-4 <= abs(value) < 1e6:
        # Go's fixed notation with the shortest digits: what repr gives in this range, but "7" for 7.0
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    d = Decimal(repr(value)).normalize()
    sign, digits, exponent = d.as_tuple()
    lead = exponent + len(digits) - 1  # decimal exponent of the first digit
    prefix = "-" if sign else ""
    if lead < -4 or lead >= 6:
        mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'+' if lead >= 0 else '-'}{abs(lead):02d}"
    return prefix + format(abs(d), "f")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text exposition (format 0.0.4) of the given families."""
    out: list[str] = []
    for fam in families:
        name, kind = fam.name, fam.type
        if kind == "counter" and not (fam.samples and fam.samples[0].name == name):
            # client_python strips the suffix from counter family names; a counter whose samples
            # carry the bare name (dcgm-exporter's DCGM_FI_*, exposition/dcgm.py) keeps it.
            name += "_total"
        elif kind == "unknown":
            kind = "untyped"
        elif kind == "info":
            name, kind = name + "_info", "gauge"
        out.append(f"# HELP {name} {_escape_help(fam.documentation)}\n# TYPE {name} {kind}\n")
        for sample in fam.samples:
            if sample.name.endswith("_created"):
                continue
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_value(str(v))}"' for k, v in sample.labels.items())
                out.append(f"{sample.name}{{{labels}}} {go_float(sample.value)}\n")
            else:
                out.append(f"{sample.name} {go_float(sample.value)}\n")
    return "".join(out).encode()


def make_snapshot(families: Iterable[Metric], built_at: float, devices: tuple[DeviceSample, ...] = (),
                  pid_owners: Mapping[int, tuple[str, str, str, str]] | None = None) -> Snapshot:
    body = render(families)
    return Snapshot(body, gzip.compress(body, compresslevel=6, mtime=0), built_at, devices,
                    pid_owners or EMPTY)


_AGE_HEAD = f"# HELP {AGE_FAMILY} Age of the served snapshot at scrape time\n# TYPE {AGE_FAMILY} gauge\n{AGE_FAMILY} "


def age_text(snapshot: Snapshot, now: float) -> bytes:
    """The one family computed at scrape time."""
    return f"{_AGE_HEAD}{go_float(max(0.0, now - snapshot.built_at))}\n".encode()


def scrape_parts(snapshot: Snapshot, now: float, gzipped: bool, extra: bytes = b"") -> tuple[bytes, bytes]:
    """What a scrape returns, in two parts: the pre-rendered body, then the age line and ``extra``.

    ``extra`` is exposition text computed at scrape time by the caller (the HTTP server's own
    counters): small, and in the same gzip member as the age line. Two parts, so that a large body
    is sent as it is, not copied into a new one per scrape.
    """
    tail = age_text(snapshot, now) + extra
    if gzipped:
        return snapshot.body_gzip, stored_gzip(tail)
    return snapshot.body, tail


def scrape_payload(snapshot: Snapshot, now: float, gzipped: bool, extra: bytes = b"") -> bytes:
    """The bytes a scrape returns (:func:`scrape_parts` joined)."""
    return b"".join(scrape_parts(snapshot, now, gzipped, extra))


_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, no mtime, OS unknown


def stored_gzip(data: bytes) -> bytes:
    """One gzip member (RFC 1952) holding ``data`` in deflate stored blocks (RFC 1951, 3.2.4)."""
    n = len(data)
    if n <= 0xFFFF:  # one block: what every scrape's tail is (a few hundred bytes), without the loop
        return b"".join((_GZIP_HEADER, struct.pack("<BHH", 1, n, n ^ 0xFFFF), data,
                         struct.pack("<II", zlib.crc32(data), n)))
    out = [_GZIP_HEADER]
    for start in range(0, max(len(data), 1), 0xFFFF):
        block = data[start:start + 0xFFFF]
        final = start + 0xFFFF >= len(data)
        out.append(struct.pack("<BHH", final, len(block), len(block) ^ 0xFFFF) + block)
    out.append(struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFF_FFFF))
    return b"".join(out)


def with_sample_failures(snapshot: Snapshot, failures_total: int) -> Snapshot:
    """``snapshot`` with its ``kube_gpu_exporter_sample_failures_total`` sample set to ``failures_total``.

    A failed cycle has no new snapshot: the previous one stays served (``built_at`` unchanged, so its
    age keeps telling how old the data is), but its failure counter must not stay what it was when
    it was built. Runs on the sampler thread, once per failed cycle (the gzip body is redone).
    """
    body = snapshot.body
    sample = FAILURES_FAMILY.encode() + b" "
    value = go_float(failures_total).encode()
    start = body.find(b"\n" + sample) + 1  # never the HELP/TYPE lines: they start with "# "
    if start:
        end = body.find(b"\n", start)
        end = len(body) if end < 0 else end
        new = body[:start] + sample + value + body[end:]
    else:  # e.g. the empty snapshot served before the first cycle succeeded
        new = body + (f"# HELP {FAILURES_FAMILY} Sampling cycles that failed unexpectedly\n"
                      f"# TYPE {FAILURES_FAMILY} counter\n").encode() + sample + value + b"\n"
    return replace(snapshot, body=new, body_gzip=gzip.compress(new, compresslevel=6, mtime=0),
                   sample_failures_total=failures_total)


def empty_snapshot(built_at: float, families: Iterable[Metric] = ()) -> Snapshot:
    return make_snapshot(families, built_at)
