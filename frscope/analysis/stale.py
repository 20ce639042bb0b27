"""Ranks that stopped early: a stale dump, or no dump beside survivors that stopped together.

A rank that dies leaves at best an old dump (a periodic one, or the last one a sidecar polled),
while the survivors' dumps are from the moment they failed. Read naively, that is "everyone joined,
rank N never completed". Two facts tell it apart, both from the dumps' contents:

- the rank's recorder stops before sequence numbers that every other member of the group has
  finished: a collective cannot finish without every member, so the rank took part in them and its
  dump was taken before; and its newest entry is older than the others' newest by at least
  `stall_after_s` (`stale_by_s`): recorders read one after another while a job runs also differ by
  a few collectives, but only by the time between the reads;
- a rank with no dump at all, beside survivors whose last collective of the group is the same
  sequence number and finished (gloo retires a collective that failed because a peer died): the
  signature of a crash there.

Where the runner knows how the rank's process ended (`RankExit`: exit code, OOMKilled, restarts,
the termination message), that is the strongest evidence and goes into the finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from frscope.analysis.clock import CAPTURED, MTIME
from frscope.analysis.context import Context
from frscope.analysis.ops import RETIRES_FAILED, ROOTED_OPS
from frscope.analysis.tracks import Track, newest_created, oldest_open
from frscope.analysis.waitfor import State
from frscope.records import Entry, GroupInfo, RankExit


@dataclass(frozen=True, slots=True)
class Stale:
    """A member whose recorder ends at `last_seq` while every other member finished `done_seq`."""

    rank: int
    last_seq: int
    done_seq: int
    newest_ns: int | None  # the rank's newest entry, any group
    others_newest_ns: int | None
    # The rank entered `last_seq + 1` (and maybe more) but its recorder shows it pending, while every other
    # member recorded it finished (on a backend where that means it succeeded).
    pending: bool = False
    # Read close to the others', but every rank the blocked ones wait on is idle right after a collective this
    # rank's older read lacks (`waits_end_beside`): that is what named it.
    beside: bool = False


def _newest(ctx: Context, rank: int) -> int | None:
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None:
        return None
    return newest_created(dump.entries)


def stale_ranks(ctx: Context, group: GroupInfo, tracks: dict[int, Track],
                exits: Mapping[int, RankExit], unresponsive: frozenset[int] = frozenset(),
                gone: frozenset[int] = frozenset()) -> dict[int, Stale]:
    """Members whose dump ends before collectives all the other members finished; with exit evidence
    that a rank failed, or a read clearly older than the next collective every other member entered
    (a rank whose collector kept its last good read: it was not read again because it was gone), also
    before collectives all the others entered. `unresponsive` ranks (their worker server gave no
    answer) keep an old read while alive: only the first two tests apply to them. A `gone` rank (its
    collector says its process is gone) whose first missing collective another member recorded done
    well before its timeout (`_ended_early`) is stale however close its read: that collective either
    finished with it (its read is older) or failed as it went away."""
    if len(tracks) < 2:
        return {}
    # (Membership known only from the entries is enough here: a rank with entries of the group is a
    # member, and one without any is not in `tracks`.)
    with_entries = {r: t for r, t in tracks.items() if t.by_seq}
    if not with_entries:
        return {}
    out: dict[int, Stale] = {}
    # The two lowest 'finished' marks are enough: each rank is compared with the others' minimum.
    done = sorted((t.last_completed, r) for r, t in with_entries.items())
    entered = sorted((t.last_seq, r) for r, t in with_entries.items())
    # A member whose recorder holds nothing of the group (a dump taken before its first collective)
    # while every member with entries finished some.
    for rank in tracks.keys() - with_entries.keys():
        if done[0][0] > 0:
            out[rank] = Stale(rank, 0, done[0][0], None, None)
    for rank, track in with_entries.items() if len(with_entries) > 1 else ():
        others_done = done[1][0] if done[0][1] == rank else done[0][0]
        others_entered = entered[1][0] if entered[0][1] == rank else entered[0][0]
        exit = exits.get(rank)
        # Every member entered the rank's oldest pending collective (its process may have ended in it).
        all_in = track.next_seq <= track.last_seq and all(
            r in with_entries and with_entries[r].last_seq >= track.next_seq for r in group.ranks)
        if track.last_seq < others_done:
            out[rank] = Stale(rank, track.last_seq, others_done, None, None)
        elif track.last_completed < others_done and (
                finished_past(ctx, with_entries, rank, track.next_seq) or (_dead(rank, exits, gone) and all_in)):
            # Evidence must agree: an entry every other member finished cannot still be pending here. This
            # read is older than theirs (and the rank stopped there, or its read raced the completion). On
            # gloo a finish may be a failure: where every member entered it and this rank's process ended,
            # it failed for want of this rank, which stopped there either way.
            out[rank] = Stale(rank, track.last_completed, others_done, None, None, pending=True)
        elif all_in and _dead(rank, exits, gone) and not any(
                _dead(r, exits, gone) for r in group.ranks if r != rank):
            # A dead rank is a sink: every member entered the collective and none finished it, and the one
            # whose process ended (the others' live) is what they wait for (an op finishes only while every
            # member's process lives), not the device or the network.
            out[rank] = Stale(rank, track.last_completed, others_done, None, None, pending=True)
        elif exit is not None and exit.failed and track.last_seq < others_entered:
            out[rank] = Stale(rank, track.last_seq, track.last_seq, None, None)
        elif rank not in unresponsive and track.last_seq < others_entered:
            read_early = Stale(rank, track.last_seq, track.last_seq, _newest(ctx, rank), None)
            if read_before(ctx, read_early, tracks) or (rank in gone and _ended_early(ctx, rank, track.last_seq + 1,
                                                                                      tracks)):
                out[rank] = read_early
    if not out or len(out) == len(tracks):
        return {}
    others_newest = max((n for r in with_entries if r not in out and (n := _newest(ctx, r))), default=None)
    settled = _settled(ctx)
    found: dict[int, Stale] = {}
    for rank, s in out.items():
        if _waits_elsewhere(ctx, rank, group.name) and not (s.pending and _dead(rank, exits, gone)):
            continue  # (a dead rank pending here waits nowhere: it stopped)
        newest = _newest(ctx, rank)
        exit = exits.get(rank)
        # Recorders read one after another while a job runs differ by a few collectives: without the
        # runner's word that the rank failed, its dump must also be much older than the others'.
        # A process that is gone, whose recorder lacks what every other member finished with success
        # (`finished_past`), or shows pending what they finished (it was in it: a timeout would have ended it
        # there too), took part and then went away: however close its read.
        certain = (exit is not None and exit.failed) or (rank in gone and (
            s.pending or finished_past(ctx, tracks, rank, s.last_seq + 1)
            or _ended_early(ctx, rank, s.last_seq + 1, tracks)))
        # An entry every other member finished cannot still be pending on this rank: its dump is older
        # than theirs. Where when each was read is lost (copies), nothing says the reads were close.
        if settled and not certain:
            continue  # nobody waits: an old read of a rank the others went on with, not a rank that stopped
        if ctx.live_stack(rank) and not certain:
            # Its worker server answered for its stack at the capture: the process is there, and its
            # recorder is only an older read. Where the others wait for it, the stuck point names it.
            continue
        own = tracks[rank]
        # Read times lost: pending what the others finished, and lacking a later one they finished, it is older.
        # A lag of only its newest op's finish is not (gloo marks it after the call returns: a dump taken then).
        pending_behind = (ctx.clock.lost(rank) and own.next_seq <= min(own.last_seq, s.done_seq)
                          and s.done_seq > own.last_seq)
        # Nobody waits on a backend that retires a failed collective as finished, when the dumps were taken
        # is lost, and the others went past the collective after its end (one that failed, on a timeout or a
        # lost peer, is the last they record): it took part there, and their last ones may have failed for
        # want of it as well as finished. Both readings are said (`stopped_finding`).
        ended = ctx.clock.lost(rank) and s.done_seq > s.last_seq + 1 and ended_quiet(ctx)
        beside = False
        if not certain and not pending_behind and not ended and newest and others_newest:
            stale = replace(s, newest_ns=newest, others_newest_ns=others_newest)
            if ((others_newest - newest) / 1e9 < ctx.options.stall_after_s and not read_before(ctx, stale, tracks)
                    and not _failed_after_missing(ctx, rank, s.last_seq + 1, tracks)):
                beside = finished_past(ctx, tracks, rank, s.last_seq + 1) and waits_end_beside(ctx, rank)
                if not beside:
                    continue
        found[rank] = replace(s, newest_ns=newest, others_newest_ns=others_newest, beside=beside)
    return found


def waits_end_beside(ctx: Context, rank: int) -> bool:
    """On a backend that retires a failed collective as finished (gloo): ranks are blocked, and every rank
    their waits end at is idle right after a collective of a group it shares with `rank`, one that `rank`'s
    recorder lacks and after which no member recorded anything in that group (no later op shows that the
    call returned). (The caller has shown that `rank`'s read is older: it lacks a collective the others
    finished and went past.) Such a finish may be a failure for want of `rank` as well as a success, and one
    cause ending every sink's last collective is `rank`: the waits go on through those collectives to it
    (principles 1 and 2), not to ranks that each stopped recording right after one."""
    waited: set[int] = set()
    for blocked in ctx.waits.open_ranks():
        waited |= ctx.waits.named_waits(blocked) or frozenset()
    sinks = [r for r in waited if r != rank and ctx.waits.of(r).sink]
    if not sinks:
        return False
    for sink in sinks:
        dump = ctx.dumpset.dumps.get(sink)
        if ctx.waits.of(sink).state is not State.IDLE or dump is None or dump.backend not in RETIRES_FAILED \
                or not len(dump.entries):
            return False  # in Python, missing, or another backend: that sink stands on its own
        last = dump.entries[-1]
        group = ctx.dumpset.groups.get(last.pg_name)
        tracks = ctx.tracks.get(last.pg_name, {})
        own = tracks.get(rank)
        if last.is_p2p or not last.completed or group is None or rank not in group.ranks or own is None \
                or own.last_seq >= last.collective_seq_id:
            return False
        if last.op in ROOTED_OPS:
            if not _root_of(last):
                return False  # a non-root's part (or one whose root is unknown) needs the root alone, not `rank`
        elif any(t.last_seq > last.collective_seq_id for t in tracks.values()):
            return False  # a member went on past it: it succeeded, and the sink stopped after it on its own
    return True


def _root_of(entry: Entry) -> bool:
    """The entry is a scatter's or a gather's root part (the side only the root fills: a scatter's inputs, a
    gather's outputs): it exchanges with every member, and other members going past it prove nothing of it.
    A broadcast's or a reduce's root is not in the entry: False."""
    if entry.op == "scatter":
        return bool(entry.input_sizes)
    if entry.op == "gather":
        return bool(entry.output_sizes)
    return False


def completed_is_success(ctx: Context, ranks: Mapping[int, object]) -> bool:
    """The ranks' recorders come from a backend whose 'completed' means the op succeeded (NCCL; gloo
    retires a failed op as finished too)."""
    backends = {d.backend if (d := ctx.dumpset.dumps.get(r)) is not None else None for r in ranks}
    return bool(backends) and None not in backends and not backends & RETIRES_FAILED


def finished_past(ctx: Context, tracks: Mapping[int, Track], rank: int, seq: int) -> bool:
    """Every other member with entries of the group finished collective `seq`, and that finish was a success:
    the backend's 'completed' says so (NCCL), or each of them recorded an op after it (gloo retires a failed
    op too, but a failed one raises: a rank that went on had it return). It cannot still be pending on
    `rank`: that read is older than theirs."""
    others = {r: t for r, t in tracks.items() if r != rank and t.by_seq}
    if not others or any(t.last_completed < seq for t in others.values()):
        return False
    if completed_is_success(ctx, others):
        return True
    for other, track in others.items():
        bucket = track.by_seq.get(seq)
        dump = ctx.dumpset.dumps.get(other)
        if not bucket or dump is None or not len(dump.entries) or dump.entries[-1].record_id <= bucket[-1].record_id:
            return False
    return True


def done_by_the_others(ctx: Context, rank: int, entry: Entry) -> bool:
    """The entry's collective is one every other member of its group finished with success (`finished_past`):
    it cannot still be pending on `rank`."""
    return not entry.is_p2p and finished_past(ctx, ctx.tracks.get(entry.pg_name, {}), rank, entry.collective_seq_id)


def _dead(rank: int, exits: Mapping[int, RankExit], gone: frozenset[int]) -> bool:
    """The runner says the rank's process failed, or its collector that the process is gone."""
    exit = exits.get(rank)
    return (exit is not None and exit.failed) or rank in gone


