"""DumpSet (+ Report) -> compact, JSON-able timeline data for the HTML report and the web UI.

The grid is, per process group, one row per member rank and one column per collective sequence id.
A cell is what that rank recorded for that collective (op, state, sizes, dtypes, call site), or why
it has nothing there (never entered it, evicted from its ring buffer, no dump at all).

1,024 ranks x 2,000 entries is two million cells, but in a real job nearly every rank records the
same thing for the same collective. So:

- every column has a *consensus* cell (the majority across the group's ranks, found with == only,
  no hashing on the hot path), plus its median creation time and duration;
- a row only lists where it differs from the consensus, run-length encoded
  (`[first_col, length, cell, ...]`); rows with identical differences share one *pattern*;
- per-rank timing is kept only where a rank was late by more than `lag_threshold_ms` against the
  column's median creation time (sparse `lags`), largest first, capped;
- if the differences still exceed `max_runs`, columns are sampled: the columns of every finding and
  the last `tail_columns` are always kept, the rest strided (`sampled`, `columns_dropped`). Rows are
  never dropped, so culprit ranks are always there.

Cells and strings are interned in tables (`cells`, `strings`). Times are milliseconds since `t0_ns`
(a string: ns since the epoch do not fit a JavaScript number). The shape is documented in
docs/timeline.md.
"""

from __future__ import annotations

import heapq
from typing import Any

from frscope.analysis import Report, op_label
from frscope.analysis.tracks import NONE, Track, build_tracks
from frscope.records import COMPLETED, STARTED, DumpSet, Entry
from frscope.records.columns import RETIRED_TRUE, EntryTable
from frscope.report.rank_times import ColumnSpread, build_rank_times, column_spread, spread_fields
from frscope.report.timeline_cells import (
    S_COMPLETED,
    S_IN_FLIGHT,
    S_NO_DUMP,
    S_SCHEDULED,
    S_STARTED,
    STATES,
    TIMELINE_SCHEMA,
    RawKey,
    Tables,
    TimelineOptions,
    absent_state,
    bucket_duration,
    finding_marks,
    median,
    raw_key,
)


def _columns(tracks: dict[int, Track]) -> list[int]:
    seqs: set[int] = set()
    for track in tracks.values():
        seqs.update(track.by_seq)
    return sorted(seqs)


class _GroupGrid:
    """One group's raw grid, computed once; `encode()` can then be called on a column subset."""

    def __init__(
        self,
        rows: list[int],
        seqs: list[int],
        col_cell: list[int],
        exceptions: list[list[tuple[int, int]]],
        col_t: list[float | None],
        col_dur: list[float | None],
        lags: list[tuple[float, int, int]],
        col_spread: list[ColumnSpread | None],
    ) -> None:
        self.rows = rows
        self.seqs = seqs
        self.col_cell = col_cell
        self.exceptions = exceptions  # per row: (col, cell) where the row differs, ascending col
        self.col_t = col_t
        self.col_dur = col_dur
        self.col_spread = col_spread  # per column: the ranks' own durations and arrivals
        self.lags = lags  # (lag_ms, row, col)

    def col_t_for(self, keep: list[int] | None) -> list[float | None]:
        return self.col_t if keep is None else [self.col_t[c] for c in keep]

    def runs_for(self, keep: list[int] | None) -> tuple[list[list[int]], list[int], int]:
        """(patterns, row_pattern, total runs) over the kept columns (indices into self.seqs)."""
        remap: dict[int, int] | None = None
        if keep is not None:
            remap = {c: i for i, c in enumerate(keep)}
        patterns: list[list[int]] = []
        pattern_ids: dict[tuple[int, ...], int] = {}
        row_pattern: list[int] = []
        total = 0
        for excs in self.exceptions:
            flat: list[int] = []
            for col, cell in excs:
                if remap is not None:
                    mapped = remap.get(col)
                    if mapped is None:
                        continue
                    col = mapped
                if flat and flat[-1] == cell and flat[-3] + flat[-2] == col:
                    flat[-2] += 1
                else:
                    flat.extend((col, 1, cell))
            key = tuple(flat)
            pid = pattern_ids.get(key)
            if pid is None:
                pid = pattern_ids[key] = len(patterns)
                patterns.append(flat)
                total += len(flat) // 3
            row_pattern.append(pid)
        return patterns, row_pattern, total


