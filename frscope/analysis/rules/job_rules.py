"""Rules that look at the whole job: p2p from live stacks, stragglers."""

from __future__ import annotations

from frscope.analysis.findings import Category
from frscope.analysis.p2p_stacks import stack_p2p
from frscope.analysis.rules.facts import Facts
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.straggler import LAST_SHARE, find_straggler, last_counts
from frscope.analysis.stragglers_steps import find_step_straggler


def p2p_from_stacks(facts: Facts) -> list[Proposal]:
    """Ranks whose live stack sits in send/recv while their recorder shows no p2p op pending (backends
    that record p2p are read by rule `p2p`)."""
    recorded = {r for gf in facts.groups for r, t in gf.tracks.items() if t.open_p2p()}
    found = stack_p2p(facts.ctx, facts.default_ref, recorded)
    return [Proposal(found, "p2p-stacks", [])] if found is not None else []


def stragglers(facts: Facts) -> list[Proposal]:
    """A rank late at every collective, or at step boundaries, per group; one finding per rank. A rank
    late in one group only because it waited in another group for a straggler there (a tensor-parallel
    peer of a slow rank reaches the data-parallel group late too) is that straggler's consequence."""
    out: list[Proposal] = []
    for gf in facts.groups:
        if not gf.tracks:
            continue
        found = find_straggler(facts.ctx, gf.ref, gf.tracks) or find_step_straggler(facts.ctx, gf.ref, gf.tracks)
        if found is not None and not any(
            p.finding.category is Category.STRAGGLER and p.finding.culprit_ranks == found.culprit_ranks for p in out
        ):
            out.append(Proposal(found, "straggler", []))
    if len(out) > 1:
        _inherited(facts, out)
    return out


def _inherited(facts: Facts, found: list[Proposal]) -> None:
    """Mark each straggler that, in a group it shares with another straggler, waits for that one."""
    by_rank = {p.finding.culprit_ranks[0]: p for p in found}
    waits_for: dict[int, tuple[int, str]] = {}
    for gf in facts.groups:
        members = [r for r in by_rank if r in gf.tracks]
        if len(members) < 2:
            continue
        counts, samples = last_counts(gf.tracks)
        if not samples:
            continue
        latest = max(members, key=lambda r: counts.get(r, 0))
        if counts.get(latest, 0) / samples < LAST_SHARE:
            continue
        for rank in members:
            if rank != latest and rank not in waits_for and counts.get(rank, 0) < counts[latest]:
                waits_for[rank] = (latest, gf.ref.label())
    for rank, (cause, where) in waits_for.items():
        if waits_for.get(cause, (None,))[0] == rank:
            continue  # each waits for the other somewhere: neither explains the other
        proposal = by_rank[rank]
        proposal.caused_by = by_rank[cause].finding
        proposal.finding.evidence.append(
            f"rank {rank} is early in {where}, where it waits for rank {cause}: its lateness here is "
            f"rank {cause}'s, passed on")
