"""Point-to-point deadlocks seen only in live stacks (gloo records no p2p op at all).

A stack says which rank sits in `send`/`recv` and where it was called from, not its peer (the
worker server's traceback carries no arguments). What it does show is enough for the common shapes:

- a *chain*: consecutive ranks waiting in a receive, one behind the other, as pipeline stages do
  (stage r receives from r - 1): the first of them waits on the rank before it. Consecutive ranks
  waiting in a send (gloo's send waits for the matching receive) wait on the rank after the last of
  them. When that rank is in no torch.distributed call at all (stuck in Python: a data loader, a
  checkpoint), it is the one that breaks the pairing, and the waiting ranks are its victims;
- a *closed* pairing: the blocked ranks wait only on each other (both sides receive first, or both
  send first): every one of them is a candidate, and the finding says so.
"""

from __future__ import annotations

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.stacks import blocked_in, user_frame
from frscope.analysis.tracks import blocked_entry
from frscope.analysis.waitfor import UNRECORDED_OPS
from frscope.analysis.wording import plural

RECEIVES = frozenset({"recv", "irecv", "recv_object_list"})


def _site(ctx: Context, rank: int) -> str:
    site = user_frame(ctx.live_stack(rank))
    return f" at {site.filename}:{site.line} ({site.name})" if site else ""


def _sink_in_python(ctx: Context, ref: GroupRef, blocked: dict[int, str], exclude: set[int]) -> Finding | None:
    """The wait chain ends at a rank that waits on nobody: ranks blocked in unrecorded ops (send/recv,
    a pipeline schedule's batched p2p, monitored_barrier) while a few others sit in Python, in no
    torch.distributed call. Whoever each blocked rank waits for, the waits can only end at those: they
    never joined the exchange (a stage stuck before its recv, a rank stuck before the barrier)."""
    free = [r for r in sorted(ctx.dumpset.dumps) if r not in blocked and r not in exclude and ctx.in_python(r)]
    # Several ranks in Python, as many as wait: which of them the waits end at is not said (one may be done).
    # A single one is the only place they can end.
    if not free or (len(free) >= len(blocked) and len(free) > 1):
        return None
    ops = sorted(set(blocked.values()))
    first = free[0]
    finding = Finding(
        category=Category.RANK_NOT_JOINED,
        culprit_ranks=tuple(free),
        process_group=ref,
        summary=(f"{plural(free).capitalize()} never joined the {'/'.join(ops)} that {plural(sorted(blocked))} "
                 f"{'is' if len(blocked) == 1 else 'are'} blocked in; rank {first} is {ctx.activity(first)}."),
        op=ops[0],
    )
    for rank in free[: ctx.options.max_rank_views]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
        if stack := ctx.live_stack(rank):
            finding.culprit_stacks[rank] = stack
    for rank in sorted(blocked)[:3]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
    finding.evidence.append(
        "blocked in unrecorded ops: " + ", ".join(f"rank {r} in {op}{_site(ctx, r)}" for r, op in
                                                  sorted(blocked.items())[:8])
        + ("" if len(blocked) <= 8 else f" and {len(blocked) - 8} more"))
    finding.evidence.append(
        f"{plural(free)} {'is' if len(free) == 1 else 'are'} in Python, in no torch.distributed call: every wait "
        "among the blocked ranks ends there (the recorder shows none of these ops: gloo records no point-to-point "
        "op, and monitored_barrier runs as point-to-point)")
    return finding


def _runs(blocked: dict[int, str]) -> list[list[int]]:
    """Consecutive ranks waiting in the same direction (all receiving, or all sending)."""
    runs: list[list[int]] = []
    for rank in sorted(blocked):
        if runs and rank == runs[-1][-1] + 1 and (blocked[rank] in RECEIVES) == (blocked[runs[-1][-1]] in RECEIVES):
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return runs


def _exchange(ctx: Context, rank: int) -> tuple[str, str] | None:
    """Which exchange of the program the rank waits in: the user function that called the op (its file and
    name). One exchange's sends and receives sit there, whatever their direction or line."""
    frame = user_frame(ctx.live_stack(rank))
    return (frame.filename, frame.name) if frame else None


def _may_pair(ctx: Context, rank: int, blocked: dict[int, str]) -> bool:
    """Other ranks wait in the rank's exchange, every one of them the same way (all receive, or all send):
    two such ranks may wait on each other (both received first; the stacks carry no peer), rather than
    each on its stage partner. An exchange with senders and receivers is a pipeline's, stage to stage."""
    mine = _exchange(ctx, rank)
    same = [r for r in blocked if _exchange(ctx, r) == mine]
    return len(same) > 1 and len({blocked[r] in RECEIVES for r in same}) == 1


