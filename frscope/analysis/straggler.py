"""Stragglers: a rank that reaches collectives consistently later than its peers.

Creation times of the same collective_seq_id on different ranks show who arrived last. Different
hosts' clocks differ by their skew, so lateness under `clock_skew_ms` never counts; where NCCL
recorded durations, the straggler's own duration must also be the shortest (the others waited for
it), which a constant clock offset cannot fake.
"""

from __future__ import annotations

from statistics import median

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.tracks import Track
from frscope.analysis.wording import plural

SAMPLE = 200  # the most recent collectives per group are enough, and keep this linear and cheap
MIN_SAMPLES = 5
LAST_SHARE = 0.6  # last to arrive in at least this share of the sampled collectives


def find_straggler(ctx: Context, ref: GroupRef, tracks: dict[int, Track]) -> Finding | None:
    ranks = sorted(r for r, t in tracks.items() if t.by_seq)
    if len(ranks) < 2:
        return None
    lo = max(tracks[r].first_seq for r in ranks)
    hi = min(tracks[r].last_completed for r in ranks)
    if hi - lo + 1 < MIN_SAMPLES:
        return None
    last_count = dict.fromkeys(ranks, 0)
    lateness: dict[int, list[float]] = {r: [] for r in ranks}
    waited: dict[int, list[float]] = {r: [] for r in ranks}
    samples = 0
    for seq in range(max(lo, hi - SAMPLE + 1), hi + 1):
        times: list[tuple[int, int]] = []
        for rank in ranks:
            bucket = tracks[rank].by_seq.get(seq)
            if not bucket or not bucket[0].time_created_ns:
                break
            times.append((bucket[0].time_created_ns, rank))
            if bucket[0].duration_ms is not None:
                waited[rank].append(bucket[0].duration_ms)
        else:
            samples += 1
            times.sort()
            mid = times[len(times) // 2][0]
            last_count[times[-1][1]] += 1
            for created, rank in times:
                lateness[rank].append((created - mid) / 1e6)
    if samples < MIN_SAMPLES:
        return None
    worst = max(ranks, key=lambda r: (last_count[r], median(lateness[r])))
    late_ms = median(lateness[worst])
    share = last_count[worst] / samples
    if share < LAST_SHARE or late_ms < ctx.options.clock_skew_ms:
        return None
    evidence = [
        f"rank {worst} arrived last at {last_count[worst]} of the {samples} most recent completed collectives of "
        f"{ref.label()}, {late_ms:.0f} ms after the median rank (median over those collectives)",
        f"lateness under {ctx.options.clock_skew_ms:.0f} ms is ignored as possible clock skew between hosts",
    ]
    if waited[worst] and all(waited[r] for r in ranks):
        mine = median(waited[worst])
        others = median(median(waited[r]) for r in ranks if r != worst)
        if mine >= others:
            return None  # it did not make the others wait: a clock offset, not a straggler
        evidence.append(
            f"its collectives took {mine:.1f} ms (median) while the others' took {others:.1f} ms: they waited for it"
        )
    finding = Finding(
        category=Category.STRAGGLER,
        culprit_ranks=(worst,),
        process_group=ref,
        summary=(
            f"{plural([worst]).capitalize()} reaches the collectives of {ref.label()} late: by {late_ms:.0f} ms "
            f"(median) at {last_count[worst]} of {samples} collectives; every other rank waits for it."
        ),
        late_by_ms=late_ms,
        evidence=evidence,
    )
    finding.ranks[worst] = ctx.rank_view(worst, ref.name, None)
    stack = ctx.live_stack(worst)
    if stack:
        finding.culprit_stacks[worst] = stack
    last = tracks[worst].by_seq.get(hi)
    if last and last[0].frames:
        finding.culprit_frames[worst] = last[0].frames
        finding.op = last[0].op
        finding.collective_seq_id = hi
    return finding
