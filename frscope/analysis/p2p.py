"""Point-to-point ops: pending sends and receives that have no partner.

NCCL records p2p ops ('nccl:send 0->1', 'nccl:recv 1<-0', group-local ranks, their own p2p_seq_id).
Gloo records none at all, so there the only evidence is a rank's live stack sitting in send/recv
(`p2p_stacks.py`).
"""

from __future__ import annotations

from frscope.analysis.clock import MTIME_CAPPED
from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.tracks import Track
from frscope.analysis.waitfor import State
from frscope.analysis.wording import fmt_duration, plural
from frscope.records import Entry, GroupInfo

P2P_OPS = ("send", "isend", "recv", "irecv")


def _pending(track: Track) -> list[Entry]:
    return track.open_p2p()


def _kind(entry: Entry) -> str:
    return "send" if entry.op in ("send", "isend") else "recv"


Posted = dict[tuple[str, int, int], list[Entry]]  # (kind, rank, peer) -> its pending ops, oldest first


def _facing_heads(posted: Posted) -> tuple[int, Entry, int, Entry] | None:
    """(a, its op, b, its op): two ranks whose oldest pending p2p ops with each other are both receives
    (or both sends), the oldest such pair. Each op is ahead of the counterpart the other waits for on
    its own stream, so neither can finish (a deadlock, whatever else each rank posted behind it)."""
    heads: dict[tuple[int, int], Entry] = {}
    for (_, rank, peer), entries in posted.items():
        head = next((e for e in entries if e.op in P2P_OPS), None)
        held = heads.get((rank, peer))
        if head is not None and (held is None or head.record_id < held.record_id):
            heads[(rank, peer)] = head
    found = [(a, mine, b, theirs) for (a, b), mine in heads.items()
             if a < b and (theirs := heads.get((b, a))) is not None and _kind(mine) == _kind(theirs)]
    if not found:
        return None
    return min(found, key=lambda f: min(f[1].time_created_ns or 0, f[3].time_created_ns or 0))


def _one_skipped(a: int, b: int, kind: str, posted: Posted) -> bool:
    """Of two ranks facing each other with ops of `kind`, one posted the other kind too (behind it) and
    the other never did: that one skipped it (its program diverged), a p2p op without a partner rather
    than a deadlock of two programs that both post in the wrong order."""
    other = "send" if kind == "recv" else "recv"
    return ((other, a, b) in posted) != ((other, b, a) in posted)


def _age(ctx: Context, ranks: list[int], created: int) -> tuple[float | None, str | None]:
    """How long the op has waited and where that came from; None with both readings when the files are
    copies (the read time is lost: no age is made up from the timeout)."""
    now, read_by = ctx.clock.now_for(ranks)
    if read_by == MTIME_CAPPED:
        return None, ctx.clock.unknown_age(created or None)
    if not now or not created:
        return None, None
    return (now - created) / 1e9, ctx.age_source(ranks)


def _deadlock_finding(ctx: Context, group: GroupInfo, ref: GroupRef, a: int, first: Entry, b: int, second: Entry
                      ) -> Finding:
    kind = _kind(first)
    created = min(first.time_created_ns or 0, second.time_created_ns or 0)
    age, age_source = _age(ctx, [a, b], created)
    summary = (f"Ranks {a} and {b} each wait in a {kind} with the other (p2p #{first.p2p_seq_id} / "
               f"#{second.p2p_seq_id} of {ref.label()}), posted before the {'recv' if kind == 'send' else 'send'} "
               "the other waits for: a point-to-point deadlock"
               + (f", for {fmt_duration(age)}" if age is not None else "") + ".")
    finding = _p2p_finding(ref, [a, b], summary, first, created, age, age_source)
    finding.evidence.append(f"rank {a}'s and rank {b}'s oldest pending ops with each other are both {kind}s")
    for rank, entry in ((a, first), (b, second)):
        finding.ranks[rank] = ctx.rank_view(rank, group.name, entry)
        stack = ctx.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack
    return finding


