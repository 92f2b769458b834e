"""The immutable snapshot a scrape serves, and its rendering.

A snapshot is rendered once per sampling cycle, off the event loop; a scrape only appends
the snapshot's age (and, for gzip clients, a tiny second gzip member: concatenated gzip
members are one valid stream, which Go's and Python's readers accept).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from exporter.model import EMPTY, DeviceSample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
AGE_FAMILY = "kube_gpu_exporter_snapshot_age_seconds"


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


class _Static:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text exposition (0.0.4) of the given families."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static(families))
    return generate_latest(registry)


def make_snapshot(families: Iterable[Metric], built_at: float, devices: tuple[DeviceSample, ...] = (),
                  pid_owners: Mapping[int, tuple[str, str, str, str]] | None = None) -> Snapshot:
    body = render(families)
    return Snapshot(body, gzip.compress(body, compresslevel=6, mtime=0), built_at, devices,
                    pid_owners or EMPTY)


def age_text(snapshot: Snapshot, now: float) -> bytes:
    """The one family computed at scrape time."""
    age = max(0.0, now - snapshot.built_at)
    return (f"# HELP {AGE_FAMILY} Age of the served snapshot at scrape time\n"
            f"# TYPE {AGE_FAMILY} gauge\n{AGE_FAMILY} {age!r}\n").encode()


def scrape_payload(snapshot: Snapshot, now: float, gzipped: bool) -> bytes:
    """The bytes a scrape returns: the pre-rendered body plus the age line."""
    if gzipped:
        return snapshot.body_gzip + gzip.compress(age_text(snapshot, now), compresslevel=1, mtime=0)
    return snapshot.body + age_text(snapshot, now)


def empty_snapshot(built_at: float, families: Iterable[Metric] = ()) -> Snapshot:
    return make_snapshot(families, built_at)
