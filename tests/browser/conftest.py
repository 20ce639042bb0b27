"""A real headless Chromium (Debian's `chromium`, installed by `make deps-apt`) driven by Playwright.

Browsers are never downloaded (`playwright install` is not used): Playwright starts the system binary.
The live web UI runs on a real aiohttp server on loopback, in a thread with its own event loop, so the
tests can use Playwright's sync API.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

CHROMIUM = os.environ.get("FRSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: run `make deps-apt` (Debian packages chromium, chromium-driver)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


class PageErrors:
    """Console errors and uncaught exceptions of one page."""

    def __init__(self, page: Any) -> None:
        self.items: list[str] = []
        page.on("console", lambda m: self.items.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.items.append(f"pageerror: {e}"))


def wait_ready(page: Any, timeout_ms: int = 60_000) -> None:
    page.wait_for_selector("body[data-ready=true]", state="attached", timeout=timeout_ms)


def state(page: Any) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate("() => window.frscope.state()")
    return result


class LiveServer:
    """An aiohttp app on 127.0.0.1 in a thread; `call()` runs a function on its loop and waits."""

    def __init__(self, app: web.Application | Callable[[], Awaitable[web.Application]]) -> None:
        # a factory builds the app on the server's own loop (for apps that open client sessions)
        self.app = app
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="webui-test-server", daemon=True)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        async def main() -> None:
            app = self.app if isinstance(self.app, web.Application) else await self.app()
            runner = web.AppRunner(app, shutdown_timeout=2.0)
            self._stop = asyncio.Event()
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("web UI test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self._stop
        assert stop is not None
        self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(15)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"
