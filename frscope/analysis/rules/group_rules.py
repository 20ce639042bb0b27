"""The rules that look at one group at a time: not joined / not completed, mismatches, stale
recorders, recorded p2p. Each proposes findings from the facts, with the stuck points they explain."""

from __future__ import annotations

import dataclasses

from frscope.analysis.collectives import hang_finding
from frscope.analysis.findings import Category, Finding
from frscope.analysis.history import scan_history
from frscope.analysis.ops import VARIABLE_SIZE_OPS, numel
from frscope.analysis.p2p import recorded_p2p, unposted_batch
from frscope.analysis.rules.facts import Facts, unresponsive_note
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.stacks import blocked_in
from frscope.analysis.stopped import stopped_finding
from frscope.analysis.tracks import blocked_entry
from frscope.analysis.wording import plural


def hangs(facts: Facts) -> list[Proposal]:
    """RankNotJoined / NotCompleted at each group's stuck point (live members only)."""
    out: list[Proposal] = []
    for gf in facts.groups:
        if gf.point is None:
            continue
        hang = hang_finding(facts.ctx, gf.group, gf.ref, gf.live, gf.point)
        if hang is not None and hang.category is Category.NOT_COMPLETED and gf.unrecorded_members:
            empty = gf.unrecorded_members
            hang.evidence.append(
                f"{plural(list(empty))} of {gf.ref.label()} left a recorder that holds nothing of it (read before "
                f"{'its' if len(empty) == 1 else 'their'} first collective there, or stale): if "
                f"{'its process' if len(empty) == 1 else 'their processes'} ended, "
                f"{'it is' if len(empty) == 1 else 'they are'} the cause; the exit codes decide")
        point = gf.point
        if hang is not None and hang.category is Category.RANK_NOT_JOINED and all(
                gf.live[r].last_completed >= point.seq for r in point.joined):
            hang.evidence.append(
                f"{plural(point.joined)} recorded #{point.seq} finished without {plural(list(hang.culprit_ranks))}: "
                "gloo retires a collective that failed (timed out, or lost a peer) as if it had finished. The "
                f"{'rank is' if len(hang.culprit_ranks) == 1 else 'ranks are'} either stuck before it (a live "
                "stack shows where) or stopped after the dump was taken (the exit code decides)")
        elif (hang is not None and hang.category is Category.RANK_NOT_JOINED
              and all(_free(facts, r) and not facts.ctx.live_stack(r) and r not in facts.exits
                      for r in hang.culprit_ranks)):
            one = len(hang.culprit_ranks) == 1
            hang.evidence.append(
                f"no live stack and no exit code for {plural(list(hang.culprit_ranks))}: "
                f"{'it is' if one else 'they are'} either busy outside torch.distributed (a live stack shows where) "
                f"or {'its process' if one else 'their processes'} ended after the dump was taken (the exit code "
                "decides; a copied file's time no longer says when the dump was taken)")
        if hang is not None and hang.category is Category.RANK_NOT_JOINED:
            _pipeline_candidates(facts, gf.group.ranks, hang)
        if hang is not None:
            if (note := unresponsive_note(facts, hang.culprit_ranks)) is not None:
                hang.evidence.insert(0, note)
            out.append(Proposal(hang, "hang", [(gf.name, gf.point.seq)]))
    together = _stuck_together(facts, out)
    return [together, *out] if together is not None else out


def _stuck_together(facts: Facts, hangs: list[Proposal]) -> Proposal | None:
    """Ranks stuck outside any collective at once (a node's ranks in one slow call) leave several groups
    waiting, each blaming one of them: one finding names them all, the groups' findings nest under it."""
    free = [p for p in hangs if p.finding.category is Category.RANK_NOT_JOINED
            and all(_free(facts, r) for r in p.finding.culprit_ranks)]
    ranks = sorted({r for p in free for r in p.finding.culprit_ranks})
    if len(free) < 2 or all(set(p.finding.culprit_ranks) == set(ranks) for p in free):
        return None
    first = min(free, key=lambda p: p.finding.since_ns or 2**63).finding
    waits = "; ".join(f"{p.finding.op} #{p.finding.collective_seq_id} of {p.finding.process_group.label()} waits for "
                      f"{plural(list(p.finding.culprit_ranks))}" for p in free[:6])
    together = dataclasses.replace(
        first, culprit_ranks=tuple(ranks), consequences=[], evidence=list(first.evidence),
        ranks=dict(first.ranks), culprit_frames=dict(first.culprit_frames), culprit_stacks=dict(first.culprit_stacks),
        summary=f"{plural(ranks).capitalize()} are stuck outside any collective at once, and each leaves a group "
                f"waiting: {waits}.")
    for proposal in free:
        proposal.caused_by = together
        together.ranks.update(proposal.finding.ranks)
        together.culprit_stacks.update(proposal.finding.culprit_stacks)
    return Proposal(together, "hang", [])


