"""resource.k8s.io for the API server double: ResourceSlices (list, watch) and ResourceClaims (get, list).

v1 by default, v1beta2 instead for a 1.33 server (``ApiServerDouble.serve_resource_versions``).

Validation follows the real server where the exporter can tell: field selectors on slices accept
only the fields the API indexes (``spec.nodeName``, ``spec.driver``, ``spec.pool.name``,
``metadata.name``), an unknown field is 400; a missing claim is a 404 Status; objects keep the
shape the test stored (the API's own camelCase JSON). Slice watches stream ADDED, MODIFIED and
DELETED events for changes made after the list's resourceVersion, until ``timeoutSeconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from .selectors import SelectorError, parse_field_selector, parse_label_selector

PREFIX = "/apis/resource.k8s.io/v1"
BETA2 = "/apis/resource.k8s.io/v1beta2"  # what a 1.33 server serves (same fields as v1 for what is read here)
SLICE_FIELDS = frozenset({"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"})
CLAIM_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


class DraState:
    """Slices and claims of the double, touched only on its loop thread."""

    def __init__(self, api_error: type[Exception]) -> None:
        self.api_error = api_error
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 1
        self.slice_watches: set[asyncio.Queue] = set()
        self.versions: set[str] = {"v1"}  # resource.k8s.io versions served

    # --- test API (called on the loop thread) ---

    def set_slices(self, slices: list[Mapping[str, Any]], rv: int) -> None:
        new = {}
        for s in slices:
            obj = copy.deepcopy(dict(s))
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = str(rv)
            new[meta["name"]] = obj
        events = [("DELETED", o) for n, o in self.slices.items() if n not in new]
        events += [("MODIFIED" if n in self.slices else "ADDED", o) for n, o in new.items()
                   if self.slices.get(n, {}).get("spec") != o.get("spec") or n not in self.slices]
        self.slices, self.rv = new, rv
        for q in list(self.slice_watches):
            for e in events:
                q.put_nowait(e)

    def set_claims(self, claims: list[Mapping[str, Any]], rv: int) -> None:
        self.claims = {}
        for c in claims:
            obj = copy.deepcopy(dict(c))
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = str(rv)
            self.claims[(meta["namespace"], meta["name"])] = obj
        self.rv = rv

    # --- handlers ---

    def add_routes(self, r: web.UrlDispatcher) -> None:
        for prefix in (PREFIX, BETA2):
            r.add_get(f"{prefix}/resourceslices", self._served(self.slices_collection))
            r.add_get(f"{prefix}/resourceslices/{{name}}", self._served(self.get_slice))
            r.add_get(f"{prefix}/resourceclaims", self._served(self.list_claims))
            r.add_get(f"{prefix}/namespaces/{{ns}}/resourceclaims", self._served(self.list_claims))
            r.add_get(f"{prefix}/namespaces/{{ns}}/resourceclaims/{{name}}", self._served(self.get_claim))

    def _served(self, handler: Any) -> Any:
        """Answer only for the versions this server serves (a 1.33 server has no v1: 404)."""
        async def wrapper(request: web.Request) -> web.StreamResponse:
            if request.path.split("/")[3] not in self.versions:
                raise self.api_error(404, "NotFound", "the server could not find the requested resource")
            return await handler(request)
        return wrapper

    def _selectors(self, request: web.Request, fields: frozenset[str]) -> tuple[Any, Any]:
        try:
            return (parse_field_selector(request.query.get("fieldSelector"), fields),
                    parse_label_selector(request.query.get("labelSelector")))
        except SelectorError as exc:
            raise self.api_error(400, "BadRequest", str(exc)) from exc

    async def slices_collection(self, request: web.Request) -> web.StreamResponse:
        fsel, lsel = self._selectors(request, SLICE_FIELDS)
        if request.query.get("watch") in ("true", "1"):
            return await self._watch_slices(request, lambda o: fsel(o) and lsel(o))
        items = [o for _, o in sorted(self.slices.items()) if fsel(o) and lsel(o)]
        return web.json_response({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                                  "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    async def get_slice(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.slices:
            raise self.api_error(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found',
                                 {"name": name, "group": "resource.k8s.io", "kind": "resourceslices"})
        return web.json_response(self.slices[name])

    async def _watch_slices(self, request: web.Request, match: Any) -> web.StreamResponse:
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        queue: asyncio.Queue = asyncio.Queue()
        since = int(request.query.get("resourceVersion") or 0)
        if since and since < self.rv:  # changes between the list and the watch are not kept: replay the state
            for o in self.slices.values():
                queue.put_nowait(("ADDED", o))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        self.slice_watches.add(queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    etype, obj = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if match(obj):
                    await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.slice_watches.discard(queue)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    async def list_claims(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info.get("ns")
        fsel, lsel = self._selectors(request, CLAIM_FIELDS)
        items = [o for (cns, _), o in sorted(self.claims.items()) if (ns is None or cns == ns) and fsel(o) and lsel(o)]
        return web.json_response({"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1",
                                  "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    async def get_claim(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.claims:
            raise self.api_error(404, "NotFound", f'resourceclaims.resource.k8s.io "{key[1]}" not found',
                                 {"name": key[1], "group": "resource.k8s.io", "kind": "resourceclaims"})
        return web.json_response(self.claims[key])
