"""When each rank arrived at the same collectives: what both straggler checks start from.

`straggler` (late at every collective) and `stragglers_steps` (late at step boundaries) look at the
same window, the most recent `SAMPLE` collectives of a group that every rank with entries completed
and dated, and measure each rank's arrival (`time_created_ns` of its first entry at the seq;
coalesced ops share one) against a middle rank of that collective. Which middle differs: `straggler`
takes the upper middle arrival (`upper_middle`), `stragglers_steps` the median.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

from frscope.analysis.tracks import Track
from frscope.records import Entry

SAMPLE = 200  # the most recent collectives per group are enough, and keep this linear and cheap


@dataclass(frozen=True, slots=True)
class Row:
    """One collective every rank arrived at: each rank's first entry there."""

    seq: int
    entries: dict[int, Entry]

    def created(self, rank: int) -> int:
        return self.entries[rank].time_created_ns or 0  # never 0: arrival_rows keeps dated entries only


def arrival_rows(tracks: dict[int, Track]) -> tuple[list[int], list[Row]]:
    """The ranks with entries, and the rows of the most recent `SAMPLE` collectives that all of them
    completed, oldest first; a collective some rank did not date is left out. No rows with fewer
    than two ranks."""
    ranks = sorted(r for r, t in tracks.items() if t.by_seq)
    if len(ranks) < 2:
        return ranks, []
    lo = max(tracks[r].first_seq for r in ranks)
    hi = min(tracks[r].last_completed for r in ranks)
    rows: list[Row] = []
    for seq in range(max(lo, hi - SAMPLE + 1), hi + 1):
        entries: dict[int, Entry] = {}
        for rank in ranks:
            bucket = tracks[rank].by_seq.get(seq)
            if not bucket or not bucket[0].time_created_ns:
                break
            entries[rank] = bucket[0]
        else:
            rows.append(Row(seq, entries))
    return ranks, rows


def upper_middle(times: Sequence[int]) -> int:
    """The arrival in the middle, the later of the two for an even count."""
    return sorted(times)[len(times) // 2]


def lateness_ms(
    ranks: list[int], rows: list[Row], middle: Callable[[Sequence[int]], float] = median
) -> tuple[list[float], dict[int, list[float]]]:
    """Per row its middle arrival (ns), and per rank how late it arrived after that middle at each
    row (ms; negative: early), in row order."""
    mids: list[float] = []
    late: dict[int, list[float]] = {r: [] for r in ranks}
    for row in rows:
        mid = middle([row.created(r) for r in ranks])
        mids.append(mid)
        for rank in ranks:
            late[rank].append((row.created(rank) - mid) / 1e6)
    return mids, late
