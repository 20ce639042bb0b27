"""Members without a dump: who waits for them, and whether that looks like a crash.

When everyone with a dump waits in one collective, the finding says so, and that a missing dump is
not proof of guilt. When every survivor stopped at the same finished seq (gloo retires a collective
that failed because a peer left), the missing rank left there; it is `RankStopped`, a crash, only where the
runner says its process failed, and otherwise `RankNotJoined` with crash or exit unknown (a rank out of data
that exits cleanly leaves the same recorders). A missing rank whose process failed beside ranks that wait is
`RankStopped` too.
"""

from __future__ import annotations

from dataclasses import dataclass

from frscope.analysis.findings import Category, Finding, GroupRef
from frscope.analysis.rules.facts import Facts, unresponsive_note
from frscope.analysis.rules.proposal import Proposal
from frscope.analysis.stopped import crash_signature, finished_then_failed
from frscope.analysis.tracks import Track
from frscope.analysis.wording import fmt_duration, plural
from frscope.records.exits import most_likely_first


@dataclass(frozen=True, slots=True)
class Waiting:
    """A stuck point where every member with a dump entered and waits, while some member has none."""

    ref: GroupRef
    seq: int
    op: str
    joined: list[int]
    age: float | None
    since_ns: int


def _waiting_on_missing(facts: Facts) -> list[Waiting]:
    out: list[Waiting] = []
    dumps = facts.ctx.dumpset.dumps
    for gf in facts.groups:
        if gf.stale or not gf.waiting or gf.point is None or not gf.suspects_missing:
            continue
        without_dump = tuple(r for r in gf.group.ranks if r not in dumps and r in facts.failed)
        if finished_then_failed(gf.live, gf.ref, gf.point.seq, gf.waiting, facts.exits, without_dump):
            continue  # a member that finished it and failed is the one gone (rule `exits`)
        out.append(Waiting(gf.ref, gf.point.seq, gf.waiting_op, list(gf.waiting), gf.point.age_s,
                           gf.point.since_ns or 2**63))
    return sorted(out, key=lambda w: w.since_ns)  # the earliest wait first: where they were last expected


def missing_dumps(facts: Facts) -> list[Proposal]:
    ctx = facts.ctx
    missing = ctx.dumpset.missing_ranks
    if not missing:
        return []
    # A rank whose recorder was read empty is no more evidence than one never read.
    unrecorded = set(missing) | {r for r, d in ctx.dumpset.dumps.items() if not d.entries}
    failed = [r for r in sorted(unrecorded) if r in facts.failed]
    if failed and not any(d.entries for d in ctx.dumpset.dumps.values()):
        return []  # not one recorder holds an entry: the exits are all there is (rule `exits`)
    waiting = _waiting_on_missing(facts)
    points = [(w.ref.name, w.seq) for w in waiting]
    signature = None if waiting else crash_signature(ctx, missing)
    # A missing rank whose process failed without blaming a peer (killed, OOM, its own error) crashed.
    crashed = [r for r in failed if r in missing and not facts.exits[r].peer_gone]
    if signature is not None or (failed and waiting) or crashed:
        return [Proposal(_crashed(facts, missing, failed, signature, waiting), "missing", points, absorbs_waiting=True)]
    groups = ctx.dumpset.groups
    biggest = max(
        (g for g in groups.values() if set(missing) & set(g.ranks)),
        key=lambda g: (len(set(missing) & set(g.ranks)), len(g.ranks)),
        default=None,
    )
    ref = (
        GroupRef(biggest.name, biggest.desc, biggest.ranks)
        if biggest
        else GroupRef("world", "", tuple(range(ctx.dumpset.world_size)))
    )
    summary = f"No dump from {plural(missing)} of {ctx.dumpset.world_size}."
    finding = Finding(category=Category.MISSING_DUMPS, culprit_ranks=tuple(missing), process_group=ref, summary=summary)
    if waiting:
        first = waiting[0]
        since = f" for {fmt_duration(first.age)}" if first.age is not None else ""
        finding.summary = (
            f"{plural(first.joined).capitalize()} of {first.ref.label()} wait{'s' if len(first.joined) == 1 else ''} "
            f"in {first.op} #{first.seq}{since}, and {plural(missing)} left no dump: a rank without a dump crashed, "
            "was killed, or never joined — or it is the victim (with gloo, the rank that receives a larger message "
            "than it expects aborts at once without a dump while the sender survives)."
        )
        finding.process_group = first.ref
        finding.collective_seq_id = first.seq
        finding.op = first.op
        finding.stalled_for_s = first.age
        finding.age_source = ctx.age_source(first.joined) if first.age is not None else None
    silent = sorted(set(missing) & facts.unresponsive)
    if silent and waiting:
        first = waiting[0]
        since = f" for {fmt_duration(first.age)}" if first.age is not None else ""
        finding.summary = (
            f"{plural(silent).capitalize()} did not answer {'its' if len(silent) == 1 else 'their'} worker server "
            f"(unresponsive: alive but holding the GIL, or stuck in native code) while {plural(first.joined)} of "
            f"{first.ref.label()} wait{'s' if len(first.joined) == 1 else ''} in {first.op} #{first.seq}{since}: "
            f"{'it is' if len(silent) == 1 else 'they are'} the suspect."
        )
    if (note := unresponsive_note(facts, missing)) is not None:
        finding.evidence.append(note)
    finding.evidence.append("a missing dump is not proof of guilt: check the missing ranks' pod logs and exit codes")
    if len(waiting) == 1:
        finding.evidence.append(
            f"every rank with a dump stopped at the same collective ({waiting[0].op} #{waiting[0].seq}): the "
            f"signature of {plural(missing)} crashing there, unless {'it was' if len(missing) == 1 else 'they were'} "
            "the victim of an abort"
        )
    for w in waiting[1:]:
        finding.evidence.append(f"{plural(w.joined)} also wait in {w.op} #{w.seq} of {w.ref.label()}")
    return [Proposal(finding, "missing", points, absorbs_waiting=True)]


