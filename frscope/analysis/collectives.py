"""Who holds a stuck group, and why: the hang finding at the collective it stands still in.

At the stuck point (`stuck.stuck_point`): members that never entered it are RankNotJoined, named through
the wait-for model (`waitfor`: the culprits are the ranks that wait on nobody, not those blocked
elsewhere on others); an odd side that called one collective more than idle peers is named as such;
where every member entered and some never finished, NotCompleted (or a SizeMismatch where an all_to_all
with one side's odd counts never finished anywhere).
"""

from __future__ import annotations

from collections import Counter

from frscope.analysis.context import Context
from frscope.analysis.crossgroup import behind_on_kind, family_kind, skipped_kind
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.mismatch import Bucket, add_views, odd_exchange, odd_exchange_finding
from frscope.analysis.stuck import StuckPoint, stuck_finding
from frscope.analysis.tracks import Track, oldest_open
from frscope.analysis.waitfor import State
from frscope.analysis.wording import fmt_duration, fmt_ranks, plural
from frscope.records import COMPLETED, STARTED, Entry, GroupInfo


def _called_more(ctx: Context, group: GroupInfo, point: StuckPoint) -> bool:
    """The ranks blocked here are fewer than the members that never entered it, and those are idle: every
    op they recorded finished, in every group. The odd side is the one in the collective: it called one
    more than its peers (uneven data: a rank with more batches runs one more step), not a majority of
    ranks that all stopped at the same point."""
    if any(r not in ctx.dumpset.dumps for r in group.ranks):
        return False  # a member left no dump: its count is unknown, and a rank gone is no idle peer
    if set(point.not_joined) & ctx.gone_ranks():
        return False  # a process that went away is no idle peer: it stopped short
    idle = []
    for rank in point.not_joined:
        dump = ctx.dumpset.dumps.get(rank)
        if dump is None or not len(dump.entries):
            return False
        wait = ctx.waits.of(rank)
        if wait.open:
            on = ctx.waits.named_waits(rank)
            if on and on <= set(point.joined):
                # blocked elsewhere (another group's collective, a p2p op or batch) on the ranks in this
                # collective: it waits on them, no evidence either way
                continue
            return False
        if wait.inside is not None and wait.inside != "monitored_barrier":
            # waiting in an op the recorder does not keep (gloo's send/recv) for a peer it does not name (maybe
            # a rank in this collective): not idle, and no evidence either way
            continue
        idle.append(rank)
        # (in monitored_barrier it went on to the barrier, which waits for every member not in it: the ranks
        # blocked here)
    return len(_went_further(ctx, point.joined, idle)) < len(idle)


def _went_further(ctx: Context, joined: list[int], idle: list[int]) -> set[int]:
    """The ranks that called more than the idle ones, counted over the job, not this group alone: those in
    the collective, and every rank blocked elsewhere whose waits reach an idle rank other than through them
    (it entered a collective an idle rank never did: in a grid the other groups went on to the step the idle
    ranks never began; a rank that waits on the ones in the collective says nothing of the idle ones).
    Every rank runs one program, so the odd side is the smaller of the two (principle 1)."""
    targets, through = frozenset(idle), frozenset(joined)
    further = set(joined)
    for rank in ctx.dumpset.dumps:
        if rank not in further and rank not in targets and ctx.waits.of(rank).open \
                and ctx.waits.reaches([rank], targets, avoiding=through):
            further.add(rank)
    return further