def _pipeline_candidates(facts: Facts, members: tuple[int, ...], hang: Finding) -> None:
    """Without stacks, a pipeline stage stuck before its receive shows only as the ranks missing from
    the next collective: it, every later stage (each waits in recv behind it) and often the stage
    before it (its send waits for the receive). They are the last ranks of the group, in a row, none
    with a collective open. The stuck stage is the first or the second of them: those two are the
    candidates; the rest wait behind them. Live stacks decide (gloo records no p2p op)."""
    culprits = list(hang.culprit_ranks)
    if len(culprits) < 3 or culprits != list(range(culprits[0], culprits[0] + len(culprits))):
        return
    if culprits[-1] != max(members) or any(facts.ctx.live_stack(r) for r in culprits):
        return
    if not all(_free(facts, r) for r in culprits):
        return
    behind = culprits[2:]
    hang.culprit_ranks = tuple(culprits[:2])
    hang.ambiguous = True
    hang.would_decide = "the ranks' live stacks (a sidecar snapshot): gloo records no p2p op"
    hang.summary = (f"Ranks {culprits[0]} and {culprits[1]} are the candidates: " + hang.summary[0].lower()
                    + hang.summary[1:])
    hang.evidence.append(
        f"ranks {culprits[0]}-{culprits[-1]}, the last of the group in a row, never joined it and none has a "
        f"collective open: the shape of a pipeline stage stuck before its receive (gloo records no p2p op). "
        f"The stuck stage is rank {culprits[0]} or {culprits[1]} (whose send to it may wait); "
        f"{plural(behind)} wait behind it. Live stacks decide")


def _free(facts: Facts, rank: int) -> bool:
    """The rank has a recorder with no collective open, its last one did not fail waiting for a member
    that never entered it, and no live stack shows it waiting in an op the recorder does not keep (gloo's
    send/recv, monitored_barrier): it is busy outside torch.distributed."""
    dump = facts.ctx.dumpset.dumps.get(rank)
    return (dump is not None and bool(dump.entries) and blocked_entry(dump.entries) is None
            and facts.ctx.waits.failed_wait(rank) is None and blocked_in(facts.ctx.live_stack(rank)) is None)


def mismatches(facts: Facts) -> list[Proposal]:
    """The earliest type / size / dtype disagreement of each group's visible history."""
    out: list[Proposal] = []
    for gf in facts.groups:
        if not gf.tracks:
            continue
        found = scan_history(facts.ctx, gf.group, gf.ref, gf.tracks)
        if found is not None:
            points = [(gf.name, found.collective_seq_id)] if found.collective_seq_id is not None else []
            out.append(Proposal(found, "mismatch", points, covers_later=True, aborts_peers=_aborts(found)))
    return out


def _aborts(found: Finding) -> bool:
    """A size mismatch in bytes (not only in shape): gloo's receiver aborts on it."""
    if found.category is not Category.SIZE_MISMATCH:
        return False
    if found.op in VARIABLE_SIZE_OPS:
        return True
    culprit = found.ranks.get(found.culprit_ranks[0]) if found.culprit_ranks else None
    if culprit is None or culprit.input_sizes is None or found.input_sizes is None:
        return False
    return numel(culprit.input_sizes) != numel(found.input_sizes)


def stale(facts: Facts) -> list[Proposal]:
    """RankStopped for members whose recorder ends before what every other member finished: one finding
    per rank (the first group that shows it), explaining every group's stuck point it left waiting."""
    out: list[Proposal] = []
    by_rank: dict[int, Proposal] = {}
    for gf in facts.groups:
        if not gf.stale:
            continue
        fresh = {r: s for r, s in gf.stale.items() if r not in by_rank}
        point = [(gf.name, gf.point.seq)] if gf.point is not None else []
        if fresh:
            finding = stopped_finding(facts.ctx, gf.ref, gf.tracks, fresh, gf.point, facts.exits)
            if (note := unresponsive_note(facts, finding.culprit_ranks)) is not None:
                finding.evidence.insert(0, note)
            # ... and the collective each stopped rank missed that the others recorded done (on gloo: failed
            # for want of it), where a member that went on to fail waited for it
            missed = [(gf.name, st.last_seq + 1) for st in fresh.values() if (gf.name, st.last_seq + 1) not in point]
            proposal = Proposal(finding, "stale", [*point, *dict.fromkeys(missed)], absorbs_waiting=True)
            out.append(proposal)
            by_rank.update(dict.fromkeys(fresh, proposal))
        else:
            # Already reported in another group: the others here wait for the same stopped rank.
            by_rank[min(gf.stale)].points.extend(point)
    return out


def p2p_recorded(facts: Facts) -> list[Proposal]:
    """Pending sends / receives without a partner (backends that record p2p: NCCL)."""
    out: list[Proposal] = []
    for gf in facts.groups:
        if not gf.tracks:
            continue
        found: Finding | None = (recorded_p2p(facts.ctx, gf.group, gf.ref, gf.tracks)
                                 or unposted_batch(facts.ctx, gf.group, gf.ref, gf.tracks))
        if found is not None:
            out.append(Proposal(found, "p2p", []))
    return out