def _facing(ctx: Context, runs: list[list[int]], blocked: dict[int, str]) -> tuple[int, int, list[int]] | None:
    """Pipeline stages send forward: a rank blocked sending next to the rank after it, blocked receiving
    in the same exchange, face each other, and both being posted, their ops do not match. (A receive
    called from another exchange is not the counterpart of that send: that rank is busy elsewhere.)
    (sender, receiver, the receivers behind either); None without such a pair, or with more than one."""
    found = [(a, b) for a, b in zip(runs, runs[1:], strict=False)
             if blocked[a[-1]] not in RECEIVES and blocked[b[0]] in RECEIVES and b[0] == a[-1] + 1
             and _exchange(ctx, a[-1]) == _exchange(ctx, b[0])]
    if len(found) != 1:
        return None
    sends, receives = found[0]
    return sends[-1], receives[0], [*sends[:-1], *receives[1:]]


def _odd_ones(ctx: Context, ranks: list[int], blocked: dict[int, str]) -> list[int] | None:
    """Among ranks that wait on each other, the few that differ from the rest: by the exchange they wait
    in (every rank runs the same program, so the odd exchange is the one off the path; its sends and
    receives are one exchange, not two), else by how far their recorder got (the rank a step ahead or
    behind). None when nothing sets a minority apart."""
    def site(rank: int) -> object:
        return _exchange(ctx, rank)

    def progress(rank: int) -> object:
        dump = ctx.dumpset.dumps.get(rank)
        return tuple(sorted((g, t.last_completed) for g, tracks in ctx.tracks.items()
                            if (t := tracks.get(rank)) is not None)) if dump is not None else None

    for key in (site, progress):
        classes: dict[object, list[int]] = {}
        for rank in ranks:
            classes.setdefault(key(rank), []).append(rank)
        if len(classes) < 2:
            continue
        biggest = max(classes.values(), key=len)
        if sum(len(v) == len(biggest) for v in classes.values()) > 1:
            continue  # no single majority
        return sorted(r for r in ranks if r not in biggest)
    return None


