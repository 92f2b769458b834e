"""Serve a rendered fleet to Prometheus: one aiohttp server, one path per shard of nodes.

``/shard/<k>`` carries the exporter series of shard ``k``'s nodes and ``/tke/<k>`` their TKE
inputs; every series has its node's own ``cluster``/``instance`` labels, so Prometheus scrapes them
with ``honor_labels: true`` as if it scraped every node. A shard's body is pre-rendered bytes per
family; only two things change between scrapes:

- counters that move (busy seconds, energy, ...) are written as ``value + rate x elapsed``
  (``elapsed`` in whole scrape intervals since the path's first scrape when the interval is given);
- the usage gauges in ``VARY`` (duty cycle, memory used, and the GPU manager's counterparts) cycle
  through ``FACTORS``, one per scrape of that path, all values of a scrape scaled alike.

``POST /control?vary=0`` holds every gauge at the model's value (factor 1) so that a comparison can
read exact numbers; ``vary=1`` resumes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from bench.fleet_render import Family, Sample

VARY = frozenset({"nvidia_gpu_duty_cycle", "nvidia_gpu_memory_used_bytes", "container_gpu_utilization",
                  "container_gpu_memory_total"})
FACTORS = (1.0, 0.96, 1.03, 0.99)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _num(v: float) -> str:
    return repr(v) if v != int(v) or abs(v) >= 1e15 else str(int(v))


def _lines(samples: Iterable[Sample], factor: float = 1.0) -> bytes:
    return b"".join(s.key + b" " + _num(s.value * factor).encode() + b"\n" for s in samples)


@dataclass
class _Counters:
    """Moving counter lines of one family: their keys, values at elapsed 0 and rates."""

    keys: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)

    def render(self, elapsed: float) -> bytes:
        return "".join(f"{k} {v + r * elapsed!r}\n" for k, v, r in
                       zip(self.keys, self.values, self.rates, strict=True)).encode()


class Shard:
    """The pre-rendered body of some nodes' families (merged per family, one HELP/TYPE each)."""

    def __init__(self, families: Iterable[Family]) -> None:
        merged: dict[str, tuple[Family, list[Sample]]] = {}
        for fam in families:
            merged.setdefault(fam.name, (fam, []))[1].extend(fam.samples)
        self.parts: list[bytes | _Counters | tuple[bytes, ...]] = []
        self.series = 0
        for name, (fam, samples) in merged.items():
            self.series += len(samples)
            header = f"# HELP {name} {fam.help}\n# TYPE {name} {fam.kind}\n".encode()
            if name in VARY:
                self.parts += [header, tuple(_lines(samples, f) for f in FACTORS)]
                continue
            static = [s for s in samples if not s.rate]
            moving = _Counters()
            for s in samples:
                if s.rate:
                    moving.keys.append(s.key.decode())
                    moving.values.append(s.value)
                    moving.rates.append(s.rate)
            self.parts += [header + _lines(static)]
            if moving.keys:
                self.parts.append(moving)
        self.scrapes = 0

    def body(self, elapsed: float, vary: bool) -> bytes:
        variant = self.scrapes % len(FACTORS) if vary else 0
        self.scrapes += 1
        out = []
        for part in self.parts:
            if isinstance(part, bytes):
                out.append(part)
            elif isinstance(part, tuple):
                out.append(part[variant])
            else:
                out.append(part.render(elapsed))
        return b"".join(out)


class FleetServer:
    """The shards on one loopback port, served from a thread with its own event loop."""

    def __init__(self, shards: dict[str, Sequence[Shard]], host: str = "127.0.0.1", port: int = 0,
                 interval: float | None = None) -> None:
        self.shards, self.host, self.port = shards, host, port
        # With the scrape interval known, a path's counters advance by exactly one interval per scrape
        # (time since its first scrape, rounded to intervals): a late response does not bend the line.
        self.interval = interval
        self._first: dict[tuple[str, int], float] = {}
        self.vary = True
        self.started = time.time()
        self.scrapes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def paths(self, kind: str) -> list[str]:
        return [f"/{kind}/{k}" for k in range(len(self.shards[kind]))]

    async def _shard(self, request: web.Request) -> web.Response:
        shards = self.shards.get(request.match_info["kind"])
        k = int(request.match_info["k"])
        if shards is None or not 0 <= k < len(shards):
            raise web.HTTPNotFound()
        self.scrapes += 1
        now = time.time()
        if self.interval:
            first = self._first.setdefault((request.match_info["kind"], k), now)
            now = first + round((now - first) / self.interval) * self.interval
        body = shards[k].body(now - self.started, self.vary)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _control(self, request: web.Request) -> web.Response:
        if "vary" in request.query:
            self.vary = request.query["vary"] not in ("0", "false", "no")
        return web.json_response({"vary": self.vary, "scrapes": self.scrapes})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(r"/{kind:shard|tke}/{k:\d+}", self._shard)
        app.router.add_route("*", "/control", self._control)
        return app

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def start(self) -> FleetServer:
        """Serve from a daemon thread; returns once the port is bound."""
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._start())
            self._ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fleet-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("fleet server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> FleetServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shards(per_node: Sequence[list[Family]], nodes_per_shard: int) -> list[Shard]:
    """``per_node`` families grouped into shards of ``nodes_per_shard`` consecutive nodes."""
    return [Shard(f for node in per_node[i:i + nodes_per_shard] for f in node)
            for i in range(0, len(per_node), nodes_per_shard)]
