"""Rules that rest on the runner's word about how processes ended (exit codes, OOMKilled, messages).

- a rank finished the collective the others still wait in, and its process then failed: the others
  wait for a peer that is gone, not for the network;
- not one recorder could be read, but processes failed: their exits are all there is;
- processes failed after their last recorded collective (every recorder complete): a fallback, kept
  only when no other rule explains the job;
- a rank whose collector says its process is gone while every other rank's process lives (its live
  stack answered): it stopped, though nobody waits for it yet; a fallback too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.rules.facts import Facts
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.stopped import left_after_finishing
from frscope.analysis.wording import plural
from frscope.records import RankExit
from frscope.records.exits import most_likely_first


def left_after_finish(facts: Facts) -> list[Proposal]:
    out: list[Proposal] = []
    if not facts.failed:
        return out
    dumps = facts.ctx.dumpset.dumps
    for gf in facts.groups:
        if gf.stale or not gf.waiting or gf.point is None:
            continue
        without_dump = tuple(r for r in gf.group.ranks if r not in dumps and r in facts.failed)
        left = left_after_finishing(facts.ctx, gf.ref, gf.live, gf.point, gf.waiting, facts.exits, without_dump)
        if left is not None:
            out.append(Proposal(left, "exit", [(gf.name, gf.point.seq)]))
    return out


def left_early(facts: Facts) -> list[Proposal]:
    """Ranks whose process ended cleanly (exit code 0) while the group's other members went on to
    collectives that need them: uneven data (its loop ran out first) or a rank that returned early. The
    peers then wait, or fail blaming the peer that went away."""
    done = {r for r, e in facts.exits.items() if e.exit_code == 0 and not e.failed}
    if not done:
        return []
    for gf in facts.groups:
        members = [r for r in gf.group.ranks if r in done]
        if not members:
            continue
        others = {r: t.last_seq for r, t in gf.tracks.items() if r not in done}
        if not others:
            continue
        furthest = max(others.values())
        last = {r: gf.tracks[r].last_seq if r in gf.tracks else 0 for r in members}
        early = sorted(r for r, seq in last.items() if seq < furthest)
        if not early:
            continue
        after = min(last[r] for r in early)
        ahead = sorted(r for r, seq in others.items() if seq > after)
        unread = [r for r in early if r not in facts.ctx.dumpset.dumps]
        track = gf.tracks.get(ahead[0])
        bucket = track.by_seq.get(after + 1) if track is not None else None
        op = bucket[0].op if bucket else "collective"
        them = "its" if len(early) == 1 else "their"
        finding = Finding(
            category=Category.RANK_STOPPED, culprit_ranks=tuple(early), process_group=gf.ref,
            summary=(f"{plural(early).capitalize()} ended cleanly (exit code 0) "
                     + ("and left no dump, " if unread else
                        f"after {f'#{after}' if after else 'no collective'} of {gf.ref.label()}, ")
                     + f"while {plural(ahead)} went on "
                     f"to {op} #{after + 1}, which needs every member: {them} loop ran out first (uneven data) or "
                     "returned early."),
            collective_seq_id=after + 1, op=op,
            since_ns=bucket[0].time_created_ns if bucket else None)
        finding.evidence.append(f"{plural(early)} exited 0 while {plural(ahead)} still needed "
                                f"{'it' if len(early) == 1 else 'them'}")
        points = [(gf.name, gf.point.seq)] if gf.point is not None else []
        return [Proposal(finding, "exit", points)]
    return []


def stopped_by_exits(world_size: int, failed: list[int], exits: Mapping[int, RankExit],
                     what: Callable[[list[int], str], str], why: str) -> Finding:
    """`RankStopped` from the runner's word alone: the first failure that blames no peer is the culprit,
    its exit the evidence. `what(culprits, " first" or "")` opens the summary; `why` is the last evidence."""
    culprits = most_likely_first(failed, exits)
    exit = exits.get(culprits[0])
    how = f" Rank {culprits[0]}'s process {exit.describe()}." if exit is not None else ""
    first = " first" if len(failed) > len(culprits) else ""
    ref = GroupRef("world", "", tuple(range(world_size)))
    finding = Finding(category=Category.RANK_STOPPED, culprit_ranks=tuple(culprits), process_group=ref,
                      summary=what(culprits, first) + how)
    others = sorted(set(failed) - set(culprits))
    if others:
        finding.evidence.append(f"{plural(others)} also failed, blaming a peer or after the first failure")
    finding.evidence.append(why)
    return finding


def unrecorded_failures(facts: Facts) -> list[Proposal]:
    """Not one recorder could be read (the job ended before any collector read a rank: a crash within a
    second or two of the start), but the runner says which processes failed."""
    dumpset = facts.ctx.dumpset
    if any(d.entries for d in dumpset.dumps.values()) or any(gf.waiting for gf in facts.groups):
        return []
    failed = sorted(facts.failed & (set(dumpset.missing_ranks) | set(dumpset.dumps)))
    if not failed:
        return []
    finding = stopped_by_exits(
        dumpset.world_size, failed, facts.exits,
        lambda culprits, first: (f"No recorder of the job could be read (it ended before the collectors read "
                                 f"one); {plural(culprits)} failed{first}."),
        "no recorder evidence: the exit codes and termination messages are all there is")
    return [Proposal(finding, "exit", [])]


def failed_after_records(facts: Facts) -> list[Proposal]:
    """Processes failed, yet no recorder shows a collective pending: they were read before the exit (a
    collector reads recorders every few seconds; a crash between two reads leaves every recorder
    complete). A fallback: kept only when no other rule explains the job."""
    if not facts.failed or not any(d.entries for d in facts.ctx.dumpset.dumps.values()):
        return []
    finding = stopped_by_exits(
        facts.ctx.dumpset.world_size, sorted(facts.failed), facts.exits,
        lambda culprits, first: (f"{plural(culprits).capitalize()} failed{first} after "
                                 f"{'its' if len(culprits) == 1 else 'their'} last recorded collective (no "
                                 f"recorder shows one pending: they were read before the exit)."),
        "the recorders end before the failure: the exit codes and termination messages say why")
    return [Proposal(finding, "exit", [], fallback=True)]


def gone_among_live(facts: Facts) -> list[Proposal]:
    """Ranks whose collector says the process is gone (its worker socket went with it) while every other
    rank's process answered for its live stack: those alone stopped (crashed, or were killed), whether or
    not anyone waits for them yet (the others finished, or run what does not need them). A fallback: a rule
    that names where someone waits for them says more."""
    ctx = facts.ctx
    gone = sorted(ctx.gone_ranks())
    others = [r for r in ctx.dumpset.dumps if r not in gone]
    if not gone or not others or not all(ctx.live_stack(r) for r in others):
        return []
    finding = stopped_by_exits(
        ctx.dumpset.world_size, gone, facts.exits,
        lambda culprits, first: (f"{plural(culprits).capitalize()} stopped: {'its' if len(culprits) == 1 else 'their'} "
                                 f"collector says the process is gone, while {plural(others)} live (their stacks "
                                 "answered); no recorder shows anyone waiting for it yet."),
        f"the collector found the worker socket of {plural(gone)} gone with the process; {plural(others)} answered")
    if len(finding.culprit_ranks) > 1:
        # which went first nothing here says: a rank that died takes down (gloo) the ranks exchanging with it
        finding.ambiguous = True
        finding.evidence.append("one of them may have stopped first and the others failed on it (gloo fails the "
                                "ranks exchanging with a peer that went away): their exit codes or logs decide")
    return [Proposal(finding, "exit", [], fallback=True)]