def _grid(
    dumpset: DumpSet,
    tables: Tables,
    rows: list[int],
    tracks: dict[int, Track],
    lag_threshold_ms: float,
    t0: int | None,
) -> _GroupGrid:
    seqs = _columns(tracks)
    has_dump = [r in dumpset.dumps for r in rows]
    row_tracks = [tracks.get(r) for r in rows]
    # Columnar ranks: each seq's one entry read from the table's columns in place (an `Entry` is built only
    # for a cell's first sight: building one per cell was most of a 1,024-rank live window's timeline).
    positions = [track.single_positions(seqs) if track is not None else None for track in row_tracks]
    row_tables: list[EntryTable | None] = [track.table if track is not None else None for track in row_tracks]
    exceptions: list[list[tuple[int, int]]] = [[] for _ in rows]
    col_cell: list[int] = []
    col_t: list[float | None] = []
    col_dur: list[float | None] = []
    col_spread: list[ColumnSpread | None] = []
    lags: list[tuple[float, int, int]] = []
    for col, seq in enumerate(seqs):
        keys: list[RawKey | None] = []
        buckets: list[list[Entry] | None] = []  # None where read from the columns (or no entry: keys' None)
        created: list[tuple[int, int]] = []  # (row, ns)
        durations: list[float] = []
        slowest_row = -1
        slowest_d = -1.0
        candidate: RawKey | None = None
        count = 0
        # Hot loop (every entry of every rank): inlined, and a Boyer-Moore majority vote on the way.
        for i, track in enumerate(row_tracks):
            at = positions[i]
            p = at[col] if at is not None else NONE - 1
            if p >= 0:
                table = row_tables[i]
                assert table is not None and track is not None
                buckets.append(None)
                status = table.states[table.state[p]]
                if status == COMPLETED or table.flags[p] >= RETIRED_TRUE:
                    state = S_COMPLETED
                elif seq == track.next_seq:
                    state = S_IN_FLIGHT
                elif status == STARTED:
                    state = S_STARTED
                else:
                    state = S_SCHEDULED
                key: RawKey = (table.names[table.name[p]][1], state, *table.shapes[table.shape[p]])
                d: float | None = table.duration[p]
                if d != d:  # NaN: not recorded
                    d = None
                    if table.started[p] and table.completed[p]:
                        d = (table.completed[p] - table.started[p]) / 1e6
                ns = table.created[p]
            else:
                bucket = track.by_seq.get(seq) if track is not None and p != NONE else None
                buckets.append(bucket)
                if bucket is None:
                    keys.append(None)
                    continue
                in_flight = seq == track.next_seq  # type: ignore[union-attr]
                e = bucket[0]
                if len(bucket) == 1:
                    if e.state == COMPLETED or e.retired is True:
                        state = S_COMPLETED
                    elif in_flight:
                        state = S_IN_FLIGHT
                    elif e.state == STARTED:
                        state = S_STARTED
                    else:
                        state = S_SCHEDULED
                    key = (e.op, state, e.input_sizes, e.input_dtypes, e.output_sizes, e.output_dtypes)
                    d = e.duration_ms
                    if d is None and e.time_started_ns and e.time_completed_ns:
                        d = (e.time_completed_ns - e.time_started_ns) / 1e6
                else:
                    key = raw_key(bucket, in_flight)
                    d = bucket_duration(bucket)
                ns = e.time_created_ns or 0
            keys.append(key)
            if count == 0:
                candidate, count = key, 1
            elif key == candidate:
                count += 1
            else:
                count -= 1
            if ns:
                created.append((i, ns))
            if d is not None:
                durations.append(d)
                if d > slowest_d:
                    slowest_d, slowest_row = d, i
        consensus = -1
        for i, k in enumerate(keys):
            if k is not None and k == candidate:
                if consensus < 0:
                    consensus = tables.cell(k, _bucket(buckets[i], row_tracks[i], seq), rows[i])
                continue
            if k is None:
                cell = tables.absent(absent_state(row_tracks[i], seq, has_dump[i]))
            else:
                cell = tables.cell(k, _bucket(buckets[i], row_tracks[i], seq), rows[i])
            exceptions[i].append((col, cell))
        col_cell.append(consensus)
        if created and t0 is not None:
            median_ns = median([ns for _, ns in created])
            col_t.append(round((median_ns - t0) / 1e6, 3))
            for row, ns in created:
                lag = (ns - median_ns) / 1e6
                if lag > lag_threshold_ms:
                    lags.append((round(lag, 3), row, col))
        else:
            col_t.append(None)
        col_dur.append(round(median(durations), 3) if durations else None)
        col_spread.append(column_spread(created, durations, slowest_row, rows))
    return _GroupGrid(rows, seqs, col_cell, exceptions, col_t, col_dur, lags, col_spread)


