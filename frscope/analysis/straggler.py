"""Stragglers: a rank that reaches collectives consistently later than its peers.

Creation times of the same collective_seq_id on different ranks show who arrived last. Different
hosts' clocks differ by their skew, so lateness under `clock_skew_ms` never counts; where NCCL
recorded durations, the straggler's own duration must also be the shortest (the others waited for
it), which a constant clock offset cannot fake. However often a rank is last, a lateness whose waits
cost the others little of their time (`stragglers_steps.costly`) is jitter, not a straggler.
"""

from __future__ import annotations

from collections import Counter
from heapq import nlargest
from math import comb
from statistics import median

from frscope.analysis.arrivals import Arrivals, arrivals, durations_ms, lateness_ms, middles, upper_middle
from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.stragglers_steps import (
    ALPHA,
    ALPHA_STEADY,
    MIN_WAIT_MS,
    STEADY_SPREAD,
    binomial_tail,
    costly,
)
from frscope.analysis.tracks import Track
from frscope.analysis.waited import Handoffs
from frscope.analysis.wording import plural

MIN_SAMPLES = 5
LAST_SHARE = 0.6  # last to arrive in at least this share of the sampled collectives
MAX_SET = 8  # ranks late together: at most one host's ranks (8 GPUs a node)
FEW_SAMPLES = 5  # a steady lateness counts from this many collectives (one per step: five steps)


def _steady_offset(ctx: Context, rank: int, lateness: list[float], late_ms: float) -> bool:
    """Few ranks (two: each is last by a coin toss) can never be beyond chance by count alone over a few
    steps; a lateness of about one length (interquartile range within STEADY_SPREAD of the median), well
    over any wait jitter makes (MIN_WAIT_MS), that is absent at some collective of the rank, in this group
    or another (so no clock offset: its clock agrees with its peers' there), is one cause repeating."""
    if len(lateness) < FEW_SAMPLES or late_ms < MIN_WAIT_MS:
        return False
    ordered = sorted(lateness)
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    return (q3 - q1) / late_ms <= STEADY_SPREAD and _in_step_somewhere(ctx, rank, late_ms / 2)


def _in_step_somewhere(ctx: Context, rank: int, within_ms: float) -> bool:
    """The rank arrived within `within_ms` of the middle at some collective of some group it is in."""
    for tracks in ctx.tracks.values():
        if rank not in tracks or len(tracks) < 2:
            continue
        arrived = arrivals(tracks)
        if rank in arrived.by_rank and len(arrived):
            mine = lateness_ms(arrived, rank, middles(arrived, upper_middle if len(arrived.ranks) > 2 else min))
            if min(mine, default=within_ms) < within_ms:
                return True
    return False


def _passed_on(handoffs: Handoffs, rank: int, group: str, seqs: list[int], within_ms: float,
               on_time: list[int]) -> bool:
    """At most of `seqs`, the rank's lateness was another rank's, passed on (`waited.Handoffs`)."""
    passed = sum(handoffs.waited_for(rank, group, seq, within_ms, on_time) is not None for seq in seqs)
    return passed * 2 > len(seqs)