def _p2p_finding(ref: GroupRef, culprits: list[int], summary: str, entry: Entry, created: int, age: float | None,
                 age_source: str | None) -> Finding:
    return Finding(
        category=Category.P2P_MISMATCH,
        culprit_ranks=tuple(culprits),
        process_group=ref,
        summary=summary,
        p2p_seq_id=entry.p2p_seq_id,
        op=entry.op,
        input_sizes=entry.input_sizes,
        output_sizes=entry.output_sizes,
        input_dtypes=entry.input_dtypes,
        output_dtypes=entry.output_dtypes,
        since_ns=created or None,
        stalled_for_s=age,
        age_source=age_source,
    )


def _misdirected(candidates: list[tuple[int, int, int, Entry, str]]) -> tuple[int, int, int, Entry, str] | None:
    """A pending op that names a peer which never posts the counterpart, by a rank that another rank's
    pending op waits for with the counterpart's kind: that rank named the wrong peer (rank 2's send to
    3 waits while rank 3 receives from 11). It is the culprit, not the peer it named (idle, or busy
    with its own partners), nor the rank whose op waits for it."""
    unmatched = [c for c in candidates if c[4] == "unmatched"]
    waited_for = {(_kind(c[3]), c[2]): c[1] for c in unmatched}  # (kind, the rank it names) -> who waits
    for created, rank, peer, entry, _ in sorted(unmatched, key=lambda c: (c[0], c[1])):
        partner_kind = "recv" if _kind(entry) == "send" else "send"
        other = waited_for.get((partner_kind, rank))
        if other is not None and other != peer:
            return created, rank, other, entry, "misdirected"  # (.., the culprit, the rank waiting for it, ..)
    return None


def _answered_cycle(candidates: list[tuple[int, int, int, Entry, str]], posted: Posted,
                    group: GroupInfo, tracks: dict[int, Track]) -> tuple[int, int, int, Entry, str] | None:
    """A pending op that names a peer which never posts the counterpart, where that peer waits on the rank
    itself in an op whose counterpart the rank did post (held behind the unanswered one on its stream: rank
    1 receives from 2 and then sends to 2, while rank 2 receives from 1). The two wait on each other; the
    culprit is the side whose order departs from its own habit. Where the rank never before completed such
    an op with that peer, it named a peer that is not sending to it (the peer's wait has its counterpart):
    the rank is the culprit. Where it did, habitually, the peer is the one that skipped its counterpart this
    time: not this reading (the unanswered op's peer is named)."""
    for created, rank, peer, entry, why in sorted(candidates, key=lambda c: (c[0], c[1])):
        if why != "unmatched":
            continue
        if any((kind, peer, rank) in posted and ("recv" if kind == "send" else "send", rank, peer) in posted
               for kind in ("send", "recv")):
            kind = _kind(entry)
            if any(e.completed and _with(group, e, peer, kind) for e in tracks[rank].p2p):
                continue
            return created, rank, peer, entry, "misdirected"
    return None


def _owed(ctx: Context, group: GroupInfo, tracks: dict[int, Track],
          candidates: list[tuple[int, int, int, Entry, str]]) -> tuple[int, int, int, Entry, str] | None:
    """A pending recv that names a peer which never posts the counterpart, by a rank that owes another rank a
    recv: that rank completed more sends to it than the rank ever posted recvs from it (NCCL completes a small
    send before its recv is posted; a pair's messages in one direction match in order; neither ring wrapped).
    The message the rank should receive is there, from that other rank: the rank named the wrong peer.
    (.., the culprit, the rank whose send it owes, ..)."""
    waiting = [c for c in candidates if c[4] == "unmatched" and _kind(c[3]) == "recv" and c[1] in tracks]
    if not waiting:
        return None
    sent: dict[tuple[int, int], int] = {}  # (sender, receiver) -> completed sends
    received: dict[tuple[int, int], int] = {}  # (receiver, sender) -> posted recvs
    for rank, track in tracks.items():
        for e in track.p2p:
            peer = group.global_rank(e.peer) if e.op in P2P_OPS and e.peer is not None else None
            if peer is None:
                continue
            if _kind(e) == "recv":
                received[(rank, peer)] = received.get((rank, peer), 0) + 1
            elif e.completed:
                sent[(rank, peer)] = sent.get((rank, peer), 0) + 1
    for created, rank, peer, entry, _ in sorted(waiting, key=lambda c: (c[0], c[1])):
        if not _whole(ctx, rank):
            continue
        for (other, to), count in sorted(sent.items()):
            if to == rank and other != peer and count > received.get((rank, other), 0) and _whole(ctx, other):
                return created, rank, other, entry, "owed"
    return None


