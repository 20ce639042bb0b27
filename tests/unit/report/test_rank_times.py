"""Each rank's own times in the timeline: real gloo recorders (creation times only) and, for durations,
the NCCL shape of the synthetic job (nobody here has NCCL with timing on)."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from frscope.analysis import analyze
from frscope.records import load_dumps
from frscope.report.rank_times import _runs
from frscope.report.timeline import TimelineOptions, build_timeline
from tests.synthetic import hand_report, synthetic_hang

REAL = Path(__file__).parents[2] / "data" / "real"


def expand(row: list[Any]) -> list[Any]:
    """A row the way the page expands it."""
    out: list[Any] = []
    for v in row:
        if isinstance(v, list):
            out.extend([v[0]] * v[1])
        else:
            out.append(v)
    return out


def _group(tl: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in tl["groups"] if g["name"] == name)


def test_runs_fold_repeats_only() -> None:
    values = [5, 5, 5, 5, None, None, None, 1, 2, 2, 7]
    assert _runs(values) == [[5, 4], [None, 3], 1, 2, 2, 7]
    assert expand(_runs(values)) == values
    assert _runs([]) == []


def test_straggler_is_the_last_to_arrive_and_its_own_times_say_so() -> None:
    dumpset = load_dumps([REAL / "straggler"])
    tl = build_timeline(dumpset, analyze(dumpset))
    g = _group(tl, "0")
    # the all_reduces of the training loop: rank 2 sleeps 150 ms before each
    loop = [c for c, seq in enumerate(g["seqs"]) if seq >= 2]
    assert sum(g["col_last_rank"][c] == 2 for c in loop) >= 0.9 * len(loop)
    waits = [g["col_last_wait_ms"][c] for c in loop if g["col_last_rank"][c] == 2]
    assert 120 < median(waits) < 400, waits
    # gloo records creation times only: no durations, no start times
    assert set(g["col_dur_min_ms"]) == {None} and set(g["col_slowest_rank"]) == {None}
    times = g["rank_times"]
    assert times["queued_us"] is None and times["dur_us"] is None
    assert times["first_col"] == 0  # 4 ranks x 21 collectives: all within the budget
    row = g["ranks"].index(2)
    own = expand(times["created_us"][row])
    assert len(own) == len(g["seqs"])
    # the rank's own creation time, us after the column's median: ~150 ms late, others about on time
    assert median(own[c] for c in loop) > 50_000
    assert abs(median(expand(times["created_us"][g["ranks"].index(0)])[c] for c in loop)) < 50_000


def test_missing_rank_has_no_times() -> None:
    dumpset = load_dumps([REAL / "hang" / f"rank-{r}.json" for r in (0, 2, 3)], world_size=4)
    tl = build_timeline(dumpset, analyze(dumpset))
    g = _group(tl, "0")
    missing = [r for r in g["ranks"] if r not in dumpset.dumps]
    assert missing == [1]
    for rank in missing:
        assert set(expand(g["rank_times"]["created_us"][g["ranks"].index(rank)])) == {None}


def test_nccl_shape_gives_durations_start_and_the_slowest_rank() -> None:
    dumpset = synthetic_hang(16, 50, culprit=3)
    # rank 9's collectives take 4 ms instead of 0.9 ms
    for e in dumpset.dumps[9].entries:
        if e.duration_ms is not None:
            e.duration_ms = 4.0
    tl = build_timeline(dumpset, hand_report(dumpset, 3, 50))
    g = tl["groups"][0]
    done = [c for c, seq in enumerate(g["seqs"]) if seq < 50]
    assert all(g["col_slowest_rank"][c] == 9 for c in done)
    assert all(g["col_dur_max_ms"][c] == 4.0 and g["col_dur_min_ms"][c] == 0.9 for c in done)
    times = g["rank_times"]
    dur9 = expand(times["dur_us"][g["ranks"].index(9)])
    assert dur9[0] == 4000 and dur9[-1] is None  # the last one is still in flight
    assert set(expand(times["queued_us"][0])[:-1]) == {1}  # started 1 us after it was created


def test_budget_keeps_the_most_recent_columns_of_the_primary_group_first() -> None:
    dumpset = synthetic_hang(16, 50, culprit=3)
    tl = build_timeline(dumpset, hand_report(dumpset, 3, 50), TimelineOptions(max_rank_times=16 * 10))
    times = tl["groups"][0]["rank_times"]
    assert times["first_col"] == 40
    assert all(len(expand(row)) == 10 for row in times["created_us"])
    none = build_timeline(dumpset, hand_report(dumpset, 3, 50), TimelineOptions(max_rank_times=0))
    assert none["groups"][0]["rank_times"] is None
    # the spread is kept for every column whatever the budget
    assert len(none["groups"][0]["col_slowest_rank"]) == 50


def test_trace_from_the_timeline_agrees_with_the_trace_from_the_recorders() -> None:
    """The web UI's trace.json (built from the timeline it keeps) places every slice where
    `frscope analyze --trace` (built from the recorders) does, to the microsecond."""
    from frscope.report.trace import build_trace, trace_from_timeline

    for fixture in ("hang", "straggler", "steps-pickle"):
        dumpset = load_dumps([REAL / fixture])
        report = analyze(dumpset)
        from_timeline = trace_from_timeline(build_timeline(dumpset, report))
        from_recorders = build_trace(dumpset)
        want = {(e["pid"], e["name"], e["args"]["pg"]): e for e in from_recorders["traceEvents"] if e["ph"] != "M"}
        got = [e for e in from_timeline["traceEvents"] if e["ph"] != "M"]
        assert len(got) == len(want), fixture
        for e in got:
            ref = want[(e["pid"], e["name"], e["args"]["pg"])]
            assert abs(e["ts"] - ref["ts"]) <= 1.0 and e["ph"] == ref["ph"], (fixture, e, ref)
            if e["ph"] == "X":
                assert abs(e["dur"] - ref["dur"]) <= 1.0
            assert e["args"]["times"] == "this rank"