def _extra_call_finding(ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track], point: StuckPoint,
                        buckets: dict[int, Bucket], op: str, since: str, sample: Entry | None) -> Finding:
    seq, culprits = point.seq, point.joined
    idle = [r for r in point.not_joined
            if (d := ctx.dumpset.dumps.get(r)) is not None and oldest_open(d.entries) is None
            and ctx.waits.of(r).inside in (None, "monitored_barrier")]
    in_unrecorded = [r for r in point.not_joined if r not in idle and ctx.waits.of(r).state is State.IN_UNRECORDED]
    waiting = [r for r in point.not_joined if r not in idle and r not in in_unrecorded]
    last = {tracks[r].last_seq for r in idle}
    where = f"#{last.pop()}" if len(last) == 1 else "their last collective"
    summary = (
        f"{plural(culprits).capitalize()} called {op} #{seq} of {ref.label()}, which {plural(idle)} never called: "
        f"{'it has' if len(culprits) == 1 else 'they have'} been blocked in it{since}, while the others finished "
        f"everything they enqueued (idle after {where}); {'it' if len(culprits) == 1 else 'they'} ran one collective "
        "more than the rest of the group (e.g. more batches of uneven data)."
    )
    finding = stuck_finding(Category.RANK_NOT_JOINED, culprits, ref, summary, seq, op, sample, point)
    finding.evidence.append(
        f"{plural(idle)} ({len(idle)} of the group's {sum(r in ctx.dumpset.dumps for r in group.ranks)} ranks with "
        "a recorder) "
        f"recorded nothing open in any group: the odd side is the {len(culprits)} in #{seq}")
    if waiting:
        finding.evidence.append(f"{plural(waiting)} never called it either, blocked in another op (another group's "
                                f"collective, or a point-to-point op or batch) that waits on {plural(culprits)}")
    if in_unrecorded:
        finding.evidence.append(f"{plural(in_unrecorded)} never called it either, waiting in a point-to-point op the "
                                "recorder does not keep (live stack), for a peer it does not name")
    add_views(ctx, finding, group.name, buckets, culprits, idle)
    return finding


def _unseen_member_finding(ctx: Context, group: GroupInfo, ref: GroupRef, point: StuckPoint,
                           buckets: dict[int, Bucket], unseen: list[int], sinks: bool, op: str, since: str,
                           sample: Entry | None) -> Finding:
    """Every member the entries show is in the collective on gloo and none finished it: they wait on a
    member the evidence does not show, and the wait can only end at the ranks that wait on nobody and
    recorded nothing of the group (`sinks`), or, where every such rank waits elsewhere, at whatever those
    wait on (the root-cause walk follows them)."""
    seq, joined = point.seq, point.joined
    first = unseen[0]
    doing = ctx.activity(first)
    summary = (
        f"{plural(unseen).capitalize()} never joined {op} #{seq} of {ref.label()}, which {plural(joined)} "
        f"{'has' if len(joined) == 1 else 'have'} been blocked in{since}"
        f"{f'; rank {first} is {doing}' if doing else ''}: the group's entries show no other member, and a gloo "
        f"collective every member entered completes, so {'it is' if len(unseen) == 1 else 'one of them is'} "
        "the member that never came."
    )
    finding = stuck_finding(Category.RANK_NOT_JOINED, unseen, ref, summary, seq, op, sample, point)
    finding.ambiguous = len(unseen) > 1
    if finding.ambiguous:
        finding.would_decide = ("the group's member list (NCCL's pg_config names it; gloo's names none for a "
                                "new_group), or the candidates' live stacks")
    finding.evidence.append(
        f"the group's members are known only from its entries ({plural(joined)}; gloo's pg_config names none), "
        f"every one of them entered #{seq} and none finished it: they wait on a member that never entered")
    finding.evidence.append(
        f"{plural(unseen)} recorded nothing of {ref.label()} and wait{'s' if len(unseen) == 1 else ''} on nobody: "
        "the only ranks where that wait can end (what would decide: the group's member list, or the rank's "
        "live stack at the call that should have entered it)" if sinks else
        f"{plural(unseen)} recorded nothing of {ref.label()} and each waits elsewhere: the member that never came "
        "is among them, and the wait goes on where theirs does")
    ruled_out = [r for r in sorted(ctx.dumpset.dumps) if r not in unseen and r not in ctx.tracks.get(group.name, {})
                 and ctx.waits.of(r).sink]
    if ruled_out:
        finding.evidence.append(
            f"{plural(ruled_out)} also wait{'s' if len(ruled_out) == 1 else ''} on nobody, but number "
            f"{'its' if len(ruled_out) == 1 else 'their'} groups without a gap (pg_status) and recorded in a group "
            f"created after {ref.label()}: no member of it")
    for rank in unseen[: ctx.options.max_rank_views]:
        ctx.show_culprit(finding, rank, group.name, None)
    for rank in joined[:3]:
        bucket = buckets.get(rank)
        finding.ranks[rank] = ctx.rank_view(rank, group.name, bucket[0] if bucket else None, call_site=False)
    return finding


