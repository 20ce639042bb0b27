"""Point-to-point ops: pending sends and receives that have no partner.

NCCL records p2p ops ('nccl:send 0->1', 'nccl:recv 1<-0', group-local ranks, their own p2p_seq_id).
Gloo records none at all, so there the only evidence is a rank's live stack sitting in send/recv
(`p2p_stacks.py`).
"""

from __future__ import annotations

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.tracks import Track
from frscope.analysis.wording import fmt_duration
from frscope.records import Entry, GroupInfo


def _pending(track: Track) -> list[Entry]:
    return track.open_p2p()


def recorded_p2p(ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track]) -> Finding | None:
    """The oldest pending p2p op whose partner has no matching pending op (or a different size)."""
    pending: dict[int, list[Entry]] = {r: p for r, t in tracks.items() if (p := _pending(t))}
    if not pending:
        return None
    # Index the receivers' side: (receiver, sender) -> pending recvs, (sender, receiver) -> pending sends.
    posted: dict[tuple[str, int, int], list[Entry]] = {}
    for rank, entries in pending.items():
        for entry in entries:
            peer = group.global_rank(entry.peer) if entry.peer is not None else None
            if peer is None:
                continue
            kind = "send" if entry.op in ("send", "isend") else "recv"
            posted.setdefault((kind, rank, peer), []).append(entry)
    candidates: list[tuple[int, int, int, Entry, str]] = []
    for (kind, rank, peer), entries in posted.items():
        partner_kind = "recv" if kind == "send" else "send"
        partner = posted.get((partner_kind, peer, rank), [])
        first = entries[0]
        if peer not in ctx.dumpset.dumps:
            continue  # no dump for the partner: MissingDumps speaks for it
        if not partner:
            candidates.append((first.time_created_ns or 0, rank, peer, first, "unmatched"))
        else:
            mine = first.input_sizes if kind == "send" else first.output_sizes
            theirs = partner[0].output_sizes if kind == "send" else partner[0].input_sizes
            if mine and theirs and mine != theirs:
                candidates.append((first.time_created_ns or 0, rank, peer, first, "size"))
    if not candidates:
        return None
    created, rank, peer, entry, why = min(candidates, key=lambda c: (c[0], c[1]))
    now = ctx.now_for([rank])
    age = (now - created) / 1e9 if now and created else None
    if why == "unmatched" and age is not None and age < ctx.options.stall_after_s:
        return None
    kind = "send" if entry.op in ("send", "isend") else "recv"
    if why == "size":
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
    finding = Finding(
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
        age_source=ctx.age_source([rank]) if age is not None else None,
    )
    finding.ranks[rank] = ctx.rank_view(rank, group.name, entry)
    for culprit in culprits:
        if culprit != rank:
            finding.ranks[culprit] = ctx.rank_view(culprit, group.name, None)
        stack = ctx.live_stack(culprit)
        if stack:
            finding.culprit_stacks[culprit] = stack
    if entry.frames:
        finding.culprit_frames[rank] = entry.frames
    return finding
