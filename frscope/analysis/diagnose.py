"""The analysis entry point: every group's checks, then root causes.

A hang spreads: a rank stuck in a tensor-parallel all_reduce never joins the data-parallel
all_gather, so that group reports a RankNotJoined too. Each finding whose culprits are themselves
blocked in another finding's collective is nested under it as a consequence; what is left are the
root causes, earliest divergence first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from frscope.analysis.collectives import hang_finding, stuck_point
from frscope.analysis.context import AnalysisOptions, Context
from frscope.analysis.findings import Category, Finding, GroupProgress, GroupRef, RankProgress, Report
from frscope.analysis.history import scan_history
from frscope.analysis.p2p import recorded_p2p
from frscope.analysis.p2p_stacks import stack_p2p
from frscope.analysis.rootcause import Causes, link
from frscope.analysis.stale import crash_signature, left_after_finishing, stale_ranks, stopped_finding
from frscope.analysis.straggler import find_straggler
from frscope.analysis.stragglers_steps import find_step_straggler
from frscope.analysis.tracks import Track, build_tracks
from frscope.analysis.wording import fmt_duration, plural
from frscope.records import DumpSet, LoadProblem, RankExit
from frscope.records.exits import most_likely_first
from frscope.records.gcpause import gc_paused
from frscope.records.membership import is_default_group

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


def _group_tracks(dumpset: DumpSet, name: str, ranks: tuple[int, ...], tracks: dict[int, Track]) -> dict[int, Track]:
    """The group's members that have a dump. A member with no entry of the group counts as having
    entered nothing, but only while nobody has completed anything there (otherwise its entries were
    evicted from its ring buffer: a real member cannot miss a completed collective)."""
    mine = {r: tracks[r] for r in ranks if r in tracks}
    nothing_done = all(t.next_seq <= t.first_seq for t in mine.values() if t.by_seq)
    if nothing_done:
        for rank in ranks:
            if rank in dumpset.dumps and rank not in mine:
                mine[rank] = Track(rank)
    return mine


def _progress(ref: GroupRef, source: str, tracks: dict[int, Track]) -> GroupProgress:
    ranks: dict[int, RankProgress] = {}
    for rank, track in sorted(tracks.items()):
        open_bucket = track.by_seq.get(track.next_seq)
        ranks[rank] = RankProgress(
            last_enqueued_seq=track.last_seq or None,
            last_completed_seq=track.last_completed if track.by_seq else None,
            inflight_op=open_bucket[0].op if open_bucket else None,
            inflight_seq=track.next_seq if open_bucket else None,
        )
    return GroupProgress(ref, source, ranks)


def _missing_dumps(ctx: Context, waiting: list[tuple[GroupRef, int, str, list[int], float | None]],
                   exits: Mapping[int, RankExit]) -> Finding | None:
    missing = ctx.dumpset.missing_ranks
    # A rank whose recorder was read empty is no more evidence than one never read: a pod whose sidecar
    # was asked while its ranks went down delivers both of its ranks empty (seen on a real node, where the
    # raising rank was one of them and only the other pod's victims were missing).
    unrecorded = set(missing) | {r for r, d in ctx.dumpset.dumps.items() if not d.entries}
    failed = [r for r in sorted(unrecorded) if (e := exits.get(r)) is not None and e.failed]
    if failed and not waiting and not any(d.entries for d in ctx.dumpset.dumps.values()):
        return _died_unrecorded(ctx, failed, exits)
    if not missing:
        return None
    signature = None if waiting else crash_signature(ctx, missing)
    if signature is not None or (failed and waiting):
        return _crashed(ctx, missing, failed, signature, waiting, exits)
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
        group_ref, seq, op, joined, age = waiting[0]
        since = f" for {fmt_duration(age)}" if age is not None else ""
        summary = (
            f"{plural(joined).capitalize()} of {group_ref.label()} wait{'s' if len(joined) == 1 else ''} in {op} "
            f"#{seq}{since}, and {plural(missing)} left no dump: a rank without a dump crashed, was killed, or "
            "never joined — or it is the victim (with gloo, the rank that receives a larger message than it "
            "expects aborts at once without a dump while the sender survives)."
        )
        finding.summary = summary
        finding.process_group = group_ref
        finding.collective_seq_id = seq
        finding.op = op
        finding.stalled_for_s = age
        finding.age_source = ctx.age_source(joined) if age is not None else None
    finding.evidence.append("a missing dump is not proof of guilt: check the missing ranks' pod logs and exit codes")
    if len(waiting) == 1:
        finding.evidence.append(
            f"every rank with a dump stopped at the same collective ({waiting[0][2]} #{waiting[0][1]}): the "
            f"signature of {plural(missing)} crashing there, unless {'it was' if len(missing) == 1 else 'they were'} "
            "the victim of an abort"
        )
    for group_ref, seq, op, joined, _age in waiting[1:]:
        finding.evidence.append(f"{plural(joined)} also wait in {op} #{seq} of {group_ref.label()}")
    return finding


def _stopped_by_exits(world_size: int, failed: list[int], exits: Mapping[int, RankExit],
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


def _died_unrecorded(ctx: Context, failed: list[int], exits: Mapping[int, RankExit]) -> Finding:
    """Not one recorder could be read (the job ended before any collector read a rank: a crash within a
    second or two of the start, seen on a real node), but the runner says which processes failed."""
    return _stopped_by_exits(
        ctx.dumpset.world_size, failed, exits,
        lambda culprits, first: (f"No recorder of the job could be read (it ended before the collectors read "
                                 f"one); {plural(culprits)} failed{first}."),
        "no recorder evidence: the exit codes and termination messages are all there is")


def _failed_after_their_records(dumpset: DumpSet, failed: list[int], exits: Mapping[int, RankExit]) -> Finding:
    """Processes failed, yet no recorder shows a collective pending: they were read before the exit (a
    collector reads recorders every few seconds; a crash between two reads, seen on a real node, left
    every recorder complete)."""
    return _stopped_by_exits(
        dumpset.world_size, failed, exits,
        lambda culprits, first: (f"{plural(culprits).capitalize()} failed{first} after "
                                 f"{'its' if len(culprits) == 1 else 'their'} last recorded collective (no "
                                 f"recorder shows one pending: they were read before the exit)."),
        "the recorders end before the failure: the exit codes and termination messages say why")


def _crashed(ctx: Context, missing: tuple[int, ...], failed: list[int],
             signature: tuple[GroupRef, int, str, list[int]] | None,
             waiting: list[tuple[GroupRef, int, str, list[int], float | None]],
             exits: Mapping[int, RankExit]) -> Finding:
    """A rank without a dump that crashed: the survivors stopped together, or its exit says it failed."""
    culprits = most_likely_first(failed, exits) if failed else list(missing)
    exit = exits.get(culprits[0])
    how = f" Its process {exit.describe()}." if exit is not None else ""
    if signature is not None:
        ref, seq, op, survivors = signature
        summary = (
            f"{plural(culprits).capitalize()} left no dump, and {plural(survivors)} all stopped at {op} #{seq} of "
            f"{ref.label()}, the last collective each finished (gloo retires a collective that failed because a "
            f"peer died): the signature of {plural(culprits)} crashing there.{how}"
        )
        age = None
    else:
        ref, seq, op, survivors, age = waiting[0]
        since = f" for {fmt_duration(age)}" if age is not None else ""
        summary = (
            f"{plural(culprits).capitalize()} left no dump and "
            f"{'its process' if len(culprits) == 1 else 'their processes'} failed, "
            f"while {plural(survivors)} wait{'s' if len(survivors) == 1 else ''} in {op} #{seq} of "
            f"{ref.label()}{since}.{how}"
        )
    entered = [b[0].time_created_ns for r in survivors
               if (b := ctx.tracks.get(ref.name, {}).get(r, Track(r)).by_seq.get(seq)) and b[0].time_created_ns]
    finding = Finding(category=Category.RANK_STOPPED, culprit_ranks=tuple(culprits), process_group=ref,
                      summary=summary, collective_seq_id=seq, op=op, stalled_for_s=age,
                      age_source=ctx.age_source(survivors) if age is not None else None,
                      since_ns=min(entered) if entered else None)
    others = sorted(set(missing) - set(culprits))
    if others:
        finding.evidence.append(f"{plural(others)} also left no dump")
    finding.evidence.append("a missing dump beside survivors that stopped at one sequence number is a crash's "
                            "signature; the exit code and termination message say why")
    return finding


def analyze(dumpset: DumpSet, options: AnalysisOptions | None = None, *,
            exits: Mapping[int, RankExit] | None = None) -> Report:
    """`exits`: how ranks' processes ended, where the runner knows (Kubernetes container statuses)."""
    with gc_paused():
        return _analyze(_emptied_failed_as_missing(dumpset, exits or {}), options or AnalysisOptions(), exits or {})


