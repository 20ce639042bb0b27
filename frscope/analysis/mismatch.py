"""Did the ranks of a group disagree on a collective (type, sizes, dtypes)?

With equal byte counts gloo completes such a collective silently with wrong data, so the whole visible
history is scanned (`history`) and the earliest disagreement is what counts. The largest class of ranks is
what the group meant to do; a tie is settled by the group's last agreed collective, else ambiguous.
Collectives whose sizes differ by design (all_to_all's splits, a root's side) are judged on what must
agree: the side every rank passes, or the totals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding, GroupRef, sizes_of
from frscope.analysis.ops import (
    ROOTED_OPS,
    SAME_SIZE_SIDE,
    VARIABLE_SIZE_OPS,
    agreeing_sizes,
    numel,
    self_consistency_error,
)
from frscope.analysis.stacks import user_frame
from frscope.analysis.stuck import StuckPoint, stuck_finding
from frscope.analysis.wording import plural
from frscope.records import Entry, GroupInfo

Bucket = list[Entry]


def same(a: Bucket, b: Bucket) -> bool:
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


HISTORY = 24  # agreed collectives kept for a tie: three repetitions of a step of up to 8
MAX_PERIOD = 8


def _same_phase(keys: list[str]) -> str | None:
    """What the group's own pattern says comes next: its recorded collectives repeat with a period (a step
    of p collectives, the smallest that the last three repetitions, or as many as are kept, follow), and
    the next one is what came p collectives before. One collective repeated is period 1: the last one."""
    n = len(keys)
    for period in range(1, min(MAX_PERIOD, n // 2) + 1):
        if all(keys[i] == keys[i - period] for i in range(max(period, n - 3 * period), n)):
            return keys[n - period]
    return keys[-1] if keys else None


def _majority(
    buckets: dict[int, Bucket], key: Callable[[Bucket], str], history: Sequence[Bucket]
) -> tuple[str, list[int], bool] | None:
    """(expected key, culprit ranks, ambiguous), or None when every rank agrees on this key.

    The largest class is what the group meant to do. On a tie (2 ranks, or halves) the class that
    matches the group's own recorded order wins (`_same_phase` over its last agreed collectives, oldest
    first: a rank that skipped one is out of phase with every earlier step); if that does not decide, it
    is ambiguous and every tied rank is a candidate."""
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
        previous = _same_phase([key(b) for b in history])
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
    ctx: Context, ref: GroupRef, seq: int, buckets: dict[int, Bucket], history: Sequence[Bucket]
) -> Finding | None:
    """`history`: the group's last agreed collectives (at most `HISTORY`), oldest first."""
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
            would_decide=("a third rank in the collective, or an earlier collective of the group where they agreed "
                          "(the recorders keep none)") if ambiguous else None,
            since_ns=min((b[0].time_created_ns for b in buckets.values() if b[0].time_created_ns), default=None),
        )
        add_views(ctx, finding, ref.name, buckets, culprits, good_ranks)
        return finding
    return None


def self_consistency(
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
        add_views(ctx, finding, ref.name, buckets, culprits, sorted(set(buckets) - set(bad)))
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
        add_views(ctx, finding, ref.name, buckets, culprits, balanced)
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
                would_decide="the split sizes each rank meant to pass (the recorder keeps what they passed, which "
                             "does not add up, not which rank is wrong)",
            )
            add_views(ctx, finding, ref.name, buckets, sorted(buckets), [])
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


def add_views(
    ctx: Context, finding: Finding, group: str, buckets: dict[int, Bucket], culprits: list[int], others: list[int]
) -> None:
    cap = ctx.options.max_rank_views
    for rank in culprits[:cap]:
        bucket = buckets.get(rank)
        ctx.show_culprit(finding, rank, group, bucket[0] if bucket else None)
    for rank in others[:3]:
        bucket = buckets.get(rank)
        finding.ranks[rank] = ctx.rank_view(rank, group, bucket[0] if bucket else None, call_site=False)


def odd_exchange(buckets: dict[int, Bucket]) -> tuple[list[int], list[int]] | None:
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


def odd_exchange_finding(ctx: Context, group: str, ref: GroupRef, buckets: dict[int, Bucket],
                          odd: tuple[list[int], list[int]], seq: int, op: str, since: str,
                          point: StuckPoint) -> Finding:
    culprits, common = odd
    bad, good = buckets[culprits[0]][0], buckets[common[0]][0]
    summary = (
        f"{plural(culprits).capitalize()} passed sizes input {bad.input_sizes} output {bad.output_sizes} to {op} "
        f"#{seq} of {ref.label()} where {plural(common)} passed input {good.input_sizes} output "
        f"{good.output_sizes}, and it never completed on any rank{since}."
    )
    finding = stuck_finding(Category.SIZE_MISMATCH, culprits, ref, summary, seq, op, good, point)
    finding.evidence.append(
        f"{op}'s sizes may differ between ranks by design (uneven splits), so they alone decide nothing; here "
        f"every rank entered it and none finished it, and {plural(culprits)} alone "
        f"{'differs' if len(culprits) == 1 else 'differ'} from the {len(common)} others")
    add_views(ctx, finding, group, buckets, culprits, common)
    return finding

