"""An application from ``exporter.server.app.make_app`` on a real socket, and an aiohttp client for it.

    async with AppClient(make_app(holder, 60)) as client:
        r = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        status, body = r.status, await r.read()

The server is the exporter's own (:class:`~exporter.server.app.HttpServer`, default limits) on
127.0.0.1 and a free port; the client is aiohttp's, a test dependency only.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from exporter.server.app import App, HttpServer
from exporter.server.limits import ServerLimits
from exporter.server.stats import HttpStats


class AppClient:
    def __init__(self, app: App, limits: ServerLimits | None = None) -> None:
        self.server = HttpServer(app, "127.0.0.1", 0, limits or ServerLimits(), HttpStats())
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AppClient:
        await self.server.start()
        self._session = aiohttp.ClientSession(f"http://127.0.0.1:{self.server.port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._session is not None
        await self._session.close()
        await self.server.close()

    def get(self, path: str, **kw: Any) -> Any:
        """``aiohttp.ClientSession.get`` on the server: await it for the response."""
        assert self._session is not None
        return self._session.get(path, **kw)
