"""Each rank's own times in the timeline: per column the spread across ranks, per cell the rank's times.

The grid (frscope.report.timeline) keeps one consensus cell and one median time per collective. This
module adds what a single rank did:

- for every column, the spread of the ranks' own durations (min, max and the slowest rank, where the
  recorder has durations: NCCL with timing, or start and completion times) and of their arrivals
  (the last rank to create the collective, how long after the first, and how long the next-latest
  waited for it: the wait that rank cost the collective);
- for the most recent collectives of every group, within a cell budget, each rank's own creation time
  (as a difference from the column's median, in microseconds), the time from creation to start and
  its duration. Beyond the budget only the spread is kept: 1,024 ranks x 2,000 collectives would be
  two million numbers per field.

Pure: no I/O; linear in the cells it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frscope.analysis.tracks import SEVERAL, Track
from frscope.report.timeline_cells import bucket_duration


@dataclass(frozen=True, slots=True)
class ColumnSpread:
    dur_min_ms: float | None
    dur_max_ms: float | None
    slowest_rank: int | None  # the rank with the longest duration
    last_rank: int | None  # the last rank to create the collective
    spread_ms: float | None  # last creation - first creation
    last_wait_ms: float | None  # last creation - the next-latest one: what the last rank cost


def column_spread(
    created: list[tuple[int, int]], durations: list[float], slowest_row: int, rows: list[int]
) -> ColumnSpread | None:
    """From one column's (row, created ns) pairs and durations (the grid's hot loop collects them)."""
    if not created and not durations:
        return None
    last_rank = spread = wait = None
    if created:
        first_ns = min(ns for _, ns in created)
        last_row, last_ns = max(created, key=lambda x: (x[1], x[0]))
        last_rank = rows[last_row]
        spread = round((last_ns - first_ns) / 1e6, 3)
        if len(created) > 1:
            second = max(ns for row, ns in created if row != last_row)
            wait = round((last_ns - second) / 1e6, 3)
    return ColumnSpread(
        round(min(durations), 3) if durations else None,
        round(max(durations), 3) if durations else None,
        rows[slowest_row] if durations and slowest_row >= 0 else None,
        last_rank,
        spread,
        wait,
    )


def spread_fields(spreads: list[ColumnSpread | None]) -> dict[str, list[Any]]:
    """The per-column arrays of a timeline group (docs/timeline.md)."""
    fields: dict[str, list[Any]] = {
        "col_dur_min_ms": [],
        "col_dur_max_ms": [],
        "col_slowest_rank": [],
        "col_last_rank": [],
        "col_spread_ms": [],
        "col_last_wait_ms": [],
    }
    lists = list(fields.values())
    for s in spreads:
        values = (None,) * 6 if s is None else (
            s.dur_min_ms, s.dur_max_ms, s.slowest_rank, s.last_rank, s.spread_ms, s.last_wait_ms
        )
        for out, value in zip(lists, values, strict=True):
            out.append(value)
    return fields


def _runs(values: list[int | None]) -> list[Any]:
    """A row with repeats folded: `[v, n]` stands for n copies of v (a rank in lockstep, or nothing
    recorded, is a few numbers, not thousands)."""
    out: list[Any] = []
    i, n = 0, len(values)
    while i < n:
        v = values[i]
        j = i + 1
        while j < n and values[j] == v:
            j += 1
        if j - i >= 3:
            out.append([v, j - i])
        else:
            out.extend(values[i:j])
        i = j
    return out


def _rows_window(
    rows: list[int], seqs: list[int], col_t: list[float | None], first: int, group_tracks: dict[int, Track], t0: int
) -> dict[str, Any] | None:
    created: list[list[int | None]] = []
    queued: list[list[int | None]] = []
    durs: list[list[int | None]] = []
    any_created = any_queued = any_dur = False
    window = seqs[first:]
    medians = [None if t is None else t * 1000.0 for t in col_t[first:]]
    for rank in rows:
        track = group_tracks.get(rank)
        c_row: list[int | None] = []
        q_row: list[int | None] = []
        d_row: list[int | None] = []
        # Columnar ranks: each seq's one entry read from the table's columns in place (no `Entry` built)
        positions = track.single_positions(window) if track is not None else None
        table = track.table if track is not None else None
        for k, (seq, mid_us) in enumerate(zip(window, medians, strict=True)):
            p = positions[k] if positions is not None else SEVERAL
            d: float | None
            if p >= 0:
                assert table is not None
                c, s, d = table.created[p], table.started[p], table.duration[p]
                if d != d:  # NaN: not recorded (bucket_duration of one entry)
                    end = table.completed[p]
                    d = (end - s) / 1e6 if s and end and end >= s else None
            else:
                bucket = track.by_seq.get(seq) if track is not None and p == SEVERAL else None
                if not bucket:
                    c_row.append(None)
                    q_row.append(None)
                    d_row.append(None)
                    continue
                c, s, d = bucket[0].time_created_ns or 0, bucket[0].time_started_ns or 0, bucket_duration(bucket)
            if c and mid_us is not None:
                c_row.append(round((c - t0) / 1000.0 - mid_us))
                any_created = True
            else:
                c_row.append(None)
            if c and s and s >= c:
                q_row.append(round((s - c) / 1000.0))
                any_queued = True
            else:
                q_row.append(None)
            if d is not None:
                d_row.append(round(d * 1000.0))
                any_dur = True
            else:
                d_row.append(None)
        created.append(_runs(c_row))
        queued.append(_runs(q_row))
        durs.append(_runs(d_row))
    if not (any_created or any_queued or any_dur):
        return None
    return {
        "first_col": first,
        "created_us": created if any_created else None,
        "queued_us": queued if any_queued else None,
        "dur_us": durs if any_dur else None,
    }


def build_rank_times(
    groups: list[tuple[str, list[int], list[int], list[float | None]]],
    tracks: dict[str, dict[int, Track]],
    t0: int | None,
    budget: int,
    primary_group: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Per group (name, rows, shown seqs, their median creation times in ms since t0): the ranks' own
    times for its most recent collectives, within `budget` cells in all (the primary group first).

    `created_us[row]`, expanded (`[v, n]`: n copies of v), gives per column `first_col + i` the rank's
    creation time minus the column's median (us); `queued_us` its start minus its creation, `dur_us` its
    duration; None: not recorded.
    """
    out: dict[str, dict[str, Any]] = {}
    if t0 is None:
        return out
    ordered = sorted(groups, key=lambda g: g[0] != primary_group)
    left = budget
    for name, rows, seqs, col_t in ordered:
        if not rows or not seqs or left < len(rows):
            continue
        window = min(len(seqs), left // len(rows))
        times = _rows_window(rows, seqs, col_t, len(seqs) - window, tracks.get(name, {}), t0)
        if times is not None:
            out[name] = times
            left -= window * len(rows)
    return out
