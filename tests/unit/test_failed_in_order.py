"""Evidence must agree (issue 33): a group's collectives finish in order, so on gloo, which retires a collective
that failed as if it had finished, a later collective recorded finished while an earlier one is still open
failed, and the group with it, however young the wait. Torch-shaped gloo records."""

from __future__ import annotations

from pathlib import Path

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000


def _job(tmp_path: Path, *, later_retired: bool) -> Path:
    """4 gloo ranks, 3 collectives done; ranks 0-2 then issue an async all_reduce #4 (open) and a broadcast #5
    (retired as finished where `later_retired`); rank 3 recorded neither (its process ended: gloo failed its
    peers' broadcast at once)."""
    per_rank = {r: [b.entry(s, backend="gloo", state="scheduled", retired=True, created_ns=b.T0 + s * 100 * MS)
                    for s in range(1, 4)] for r in range(4)}
    t = b.T0 + 400 * MS
    for r in range(3):
        per_rank[r].append(b.entry(4, backend="gloo", state="scheduled", retired=False, created_ns=t))
        per_rank[r].append(b.entry(5, op="broadcast", backend="gloo", state="scheduled", retired=later_retired,
                                   created_ns=t + 20_000))
    return b.job(tmp_path, per_rank, 4)


def test_a_later_collective_retired_before_an_open_one_failed_however_young(tmp_path: Path) -> None:
    """Read 5 ms after the others entered #4: too young for an age to call it stuck, but #5 cannot have finished
    before #4 without rank 3, which entered neither: it failed (a peer lost), and rank 3 is the one missing.
    Before, no finding (a crash read as nothing)."""
    report = analyze(load_dumps([_job(tmp_path, later_retired=True)]), AnalysisOptions(now_ns=b.T0 + 405 * MS))
    assert report.findings, "a failed group read as healthy"
    first = report.findings[0]
    assert first.category is Category.RANK_NOT_JOINED and first.culprit_ranks == (3,), first.summary


def test_open_collectives_in_order_that_young_are_no_hang(tmp_path: Path) -> None:
    """The same reads with #5 open too: a job 5 ms into its collectives, nothing disagrees."""
    report = analyze(load_dumps([_job(tmp_path, later_retired=False)]), AnalysisOptions(now_ns=b.T0 + 405 * MS))
    assert not report.findings, report.findings[0].summary