def _emptied_failed_as_missing(dumpset: DumpSet, exits: Mapping[int, RankExit]) -> DumpSet:
    """A rank whose recorder is empty while others' hold entries, and whose process failed, counts as
    missing: the empty recorder was read before its first collective (a collector polls a cheap probe
    between full reads, and a quick crash falls between two), so its exit is the only evidence (seen on
    a real node: a rank raised three collectives in, its last full read was from before the first)."""
    if not exits or not any(d.entries for d in dumpset.dumps.values()):
        return dumpset
    empty = {r for r, d in dumpset.dumps.items() if not d.entries and (e := exits.get(r)) is not None and e.failed}
    if not empty:
        return dumpset
    problems = [*dumpset.problems, *(LoadProblem(dumpset.dumps[r].source, "empty recorder of a rank whose process "
                                                 "failed: counted as missing", rank=r, kind="warning")
                                     for r in sorted(empty))]
    return dataclasses.replace(dumpset, dumps={r: d for r, d in dumpset.dumps.items() if r not in empty},
                               problems=problems)


def _when(exit: RankExit, finding: Finding) -> str:
    """', 3 s before the others entered all_reduce #4': a death before the hang is its cause."""
    if exit.finished_at_ns is None or finding.since_ns is None or finding.collective_seq_id is None:
        return ""
    if finding.last_seen_ns is not None:
        return ""  # a stale dump's finding dates the rank's last entry, not a collective the others entered
    delta = (finding.since_ns - exit.finished_at_ns) / 1e9
    what = f"{finding.op or 'collective'} #{finding.collective_seq_id}"
    if delta >= 1:  # finishedAt has second precision
        return f", {fmt_duration(delta)} before the first rank entered {what}"
    if delta <= -1:
        return f", {fmt_duration(-delta)} after the first rank entered {what}"
    return f", within a second of the first rank entering {what}"


