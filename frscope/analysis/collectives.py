"""Cross-rank checks of one process group's collectives.

Two questions per group, both linear in the entries:
1. Did the ranks ever disagree on a collective (type, sizes, dtypes)? With equal byte counts gloo
   completes such a collective silently with wrong data, so the whole visible history is scanned and
   the earliest disagreement is what counts.
2. Where is the group stuck? The first collective that is not complete on every rank: who never
   entered it (RankNotJoined), or, if everyone did, that it never finished (NotCompleted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from frscope.analysis.clock import CAPTURED, MTIME, MTIME_CAPPED
from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef, sizes_of
from frscope.analysis.ops import (
    RETIRES_FAILED,
    ROOTED_OPS,
    SAME_SIZE_SIDE,
    VARIABLE_SIZE_OPS,
    agreeing_sizes,
    numel,
    self_consistency_error,
)
from frscope.analysis.stacks import P2P_FUNCTIONS, blocked_in, user_frame
from frscope.analysis.tracks import Track, oldest_open
from frscope.analysis.wording import fmt_duration, fmt_ranks, plural
from frscope.records import COMPLETED, STARTED, Entry, GroupInfo

Bucket = list[Entry]


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


def _same(a: Bucket, b: Bucket) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        # The common case (identical calls) is one tuple comparison done in C.
        if (x.op, x.input_sizes, x.output_sizes, x.input_dtypes, x.output_dtypes) == (
            y.op,
            y.input_sizes,
            y.output_sizes,
            y.input_dtypes,
            y.output_dtypes,
        ):
            continue
        if x.op != y.op:
            return False
        if agreeing_sizes(x.op, x.input_sizes, x.output_sizes) != agreeing_sizes(y.op, y.input_sizes, y.output_sizes):
            return False
        if x.op in SAME_SIZE_SIDE:
            if _agreeing_dtypes(x) != _agreeing_dtypes(y):
                return False
        elif x.op in ROOTED_OPS:
            if x.input_dtypes and y.input_dtypes and x.input_dtypes != y.input_dtypes:
                return False
        elif x.input_dtypes != y.input_dtypes or x.output_dtypes != y.output_dtypes:
            return False
    return True


def _op_key(b: Bucket) -> str:
    return "+".join(e.op for e in b)


def _size_key(b: Bucket) -> str:
    return repr([agreeing_sizes(e.op, e.input_sizes, e.output_sizes) for e in b])


def _agreeing_dtypes(e: Entry) -> list[str]:
    """scatter / gather: the dtypes of the side every rank passes (the other is the root's alone)."""
    return e.output_dtypes if SAME_SIZE_SIDE[e.op] == "output" else e.input_dtypes


def _dtype_key(b: Bucket) -> str:
    return repr([_agreeing_dtypes(e) if e.op in SAME_SIZE_SIDE
                 else (e.input_dtypes, e.output_dtypes if e.op not in ROOTED_OPS else None) for e in b])


def _majority(
    buckets: dict[int, Bucket], key: Callable[[Bucket], str], history: Bucket | None
) -> tuple[str, list[int], bool] | None:
    """(expected key, culprit ranks, ambiguous), or None when every rank agrees on this key.

    The largest class is what the group meant to do. On a tie (2 ranks, or halves) the class that
    matches the group's last agreed collective wins; if that does not decide, it is ambiguous and
    every tied rank is a candidate."""
    classes: dict[str, list[int]] = {}
    for rank, bucket in buckets.items():
        classes.setdefault(key(bucket), []).append(rank)
    if len(classes) < 2:
        return None
    sizes = Counter({k: len(v) for k, v in classes.items()})
    ranked = sizes.most_common()
    top = [k for k, n in ranked if n == ranked[0][1]]
    ambiguous = False
    if len(top) == 1:
        expected = top[0]
    else:
        previous = key(history) if history is not None else None
        if previous in top:
            expected = previous
        else:
            expected, ambiguous = top[0], True
    if ambiguous:
        culprits = sorted(r for k in top for r in classes[k])
        culprits += sorted(r for k, rs in classes.items() if k not in top for r in rs)
    else:
        culprits = sorted(r for k, rs in classes.items() if k != expected for r in rs)
    return expected, culprits, ambiguous


def _describe_bucket(b: Bucket, what: str) -> str:
    if what == "op":
        return _op_key(b)
    if what == "sizes":
        first = b[0]
        side = SAME_SIZE_SIDE.get(first.op)
        if side is not None:  # the root-only side differs by design: name the side that must agree
            return f"{side} {first.output_sizes if side == 'output' else first.input_sizes}"
        return f"input {first.input_sizes} output {first.output_sizes}"
    first = b[0]
    if first.op in SAME_SIZE_SIDE:
        return f"{SAME_SIZE_SIDE[first.op]} {_agreeing_dtypes(first)}"
    return f"input {first.input_dtypes} output {first.output_dtypes}"


def classify_mismatch(
    ctx: Context, ref: GroupRef, seq: int, buckets: dict[int, Bucket], history: Bucket | None
) -> Finding | None:
    for category, key, what in (
        (Category.COLLECTIVE_TYPE_MISMATCH, _op_key, "op"),
        (Category.SIZE_MISMATCH, _size_key, "sizes"),
        (Category.DTYPE_MISMATCH, _dtype_key, "dtypes"),
    ):
        verdict = _majority(buckets, key, history)
        if verdict is None:
            continue
        expected, culprits, ambiguous = verdict
        good = next(b for b in buckets.values() if key(b) == expected)
        good_ranks = sorted(r for r, b in buckets.items() if key(b) == expected)
        first_culprit = culprits[0]
        bad = buckets[first_culprit]
        # Where the culprit called it from: the recorder's frames at enqueue, else its live stack.
        site = user_frame(bad[0].frames) or user_frame(ctx.live_stack(first_culprit))
        where = f", called from {site.filename}:{site.line} ({site.name})" if site else ""
        if ambiguous:
            summary = (
                f"Ranks disagree on {what} at collective #{seq} of {ref.label()}: "
                + "; ".join(
                    f"{plural([r for r in culprits if key(buckets[r]) == k])} "
                    f"{_describe_bucket(buckets[next(r for r in culprits if key(buckets[r]) == k)], what)}"
                    for k in dict.fromkeys(key(buckets[r]) for r in culprits)
                )
                + " (no majority: any of them may be the culprit)."
            )
        elif category is Category.COLLECTIVE_TYPE_MISMATCH:
            summary = (
                f"{plural(culprits).capitalize()} called {_op_key(bad)} where {plural(good_ranks)} called "
                f"{_op_key(good)} at collective #{seq} of {ref.label()}{where}."
            )
        else:
            summary = (
                f"{plural(culprits).capitalize()} passed {what} {_describe_bucket(bad, what)} to {_op_key(good)} "
                f"#{seq} of {ref.label()} where {plural(good_ranks)} passed {_describe_bucket(good, what)}{where}."
            )
        finding = Finding(
            category=category,
            culprit_ranks=tuple(culprits),
            process_group=ref,
            summary=summary,
            collective_seq_id=seq,
            op=good[0].op,
            **sizes_of(good[0]),
            ambiguous=ambiguous,
            since_ns=min((b[0].time_created_ns for b in buckets.values() if b[0].time_created_ns), default=None),
        )
        _add_views(ctx, finding, ref.name, buckets, culprits, good_ranks)
        return finding
    return None


def _self_consistency(
    ctx: Context, group: GroupInfo, ref: GroupRef, seq: int, buckets: dict[int, Bucket]
) -> Finding | None:
    """all_gather / reduce_scatter output vs input x group size; all_to_all totals across ranks."""
    if group.membership_source == "entries":
        return None  # membership guessed from entries: the group size is not trustworthy
    size = len(group.ranks)
    bad: dict[int, str] = {}
    for rank, bucket in buckets.items():
        for entry in bucket:
            error = self_consistency_error(entry.op, entry.input_sizes, entry.output_sizes, size)
            if error:
                bad[rank] = error
    if bad and len(bad) < len(buckets):
        culprits = sorted(bad)
        entry = buckets[culprits[0]][0]
        finding = Finding(
            category=Category.SIZE_MISMATCH,
            culprit_ranks=tuple(culprits),
            process_group=ref,
            summary=(
                f"{plural(culprits).capitalize()} called {entry.op} #{seq} of {ref.label()} with sizes that do not "
                f"fit the group: {bad[culprits[0]]}."
            ),
            collective_seq_id=seq,
            op=entry.op,
            input_sizes=entry.input_sizes,
            output_sizes=entry.output_sizes,
        )
        _add_views(ctx, finding, ref.name, buckets, culprits, sorted(set(buckets) - set(bad)))
        return finding
    ops = {e.op for b in buckets.values() for e in b}
    uneven = (_unbalanced_minority(buckets, complete=len(buckets) == size)
              if ops and ops <= VARIABLE_SIZE_OPS and not ops & ROOTED_OPS else None)
    if uneven is not None:
        culprits, balanced = uneven
        entry = buckets[culprits[0]][0]
        finding = Finding(
            category=Category.SIZE_MISMATCH,
            culprit_ranks=tuple(culprits),
            process_group=ref,
            summary=(
                f"{plural(culprits).capitalize()} called {entry.op} #{seq} of {ref.label()} sending "
                f"{numel(entry.input_sizes)} elements and expecting {numel(entry.output_sizes)}, where "
                f"{plural(balanced)} send as many as they receive: "
                f"{'its' if len(culprits) == 1 else 'their'} split sizes do not balance."
            ),
            collective_seq_id=seq,
            op=entry.op,
            input_sizes=entry.input_sizes,
            output_sizes=entry.output_sizes,
            since_ns=min((b[0].time_created_ns for b in buckets.values() if b[0].time_created_ns), default=None),
        )
        finding.evidence.append(
            "with gloo, the rank that receives more than it expects aborts at once without a dump: it is the "
            "victim, the unbalanced sender the cause")
        _add_views(ctx, finding, ref.name, buckets, culprits, balanced)
        return finding
    if len(buckets) == size and ops and ops <= VARIABLE_SIZE_OPS and not ops & ROOTED_OPS:
        sent = sum(numel(e.input_sizes) for b in buckets.values() for e in b)
        received = sum(numel(e.output_sizes) for b in buckets.values() for e in b)
        if sent != received:
            finding = Finding(
                category=Category.SIZE_MISMATCH,
                culprit_ranks=tuple(sorted(buckets)),
                process_group=ref,
                summary=(
                    f"{next(iter(ops))} #{seq} of {ref.label()} does not add up: the ranks send {sent} elements "
                    f"in all and expect to receive {received} (split sizes disagree)."
                ),
                collective_seq_id=seq,
                op=next(iter(ops)),
                ambiguous=True,
            )
            _add_views(ctx, finding, ref.name, buckets, sorted(buckets), [])
            return finding
    return None


def _unbalanced_minority(buckets: dict[int, Bucket], complete: bool) -> tuple[list[int], list[int]] | None:
    """all_to_all: the ranks whose input and output sizes differ, when most ranks' are equal (an even
    exchange) and at least two are: a rank with one split more or less is the odd one out. With every
    member there and the totals even, uneven ranks make up for each other (routed tokens): no finding."""
    balance = {r: sum(numel(e.input_sizes) - numel(e.output_sizes) for e in b) for r, b in buckets.items()}
    if complete and not sum(balance.values()):
        return None
    odd = sorted(r for r, d in balance.items() if d)
    even = sorted(r for r, d in balance.items() if not d)
    if odd and len(even) >= 2 and len(odd) < len(even):
        return odd, even
    return None


def _add_views(
    ctx: Context, finding: Finding, group: str, buckets: dict[int, Bucket], culprits: list[int], others: list[int]
) -> None:
    cap = ctx.options.max_rank_views
    for rank in culprits[:cap]:
        bucket = buckets.get(rank)
        ctx.show_culprit(finding, rank, group, bucket[0] if bucket else None)
    for rank in others[:3]:
        bucket = buckets.get(rank)
        finding.ranks[rank] = ctx.rank_view(rank, group, bucket[0] if bucket else None, call_site=False)


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


def _held_at(tracks: dict[int, Track], idle: Callable[[int], bool], completed_is_success: bool = False) -> int:
    """The collective the group is held at: the lowest one a member has not finished, unless every member
    that has not finished it is behind members that all finished it and entered a later one. Evidence must
    agree: a collective every other member finished is not what holds the group (the lagging recorder
    was read before its completion showed, or its process stopped there); the others wait in the next
    one, for the ranks that never entered it. Where 'completed' means the collective succeeded (NCCL,
    not gloo, which retires a failed one too), one member's 'completed' settles it for all (a collective
    finishes on none without every member; a group's collectives finish in order): the group is held at
    the first collective no member finished, whatever the lagging recorders still show as pending."""
    if completed_is_success:
        return max(t.next_seq for t in tracks.values())
    seq = min(t.next_seq for t in tracks.values())
    behind = [t for t in tracks.values() if t.next_seq == seq]
    ahead = [t for t in tracks.values() if t.next_seq > seq]
    if not ahead or any(t.last_seq > seq for t in behind):
        return seq
    later = min(t.next_seq for t in ahead)
    if all(t.last_seq >= later for t in ahead):
        return later
    # Members that went past `seq` to the same place, where their live stacks show them in no
    # torch.distributed call, wait nowhere: `seq` is not what holds the group (where they finished all they
    # enqueued, nothing does). Without such stacks a backend that retires a failed collective as finished
    # (gloo) may show the same record after a timeout (async ops queued behind it fail too).
    if all(t.next_seq == later and t.last_seq > seq and idle(t.rank) for t in ahead):
        return later
    return seq


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
                   completed_is_success=None not in backends and not backends & RETIRES_FAILED)
    joined = sorted(r for r, t in tracks.items() if t.last_seq >= seq)
    if not joined:
        return None  # every rank is done with everything it enqueued: idle, not stuck
    if all(tracks[r].last_completed >= seq for r in joined) and all(
            (d := ctx.dumpset.dumps.get(r)) is not None and d.backend and d.backend not in RETIRES_FAILED
            for r in joined):
        return None  # it succeeded without a member that shows none of it: that member's read is older
    not_joined = sorted(set(tracks) - set(joined))
    entered = [e for r in joined for e in tracks[r].by_seq.get(seq, ())]
    created = [e.time_created_ns for e in entered if e.time_created_ns]
    since = min(created) if created else None
    # The latest read of any member counts: one read long after the others entered, and still not in
    # it, shows the collective stood still that long.
    now, read_by = ctx.clock.now_for(sorted(tracks))
    if read_by == MTIME_CAPPED:
        # The files are copies: when the recorders were read is lost, and so is the age. An age made up
        # from the collective's timeout would decide "stalled" by a few microseconds between groups.
        return StuckPoint(seq, joined, not_joined, since, None, True, ctx.clock.unknown_age(since))
    age = (now - since) / 1e9 if (now is not None and since is not None) else None
    members = set(group.ranks) | set(tracks)
    stalled = (age is None or age >= ctx.options.stall_after_s or bool(failed & members)
               or bool(not_joined and gone & members and max(t.last_seq for t in tracks.values()) == seq)
               or _failed_without(ctx, tracks, seq, joined, not_joined))
    source = ctx.age_source(sorted(tracks)) if age is not None else None
    timeouts = [e.timeout_ms for e in entered if e.timeout_ms]
    if age is not None and timeouts and age > min(timeouts) / 1000:
        # The collective's own timeout ended it (it failed then): the recorders were read later. Its
        # age is no longer than the timeout; the report says so.
        timeout_s = min(timeouts) / 1000
        source = f"{source}; capped at the collective's {fmt_duration(timeout_s)} timeout, which ended it " \
                 f"{fmt_duration(age - timeout_s)} before the recorders were read"
        age = timeout_s
    return StuckPoint(seq, joined, not_joined, since, age, stalled, source)


