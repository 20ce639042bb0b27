"""Timeline data from real recorders (tests/data/real) and, for size only, a synthetic job at scale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from frscope.analysis import AnalysisOptions, analyze
from frscope.records import load_dumps
from frscope.report.timeline import STATES, TimelineOptions, build_timeline
from tests.synthetic import big_job, hand_report, synthetic_hang

REAL = Path(__file__).parents[2] / "data" / "real"
SOON = AnalysisOptions(stall_after_s=1.0)


def _timeline(name: str, options: AnalysisOptions | None = SOON, **kw: Any) -> dict[str, Any]:
    dumpset = load_dumps([REAL / name])
    assert dumpset.dumps, f"fixture {name} missing: run scripts/make_fixtures.py"
    return build_timeline(dumpset, analyze(dumpset, options), TimelineOptions(**kw) if kw else None)


def _group(tl: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in tl["groups"] if g["name"] == name)


def _cell(tl: dict[str, Any], group: str, rank: int, seq: int) -> dict[str, Any]:
    """Decode one cell the way the page does: consensus, overridden by the row's runs."""
    g = _group(tl, group)
    row, col = g["ranks"].index(rank), g["seqs"].index(seq)
    cell = g["col_cell"][col]
    runs = g["patterns"][g["row_pattern"][row]]
    for i in range(0, len(runs), 3):
        if runs[i] <= col < runs[i] + runs[i + 1]:
            cell = runs[i + 2]
    fields = dict(zip(tl["cell_fields"], tl["cells"][cell], strict=True))
    strings = tl["strings"]
    return {
        "op": tl["op_names"][fields["op"]] if fields["op"] >= 0 else None,
        "state": STATES[fields["state"]],
        "input_sizes": strings[fields["input_sizes"]],
        "input_dtypes": strings[fields["input_dtypes"]],
        "site": strings[fields["site"]],
    }


def test_hang_marks_culprit_and_stuck_collective() -> None:
    tl = _timeline("hang")
    assert tl["schema"] == "frscope.timeline/v1"
    assert tl["culprit_ranks"] == [1]
    assert tl["primary"]["group"] == "0" and tl["primary"]["seq"] == 4
    assert tl["primary"]["category"] == "RankNotJoined"
    g = _group(tl, "0")
    assert g["ranks"] == [0, 1, 2, 3] and g["seqs"] == [1, 2, 3, 4]
    assert g["finding_cols"] == [3]
    for rank in (0, 2, 3):
        assert _cell(tl, "0", rank, 4)["state"] == "in_flight"
        assert _cell(tl, "0", rank, 4)["op"] == "all_reduce"
    assert _cell(tl, "0", 1, 4)["state"] == "not_entered"
    assert _cell(tl, "0", 1, 3) == _cell(tl, "0", 0, 3)
    assert _cell(tl, "0", 0, 1)["state"] == "completed"
    assert _cell(tl, "0", 0, 1)["input_sizes"] == "[8, 4]"
    assert _cell(tl, "0", 0, 1)["input_dtypes"] == "Float"
    # ranks 0, 2 and 3 agree everywhere: one shared pattern with no difference
    assert g["row_pattern"][0] == g["row_pattern"][2] == g["row_pattern"][3]
    assert g["patterns"][g["row_pattern"][0]] == []
    # gloo records creation times: the time axis is available, in ms since t0
    assert all(t is not None and t >= 0 for t in g["col_t_ms"])
    assert g["col_t_ms"] == sorted(g["col_t_ms"])
    assert set(tl["captured_ms"]) == {"0", "1", "2", "3"}
    json.dumps(tl, allow_nan=False)


def test_pickle_dump_gives_call_sites() -> None:
    tl = _timeline("hang-pickle")
    site = _cell(tl, "0", 0, 4)["site"]
    assert "job.py" in site and "(" in site, site


def test_type_mismatch_shows_the_other_op() -> None:
    tl = _timeline("type", None)
    assert tl["culprit_ranks"] == [1]
    assert _cell(tl, "0", 1, 4)["op"] == "broadcast"
    assert _cell(tl, "0", 0, 4)["op"] == "all_reduce"
    assert {"ALLREDUCE", "BROADCAST"} <= set(tl["op_labels"])