def late_together(arrived: Arrivals, worst: int, apart: int | None = None) -> tuple[tuple[int, ...], int, list[int]]:
    """The ranks late together with `worst` and at how many collectives: per collective, the ranks after
    the widest gap among the latest arrivals (at most half the ranks) hold it; when the most usual such
    set is a few ranks of one host (a launcher numbers a node's ranks in a row) and holds at least
    LAST_SHARE of the collectives, those ranks are one slow node, late together (whichever of them comes
    last is a coin toss). Otherwise `worst` alone. Also the collectives where that set was late. `apart`:
    the collectives the share is of (those every rank reached at once left out), by default all."""
    ranks = arrived.ranks
    most = max(1, len(ranks) // 2)
    sets: Counter[tuple[int, ...]] = Counter()
    where: dict[tuple[int, ...], list[int]] = {}
    for seq, times in zip(arrived.seqs, arrived.rows, strict=True):
        order = sorted(zip(times, ranks, strict=True), reverse=True)
        gaps = [order[i][0] - order[i + 1][0] for i in range(min(most, len(order) - 1))]
        if not gaps or order[0][0] == order[-1][0]:
            continue  # no gap, or every rank reached it at once: nobody is late there
        widest = max(range(len(gaps)), key=lambda i: (gaps[i], -i))
        late = tuple(sorted(r for _, r in order[: widest + 1]))
        if worst in late:
            sets[late] += 1
            where.setdefault(late, []).append(seq)
    if sets:
        node, count = max(sets.items(), key=lambda kv: (kv[1], -len(kv[0])))
        if len(node) > 1 and node[-1] - node[0] == len(node) - 1 and count >= LAST_SHARE * (apart or len(arrived)):
            return node, count, where[node]
    return (worst,), 0, []


def find_straggler(ctx: Context, ref: GroupRef, tracks: dict[int, Track],
                   handoffs: Handoffs | None = None) -> Finding | None:
    """A rank (or one host's ranks) late at most collectives of the group. `handoffs`: one per analysis
    (it keeps what it read of every group), else one of its own."""
    arrived = arrivals(tracks)
    samples = len(arrived)
    if samples < MIN_SAMPLES:
        return None
    ranks = arrived.ranks
    hi = min(tracks[r].last_completed for r in ranks)
    # Per collective (C-level over the ranks): who came last, the latest arrival. A collective every rank
    # reached at the same instant (gloo's members leave a blocking collective together, and go on in
    # lockstep) tells nothing about who comes last: it is no sample. One where a few ranks share the latest
    # arrival (a node's ranks) is one, with no single rank last. A rank late at a step's start enqueues the
    # step's non-blocking collectives (all of NCCL's, gloo's async ones) late one after another, while the
    # others had enqueued them before it reached the first:
    # that one wait, carried, is counted once (as in `stragglers_steps`), so `samples` counts the
    # collectives that are waits of their own. (Where a collective blocks, the others cannot reach the
    # next one before the late rank reached it: each such row counts.)
    last_count = dict.fromkeys(ranks, 0)
    last_rows: dict[int, list[int]] = {r: [] for r in ranks}  # the rows (waits of their own) each was last at
    previous: tuple[int, int] | None = None  # the last rank of the row before, and its arrival there
    samples = 0
    apart = 0  # the collectives not reached by every rank at once
    for row, times in enumerate(arrived.rows):
        latest = max(times)
        ties = times.count(latest)
        if ties > 1:
            # no one rank came last (credited to the higher rank, a tie made it last at every lockstep one)
            previous = None
            if ties < len(times):
                samples += 1
                apart += 1
            continue
        apart += 1
        at = times.index(latest)
        if previous is not None and previous[0] == at and max(times[:at] + times[at + 1:]) < previous[1]:
            continue
        previous = (at, times[at])
        last_count[ranks[at]] += 1
        last_rows[ranks[at]].append(row)
        samples += 1
    # The worst rank arrived last most often (then: latest by median); below LAST_SHARE nobody
    # qualifies, so only the ranks with the top count need their lateness.
    top = max(last_count.values())
    if samples < MIN_SAMPLES or top / samples < LAST_SHARE:
        # No rank is last alone that often; a few ranks may be, together (a slow node whose ranks take
        # turns at being the very last).
        return _late_together_finding(ctx, ref, tracks, arrived, handoffs)
    # The middle arrival of two ranks is the later one: with two, lateness is measured from the other.
    mids = middles(arrived, upper_middle if len(ranks) > 2 else min)
    lateness = {r: lateness_ms(arrived, r, mids) for r in ranks if last_count[r] == top}
    worst = max(lateness, key=lambda r: (last_count[r], median(lateness[r])))
    late_ms = median(lateness[worst])
    share = last_count[worst] / samples
    if share < LAST_SHARE:
        return None
    if late_ms < ctx.options.clock_skew_ms:
        # Not late as one rank, measured from the group's middle: where half the group is late together that
        # middle is one of the late (a node of two in a group of four); the set is judged from the others.
        return _late_together_finding(ctx, ref, tracks, arrived, handoffs)
    # Unbiased jitter makes each rank last 1/n of the time: with few ranks (two: half the time) a share
    # over LAST_SHARE happens by chance, so the count must also be beyond chance (all ranks together).
    chance = binomial_tail(last_count[worst], samples, 1 / len(ranks)) * len(ranks)
    if chance >= ALPHA and not (chance < ALPHA_STEADY and _steady_offset(ctx, worst, lateness[worst], late_ms)):
        # As one rank, within chance: a slow node's ranks taking turns at being last (one of them a little
        # more often) are judged as the set they are, whose being late together chance explains far less.
        return _late_together_finding(ctx, ref, tracks, arrived, handoffs)
    # Worth a finding only where the others' waits for it cost the job a share of its time (`costly`): a
    # rank last at 9 of 9 steps of 1.5 s by 20 ms of compute jitter is a coin toss that came up nine times.
    if not costly(arrived, [max(0.0, lateness[worst][i]) for i in last_rows[worst]]):
        return None
    # Its lateness passed on from a rank that released it late (principle 1, `waited`): that rank is the
    # straggler, found where the wait began.
    handoffs = handoffs or Handoffs(ctx)
    last_at = [seq for seq, times in zip(arrived.seqs, arrived.rows, strict=True)
               if ranks[len(times) - 1 - times[::-1].index(max(times))] == worst]
    if _passed_on(handoffs, worst, ref.name, last_at, late_ms / 2, [r for r in ranks if r != worst]):
        return None
    waited = {r: durations_ms(arrived, tracks[r]) for r in ranks}
    evidence = [
        f"rank {worst} arrived last at {last_count[worst]} of the {samples} most recent completed collectives of "
        f"{ref.label()}, {late_ms:.0f} ms after the median rank (median over those collectives)",
        f"lateness under {ctx.options.clock_skew_ms:.0f} ms is ignored as possible clock skew between hosts",
    ]
    if waited[worst] and all(waited[r] for r in ranks):
        # Totals, not medians: a slow step delays one collective per step on NCCL (the ops queued behind it
        # then run back to back), so most durations are the transfer alone on every rank.
        mine = sum(waited[worst])
        others = median(sum(waited[r]) for r in ranks if r != worst)
        if mine >= others:
            return None  # it did not make the others wait: a clock offset, not a straggler
        evidence.append(
            f"its collectives took {mine:.1f} ms in all while the others' took {others:.1f} ms (median rank): "
            "they waited for it"
        )
    node, together, node_at = late_together(arrived, worst, apart)
    node = tuple(r for r in node if r == worst
                 or not _passed_on(handoffs, r, ref.name, node_at, late_ms / 2, [q for q in ranks if q not in node]))
    if len(node) > 1:
        evidence.insert(1, f"{plural([r for r in node if r != worst])} arrived with it, after every other rank, at "
                           f"{together} of the {samples} collectives: one host's ranks late together (a slow node)")
    names = plural(list(node))
    together_words = " together (one host's ranks: a slow node)" if len(node) > 1 else ""
    finding = Finding(
        category=Category.STRAGGLER,
        culprit_ranks=node,
        process_group=ref,
        summary=(
            f"{names.capitalize()} {'reaches' if len(node) == 1 else 'reach'} the collectives of {ref.label()} late"
            f"{together_words}: by {late_ms:.0f} ms (median) at {last_count[worst]} of {samples} collectives; every "
            "other rank waits for "
            f"{'it' if len(node) == 1 else 'them'}."
        ),
        late_by_ms=late_ms,
        evidence=evidence,
    )
    _show(ctx, finding, ref, tracks, node, (worst,), hi)
    return finding


def _late_together_finding(ctx: Context, ref: GroupRef, tracks: dict[int, Track], arrived: Arrivals,
                           handoffs: Handoffs | None) -> Finding | None:
    """The finding for ranks late together (`_late_set`), less those whose lateness another rank passed
    on to them (principle 1); None where fewer than two are left."""
    found = _late_set(ctx, arrived)
    if found is None:
        return None
    late_set, count, late_ms, late_at = found
    rest = [r for r in arrived.ranks if r not in late_set]
    own = tuple(r for r in late_set
                if not _passed_on(handoffs or Handoffs(ctx), r, ref.name, late_at, late_ms / 2, rest))
    return _set_finding(ctx, ref, tracks, arrived, own, count, late_ms) if len(own) > 1 else None


def _show(ctx: Context, finding: Finding, ref: GroupRef, tracks: dict[int, Track], ranks: tuple[int, ...],
          framed: tuple[int, ...], seq: int) -> None:
    """The culprits' views and live stacks, and where `framed` ranks enqueued collective `seq` from."""
    for rank in ranks[: ctx.options.max_rank_views]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
        stack = ctx.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack
    for rank in framed:
        last = tracks[rank].by_seq.get(seq)
        if last and last[0].frames:
            finding.culprit_frames[rank] = last[0].frames
            finding.op = last[0].op
            finding.collective_seq_id = seq


def _late_set(ctx: Context, arrived: Arrivals) -> tuple[tuple[int, ...], int, float, list[int]] | None:
    """Ranks late together: at each collective the late set is the ranks after the widest gap among the
    latest arrivals (at most `MAX_SET`, at most half the group); a set of two or more that is the late set
    at `LAST_SHARE` of the collectives, apart from the rest by more than the clock skew, beyond chance
    (1 in C(n, k) per collective for k ranks), is one cause: a slow node delays all of its ranks at once,
    and then each is last only about 1/k of the time, so no single rank is. A late set's one wait carried
    to the next collectives it enqueued (the others reached them before it had reached the one before, as
    `find_straggler` counts a rank's) is one sample, not one per collective. (set, count, median ms late,
    the collectives where it was late.)"""
    ranks = arrived.ranks
    most = min(MAX_SET, len(ranks) // 2)
    if most < 2:
        return None
    skew_ns = ctx.options.clock_skew_ms * 1e6
    counts: dict[tuple[int, ...], int] = {}
    where: dict[tuple[int, ...], list[int]] = {}
    rows: dict[tuple[int, ...], list[int]] = {}
    samples = 0
    previous: tuple[tuple[int, ...], int] | None = None  # the late set of the row before, its earliest arrival
    for row, (seq, times) in enumerate(zip(arrived.seqs, arrived.rows, strict=True)):
        top = nlargest(most + 1, zip(times, ranks, strict=True))
        gaps = [top[i][0] - top[i + 1][0] for i in range(len(top) - 1)]
        widest = max(range(len(gaps)), key=lambda i: (gaps[i], -i))
        late = tuple(sorted(r for _, r in top[: widest + 1]))
        if previous is not None and previous[0] == late and top[widest + 1][0] < previous[1]:
            continue  # the same wait, carried
        samples += 1
        previous = (late, top[widest][0])
        if widest >= 1 and gaps[widest] > skew_ns:
            counts[late] = counts.get(late, 0) + 1
            where.setdefault(late, []).append(seq)
            rows.setdefault(late, []).append(row)
    if not counts or samples < MIN_SAMPLES:
        return None
    late_set = max(counts, key=lambda s: (counts[s], -len(s)))
    count = counts[late_set]
    if count / samples < LAST_SHARE:
        return None
    sets = comb(len(ranks), len(late_set))
    if binomial_tail(count, samples, 1 / sets) * sets >= ALPHA:
        return None
    # measured from the middle of the other ranks: with half the group late together the group's own
    # middle is one of them (late by nothing)
    rest = [i for i, r in enumerate(ranks) if r not in late_set]
    mids = [upper_middle([row[i] for i in rest]) for row in arrived.rows]
    together = [min(row) for row in zip(*(lateness_ms(arrived, r, mids) for r in late_set), strict=True)]
    if not costly(arrived, (max(0.0, together[i]) for i in rows[late_set])):
        return None  # the others lost a small share of their time waiting for the set (`costly`)
    return late_set, count, median(together), where[late_set]


def _set_finding(ctx: Context, ref: GroupRef, tracks: dict[int, Track], arrived: Arrivals, late_set: tuple[int, ...],
                 count: int, late_ms: float) -> Finding | None:
    samples = len(arrived)
    others = [r for r in arrived.ranks if r not in late_set]
    waited = {r: sum(durations_ms(arrived, tracks[r])) for r in arrived.ranks}
    evidence = [
        f"{plural(list(late_set))} arrived last together, after every other rank, at {count} of the {samples} most "
        f"recent completed collectives of {ref.label()}, {late_ms:.0f} ms after the median rank (median)",
        f"lateness under {ctx.options.clock_skew_ms:.0f} ms is ignored as possible clock skew between hosts",
    ]
    if all(durations_ms(arrived, tracks[r]) for r in arrived.ranks):
        mine, theirs = max(waited[r] for r in late_set), median(waited[r] for r in others)
        if mine >= theirs:
            return None  # they did not make the others wait: a clock offset, not stragglers
        evidence.append(f"their collectives took {mine:.1f} ms in all at most while the others' took {theirs:.1f} ms "
                        "(median rank): the others waited for them")
    node = " (one host's ranks: a slow node)" if late_set[-1] - late_set[0] == len(late_set) - 1 else ""
    finding = Finding(
        category=Category.STRAGGLER,
        culprit_ranks=late_set,
        process_group=ref,
        summary=(
            f"{plural(list(late_set)).capitalize()} reach the collectives of {ref.label()} late together{node}: by "
            f"{late_ms:.0f} ms (median) at {count} of {samples} collectives; every other rank waits for them."
        ),
        late_by_ms=late_ms,
        evidence=evidence,
    )
    _show(ctx, finding, ref, tracks, late_set, late_set[: ctx.options.max_rank_views], arrived.seqs[-1])
    return finding
