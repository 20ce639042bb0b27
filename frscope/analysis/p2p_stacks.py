"""Point-to-point deadlocks seen only in live stacks (gloo records no p2p op at all).

A stack says which rank sits in `send`/`recv` and where it was called from, not its peer (the
worker server's traceback carries no arguments). What it does show is enough for the common shapes:

- a *chain*: consecutive ranks waiting in a receive, one behind the other, as pipeline stages do
  (stage r receives from r - 1): the first of them waits on the rank before it. Consecutive ranks
  waiting in a send (gloo's send waits for the matching receive) wait on the rank after the last of
  them. When that rank is in no torch.distributed call at all (stuck in Python: a data loader, a
  checkpoint), it is the one that breaks the pairing, and the waiting ranks are its victims;
- a *pair*: the only two ranks waiting in an exchange (the user function that called the op), both
  receiving first (or both sending first): neither op is the other's counterpart and nobody else there
  can post one, so they wait on each other, a cycle; ranks whose stage partners lead to them wait
  behind them. A sender and a receiver of one exchange, the receiver the next member after the sender
  in a group that holds every rank waiting there, *face* each other: both posted, they never match;
- a *closed* pairing: the blocked ranks wait only on each other (both sides receive first, or both
  send first): every one of them is a candidate, and the finding says so.

Ranks in Python end the waits only where the stacks do not read every wait as ending among the blocked
ranks (a pair, a facing pair, or behind one): there nobody waits on them.
"""

from __future__ import annotations

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.stacks import GROUP_CREATION, blocked_in, still_inside, user_frame
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
    free = [r for r in sorted(ctx.dumpset.dumps) if r not in blocked and r not in exclude and ctx.in_python(r)
            and not ctx.waits.went_on(r, blocked)]
    # Where the evidence names whom every blocked rank waits on (a monitored_barrier whose group its recorder
    # shows), the waits end only at those: a rank in Python outside them waits for nothing of theirs.
    named = [ctx.waits.named_waits(r) for r in blocked]
    if named and all(n is not None for n in named):
        waited = frozenset().union(*(n for n in named if n is not None))
        free = [r for r in free if r in waited]
    # A rank that returned from the step the blocked ranks wait in ran it to the end, posting what it posts;
    # one still in Python inside that step is where their waits end (principle 1).
    left = free
    free = still_inside([ctx.live_stack(r) for r in blocked], {r: ctx.live_stack(r) for r in free})
    left = [r for r in left if r not in free]
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
    if left:
        finding.evidence.append(
            f"{plural(left)} {'is' if len(left) == 1 else 'are'} in Python too, but outside the step the blocked "
            f"ranks wait in (the stack left the calls theirs share): {'it' if len(left) == 1 else 'they'} ran that "
            "step to the end, posting what it posts")
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


SENDS_RECEIVES = RECEIVES | {"send", "isend", "send_object_list"}


def _paired(ctx: Context, blocked: dict[int, str]) -> list[list[int]]:
    """Exchanges that only two blocked ranks wait in, both the same way (both receive first, or both send
    first): neither op can be the other's counterpart, and nobody else waits in that exchange to post one, so
    the two wait on each other (a cycle: both are candidates, the stacks carry no peer). Not where the two are
    consecutive stages of a chain (members of a group, one after the other) whose stage before them (after
    them, for senders) sits in Python: that stage never sent, and the second waits behind the first (the
    chain reading)."""
    sites: dict[tuple[str, str], list[int]] = {}
    for rank in sorted(blocked):
        site = _exchange(ctx, rank)
        if site is not None and blocked[rank] in SENDS_RECEIVES:
            sites.setdefault(site, []).append(rank)
    for rank in blocked:
        site = _exchange(ctx, rank)
        if site in sites and blocked[rank] not in SENDS_RECEIVES:
            del sites[site]  # a batch or barrier of that exchange waits too: not two ranks alone
    out: list[list[int]] = []
    for ranks in sites.values():
        if len(ranks) == 2 and len({blocked[r] in RECEIVES for r in ranks}) == 1 \
                and not _chain_from_python(ctx, ranks[0], ranks[1], blocked[ranks[0]] in RECEIVES, blocked):
            out.append(ranks)
    # Two senders whose next stages (the next member of a group each belongs to) are the ranks of a receiving
    # pair wait behind that pair (stages of parallel pipelines, each sending to its own next stage, busy
    # receiving elsewhere): the receiving pair is where the waits end.
    receiving = {r for pair in out if blocked[pair[0]] in RECEIVES for r in pair}
    after = _next_in_groups(ctx, blocked)
    return [pair for pair in out if blocked[pair[0]] in RECEIVES or not all(after[r] & receiving for r in pair)]


