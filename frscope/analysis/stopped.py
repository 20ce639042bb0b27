"""Findings for ranks that stopped: a stale rank's `RankStopped` (from `stale.stale_ranks`), the crash
signature of ranks with no dump beside survivors that stopped together, and ranks that finished the
collective the others wait in and then failed (the runner's exit codes)."""

from __future__ import annotations

from collections.abc import Mapping

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef, sizes_of
from frscope.analysis.stale import Stale, ended_quiet
from frscope.analysis.stuck import StuckPoint
from frscope.analysis.tracks import Track
from frscope.analysis.wording import fmt_duration, plural
from frscope.records import RankExit
from frscope.records.exits import most_likely_first


def _exit_text(exit: RankExit | None) -> str:
    return f"; its process {exit.describe()}" if exit is not None else ""


def stopped_finding(ctx: Context, ref: GroupRef, tracks: dict[int, Track], stale: dict[int, Stale],
                    point: StuckPoint | None, exits: Mapping[int, RankExit]) -> Finding:
    """One finding for the group's stale ranks; `point` is where the others stand (stale ranks left out)."""
    ranks = sorted(stale)
    first = stale[ranks[0]]
    others = sorted(set(tracks) - set(ranks))
    seq = first.last_seq + 1
    sample = next((b[0] for r in others if (b := tracks[r].by_seq.get(seq))), None)
    op = sample.op if sample else "collective"
    older = ""
    stale_by = None
    if first.newest_ns and first.others_newest_ns and first.others_newest_ns > first.newest_ns:
        stale_by = (first.others_newest_ns - first.newest_ns) / 1e9
        older = f" Its newest entry is {fmt_duration(stale_by)} older than the other ranks' newest."
    where = ""
    if point is not None and point.joined:
        waited = f" for {fmt_duration(point.age_s)}" if point.age_s is not None else ""
        where = f" The others now stand at #{point.seq}{waited}."
    exit_text = _exit_text(exits.get(ranks[0]))
    ends = f"ends at #{first.last_seq} of {ref.label()}" if first.last_seq else f"holds nothing of {ref.label()}"
    if first.pending:
        ends = f"still shows #{seq} of {ref.label()} pending"
    # Say what is unknown: nobody waits, a failed collective looks finished, and when each dump was taken is lost.
    unsure = all(ctx.clock.lost(r) for r in ranks) and not any(r in exits for r in ranks) and ended_quiet(ctx)
    if first.pending and first.done_seq < seq:
        summary = (
            f"{plural(ranks).capitalize()} stopped{exit_text}: {'its' if len(ranks) == 1 else 'their'} recorder "
            f"shows {op} #{seq} of {ref.label()} pending, which every member entered and none finished: the "
            f"others wait for a rank that is gone, not for the device or the network.{older}{where}"
        )
    elif first.done_seq >= seq and unsure:
        summary = (
            f"{plural(ranks).capitalize()} stopped early, or the job ended and "
            f"{'its dump is' if len(ranks) == 1 else 'their dumps are'} only older: "
            f"{'its' if len(ranks) == 1 else 'their'} recorder {ends}, yet {plural(others)} finished {op} #{seq}"
            f"{f'-#{first.done_seq}' if first.done_seq > seq else ''}, which needs every member, and every recorder "
            "shows all it enqueued finished. This backend retires a collective that failed (a peer gone) as if it "
            "had finished and when each dump was taken is lost: either the rank stopped after its dump and the "
            "others' last collectives failed for want of it, or nothing hung; the exit codes decide."
            f"{older}"
        )
    elif first.done_seq >= seq:
        summary = (
            f"{plural(ranks).capitalize()} stopped early: {'its' if len(ranks) == 1 else 'their'} recorder {ends}, "
            f"yet {plural(others)} finished {op} #{seq}"
            f"{f'-#{first.done_seq}' if first.done_seq > seq else ''}, which needs every member: the dump is stale "
            f"(taken before), and the rank stopped after that (crashed, killed, or its dump was never refreshed)"
            f"{exit_text}.{older}{where}"
        )
    else:
        summary = (
            f"{plural(ranks).capitalize()} stopped early{exit_text}: {'its' if len(ranks) == 1 else 'their'} "
            f"recorder {ends}, and {plural(others)} went on to {op} #{seq} "
            f"without it.{older}{where}"
        )
    finding = Finding(
        category=Category.RANK_STOPPED,
        culprit_ranks=tuple(ranks),
        process_group=ref,
        summary=summary,
        collective_seq_id=seq,
        op=op,
        **sizes_of(sample),
        since_ns=first.newest_ns,
        last_seen_ns=first.newest_ns,
        stale_by_s=stale_by,
    )
    if point is not None and point.joined:
        finding.stalled_for_s = point.age_s
        finding.age_source = point.age_source
    for rank in ranks[: ctx.options.max_rank_views]:
        info = stale[rank]
        last = tracks[rank].by_seq.get(info.last_seq)
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, last[0] if last else None)
        stack = ctx.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack
        finding.evidence.append(
            f"rank {rank}: recorder "
            + (f"shows #{info.last_seq + 1} pending" if info.pending
               else f"ends at #{info.last_seq}" if info.last_seq else "holds nothing")
            + f" of {ref.label()}; every other member finished "
            f"up to #{info.done_seq}"
        )
    if first.beside:
        finding.evidence.append(
            f"the ranks the blocked ones wait on are idle right after a collective shared with rank {ranks[0]} that "
            f"its recorder lacks: this backend retires a collective that failed as finished, so either it failed "
            f"for want of rank {ranks[0]} (read: stopped) or those ranks stopped right after it; one cause for all "
            f"is rank {ranks[0]} (the exit codes or live stacks decide)")
    for rank in others[:3]:
        bucket = tracks[rank].by_seq.get(seq)
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, bucket[0] if bucket else None, call_site=False)
    return finding


