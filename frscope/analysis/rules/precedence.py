"""The one ranking step: which proposals are root causes and which are their consequences.

Every rule proposes findings with the stuck points they explain. Ranking them:
1. Each stuck point (group, seq) belongs to the proposal of highest precedence that explains it:
   a mismatch (the group diverged there or earlier), then a rank that stopped (stale recorder, gone
   after finishing, crashed without a dump, its part ended alone), then missing dumps, then the hang
   itself. Another such verdict on the same collective nests under the owner (one root per
   collective). A stale rank whose group went on past its recorder up to a mismatch gloo aborts
   on nests under that mismatch (it was the receiver that died there). A
   NotCompleted at a point owned by another proposal nests under it: the ranks wait for that cause,
   not for the network. A hang at or after a mismatch of its group nests under the mismatch.
2. The waits are followed across groups and p2p peers (`rootcause.link`): a hang whose culprits
   are blocked in another point's collective nests under that point's owner; cycles become one root.
3. Fallback proposals (said only when nothing else explains the job) are kept when every other root
   is a straggler.
4. A stopped rank whose own error blames a peer that went away nests under the stopped or missing
   rank whose process failed without blaming one (the first failure); where every root is a rank that
   stopped with a plain error exit and the runner says ranks no root names were killed by a signal, its
   finding naming those is the root.
5. Roots are ordered: hangs before stragglers, the earliest first, then by category.
"""

from __future__ import annotations

from collections.abc import Mapping

from frscope.analysis.context import Context
from frscope.analysis.findings import Category, Finding
from frscope.analysis.rootcause import Causes, link
from frscope.analysis.rules.proposal import Point, Proposal
from frscope.records import RankExit
from frscope.records.exits import signal_name

MISMATCHES = (Category.COLLECTIVE_TYPE_MISMATCH, Category.SIZE_MISMATCH, Category.DTYPE_MISMATCH)
VERDICTS = (*MISMATCHES, Category.RANK_STOPPED, Category.MISSING_DUMPS)  # what a collective's cause can be

# Who owns a stuck point: lower first.
_OWNER_RANK = {
    Category.COLLECTIVE_TYPE_MISMATCH: 0,
    Category.SIZE_MISMATCH: 0,
    Category.DTYPE_MISMATCH: 0,
    Category.RANK_STOPPED: 1,
    Category.MISSING_DUMPS: 2,
    Category.P2P_MISMATCH: 3,
    Category.RANK_NOT_JOINED: 4,
    Category.NOT_COMPLETED: 5,
    Category.STRAGGLER: 6,
}

# Most actionable first when two root causes started at the same moment.
_PRIORITY = {
    Category.COLLECTIVE_TYPE_MISMATCH: 0,
    Category.SIZE_MISMATCH: 1,
    Category.DTYPE_MISMATCH: 1,
    Category.P2P_MISMATCH: 2,
    Category.RANK_NOT_JOINED: 3,
    Category.NOT_COMPLETED: 4,
    Category.MISSING_DUMPS: 5,
    Category.STRAGGLER: 6,
    Category.RANK_STOPPED: 3,
}


def _owners(proposals: list[Proposal]) -> dict[Point, Proposal]:
    owners: dict[Point, Proposal] = {}
    for proposal in proposals:
        for point in proposal.points:
            held = owners.get(point)
            if held is None or _OWNER_RANK[proposal.finding.category] < _OWNER_RANK[held.finding.category]:
                owners[point] = proposal
    return owners


def _same_point_parents(proposals: list[Proposal], owners: dict[Point, Proposal]
                        ) -> tuple[dict[int, Finding], set[int]]:
    """(finding -> its cause at the same point, findings absorbed by their point's owner)."""
    parent: dict[int, Finding] = {}
    absorbed: set[int] = set()
    mismatch_from: dict[str, tuple[int, Finding]] = {}  # group -> (seq, finding) of its earliest mismatch
    for proposal in proposals:
        finding = proposal.finding
        if proposal.covers_later and finding.collective_seq_id is not None:
            name = finding.process_group.name
            if name not in mismatch_from or finding.collective_seq_id < mismatch_from[name][0]:
                mismatch_from[name] = (finding.collective_seq_id, finding)
    aborting = [p.finding for p in proposals if p.aborts_peers and p.finding.collective_seq_id is not None]
    for proposal in proposals:
        finding = proposal.finding
        if proposal.rule == "stale" and finding.collective_seq_id is not None:
            # The others went on past where its recorder ends, up to a mismatch that kills its receiver:
            # it was alive until then, and its dump is older than its end.
            cause = next((m for m in aborting if m.process_group.name == finding.process_group.name
                          and m.collective_seq_id is not None and m.collective_seq_id >= finding.collective_seq_id
                          and not set(m.culprit_ranks) & set(finding.culprit_ranks)), None)
            if cause is not None:
                parent[id(finding)] = cause
                continue
        if finding.category in VERDICTS and proposal.points:
            # Another verdict on the same collective(s), of lower precedence: one root per collective.
            owner = owners.get(proposal.points[0])
            if owner is not None and owner is not proposal and all(owners.get(p) is owner for p in proposal.points):
                parent[id(finding)] = owner.finding
            continue
        if finding.category not in (Category.RANK_NOT_JOINED, Category.NOT_COMPLETED):
            continue
        seq = finding.collective_seq_id
        earlier = mismatch_from.get(finding.process_group.name)
        if seq is not None and earlier is not None and earlier[0] <= seq:
            parent[id(finding)] = earlier[1]  # the group diverged first and stopped later
            continue
        if finding.category is Category.NOT_COMPLETED:
            owner = next((owners[p] for p in proposal.points if owners.get(p) is not proposal and p in owners), None)
            if owner is not None and owner.absorbs_waiting:
                absorbed.add(id(finding))
            elif owner is not None:
                parent[id(finding)] = owner.finding  # they wait for the owner's cause, not for the network
    return parent, absorbed


