"""Stragglers that are late only at step boundaries.

A rank with a slow data loader reaches the first collective of every step well after the others;
the rest of the step then runs in lockstep. Averaged over all collectives its lateness is small,
and gloo records no durations, so `straggler.py` (consistent lateness) does not see it.

Here the question is per collective: where did the others' wait concentrate? For each collective
seen by every rank, the last rank to create it made the others wait for the gap between it and the
next-latest rank. Gaps of at least `MIN_WAIT_MS` (and more than the clock skew) are wait events.
Each rank's own typical offset from the median is subtracted first, so a host whose clock runs
ahead never looks late at a few collectives only. A rank is a straggler when it caused the wait
events far more often than chance allows: with n ranks, an unbiased job's events fall on each rank
with probability 1/n, and the binomial tail of its count must be below `ALPHA` (for all ranks
together). Uneven but unbiased jitter therefore stays quiet.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import compress, repeat
from math import comb, nan
from operator import eq, sub, truediv
from statistics import median

from frscope.analysis.arrivals import Arrivals, arrivals, lateness_ms, middles
from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef, LateAt
from frscope.analysis.tracks import Track
from frscope.analysis.waited import Handoffs
from frscope.analysis.wording import plural

MIN_WAIT_MS = 50.0
# Recorded durations within this of each other: nobody waited at that collective (the group in lockstep).
LOCKSTEP_MS = 1.0
# Short steps: waits from FLOOR_WAIT_MS count. Either way a straggler's waits together are at least REL_WAIT
# of the group's time (`costly`).
FLOOR_WAIT_MS = 10.0
REL_WAIT = 0.1
MIN_EVENTS = 3
ALPHA = 0.01
# Steady waits (`_steady`): a looser chance bound, with the waits' lengths within this spread
# (interquartile range over median) and at least this share of all the waiting.
ALPHA_STEADY = 0.1
STEADY_SPREAD = 0.25
STEADY_SHARE = 0.9
# and at least this many steady waits (a few identical waits happen by chance): one a step over five steps,
# as `straggler.FEW_SAMPLES` counts a steady lateness
STEADY_MIN_EVENTS = 5
MAX_SHOWN = 8


def _steady(mine: list[LateAt], events: dict[tuple[int, ...], list[LateAt]]) -> bool:
    """The rank's waits are one cause repeating, not jitter: they have about one length (a slow loader
    costs the same every step; with jitter on every rank the gap between the two latest varies from
    nothing to the jitter's range), and they are nearly all of the time anyone waited. With few ranks
    (two: each event falls on a rank by a coin toss) a handful of steps can never be beyond chance by
    count alone; the waits' steadiness is the evidence that the count lacks."""
    waits = sorted(a.waited_ms for a in mine)
    q1, mid, q3 = waits[len(waits) // 4], median(waits), waits[(3 * len(waits)) // 4]
    everyone = sum(a.waited_ms for found in events.values() for a in found)
    return mid > 0 and (q3 - q1) / mid <= STEADY_SPREAD and sum(waits) >= STEADY_SHARE * everyone


def _carried(rows: list[tuple[int, ...]]) -> list[bool]:
    """Per collective: whether its one latest rank is the one latest at the collective before and every
    other rank reached it before that rank had reached the one before (they did not wait in between: the
    late rank's one wait, carried to the next collective it enqueued)."""
    out = [False] * len(rows)
    for i in range(1, len(rows)):
        before, times = rows[i - 1], rows[i]
        latest = max(times)
        at = times.index(latest)
        if times.count(latest) == 1 and before.count(max(before)) == 1 and before.index(max(before)) == at:
            out[i] = max(times[:at] + times[at + 1:]) < before[at]
    return out


def _waits_ms(arrived: Arrivals, tracks: dict[int, Track]) -> list[float]:
    """Per counted collective, the longest recorded duration less the shortest (ms): how long the first
    to arrive waited for the last, on no clock (NaN where a rank dated none)."""
    columns = [list(compress(tracks[r].first_duration(arrived.window), arrived.counted)) for r in arrived.ranks]
    return [max(row) - min(row) if all(map(eq, row, row)) else nan for row in zip(*columns, strict=True)]


def costly(arrived: Arrivals, waits_ms: Iterable[float]) -> bool:
    """Whether the waits a lateness made the others sit through add up to at least REL_WAIT of the time the
    window spans (its first collective's median arrival to its last's): a straggler costs the job its
    lateness at every step, a share of its time. Compute jitter costs a few percent of a step, and over
    enough steps it makes some rank the last at every one by chance (of two ranks, one in 2**steps; a job
    runs many groups and is read many times): however often such a rank is last, a lateness the job would
    barely run faster without is no straggler."""
    span_ms = (median(arrived.rows[-1]) - median(arrived.rows[0])) / 1e6 if len(arrived) else 0.0
    return sum(waits_ms) >= REL_WAIT * span_ms


def binomial_tail(k: int, m: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(m, p)."""
    return sum(comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(k, m + 1))


def find_step_straggler(ctx: Context, ref: GroupRef, tracks: dict[int, Track],
                        handoffs: Handoffs | None = None) -> Finding | None:
    """A rank (or one host's ranks) late at step boundaries: waits of at least `MIN_WAIT_MS`, or in a job
    of short steps, waits of at least `FLOOR_WAIT_MS`, that add up to a large share (`REL_WAIT`) of the time
    the group's collectives span (20 ms lost in every 50 ms step is the job running at 70% of its speed)."""
    arrived = arrivals(tracks)
    if len(arrived) < MIN_EVENTS:
        return None
    skew = ctx.options.clock_skew_ms
    handoffs = handoffs or Handoffs(ctx)
    found = _step_straggler(ctx, ref, tracks, arrived, max(MIN_WAIT_MS, skew), handoffs)
    if found is None and skew < MIN_WAIT_MS:
        found = _step_straggler(ctx, ref, tracks, arrived, max(FLOOR_WAIT_MS, skew), handoffs)
    return found


def _step_straggler(ctx: Context, ref: GroupRef, tracks: dict[int, Track], arrived: Arrivals, threshold: float,
                    handoffs: Handoffs) -> Finding | None:
    ranks = arrived.ranks
    # A wait event needs the last arrival >= threshold after the next-latest, offsets removed. Each rank's
    # offset is a median of (arrival - row median), so within the widest row spread S of either side;
    # the gap is then at most 3 S. A group in lockstep (3 S well below the threshold) has no event.
    spread_ms = max(max(times) - min(times) for times in arrived.rows) / 1e6
    if 3 * spread_ms + 1.0 < threshold:
        return None
    # Each rank's clock offset from the median rank (clock skew): removed. It is read where the group ran
    # in lockstep (every rank within the skew a clock may have, the option: nobody waited there), so
    # waiting is never taken for a clock: a rank late at half the collectives, or one outside a subgroup
    # that reaches the group's collectives first each time the others wait in the subgroup first, keeps
    # its lateness and its head start. A group never in lockstep: the rank's usual offset (a clock
    # further off than the skew shows as much at every collective).
    mids_ns = middles(arrived)
    mids = [mid / 1e6 for mid in mids_ns]
    skew_ns = ctx.options.clock_skew_ms * 1e6
    # Where every rank dated how long it spent in a collective (NCCL with timing), those durations say
    # without any clock whether somebody waited there: a collective reached within the skew whose
    # durations differ by more than LOCKSTEP_MS was a wait (jitter of a step's start), and reading clocks
    # from it would take that wait for an offset. Nor is a wait carried to the next collectives a rank
    # enqueued after it (their kernels queue behind the one that waits, so their durations agree) a
    # lockstep.
    waited = _waits_ms(arrived, tracks)
    carried = _carried(arrived.rows)
    calm = [i for i, times in enumerate(arrived.rows)
            if max(times) - min(times) <= skew_ns and not waited[i] > LOCKSTEP_MS and not carried[i]]
    shifted: list[list[float]] = []  # per rank, per row: its arrival in ms less its clock offset
    for rank in ranks:
        offsets = lateness_ms(arrived, rank, mids_ns)
        base = median([offsets[i] for i in calm] or offsets)
        shifted.append(list(map(sub, map(truediv, arrived.by_rank[rank], repeat(1e6)), repeat(base))))
    # The late set of a collective: the ranks after the widest gap among the latest arrivals (at most half
    # the ranks): one rank, or a node's ranks late together (a slow host delays all of its ranks at once,
    # and then none of them is much later than the next-latest, which is its node peer).
    most = max(1, len(ranks) // 2)
    events: dict[tuple[int, ...], list[LateAt]] = {}
    total = 0
    # A collective that does not hold its caller (every NCCL one; gloo's async ones) lets a rank late at the
    # step's start enqueue the next ones late by the same amount, up to the first that blocks. Such a row,
    # where the others reached it before the same late set had reached the previous row (they did not wait
    # for it in between), is that one wait carried, counted once. Where the others reached it after, they
    # waited (the step's sync point): a new wait. The times decide, not the backend: the others cannot reach
    # the row after a blocking collective before the late set reached that collective.
    previous: tuple[tuple[int, ...], float] | None = None  # the last late set counted, its earliest arrival
    for seq, mid_ms, late in zip(arrived.seqs, mids, zip(*shifted, strict=True), strict=True):
        order = sorted(zip(late, ranks, strict=True), reverse=True)  # latest first; a tie: the higher rank
        gaps = [order[i][0] - order[i + 1][0] for i in range(min(most, len(order) - 1))]
        widest = max(range(len(gaps)), key=lambda i: (gaps[i], -i))
        if gaps[widest] < threshold:
            previous = None
        else:
            late_set = tuple(sorted(r for _, r in order[: widest + 1]))
            if previous is not None and late_set == previous[0] \
                    and order[widest + 1][0] < previous[1]:
                continue  # the same wait, carried to the next collective it enqueued
            previous = (late_set, order[widest][0])
            # A late rank released late by another rank (it waited for it in its ops before, in another
            # group or at the step's end) and no slower than the others since, passes that rank's lateness
            # on (principle 1): it is no party to this wait. A wait passed on whole is counted where it began.
            on_time = [r for _, r in order[widest + 1:]]
            late_set = tuple(r for r in late_set if handoffs.waited_for(r, ref.name, seq, threshold, on_time) is None)
            if not late_set:
                continue
            total += 1
            if late_set[-1] - late_set[0] != len(late_set) - 1:
                continue  # not one host's ranks (a launcher numbers a node's ranks in a row): no one party
            last, rank = order[0]
            op = tracks[rank].by_seq[seq][0].op
            events.setdefault(late_set, []).append(LateAt(seq, op, last - mid_ms, gaps[widest]))
    if total < MIN_EVENTS or not events:
        return None
    worst = max(events, key=lambda s: (len(events[s]), -len(s)))
    mine = events[worst]
    k = len(mine)
    if k < MIN_EVENTS or k * 2 < total:
        return None
    chance = binomial_tail(k, total, 1 / len(ranks)) * len(ranks)
    if chance >= ALPHA and not (chance < ALPHA_STEADY and k >= STEADY_MIN_EVENTS and _steady(mine, events)):
        return None
    late_ms = median(a.late_by_ms for a in mine)
    waited_ms = median(a.waited_ms for a in mine)
    if not costly(arrived, (a.waited_ms for a in mine)):
        return None  # waits that are a small share of the job's time: not worth a finding
    seqs = [a.collective_seq_id for a in mine]
    spacings = {b - a for a, b in zip(seqs, seqs[1:], strict=False)}
    rhythm = f", every {spacings.pop()} collectives" if len(spacings) == 1 else ""
    listed = ", ".join(f"#{s}" for s in seqs[:4]) + (", ..." if len(seqs) > 4 else "")
    ops = sorted({a.op for a in mine})
    names = plural(list(worst))
    together = " together (one host's ranks: a slow node)" if len(worst) > 1 else ""
    first = worst[-1]
    finding = Finding(
        category=Category.STRAGGLER,
        culprit_ranks=worst,
        process_group=ref,
        summary=(
            f"{names.capitalize()} {'reaches' if len(worst) == 1 else 'reach'} {ref.label()} late{together} at step "
            f"boundaries: {late_ms:.0f} ms after the median rank at {'/'.join(ops)} {listed} (from #{seqs[0]}{rhythm}; "
            f"{k} of the {total} collectives where the others waited), in lockstep in between; every other rank waits "
            f"~{waited_ms:.0f} ms for {'it' if len(worst) == 1 else 'them'} there each time."
        ),
        collective_seq_id=seqs[0],
        op=ops[0],
        late_by_ms=late_ms,
        late_at=mine[:MAX_SHOWN],
        late_count=k,
        since_ns=tracks[first].by_seq[seqs[0]][0].time_created_ns,
        evidence=[
            f"{names} {'was' if len(worst) == 1 else 'were'} the last to arrive, by at least {threshold:.0f} ms over "
            f"the next-latest rank, at {k} of {total} such collectives of {ref.label()} (by chance: p = "
            f"{binomial_tail(k, total, 1 / len(ranks)):.1g} with {len(ranks)} ranks)",
            "lateness is measured after removing each rank's usual offset from the median (clock skew)",
        ],
    )
    for rank in worst[: ctx.options.max_rank_views]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, tracks[rank].by_seq[seqs[-1]][0])
        stack = ctx.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack
        frames = tracks[rank].by_seq[seqs[-1]][0].frames
        if frames:
            finding.culprit_frames[rank] = frames
    return finding
