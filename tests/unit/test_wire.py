"""frscope.wire: the documents the sidecar writes are the ones the operator and frscope.records read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from frscope import wire
from frscope.records import normalize_dump
from tests.unit import builders as b


def test_piece_bytes_and_dict_are_the_same_document_and_records_reads_it() -> None:
    trace = b.dump([b.entry(1), b.entry(2)], world=2)
    as_dict = wire.snapshot_piece(1, b.T0, "socket:/run/rank-1.sock", "Thread 0x1 (most recent call first):", trace)
    as_bytes = wire.snapshot_piece_bytes(1, b.T0, "socket:/run/rank-1.sock", "Thread 0x1 (most recent call first):",
                                         json.dumps(trace).encode())
    assert json.loads(as_bytes) == json.loads(json.dumps(as_dict))
    assert set(as_dict) == wire.SNAPSHOT_PIECE_KEYS
    dump = normalize_dump(json.loads(as_bytes), "piece", None)
    assert dump.rank == 1 and dump.captured_at_ns == b.T0 and len(dump.entries) == 2 and dump.stacks


def test_envelope_round_trip_keeps_pieces_and_errors() -> None:
    head = wire.snapshot_head(pod="w-0", namespace="ml", node="n1", captured_at_ns=5, reason="stall")
    piece = wire.snapshot_piece_bytes(0, 5, "file:/d/rank_0", None, b'{"entries": []}')
    body = wire.snapshot_envelope_bytes(head, [piece], [{"rank": 1, "message": "socket gone"}])
    snap = wire.parse_snapshot(json.loads(body), size_bytes=len(body))
    assert (snap.pod, snap.namespace, snap.reason, snap.captured_at_ns) == ("w-0", "ml", "stall", 5)
    assert snap.ranks[0]["rank"] == 0 and snap.errors == [(1, "socket gone")] and snap.size_bytes == len(body)


@pytest.mark.parametrize("obj", [{"schema": "frscope.sidecar.status/v1", "ranks": []}, [], {"ranks": []}])
def test_a_document_that_is_not_an_envelope_is_refused_by_name(obj: object) -> None:
    with pytest.raises(wire.WireError, match="not a frscope.sidecar.snapshot/v1 object"):
        wire.parse_snapshot(obj)


def test_status_document_parses_into_stalls_and_ranks() -> None:
    group: wire.GroupStatusDoc = {
        "desc": "default_pg", "last_enqueued_seq": 9, "last_completed_seq": 8, "inflight_op": "all_reduce",
        "inflight_seq": 9, "inflight_age_s": 74.2, "stalled": True, "stalled_since_ns": 1,
        "no_progress_s": 74.2, "stall_threshold_s": 60.0,
    }
    doc: wire.StatusDoc = {
        "schema": wire.STATUS_SCHEMA, "pod": "w-0", "namespace": "ml", "node": "n1", "captured_at_ns": 2,
        "stalled": True,
        "ranks": {
            "3": {"up": True, "error": None, "last_poll_ns": 2, "last_ok_ns": 2, "recorder_ns": 2,
                  "progress_probe": None, "groups": {"0": group}},
            "4": {"up": False, "error": "connect refused", "last_poll_ns": 2, "last_ok_ns": None,
                  "recorder_ns": None, "progress_probe": None, "groups": {}},
        },
        "dump_dir": {"path": None, "exists": None, "files": []},
        "evidence": {"dir": None, "captures_in_memory": 0, "files_on_disk": 0, "latest_capture_ns": None,
                     "last_error": None},
    }
    status = wire.parse_status(json.loads(json.dumps(doc)))
    assert status.stalled and (status.ranks_up, status.ranks_down) == (1, 1)
    assert status.stalls == (wire.GroupStall(3, "0", "default_pg", "all_reduce", 9, 74.2),)
    assert status.ranks == (wire.RankUp(3, True), wire.RankUp(4, False, "connect refused"))
    with pytest.raises(wire.WireError, match="not a frscope.sidecar.status/v1 object"):
        wire.parse_status({"schema": wire.SNAPSHOT_SCHEMA})

    # A suspected group (not yet a stall) is a suspect, not a stall; a confirmed one stays a stall only.
    suspected = {**group, "stalled": False, "stalled_since_ns": None, "suspected": True, "inflight_age_s": 5.0}
    confirmed = {**group, "suspected": True}
    doc["ranks"]["3"]["groups"] = {"0": suspected, "1": confirmed}  # type: ignore[dict-item]
    status = wire.parse_status(json.loads(json.dumps(doc)))
    assert status.suspects == (wire.GroupStall(3, "0", "default_pg", "all_reduce", 9, 5.0),)
    assert status.stalls == (wire.GroupStall(3, "1", "default_pg", "all_reduce", 9, 74.2),)
    doc["ranks"]["3"]["groups"] = {"0": suspected}  # type: ignore[dict-item]
    doc["stalled"] = False
    status = wire.parse_status(json.loads(json.dumps(doc)))
    assert not status.stalled and status.stalls == () and len(status.suspects) == 1

    # A hang the recorder cannot see: no group in flight, the rank's stack waits in an unrecorded call.
    unrecorded: wire.UnrecordedWaitDoc = {
        "op": "monitored_barrier", "site": "train.py:166 (main)", "no_progress_s": 8.0, "suspected_since_ns": 3,
        "stalled": False, "stalled_since_ns": None, "usual_step_s": 0.2, "suspect_threshold_s": 4.0}
    doc["ranks"]["3"]["groups"] = {}
    doc["ranks"]["3"]["unrecorded_wait"] = unrecorded
    status = wire.parse_status(json.loads(json.dumps(doc)))
    assert status.suspects == (wire.GroupStall(3, "", "", "monitored_barrier", None, 8.0, unrecorded=True),)
    assert status.suspects[0].where() == "monitored_barrier (not recorded: seen in its stack)"
    doc["ranks"]["3"]["unrecorded_wait"] = {**unrecorded, "stalled": True}
    doc["stalled"] = True
    status = wire.parse_status(json.loads(json.dumps(doc)))
    assert status.stalled and [s.op for s in status.stalls] == ["monitored_barrier"] and not status.suspects
    doc["ranks"]["3"]["unrecorded_wait"] = {"op": 7}  # type: ignore[typeddict-item]  # hostile: no wait
    assert wire.parse_status(json.loads(json.dumps(doc))).stalls == ()


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", "", " ", "1000001", "99999999999", "²", "+5", "1e3"])
def test_snapshot_window_out_of_bounds_is_refused(text: str) -> None:
    with pytest.raises(wire.WireError, match="from 1 to 1,000,000"):
        wire.parse_window(text)


def test_snapshot_window_bounds() -> None:
    assert wire.parse_window(None) is None
    assert wire.parse_window("1") == 1 and wire.parse_window("1000000") == 1_000_000
    assert wire.parse_window("200") == 200
    # A reader never asks what a sidecar refuses: 0 or None is the whole ring, more is clamped.
    assert wire.window_query(None) is None and wire.window_query(0) is None
    assert wire.window_query(200) == "200" and wire.window_query(5_000_000) == "1000000"


def test_window_piece_cuts_the_oldest_and_counts_them() -> None:
    trace = b.dump([b.entry(i) for i in range(1, 11)], world=2)
    piece = wire.snapshot_piece(0, b.T0, "socket:/r", None, trace)
    assert not wire.window_piece(piece, 10) and wire.ENTRIES_DROPPED_KEY not in piece
    assert wire.window_piece(piece, 4)
    assert [e["collective_seq_id"] for e in piece["trace"]["entries"]] == [7, 8, 9, 10]
    assert wire.entries_dropped(piece) == 6
    # Cut again (the operator after a sidecar): the counts add up.
    assert wire.window_piece(piece, 1) and wire.entries_dropped(piece) == 9
    bare = b.dump([b.entry(i) for i in range(1, 4)], world=2)
    assert wire.window_piece(bare, 2) and len(bare["entries"]) == 2 and wire.entries_dropped(bare) == 1
    assert wire.entries_dropped({"entries_dropped": -3}) == 0 and wire.entries_dropped({"entries_dropped": True}) == 0


# -- hostile status answers (issue 26): a WireError, never another exception ----------------------------
def _status_doc(**rank_fields: Any) -> dict[str, Any]:
    group = {"stalled": True, "desc": "default_pg", "inflight_op": "all_reduce", "inflight_seq": 7,
             "inflight_age_s": 30.0}
    return {"schema": wire.STATUS_SCHEMA, "pod": "p", "namespace": "ns",
            "ranks": {"0": {"up": True, "groups": {"0": {**group, **rank_fields}}}}}


def test_a_hostile_status_answer_is_a_wire_error_or_read_safely() -> None:
    huge = int("9" * 400)
    got = wire.loads_status(json.dumps(_status_doc(inflight_age_s=huge, inflight_seq=huge)).encode())
    assert got.stalls[0].age_s is None and got.stalls[0].seq is None  # a 400-digit number is no number
    deep = b'{"schema": "frscope.sidecar.status/v1", "ranks": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    for raw in (deep, b"x" * (wire.STATUS_MAX_BYTES + 1), b'{"a": 1e999999}', b"\xff"):
        with pytest.raises(wire.WireError):
            wire.loads_status(raw)
    odd = _status_doc(desc=["x"] * 10, inflight_op={"a": 1})
    odd["ranks"]["99999999999999999999"] = {"up": True}
    odd["pod"] = {"nested": "object"}
    got = wire.loads_status(json.dumps(odd).encode())
    assert [r.rank for r in got.ranks] == [0] and got.stalls[0].desc == "?" and got.pod == "?"


def test_status_arrivals_are_read_per_rank_and_group_bounded_and_checked() -> None:
    many = [[seq, 1_000 + seq] for seq in range(1, 401)]
    doc = _status_doc(stalled=False, arrivals=many)
    odd = [[1, 5], "x", [2], [3, -1], [True, 7], [4, 9], [5, 11, 250], [6, 12, -3], [7, 13, "x"], [8, 1, 2, 3]]
    doc["ranks"]["0"]["groups"]["1"] = {"stalled": False, "arrivals": odd}
    doc["ranks"]["0"]["groups"]["2"] = {"stalled": False, "arrivals": {"not": "a list"}}
    got = wire.loads_status(json.dumps(doc).encode())
    assert sorted(got.arrivals) == [0] and sorted(got.arrivals[0]) == ["0", "1"]
    assert len(got.arrivals[0]["0"]) == wire.STATUS_ARRIVALS and got.arrivals[0]["0"][-1] == (400, 1_400)
    # malformed ones skipped, the good ones kept; a wait that is not one is no wait
    assert got.arrivals[0]["1"] == ((1, 5), (4, 9), (5, 11, 250), (6, 12), (7, 13))
    assert got.stalls == ()


def test_a_status_documents_arrivals_stay_well_inside_the_size_bound_whatever_the_layout() -> None:
    assert wire.status_arrivals_each(8) == wire.STATUS_ARRIVALS  # 8 ranks, one group each
    assert wire.status_arrivals_each(8 * 100) == 7 and wire.status_arrivals_each(100_000) == 0
    for lists in (1, 8, 64, 129, 1000, 9000):
        each = wire.status_arrivals_each(lists)
        biggest = json.dumps([[[(1 << 40) + i, (1 << 62) + i, (1 << 62) + i] for i in range(each)]
                              for _ in range(lists)])
        assert each * lists <= wire.STATUS_ARRIVALS_TOTAL and len(biggest) < wire.STATUS_MAX_BYTES // 2