def _victims_under_first_failure(roots: list[Finding], exits: Mapping[int, RankExit]) -> list[Finding]:
    """A stopped rank whose own error blames a peer that went away (a victim) is the consequence of a
    stopped or missing rank whose process failed without blaming one: the first failure."""
    def failed_first(f: Finding) -> bool:
        return any((e := exits.get(r)) is not None and e.failed and not e.peer_gone for r in f.culprit_ranks)

    def victim(f: Finding) -> bool:
        return bool(f.culprit_ranks) and all((e := exits.get(r)) is not None and e.peer_gone for r in f.culprit_ranks)

    stopped = (Category.RANK_STOPPED, Category.MISSING_DUMPS)
    first = next((f for f in roots if f.category in stopped and failed_first(f)), None)
    if first is None:
        return roots
    kept: list[Finding] = []
    for root in roots:
        if root is not first and root.category in stopped and victim(root):
            first.consequences.append(root)
            first.consequences.extend(root.consequences)
            root.consequences = []
        else:
            kept.append(root)
    return kept


def _stops_under_first_failure(roots: list[Finding], fallbacks: list[Finding],
                               exits: Mapping[int, RankExit]) -> list[Finding]:
    """Every root is a rank that stopped with a plain error exit (a code, no signal, no message), and the
    runner says other ranks were killed by a signal (not SIGTERM) or OOM-killed that no root names. Nothing in a
    peer's failure kills a process (`records.exits.most_likely_first`): those went first, and the stops followed
    (gloo fails a peer's collective at once and retires it as finished, which reads as a recorder that stopped
    early). The runner's finding that names the killed ranks is the root."""
    if not roots or not all(f.category is Category.RANK_STOPPED for f in roots):
        return roots
    named = {r for f in roots for r in f.culprit_ranks}
    killed = {r for r, e in exits.items() if e.failed and not e.terminated
              and (e.reason == "OOMKilled" or (e.exit_code is not None and signal_name(e.exit_code)))}
    if not killed or killed & named:
        return roots
    if not all((e := exits.get(r)) is not None and e.failed and r not in killed and not e.message for r in named):
        return roots
    cause = next((f for f in fallbacks if f.category is Category.RANK_STOPPED and set(f.culprit_ranks) == killed),
                 None)
    if cause is None:
        return roots
    cause.evidence.append("killed by a signal while the ranks that stopped only exited with an error code: nothing "
                          "in a peer's failure kills a process, so this went first and they failed with it")
    cause.consequences.extend(roots)
    return [cause]


def rank_proposals(ctx: Context, proposals: list[Proposal], exits: Mapping[int, RankExit]) -> list[Finding]:
    """The root causes, most important first; every other proposal nested under its root."""
    main = [p for p in proposals if not p.fallback]
    owners = _owners(main)
    causes = Causes(
        at_point={point: owner.finding for point, owner in owners.items()},
        p2p=[p.finding for p in main if p.rule == "p2p"],
        unrecorded_p2p=next((p.finding for p in main if p.rule == "p2p-stacks"), None),
        missing=next((p.finding for p in main if p.rule == "missing"), None),
    )
    parent, absorbed = _same_point_parents(main, owners)
    parent.update({id(p.finding): p.caused_by for p in main if p.caused_by is not None})
    roots = link(ctx, [p.finding for p in main if id(p.finding) not in absorbed], causes, parent)
    roots = _victims_under_first_failure(roots, exits)
    roots = _stops_under_first_failure(roots, [p.finding for p in proposals if p.fallback], exits)
    if all(f.category is Category.STRAGGLER for f in roots):
        roots.extend(p.finding for p in proposals if p.fallback)
    roots.sort(key=lambda f: (f.category is Category.STRAGGLER, f.since_ns or 2**63, _PRIORITY[f.category]))
    return roots