def _crashed(facts: Facts, missing: tuple[int, ...], failed: list[int],
             signature: tuple[GroupRef, int, str, list[int]] | None, waiting: list[Waiting]) -> Finding:
    """A rank without a dump that crashed: the survivors stopped together, or its exit says it failed."""
    ctx, exits = facts.ctx, facts.exits
    culprits = most_likely_first(failed, exits) if failed else list(missing)
    exit = exits.get(culprits[0])
    how = f" Its process {exit.describe()}." if exit is not None else ""
    age: float | None
    category = Category.RANK_STOPPED
    if signature is not None:
        ref, seq, op, survivors = signature
        age = None
        stopped = (f"{plural(culprits).capitalize()} left no dump, and {plural(survivors)} all stopped at {op} #{seq} "
                   f"of {ref.label()}, the last collective each finished (gloo retires a collective that failed "
                   f"because a peer {'died' if failed else 'left'})")
        if failed:
            summary = f"{stopped}: the signature of {plural(culprits)} crashing there.{how}"
        else:
            # Nothing says the rank failed (no exit, signal or message): it left there, and whether it crashed or
            # exited (out of data, after destroy_process_group) is unknown. It is named for what the recorders
            # show, the rank the others' last collective failed for want of, not as a crash.
            they = "it" if len(culprits) == 1 else "they"
            summary = f"{stopped}: {plural(culprits)} left the job there" + (
                f".{how}" if exit is not None else f"; whether {they} crashed or exited, no exit code says.")
            category = Category.RANK_NOT_JOINED
    elif not waiting:
        finding = Finding(
            category=Category.RANK_STOPPED, culprit_ranks=tuple(culprits),
            process_group=GroupRef("world", "", tuple(range(ctx.dumpset.world_size))),
            summary=(f"{plural(culprits).capitalize()} left no dump and "
                     f"{'its process' if len(culprits) == 1 else 'their processes'} failed without blaming a peer: "
                     f"{'it' if len(culprits) == 1 else 'they'} crashed.{how}"))
        finding.evidence.append("the others' recorders end where their collectives failed with it")
        return finding
    else:
        first = waiting[0]
        ref, seq, op, survivors, age = first.ref, first.seq, first.op, first.joined, first.age
        since = f" for {fmt_duration(age)}" if age is not None else ""
        summary = (
            f"{plural(culprits).capitalize()} left no dump and "
            f"{'its process' if len(culprits) == 1 else 'their processes'} failed, "
            f"while {plural(survivors)} wait{'s' if len(survivors) == 1 else ''} in {op} #{seq} of "
            f"{ref.label()}{since}.{how}"
        )
    entered = [b[0].time_created_ns for r in survivors
               if (b := ctx.tracks.get(ref.name, {}).get(r, Track(r)).by_seq.get(seq)) and b[0].time_created_ns]
    finding = Finding(category=category, culprit_ranks=tuple(culprits), process_group=ref,
                      summary=summary, collective_seq_id=seq, op=op, stalled_for_s=age,
                      age_source=ctx.age_source(survivors) if age is not None else None,
                      since_ns=min(entered) if entered else None)
    others = sorted(set(missing) - set(culprits))
    if others:
        finding.evidence.append(f"{plural(others)} also left no dump")
    finding.evidence.append("a missing dump beside survivors that stopped at one sequence number: the rank left "
                            "there (a crash, a kill or an exit); the exit code and termination message say which")
    return finding