def hang_finding(
    ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track], point: StuckPoint
) -> Finding | None:
    """RankNotJoined or NotCompleted at the stuck point; None when the group is merely busy."""
    if not point.stalled:
        return None
    seq = point.seq
    buckets = {r: b for r in point.joined if (b := tracks[r].by_seq.get(seq))}
    sample = next(iter(buckets.values()))[0] if buckets else None
    op = sample.op if sample else "collective"
    since = (f" for {fmt_duration(point.age_s)}" if point.age_s is not None
             else " (for how long is unknown: the capture time is lost)" if point.age_source else "")
    if point.not_joined and _called_more(ctx, group, point):
        return _extra_call_finding(ctx, group, ref, tracks, point, buckets, op, since, sample)
    if point.not_joined:
        # Named from the recorders current at `seq`; those read before the group's later collectives only
        # where no current one is left (`StuckPoint.behind`).
        current = [r for r in point.not_joined if r not in point.behind] or point.not_joined
        unknown = [r for r in point.not_joined if r not in current]
        culprits, in_p2p = ctx.waits.sinks_among(current)
        first = culprits[0]
        doing = ctx.activity(first)
        doing_text = f"; rank {first} is {doing}" if doing else ""
        summary = (
            f"{plural(culprits).capitalize()} never joined {op} #{seq} of {ref.label()}, which "
            f"{plural(point.joined)} {'has' if len(point.joined) == 1 else 'have'} been blocked in{since}{doing_text}."
        )
        finding = stuck_finding(Category.RANK_NOT_JOINED, culprits, ref, summary, seq, op, sample, point)
        for rank in culprits[: ctx.options.max_rank_views]:
            track = tracks[rank]
            last = track.by_seq.get(track.last_seq)
            ctx.show_culprit(finding, rank, group.name, last[0] if last else None)
            finding.evidence.append(
                f"rank {rank}: last entered #{track.last_seq} of {ref.label()}"
                + (f", now {finding.ranks[rank].activity}" if finding.ranks[rank].activity else "")
            )
        for rank in point.joined[:3]:
            bucket = buckets.get(rank)
            finding.ranks[rank] = ctx.rank_view(rank, group.name, bucket[0] if bucket else None, call_site=False)
        if len(culprits) > 1 and not in_p2p and ctx.waits.hidden_p2p(culprits):
            # Several idle ranks, and neither recorder nor stack would show one waiting on another in a
            # send/recv (gloo records none): all stuck, or one stuck and the rest waiting on it.
            finding.ambiguous = True
            finding.would_decide = ("the candidates' live stacks (a sidecar snapshot): they show who waits in a "
                                    "send/recv")
            finding.evidence.append(
                f"{plural(culprits)} show nothing open, and this backend records no point-to-point op: one may "
                "wait on another in a send/recv (live stacks would tell)")
        for rank in unknown[:3]:
            missing = tracks[rank].last_seq + 1
            finding.evidence.append(
                f"rank {rank}'s recorder ends at #{tracks[rank].last_seq} of {ref.label()}, yet every other member "
                f"finished #{missing} and went on: it took part, and its recorder was read before; whether it "
                f"joined #{seq} is unknown")
        if in_p2p:
            finding.evidence.append(
                f"{plural(in_p2p)} never joined either, blocked in an op that waits on another rank (a "
                "point-to-point op whose peer the recorder does not name or does not record, or an earlier "
                f"collective that members never entered); {plural(culprits)} wait{'s' if len(culprits) == 1 else ''} "
                "on nobody")
        return finding

    # Everyone entered it. Which ranks did not finish it, and did their device even start it?
    not_done = sorted(r for r, b in buckets.items() if not all(e.completed for e in b))
    if not not_done:
        return None
    if ctx.waits.unseen_member_holds(group.name, seq):
        unseen, sinks = ctx.waits.unseen_member_candidates(group.name)
        # (a group's kind is its description, read only where a family of groups shares it)
        kind = family_kind(ctx, group.name)
        if not sinks and len(unseen) > 1 and kind is not None:
            # Each candidate waits elsewhere, on ranks that wait here: a cycle. Its culprit is the rank
            # whose own order differs from its peers' (it went on where they issued this group's kind),
            # never the ranks that kept the common order (principle 1).
            broke = [r for r in unseen if skipped_kind(ctx, r) == kind]
            if broke and len(broke) < len(unseen):
                finding = _unseen_member_finding(ctx, group, ref, point, buckets, broke, sinks, op, since, sample)
                kept_ranks = [r for r in unseen if r not in broke]
                own = "its" if len(broke) == 1 else "their"
                finding.evidence.append(
                    f"{plural(broke)} went on to another group where most ranks issued a collective of {kind} "
                    f"first: {own} own order differs from {own} peers'; the other {plural(kept_ranks)} "
                    f"that recorded nothing of {ref.label()} kept the common order")
                return finding
        behind = behind_on_kind(ctx, group.name, unseen) if kind is not None else unseen
        if 0 < len(behind) < len(unseen):
            # Principle 1, by counts: the ranks that issued as many collectives of this group's kind as its
            # members ran their own group's where the members ran this one; the member that never came is
            # among those that issued fewer.
            finding = _unseen_member_finding(ctx, group, ref, point, buckets, behind, sinks, op, since, sample)
            even = [r for r in unseen if r not in behind]
            finding.evidence.append(
                f"{plural(even)} issued as many collectives of {kind} as the group's members "
                f"(their own group's, where the members ran this one); only {plural(behind)} issued fewer")
            return finding
        if unseen:
            return _unseen_member_finding(ctx, group, ref, point, buckets, unseen, sinks, op, since, sample)
    odd = odd_exchange(buckets) if len(not_done) == len(buckets) else None
    if odd is not None:
        return odd_exchange_finding(ctx, group.name, ref, buckets, odd, seq, op, since, point)
    states = {r: buckets[r][0].state for r in not_done}
    started = [r for r, s in states.items() if s == STARTED]
    scheduled = [r for r, s in states.items() if s not in (STARTED, COMPLETED)]
    culprits = not_done
    detail = ""
    if started and scheduled:
        # NCCL: the device of 'scheduled' ranks never reached the kernel; their stream is busy elsewhere.
        culprits = scheduled
        detail = (
            f" {plural(scheduled).capitalize()} never started it on the device (still 'scheduled' while "
            f"{plural(started)} started): their GPU stream is busy with earlier work."
        )
    elif started:
        detail = " It started on every rank's device and never finished: suspect the GPU, NCCL or the network."
    else:
        detail = " The recorder has no device-side state here (gloo): suspect the network or a rank's transport."
    summary = (
        f"Every rank of {ref.label()} entered {op} #{seq} and {plural(not_done)} never completed it{since}.{detail}"
    )
    finding = stuck_finding(Category.NOT_COMPLETED, culprits, ref, summary, seq, op, sample, point)
    add_views(ctx, finding, group.name, buckets, culprits, sorted(set(buckets) - set(culprits)))
    durations = [b[0].duration_ms for b in buckets.values() if b[0].duration_ms]
    if durations:
        finding.evidence.append(f"recorded durations so far: up to {max(durations):.0f} ms")
    finding.evidence.append(f"states: {dict(Counter(states.values()))} over {plural(not_done)}")
    if fmt_ranks(culprits) != fmt_ranks(not_done):
        finding.evidence.append(f"not completed on {plural(not_done)}")
    return finding