def _bucket(bucket: list[Entry] | None, track: Track | None, seq: int) -> list[Entry]:
    """The entries of a cell that has some (read from the columns in the hot loop: built now, and not kept by a
    columnar rank's buckets: a cell needs them only when it is new, and kept, every rank's entries of every
    cell where it differed from its peers stayed until the timeline was built, ~9 KiB a rank)."""
    if bucket is not None:
        return bucket
    assert track is not None
    return track.peek(seq)


def _choose_columns(grid: _GroupGrid, must: set[int], budget: int, tail: int) -> list[int]:
    n = len(grid.seqs)
    keep = set(must) | set(range(max(0, n - tail), n))
    spare = max(budget - len(keep), 0)
    rest = [c for c in range(n) if c not in keep]
    if rest and spare:
        step = max(1, -(-len(rest) // spare))
        keep.update(rest[::step])
    return sorted(keep)


def build_timeline(
    dumpset: DumpSet, report: Report | None = None, options: TimelineOptions | None = None
) -> dict[str, Any]:
    """The timeline data (see the module docstring and docs/timeline.md). Pure; linear in the entries."""
    opts = options or TimelineOptions()
    tables = Tables()
    tables.absent(S_NO_DUMP)  # cell 0 is always a plain 'no dump' cell
    tracks = build_tracks(dumpset)
    findings = report.findings if report is not None else []
    marks = finding_marks(findings)

    t0: int | None = None
    for dump in dumpset.dumps.values():
        entries = dump.entries
        # (a columnar rank's creation times read in place: 0 is 'not recorded')
        created = (filter(None, entries.created) if isinstance(entries, EntryTable)
                   else (e.time_created_ns for e in entries if e.time_created_ns))
        first = min(created, default=None)
        if first is not None and (t0 is None or first < t0):
            t0 = first

    grids: list[tuple[str, str, _GroupGrid]] = []
    for name, group in dumpset.groups.items():
        group_tracks = tracks.get(name, {})
        rows = sorted(set(group.ranks) | set(group_tracks))
        grids.append((name, group.desc, _grid(dumpset, tables, rows, group_tracks, opts.lag_threshold_ms, t0)))

    # Downsample columns only when the differences do not fit the budget.
    encoded = [g.runs_for(None) for _, _, g in grids]
    total = sum(e[2] for e in encoded)
    keeps: list[list[int] | None] = [None] * len(grids)
    if total > opts.max_runs:
        for gi, (name, _desc, grid) in enumerate(grids):
            patterns, _rp, runs = encoded[gi]
            if runs == 0:
                continue
            share = max(1, int(len(grid.seqs) * opts.max_runs / total))
            must = {grid.seqs.index(m["seq"]) for m in marks if m["group"] == name and m["seq"] in grid.seqs}
            keeps[gi] = _choose_columns(grid, must, share, min(opts.tail_columns, share))
            encoded[gi] = grid.runs_for(keeps[gi])

    rank_times = build_rank_times(
        [(name, grid.rows, [grid.seqs[c] for c in (keeps[gi] or range(len(grid.seqs)))], grid.col_t_for(keeps[gi]))
         for gi, (name, _desc, grid) in enumerate(grids)],
        tracks, t0, opts.max_rank_times, primary_group=next((m["group"] for m in marks if not m["consequence"]), None),
    )
    lag_budget = opts.max_lags
    groups_out: list[dict[str, Any]] = []
    for gi, (name, desc, grid) in enumerate(grids):
        keep = keeps[gi]
        patterns, row_pattern, _ = encoded[gi]
        cols = keep if keep is not None else list(range(len(grid.seqs)))
        remap = {c: i for i, c in enumerate(cols)}
        lags = [(lag, row, remap[col]) for lag, row, col in grid.lags if col in remap]
        if len(lags) > lag_budget:
            lags = heapq.nlargest(lag_budget, lags)
        lag_budget = max(0, lag_budget - len(lags))
        lags.sort(key=lambda x: (x[1], x[2]))
        stuck_cols = [
            remap[grid.seqs.index(m["seq"])]
            for m in marks
            if m["group"] == name and m["seq"] in grid.seqs and grid.seqs.index(m["seq"]) in remap
        ]
        groups_out.append(
            {
                "name": name,
                "desc": desc,
                "ranks": grid.rows,
                "seqs": [grid.seqs[c] for c in cols],
                "seq_range": [grid.seqs[0], grid.seqs[-1]] if grid.seqs else None,
                "sampled": keep is not None,
                "columns_dropped": len(grid.seqs) - len(cols),
                "col_cell": [grid.col_cell[c] for c in cols],
                "col_t_ms": [grid.col_t[c] for c in cols],
                "col_dur_ms": [grid.col_dur[c] for c in cols],
                **spread_fields([grid.col_spread[c] for c in cols]),
                "rank_times": rank_times.get(name),
                "patterns": patterns,
                "row_pattern": row_pattern,
                "lags": [x for lag, row, col in lags for x in (row, col, lag)],
                "finding_cols": sorted(set(stuck_cols)),
                "p2p_entries": sum(len(t.p2p) for t in tracks.get(name, {}).values()),
            }
        )

    primary = next((m for m in marks if not m["consequence"] and m["seq"] is not None), None)
    culprits = sorted({r for m in marks if not m["consequence"] for r in m["culprit_ranks"]})
    tables.resolve_sites(set(culprits), opts.max_site_ranks)
    op_names = tables.op_names
    labels = sorted({op_label(o) for o in op_names})
    captured = {
        str(r): round((d.captured_at_ns - t0) / 1e6, 3)
        for r, d in dumpset.dumps.items()
        if d.captured_at_ns and t0 is not None
    }
    return {
        "schema": TIMELINE_SCHEMA,
        "world_size": dumpset.world_size,
        "ranks_loaded": list(dumpset.ranks_loaded),
        "missing_ranks": list(dumpset.missing_ranks),
        "t0_ns": str(t0) if t0 is not None else None,
        "captured_ms": captured,
        "states": list(STATES),
        "op_names": op_names,
        "op_labels": labels,
        "op_label_of": [labels.index(op_label(o)) for o in op_names],
        "cell_fields": [
            "op",
            "state",
            "input_sizes",
            "input_dtypes",
            "output_sizes",
            "output_dtypes",
            "site",
            "entries",
        ],
        "cells": tables.cells,
        "strings": tables.strings,
        "culprit_ranks": culprits,
        "primary": primary,
        "marks": marks,
        "lag_threshold_ms": opts.lag_threshold_ms,
        "groups": groups_out,
    }


__all__ = ["STATES", "TIMELINE_SCHEMA", "TimelineOptions", "build_timeline"]
