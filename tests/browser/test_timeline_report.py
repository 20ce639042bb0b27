"""The self-contained HTML report (`frscope analyze --html`) in a real headless Chromium, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.cli import main
from frscope.records import load_dumps
from frscope.report.html import render_report_html
from tests.browser.conftest import PageErrors, state, wait_ready

REAL = Path(__file__).parents[1] / "data" / "real"

pytestmark = pytest.mark.browser


def _offline_page(
    browser: Any, path: Path, width: int = 1400, height: int = 900
) -> tuple[Any, Any, PageErrors, list[str]]:
    context = browser.new_context(viewport={"width": width, "height": height}, offline=True)
    blocked: list[str] = []

    def guard(route: Any) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    errors = PageErrors(page)
    page.goto(path.as_uri())
    wait_ready(page)
    return context, page, errors, blocked


def _write_report(tmp_path: Path, fixture: str, options: AnalysisOptions | None) -> Path:
    dumpset = load_dumps([REAL / fixture])
    out = tmp_path / f"{fixture}.html"
    out.write_text(render_report_html(analyze(dumpset, options), dumpset), encoding="utf-8")
    return out


def test_cli_html_opens_offline_with_culprit_highlighted(browser: Any, tmp_path: Path, artifacts: Path) -> None:
    out = tmp_path / "report.html"
    code = main(
        [
            "analyze",
            str(REAL / "hang-pickle"),
            "--stuck-after",
            "1",
            "--html",
            str(out),
            "-o",
            str(tmp_path / "report.txt"),
            "--no-progress",
        ]
    )
    assert code == 1 and out.exists()
    context, page, errors, blocked = _offline_page(browser, out)
    try:
        s = state(page)
        assert errors.items == []
        assert blocked == []
        assert s["culpritRanks"] == [1] and s["highlightedRanks"] == [1]
        assert s["stuck"]["seq"] == 4 and s["stuckVisible"] is True and s["group"] == "0"
        assert "never joined" in page.inner_text("#fr-verdict")
        assert page.get_attribute("#fr-canvas", "data-highlighted-ranks") == "[1]"
        # the findings panel: verdict, evidence, and the stuck rank's stack with its user frame
        findings = page.inner_text("#fr-findings")
        assert "RankNotJoined" in findings and "train_step" in findings and "job.py:145" in findings
        # click the culprit's cell at the stuck collective: the details name it
        box = page.evaluate("() => window.frscope.cellBox(1, 4)")
        canvas = page.query_selector("#fr-canvas").bounding_box()
        page.mouse.click(canvas["x"] + box["cx"], canvas["y"] + box["cy"])
        details = page.inner_text("#fr-details")
        assert "never entered" in details and "(culprit)" in details
        box = page.evaluate("() => window.frscope.cellBox(0, 4)")
        page.mouse.move(canvas["x"] + box["cx"], canvas["y"] + box["cy"])
        tip = page.inner_text("#fr-tooltip")
        assert "all_reduce" in tip and "[8, 4]" in tip and "in flight" in tip and "job.py" in tip
        page.screenshot(path=str(artifacts / "timeline-report-hang.png"), full_page=True)
        assert errors.items == []
    finally:
        context.close()


def test_op_filter_changes_what_is_drawn(browser: Any, tmp_path: Path, artifacts: Path) -> None:
    out = _write_report(tmp_path, "type", None)
    context, page, errors, blocked = _offline_page(browser, out)
    try:
        before = state(page)
        assert set(before["drawnByOp"]) == {"ALLREDUCE", "BROADCAST"}
        pixels_before = page.evaluate("() => document.getElementById('fr-canvas').toDataURL()")
        page.uncheck("#fr-ops input[data-op=ALLREDUCE]")
        after = state(page)
        assert after["ops"] == ["BROADCAST"]
        assert set(after["drawnByOp"]) == {"BROADCAST"}
        assert after["drawnCells"] == before["drawnByOp"]["BROADCAST"] < before["drawnCells"]
        assert page.evaluate("() => document.getElementById('fr-canvas').toDataURL()") != pixels_before
        assert after["highlightedRanks"] == [1]  # the culprit stays marked whatever is filtered
        page.click("#fr-ops-all")
        assert state(page)["drawnCells"] == before["drawnCells"]
        # rank range filter: the culprit's row goes away with it
        page.fill("#fr-ranks", "2-3")
        page.press("#fr-ranks", "Enter")
        ranged = state(page)
        assert ranged["rows"] == 2 and ranged["highlightedRanks"] == []
        # time axis: the same cells, placed by creation time
        page.fill("#fr-ranks", "")
        page.press("#fr-ranks", "Enter")
        page.check("#fr-mode-time")
        timed = state(page)
        assert timed["mode"] == "time" and timed["highlightedRanks"] == [1] and timed["drawnCells"] > 0
        page.screenshot(path=str(artifacts / "timeline-report-type-time.png"), full_page=True)
        assert errors.items == [] and blocked == []
    finally:
        context.close()


def test_group_filter(browser: Any, tmp_path: Path) -> None:
    out = _write_report(tmp_path, "hang", AnalysisOptions(stall_after_s=1.0))
    context, page, errors, _ = _offline_page(browser, out)
    try:
        options = page.eval_on_selector_all("#fr-group option", "els => els.map(e => e.textContent)")
        assert len(options) == 2 and "param_sync" in options[1]
        page.select_option("#fr-group", "1")
        s = state(page)
        assert s["group"] == "1" and s["rows"] == 2 and set(s["drawnByOp"]) == {"BROADCAST"}
        assert s["highlightedRanks"] == [1]  # rank 1 is a member of param_sync too
        assert errors.items == []
    finally:
        context.close()


@pytest.mark.parametrize("fixture", sorted(p.name for p in REAL.iterdir() if p.is_dir()))
def test_every_real_fixture_draws_without_errors(browser: Any, tmp_path: Path, fixture: str) -> None:
    out = _write_report(tmp_path, fixture, AnalysisOptions(stall_after_s=1.0))
    context, page, errors, blocked = _offline_page(browser, out, 1100, 800)
    try:
        s = state(page)
        assert s["drawnCells"] > 0
        page.evaluate("() => window.frscope.setMode('time')")
        page.evaluate("() => window.frscope.zoomToStuck()")
        page.mouse.move(400, 420)
        page.evaluate("() => window.frscope.reset()")
        for i in range(len(page.query_selector_all("#fr-group option"))):
            page.select_option("#fr-group", str(i))
        assert errors.items == [] and blocked == []
    finally:
        context.close()


def test_time_mode_shows_the_wait_on_the_axis_and_stacks_wrap(browser: Any, tmp_path: Path) -> None:
    """A real gloo hang: the waiting ranks' all_reduce was in flight for seconds when the recorders were
    read, after a history of milliseconds. Time mode opens on an axis that holds the whole wait (and
    names its length); a culprit stack line longer than its panel wraps instead of hiding its end."""
    out = _write_report(tmp_path, "hang", AnalysisOptions(stall_after_s=1.0))
    context, page, errors, _ = _offline_page(browser, out, 1100, 800)
    try:
        page.evaluate("() => window.frscope.setMode('time')")
        s = state(page)
        assert s["waitMs"] is not None and s["waitMs"] > 1000, s
        assert s["axisSpanMs"] >= s["waitMs"], s
        overflowing = page.eval_on_selector_all(
            ".stack", "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).length")
        wrapping = page.eval_on_selector_all(".stack", "els => els.map(e => getComputedStyle(e).whiteSpace)")
        assert wrapping and set(wrapping) == {"pre-wrap"} and overflowing == 0
        assert errors.items == []
    finally:
        context.close()