def crash_signature(ctx: Context, missing: tuple[int, ...]) -> tuple[GroupRef, int, str, list[int]] | None:
    """A group with missing members whose every rank with a dump stopped at the same finished seq:
    (group, seq, op, survivors). The group with the most survivors wins."""
    best: tuple[GroupRef, int, str, list[int]] | None = None
    for name, group in ctx.dumpset.groups.items():
        if group.membership_source == "entries" or not set(missing) & set(group.ranks):
            continue
        tracks = ctx.tracks.get(name, {})
        survivors = sorted(r for r in group.ranks if r in tracks and tracks[r].by_seq)
        if not survivors or len(survivors) + len(set(missing) & set(group.ranks)) != len(group.ranks):
            continue
        lasts = {tracks[r].last_seq for r in survivors}
        if len(lasts) != 1:
            continue
        seq = lasts.pop()
        if any(tracks[r].last_completed != seq for r in survivors):
            continue  # someone still waits there: that is the waiting case, told by MissingDumps
        op = tracks[survivors[0]].by_seq[seq][0].op
        if best is None or len(survivors) > len(best[3]):
            best = (GroupRef(name, group.desc, group.ranks), seq, op, survivors)
    return best


def finished_then_failed(tracks: dict[int, Track], ref: GroupRef, seq: int, waiting: tuple[int, ...],
                         exits: Mapping[int, RankExit], failed_without_dump: tuple[int, ...] = ()) -> list[int] | None:
    """The members that finished `seq` (which `waiting` never completed) and whose process then failed,
    likeliest first failure first; None when there are none, or when the likeliest first failure is a
    member without a dump."""
    if any(r not in tracks or not tracks[r].by_seq for r in ref.ranks):
        # A member left no record at all (killed before any dump): that peer is the one gone, and the
        # ranks that finished and then failed are the aftermath (their watchdog), not the cause.
        return None
    gone = sorted(r for r, t in tracks.items() if r not in waiting and t.last_completed >= seq
                  and (e := exits.get(r)) is not None and e.failed)
    if not gone:
        return None
    culprits = most_likely_first([*gone, *failed_without_dump], exits)
    return culprits if set(culprits) <= set(gone) else None


def left_after_finishing(ctx: Context, ref: GroupRef, tracks: dict[int, Track], point: StuckPoint,
                         waiting: tuple[int, ...], exits: Mapping[int, RankExit],
                         failed_without_dump: tuple[int, ...] = ()) -> Finding | None:
    """Ranks that finished the collective the others still wait in, and whose process then failed (the
    runner's word): the others wait for a peer that is gone, not for the network. With gloo, a rank that
    completes an all_reduce and dies cuts the ring before its last sends reach the others (its recorder
    shows the collective completed, its peers' do not). The
    launcher's first failure (torchrun's root cause) is the culprit when it names one. None when the
    likeliest first failure is a member without a dump (`failed_without_dump`): the missing-dump
    reasoning names that one (a rank that finished and then failed may be a victim whose error blames a
    peer that raised and left an empty recorder)."""
    seq = point.seq
    culprits = finished_then_failed(tracks, ref, seq, waiting, exits, failed_without_dump)
    if culprits is None:
        return None
    gone = sorted(r for r, t in tracks.items() if r not in waiting and t.last_completed >= seq
                  and (e := exits.get(r)) is not None and e.failed)
    sample = next((b[0] for r in waiting if (b := tracks[r].by_seq.get(seq))), None)
    op = sample.op if sample else "collective"
    since = f" for {fmt_duration(point.age_s)}" if point.age_s is not None else ""
    summary = (
        f"{plural(culprits).capitalize()} finished {op} #{seq} of {ref.label()} and then "
        f"{'its process' if len(culprits) == 1 else 'their processes'} failed, while {plural(waiting)} never "
        f"completed it{since}: they wait for a peer that is gone{_exit_text(exits.get(culprits[0]))}."
    )
    finding = Finding(category=Category.RANK_STOPPED, culprit_ranks=tuple(culprits), process_group=ref,
                      summary=summary, collective_seq_id=seq, op=op, **sizes_of(sample), since_ns=point.since_ns,
                      stalled_for_s=point.age_s, age_source=point.age_source)
    for rank in culprits[: ctx.options.max_rank_views]:
        last = tracks[rank].by_seq.get(tracks[rank].last_seq)
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, last[0] if last else None)
        finding.evidence.append(f"rank {rank}: finished #{seq} of {ref.label()}; last entered "
                                f"#{tracks[rank].last_seq}; its process {exits[rank].describe()}")
    others = [r for r in gone if r not in culprits]
    if others:
        finding.evidence.append(f"{plural(others)} also finished #{seq} and failed after the first failure")
    for rank in waiting[:3]:
        bucket = tracks[rank].by_seq.get(seq)
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, bucket[0] if bucket else None, call_site=False)
    return finding