def _chain_from_python(ctx: Context, a: int, b: int, receiving: bool, blocked: dict[int, str]) -> bool:
    """Whether `a` and `b` (a < b) are consecutive stages of a group's order (the default group's, or a
    group's members in global rank order) whose stage before them (receivers: the member before `a`) or
    after them (senders: the member after `b`) sits in Python, in one and the same order: that stage never
    sent (received), and the second of the two waits behind the first."""
    orders: list[tuple[int, ...]] = [(a - 1, a, b, b + 1)] if b == a + 1 else []
    orders += [g.ranks for g in ctx.dumpset.groups.values() if a in g.ranks and b in g.ranks]
    for order in orders:
        i = order.index(a)
        if i + 1 >= len(order) or order[i + 1] != b:
            continue
        h = i - 1 if receiving else i + 2
        if 0 <= h < len(order) and order[h] in ctx.dumpset.dumps and order[h] not in blocked \
                and ctx.in_python(order[h]) and not ctx.waits.went_on(order[h], (a, b)):
            return True
    return False


def _behind(ctx: Context, ranks: set[int], blocked: dict[int, str]) -> list[int]:
    """Blocked ranks whose stage partners (`_partners`), followed from rank to rank (and through a partner
    held in a recorded collective, to the members that collective waits on), reach `ranks`: they wait
    behind them (one walk back along the waits, from `ranks`)."""
    waiters: dict[int, list[int]] = {}
    for rank, partners in _partners(ctx, blocked).items():
        if blocked[rank] in SENDS_RECEIVES:
            for partner in partners:
                waiters.setdefault(partner, []).append(rank)
                # a partner held in a recorded collective waits on that collective's missing members
                if partner not in blocked and partner in ctx.dumpset.dumps \
                        and ctx.waits.held_in_collective(partner) is not None:
                    for member in ctx.waits.of(partner).on or ():
                        waiters.setdefault(member, []).append(partner)
    reached = set(ranks)
    todo = list(ranks)
    while todo:
        for waiter in waiters.get(todo.pop(), ()):
            if waiter not in reached:
                reached.add(waiter)
                todo.append(waiter)
    return sorted((reached - ranks) & set(blocked))


def _partners(ctx: Context, blocked: dict[int, str]) -> dict[int, set[int]]:
    """The ranks each blocked rank may wait on as a pipeline stage: a receive on the member before it in a
    group it belongs to, a send on the member after it (the rank before or after it, in the default group)."""
    after = _next_in_groups(ctx, blocked)
    before: dict[int, set[int]] = {r: {r - 1} for r in blocked}
    for group in ctx.dumpset.groups.values():
        for a, b in zip(group.ranks, group.ranks[1:], strict=False):
            if b in before:
                before[b].add(a)
    return {r: before[r] if blocked[r] in RECEIVES else after[r] for r in blocked}


def _next_in_groups(ctx: Context, blocked: dict[int, str]) -> dict[int, set[int]]:
    """For each blocked rank, the members right after it in the groups it belongs to (torch numbers a group's
    members in global rank order, and a pipeline stage sends to the next member of its group)."""
    out: dict[int, set[int]] = {r: {r + 1} for r in blocked}
    for group in ctx.dumpset.groups.values():
        for a, b in zip(group.ranks, group.ranks[1:], strict=False):
            if a in out:
                out[a].add(b)
    return out


def _facing(ctx: Context, runs: list[list[int]], blocked: dict[int, str], groups: bool = True
            ) -> tuple[int, int, list[int]] | None:
    """Pipeline stages send forward: a rank blocked sending to the next member of a group, blocked receiving
    in the same exchange, face each other, and both being posted, their ops do not match. (A receive called
    from another exchange is not the counterpart of that send: that rank is busy elsewhere.) The group is
    one that holds every rank waiting in that exchange (an exchange's ops run on one group: the default
    group, where the stage after a rank is the rank after it, or a pipeline group of non-consecutive ranks,
    whose members torch numbers in global rank order; `groups` False: the default group's only). (sender,
    receiver, the ranks waiting in a row behind either); None without such a pair, or with more than one."""
    site = {r: _exchange(ctx, r) for r in blocked}
    sites: dict[tuple[str, str] | None, set[int]] = {}
    for rank in blocked:
        sites.setdefault(site[rank], set()).add(rank)

    def faces(a: int, b: int) -> bool:
        return (a in blocked and b in blocked and blocked[a] not in RECEIVES and blocked[b] in RECEIVES
                and site[a] == site[b])

    found = {(a, a + 1) for a in blocked if faces(a, a + 1)}
    for group in ctx.dumpset.groups.values() if groups else ():
        pairs = [(a, b) for a, b in zip(group.ranks, group.ranks[1:], strict=False) if faces(a, b)]
        if pairs:
            members = set(group.ranks)
            found.update((a, b) for a, b in pairs if sites[site[a]] <= members)
    if len(found) != 1:
        return None
    sender, receiver = found.pop()
    rows = [run for run in runs if sender in run or receiver in run]
    return sender, receiver, [r for run in rows for r in run if r not in (sender, receiver)]


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


