"""What every rule reads: per group, its members' tracks, the stale ones, and where it stands still.

Facts are measurements, not verdicts: which members have a dump, which recorders end before
collectives all the others finished (`stale`), the stuck point of the live members, and who waits
there. Every rule reads the same facts and proposes its findings from them; no rule sees another's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from frscope.analysis.clock import CAPTURED
from frscope.analysis.context import Context
from frscope.analysis.findings import GroupProgress, GroupRef, RankProgress
from frscope.analysis.stale import Stale, read_before, stale_ranks
from frscope.analysis.stuck import StuckPoint, stuck_point
from frscope.analysis.tracks import Track, newest_created
from frscope.analysis.wording import plural
from frscope.records import GroupInfo, RankExit
from frscope.records.membership import is_default_group


@dataclass(slots=True)
class GroupFacts:
    name: str
    group: GroupInfo
    ref: GroupRef
    tracks: dict[int, Track]  # the members with a dump
    stale: dict[int, Stale]  # members whose recorder ends before what every other member finished
    live: dict[int, Track]  # `tracks` less the stale ones
    point: StuckPoint | None  # where the live members stand still (None: nothing open)
    # Everyone live entered the stuck point, and these never completed it (empty otherwise).
    waiting: tuple[int, ...]
    waiting_op: str
    missing_members: tuple[int, ...]  # members without a dump
    # Members with a dump that holds nothing of the group (not judged: read before their first
    # collective, or its entries evicted from the ring buffer).
    unrecorded_members: tuple[int, ...]
    # Members without a dump are suspects here (or may be: membership known only from the entries).
    suspects_missing: bool


@dataclass(slots=True)
class Facts:
    ctx: Context
    exits: Mapping[int, RankExit]
    failed: frozenset[int]  # ranks whose process the runner says failed
    groups: list[GroupFacts]
    default_ref: GroupRef  # the default group (the whole world), for job-wide findings
    # Ranks whose worker server gave the collector no answer (a process holding the GIL in a long C
    # call, or stuck in native code): what they hold is their last good read, if any.
    unresponsive: frozenset[int] = frozenset()


def unresponsive_note(facts: Facts, ranks: tuple[int, ...]) -> str | None:
    """Evidence for a finding whose culprits include ranks that did not answer the collector."""
    silent = sorted(set(ranks) & facts.unresponsive)
    if not silent:
        return None
    return (f"{plural(silent)} did not answer {'its' if len(silent) == 1 else 'their'} worker server: the process "
            "is alive but holds the GIL (a long C call, e.g. a pathological regex) or is stuck in native code; what "
            f"it shows is {'its' if len(silent) == 1 else 'their'} last good read. A native stack (py-spy dump "
            "--native) would show what it holds")


def group_tracks(ctx: Context, group: GroupInfo) -> dict[int, Track]:
    """The group's members that have a dump. A member with no entry of the group counts as having
    entered nothing while nobody has completed anything there, and also when its recorder ends before
    the others' oldest entry of the group (a dump taken before the group's first collective: a stale
    periodic dump), or when its empty recorder was read clearly before the others began what they all
    entered last. Otherwise its entries of the group were evicted from its ring buffer (a real member
    cannot miss a completed collective) and it is left out."""
    tracks = ctx.tracks.get(group.name, {})
    mine = {r: tracks[r] for r in group.ranks if r in tracks}
    without = [r for r in group.ranks if r in ctx.dumpset.dumps and r not in mine]
    if not without:
        return mine
    nothing_done = all(t.next_seq <= t.first_seq for t in mine.values() if t.by_seq)
    all_done = all(t.next_seq > t.last_seq for t in mine.values() if t.by_seq)
    oldest = min((c for t in mine.values() if t.by_seq and (c := _first_created(t))), default=None)
    certain = group.membership_source != "entries"
    for rank in without:
        newest = newest_created(ctx.dumpset.dumps[rank].entries)
        # An empty recorder has no time: it may be a read from before the rank's first collective (a
        # collector between two full reads) as well as a stale dump. Only a dated one is judged.
        # Its newest entry is only a lower bound of when it was read: where the collector's read time is known and
        # later than the others' oldest entry of the group, its entries there were evicted (a small ring),
        # it is no dump taken before the group's first collective.
        read_at = ctx.clock.at_ns.get(rank) if ctx.clock.source.get(rank) == CAPTURED else None
        before = (certain and oldest is not None and newest is not None and newest < oldest
                  and (read_at is None or read_at < oldest))
        # An empty recorder is dated by its read alone: one read clearly before the others began what
        # they all entered last, which they all recorded as done (no wait here whose age could still
        # say it is young), is as old as a dated one.
        read_early = (certain and newest is None and all_done and bool(mine)
                      and read_before(ctx, Stale(rank, 0, 0, None, None), mine))
        if nothing_done or before or read_early:
            mine[rank] = Track(rank)
    return mine


def _first_created(track: Track) -> int | None:
    bucket = track.by_seq.get(track.first_seq)
    return bucket[0].time_created_ns if bucket else None


def _waiting(tracks: dict[int, Track], point: StuckPoint | None) -> tuple[tuple[int, ...], str]:
    if point is None or not point.stalled or point.not_joined:
        return (), "collective"
    buckets = {r: b for r in point.joined if (b := tracks[r].by_seq.get(point.seq))}
    op = next(iter(buckets.values()))[0].op if buckets else "collective"
    return tuple(sorted(r for r, b in buckets.items() if not all(e.completed for e in b))), op


def gather_facts(ctx: Context, exits: Mapping[int, RankExit]) -> Facts:
    dumpset = ctx.dumpset
    failed = frozenset(r for r, e in exits.items() if e.failed)
    any_missing = bool(dumpset.missing_ranks)
    unresponsive = ctx.unresponsive_ranks()
    gone = ctx.gone_ranks()
    groups: list[GroupFacts] = []
    default_ref: GroupRef | None = None
    for name, group in dumpset.groups.items():
        ref = GroupRef(name, group.desc, group.ranks)
        if default_ref is None or is_default_group(name, group.desc):
            if default_ref is None or not is_default_group(default_ref.name, default_ref.desc):
                default_ref = ref
        tracks = group_tracks(ctx, group)
        stale = stale_ranks(ctx, group, tracks, exits, unresponsive, gone) if tracks else {}
        live = {r: t for r, t in tracks.items() if r not in stale} if stale else tracks
        point = stuck_point(ctx, group, live, failed, gone) if live else None
        waiting, op = _waiting(live, point)
        missing = tuple(r for r in group.ranks if r not in dumpset.dumps)
        suspects = bool(missing or (any_missing and group.membership_source == "entries"))
        unrecorded = tuple(r for r in group.ranks if r in dumpset.dumps and r not in tracks)
        groups.append(GroupFacts(name, group, ref, tracks, stale, live, point, waiting, op, missing, unrecorded,
                                 suspects))
    return Facts(ctx, exits, failed, groups,
                 default_ref or GroupRef("0", "default_pg", tuple(range(dumpset.world_size))),
                 unresponsive)


def progress(facts: Facts) -> list[GroupProgress]:
    """Where each group's members stand, for the report."""
    out: list[GroupProgress] = []
    for gf in facts.groups:
        ranks: dict[int, RankProgress] = {}
        for rank, track in sorted(gf.tracks.items()):
            open_bucket = track.by_seq.get(track.next_seq)
            ranks[rank] = RankProgress(
                last_enqueued_seq=track.last_seq or None,
                last_completed_seq=track.last_completed if track.by_seq else None,
                inflight_op=open_bucket[0].op if open_bucket else None,
                inflight_seq=track.next_seq if open_bucket else None,
            )
        out.append(GroupProgress(gf.ref, gf.group.membership_source, ranks))
    return out
