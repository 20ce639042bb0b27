"""Each rank's own times, the list view, jump, and the rank-list / state / group filters of the timeline,
in a real headless Chromium on reports of real gloo recorders (tests/data/real), offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.records import DumpSet, Entry, GroupInfo, RankDump, load_dumps
from frscope.report.filters import parse_ranks
from frscope.report.html import render_html, render_report_html
from frscope.report.serialize import report_to_dict
from frscope.report.timeline import build_timeline
from tests.browser.conftest import state
from tests.browser.test_timeline_report import REAL, _offline_page, _write_report

pytestmark = pytest.mark.browser

# The rank lists both parsers must read alike (None: rejected).
RANK_LISTS = ["", "3", "0-7,12", " 0 - 2 , 5 ", "4-4", "1,1,2", "7-3", "a", "1-", "-1", "1-2-3", "0-7,x", "1048575",
              "1048576", "0-1048576", "12,,14", "3 4"]


def test_rank_list_parser_is_the_clis(browser: Any, tmp_path: Path) -> None:
    out = _write_report(tmp_path, "hang", AnalysisOptions(stall_after_s=1.0))
    context, page, errors, _ = _offline_page(browser, out)
    try:
        for text in RANK_LISTS:
            try:
                want: list[int] | None = sorted(parse_ranks(text))
            except ValueError:
                want = None
            got = page.evaluate("""(t) => { try { const out = [];
                for (const [lo, hi] of window.frscope.parseRanks(t))
                  for (let r = lo; r <= hi && out.length < 64; r++) out.push(r);
                return out; } catch (e) { return null; } }""", text)
            if want is not None and len(want) > 64:
                assert got is not None and got == want[:64], text
            else:
                assert got == want, text
        # the rank box takes a list; a bad one is refused and names the bad part
        page.fill("#fr-ranks", "0,2-3")
        page.press("#fr-ranks", "Enter")
        s = state(page)
        assert s["rows"] == 3 and s["ranks"] == "0,2-3" and s["highlightedRanks"] == []
        page.fill("#fr-ranks", "3-1")
        page.press("#fr-ranks", "Enter")
        assert state(page)["rows"] == 3
        assert "3-1" in page.evaluate("() => document.getElementById('fr-ranks').validationMessage")
        assert errors.items == []
    finally:
        context.close()


def test_straggler_own_times_list_and_jump(browser: Any, tmp_path: Path, artifacts: Path) -> None:
    out = _write_report(tmp_path, "straggler", None)
    context, page, errors, blocked = _offline_page(browser, out)
    try:
        # the tooltip shows rank 2's own creation time, against the group's median
        page.evaluate("() => window.frscope.setGroup('0')")
        box = page.evaluate("() => window.frscope.cellBox(2, 10)")
        canvas = page.query_selector("#fr-canvas").bounding_box()
        page.mouse.move(canvas["x"] + box["cx"], canvas["y"] + box["cy"])
        tip = page.inner_text("#fr-tooltip")
        assert "this rank (+1" in tip and "vs the group's median" in tip, tip
        assert "last to arrive: rank 2" in tip, tip
        info = page.evaluate("() => window.frscope.cellAt(2, 10)")
        assert info["own_created_ms"] - info["created_ms"] > 100 and info["last_rank"] == 2
        # the list: one line per collective; sorted by the last rank's cost, rank 2's collectives first
        listed = page.evaluate("() => window.frscope.list()")
        assert listed["count"] == 20 and listed["seqs"][:3] == [1, 2, 3]
        assert listed["domRows"] <= 40
        page.select_option("#fr-list-sort", "wait")
        row = page.inner_text("#fr-list-rows .fr-list-row:first-child")
        assert "all_reduce" in row and "2 (+1" in row, row
        # jump to a rank: its own column appears in the list, its cell is pinned
        page.fill("#fr-jump", "rank 2")
        page.press("#fr-jump", "Enter")
        assert page.evaluate("() => window.frscope.list().focusRank") == 2
        assert "rank 2 (own)" in page.inner_text("#fr-list-head")
        assert "rank: 2" in page.inner_text("#fr-details").replace("\t", ": ")
        # jump to a sequence id: the list scrolls to it and it is selected; clicking a line jumps too
        page.fill("#fr-jump", "#17")
        page.press("#fr-jump", "Enter")
        assert page.get_attribute("#fr-list-rows .fr-list-row.selected", "data-seq") == "17"
        assert "#17" in page.inner_text("#fr-details")
        other = page.get_attribute("#fr-list-rows .fr-list-row:not(.selected)", "data-seq")
        page.click(f"#fr-list-rows .fr-list-row[data-seq='{other}']")
        assert page.evaluate("() => window.frscope.list().selectedSeq") == int(other)
        page.screenshot(path=str(artifacts / "timeline-list-straggler.png"), full_page=True)
        # the time axis, zoomed in: each rank's own creation is drawn over the cells; rank 2's stands apart
        assert state(page)["ownMarks"] == 0  # sequence axis: nothing to place
        page.check("#fr-mode-time")
        page.evaluate("() => window.frscope.jump('#10')")
        timed = state(page)
        assert timed["mode"] == "time" and timed["ownMarks"] >= 4, timed
        page.screenshot(path=str(artifacts / "timeline-own-times.png"), full_page=True)
        page.fill("#fr-jump", "#999")
        page.press("#fr-jump", "Enter")
        assert "no collective #999" in page.inner_text("#fr-jump-msg")
        assert errors.items == [] and blocked == []
    finally:
        context.close()


def test_state_filter_on_a_hang(browser: Any, tmp_path: Path) -> None:
    out = _write_report(tmp_path, "hang", AnalysisOptions(stall_after_s=1.0))
    context, page, errors, _ = _offline_page(browser, out)
    try:
        before = state(page)
        for name in ("completed", "scheduled", "started", "not_recorded", "no_dump"):
            page.uncheck(f"#fr-state-filter input[data-state={name}]")
        s = state(page)
        assert s["states"] == ["in_flight", "not_entered"]
        assert s["drawnCells"] == 3 < before["drawnCells"]  # ranks 0, 2, 3 in all_reduce #4
        assert s["highlightedRanks"] == [1]  # the culprit stays outlined
        listed = page.evaluate("() => window.frscope.list()")
        assert listed["seqs"] == [4]
        page.evaluate("() => window.frscope.setStates(null)")
        assert state(page)["drawnCells"] == before["drawnCells"]
        assert errors.items == []
    finally:
        context.close()


def _many_groups(count: int) -> DumpSet:
    """`count` two-rank groups (as a 3-D parallel job at scale has thousands), one all_reduce each."""
    groups: dict[str, GroupInfo] = {}
    entries: dict[int, list[Entry]] = {0: [], 1: []}
    for i in range(count):
        name = str(i)
        groups[name] = GroupInfo(name, f"mesh_tp_{i}", (0, 1), "")
        for rank in (0, 1):
            created = 1_700_000_000_000_000_000 + i * 1_000_000 + rank * 1000
            entries[rank].append(Entry(i, name, f"mesh_tp_{i}", 1, 0, False, "all_reduce", "nccl:all_reduce", None,
                                       [[4]], ["Float"], [[4]], ["Float"], "completed", None, created, created,
                                       created + 50_000, 0.05, 600_000, "1", "python", None))
    dumps = {r: RankDump(r, f"rank-{r}", "2.10", "nccl", e, captured_at_ns=1_800_000_000_000_000_000)
             for r, e in entries.items()}
    return DumpSet(dumps, groups, 2)


def test_group_search_among_thousands(browser: Any, tmp_path: Path) -> None:
    dumpset = _many_groups(3000)
    out = tmp_path / "groups.html"
    report = analyze(dumpset)
    out.write_text(render_html(report_to_dict(report), build_timeline(dumpset, report)), encoding="utf-8")
    context, page, errors, _ = _offline_page(browser, out)
    try:
        options = page.eval_on_selector_all("#fr-group option", "els => els.length")
        assert options <= 202  # not 3,000 options
        assert "3000 groups" in page.inner_text("#fr-group-count")
        page.fill("#fr-group-search", "mesh_tp_2718")
        assert page.eval_on_selector_all("#fr-group option:not([disabled])", "els => els.length") <= 2
        page.press("#fr-group-search", "Enter")
        s = state(page)
        assert s["group"] == "2718" and s["drawnCells"] == 2
        assert errors.items == []
    finally:
        context.close()


def test_real_fixture_report_has_own_times_in_details(browser: Any, tmp_path: Path) -> None:
    dumpset = load_dumps([REAL / "steps"])
    out = tmp_path / "steps.html"
    out.write_text(render_report_html(analyze(dumpset), dumpset), encoding="utf-8")
    context, page, errors, _ = _offline_page(browser, out)
    try:
        page.evaluate("() => window.frscope.jump('rank 2')")
        page.evaluate("() => window.frscope.jump('#5')")
        details = page.inner_text("#fr-details")
        assert "this rank" in details and "last to arrive" in details, details
        assert errors.items == []
    finally:
        context.close()