def _chain(ctx: Context, blocked: dict[int, str]) -> bool:
    """Whether the waits may be a chain of pipeline stages: a pipeline's first stage receives from nobody and
    its last sends to nobody, so a receiver at the first rank (or a sender at the last) means they are not."""
    last = max(ctx.dumpset.dumps, default=0)
    return not any((blocked[r[0]] in RECEIVES and r[0] == 0) or (blocked[r[-1]] not in RECEIVES and r[-1] == last)
                   for r in _runs(blocked))


def _waits_close(ctx: Context, blocked: dict[int, str]) -> bool:
    """Every blocked rank waits in send/recv, and the stacks read each wait as ending among the blocked ranks:
    at a pair of one exchange (`_paired`), at a facing pair (`_facing`), or behind one, rank to rank."""
    if any(op not in SENDS_RECEIVES for op in blocked.values()):
        return False
    ends = {r for pair in _paired(ctx, blocked) for r in pair}
    # (a facing pair along another group's order is no reason to pass over ranks in Python: the default
    # group's chain may end at one of them, which explains the waits on its own)
    facing = _facing(ctx, _runs(blocked), blocked, groups=False) if _chain(ctx, blocked) else None
    if facing is not None:
        ends |= {facing[0], facing[1]}
    return bool(ends) and set(blocked) <= ends | set(_behind(ctx, ends, blocked))


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
    # Where the stacks read every wait as ending among the blocked ranks (a pair of one exchange, a facing
    # pair, ranks waiting in a row behind one), a rank in Python is no end of theirs: nobody waits on it.
    if not _waits_close(ctx, blocked):
        sink = _sink_in_python(ctx, ref, blocked, exclude)
        if sink is not None:
            return sink
    # Ranks creating a group wait for every rank that has not come to create it, never for one partner: where
    # no rank in Python ends their waits, no pairing of send/recv is read from them.
    blocked = {r: op for r, op in blocked.items() if op not in GROUP_CREATION}
    if not blocked:
        return None
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
    paired = _paired(ctx, blocked)
    left = blocked
    if paired:
        taken = {r for pair in paired for r in pair}
        waiting = _behind(ctx, taken, blocked)
        culprits.extend(sorted(taken))
        for a, b in paired:
            kind = "receive" if blocked[a] in RECEIVES else "send"
            named = blocked[a] if blocked[a] == blocked[b] else f"{blocked[a]} / {blocked[b]}"  # torch's own names
            pairings.append(
                f"ranks {a} and {b} both wait in {named}{_site(ctx, a)}, the only ranks waiting in that exchange: "
                f"neither op is the other's counterpart and nobody else there can post one, so they wait on each "
                f"other (each side tries to {kind} first)")
        if waiting:
            pairings[-1] += (f"; {plural(waiting)} wait{'s' if len(waiting) == 1 else ''} behind them, each on the "
                             "next rank in the chain")
        left = {r: op for r, op in blocked.items() if r not in taken and r not in waiting}
    # whether the other waits may be a chain of stages (a pair's ranks, explained by the pair, say nothing of it)
    chain = bool(left) and _chain(ctx, left)
    runs = _runs(left)
    facing = _facing(ctx, runs, left) if chain else None
    if facing is not None:
        sender, receiver, behind_ranks = facing
        behind_ranks = sorted(set(behind_ranks) | set(_behind(ctx, {sender, receiver}, left)))
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
        if chain and partner in ctx.dumpset.dumps and partner not in blocked and ctx.in_python(partner) \
                and not ctx.waits.went_on(partner, run):
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
    broken_by_python = facing is None and not closed and odd is None and not paired
    finding = Finding(
        category=Category.RANK_NOT_JOINED if broken_by_python else Category.P2P_MISMATCH,
        culprit_ranks=tuple(culprits),
        process_group=ref,
        summary=summary,
        op=blocked[first_blocked],
        # Two ranks that both receive (or both send) first deadlock together: one of them broke the order,
        # which stacks without peers cannot tell; a facing pair that never matches: one has the wrong peer.
        ambiguous=(bool(closed) and len(culprits) > 1) or facing is not None or bool(paired),
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
        "before it, in the default group's order or a group's); a send/recv pair deadlocks when both sides send "
        "(or both receive) first, or when the peer or tag differ"
    )
    if paired:
        finding.evidence.append(
            "the only ranks waiting in their exchange, both the same way: "
            + "; ".join(f"ranks {a} and {b} in {blocked[a]}{_site(ctx, a)}" for a, b in paired))
    return finding