def _with(group: GroupInfo, entry: Entry, peer: int, kind: str) -> bool:
    return entry.op in P2P_OPS and _kind(entry) == kind and entry.peer is not None \
        and group.global_rank(entry.peer) == peer


def _whole(ctx: Context, rank: int) -> bool:
    """The rank's recorder still holds its first op (nothing evicted from the ring): counts are whole."""
    dump = ctx.dumpset.dumps.get(rank)
    return dump is not None and bool(len(dump.entries)) and dump.entries[0].record_id == 0


def _counterpart_done(ctx: Context, group: GroupInfo, tracks: dict[int, Track], rank: int, peer: int,
                      entry: Entry) -> bool:
    """Evidence must agree: the peer recorded as completed as many counterparts of the rank's ops with it
    as the rank posted up to `entry` (a pair's messages in one direction match in order). The message
    `entry` waits for went through: `entry` cannot still be pending, the rank's read is older than the
    peer's (its process stopped, or the read raced the completion), and the peer owes it nothing."""
    if peer not in tracks or not (_whole(ctx, rank) and _whole(ctx, peer)):
        return False
    kind = _kind(entry)
    other = "recv" if kind == "send" else "send"
    posted = sum(1 for e in tracks[rank].p2p if e.record_id <= entry.record_id and _with(group, e, peer, kind))
    done = sum(1 for e in tracks[peer].p2p if e.completed and _with(group, e, rank, other))
    return done >= posted


