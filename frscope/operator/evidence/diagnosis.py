"""Gathered evidence -> DumpSet -> Report, with the same code as `frscope analyze`.

Runs in a worker thread (assembling and analyzing 1,000s of ranks is CPU work; the event loop must
keep answering probes and pushes). What could not be gathered becomes a LoadProblem naming the pod,
and the ranks the job should have but nobody delivered are the report's missing ranks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.operator.evidence.gather import Gathered
from frscope.records import DumpSet, LoadProblem, RankDump, RankExit, assemble


@dataclass(slots=True)
class Diagnosis:
    report: Report
    dumpset: DumpSet
    missing_pods: dict[str, str]  # pod -> why no snapshot came from it
    exits: dict[int, RankExit] = field(default_factory=dict)  # how ranks' containers ended (the analysis's)


def build_dumpset(gathered: Gathered, world_size: int | None) -> DumpSet:
    dumps: list[RankDump] = []
    problems: list[LoadProblem] = []
    for _, evidence in sorted(gathered.pods.items()):
        dumps.extend(evidence.dumps)
        problems.extend(evidence.problems)
    for pod, why in sorted(gathered.failures.items()):
        problems.append(LoadProblem(f"pod {gathered.namespace}/{pod}", f"sidecar not gathered: {why}"))
    if gathered.entries_dropped:
        problems.append(LoadProblem("(operator)", f"kept the newest entries of each rank's recorder only; "
                                    f"{gathered.entries_dropped} older entries left out", kind="warning"))
    return assemble(dumps, problems, world_size)


def diagnose_sync(gathered: Gathered, world_size: int | None, options: AnalysisOptions,
                  exits: Mapping[int, RankExit] | None = None) -> Diagnosis:
    """`exits`: how ranks' containers ended (`trainer_exits.rank_exits`), evidence beside the dumps."""
    dumpset = build_dumpset(gathered, world_size)
    return Diagnosis(analyze(dumpset, options, exits=exits), dumpset, dict(gathered.failures), dict(exits or {}))


async def diagnose(gathered: Gathered, world_size: int | None, options: AnalysisOptions,
                   exits: Mapping[int, RankExit] | None = None) -> Diagnosis:
    return await asyncio.to_thread(diagnose_sync, gathered, world_size, options, exits)
