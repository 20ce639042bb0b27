"""When each rank arrived at the same collectives: what both straggler checks start from.

`straggler` (late at every collective) and `stragglers_steps` (late at step boundaries) look at the
same window, the most recent `SAMPLE` collectives of a group that every rank with entries completed
and dated, and measure each rank's arrival (`time_created_ns` of its first entry at the seq;
coalesced ops share one) against a middle rank of that collective. Which middle differs: `straggler`
takes the upper middle arrival (`upper_middle`), `stragglers_steps` the median.

Arrivals are read as columns (`Track.first_created`: straight from a columnar rank's table, no Entry
built), and the per-collective work runs as C-level passes over them: at 8,192 ranks a group's window
is 200 x 8,192 arrivals, and a Python loop per (rank, collective) was most of the checks' time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq, sub, truediv
from statistics import median

from frscope.analysis.tracks import Track

SAMPLE = 200  # the most recent collectives per group are enough, and keep this linear and cheap


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The collectives of the window that every rank in `ranks` dated, oldest first."""

    ranks: list[int]  # the ranks with entries, ascending
    window: range  # the seqs looked at; `counted` marks those every rank dated
    counted: list[bool]
    seqs: list[int]  # the counted seqs
    rows: list[tuple[int, ...]]  # per counted seq: each rank's arrival (ns), in `ranks` order
    by_rank: dict[int, list[int]]  # per rank: its arrival at each counted seq

    def __len__(self) -> int:
        return len(self.rows)


def arrivals(tracks: dict[int, Track]) -> Arrivals:
    """The ranks with entries, and their arrivals at the most recent `SAMPLE` collectives that all of
    them completed; a collective some rank did not date is left out. None counted with fewer than two
    ranks. Evidence must agree: a rank whose recorder ends before a collective every other rank completed
    (which needed it) was read earlier than theirs (a stale read); its end does not cut the others' window,
    and it is left out (it arrived at the later ones, when is unknown)."""
    ranks = sorted(r for r, t in tracks.items() if t.by_seq)
    if len(ranks) > 2:
        done = sorted(tracks[r].last_completed for r in ranks)
        ranks = [r for r in ranks if tracks[r].last_seq >= (done[1] if tracks[r].last_completed == done[0]
                                                            else done[0])]
    if len(ranks) < 2:
        return Arrivals(ranks, range(0), [], [], [], {r: [] for r in ranks})
    lo = max(tracks[r].first_seq for r in ranks)
    hi = min(tracks[r].last_completed for r in ranks)
    window = range(max(lo, hi - SAMPLE + 1), hi + 1)
    columns = [tracks[r].first_created(window) for r in ranks]  # None or 0: no entry, or not dated
    counted = list(map(all, zip(*columns, strict=True)))
    rows: list[tuple[int, ...]] = list(compress(zip(*columns, strict=True), counted))
    by_rank: dict[int, list[int]] = {r: list(compress(col, counted)) for r, col in zip(ranks, columns, strict=True)}  # type: ignore[arg-type]
    return Arrivals(ranks, window, counted, list(compress(window, counted)), rows, by_rank)


def upper_middle(times: Sequence[int]) -> int:
    """The arrival in the middle, the later of the two for an even count."""
    return sorted(times)[len(times) // 2]


def middles(arrived: Arrivals, middle: Callable[[Sequence[int]], float] = median) -> list[float]:
    """Per counted collective its middle arrival (ns)."""
    return list(map(middle, arrived.rows))


def lateness_ms(arrived: Arrivals, rank: int, mids: Sequence[float]) -> list[float]:
    """How late `rank` arrived after the middle at each counted collective (ms; negative: early)."""
    return list(map(truediv, map(sub, arrived.by_rank[rank], mids), repeat(1e6)))


def durations_ms(arrived: Arrivals, track: Track) -> list[float]:
    """The rank's recorded durations (its first entry's `duration_ms`) at the counted collectives, in
    order; collectives it recorded none for are left out."""
    recorded = list(compress(track.first_duration(arrived.window), arrived.counted))
    return list(compress(recorded, map(eq, recorded, recorded)))  # all but NaN (not recorded)
