"""Gathered snapshots -> DumpSet -> Report, with the same code as `frscope analyze`.

Runs in a worker thread (normalizing 1,000s of recorders is CPU work; the event loop must keep
answering probes and pushes). What could not be gathered becomes a LoadProblem naming the pod, and
the ranks the job should have but nobody delivered are the report's missing ranks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from frscope.analysis import AnalysisOptions, Report, analyze
from frscope.operator.gather import Gathered
from frscope.records import DumpError, DumpSet, LoadProblem, RankDump, assemble, normalize_dump


@dataclass(slots=True)
class Diagnosis:
    report: Report
    dumpset: DumpSet
    missing_pods: dict[str, str]  # pod -> why no snapshot came from it


def build_dumpset(gathered: Gathered, world_size: int | None) -> DumpSet:
    dumps: list[RankDump] = []
    problems: list[LoadProblem] = []
    for pod, snapshot in sorted(gathered.snapshots.items()):
        origin = "push" if pod in gathered.from_push else "sidecar"
        for rank, message in snapshot.errors:
            problems.append(LoadProblem(f"pod {gathered.namespace}/{pod} ({origin})", message, rank=rank))
        for raw in snapshot.ranks:
            rank_hint = raw.get("rank")
            source = f"pod {gathered.namespace}/{pod} ({origin}) rank {rank_hint}"
            try:
                dumps.append(normalize_dump(raw, source, rank_hint if isinstance(rank_hint, int) else None))
            except DumpError as exc:
                problems.append(LoadProblem(exc.source, exc.message, rank=exc.rank))
    for pod, why in sorted(gathered.failures.items()):
        problems.append(LoadProblem(f"pod {gathered.namespace}/{pod}", f"sidecar not gathered: {why}"))
    return assemble(dumps, problems, world_size)


def diagnose_sync(gathered: Gathered, world_size: int | None, options: AnalysisOptions) -> Diagnosis:
    dumpset = build_dumpset(gathered, world_size)
    return Diagnosis(analyze(dumpset, options), dumpset, dict(gathered.failures))


async def diagnose(gathered: Gathered, world_size: int | None, options: AnalysisOptions) -> Diagnosis:
    return await asyncio.to_thread(diagnose_sync, gathered, world_size, options)
