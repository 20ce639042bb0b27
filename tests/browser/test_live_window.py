"""The operator's live window in a real Chromium: a healthy, running real gloo job (tests/browser/live_train.py,
3 ranks, one slower), a real `frscope sidecar` process reading its ranks' worker-server sockets, and the
operator's web UI (`OperatorJobs` over a `JobStore`, `LiveWindows` asking the sidecar over HTTP). No
diagnosis ever happens: the page shows the collectives as they flow, with each rank's own times, and
trace.json serves the same window."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from frscope.demo.launcher import _job_env
from frscope.demo.live import LocalSidecar
from frscope.operator.evidence.sidecars import SidecarClient
from frscope.operator.model.objects import JobRef, PodInfo
from frscope.operator.model.store import JobStore
from frscope.operator.serve.live_windows import LiveWindows
from frscope.operator.serve.ui import OperatorJobs
from frscope.webui import create_app
from tests.browser.conftest import LiveServer, PageErrors, state, wait_ready

pytestmark = [pytest.mark.browser, pytest.mark.torch]
WORLD = 3
TRAIN = Path(__file__).with_name("live_train.py")


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[Path, float]]:
    """The running job's socket dir and when it was started (time.monotonic())."""
    env = _job_env(WORLD)
    logs = [open(tmp_path / f"rank-{r}.log", "wb") for r in range(WORLD)]  # closed below
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(TRAIN), "--socket-dir", str(tmp_path), "--seconds", "120"],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=logs[r],
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
             for r in range(WORLD)]
    try:
        yield tmp_path, started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait(timeout=10)
        for log in logs:
            log.close()


def _ui(store: JobStore) -> Any:
    async def factory() -> web.Application:
        session = aiohttp.ClientSession()
        live = LiveWindows(store, SidecarClient(session))  # the operator's defaults
        app = create_app(OperatorJobs(store, live))

        async def close(_: web.Application) -> None:
            await live.close()
            await session.close()

        app.on_cleanup.append(close)
        return app

    return factory


@pytest.mark.timeout(240)
def test_a_healthy_running_job_flows_live_with_each_ranks_times(
        browser: Any, job: tuple[Path, float], artifacts: Path) -> None:
    socket_dir, started = job
    sidecar = LocalSidecar(socket_dir, stall_after_s=60.0)
    try:
        sidecar.wait_listening(time.monotonic() + 60)
        store = JobStore()
        store.upsert_job(JobRef("ml", "train", "uid-train"), world_size=WORLD,
                         conditions=[{"type": "Running", "status": "True"}])
        store.upsert_pod(PodInfo("ml", "train-master-0", "uid-pod", "train", "Master", 0, "127.0.0.1",
                                 sidecar.port, "Running", 0, (), False))
        with LiveServer(_ui(store)) as server:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            errors = PageErrors(page)
            try:
                page.goto(f"http://127.0.0.1:{server.port}/jobs/ml/train")
                wait_ready(page)
                # no diagnosis, default settings: the collectives appear on their own
                page.wait_for_function("() => window.frscope.state().cols > 0", timeout=90_000)
                first_seen_s = time.monotonic() - started
                first = state(page)
                assert first["verdict"] is None and first["rows"] == WORLD
                assert "live from the job's sidecars" in page.inner_text("#fr-verdict")
                page.wait_for_function(f"() => window.frscope.state().cols > {first['cols']} + 4", timeout=30_000)
                later = state(page)
                # each rank's own times: the slow rank arrives last, ~40 ms after the others
                listed = page.evaluate("() => window.frscope.list()")
                seq = next(q for q in reversed(listed["seqs"][:-2])
                           if page.evaluate(f"() => window.frscope.cellAt(0, {q}).op") == "all_reduce")
                info = page.evaluate(f"() => window.frscope.cellAt(2, {seq})")
                assert info["own_created_ms"] is not None and info["last_rank"] == 2, info
                assert info["own_created_ms"] - info["created_ms"] > 10
                for rank in range(WORLD):
                    assert page.evaluate(f"() => window.frscope.cellAt({rank}, {seq}).own_created_ms") is not None
                # where the time goes, for the window: the slower rank costs the job most
                page.wait_for_function("() => /^Rank 2 costs the job most/.test("
                                       "(document.querySelector('#fr-perf .perf-headline') || {}).textContent || '')",
                                       timeout=30_000)
                page.screenshot(path=str(artifacts / "live-window-healthy.png"), full_page=True)
                # the same window as a Chrome/Perfetto trace, linked from the page
                assert page.get_attribute("#fr-trace", "href") == "train/trace.json"
                response = page.request.get(f"http://127.0.0.1:{server.port}/jobs/ml/train/trace.json")
                assert response.ok
                trace = json.loads(response.body())
                slices = [e for e in trace["traceEvents"] if e["ph"] != "M"]
                assert {e["pid"] for e in slices} == set(range(WORLD))
                assert all(e["args"]["times"] == "this rank" for e in slices)
                assert {e["args"]["op"] for e in slices} >= {"all_reduce", "broadcast"}
                assert errors.items == []
                print(f"live window: first collectives on the page {first_seen_s:.1f} s after the job started; "
                      f"{later['cols']} collectives shown")
            finally:
                context.close()
    finally:
        sidecar.stop()
