"""Live lateness across pods: which pod (a node, its host) the job's other pods keep waiting for, and
what that costs the job, from the recent arrivals every sidecar reports (`frscope.analysis.lateness`
compares only the ranks of one pod, so a whole slow node, or the only rank of a pod, is invisible to it).

A pod is the unit because its ranks share one clock (one node). Per process group that spans at least
two pods, at each collective every member enqueued, each pod has an *arrival*: when its last member
rank got there. The last pod made all the others wait the gap between it and the next-latest pod (after
that one arrived, only the last was missing); that gap is the last pod's *lateness* at the collective.
Two measures of the gap, per collective:

- **by waits** (skew-free), where every pod's recorder dates how long its ranks spent in the collective
  (NCCL with timing: `duration_ms`, from the kernel's start to its end): every participant finishes a
  collective at about the same true moment, so a rank's wait, read on its own clock, is that moment
  minus its arrival. Arrival order is reverse wait order and the gap is the next-smallest wait minus
  the smallest (`max_wait - wait` for two pods). No clock is compared.
- **by clocks**, where a recorder dates enqueues only (gloo; NCCL without timing): enqueue times of
  different hosts, each first moved onto the operator's clock by that pod's measured offset
  (`PodClock`: the operator's round trips to the sidecar, which shares its ranks' node clock). What is
  left of the hosts' offsets is at most the two pods' `bound_ns` together, and that much is taken off
  every gap, so a residual offset can neither make a pod late nor add to its cost. Enqueue times alone
  cannot tell a pod that is late by d at every step from a clock d ahead (a rank's own intervals are
  the same in both cases): the measured offset is what makes a persistent straggler visible.

A gap of at least `min_gap_s` is a *late arrival*. Over the window (the group's last `window_s`
seconds, POD_WINDOW_S by default, and at least its newest MIN_WINDOW_COLLECTIVES; a quarter of the
in-pod window because arrivals reach the operator in chunks, a sidecar's full recorder read every 30 s:
a straggler that began during a chunk is named from that chunk once it was slow for the last 15 s of
it, not one chunk later):
  - `lateness_s`: the mean gap of the pod's late arrivals;
  - `share`: the sum of its gaps over the part of the window the compared collectives cover: the
    fraction of the job's time the other pods spent waiting for it ("costs the job 18% of its time");
  - a *straggler*: share at least `min_share`, and late far more often than chance (binomial tail of
    its count below `ALPHA` / pods, as in `lateness`): even jitter names nobody.
The pod's named rank is the member it waited for most often at its late arrivals.

Cost: per group, at most `compare_budget` pod-collective cells are compared (the newest collectives,
at least MIN_COMPARED): a job of 8,192 pods compares its newest 32 collectives, one of 512 pods 512.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from frscope.analysis.context import DEFAULT_CLOCK_SKEW_MS
from frscope.analysis.lateness import ALPHA, MIN_GAP_S, MIN_LATE, MIN_SHARE, binomial_tail

# rank -> group -> ((collective_seq_id, enqueue ns on the pod's clock[, wait ns]), ...): what one sidecar
# reports of its pod's ranks; the wait is there only where the recorder dates it.
RankArrivals = Mapping[int, Mapping[str, Sequence[tuple[int, ...]]]]
NO_WAIT = -1
POD_WINDOW_S = 15.0
# However slow the steps, the window holds at least this many collectives (where known): a chance-level
# test needs a few.
MIN_WINDOW_COLLECTIVES = 8
# The most pod-collective cells compared per group, and the fewest collectives however many pods.
COMPARE_BUDGET = 1 << 18
MIN_COMPARED = 32
MAX_COMPARED = 512


class PodArrival(NamedTuple):
    """One pod at one collective of one group (a tuple: a job's arrivals are many)."""

    created_ns: int  # its last member's enqueue, on the pod's clock
    late_rank: int  # that member
    wait_ns: int  # its members' least recorded wait (NO_WAIT: some member's is not recorded)
    wait_rank: int  # the member that waited least (the one the pod's arrival is by waits)


@dataclass(frozen=True, slots=True)
class PodClock:
    """A pod's clock against the operator's: `offset_ns` (pod minus operator), true to within `bound_ns`."""

    offset_ns: int
    bound_ns: int


# pod -> group -> collective_seq_id -> its arrival
PodArrivals = Mapping[str, Mapping[str, Mapping[int, PodArrival]]]


@dataclass(frozen=True, slots=True)
class PodLateness:
    pod: str
    rank: int  # the pod's rank the others waited for most often (-1: it was never late)
    ranks: tuple[int, ...]  # the pod's ranks in the group (those that reported arrivals)
    group: str  # the group where it costs the job most
    lateness_s: float  # mean gap of its late arrivals, the clock bound taken off (0: none)
    share: float  # fraction of the window the other pods spent waiting for it
    late: int
    compared: int
    window_s: float
    straggler: bool
    by_waits: int  # of the compared collectives, how many were compared by waits (skew-free)


def pod_arrivals(by_rank: RankArrivals) -> dict[str, dict[int, PodArrival]]:
    """One pod's ranks' arrivals -> group -> seq -> the pod's arrival, for the collectives that every
    rank of the pod reporting the group has."""
    out: dict[str, dict[int, PodArrival]] = {}
    groups: dict[str, list[tuple[int, Sequence[tuple[int, ...]]]]] = {}
    for rank, by_group in by_rank.items():
        for group, rows in by_group.items():
            if rows:
                groups.setdefault(group, []).append((rank, rows))
    for group, members in groups.items():
        if len(members) == 1:  # one rank in the group: its rows are the pod's arrivals
            rank, rows = members[0]
            out[group] = {row[0]: PodArrival(row[1], rank, w, rank)
                          for row in rows for w in (row[2] if len(row) > 2 and row[2] >= 0 else NO_WAIT,)}
            continue
        merged: dict[int, list[int]] = {}  # seq -> [created, late rank, wait, wait rank, members seen]
        for rank, rows in members:
            for row in rows:
                seq, created = row[0], row[1]
                wait = row[2] if len(row) > 2 and row[2] >= 0 else NO_WAIT
                got = merged.get(seq)
                if got is None:
                    merged[seq] = [created, rank, wait, rank, 1]
                    continue
                if created > got[0]:
                    got[0], got[1] = created, rank
                if got[2] != NO_WAIT and (wait == NO_WAIT or wait < got[2]):
                    got[2], got[3] = wait, rank
                got[4] += 1
        need = len(members)
        out[group] = {seq: PodArrival(v[0], v[1], v[2], v[3]) for seq, v in merged.items() if v[4] == need}
    return out


def pod_lateness(arrivals: PodArrivals, clocks: Mapping[str, PodClock] | None = None, *,
                 ranks: Mapping[str, tuple[int, ...]] | None = None,
                 unmeasured_bound_s: float = DEFAULT_CLOCK_SKEW_MS / 1000, min_gap_s: float = MIN_GAP_S,
                 min_share: float = MIN_SHARE, window_s: float = POD_WINDOW_S,
                 compare_budget: int = COMPARE_BUDGET) -> dict[str, PodLateness]:
    """Per pod, its lateness against the job's other pods in the group where it costs most; empty when
    no group spans two pods. A pod without a measured clock (`clocks`) is taken at offset 0 within
    `unmeasured_bound_s` (the operator's `--clock-skew-ms`). `ranks`: each pod's ranks, for the result."""
    unmeasured = PodClock(0, int(unmeasured_bound_s * 1e9))
    groups: dict[str, dict[str, Mapping[int, PodArrival]]] = {}
    for pod, by_group in arrivals.items():
        for group, seqs in by_group.items():
            if seqs:
                groups.setdefault(group, {})[pod] = seqs
    best: dict[str, PodLateness] = {}
    for group, by_pod in sorted(groups.items()):
        if len(by_pod) < 2:
            continue
        pod_clocks = {pod: (clocks or {}).get(pod, unmeasured) for pod in by_pod}
        found = _group(group, by_pod, pod_clocks, ranks or {}, min_gap_s, min_share, window_s, compare_budget)
        for late in found.values():
            kept = best.get(late.pod)
            if kept is None or (late.straggler, late.share) > (kept.straggler, kept.share):
                best[late.pod] = late
    return best


def _group(group: str, by_pod: dict[str, Mapping[int, PodArrival]], clocks: dict[str, PodClock],
           ranks: Mapping[str, tuple[int, ...]], min_gap_s: float, min_share: float, window_s: float,
           compare_budget: int) -> dict[str, PodLateness]:
    pods = sorted(by_pod)
    columns = [by_pod[pod] for pod in pods]
    common = set(columns[0]).intersection(*columns[1:])
    if not common:
        return {}
    keep = max(MIN_COMPARED, min(MAX_COMPARED, compare_budget // len(pods)))
    ordered = sorted(common)[-keep:]
    offsets = [clocks[pod].offset_ns for pod in pods]
    bounds = [clocks[pod].bound_ns for pod in pods]
    # when each compared collective began, on the operator's clock (its newest pod's arrival), for the window
    began = [max(col[seq].created_ns - off for col, off in zip(columns, offsets, strict=True)) for seq in ordered]
    newest = max(began)
    first = min(next(i for i, t in enumerate(began) if newest - t <= window_s * 1e9),
                max(0, len(began) - MIN_WINDOW_COLLECTIVES))
    ordered, began = ordered[first:], began[first:]
    span_s = (newest - min(began)) / 1e9
    # The operator merges what its sweeps saw, so collectives between sweeps may be missing (a group's
    # seqs are consecutive): the share is over the part of the span the compared collectives cover.
    covered = len(ordered) / (ordered[-1] - ordered[0] + 1)
    gaps: list[list[float]] = [[] for _ in pods]
    # The span runs from the first compared collective's begin to the newest's: the gaps inside it are
    # those of every collective but the first (a gap ends where its collective begins).
    costs = [0.0 for _ in pods]
    late_ranks: list[Counter[int]] = [Counter() for _ in pods]
    by_waits = 0
    min_gap_ns = min_gap_s * 1e9
    for index, seq in enumerate(ordered):
        row = [col[seq] for col in columns]
        if all(a.wait_ns != NO_WAIT for a in row):
            by_waits += 1
            values = [-a.wait_ns for a in row]  # arrival = the common end minus the wait
            last, beyond = _last_gap(values)
            named = row[last].wait_rank
        else:
            values = [a.created_ns - off for a, off in zip(row, offsets, strict=True)]
            last, gap = _last_gap(values)
            second = _second(values, last)
            beyond = gap - bounds[last] - bounds[second]
            named = row[last].late_rank
        if beyond >= min_gap_ns:
            gaps[last].append(beyond / 1e9)
            late_ranks[last][named] += 1
            if index:
                costs[last] += beyond / 1e9
    events = sum(len(g) for g in gaps)
    p = 1.0 / len(pods)
    out: dict[str, PodLateness] = {}
    for i, pod in enumerate(pods):
        mine = gaps[i]
        share = costs[i] / (span_s * covered) if span_s > 0 else 0.0
        biased = len(mine) >= MIN_LATE and binomial_tail(len(mine), events, p) < ALPHA / len(pods)
        named = late_ranks[i].most_common(1)[0][0] if mine else -1
        out[pod] = PodLateness(pod, named, ranks.get(pod, ()), group, sum(mine) / len(mine) if mine else 0.0,
                               min(share, 1.0), len(mine), len(ordered), span_s, biased and share >= min_share,
                               by_waits)
    return out


def _last_gap(values: list[int]) -> tuple[int, int]:
    """The index of the largest value and its gap to the next-largest (C-level max, no sort)."""
    top = max(values)
    last = values.index(top)
    rest = values[:last] + values[last + 1:]
    return last, top - max(rest)


def _second(values: list[int], last: int) -> int:
    """The index of the next-largest value after `last`'s."""
    rest = values[:last] + values[last + 1:]
    i = rest.index(max(rest))
    return i if i < last else i + 1
