"""`frscope analyze --trace FILE`: Chrome/Perfetto trace JSON, a track per rank and group, a slice per entry."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from frscope import wire
from frscope.cli import main
from tests.unit import builders as b

CAPTURED = b.T0 + 14 * 10**9  # the recorders were read 14 s after the first entry


def _write(tmp_path: Path, rank: int, entries: list[dict[str, Any]], world: int) -> None:
    piece = wire.snapshot_piece(rank, CAPTURED, f"socket:/run/rank-{rank}.sock", None, b.dump(entries, world=world))
    (tmp_path / f"rank-{rank}.json").write_text(json.dumps(piece))


def _trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = tmp_path / "out" / "trace.json"
    out.parent.mkdir()
    main(["analyze", str(tmp_path), "--trace", str(out), "--no-progress"])
    assert "trace written to" in capsys.readouterr().err
    trace: dict[str, Any] = json.loads(out.read_text())
    return trace


def _slices(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] in ("X", "i")]


def test_one_track_per_rank_and_group_and_the_hang_is_a_long_slice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tp = ("1", "tp")
    for rank in range(3):
        entries = [b.entry(s, duration_ms=0.5) for s in range(1, 4)]
        entries.append(b.entry(1, op="broadcast", pg=tp, record_id=3, duration_ms=1.0,
                               created_ns=b.T0 + 5_000_000))
        if rank != 1:  # rank 1 never joined all_reduce #4: the others wait in it until the capture
            entries.append(b.entry(4, state="started", record_id=4, created_ns=b.T0 + 10_000_000))
        _write(tmp_path, rank, entries, 3)
    trace = _trace(tmp_path, capsys)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"} == {
        0: "rank 0", 1: "rank 1", 2: "rank 2"}
    threads = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(r, name) for r in range(3) for name in ("pg 0 (default_pg)", "pg 1 (tp)")}
    slices = _slices(trace)
    assert len(slices) == 3 * 4 + 2
    done = next(e for e in slices if e["pid"] == 1 and e["name"] == "all_reduce #2")
    assert done["ph"] == "X" and done["dur"] == 500.0 and done["ts"] == 1000.0  # µs after the first entry
    assert done["args"]["seq"] == 2 and done["args"]["op"] == "all_reduce"
    assert done["args"]["input_sizes"] == [[4, 8]] and done["args"]["state"] == "completed"
    waits = [e for e in slices if e["name"] == "all_reduce #4"]
    assert sorted(e["pid"] for e in waits) == [0, 2]
    for wait in waits:  # from its enqueue (10 ms) to the capture (14 s): the wait is on the axis
        assert wait["ph"] == "X" and wait["args"]["in_flight_at_capture"] is True
        assert wait["args"]["state"] == "in flight at capture"
        assert wait["ts"] == 9_000.0 and wait["dur"] == pytest.approx(14e6 - 10_000.0)
    assert trace["otherData"]["t0_ns"] == str(b.T0 + 1_000_000) and trace["displayTimeUnit"] == "ms"


def test_overlapping_ops_get_lanes_so_slices_nest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three async all_reduces still in flight at the capture, and a fourth that completed meanwhile, on
    one group: four lanes; on every thread, slices never partly overlap (trace viewers need slices on
    one thread to nest)."""
    entries = [b.entry(s, state="started", created_ns=b.T0 + s * 1_000_000) for s in range(1, 4)]
    entries.append(b.entry(4, created_ns=b.T0 + 20_000_000, duration_ms=1.0))
    _write(tmp_path, 0, entries, 1)
    trace = _trace(tmp_path, capsys)
    names = sorted(e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name")
    assert names == ["pg 0 (default_pg)"] + [f"pg 0 (default_pg) lane {n}" for n in (2, 3, 4)]
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in _slices(trace):
        by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e.get("dur", 0.0)))
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end


def test_gloo_entries_without_an_end_are_instants_not_made_up_lengths(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries = [b.entry(s, backend="gloo", state="scheduled", retired=True) for s in range(1, 3)]
    _write(tmp_path, 0, entries, 1)
    slices = _slices(_trace(tmp_path, capsys))
    assert [(e["name"], e["ph"], e["s"]) for e in slices] == [("all_reduce #1", "i", "t"), ("all_reduce #2", "i", "t")]


def test_a_real_gloo_hang_shows_the_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Recorders of a real 4-rank gloo job (tests/data/real/hang): rank 1 never joined all_reduce #4;
    the others' all_reduce #4 runs until the capture."""
    real = Path(__file__).parents[2] / "data" / "real" / "hang"
    out = tmp_path / "trace.json"
    assert main(["analyze", str(real), "--trace", str(out), "--no-progress"]) == 1
    slices = _slices(json.loads(out.read_text()))
    waits = {e["pid"]: e for e in slices if e["name"] == "all_reduce #4" and e["args"]["pg"] == "0"}
    assert sorted(waits) == [0, 2, 3]
    assert all(e["ph"] == "X" and e["args"]["in_flight_at_capture"] and e["dur"] > 0 for e in waits.values())
