"""Rules that look at the whole job: p2p from live stacks, stragglers."""

from __future__ import annotations

from frscope.analysis.findings import Category
from frscope.analysis.p2p_stacks import stack_p2p
from frscope.analysis.rules.facts import Facts
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.straggler import find_straggler
from frscope.analysis.stragglers_steps import find_step_straggler
from frscope.analysis.waited import Handoffs
from frscope.analysis.wording import plural


def p2p_from_stacks(facts: Facts) -> list[Proposal]:
    """Ranks whose live stack sits in send/recv while their recorder shows no p2p op pending (backends
    that record p2p are read by rule `p2p`)."""
    recorded = {r for gf in facts.groups for r, t in gf.tracks.items() if t.open_p2p()}
    found = stack_p2p(facts.ctx, facts.default_ref, recorded)
    return [Proposal(found, "p2p-stacks", [])] if found is not None else []


def stragglers(facts: Facts) -> list[Proposal]:
    """A rank late at every collective, or at step boundaries, per group; one finding per rank (or node).
    A rank late in one group only because another rank released it late (a tensor-parallel peer of a slow
    rank reaches the data-parallel group late too) is none: the checks read that from `waited.Handoffs`,
    one for the whole job."""
    out: list[Proposal] = []
    handoffs = Handoffs(facts.ctx)
    for gf in facts.groups:
        if not gf.tracks:
            continue
        found = (find_straggler(facts.ctx, gf.ref, gf.tracks, handoffs)
                 or find_step_straggler(facts.ctx, gf.ref, gf.tracks, handoffs))
        if found is not None and not any(
            p.finding.category is Category.STRAGGLER and p.finding.culprit_ranks == found.culprit_ranks for p in out
        ):
            out.append(Proposal(found, "straggler", []))
    return _one_node(_parts_of_a_node(out)) if len(out) > 1 else out


def _parts_of_a_node(found: list[Proposal]) -> list[Proposal]:
    """Principle 5, a slow node: where a group shows a host's ranks late together, a finding in another
    group that names only some of them (each is the only late one of the node in a group it shares with
    on-time ranks alone) is part of that node's lateness, not a straggler of its own: one finding per node."""
    nodes = [set(p.finding.culprit_ranks) for p in found if len(p.finding.culprit_ranks) > 1]
    return [p for p in found if not any(set(p.finding.culprit_ranks) < node for node in nodes)]


# Ranks each late in a group of its own are one slow node when their lateness is about the same (within
# this factor): one host's slowness reaches each of its ranks alike.
SAME_LATENESS = 1.5


def _one_node(found: list[Proposal]) -> list[Proposal]:
    """Principle 5, a slow node: its ranks late together. Where each of a host's ranks (a launcher numbers
    a node's ranks in a row) is late in a different group (ranks 0 and 1 each late in their own pair
    group), they are one finding naming the node, not one finding per rank (of which the first would name
    half of it)."""
    timed = [p for p in found if p.finding.late_by_ms]
    for i, first in enumerate(timed):
        node = set(first.finding.culprit_ranks)
        parts = [first]
        for other in timed[i + 1:]:
            merged = node | set(other.finding.culprit_ranks)
            late = [first.finding.late_by_ms or 0.0, other.finding.late_by_ms or 0.0]
            if (not node & set(other.finding.culprit_ranks) and max(merged) - min(merged) == len(merged) - 1
                    and max(late) <= SAME_LATENESS * min(late)):
                node, parts = merged, [*parts, other]
        if len(parts) > 1:
            _merge(parts, node)
            return [p for p in found if not any(p is q for q in parts[1:])]
    return found


def _merge(parts: list[Proposal], node: set[int]) -> None:
    """Fold `parts[1:]` into `parts[0]`'s finding, which then names the whole node."""
    finding = parts[0].finding
    ranks = tuple(sorted(node))
    where = "; ".join(p.finding.summary.rstrip(".") for p in parts)
    finding.culprit_ranks = ranks
    finding.summary = (f"{plural(list(ranks)).capitalize()} are late together (one host's ranks: a slow node): "
                       f"{where}.")
    for p in parts[1:]:
        finding.evidence.extend(p.finding.evidence)
        finding.ranks.update(p.finding.ranks)
        finding.culprit_stacks.update(p.finding.culprit_stacks)
        finding.culprit_frames.update(p.finding.culprit_frames)
