"""Live lateness: which rank the others keep waiting for, and what it costs the job, over a recent
window of arrivals (when each rank enqueued each collective). Used while the job runs, on what a
collector keeps of each rank's recorder (the sidecar: its pod's ranks), so it needs no finished
dump; `stragglers_steps` answers the same question for a diagnosis, over whole recorders.

At each collective that every compared rank enqueued, the last rank made the others wait at least
the gap between it and the next-latest; a gap of `min_gap_s` or more is a *late arrival* of that
rank. Over the window (the last `window_s` seconds of the group's arrivals):
  - `lateness_s`: the mean gap of the rank's late arrivals (how late it is when it is late);
  - `share`: the sum of its gaps over the window's span: the fraction of the job's time the others
    spent waiting for it ("rank 5 costs the job 18% of each step");
  - a *straggler*: its share is at least `min_share`, and it was late far more often than chance
    allows (with n ranks an unbiased job's late arrivals fall on each rank with probability 1/n; the
    binomial tail of its count must be below `ALPHA` / n). Even jitter stays quiet.
No clock offsets are removed: within a pod the ranks share a clock, and across hosts NTP keeps them
within milliseconds, well below `min_gap_s`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb

MIN_GAP_S = 0.02
MIN_SHARE = 0.1
WINDOW_S = 60.0
ALPHA = 0.01
MIN_LATE = 3

# rank -> group -> ((collective_seq_id, enqueue time in ns), ...)
Arrivals = Mapping[int, Mapping[str, Sequence[tuple[int, int]]]]


@dataclass(frozen=True, slots=True)
class RankLateness:
    rank: int
    group: str  # the group where it costs the job most
    lateness_s: float  # mean gap of its late arrivals (0: none)
    share: float  # fraction of the window the others spent waiting for it
    late: int  # its late arrivals in the window
    compared: int  # collectives compared in the window
    window_s: float  # the window's span
    straggler: bool


def binomial_tail(k: int, m: int, p: float) -> float:
    return sum(comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(k, m + 1))


def rank_lateness(arrivals: Arrivals, *, min_gap_s: float = MIN_GAP_S, min_share: float = MIN_SHARE,
                  window_s: float = WINDOW_S) -> dict[int, RankLateness]:
    """Per rank, its lateness in the group where it costs most; empty with fewer than two ranks."""
    groups: dict[str, dict[int, dict[int, int]]] = {}
    for rank, by_group in arrivals.items():
        for group, pairs in by_group.items():
            groups.setdefault(group, {})[rank] = dict(pairs)
    best: dict[int, RankLateness] = {}
    for group, by_rank in groups.items():
        if len(by_rank) < 2:
            continue
        for found in _group_lateness(group, by_rank, min_gap_s, min_share, window_s).values():
            kept = best.get(found.rank)
            if kept is None or (found.straggler, found.share) > (kept.straggler, kept.share):
                best[found.rank] = found
    return best


def _group_lateness(group: str, by_rank: dict[int, dict[int, int]], min_gap_s: float, min_share: float,
                    window_s: float) -> dict[int, RankLateness]:
    ranks = sorted(by_rank)
    common = set.intersection(*(set(times) for times in by_rank.values()))
    rows = [[by_rank[r][seq] for r in ranks] for seq in sorted(common)]
    if not rows:
        return {}
    newest = max(max(row) for row in rows)
    rows = [row for row in rows if newest - min(row) <= window_s * 1e9]
    span_s = (newest - min(min(row) for row in rows)) / 1e9
    gaps: dict[int, list[float]] = {r: [] for r in ranks}
    for row in rows:
        order = sorted(range(len(ranks)), key=row.__getitem__)
        gap = (row[order[-1]] - row[order[-2]]) / 1e9
        if gap >= min_gap_s:
            gaps[ranks[order[-1]]].append(gap)
    events = sum(len(g) for g in gaps.values())
    p = 1.0 / len(ranks)
    out: dict[int, RankLateness] = {}
    for rank in ranks:
        mine = gaps[rank]
        share = sum(mine) / span_s if span_s > 0 else 0.0
        biased = len(mine) >= MIN_LATE and binomial_tail(len(mine), events, p) < ALPHA / len(ranks)
        out[rank] = RankLateness(rank, group, sum(mine) / len(mine) if mine else 0.0, min(share, 1.0), len(mine),
                                 len(rows), span_s, biased and share >= min_share)
    return out
