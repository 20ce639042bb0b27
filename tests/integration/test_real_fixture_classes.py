"""Issue 13's fault classes on real gloo recorders (tests/data/real, made by scripts/make_fixtures.py):
stragglers late only at step boundaries, cross-group skips, stale dumps, crashes, p2p chains. Each
class is checked on more than one world size / group layout and on both input forms where torch
gives both. No torch runs here: the fixtures are the recorded truth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frscope.analysis import AnalysisOptions, Category, Finding, Report, analyze
from frscope.records import RankExit, exits_from_json, load_dumps
from frscope.report import report_to_dict

REAL = Path(__file__).parent.parent / "data" / "real"
SOON = AnalysisOptions(stall_after_s=1.0)


def _report(name: str, exits: dict[int, RankExit] | None = None) -> Report:
    directory = REAL / name
    if not directory.is_dir():
        pytest.fail(f"fixture {directory} missing: run scripts/make_fixtures.py")
    dumpset = load_dumps([directory])
    assert not [p for p in dumpset.problems if p.kind == "error"], dumpset.problems
    return analyze(dumpset, SOON, exits=exits)


def _all(findings: list[Finding]) -> list[Finding]:
    return [g for f in findings for g in (f, *_all(f.consequences))]


@pytest.mark.parametrize("name", ["steps", "steps-pickle", "steps-6", "steps-6-pickle"])
def test_straggler_late_only_at_step_boundaries(name: str) -> None:
    [finding] = _report(name).findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (2,)
    # 8 steps of 4 all_reduces on default_pg: the first of step k is seq 4k + 1, and only there.
    assert [a.collective_seq_id for a in finding.late_at] == [1, 5, 9, 13, 17, 21, 25, 29]
    assert finding.late_count == 8
    assert finding.late_by_ms is not None and 300 < finding.late_by_ms < 600  # the loader's 0.4 s
    assert all(300 < a.waited_ms < 600 for a in finding.late_at)
    assert "every 4 collectives" in finding.summary
    as_json = report_to_dict(_report(name))["findings"][0]
    assert as_json["late_count"] == 8 and as_json["late_at"][0]["collective_seq_id"] == 1


@pytest.mark.parametrize("name", ["jitter", "jitter-pickle", "none", "none-pickle"])
def test_uneven_but_unbiased_jitter_is_healthy(name: str) -> None:
    assert _report(name).findings == []


@pytest.mark.parametrize(
    ("name", "victims"),
    [("crossgroup", (0,)), ("crossgroup-pickle", (0,)), ("crossgroup-6", (0, 2)), ("crossgroup-6-pickle", (0, 2))],
)
def test_cross_group_skip_names_the_rank_that_broke_its_order(name: str, victims: tuple[int, ...]) -> None:
    [finding] = _report(name).findings
    assert finding.category is Category.RANK_NOT_JOINED and finding.culprit_ranks == (1,)
    assert finding.process_group.desc == "param_sync" and finding.collective_seq_id == 5
    # Its peers' order (where enough ranks share its groups' kinds) or else its own loop decides.
    assert finding.evidence[0].startswith(("rank 1 broke the order its peers kept", "rank 1 broke its own order"))
    assert "skipping #5 of group 1 (param_sync)" in finding.evidence[0]
    # The victims' finding (the other subgroup members never joined default_pg #4) nests under it.
    [victim] = finding.consequences
    assert victim.process_group.desc == "default_pg" and victim.culprit_ranks == victims


def test_stale_dump_is_a_rank_that_stopped_not_a_collective_that_never_completed() -> None:
    report = _report("stale-pickle")
    [finding] = report.findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (2,)
    assert not [f for f in _all(report.findings) if f.category is Category.NOT_COMPLETED]
    assert finding.stale_by_s is not None and finding.stale_by_s > 0.5  # 3 steps of 0.3 s at least
    assert finding.last_seen_ns is not None
    assert "stale" in finding.summary and "#1 of group 0" in finding.summary


@pytest.mark.parametrize("name", ["crash", "crash-pickle"])
def test_crash_names_the_dead_rank(name: str) -> None:
    [finding] = _report(name).findings
    assert finding.culprit_ranks == (2,)
    # Without exit codes: rank 2 never joined #4 (live snapshots), or left no dump (pickles).
    assert finding.category in (Category.RANK_STOPPED, Category.MISSING_DUMPS, Category.RANK_NOT_JOINED)


@pytest.mark.parametrize("name", ["crash", "crash-pickle"])
def test_crash_with_exit_codes_is_the_root_cause_named_with_its_exit(name: str) -> None:
    raw = json.loads((REAL / "crash-exits.json").read_text())
    exits = {e.rank: e for e in exits_from_json(raw, "crash-exits.json")}
    [finding] = _report(name, exits).findings
    assert finding.category is Category.RANK_STOPPED and finding.culprit_ranks == (2,)
    assert "SIGKILL" in finding.summary
    assert finding.exits[2].exit_code == -9
    as_json = report_to_dict(_report(name, exits))["findings"][0]
    assert as_json["exits"]["2"]["signal"] == "SIGKILL"


@pytest.mark.parametrize(("name", "chain"), [("pipeline", (2, 3)), ("pipeline-6", (2, 3, 4, 5))])
def test_p2p_chain_blames_the_stage_it_waits_on_not_the_chain(name: str, chain: tuple[int, ...]) -> None:
    """The chain of receives ends at the stage in Python: it never joined the exchange (a hang in Python,
    not a mismatch of peers)."""
    [finding] = _report(name).findings
    assert finding.category is Category.RANK_NOT_JOINED and finding.culprit_ranks == (1,)
    assert not finding.ambiguous
    assert "never joined the recv" in finding.summary and "rank 1 is in load_batch" in finding.summary
    assert finding.culprit_stacks[1][0].name == "load_batch"
    assert all(f"rank {r} in recv" in finding.evidence[0] for r in chain)
