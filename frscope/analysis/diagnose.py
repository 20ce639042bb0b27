"""The analysis entry point: facts, every rule's proposals, one ranking step.

Each rule (`rules/`) reads the same facts (per group: tracks, stale recorders, the stuck point) and
proposes findings with the stuck points they explain; no rule sees another's verdict. One step
(`rules/precedence.py`) decides which are root causes and nests the rest under them: a hang spreads
(a rank stuck in a tensor-parallel all_reduce never joins the data-parallel all_gather), and what is
left are the root causes, earliest divergence first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from frscope.analysis.context import AnalysisOptions, Context, gone_ranks
from frscope.analysis.findings import Finding, Report
from frscope.analysis.rules import RULES
from frscope.analysis.rules.facts import gather_facts, progress
from frscope.analysis.rules.precedence import rank_proposals
from frscope.analysis.tracks import build_tracks
from frscope.analysis.wording import fmt_duration
from frscope.records import DumpSet, LoadProblem, RankExit
from frscope.records.gcpause import gc_paused
from frscope.records.membership import build_groups


def analyze(dumpset: DumpSet, options: AnalysisOptions | None = None, *,
            exits: Mapping[int, RankExit] | None = None) -> Report:
    """`exits`: how ranks' processes ended, where the runner knows (Kubernetes container statuses)."""
    with gc_paused():
        dumpset = _world_from_exits(_emptied_failed_as_missing(dumpset, exits or {}), exits or {})
        return _analyze(dumpset, options or AnalysisOptions(), exits or {})


def _world_from_exits(dumpset: DumpSet, exits: Mapping[int, RankExit]) -> DumpSet:
    """The runner's word on how a rank's process ended is evidence that the rank exists: a rank killed
    before any dump, which no group's recorded membership names (gloo's default group is known only from
    its entries), is a missing rank of the job, not a job one rank smaller."""
    top = max(exits, default=-1) + 1
    if top <= dumpset.world_size:
        return dumpset
    groups, world, _ = build_groups(dumpset.dumps, top)
    return dataclasses.replace(dumpset, groups=groups, world_size=world)


def _emptied_failed_as_missing(dumpset: DumpSet, exits: Mapping[int, RankExit]) -> DumpSet:
    """A rank whose recorder is empty while others' hold entries, and whose process failed, counts as
    missing: the empty recorder was read before its first collective (a collector polls a cheap probe
    between full reads, and a quick crash falls between two), so its exit is the only evidence (seen on
    a real node: a rank raised three collectives in, its last full read was from before the first).
    So does one whose collector says its process is gone, where no exit says how it ended: its last read
    came before its first collective, and nothing after it says where it stood."""
    if not any(d.entries for d in dumpset.dumps.values()):
        return dumpset
    gone = gone_ranks(dumpset)
    empty = {r for r, d in dumpset.dumps.items() if not d.entries and (
        ((e := exits.get(r)) is not None and e.failed) or (r not in exits and r in gone))}
    if not empty:
        return dumpset
    problems = [*dumpset.problems, *(LoadProblem(dumpset.dumps[r].source, "empty recorder of a rank whose process "
                                                 f"{'failed' if r in exits else 'is gone'}: counted as missing",
                                                 rank=r, kind="warning")
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
    ctx = Context(dumpset, build_tracks(dumpset), options)
    facts = gather_facts(ctx, exits)
    proposals = [proposal for rule in RULES for proposal in rule(facts)]
    roots = rank_proposals(ctx, proposals, exits)
    _attach_exits(roots, exits)
    versions = tuple(sorted({d.version for d in dumpset.dumps.values() if d.version}))
    backends = [d.backend for d in dumpset.dumps.values() if d.backend]
    return Report(
        findings=roots,
        ranks_loaded=dumpset.ranks_loaded,
        missing_ranks=dumpset.missing_ranks,
        world_size=dumpset.world_size,
        groups=progress(facts),
        problems=list(dumpset.problems),
        backend=max(set(backends), key=backends.count) if backends else None,
        versions=versions,
    )
