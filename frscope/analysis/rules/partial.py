"""A collective that ended on some ranks and never completed on the others.

Every member entered it, and while the rest wait, a few recorded it finished. A collective needs
every member, so those few did not finish it with the others: their part ended on its own. With gloo
that is what a local failure looks like (the work fails at once and is retired: an all_to_all whose
split sizes do not balance on that rank fails gloo's own check before sending anything; the others
then wait, or lose the connection), and what a rank that finished and then died leaves behind.
Split sizes are not recorded, so the recorder cannot tell the two apart: the finding says that the
rank's log or exit message decides (rule `exits` speaks where the runner says the process failed).
Where a member may have left no dump (a member without one, or a group known only from its entries while
some rank left none), that is the likelier end: gloo fails a rank's part the moment a peer's connection
closes, and the missing rank explains the wait (rule `missing`).
"""

from __future__ import annotations

from frscope.analysis.findings import Category, Finding, sizes_of
from frscope.analysis.ops import VARIABLE_SIZE_OPS
from frscope.analysis.rules.facts import Facts, GroupFacts
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.stuck import StuckPoint
from frscope.analysis.wording import fmt_duration, plural


def ended_alone(facts: Facts) -> list[Proposal]:
    out: list[Proposal] = []
    for gf in facts.groups:
        point = gf.point
        if point is None or not gf.waiting or gf.suspects_missing or gf.stale:
            continue
        ended = sorted(r for r in point.joined if r not in gf.waiting)
        if not ended or len(ended) >= len(gf.waiting):
            continue  # not a minority: which side is odd the recorder cannot tell (the hang rule speaks)
        out.append(Proposal(_finding(facts, gf, point, ended), "ended-alone", [(gf.name, point.seq)]))
    return out


def _finding(facts: Facts, gf: GroupFacts, point: StuckPoint, ended: list[int]) -> Finding:
    ctx = facts.ctx
    seq = point.seq
    bucket = gf.live[ended[0]].by_seq.get(seq)
    sample = bucket[0] if bucket else None
    op = sample.op if sample else gf.waiting_op
    since = f" for {fmt_duration(point.age_s)}" if point.age_s is not None else ""
    them = "its" if len(ended) == 1 else "their"
    waiting = list(gf.waiting)
    if op in VARIABLE_SIZE_OPS:
        category = Category.SIZE_MISMATCH
        summary = (
            f"{plural(ended).capitalize()} ended {op} #{seq} of {gf.ref.label()} at once while {plural(waiting)} "
            f"{'waits' if len(waiting) == 1 else 'wait'} in it{since}: {them} part failed on {them} own, as {op} "
            "does when a rank's split sizes do not balance (gloo checks them before sending anything)."
        )
    else:
        category = Category.RANK_STOPPED
        summary = (
            f"{plural(ended).capitalize()} recorded {op} #{seq} of {gf.ref.label()} finished while {plural(waiting)} "
            f"{'waits' if len(waiting) == 1 else 'wait'} in it{since}: a collective needs every member, so {them} "
            f"part ended on {them} own (failed locally, or the rank finished and then died)."
        )
    finding = Finding(category=category, culprit_ranks=tuple(ended), process_group=gf.ref, summary=summary,
                      collective_seq_id=seq, op=op, **sizes_of(sample), since_ns=point.since_ns,
                      stalled_for_s=point.age_s, age_source=point.age_source)
    for rank in ended[: ctx.options.max_rank_views]:
        entries = gf.live[rank].by_seq.get(seq)
        finding.ranks[rank] = ctx.rank_view(rank, gf.name, entries[0] if entries else None)
        stack = ctx.live_stack(rank)
        if stack:
            finding.culprit_stacks[rank] = stack
    for rank in waiting[:3]:
        entries = gf.live[rank].by_seq.get(seq)
        finding.ranks[rank] = ctx.rank_view(rank, gf.name, entries[0] if entries else None, call_site=False)
    finding.evidence.append(
        f"{plural(ended)} recorded #{seq} finished (retired), {plural(waiting)} did not: the others cannot have "
        "finished it with them")
    finding.evidence.append(
        "the recorder holds no split sizes or error: "
        + ("the rank's log or exit message decides (gloo: 'inLengthPerRank[myRank] == outLengthPerRank[myRank]' "
           "for unbalanced splits)" if op in VARIABLE_SIZE_OPS
           else "the rank's exit code decides whether it died after finishing or its part failed")
    )
    return finding
