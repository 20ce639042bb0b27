"""The analyzer on recorders of real gloo jobs (tests/data/real, made by scripts/make_fixtures.py).

The snapshots were taken about two seconds after the job stopped moving (the demo's settle time),
so hang-type verdicts are asked for with stall_after_s=1, as `frscope demo` does; a dump written by
torch on timeout, or by the sidecar at a stall, is older than the default threshold anyway.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from frscope.analysis import AnalysisOptions, Category, Report, analyze
from frscope.records import load_dumps

REAL = Path(__file__).parent.parent / "data" / "real"
SOON = AnalysisOptions(stall_after_s=1.0)


def _report(name: str, options: AnalysisOptions | None = None) -> Report:
    directory = REAL / name
    if not directory.is_dir():
        pytest.fail(f"fixture {directory} missing: run scripts/make_fixtures.py")
    dumpset = load_dumps([directory])
    assert not [p for p in dumpset.problems if p.kind == "error"], dumpset.problems
    return analyze(dumpset, options)


@pytest.mark.parametrize("name", ["none", "none-pickle"])
def test_healthy_job_has_no_finding(name: str) -> None:
    report = _report(name, SOON)
    assert report.findings == []
    assert report.ranks_loaded == (0, 1, 2, 3)
    # gloo's pg_config bug: default group keyed '' with wrong ranks, reconstructed from the entries.
    assert report.groups[0].group.ranks == (0, 1, 2, 3)


@pytest.mark.parametrize(
    ("name", "category", "seq", "options"),
    [
        ("hang", Category.RANK_NOT_JOINED, 4, SOON),
        ("hang-pickle", Category.RANK_NOT_JOINED, 4, SOON),
        ("skip", Category.RANK_NOT_JOINED, 6, SOON),
        ("skip-pickle", Category.RANK_NOT_JOINED, 6, SOON),
        ("type", Category.COLLECTIVE_TYPE_MISMATCH, 4, None),
        ("type-pickle", Category.COLLECTIVE_TYPE_MISMATCH, 4, None),
        ("size", Category.SIZE_MISMATCH, 4, None),
        ("size-pickle", Category.SIZE_MISMATCH, 4, None),
        ("dtype", Category.DTYPE_MISMATCH, 4, None),
        ("dtype-pickle", Category.DTYPE_MISMATCH, 4, None),
    ],
)
def test_culprit_and_category(name: str, category: Category, seq: int, options: AnalysisOptions | None) -> None:
    [finding] = _report(name, options).findings
    assert finding.category is category
    assert finding.culprit_ranks == (1,)
    assert finding.process_group.name == "0" and finding.process_group.desc == "default_pg"
    assert finding.collective_seq_id == seq


def test_hang_names_what_the_stuck_rank_is_doing() -> None:
    [finding] = _report("hang", SOON).findings
    assert "load_batch" in finding.summary
    assert finding.culprit_stacks[1][0].name == "load_batch"
    assert finding.stalled_for_s is not None and finding.stalled_for_s > 1


def test_pickle_dump_carries_the_call_site_at_enqueue() -> None:
    [finding] = _report("type-pickle").findings
    frames = finding.culprit_frames[1]
    assert frames[0].name == "broadcast" and any(f.name == "train_step" for f in frames)


def test_gloo_p2p_deadlock_is_found_from_the_stacks() -> None:
    [finding] = _report("p2p", SOON).findings
    assert finding.category is Category.P2P_MISMATCH and finding.culprit_ranks == (0, 1)
    assert "recv" in finding.summary
    # Ranks 2-3 wait in all_reduce #4 that 0 and 1 never joined: a consequence, not a second cause.
    [consequence] = finding.consequences
    assert consequence.category is Category.RANK_NOT_JOINED and consequence.culprit_ranks == (0, 1)


def test_straggler() -> None:
    [finding] = _report("straggler").findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (2,)
    assert finding.late_by_ms is not None and 100 < finding.late_by_ms < 250