def recorded_p2p(ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track]) -> Finding | None:
    """The oldest pending p2p op whose partner has no matching pending op (or a different size)."""
    pending: dict[int, list[Entry]] = {r: p for r, t in tracks.items() if (p := _pending(t))}
    if not pending:
        return None
    # Index the receivers' side: (receiver, sender) -> pending recvs, (sender, receiver) -> pending sends.
    posted: Posted = {}
    for rank, entries in pending.items():
        for entry in entries:
            peer = group.global_rank(entry.peer) if entry.peer is not None else None
            if peer is not None:
                posted.setdefault((_kind(entry), rank, peer), []).append(entry)
    facing = _facing_heads(posted)
    if facing is not None and not _one_skipped(facing[0], facing[2], _kind(facing[1]), posted):
        finding = _deadlock_finding(ctx, group, ref, *facing)
        if finding.stalled_for_s is None or finding.stalled_for_s >= ctx.options.stall_after_s:
            return finding
    candidates: list[tuple[int, int, int, Entry, str]] = []
    for (kind, rank, peer), entries in posted.items():
        partner_kind = "recv" if kind == "send" else "send"
        partner = posted.get((partner_kind, peer, rank), [])
        first = entries[0]
        if peer not in ctx.dumpset.dumps:
            continue  # no dump for the partner: MissingDumps speaks for it
        if not partner:
            if _counterpart_done(ctx, group, tracks, rank, peer, first):
                continue  # its read is older than the peer's: the op is no longer pending
            candidates.append((first.time_created_ns or 0, rank, peer, first, "unmatched"))
        else:
            mine = first.input_sizes if kind == "send" else first.output_sizes
            theirs = partner[0].output_sizes if kind == "send" else partner[0].input_sizes
            if mine and theirs and mine != theirs:
                candidates.append((first.time_created_ns or 0, rank, peer, first, "size"))
    if not candidates:
        return None
    misdirected = (_misdirected(candidates) or _answered_cycle(candidates, posted, group, tracks)
                   or _owed(ctx, group, tracks, candidates))
    if misdirected is not None:
        candidates = [misdirected]
    else:
        # Wait chains end at a rank that waits on nobody: a peer that never posted the counterpart because
        # an open collective of its own holds it is no culprit here; the pending op waits, through it, on
        # that collective (whose own finding names who holds it).
        candidates = [c for c in candidates if c[4] != "unmatched" or ctx.waits.held_in_collective(c[2]) is None]
        if not candidates:
            return None
    created, rank, peer, entry, why = min(candidates, key=lambda c: (c[0], c[1]))
    age, age_source = _age(ctx, [rank], created)
    if why in ("unmatched", "misdirected", "owed") and age is not None and age < ctx.options.stall_after_s:
        return None
    kind = _kind(entry)
    evidence = ""
    if why == "misdirected":
        culprits = [rank]  # `rank` posted `entry` with the wrong partner; `peer` waits for it
        named = group.global_rank(entry.peer) if entry.peer is not None else None
        their_kind = next((k for k in ("recv", "send") if (k, peer, rank) in posted), "")
        waiting = (f"{their_kind} {'from' if their_kind == 'recv' else 'to'} rank {rank} waits for the counterpart "
                   f"rank {rank} posted behind that {kind}" if peer == named else
                   f"{'send to' if kind == 'recv' else 'recv from'} rank {rank} waits")
        summary = (
            f"Rank {rank} posted its {kind} (p2p #{entry.p2p_seq_id} of {ref.label()}) with rank {named}, which never "
            f"posts the counterpart, while rank {peer}'s pending {waiting}: rank {rank} named the wrong peer"
            + (f", for {fmt_duration(age)}" if age is not None else "") + "."
        )
        if peer == named:
            evidence = (f"rank {rank}'s pending ops with rank {peer}: a {kind} and, behind it, the {their_kind}'s "
                        f"counterpart; rank {peer}'s: a {their_kind} and no counterpart of rank {rank}'s {kind}")
    elif why == "owed":
        culprits = [rank]  # `rank` posted its recv from a peer that never sends; `peer` sent it the message
        named = group.global_rank(entry.peer) if entry.peer is not None else None
        summary = (
            f"Rank {rank} posted its recv (p2p #{entry.p2p_seq_id} of {ref.label()}) from rank {named}, which never "
            f"posts the send, while rank {peer} completed a send to rank {rank} that rank {rank} never posted a recv "
            f"for: rank {rank} named the wrong peer" + (f", for {fmt_duration(age)}" if age is not None else "") + "."
        )
        evidence = (f"rank {peer}'s recorder holds more completed sends to rank {rank} than rank {rank}'s holds "
                    f"recvs from rank {peer} (neither ring wrapped); rank {rank}'s oldest pending op is a recv from "
                    f"rank {named}, whose recorder holds no pending send to rank {rank}")
    elif why == "size":
        culprits = sorted({rank, peer})
        summary = (
            f"Rank {rank}'s {kind} with rank {peer} (p2p #{entry.p2p_seq_id} of {ref.label()}) has sizes "
            f"{entry.input_sizes or entry.output_sizes} that its partner's op does not match."
        )
    else:
        culprits = [peer]
        wanted = "recv from" if kind == "send" else "send to"
        summary = (
            f"Rank {peer} never posted the {wanted} rank {rank} that rank {rank}'s pending {kind} "
            f"(p2p #{entry.p2p_seq_id} of {ref.label()}) waits for"
            + (f", for {fmt_duration(age)}" if age is not None else "")
            + f"; rank {peer} is {ctx.activity(peer)}."
        )
    finding = _p2p_finding(ref, culprits, summary, entry, created, age, age_source)
    if evidence:
        finding.evidence.append(evidence)
    finding.ranks[rank] = ctx.rank_view(rank, group.name, entry)
    if why in ("misdirected", "owed"):
        finding.ranks[peer] = ctx.rank_view(peer, group.name, None)
    for culprit in culprits:
        if culprit != rank:
            finding.ranks[culprit] = ctx.rank_view(culprit, group.name, None)
        stack = ctx.live_stack(culprit)
        if stack:
            finding.culprit_stacks[culprit] = stack
    if entry.frames:
        finding.culprit_frames[rank] = entry.frames
    return finding


