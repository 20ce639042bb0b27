"""Which findings are causes and which are consequences.

A rank blocked in an op waits for someone: in a collective, for the group's ranks that are missing or
stuck; in a p2p op, for its peer. Following those waits from a finding's culprits leads to another
finding (or nowhere: the culprit is busy in Python, or dead). A finding reached this way is the
cause; the finding we started from nests under it. Ranks stuck in Python explain every group they
left waiting, so findings with the same culprits nest under the earliest. Cycles — ranks that
issued two groups' collectives in different orders — become one root with a cross-group note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from frscope.analysis.context import Context
from frscope.analysis.crossgroup import breach_of, describe, describe_skip, family_kind, skipped_kind
from frscope.analysis.findings import Category, Finding
from frscope.analysis.waitfor import MAX_HOPS, State

HANGS = (Category.RANK_NOT_JOINED, Category.NOT_COMPLETED)


@dataclass(slots=True)
class Causes:
    """Where each stuck point's finding is, for the walk."""

    at_point: dict[tuple[str, int], Finding] = field(default_factory=dict)
    p2p: list[Finding] = field(default_factory=list)
    unrecorded_p2p: Finding | None = None
    missing: Finding | None = None


def cause_of_rank(ctx: Context, causes: Causes, rank: int, before_record: int | None = None) -> Finding | None:
    """The finding at the end of the rank's wait chain (`waitfor.WaitGraph.chain`): the point of the
    collective it is held at, the p2p finding of a pair on its way, the rank missing, the unrecorded
    exchange it or a peer sits in, or the failed collective an idle rank last waited in. None where the
    chain ends at a rank that waits on nobody (in Python, idle) or loops."""
    hops = ctx.waits.chain(rank, before_record)
    for wait in hops:
        if wait.entry is not None and wait.entry.is_p2p:
            for finding in causes.p2p:
                if finding.process_group.name == wait.entry.pg_name and wait.rank in finding.ranks:
                    return finding
    end = hops[-1]
    if end.entry is not None and end.entry.is_p2p:
        return None  # a loop of p2p waits, a peer the recorder does not name, or a chain too long
    if end.state is State.MISSING:
        return causes.missing
    if end.entry is not None:
        return causes.at_point.get((end.entry.pg_name, end.entry.collective_seq_id))
    # Nothing open: an unrecorded exchange it sits in (the ranks that finding names are where such waits
    # end when it names ranks in Python: not waiting there), a group that may lack a missing member, or
    # the collective gloo retired as failed while it waited.
    unrecorded = causes.unrecorded_p2p
    if unrecorded is not None and (
        (end.rank in unrecorded.culprit_ranks and unrecorded.category is not Category.RANK_NOT_JOINED)
        or end.state is State.IN_UNRECORDED
    ):
        return unrecorded
    if causes.missing is not None and ctx.waits.last_group_may_lack_a_member(end.rank):
        return causes.missing
    failed = ctx.waits.failed_wait(end.rank)
    return causes.at_point.get(failed) if failed is not None else None


def _culprit_record(ctx: Context, finding: Finding, rank: int) -> int | None:
    """For NotCompleted: the culprit's own entry; its device is busy with something older than it."""
    if finding.category is not Category.NOT_COMPLETED or finding.collective_seq_id is None:
        return None
    track = ctx.tracks.get(finding.process_group.name, {}).get(rank)
    bucket = track.by_seq.get(finding.collective_seq_id) if track else None
    return bucket[0].record_id if bucket else None


