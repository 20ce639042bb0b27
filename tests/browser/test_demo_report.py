"""`frscope demo` on a real hung 4-rank gloo job: it writes the timeline next to the recorders, says where
to open it, and the page shows the culprit (headless Chromium, offline)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from frscope.cli import main
from tests.browser.conftest import PageErrors, state, wait_ready

pytestmark = [pytest.mark.browser, pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_demo_prints_where_to_open_the_timeline(
    browser: Any, tmp_path: Path, artifacts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "demo"
    code = main(["demo", "--fault", "hang", "--world-size", "4", "--keep", str(keep)])
    out, err = capsys.readouterr()
    assert code == 0, out + err  # the demo showed the culprit: a clean exit (make demo succeeds)
    match = re.search(r"collective timeline: open (file://\S+report\.html)", err)
    assert match, err
    assert (keep / "report.html").exists() and match.group(1) == (keep / "report.html").resolve().as_uri()
    context = browser.new_context(viewport={"width": 1400, "height": 900}, offline=True)
    page = context.new_page()
    errors = PageErrors(page)
    try:
        page.goto(match.group(1))
        wait_ready(page)
        s = state(page)
        assert s["culpritRanks"] == [1] and s["highlightedRanks"] == [1] and s["stuckVisible"]
        assert "Rank 1" in page.inner_text("#fr-verdict")
        # the demo collects live stacks: the findings panel shows where rank 1 is now
        assert "load_batch" in page.inner_text("#fr-findings")
        page.screenshot(path=str(artifacts / "timeline-demo-hang.png"), full_page=True)
        assert errors.items == []
    finally:
        context.close()
