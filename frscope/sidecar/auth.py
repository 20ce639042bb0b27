"""Who may read the sidecar: a bearer token from --token-file, reloaded when the file changes.

Probes (/healthz, /readyz) stay open: the kubelet has no token.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

log = logging.getLogger("frscope.sidecar")

PROBES = frozenset({"/healthz", "/readyz"})
TOKEN_RELOAD_S = 30.0


class BearerToken:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._token: str | None = None
        self._mtime: int | None = None

    def load(self) -> None:
        """Read the token file (sync: at startup, before the loop serves). ValueError if unusable."""
        path = self.path
        if path is None:
            return
        try:
            token = path.read_text().strip()
            self._mtime = path.stat().st_mtime_ns
        except OSError as exc:
            raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from exc
        if not token:
            raise ValueError(f"--token-file {path} is empty")
        self._token = token

    def token(self) -> str | None:
        return self._token

    @property
    def loaded(self) -> bool:
        return self._token is not None

    async def reload_loop(self) -> None:
        """Pick up a rotated token file; a file that cannot be read keeps the previous token."""
        path = self.path
        assert path is not None
        while True:
            await asyncio.sleep(TOKEN_RELOAD_S)
            try:
                mtime = (await asyncio.to_thread(path.stat)).st_mtime_ns
                if mtime != self._mtime:
                    token = (await asyncio.to_thread(path.read_text)).strip()
                    if token:
                        self._token, self._mtime = token, mtime
                        log.info("token file %s reloaded", path)
            except OSError as exc:
                log.warning("token file %s cannot be read (%s); keeping the previous token", path,
                            exc.strerror or exc)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self._token is None or request.path in PROBES:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token.encode()):
            return web.json_response(
                {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return await handler(request)