def _settled(ctx: Context) -> bool:
    """Every rank finished every op it recorded, on a backend whose 'completed' means the op succeeded:
    nobody waits for anyone, so an older read is only that (a rank that died would have left the
    others blocked in their next collective)."""
    backends = {d.backend for d in ctx.dumpset.dumps.values()}
    if not backends or None in backends or backends & RETIRES_FAILED:
        return False
    return all(oldest_open(d.entries, None) is None for d in ctx.dumpset.dumps.values())


def ended_quiet(ctx: Context) -> bool:
    """Every rank's recorder shows all it enqueued finished, on a backend that retires a collective that
    failed (a peer gone) as if it had finished: the job ended, cleanly or by a failure, nothing says which."""
    backends = {d.backend for d in ctx.dumpset.dumps.values()}
    return (bool(backends) and None not in backends and backends <= RETIRES_FAILED
            and all(oldest_open(d.entries, None) is None for d in ctx.dumpset.dumps.values()))


def _failed_after_missing(ctx: Context, rank: int, seq: int, tracks: dict[int, Track]) -> bool:
    """On a backend that retires a failed collective as finished (gloo): the others began `seq` before the
    rank's own read, the rank had not entered it by then, and they recorded it finished without it. It
    cannot have finished without the rank: it failed, and the rank was not in it when it did (it had
    stopped, or was about to: gloo fails the others the moment a peer's connection closes)."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None or dump.backend not in RETIRES_FAILED or ctx.clock.source.get(rank) not in (CAPTURED, MTIME):
        return False
    if ctx.live_stack(rank):
        return False  # alive when read: where it is decides (RankNotJoined), not a stop
    read = ctx.clock.at_ns[rank]
    their_reads = [ctx.clock.at_ns[r] for r in tracks if r != rank and ctx.clock.source.get(r) in (CAPTURED, MTIME)]
    if not their_reads or read > min(their_reads):
        return False  # read after the others: its recorder was current then, it did not stop first
    began = [b[0].time_created_ns or 0 for r, t in tracks.items() if r != rank and (b := t.by_seq.get(seq))]
    others = [t for r, t in tracks.items() if r != rank and t.by_seq]
    return (bool(began) and min(began) > 0 and max(began) < read
            and all(t.last_completed >= seq for t in others))


def _ended_early(ctx: Context, rank: int, seq: int, tracks: dict[int, Track]) -> bool:
    """Another member recorded `seq` done (gloo: retired) in a read taken well before its timeout could
    have ended it: it finished, or failed because a member went away, not because one hung. Sequence
    numbers used up without an entry (gloo's monitored_barrier takes two) are no collective to judge by:
    the first one after `seq` that the member recorded stands for them."""
    for other, track in tracks.items():
        dump = ctx.dumpset.dumps.get(other)
        if other == rank or dump is None or dump.captured_at_ns is None:
            continue
        bucket = track.by_seq.get(seq)
        if bucket is None and seq <= track.last_seq:
            bucket = track.by_seq.get(min(s for s in track.by_seq if s >= seq))
        if not bucket:
            continue
        first = bucket[0]
        if all(e.completed for e in bucket) and first.timeout_ms and first.time_created_ns \
                and dump.captured_at_ns < first.time_created_ns + first.timeout_ms * 1_000_000 // 2:
            return True
    return False


def _waits_elsewhere(ctx: Context, rank: int, group: str) -> bool:
    """The rank's recorder ends in another group's collective that it still waits in, or that failed for
    want of a member (one that never entered it, or left no dump): the recorder is current, the rank was
    held there, and what the others recorded past it here failed without it (gloo retires it anyway)."""
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None or not len(dump.entries):
        return False
    last = dump.entries[-1]
    if last.is_p2p or last.pg_name == group:
        return False
    if not last.completed:
        return not done_by_the_others(ctx, rank, last)
    return ctx.waits.failed_wait(rank) is not None or ctx.waits.last_group_may_lack_a_member(rank)


READ_GAP_S = 0.1  # a recorder read this much before the others began a collective cannot show it


def read_before(ctx: Context, stale: Stale, tracks: dict[int, Track]) -> bool:
    """The rank's recorder was read (its file written, its snapshot taken) clearly before any other
    member began the latest collective it lacks that every other member entered, and no live stack says
    it was alive when read: the dump is older than that collective, not a rank left behind by it (one
    that never joined a collective the others began before the read is RankNotJoined, as after the
    others' timeout). Another member enters a collective only after its previous ones returned, so a read
    older than the latest one is stale though it may follow the first."""
    rank = stale.rank
    dump = ctx.dumpset.dumps.get(rank)
    if dump is None or ctx.live_stack(rank):
        return False
    read = dump.captured_at_ns  # its own read (not the analysis' 'now'), sane only after its newest entry
    if read is None or (stale.newest_ns is not None and read < stale.newest_ns):
        return False
    # The latest collective every other member entered: it began last, so the gap is widest there.
    seq = min((t.last_seq for r, t in tracks.items() if r != rank and t.by_seq), default=stale.last_seq + 1)
    began = [b[0].time_created_ns for r, t in tracks.items()
             if r != rank and (b := t.by_seq.get(seq)) and b[0].time_created_ns]
    return read is not None and bool(began) and (min(began) - read) / 1e9 >= READ_GAP_S
