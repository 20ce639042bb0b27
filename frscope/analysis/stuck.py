"""Where a process group stands still: the collective it is held at, who entered it, since when.

Evidence must agree (issue 33, principle 2): a collective every other member finished is not what holds
the group, and a collective cannot finish without a member, so gloo's "completed" after a member never
entered it means it failed. How long it stood still comes from the capture time; where that is lost
(copied files) the age is unknown and the finding says so (principle 4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from frscope.analysis.clock import CAPTURED, MTIME, MTIME_CAPPED
from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef, sizes_of
from frscope.analysis.ops import (
    RETIRES_FAILED,
)
from frscope.analysis.tracks import Track
from frscope.analysis.wording import fmt_duration
from frscope.records import Entry, GroupInfo


@dataclass(slots=True)
class StuckPoint:
    """Where a group stands still: the seq, who entered it, who did not, since when."""

    seq: int
    joined: list[int]
    not_joined: list[int]
    since_ns: int | None
    age_s: float | None
    stalled: bool
    age_source: str | None = None
    # Members of `not_joined` whose recorder lacks a collective of the group that every other member finished
    # with success (`_succeeded`): it took part, so its read is older than that, and its absence from `seq`
    # says nothing of where it stands (`_read_before_group`).
    behind: tuple[int, ...] = ()


def _failed_without(ctx: Context, tracks: dict[int, Track], seq: int, joined: list[int], not_joined: list[int]) -> bool:
    """Evidence must agree: the ranks that entered `seq` all recorded it finished, yet members read no
    earlier than they were never entered it. A collective cannot finish without a member: it failed
    (gloo retires a failed collective as if it had finished), however young it is."""
    if not not_joined or not all(tracks[r].last_completed >= seq for r in joined):
        return False
    if any((d := ctx.dumpset.dumps.get(r)) is None or d.backend not in RETIRES_FAILED for r in joined):
        return False  # there 'completed' means it succeeded: the member's read is older than it says
    at, source = ctx.clock.at_ns, ctx.clock.source
    if any(source.get(r) not in (CAPTURED, MTIME) for r in (*joined, *not_joined)):
        return False  # each rank's own read time is needed (not one 'now' given to the analysis)
    return min(at[r] for r in not_joined) > max(at[r] for r in joined)


def _failed_after(ctx: Context, tracks: dict[int, Track], seq: int, joined: list[int], not_joined: list[int]) -> bool:
    """Evidence must agree (a group's collectives finish in order): every rank in `seq` recorded its newest
    collective of the group finished while `seq` itself is not, on a backend that retires a failed collective
    as finished (gloo), and a member never entered `seq` (nor, so, the later one). That later one cannot have
    succeeded: it failed, for want of that member (its peers lost it), however young the wait."""
    if not not_joined:
        return False
    for rank in joined:
        dump, track = ctx.dumpset.dumps.get(rank), tracks[rank]
        if dump is None or dump.backend not in RETIRES_FAILED or track.next_seq > seq or track.last_seq <= seq:
            return False
        newest = track.by_seq.get(track.last_seq)
        if not newest or not all(e.completed for e in newest):
            return False
    return True


def _held_at(tracks: dict[int, Track], idle: Callable[[int], bool],
             succeeded: Callable[[list[Track], int], bool], completed_is_success: bool = False) -> int:
    """The collective the group is held at: the lowest one a member has not finished, unless every member
    that has not finished it is behind members that all finished it and entered a later one. Evidence must
    agree: a collective every other member finished is not what holds the group (the lagging recorder
    was read before its completion showed, or its process stopped there); the others wait in the next
    one, for the ranks that never entered it. Where 'completed' means the collective succeeded (NCCL,
    not gloo, which retires a failed one too), one member's 'completed' settles it for all (a collective
    finishes on none without every member; a group's collectives finish in order): the group is held at
    the first collective no member finished, whatever the lagging recorders still show as pending. On gloo
    the same holds where the members ahead finished it with success (`_succeeded`), whether or not each of
    them entered the next one: the group is held where they stand, not at a collective it finished."""
    if completed_is_success:
        return max(t.next_seq for t in tracks.values())
    seq = min(t.next_seq for t in tracks.values())
    behind = [t for t in tracks.values() if t.next_seq == seq]
    ahead = [t for t in tracks.values() if t.next_seq > seq]
    if not ahead or any(t.last_seq > seq for t in behind):
        return seq
    later = min(t.next_seq for t in ahead)
    if all(t.last_seq >= later for t in ahead) or succeeded(ahead, seq):
        return later
    # Members that went past `seq` to the same place, where their live stacks show them in no
    # torch.distributed call, wait nowhere: `seq` is not what holds the group (where they finished all they
    # enqueued, nothing does). Without such stacks a backend that retires a failed collective as finished
    # (gloo) may show the same record after a timeout (async ops queued behind it fail too).
    if all(t.next_seq == later and t.last_seq > seq and idle(t.rank) for t in ahead):
        return later
    return seq


def _went_on(ctx: Context, track: Track, seq: int) -> bool:
    """The rank finished collective `seq` of the track's group and recorded an op after it (any group)."""
    bucket = track.by_seq.get(seq)
    dump = ctx.dumpset.dumps.get(track.rank)
    if not bucket or dump is None or not len(dump.entries):
        return False
    return track.last_completed >= seq and dump.entries[-1].record_id > bucket[-1].record_id


def _succeeded(ctx: Context, group: GroupInfo, members: list[Track], seq: int, failed: frozenset[int],
               lagging: set[int]) -> bool:
    """On gloo (which retires a failed collective as finished), the `members` finished collective `seq` of the
    group with success: each went on past it (`_went_on`: a blocking collective that failed raises, so one
    that returned succeeded); some rank other than the `lagging` ones still waits in an op (where every op
    is retired the job ended, and a finish says nothing of how: `stale.ended_quiet`); and nothing could have
    failed it: every member that may belong to the group left a dump and no member's process is known to
    have failed (an async op fails without raising when a peer goes away, and the rank goes on)."""
    if not members or not all(_went_on(ctx, t, seq) for t in members):
        return False
    if not ctx.waits.open_ranks() - lagging:
        return False
    missing = ctx.dumpset.missing_ranks
    if any(r not in ctx.dumpset.dumps for r in group.ranks) or (group.membership_source == "entries" and missing):
        return False
    return not (failed | ctx.gone_ranks()) & set(group.ranks)


def _read_before_group(ctx: Context, group: GroupInfo, tracks: dict[int, Track], seq: int, not_joined: list[int],
                       failed: frozenset[int]) -> tuple[int, ...]:
    """The members that never entered `seq` whose recorder ends before a collective of the group that every
    other member finished with success (`_succeeded`): a collective needs every member, so each took part in it
    and its recorder was read before (a periodic dump, a file not refreshed). Evidence must agree: a recorder
    is evidence of a member's absence only where it is current; the others' wait at `seq` names the members
    whose recorders reach it."""
    out = []
    for rank in not_joined:
        first_missing = tracks[rank].last_seq + 1
        others = [t for r, t in tracks.items() if r != rank and t.by_seq]
        if first_missing < seq and _succeeded(ctx, group, others, first_missing, failed, {rank}):
            out.append(rank)
    return tuple(out)


def stuck_point(ctx: Context, group: GroupInfo, tracks: dict[int, Track],
                failed: frozenset[int] = frozenset(), gone: frozenset[int] = frozenset()) -> StuckPoint | None:
    """`failed`: ranks whose process the runner says failed. A member of the group among them means its
    collective can never complete, however young it is: the gather that follows an exit must not call
    the group merely busy (a rank ended by a short collective timeout, or peers only a second into the
    next collective when the exits are read). `gone`: ranks whose
    collector says their process is gone (its socket is gone, refused, or the process exited): the same
    holds where a member never entered the collective and nobody went past it (a job that ended cleanly
    has every member in its last one, whose entry may not be retired yet; a member that went on shows
    the collective finished, and the one missing from it holds an older read)."""
    if not tracks:
        return None
    backends = {d.backend if (d := ctx.dumpset.dumps.get(r)) is not None else None for r in tracks}
    seq = _held_at(tracks, ctx.in_python,
                   lambda ahead, seq: _succeeded(ctx, group, ahead, seq, failed, set(tracks) - {t.rank for t in ahead}),
                   completed_is_success=None not in backends and not backends & RETIRES_FAILED)
    joined = sorted(r for r, t in tracks.items() if t.last_seq >= seq)
    if not joined:
        return None  # every rank is done with everything it enqueued: idle, not stuck
    if all(tracks[r].last_completed >= seq for r in joined) and all(
            (d := ctx.dumpset.dumps.get(r)) is not None and d.backend and d.backend not in RETIRES_FAILED
            for r in joined):
        return None  # it succeeded without a member that shows none of it: that member's read is older
    not_joined = sorted(set(tracks) - set(joined))
    behind = _read_before_group(ctx, group, tracks, seq, not_joined, failed)
    entered = [e for r in joined for e in tracks[r].by_seq.get(seq, ())]
    created = [e.time_created_ns for e in entered if e.time_created_ns]
    since = min(created) if created else None
    # The latest read of any member counts: one read long after the others entered, and still not in
    # it, shows the collective stood still that long.
    now, read_by = ctx.clock.now_for(sorted(tracks))
    if read_by == MTIME_CAPPED:
        # The files are copies: when the recorders were read is lost, and so is the age. An age made up
        # from the collective's timeout would decide "stalled" by a few microseconds between groups.
        return StuckPoint(seq, joined, not_joined, since, None, True, ctx.clock.unknown_age(since), behind)
    age = (now - since) / 1e9 if (now is not None and since is not None) else None
    members = set(group.ranks) | set(tracks)
    stalled = (age is None or age >= ctx.options.stall_after_s or bool(failed & members)
               or bool(not_joined and gone & members and max(t.last_seq for t in tracks.values()) == seq)
               or _failed_without(ctx, tracks, seq, joined, not_joined)
               or _failed_after(ctx, tracks, seq, joined, not_joined))
    source = ctx.age_source(sorted(tracks)) if age is not None else None
    timeouts = [e.timeout_ms for e in entered if e.timeout_ms]
    if age is not None and timeouts and age > min(timeouts) / 1000:
        # The collective's own timeout ended it (it failed then): the recorders were read later. Its
        # age is no longer than the timeout; the report says so.
        timeout_s = min(timeouts) / 1000
        source = f"{source}; capped at the collective's {fmt_duration(timeout_s)} timeout, which ended it " \
                 f"{fmt_duration(age - timeout_s)} before the recorders were read"
        age = timeout_s
    return StuckPoint(seq, joined, not_joined, since, age, stalled, source, behind)


def stuck_finding(
    category: Category,
    culprits: list[int],
    ref: GroupRef,
    summary: str,
    seq: int,
    op: str,
    sample: Entry | None,
    point: StuckPoint,
) -> Finding:
    """A finding about the collective a group stands still in, with what the ranks passed to it."""
    return Finding(
        category=category,
        culprit_ranks=tuple(culprits),
        process_group=ref,
        summary=summary,
        collective_seq_id=seq,
        op=op,
        **sizes_of(sample),
        since_ns=point.since_ns,
        stalled_for_s=point.age_s,
        age_source=point.age_source,
    )