def stack_p2p(ctx: Context, ref: GroupRef, exclude: set[int]) -> Finding | None:
    """Ranks whose live stack sits in send/recv although the recorder shows nothing pending there."""
    blocked: dict[int, str] = {}
    for rank in sorted(ctx.dumpset.dumps):
        if rank in exclude:
            continue
        inside = blocked_in(ctx.live_stack(rank))
        if inside in UNRECORDED_OPS:
            blocked[rank] = inside
    if not blocked:
        return None
    sink = _sink_in_python(ctx, ref, blocked, exclude)
    if sink is not None:
        return sink
    # A monitored_barrier waits for every member of its group that is not in it, not for one partner: where
    # other ranks are blocked (in send/recv, or in a recorded collective), the ranks in the barrier wait for
    # them, not on each other (where they wait for the barrier's ranks in turn, that is a cycle the stuck
    # point decides).
    barrier = {r for r, op in blocked.items() if op == "monitored_barrier"}
    if barrier and (len(barrier) < len(blocked) or any(
            r not in blocked and (d := ctx.dumpset.dumps.get(r)) is not None and blocked_entry(d.entries) is not None
            for r in ctx.dumpset.dumps)):
        blocked = {r: op for r, op in blocked.items() if r not in barrier}
        if not blocked:
            return None
    culprits: list[int] = []
    pairings: list[str] = []
    closed: list[int] = []
    runs = _runs(blocked)
    # A pipeline's first stage receives from nobody and its last sends to nobody: a receiver at the
    # first rank (or a sender at the last) means these waits are no chain of stages.
    last = max(ctx.dumpset.dumps, default=0)
    chain = not any((blocked[r[0]] in RECEIVES and r[0] == 0) or (blocked[r[-1]] not in RECEIVES and r[-1] == last)
                    for r in runs)
    facing = _facing(ctx, runs, blocked) if chain else None
    if facing is not None:
        sender, receiver, behind_ranks = facing
        culprits.extend([sender, receiver])
        behind = (f"; {plural(behind_ranks)} wait{'s' if len(behind_ranks) == 1 else ''} behind them, each on the "
                  "next rank in the chain") if behind_ranks else ""
        pairings.append(
            f"rank {sender} waits in {blocked[sender]}{_site(ctx, sender)} for rank {receiver} (the stage after it) "
            f"while rank {receiver} waits in {blocked[receiver]}{_site(ctx, receiver)}, for the stage before it: "
            "both are posted and they never match, so one of the two uses another peer, tag or size (the stacks "
            f"carry no peer: rank {sender} or rank {receiver}){behind}")
        runs = [r for r in runs if not set(r) & {sender, receiver, *behind_ranks}]
    for run in runs:
        receiving = blocked[run[0]] in RECEIVES
        # Receivers wait on the stage before the first of them, senders on the stage after the last.
        waiter, partner = (run[0], run[0] - 1) if receiving else (run[-1], run[-1] + 1)
        if chain and partner not in blocked and ctx.waits.held_in_collective(partner) is not None \
                and not set(run) & (ctx.waits.of(partner).on or frozenset()) \
                and not _may_pair(ctx, run[0], blocked):
            # The rank the run waits on is held in a recorded collective that waits on none of the run's
            # ranks: the run's waits go on, through it, to whoever holds that collective (its own finding):
            # victims, no pairing of their own. (Where that collective waits on the run, the two wait on
            # each other, and where the run's exchange holds others waiting its way, they may wait on one
            # another: the reading below stands.)
            continue
        # The rank the run waits on breaks the chain when it is stuck in Python. One that went on to a
        # collective may have skipped its send, but two ranks receiving from each other leave the same
        # stacks (they carry no peer): such a run is a closed pairing.
        if chain and partner in ctx.dumpset.dumps and partner not in blocked and ctx.in_python(partner):
            culprits.append(partner)
            others = [r for r in run if r != waiter]
            behind = (f", and {plural(others)} wait{'s' if len(others) == 1 else ''} behind it in "
                      f"{blocked[others[0]]}, each on the next rank in the chain") if others else ""
            pairings.append(
                f"rank {waiter} waits in {blocked[waiter]}{_site(ctx, waiter)} for rank {partner} (the stage "
                f"{'before' if receiving else 'after'} it), which never {'sends' if receiving else 'receives'}: "
                f"it is {ctx.activity(partner)}{behind}"
            )
        else:
            closed.extend(run)
    odd = _odd_ones(ctx, closed, blocked) if len(closed) > 2 else None
    if closed and odd:
        culprits.extend(odd)
        rest = [r for r in closed if r not in odd]
        pairings.append(
            f"{plural(closed)} wait in {'/'.join(sorted({blocked[r] for r in closed}))} with no partner making "
            f"progress; {plural(odd)} {'differs' if len(odd) == 1 else 'differ'} from {plural(rest)}: "
            + "; ".join(f"rank {r} in {blocked[r]}{_site(ctx, r)}" for r in [*odd, *rest][:6])
        )
        closed = []
    if closed:
        culprits.extend(closed)
        ops = sorted({blocked[r] for r in closed})
        kind = "receive first" if set(ops) <= RECEIVES else "send first" if not set(ops) & RECEIVES else "wait"
        pairings.append(
            f"{plural(closed)} wait in {'/'.join(ops)} with no partner making progress: "
            + "; ".join(f"rank {r} in {blocked[r]}{_site(ctx, r)}" for r in closed[:6])
            + (f" (they wait on each other: each side tries to {kind})" if len(closed) > 1 and kind != "wait" else "")
        )
    if not pairings:
        return None  # every wait goes on through a rank held in a recorded collective
    culprits = sorted(set(culprits))
    backend = {d.backend for d in ctx.dumpset.dumps.values() if d.backend}
    unrecorded = (
        " (this backend does not record point-to-point ops, so only the stacks show them)"
        if backend <= {"gloo"}
        else ""
    )
    summary = "; ".join(pairings)
    summary = summary[0].upper() + summary[1:] + unrecorded + "."
    first_blocked = min(blocked)
    # Every wait that ends at a rank in Python (no facing pair, no closed pairing): that rank never joined
    # the exchange; no two posted ops failed to match.
    broken_by_python = facing is None and not closed and odd is None
    finding = Finding(
        category=Category.RANK_NOT_JOINED if broken_by_python else Category.P2P_MISMATCH,
        culprit_ranks=tuple(culprits),
        process_group=ref,
        summary=summary,
        op=blocked[first_blocked],
        # Two ranks that both receive (or both send) first deadlock together: one of them broke the order,
        # which stacks without peers cannot tell; a facing pair that never matches: one has the wrong peer.
        ambiguous=(bool(closed) and len(culprits) > 1) or facing is not None,
    )
    if finding.ambiguous:
        finding.would_decide = ("the peer each rank named in its send/recv: NCCL's recorder keeps it; gloo's "
                                "does not, and stacks carry no arguments")
    for rank in culprits[: ctx.options.max_rank_views]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
        stack = ctx.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack
    for rank in sorted(set(blocked) - set(culprits))[:3]:
        finding.ranks[rank] = ctx.rank_view(rank, ref.name, None)
    finding.evidence.append(
        "blocked in p2p: " + ", ".join(f"rank {r} in {op}" for r, op in sorted(blocked.items())[:16])
        + ("" if len(blocked) <= 16 else f" and {len(blocked) - 16} more")
    )
    finding.evidence.append(
        "the stacks carry no peer: a chain of receives is read as pipeline stages (each waits on the rank "
        "before it); a send/recv pair deadlocks when both sides send (or both receive) first, or when the "
        "peer or tag differ"
    )
    return finding