def link(ctx: Context, findings: list[Finding], causes: Causes,
         parent: dict[int, Finding] | None = None) -> list[Finding]:
    """Nest consequences under their causes; return the roots. `parent`: links already decided (a
    finding -> its cause), kept as they are."""
    parent = dict(parent or {})
    for finding in findings:
        if finding.category not in HANGS or id(finding) in parent:
            continue
        for rank in finding.culprit_ranks:
            cause = cause_of_rank(ctx, causes, rank, _culprit_record(ctx, finding, rank))
            if cause is not None and cause is not finding:
                parent[id(finding)] = cause
                break

    # A rank that stopped early (stale or no dump, or died) explains every group it left waiting.
    stopped = [f for f in findings if f.category is Category.RANK_STOPPED]
    for finding in findings:
        if finding.category in HANGS and id(finding) not in parent:
            # (a culprit whose own wait leads to the stopped rank is no sink of its own: it waited for it)
            cause = next((s for s in stopped if all(
                r in s.culprit_ranks or cause_of_rank(ctx, causes, r) is s for r in finding.culprit_ranks)), None)
            if cause is not None:
                parent[id(finding)] = cause

    # A sink explains every wait that ends at it: findings whose culprits are the same ranks that wait on
    # nobody are one root. The collective they never joined holds the job (a p2p op such a rank never
    # posted is queued before it), the earliest first.
    free = sorted(
        (f for f in findings if id(f) not in parent and (f.category is Category.RANK_NOT_JOINED or (
            f.category is Category.P2P_MISMATCH and f.culprit_ranks and not any(
                ctx.waits.of(r).state in (State.BLOCKED, State.MISSING) for r in f.culprit_ranks)))),
        key=lambda f: (f.category is not Category.RANK_NOT_JOINED, f.since_ns or 2**63),
    )
    for i, later in enumerate(free):
        for earlier in free[:i]:
            if (earlier.category is Category.RANK_NOT_JOINED and id(earlier) not in parent
                    and set(later.culprit_ranks) <= set(earlier.culprit_ranks)):
                parent[id(later)] = earlier
                break

    _break_cycles(ctx, findings, parent)

    def root_of(finding: Finding) -> Finding:
        current = finding
        while id(current) in parent:
            current = parent[id(current)]
        return current

    roots: list[Finding] = []
    for finding in findings:
        root = root_of(finding)
        if root is finding:
            roots.append(finding)
        else:
            root.consequences.append(finding)
    return roots


def _breaker(ctx: Context, cycle: list[Finding], findings: list[Finding]) -> tuple[Finding, str, Finding] | None:
    """The finding whose culprit broke its own order of groups, with how it did, and the member of the
    cycle that culprit is named in. The finding is the cycle's own, or (the rank skipped a third
    group, whose collective it never joined) the finding of the group it skipped."""
    found: list[tuple[Finding, str, Finding]] = []
    for member in cycle:
        for rank in member.culprit_ranks[:MAX_HOPS]:
            breach = breach_of(ctx, rank)
            if breach is None:
                # its own group of the kind it skipped is unknown (it never recorded in it): the kind says
                kind = family_kind(ctx, member.process_group.name)
                if kind is not None and skipped_kind(ctx, rank) == kind:
                    found.append((member, describe_skip(ctx, rank, member.process_group.label()), member))
                    break
                continue
            if breach.usual == member.process_group.name:
                found.append((member, describe(ctx, breach), member))
                break
            skipped = next((f for f in findings if f.process_group.name == breach.usual and rank in f.culprit_ranks
                            and f.category is Category.RANK_NOT_JOINED), None)
            if skipped is not None:
                found.append((skipped, describe(ctx, breach), member))
                break
    return found[0] if len({id(f[0]) for f in found}) == 1 else None


def _odd_side(cycle: list[Finding]) -> Finding | None:
    """Two groups' hangs waiting on each other: of the ranks both groups share, those in one collective are
    the culprits of the other's. The fewer broke the order the rest kept (an extra or skipped call on their
    side): the finding that names them is the root. None on a tie, or another shape of cycle."""
    if len(cycle) != 2 or any(f.category not in HANGS for f in cycle):
        return None
    a, b = cycle
    shared = set(a.process_group.ranks) & set(b.process_group.ranks)
    in_a, in_b = shared & set(a.culprit_ranks), shared & set(b.culprit_ranks)
    if not in_a or not in_b or in_a & in_b or len(in_a) == len(in_b):
        return None
    return a if len(in_a) < len(in_b) else b


def _break_cycles(ctx: Context, findings: list[Finding], parent: dict[int, Finding]) -> None:
    by_id = {id(f): f for f in findings}
    for finding in findings:
        seen: list[int] = []
        current = id(finding)
        while current in parent and current not in seen:
            seen.append(current)
            current = id(parent[current])
        if current not in seen:
            continue  # reached a root: no cycle on this path
        cycle = [by_id[i] for i in seen[seen.index(current) :]]
        breaker = _breaker(ctx, cycle, findings)
        root = breaker[0] if breaker else (_odd_side(cycle) or min(
            cycle, key=lambda f: (f.since_ns or 2**63, f.process_group.name)))
        if breaker is not None and all(root is not f for f in cycle):
            # The skipped group's finding, outside the cycle: the cycle hangs from it.
            parent[id(breaker[2])] = root
        # Every member's parent link is cut at the root; the others then nest under it.
        parent.pop(id(root), None)
        labels = ", ".join(f"{f.op} #{f.collective_seq_id} of {f.process_group.label()}" for f in cycle)
        root.evidence.insert(
            0,
            f"cross-group deadlock: {labels} wait for each other; their ranks issued these collectives "
            "in different orders",
        )
        if breaker:
            root.evidence.insert(0, breaker[1])
