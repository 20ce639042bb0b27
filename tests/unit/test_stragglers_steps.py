"""Lateness per step: a rank late only at each step's first collective is found; unbiased jitter and
a constant clock offset are not mistaken for it."""

from __future__ import annotations

import random
from pathlib import Path

from frscope.analysis import AnalysisOptions, Category, analyze
from frscope.records import load_dumps
from tests.unit import builders as b

MS = 1_000_000
LAYERS = 5
OPTIONS = AnalysisOptions(now_ns=b.T0 + 3600 * 10**9)


Dumps = dict[int, list[dict[str, object]]]


def _job(world: int, steps: int, delay_ms: dict[tuple[int, int], float]) -> Dumps:
    """Steps of LAYERS all_reduces; a step starts when its latest rank arrives, then runs in lockstep.
    `delay_ms[(rank, step)]`: how late that rank's data loader makes it for the step's first collective."""
    per_rank: Dumps = {r: [] for r in range(world)}
    t = b.T0
    seq = 0
    for step in range(steps):
        arrive = {r: t + int(delay_ms.get((r, step), 0.0) * MS) for r in range(world)}
        for layer in range(LAYERS):
            seq += 1
            for r in range(world):
                created = arrive[r] if layer == 0 else t + layer * MS
                per_rank[r].append(b.entry(seq, created_ns=created, backend="gloo", state="scheduled", retired=True))
            if layer == 0:
                t = max(arrive.values())
        t += 10 * MS
    return per_rank


def test_rank_late_at_every_step_boundary_is_named(tmp_path: Path) -> None:
    per_rank = _job(2, 12, {(1, s): 300.0 for s in range(12)})
    [finding] = analyze(load_dumps([b.job(tmp_path, per_rank, 2)]), OPTIONS).findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (1,)
    assert [a.collective_seq_id for a in finding.late_at] == [1 + LAYERS * s for s in range(8)]
    assert finding.late_count == 12 and "every 5 collectives" in finding.summary


def test_unbiased_jitter_is_healthy(tmp_path: Path) -> None:
    rng = random.Random(7)
    world, steps = 8, 60
    delays = {(r, s): rng.uniform(0, 400) for r in range(world) for s in range(steps)}
    per_rank = _job(world, steps, delays)
    assert analyze(load_dumps([b.job(tmp_path, per_rank, world)]), OPTIONS).findings == []


def test_a_few_late_steps_are_not_a_straggler(tmp_path: Path) -> None:
    # Late twice in 40 steps (a checkpoint, a GC pause): not a pattern.
    per_rank = _job(4, 40, {(3, 5): 500.0, (3, 30): 500.0})
    assert analyze(load_dumps([b.job(tmp_path, per_rank, 4)]), OPTIONS).findings == []