def test_straggler_lags_are_kept_for_the_late_rank() -> None:
    tl = _timeline("straggler", None)
    late = {(g["ranks"][g["lags"][i]], g["lags"][i + 2]) for g in tl["groups"] for i in range(0, len(g["lags"]), 3)}
    assert late, "the straggler (150 ms per all_reduce) left no lag"
    assert {rank for rank, _ in late} == {2}
    assert all(lag > 50 for _, lag in late)


def test_healthy_job_has_no_marks() -> None:
    tl = _timeline("none")
    assert tl["culprit_ranks"] == [] and tl["primary"] is None and tl["marks"] == []
    assert all(g["finding_cols"] == [] for g in tl["groups"])


def test_no_report_still_draws() -> None:
    dumpset = load_dumps([REAL / "hang"])
    tl = build_timeline(dumpset)
    assert tl["culprit_ranks"] == [] and len(tl["groups"]) == 2


def test_missing_rank_rows_say_no_dump() -> None:
    dumpset = load_dumps([REAL / "hang" / f"rank-{r}.json" for r in (0, 2, 3)], world_size=4)
    tl = build_timeline(dumpset, analyze(dumpset, SOON))
    g = _group(tl, "0")
    assert 1 in g["ranks"]
    assert _cell(tl, "0", 1, 2)["state"] == "no_dump"
    assert tl["missing_ranks"] == [1]


def test_hand_report_is_what_the_analysis_says() -> None:
    dumpset = synthetic_hang(16, 50, culprit=5)
    [finding] = analyze(dumpset).findings
    hand = hand_report(dumpset, 5, 50).findings[0]
    assert (finding.category, finding.culprit_ranks, finding.collective_seq_id) == (
        hand.category,
        hand.culprit_ranks,
        hand.collective_seq_id,
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_1024_ranks_x_2000_entries_stays_small() -> None:
    report, tl = big_job()
    size = len(json.dumps(tl, separators=(",", ":")))
    assert size < 1_000_000, size
    g = tl["groups"][0]
    assert len(g["ranks"]) == 1024 and len(g["seqs"]) == 2000 and not g["sampled"]
    assert tl["culprit_ranks"] == [517] and report["findings"][0]["culprit_ranks"] == [517]
    assert len(g["patterns"]) <= 4
    assert g["seqs"][g["finding_cols"][0]] == 2000
    assert "train.py:145" in tl["strings"][tl["cells"][g["col_cell"][0]][6]]


def test_over_budget_samples_columns_but_keeps_findings_and_culprit() -> None:
    # every rank records different sizes from the others: nothing is shared, the budget forces sampling
    dumpset = synthetic_hang(48, 400, culprit=7)
    for rank, dump in dumpset.dumps.items():
        for e in dump.entries:
            e.input_sizes = [[rank + 1, e.collective_seq_id]]
    report = analyze(dumpset)
    tl = build_timeline(dumpset, report, TimelineOptions(max_runs=2000, tail_columns=20))
    g = tl["groups"][0]
    assert g["sampled"] and g["columns_dropped"] > 0
    assert sum(len(p) // 3 for p in g["patterns"]) <= 2000 * 1.2
    kept = set(g["seqs"])
    assert {m["seq"] for m in tl["marks"] if m["seq"] is not None} <= kept
    assert set(range(381, 401)) <= kept  # the tail
    assert 7 in g["ranks"] and tl["culprit_ranks"]


@pytest.mark.parametrize("name", ["hang", "hang-pickle", "crash", "p2p", "pipeline-6", "crossgroup-6", "steps",
                                  "straggler", "jitter", "type", "size", "skip"])
def test_columnar_ranks_draw_what_their_entries_draw(name: str) -> None:
    """The timeline reads a columnar rank's cells, times and durations from its columns in place (no
    `Entry` per cell): the same timeline as from the same ranks' entries, row by row (the reference):
    coalesced ops, p2p, gaps, in-flight and unrecorded cells, several groups."""
    columnar = load_dumps([REAL / name])
    assert columnar.dumps, f"fixture {name} missing: run scripts/make_fixtures.py"
    rows = load_dumps([REAL / name])
    for dump in rows.dumps.values():
        dump.entries = list(dump.entries)
    got = build_timeline(columnar, analyze(columnar, SOON))
    want = build_timeline(rows, analyze(rows, SOON))
    assert json.dumps(got, sort_keys=True, default=str) == json.dumps(want, sort_keys=True, default=str)
