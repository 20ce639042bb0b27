"""Rules that look at the whole job: p2p from live stacks, stragglers."""

from __future__ import annotations

from frscope.analysis.findings import Category
from frscope.analysis.p2p_stacks import stack_p2p
from frscope.analysis.rules.facts import Facts
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.straggler import find_straggler
from frscope.analysis.stragglers_steps import find_step_straggler


def p2p_from_stacks(facts: Facts) -> list[Proposal]:
    """Ranks whose live stack sits in send/recv while their recorder shows no p2p op pending (backends
    that record p2p are read by rule `p2p`)."""
    recorded = {r for gf in facts.groups for r, t in gf.tracks.items() if t.open_p2p()}
    found = stack_p2p(facts.ctx, facts.default_ref, recorded)
    return [Proposal(found, "p2p-stacks", [])] if found is not None else []


def stragglers(facts: Facts) -> list[Proposal]:
    """A rank late at every collective, or at step boundaries, per group; one finding per rank."""
    out: list[Proposal] = []
    for gf in facts.groups:
        if not gf.tracks:
            continue
        found = find_straggler(facts.ctx, gf.ref, gf.tracks) or find_step_straggler(facts.ctx, gf.ref, gf.tracks)
        if found is not None and not any(
            p.finding.category is Category.STRAGGLER and p.finding.culprit_ranks == found.culprit_ranks for p in out
        ):
            out.append(Proposal(found, "straggler", []))
    return out
