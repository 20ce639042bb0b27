"""The operator's HTTP server with the web UI mounted at /ui/, in a real headless Chromium, fed through the
operator's own path (controller, store, status poller, diagnosis) from stand-in sidecars serving REAL
recorder snapshots of a hung gloo job. No Kubernetes: the job and pod bodies go to the controller directly
and the API writes go to a fake API server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.browser.conftest import PageErrors, state, wait_ready
from tests.unit.operator.test_ui import Rig

pytestmark = pytest.mark.browser
T = TypeVar("T")


class RigThread:
    """The rig on its own event loop in a thread, so that the test can drive Playwright's sync API."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="operator-ui-rig", daemon=True)
        self._thread.start()
        self.rig = self.run(lambda: Rig().start(ui_poll_s=0.2))

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(30)

    def set(self, fn: Callable[[], None]) -> None:
        async def call() -> None:
            fn()

        self.run(call)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.rig.port}/ui{path}"

    def close(self) -> None:
        try:
            self.run(self.rig.close)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


@pytest.fixture
def operator_ui() -> Iterator[RigThread]:
    rt = RigThread()
    try:
        yield rt
    finally:
        rt.close()


def test_operator_ui_follows_the_watched_job(browser: Any, artifacts: Path, operator_ui: RigThread) -> None:
    rig = operator_ui.rig
    operator_ui.run(rig.sweep)  # every rank ok, no diagnosis yet
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors = PageErrors(page)
    try:
        page.goto(operator_ui.url("/"))
        wait_ready(page)
        assert "ml/train" in page.inner_text("#jobs-body") and "not diagnosed" in page.inner_text("#jobs-body")

        page.click("text=ml/train")
        wait_ready(page)
        assert page.url.endswith("/ui/jobs/ml/train")
        assert "No report yet" in page.inner_text("#fr-verdict")  # the status-only view
        assert "ok: 4 ranks (0-3)" in page.inner_text("#fr-status")
        first = state(page)
        assert first["culpritRanks"] == [] and first["status"]["2"]["state"] == "ok"
        page.evaluate("() => (window.__notReloaded = true)")

        # The worker's ranks stall. The API server is slow to take the report, so the page shows the stall
        # (from the status sweep) before the diagnosis arrives.
        operator_ui.set(lambda: setattr(rig.kube, "delay_s", 1.0))
        operator_ui.set(lambda: setattr(rig.worker, "stalled", True))
        operator_ui.run(rig.sweep)
        page.wait_for_function("() => (window.frscope.state().status['2'] || {}).state === 'stalled'",
                               timeout=15_000)
        assert state(page)["culpritRanks"] == []
        assert "stalled: 2 ranks (2-3)" in page.inner_text("#fr-status")

        # The diagnosis is published: the page follows without a reload and highlights the culprit.
        operator_ui.set(lambda: setattr(rig.kube, "delay_s", 0.0))
        operator_ui.run(rig.controller.idle)
        page.wait_for_function("() => window.frscope.state().culpritRanks.length === 1", timeout=15_000)
        after = state(page)
        assert page.evaluate("() => window.__notReloaded") is True
        assert after["culpritRanks"] == [1] and after["highlightedRanks"] == [1] and after["stuckVisible"]
        assert "never joined" in page.inner_text("#fr-verdict")
        assert "RankNotJoined" in page.inner_text("#fr-findings")
        page.screenshot(path=str(artifacts / "operator-ui-job.png"), full_page=True)

        # The job list shows the verdict.
        page.goto(operator_ui.url("/"))
        wait_ready(page)
        page.wait_for_function("() => document.querySelector('#jobs-body').innerText.includes('never joined')",
                               timeout=15_000)
        page.screenshot(path=str(artifacts / "operator-ui-jobs.png"))
        time.sleep(0.3)
        assert errors.items == []
    finally:
        context.close()