def _attach_exits(findings: list[Finding], exits: Mapping[int, RankExit]) -> None:
    """Every finding names how its culprits (and the ranks it shows) ended, where that is known."""
    for finding in findings:
        for rank in sorted(set(finding.culprit_ranks) | set(finding.ranks)):
            exit = exits.get(rank)
            if exit is not None and rank not in finding.exits:
                finding.exits[rank] = exit
                if exit.failed and rank in finding.culprit_ranks:
                    finding.evidence.append(f"rank {rank}'s process {exit.describe()}" + _when(exit, finding))
        _attach_exits(finding.consequences, exits)


def _analyze(dumpset: DumpSet, options: AnalysisOptions, exits: Mapping[int, RankExit]) -> Report:
    tracks_by_group = build_tracks(dumpset)
    ctx = Context(dumpset, tracks_by_group, options)
    findings: list[Finding] = []
    at_point: dict[tuple[str, int], Finding] = {}
    progress: list[GroupProgress] = []
    waiting_on_missing: list[tuple[GroupRef, int, str, list[int], float | None]] = []
    waiting_since: list[int] = []
    recorded_p2p_ranks: set[int] = set()
    default_ref: GroupRef | None = None
    any_missing = bool(dumpset.missing_ranks)
    failed = frozenset(r for r, e in exits.items() if e.failed)
    stopped_ranks: set[int] = set()

    for name, group in dumpset.groups.items():
        ref = GroupRef(name, group.desc, group.ranks)
        if is_default_group(name, group.desc) or default_ref is None:
            default_ref = ref if (default_ref is None or is_default_group(name, group.desc)) else default_ref
        tracks = _group_tracks(dumpset, name, group.ranks, tracks_by_group.get(name, {}))
        progress.append(_progress(ref, group.membership_source, tracks))
        if not tracks:
            continue
        mismatch = scan_history(ctx, group, ref, tracks)
        stale = stale_ranks(ctx, group, tracks, exits)
        live = {r: t for r, t in tracks.items() if r not in stale} if stale else tracks
        point = stuck_point(ctx, group, live, failed)
        hang = hang_finding(ctx, group, ref, live, point) if point else None
        if stale:
            fresh = {r: s for r, s in stale.items() if r not in stopped_ranks}
            if fresh:
                stopped = stopped_finding(ctx, ref, tracks, fresh, point, exits)
                findings.append(stopped)
                stopped_ranks.update(fresh)
                if point is not None:
                    at_point[(name, point.seq)] = stopped
            if hang is not None and hang.category is Category.NOT_COMPLETED:
                hang = None  # the others wait for the rank that stopped, not for the network
        if hang is not None and hang.category is Category.NOT_COMPLETED and point is not None:
            without_dump = tuple(r for r in group.ranks if r not in dumpset.dumps and r in failed)
            left = left_after_finishing(ctx, ref, live, point, hang.culprit_ranks, exits, without_dump)
            if left is not None:
                left.consequences.append(hang)  # the others wait for the rank that left, not for the network
                hang = left
        missing_members = [r for r in group.ranks if r not in dumpset.dumps]
        unknown_members = any_missing and group.membership_source == "entries"
        suspects_missing = bool(missing_members or unknown_members)
        if hang is not None and hang.category is Category.NOT_COMPLETED and point and suspects_missing:
            # Everyone with a dump entered it; those without one are the first suspects (also when the
            # membership is only known from the entries, which cannot show a member without a dump).
            waiting_on_missing.append((ref, point.seq, hang.op or "collective", list(hang.culprit_ranks), point.age_s))
            waiting_since.append(point.since_ns or 2**63)
            hang = None
        if mismatch is not None:
            findings.append(mismatch)
            if mismatch.collective_seq_id is not None:
                at_point[(name, mismatch.collective_seq_id)] = mismatch
            if hang is not None and mismatch.collective_seq_id is not None and point is not None:
                if mismatch.collective_seq_id <= point.seq:
                    # The group diverged first and stopped later: the stop is a consequence.
                    mismatch.consequences.append(hang)
                    hang = None
        if hang is not None:
            findings.append(hang)
            if point is not None:
                at_point.setdefault((name, point.seq), hang)
        p2p = recorded_p2p(ctx, group, ref, tracks)
        if p2p is not None:
            findings.append(p2p)
            recorded_p2p_ranks.update(p2p.culprit_ranks)
        straggler = find_straggler(ctx, ref, tracks) or find_step_straggler(ctx, ref, tracks)
        if straggler is not None and not any(
            f.category is Category.STRAGGLER and f.culprit_ranks == straggler.culprit_ranks for f in findings
        ):
            findings.append(straggler)

    ref_for_world = default_ref or GroupRef("0", "default_pg", tuple(range(dumpset.world_size)))
    unrecorded = stack_p2p(ctx, ref_for_world, recorded_p2p_ranks)
    if unrecorded is not None:
        findings.append(unrecorded)
    # The earliest wait first: that is where the missing ranks were last expected.
    order = sorted(range(len(waiting_on_missing)), key=waiting_since.__getitem__)
    missing = _missing_dumps(ctx, [waiting_on_missing[i] for i in order], exits)
    if missing is not None:
        findings.append(missing)

    causes = Causes(at_point, [f for f in findings if f.category is Category.P2P_MISMATCH], unrecorded, missing)
    if missing is not None:
        for ref, seq, _op, _joined, _age in waiting_on_missing:
            at_point.setdefault((ref.name, seq), missing)
    roots = link(ctx, findings, causes)
    if failed and all(f.category is Category.STRAGGLER for f in roots):
        roots.append(_failed_after_their_records(dumpset, sorted(failed), exits))
    _attach_exits(roots, exits)
    roots.sort(key=lambda f: (f.category is Category.STRAGGLER, f.since_ns or 2**63, _PRIORITY[f.category]))
    versions = tuple(sorted({d.version for d in dumpset.dumps.values() if d.version}))
    backends = [d.backend for d in dumpset.dumps.values() if d.backend]
    return Report(
        findings=roots,
        ranks_loaded=dumpset.ranks_loaded,
        missing_ranks=dumpset.missing_ranks,
        world_size=dumpset.world_size,
        groups=progress,
        problems=list(dumpset.problems),
        backend=max(set(backends), key=backends.count) if backends else None,
        versions=versions,
    )
