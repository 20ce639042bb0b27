"""Live lateness across pods: which pod (a node, its host) the job's other pods keep waiting for, from
the recent arrivals every sidecar reports (`frscope.analysis.lateness` compares only the ranks of one
pod, so a whole slow node, or the only rank of a pod, is invisible to it).

Per process group that spans at least two pods, at each collective every member rank enqueued: a
pod arrives when its last member rank does; the last pod made the others wait the gap between it and
the next-latest pod. Timestamps of different pods come from different hosts' clocks, so each gap is
first reduced by `skew_s`, the bound on the hosts' clock offset (the operator's `--clock-skew-ms`):
a gap counts as a late arrival only if it is at least `min_gap_s` beyond the bound, and only the part
beyond the bound counts toward the pod's lateness and share. A constant offset within the bound can
therefore neither make a pod late nor add to its share; a pod that is later than the bound allows,
consistently, over many collectives, is a straggler by the same test as `lateness` uses (share at least
`min_share`, and late far more often than chance: binomial tail below `ALPHA` / pods).

The pod's named rank is the member it waited for most often at its late arrivals (its own last rank).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS
from frscope.analysis.lateness import ALPHA, MIN_GAP_S, MIN_LATE, MIN_SHARE, WINDOW_S, Arrivals, binomial_tail

# pod -> its ranks' arrivals (rank -> group -> ((collective_seq_id, enqueue time in ns), ...))
PodArrivals = Mapping[str, Arrivals]


@dataclass(frozen=True, slots=True)
class PodLateness:
    pod: str
    rank: int  # the pod's rank the others waited for most often (-1: it was never late)
    ranks: tuple[int, ...]  # the pod's ranks in the group
    group: str  # the group where it costs the job most
    lateness_s: float  # mean gap of its late arrivals beyond the skew bound (0: none)
    share: float  # fraction of the window the other pods spent waiting for it
    late: int
    compared: int
    window_s: float
    straggler: bool


def pod_lateness(arrivals: PodArrivals, *, skew_s: float = DEFAULT_CLOCK_SKEW_MS / 1000,
                 min_gap_s: float = MIN_GAP_S, min_share: float = MIN_SHARE,
                 window_s: float = WINDOW_S) -> dict[str, PodLateness]:
    """Per pod, its lateness against the job's other pods in the group where it costs most; empty
    when no group spans two pods."""
    # group -> pod -> rank -> seq -> enqueue ns
    groups: dict[str, dict[str, dict[int, dict[int, int]]]] = {}
    for pod, by_rank in arrivals.items():
        for rank, by_group in by_rank.items():
            for group, pairs in by_group.items():
                if pairs:
                    groups.setdefault(group, {}).setdefault(pod, {})[rank] = dict(pairs)
    best: dict[str, PodLateness] = {}
    for group, by_pod in sorted(groups.items()):
        if len(by_pod) < 2:
            continue
        for found in _group(group, by_pod, skew_s, min_gap_s, min_share, window_s).values():
            kept = best.get(found.pod)
            if kept is None or (found.straggler, found.share) > (kept.straggler, kept.share):
                best[found.pod] = found
    return best


def _group(group: str, by_pod: dict[str, dict[int, dict[int, int]]], skew_s: float, min_gap_s: float,
           min_share: float, window_s: float) -> dict[str, PodLateness]:
    pods = sorted(by_pod)
    common = set.intersection(*(set(times) for by_rank in by_pod.values() for times in by_rank.values()))
    # per collective: per pod (its arrival, the rank it waited for)
    ordered = sorted(common)
    rows: list[list[tuple[int, int]]] = [
        [max((times[seq], rank) for rank, times in by_pod[pod].items()) for pod in pods] for seq in ordered
    ]
    if not rows:
        return {}
    newest = max(max(t for t, _r in row) for row in rows)
    in_window = [i for i, row in enumerate(rows) if newest - min(t for t, _r in row) <= window_s * 1e9]
    rows = [rows[i] for i in in_window]
    span_s = (newest - min(min(t for t, _r in row) for row in rows)) / 1e9
    # The operator merges what sweeps saw, so collectives between sweeps may be missing (a group's
    # seqs are consecutive): the share is over the part of the span the compared collectives cover.
    covered = len(rows) / (ordered[in_window[-1]] - ordered[in_window[0]] + 1)
    gaps: dict[str, list[float]] = {pod: [] for pod in pods}
    last_ranks: dict[str, Counter[int]] = {pod: Counter() for pod in pods}
    for row in rows:
        order = sorted(range(len(pods)), key=lambda i: row[i][0])
        beyond = (row[order[-1]][0] - row[order[-2]][0]) / 1e9 - skew_s
        if beyond >= min_gap_s:
            pod = pods[order[-1]]
            gaps[pod].append(beyond)
            last_ranks[pod][row[order[-1]][1]] += 1
    events = sum(len(g) for g in gaps.values())
    p = 1.0 / len(pods)
    out: dict[str, PodLateness] = {}
    for pod in pods:
        mine = gaps[pod]
        share = sum(mine) / (span_s * covered) if span_s > 0 else 0.0
        biased = len(mine) >= MIN_LATE and binomial_tail(len(mine), events, p) < ALPHA / len(pods)
        named = last_ranks[pod].most_common(1)[0][0] if mine else -1
        out[pod] = PodLateness(pod, named, tuple(sorted(by_pod[pod])), group, sum(mine) / len(mine) if mine else 0.0,
                               min(share, 1.0), len(mine), len(rows), span_s, biased and share >= min_share)
    return out
