"""A rank's own collective times (frscope.wire.timings, the bootstrap's frscope_timings) carried in a
snapshot piece and put on the recorder's entries by frscope.records: what gloo's recorder does not date."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frscope import wire
from frscope.records import normalize_dump
from frscope.records.timings import apply_timings
from tests.unit import builders as b

MS = 1_000_000


def doc(rows: list[list[Any]], **extra: Any) -> dict[str, Any]:
    return {"frscope_timings": 1, "mechanism": "pg_hooks", "capacity": 2000, "aborted_at_ns": 0, "rows": rows} | extra


def row(seq: int, start_ms: float, end_ms: float | None, group: str = "0", op: str = "all_reduce") -> list[Any]:
    return [group, seq, seq - 1, op, b.T0 + int(start_ms * MS), 0 if end_ms is None else b.T0 + int(end_ms * MS)]


def gloo(seq: int, **kw: Any) -> dict[str, Any]:
    """A gloo entry as torch writes it: state scheduled, retired once done, no times but its creation."""
    kw.setdefault("created_ns", b.T0)  # created before the rows' starts below
    return b.entry(seq, backend="gloo", state="scheduled", retired=kw.pop("retired", True), **kw)


def piece(entries: list[dict[str, Any]], timings: dict[str, Any] | None, rank: int = 0) -> dict[str, Any]:
    trace = json.dumps(b.dump(entries, world=2)).encode()
    raw = wire.snapshot_piece_bytes(rank, b.T0 + 10_000 * MS, "socket:/run/rank-0.sock", None, trace,
                                    json.dumps(timings).encode() if timings is not None else None)
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


def test_gloo_entries_get_the_ranks_own_start_end_and_duration() -> None:
    dump = normalize_dump(piece([gloo(1), gloo(2)], doc([row(1, 1.0, 4.5), row(2, 5.0, 5.25)])), "piece", None)
    first, second = dump.entries
    assert first.time_started_ns == b.T0 + 1 * MS and first.time_completed_ns == b.T0 + int(4.5 * MS)
    assert first.duration_ms == pytest.approx(3.5) and second.duration_ms == pytest.approx(0.25)
    assert first.state == "scheduled" and first.completed  # the recorder's word on completion is kept
    assert dump.warnings == []


def test_a_running_collective_gets_its_start_and_never_a_completion() -> None:
    # the rank dated an end (its future fired) but the recorder read a moment before has not retired it:
    # the entry stays open; and a row without an end dates only the start
    dump = normalize_dump(piece([gloo(1, retired=False), gloo(2, retired=False)],
                                doc([row(1, 1.0, 2.0), row(2, 3.0, None)])), "piece", None)
    for e in dump.entries:
        assert e.time_started_ns is not None and e.time_completed_ns is None and e.duration_ms is None
        assert not e.completed


def test_what_the_recorder_dated_itself_is_never_replaced() -> None:
    nccl = b.entry(1, duration_ms=7.0)
    nccl["time_discovered_started_ns"] = b.T0 + 2 * MS
    nccl["time_discovered_completed_ns"] = b.T0 + 9 * MS
    dump = normalize_dump(piece([nccl], doc([row(1, 1.0, 50.0)])), "piece", None)
    [e] = dump.entries
    assert (e.time_started_ns, e.time_completed_ns, e.duration_ms) == (b.T0 + 2 * MS, b.T0 + 9 * MS, 7.0)


def test_rows_find_their_entries_by_group_and_seq_only() -> None:
    entries = [gloo(1), gloo(1, pg=("1", "tp")), b.entry(3, op="send", backend="gloo", peer="1", state="scheduled",
                                                        retired=True)]
    rows = [row(1, 10.0, 12.0, group="1"), row(0, 1.0, 2.0), row(9, 1.0, 2.0)]  # a p2p entry has seq 0
    dump = normalize_dump(piece(entries, doc(rows)), "piece", None)
    default, tp, p2p = dump.entries
    assert default.duration_ms is None and default.time_started_ns is None  # no row of group 0 seq 1
    assert tp.duration_ms == pytest.approx(2.0)
    assert p2p.duration_ms is None and p2p.time_started_ns is None


@pytest.mark.parametrize("bad", [
    ["0", 1, 0, "all_reduce", b.T0, b.T0 - 1],  # ends before it starts
    ["0", -1, 0, "all_reduce", b.T0, b.T0],  # no seq
    ["0", 1, 0, "all_reduce", 12, 13],  # no wall clock
    ["", 1, 0, "all_reduce", b.T0, b.T0],  # no group
    ["0", True, 0, "all_reduce", b.T0, b.T0],  # a bool is no seq
    ["0", 1, 0, "all_reduce", b.T0],  # short
    {"group": "0"},  # not a row
    ["0", 1, 0, "all_reduce", b.T0, float("nan")],
])
def test_a_malformed_row_is_left_out_and_counted_and_the_others_kept(bad: Any) -> None:
    timings = wire.parse_timings(doc([bad, row(2, 1.0, 2.0)]))
    assert timings.rejected == 1 and [r.seq for r in timings.rows] == [2]
    dump = normalize_dump(piece([gloo(1), gloo(2)], doc([bad, row(2, 1.0, 2.0)])), "piece", None)
    assert dump.entries[1].duration_ms == pytest.approx(1.0)
    assert dump.warnings == ["timings: 1 malformed row(s) left out"]


@pytest.mark.parametrize("timings", [[], {"frscope_timings": 2, "rows": []}, {"frscope_timings": 1, "rows": {}},
                                     "rows", {"rows": []}])
def test_a_document_that_is_no_timings_is_a_warning_and_the_recorder_reads_as_ever(timings: Any) -> None:
    dump = normalize_dump(piece([gloo(1)], timings), "piece", None)
    assert dump.entries[0].duration_ms is None and len(dump.warnings) == 1
    assert "timings" in dump.warnings[0] and "not dated by the rank" in dump.warnings[0]


def test_an_oversized_or_undecodable_answer_is_refused_by_name() -> None:
    with pytest.raises(wire.WireError, match="bytes, more than"):
        wire.loads_timings(b" " * (wire.TIMINGS_MAX_BYTES + 1))
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.loads_timings(b"\xff{")
    with pytest.raises(wire.WireError, match="not a frscope_timings 1 object"):
        wire.loads_timings(b"[1, 2]")


def test_at_most_max_rows_are_read() -> None:
    many = [row(1 + i % 50, 1.0, 2.0) for i in range(wire.timings.TIMINGS_MAX_ROWS + 5)]
    got = wire.parse_timings(doc(many))
    assert len(got.rows) == wire.timings.TIMINGS_MAX_ROWS and got.rejected == 5


def test_the_snapshot_window_cuts_the_timings_with_the_entries() -> None:
    decoded = piece([gloo(seq) for seq in range(1, 11)], doc([row(seq, seq, seq + 0.5) for seq in range(1, 11)]))
    assert wire.window_piece(decoded, 3)
    assert [e["collective_seq_id"] for e in decoded["trace"]["entries"]] == [8, 9, 10]
    assert [r[1] for r in decoded["timings"]["rows"]] == [8, 9, 10]
    dump = normalize_dump(decoded, "piece", None)
    assert [e.duration_ms for e in dump.entries] == [pytest.approx(0.5)] * 3


def test_the_document_round_trips_through_what_the_sidecar_writes() -> None:
    parsed = wire.parse_timings(doc([row(1, 1.0, 2.0), row(2, 3.0, None)], aborted_at_ns=b.T0 + 5))
    again = wire.parse_timings(wire.timings_document(parsed))
    assert again.rows == parsed.rows and again.aborted_at_ns == b.T0 + 5 and again.mechanism == "pg_hooks"
    assert [r.duration_ms for r in again.rows] == [pytest.approx(1.0), None]
    assert wire.timings_document(parsed, last=1)["rows"] == [["0", 2, 1, "all_reduce", b.T0 + 3 * MS, 0]]


def test_apply_on_a_trace_without_entries_is_harmless() -> None:
    trace: dict[str, Any] = {"version": "2.10"}
    assert apply_timings(trace, doc([row(1, 1.0, 2.0)])) is None and trace == {"version": "2.10"}


def test_the_ranks_start_never_precedes_the_entrys_creation() -> None:
    # the pre-hook runs a few microseconds before the backend records the entry
    late = gloo(1, created_ns=b.T0 + 2 * MS)
    dump = normalize_dump(piece([late], doc([row(1, 1.9, 5.0)])), "piece", None)
    [e] = dump.entries
    assert e.time_started_ns == b.T0 + 2 * MS and e.duration_ms == pytest.approx(3.0)
    assert e.time_started_ns + int(e.duration_ms * MS) == e.time_completed_ns
