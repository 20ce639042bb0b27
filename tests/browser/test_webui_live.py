"""The operator's web UI in a real headless Chromium: the job list, and a job page that follows the
provider live (server-sent events), on a real aiohttp server on loopback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.records import load_dumps
from frscope.report import report_to_dict
from frscope.report.timeline import build_timeline
from frscope.webui import MemoryProvider, RankStatus, create_app
from tests.browser.conftest import LiveServer, PageErrors, state, wait_ready

REAL = Path(__file__).parents[1] / "data" / "real"

pytestmark = pytest.mark.browser


def real(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    dumpset = load_dumps([REAL / name])
    report = analyze(dumpset, AnalysisOptions(stall_after_s=1.0))
    return report_to_dict(report), build_timeline(dumpset, report)


def test_live_page_follows_the_job(browser: Any, artifacts: Path) -> None:
    provider = MemoryProvider()
    healthy_report, healthy_timeline = real("none")
    provider.put(
        "team-a",
        "llm-pretrain",
        report=healthy_report,
        timeline=healthy_timeline,
        ranks={r: RankStatus("ok") for r in range(4)},
    )
    provider.put("team-b", "vision", report=None, timeline=None)
    hang_report, hang_timeline = real("hang-pickle")
    app = create_app(provider, poll_s=0.2)
    with LiveServer(app) as server:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        errors = PageErrors(page)
        try:
            # the job list
            page.goto(server.url("/"))
            wait_ready(page)
            rows = page.inner_text("#jobs-body")
            assert "team-a/llm-pretrain" in rows and "No problem found" in rows and "not diagnosed" in rows
            page.screenshot(path=str(artifacts / "webui-jobs.png"))
            page.click("text=team-b/vision")  # not diagnosed yet: the page says so
            wait_ready(page)
            assert "No report yet" in page.inner_text("#fr-verdict") and page.is_visible("#fr-empty")
            page.go_back()
            wait_ready(page)
            page.click("text=team-a/llm-pretrain")
            wait_ready(page)
            assert page.url.endswith("/jobs/team-a/llm-pretrain")
            first = state(page)
            assert first["culpritRanks"] == [] and "No problem found" in first["verdict"]
            assert page.is_visible("#fr-live")

            # the job hangs: the provider changes, the open page follows without a reload
            marker = page.evaluate("() => (window.__notReloaded = true)")
            server.call(
                lambda: provider.put(
                    "team-a",
                    "llm-pretrain",
                    report=hang_report,
                    timeline=hang_timeline,
                    ranks={
                        0: RankStatus("stalled", "in all_reduce #4"),
                        1: RankStatus("ok", "in load_batch"),
                        2: RankStatus("stalled"),
                        3: RankStatus("stalled"),
                    },
                )
            )
            page.wait_for_function("() => window.frscope.state().culpritRanks.length === 1", timeout=15_000)
            after = state(page)
            assert page.evaluate("() => window.__notReloaded") is marker is True
            assert after["revision"] != first["revision"]
            assert after["culpritRanks"] == [1] and after["highlightedRanks"] == [1] and after["stuckVisible"]
            assert "never joined" in page.inner_text("#fr-verdict")
            assert "stalled: 3 ranks (0, 2-3)" in page.inner_text("#fr-status")
            assert "RankNotJoined" in page.inner_text("#fr-findings")

            # a status-only change (ranks) also arrives
            gone = {r: RankStatus("unreachable") for r in range(4)}
            server.call(lambda: provider.set_ranks("team-a", "llm-pretrain", gone))
            page.wait_for_function(
                "() => (window.frscope.state().status['0'] || {}).state === 'unreachable'", timeout=15_000
            )
            page.screenshot(path=str(artifacts / "webui-job-live.png"), full_page=True)
            time.sleep(0.3)
            assert errors.items == []
        finally:
            context.close()


def test_live_page_falls_back_to_polling(browser: Any) -> None:
    """With server-sent events blocked (a proxy that buffers them, say), the page polls the summary."""
    provider = MemoryProvider()
    report, timeline = real("none")
    provider.put("ns", "job", report=report, timeline=timeline)
    hang_report, hang_timeline = real("hang")
    with LiveServer(create_app(provider, poll_s=0.2)) as server:
        context = browser.new_context()
        context.route("**/events", lambda route: route.fulfill(status=503, body="no streaming here"))
        page = context.new_page()
        try:
            page.goto(server.url("/jobs/ns/job"))
            wait_ready(page)
            server.call(lambda: provider.put("ns", "job", report=hang_report, timeline=hang_timeline))
            page.wait_for_function("() => window.frscope.state().culpritRanks.length === 1", timeout=20_000)
        finally:
            context.close()


def test_ranks_now_says_how_many_and_which_as_the_dots_do(browser: Any) -> None:
    """Two ranks reported (rank 0 stalled, rank 1 ok, as on a 2-rank hang): the "Ranks now" line names
    each state's count and ranks, and each rank's dot has its state's colour (the line once read
    "ok: 1, stalled: 0", rank lists that looked like counts)."""
    report, timeline = real("p2p")
    provider = MemoryProvider()
    provider.put("ml", "two", report=report, timeline=timeline,
                 ranks={0: RankStatus("stalled", "in recv"), 1: RankStatus("ok")})
    with LiveServer(create_app(provider, poll_s=0.2)) as server:
        context = browser.new_context(viewport={"width": 1200, "height": 800})
        page = context.new_page()
        try:
            page.goto(server.url("/jobs/ml/two"))
            wait_ready(page)
            pills = page.eval_on_selector_all(
                "#fr-status .pill",
                "els => els.map(e => [e.dataset.state, e.dataset.count, e.dataset.ranks, e.textContent])")
            assert [p[:3] for p in pills] == [["ok", "1", "1"], ["stalled", "1", "0"]]
            assert "stalled: 1 rank (0)" in pills[1][3] and "ok: 1 rank (1)" in pills[0][3]
            g = next(g for g in timeline["groups"] if 0 in g["ranks"] and 1 in g["ranks"])
            page.evaluate(f"() => window.frscope.setGroup({g['name']!r})")
            colours = page.evaluate("""(seq) => {
                const c = document.getElementById('fr-canvas'), ctx = c.getContext('2d');
                const dpr = window.devicePixelRatio || 1;
                return [0, 1].map(r => { const b = window.frscope.cellBox(r, seq);
                  const px = ctx.getImageData(Math.round(62 * dpr), Math.round(b.cy * dpr), 1, 1).data;
                  return Array.from(px).slice(0, 3); });
            }""", g["seqs"][0])
            assert colours == [[0xef, 0x6c, 0x00], [0x2e, 0x7d, 0x32]], colours  # stalled orange, ok green
        finally:
            context.close()
