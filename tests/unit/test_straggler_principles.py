"""Issue 33's principle 5 and the wait chains behind it, on small exact jobs: a straggler is the rank whose
own lateness makes the others wait, never a rank late only because it waited for the straggler in
another group first, nor a rank whose usual head start is taken for a clock offset. Each test builds
torch-shaped dumps from a tiny blocking schedule: every rank runs the same steps, a collective ends when
its last member arrives, and a rank goes on from there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000
Groups = dict[str, tuple[int, ...]]


def _run(groups: Groups, step: list[str], steps: int, compute_ms: Callable[[int, int], float], *,
         backend: str = "gloo", prologue: tuple[str, ...] = ()) -> dict[int, list[dict[str, Any]]]:
    """Each step: every rank computes `compute_ms(rank, step)`, then runs the collectives of `step` (group
    names; a rank skips the groups it is not in). gloo blocks in each one until its last member arrives;
    NCCL ranks go on after enqueuing and wait for the step's collectives at its end (the step's sync)."""
    world = 1 + max(r for ranks in groups.values() for r in ranks)
    now = dict.fromkeys(range(world), 0.0)
    seqs = dict.fromkeys(groups, 0)
    per_rank: dict[int, list[dict[str, Any]]] = {r: [] for r in range(world)}
    nccl = backend == "nccl"

    def collective(name: str, done_by: dict[int, float]) -> None:
        seqs[name] += 1
        ranks = groups[name]
        end = max(now[r] for r in ranks) + 0.2
        for r in ranks:
            state = {"state": "completed", "duration_ms": end - now[r]} if nccl else {"state": "scheduled",
                                                                                       "retired": True}
            per_rank[r].append(b.entry(seqs[name], backend=backend, pg=(name, name), op="all_reduce",
                                       created_ns=b.T0 + int(now[r] * MS), **state))
            done_by[r] = max(done_by.get(r, 0.0), end)
            now[r] = (now[r] + 0.02) if nccl else end + 0.05

    for name in prologue:
        collective(name, {})
    for s in range(steps):
        for r in now:
            now[r] += compute_ms(r, s)
        done_by: dict[int, float] = {}
        for name in step:
            collective(name, done_by)
        if nccl:
            for r, end in done_by.items():
                now[r] = max(now[r], end) + 0.05
    return per_rank


Dumps = dict[int, list[dict[str, Any]]]


def _findings(tmp_path: Path, groups: Groups, per_rank: Dumps) -> list[tuple[Category, tuple[int, ...]]]:
    world = len(per_rank)
    for rank, entries in per_rank.items():
        for i, e in enumerate(entries):
            e["record_id"] = i
        config = {name: {"name": name, "desc": name, "ranks": str(list(ranks))} for name, ranks in groups.items()
                  if rank in ranks}
        b.write_pickle(tmp_path, rank, b.dump(entries, world=world, pg_config=config))
    report = analyze(load_dumps([tmp_path]), AnalysisOptions(now_ns=b.T0 + 3600 * 10**9))
    return [(f.category, f.culprit_ranks) for f in report.findings]


def _jitter(rank: int, step: int) -> float:
    return ((rank * 7 + step * 13) % 5) * 0.3  # a fixed spread of under 1.5 ms


def test_a_rank_early_at_most_collectives_of_a_group_is_no_straggler_where_it_is_on_time(tmp_path: Path) -> None:
    """Rank 1 reaches group tp's collective 140 ms late each step; ranks 0-2 wait for it there, then reach
    group dp's first collective together, 140 ms after rank 3 (which is not in tp). dp's second collective
    runs in lockstep. Rank 3's usual place at dp is 70 ms early: no clock runs that far off (the skew bound
    is 20 ms), so it is never late at the lockstep collective: rank 1 is the one straggler."""
    groups = {"dp": (0, 1, 2, 3), "tp": (0, 1, 2)}
    per_rank = _run(groups, ["tp", "dp", "dp"], 10, lambda r, s: 200 + (140 if r == 1 else 0) + _jitter(r, s))
    assert _findings(tmp_path, groups, per_rank) == [(Category.STRAGGLER, (1,))]