def _stuck_finding(
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


def _sinks_among(ctx: Context, not_joined: list[int]) -> tuple[list[int], list[int]]:
    """(culprits, waiting ranks) of the ranks that never joined: a rank blocked in a p2p op whose peer the
    recorder does not name (a coalesced batch), or one the recorder does not keep (gloo's send/recv, seen
    in the rank's live stack), or in an earlier collective that members never entered, waits on others;
    where the rest that never joined wait on nobody (every op they recorded finished), the wait chain
    ends at those."""
    idle: list[int] = []
    in_p2p: list[int] = []
    for rank in not_joined:
        dump = ctx.dumpset.dumps.get(rank)
        open_entry = oldest_open(dump.entries) if dump is not None else None
        if open_entry is None:
            (in_p2p if blocked_in(ctx.live_stack(rank)) in P2P_FUNCTIONS else idle).append(rank)
        elif open_entry.is_p2p and open_entry.peer is None:
            in_p2p.append(rank)
        elif not open_entry.is_p2p and _waits_in_earlier(ctx, rank, open_entry):
            in_p2p.append(rank)
        else:
            return not_joined, []
    if idle and in_p2p:
        return idle, in_p2p
    return not_joined, []


def _waits_in_earlier(ctx: Context, rank: int, entry: Entry) -> bool:
    """The rank is blocked in an earlier collective that members of its group never entered (an object
    collective's first op, a tree broadcast relayed through a rank that never came): it waits on them,
    so it is no sink. Only where the op blocks the caller (gloo), or its live stack shows it waiting."""
    return bool(_waits_on(ctx, rank, entry))


def _waits_on(ctx: Context, rank: int, entry: Entry) -> set[int]:
    """The members of the entry's group that never entered it, where the rank is blocked in it (its op
    blocks the caller on gloo, or its live stack shows it waiting); empty otherwise."""
    dump = ctx.dumpset.dumps.get(rank)
    if not (dump is not None and dump.backend == "gloo") and blocked_in(ctx.live_stack(rank)) is None:
        return set()
    tracks = ctx.tracks.get(entry.pg_name, {})
    return {r for r, t in tracks.items() if r != rank and t.last_seq < entry.collective_seq_id}


def _p2p_unseen(ctx: Context, ranks: list[int]) -> bool:
    """The ranks are idle (nothing open in any group) and a point-to-point wait would be invisible: their
    backend records no p2p op (gloo) and no live stack says where they are."""
    for rank in ranks:
        dump = ctx.dumpset.dumps.get(rank)
        if dump is None or dump.backend != "gloo" or ctx.live_stack(rank) or oldest_open(dump.entries) is not None:
            return False
    return True


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
        if (open_entry := oldest_open(dump.entries)) is not None:
            waits = _waits_on(ctx, rank, open_entry) if not open_entry.is_p2p else set()
            if waits and waits <= set(point.joined):
                continue  # blocked elsewhere on the ranks in this collective: no evidence either way
            return False
        idle.append(rank)
        inside = blocked_in(ctx.live_stack(rank))
        if inside is not None and inside != "monitored_barrier":
            return False  # waiting in an op the recorder does not keep (gloo's send/recv) for a peer: not idle
        # (in monitored_barrier it went on to the barrier, which waits for every member not in it: the ranks
        # blocked here)
    return len(point.joined) < len(idle)


def _extra_call_finding(ctx: Context, group: GroupInfo, ref: GroupRef, tracks: dict[int, Track], point: StuckPoint,
                        buckets: dict[int, Bucket], op: str, since: str, sample: Entry | None) -> Finding:
    seq, culprits = point.seq, point.joined
    idle = [r for r in point.not_joined
            if (d := ctx.dumpset.dumps.get(r)) is not None and oldest_open(d.entries) is None]
    waiting = [r for r in point.not_joined if r not in idle]
    last = {tracks[r].last_seq for r in idle}
    where = f"#{last.pop()}" if len(last) == 1 else "their last collective"
    summary = (
        f"{plural(culprits).capitalize()} called {op} #{seq} of {ref.label()}, which {plural(idle)} never called: "
        f"{'it has' if len(culprits) == 1 else 'they have'} been blocked in it{since}, while the others finished "
        f"everything they enqueued (idle after {where}); {'it' if len(culprits) == 1 else 'they'} ran one collective "
        "more than the rest of the group (e.g. more batches of uneven data)."
    )
    finding = _stuck_finding(Category.RANK_NOT_JOINED, culprits, ref, summary, seq, op, sample, point)
    finding.evidence.append(
        f"{plural(idle)} ({len(idle)} of the group's {len(idle) + len(culprits)} ranks with a recorder) "
        f"recorded nothing open in any group: the odd side is the {len(culprits)} in #{seq}")
    if waiting:
        finding.evidence.append(f"{plural(waiting)} never called it either, blocked in another group's collective "
                                f"that {plural(culprits)} never entered: they wait on {plural(culprits)}")
    _add_views(ctx, finding, group.name, buckets, culprits, idle)
    return finding


def _odd_exchange(buckets: dict[int, Bucket]) -> tuple[list[int], list[int]] | None:
    """An all_to_all that stands still on every rank, where a clear majority of ranks (two or more) passed
    the same sizes and the rest others: (the odd ranks, the majority). Its sizes may differ by design
    (uneven splits), so they alone decide nothing; that the exchange never finished anywhere, with one
    side odd, points at that side's counts."""
    ops = {e.op for b in buckets.values() for e in b}
    if not ops or not ops <= VARIABLE_SIZE_OPS or ops & ROOTED_OPS:
        return None
    classes: dict[object, list[int]] = {}
    for rank, bucket in buckets.items():
        key = tuple((tuple(map(tuple, e.input_sizes)), tuple(map(tuple, e.output_sizes))) for e in bucket)
        classes.setdefault(key, []).append(rank)
    if len(classes) < 2:
        return None
    ranked = sorted(classes.values(), key=len, reverse=True)
    common = ranked[0]
    if len(common) < 2 or len(common) == len(ranked[1]) or 2 * len(common) <= len(buckets):
        return None
    return sorted(r for rs in ranked[1:] for r in rs), sorted(common)


def _odd_exchange_finding(ctx: Context, group: str, ref: GroupRef, buckets: dict[int, Bucket],
                          odd: tuple[list[int], list[int]], seq: int, op: str, since: str,
                          point: StuckPoint) -> Finding:
    culprits, common = odd
    bad, good = buckets[culprits[0]][0], buckets[common[0]][0]
    summary = (
        f"{plural(culprits).capitalize()} passed sizes input {bad.input_sizes} output {bad.output_sizes} to {op} "
        f"#{seq} of {ref.label()} where {plural(common)} passed input {good.input_sizes} output "
        f"{good.output_sizes}, and it never completed on any rank{since}."
    )
    finding = _stuck_finding(Category.SIZE_MISMATCH, culprits, ref, summary, seq, op, good, point)
    finding.evidence.append(
        f"{op}'s sizes may differ between ranks by design (uneven splits), so they alone decide nothing; here "
        f"every rank entered it and none finished it, and {plural(culprits)} alone "
        f"{'differs' if len(culprits) == 1 else 'differ'} from the {len(common)} others")
    _add_views(ctx, finding, group, buckets, culprits, common)
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
        culprits, in_p2p = _sinks_among(ctx, point.not_joined)
        first = culprits[0]
        doing = ctx.activity(first)
        doing_text = f"; rank {first} is {doing}" if doing else ""
        summary = (
            f"{plural(culprits).capitalize()} never joined {op} #{seq} of {ref.label()}, which "
            f"{plural(point.joined)} {'has' if len(point.joined) == 1 else 'have'} been blocked in{since}{doing_text}."
        )
        finding = _stuck_finding(Category.RANK_NOT_JOINED, culprits, ref, summary, seq, op, sample, point)
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
        if len(culprits) > 1 and not in_p2p and _p2p_unseen(ctx, culprits):
            # Several idle ranks, and neither recorder nor stack would show one waiting on another in a
            # send/recv (gloo records none): all stuck, or one stuck and the rest waiting on it.
            finding.ambiguous = True
            finding.evidence.append(
                f"{plural(culprits)} show nothing open, and this backend records no point-to-point op: one may "
                "wait on another in a send/recv (live stacks would tell)")
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
    odd = _odd_exchange(buckets) if len(not_done) == len(buckets) else None
    if odd is not None:
        return _odd_exchange_finding(ctx, group.name, ref, buckets, odd, seq, op, since, point)
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
    finding = _stuck_finding(Category.NOT_COMPLETED, culprits, ref, summary, seq, op, sample, point)
    _add_views(ctx, finding, group.name, buckets, culprits, sorted(set(buckets) - set(culprits)))
    durations = [b[0].duration_ms for b in buckets.values() if b[0].duration_ms]
    if durations:
        finding.evidence.append(f"recorded durations so far: up to {max(durations):.0f} ms")
    finding.evidence.append(f"states: {dict(Counter(states.values()))} over {plural(not_done)}")
    if fmt_ranks(culprits) != fmt_ranks(not_done):
        finding.evidence.append(f"not completed on {plural(not_done)}")
    return finding
