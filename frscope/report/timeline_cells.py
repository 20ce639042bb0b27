"""The timeline's cells (`timeline.build_timeline`): what one rank recorded for one collective, or why
it has nothing there, as interned rows of the cells and strings tables; the cell states; the options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frscope.analysis import Finding, op_label
from frscope.analysis.stacks import user_frame
from frscope.analysis.tracks import Track
from frscope.records import COMPLETED, STARTED, Entry

TIMELINE_SCHEMA = "frscope.timeline/v1"

# Cell states; the index is what the cells table stores.
STATES = ("completed", "scheduled", "started", "in_flight", "not_entered", "not_recorded", "no_dump")
S_COMPLETED, S_SCHEDULED, S_STARTED, S_IN_FLIGHT, S_NOT_ENTERED, S_NOT_RECORDED, S_NO_DUMP = range(len(STATES))

DEFAULT_MAX_RUNS = 200_000
DEFAULT_TAIL_COLUMNS = 256
DEFAULT_LAG_THRESHOLD_MS = 50.0
DEFAULT_MAX_LAGS = 20_000
DEFAULT_MAX_SITE_RANKS = 8
DEFAULT_MAX_RANK_TIMES = 131_072  # 128 collectives of 1,024 ranks

# Raw cell key: compared with == only (sizes are lists: unhashable, cheap to compare).
RawKey = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class TimelineOptions:
    max_runs: int = DEFAULT_MAX_RUNS
    tail_columns: int = DEFAULT_TAIL_COLUMNS
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
    max_lags: int = DEFAULT_MAX_LAGS
    # call sites come from the frames, which may be re-read from each rank's file: ask this many ranks
    # at most (besides the culprits)
    max_site_ranks: int = DEFAULT_MAX_SITE_RANKS
    # each rank's own times (created, started, duration) for this many cells at most, the most recent
    # collectives of every group first (docs/timeline.md, "Each rank's own times")
    max_rank_times: int = DEFAULT_MAX_RANK_TIMES


class Tables:
    """Interned strings and cells shared by every group."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self._string_ids: dict[str, int] = {"": 0}
        self.op_names: list[str] = []
        self._op_ids: dict[str, int] = {}
        self.cells: list[list[int]] = []
        self._cell_ids: dict[tuple[Any, ...], int] = {}
        self._reps: list[tuple[int, Entry] | None] = []  # the entry each cell was first seen in

    def string(self, text: str) -> int:
        found = self._string_ids.get(text)
        if found is None:
            found = self._string_ids[text] = len(self.strings)
            self.strings.append(text)
        return found

    def op(self, name: str) -> int:
        found = self._op_ids.get(name)
        if found is None:
            found = self._op_ids[name] = len(self.op_names)
            self.op_names.append(name)
        return found

    def absent(self, state: int) -> int:
        key = ("", state)
        found = self._cell_ids.get(key)
        if found is None:
            found = self._cell_ids[key] = len(self.cells)
            self.cells.append([-1, state, 0, 0, 0, 0, 0, 1])
            self._reps.append(None)
        return found

    def cell(self, raw: RawKey, bucket: list[Entry], rank: int) -> int:
        op, state, in_sizes, in_dtypes, out_sizes, out_dtypes = raw
        key = (op, state, repr(in_sizes), repr(in_dtypes), repr(out_sizes), repr(out_dtypes))
        found = self._cell_ids.get(key)
        if found is not None:
            return found
        found = self._cell_ids[key] = len(self.cells)
        self._reps.append((rank, bucket[0]))
        self.cells.append(
            [
                self.op(op),
                state,
                self.string(_shapes(in_sizes)),
                self.string(", ".join(in_dtypes)),
                self.string(_shapes(out_sizes)),
                self.string(", ".join(out_dtypes)),
                0,  # call site: resolve_sites()
                len(bucket),
            ]
        )
        return found

    def resolve_sites(self, preferred: set[int], max_ranks: int) -> None:
        """Call sites from the recorder's frames. Frames may be lazy (re-read from the rank's file on
        first use), so only the ranks in `preferred` plus up to `max_ranks` others are asked."""
        allowed = set(preferred)
        budget = max_ranks
        for i, rep in enumerate(self._reps):
            if rep is None:
                continue
            rank, entry = rep
            if rank not in allowed:
                if budget <= 0:
                    continue
                budget -= 1
                allowed.add(rank)
            site = user_frame(entry.frames)
            if site is not None:
                self.cells[i][6] = self.string(f"{site.filename}:{site.line} ({site.name})")


def _shapes(sizes: list[Any]) -> str:
    return " ".join(
        "[" + ", ".join(str(d) for d in shape) + "]" if isinstance(shape, list) else str(shape) for shape in sizes
    )


def _bucket_state(bucket: list[Entry], in_flight: bool) -> int:
    if all(e.state == COMPLETED or e.retired is True for e in bucket):
        return S_COMPLETED
    if in_flight:
        return S_IN_FLIGHT
    if any(e.state == STARTED for e in bucket):
        return S_STARTED
    return S_SCHEDULED


def raw_key(bucket: list[Entry], in_flight: bool) -> RawKey:
    state = _bucket_state(bucket, in_flight)
    if len(bucket) == 1:
        e = bucket[0]
        return (e.op, state, e.input_sizes, e.input_dtypes, e.output_sizes, e.output_dtypes)
    ops = {e.op for e in bucket}
    return (
        bucket[0].op if len(ops) == 1 else "coalesced",
        state,
        [s for e in bucket for s in e.input_sizes],
        [d for e in bucket for d in e.input_dtypes],
        [s for e in bucket for s in e.output_sizes],
        [d for e in bucket for d in e.output_dtypes],
    )


def absent_state(track: Track | None, seq: int, has_dump: bool) -> int:
    if not has_dump:
        return S_NO_DUMP
    if track is None or not track.by_seq or seq > track.last_seq:
        return S_NOT_ENTERED
    return S_NOT_RECORDED


def bucket_duration(bucket: list[Entry]) -> float | None:
    total = 0.0
    for e in bucket:
        if e.duration_ms is not None:
            total += e.duration_ms
        elif e.time_started_ns and e.time_completed_ns and e.time_completed_ns >= e.time_started_ns:
            total += (e.time_completed_ns - e.time_started_ns) / 1e6
        else:
            return None
    return total


def median(values: list[int] | list[float]) -> float:
    values.sort()
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def finding_marks(findings: list[Finding]) -> list[dict[str, Any]]:
    marks: list[dict[str, Any]] = []

    def walk(finding: Finding, root: int, depth: int) -> None:
        marks.append(
            {
                "finding": root,
                "consequence": depth > 0,
                "category": finding.category.value,
                "group": finding.process_group.name,
                "seq": finding.collective_seq_id,
                "op": finding.op,
                "op_label": op_label(finding.op) if finding.op else None,
                "culprit_ranks": list(finding.culprit_ranks),
                "summary": finding.summary,
            }
        )
        for c in finding.consequences:
            walk(c, root, depth + 1)

    for i, f in enumerate(findings):
        walk(f, i, 0)
    return marks