def unposted_batch(ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track]) -> Finding | None:
    """Pending batches whose peers the recorder does not name (NCCL's `coalesced` entry of a
    `batch_isend_irecv`) wait on the members that never posted their batch of that number
    (`waitfor.WaitGraph.batch_waits`). Wait chains end at a rank that waits on nobody: the culprits are
    those of them that do (in Python, idle: a stale read is one too); a member behind that is itself
    blocked waits on others, whose own findings name the cause. The oldest such batch speaks."""
    waits = ctx.waits
    pending: list[tuple[int, int, Entry, frozenset[int]]] = []  # (created, rank, batch, whom it waits on)
    for rank, track in tracks.items():
        batch = next((e for e in track.open_p2p() if e.peer is None), None)
        if batch is None:
            continue
        on = waits.batch_waits(rank, batch)
        if on is not None:
            pending.append((batch.time_created_ns or 0, rank, batch, on))
    if not pending:
        return None
    created, rank, entry, on = min(pending, key=lambda p: (p[0], p[1]))
    culprits = sorted(r for r in on if waits.of(r).sink and waits.of(r).state is not State.MISSING)
    if not culprits:
        return None
    age, age_source = _age(ctx, [rank], created)
    if age is not None and age < ctx.options.stall_after_s:
        return None
    # The batches that wait on the culprits alone (the others behind them wait on blocked ranks too: the
    # chain passes through those before it ends here)
    waiting = sorted(r for _, r, _, o in pending if o <= set(culprits)) or [rank]
    behind = sorted(r for _, r, _, o in pending if r not in waiting and o & set(culprits))
    first = culprits[0]
    doing = ctx.activity(first)
    one = len(culprits) == 1
    summary = (
        f"{plural(culprits).capitalize()} never posted {'its' if one else 'their'} batch of point-to-point ops "
        f"#{entry.p2p_seq_id} of {ref.label()}, which the pending batch{'' if len(waiting) == 1 else 'es'} of "
        f"{plural(waiting)} (peers unnamed in the recorder) wait{'s' if len(waiting) == 1 else ''} for"
        + (f", for {fmt_duration(age)}" if age is not None else "")
        + (f"; rank {first} is {doing}." if doing else ".")
    )
    finding = _p2p_finding(ref, culprits, summary, entry, created, age, age_source)
    finding.evidence.append(
        f"{plural(waiting)} wait{'s' if len(waiting) == 1 else ''} in batch #{entry.p2p_seq_id} of {ref.label()}; "
        f"{plural(culprits)} posted fewer point-to-point calls there and wait{'s' if one else ''} on nobody "
        "(ranks that exchange step by step meet in their batches of the same number)")
    if behind:
        finding.evidence.append(f"{plural(behind)} wait{'s' if len(behind) == 1 else ''} in later batches behind "
                                "blocked ranks, whose waits end here too")
    for culprit in culprits[: ctx.options.max_rank_views]:
        ctx.show_culprit(finding, culprit, group.name, None)
    for rank_waiting in [*waiting, *behind][: ctx.options.max_rank_views]:
        bucket = next((e for e in tracks[rank_waiting].open_p2p() if e.peer is None), None)
        finding.ranks[rank_waiting] = ctx.rank_view(rank_waiting, group.name, bucket, call_site=False)
    return finding
