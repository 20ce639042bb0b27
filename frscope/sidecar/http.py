"""The sidecar's HTTP routes (docs/sidecar-api.md): probes, /metrics, /v1/status, /v1/snapshot.

The routes only translate HTTP: what they serve comes from a `Backend` (the `Sidecar`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from frscope import wire
from frscope.sidecar.auth import BearerToken
from frscope.sidecar.snapshot import SnapshotAnswer
from frscope.wire import StatusDoc


class Backend(Protocol):
    registry: CollectorRegistry
    auth: BearerToken

    @property
    def ready(self) -> bool: ...

    def rank_count(self) -> int: ...

    def status(self) -> StatusDoc: ...

    async def refresh(self) -> None: ...

    async def snapshot(self, reason: str, *, prefer_live: bool = False, last_entries: int | None = None,
                       gzip_asked: bool = True, if_none_match: str | None = None) -> SnapshotAnswer: ...


def build_app(backend: Backend) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(request: web.Request) -> web.Response:
        if backend.ready:
            return web.json_response({"ready": True, "ranks": backend.rank_count()})
        return web.json_response({"ready": False}, status=503)

    async def status(request: web.Request) -> web.Response:
        text = json.dumps(backend.status())
        resp = web.Response(text=text, content_type="application/json")
        if len(text) > 1024 and "gzip" in request.headers.get("Accept-Encoding", "").lower():
            resp.enable_compression(web.ContentCoding.gzip)
        return resp

    async def snapshot(request: web.Request) -> web.Response:
        refresh = request.query.get("refresh", "") in ("1", "true", "yes")
        try:
            last_entries = wire.parse_window(request.query.get("entries"))
        except wire.WireError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        if refresh:
            await backend.refresh()
        gzip_asked = "gzip" in request.headers.get("Accept-Encoding", "").lower()
        # If-None-Match is read bounded (frscope.wire.etag_matches): a long or odd one gets the whole answer
        answer = await backend.snapshot("refresh" if refresh else "poll", prefer_live=refresh,
                                        last_entries=last_entries, gzip_asked=gzip_asked,
                                        if_none_match=request.headers.get("If-None-Match"))
        headers = {"Vary": "Accept-Encoding", "ETag": answer.etag}
        if not answer.modified:
            return web.Response(status=304, headers=headers)
        if gzip_asked:
            return web.Response(body=answer.body_gz, content_type="application/json",
                                headers={**headers, "Content-Encoding": "gzip"})
        return web.Response(body=answer.body, content_type="application/json", headers=headers)

    app = web.Application(middlewares=[backend.auth.middleware], client_max_size=1024 * 1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler(backend.registry))
    app.router.add_get("/v1/status", status)
    app.router.add_get("/v1/snapshot", snapshot)
    return app


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """prometheus-client's aiohttp handler (0.21+) with the injected registry; else generate_latest."""
    try:
        from prometheus_client.aiohttp import make_aiohttp_handler
    except ImportError:  # pragma: no cover - older prometheus-client
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def fallback(request: web.Request) -> web.Response:
            resp = web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
            resp.enable_compression()
            return resp

        return fallback
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]] = make_aiohttp_handler(registry)
    return handler
