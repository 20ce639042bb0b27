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


def test_a_slow_nodes_ranks_late_together_are_named_together(tmp_path: Path) -> None:
    """8 ranks, 2 per node: the node of ranks 2 and 3 is slow, so both reach every step's first collective
    ~400 ms late, within a few ms of each other: neither is much later than the next-latest (its node peer)."""
    rng = random.Random(3)
    delays = {(r, s): rng.uniform(0, 5) + (400.0 if r in (2, 3) else 0.0) for r in range(8) for s in range(15)}
    [finding] = analyze(load_dumps([b.job(tmp_path, _job(8, 15, delays), 8)]), OPTIONS).findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (2, 3)
    assert "together" in finding.summary


def test_two_ranks_a_handful_of_steady_late_steps_is_a_straggler(tmp_path: Path) -> None:
    """2 ranks, 8 steps: each late arrival is a coin toss between two ranks, so 8 of 8 is not beyond chance
    by count alone; the waits are all ~1 s (one cause repeating) and all of the waiting: a straggler."""
    rng = random.Random(5)
    delays = {(1, s): 1000.0 + rng.uniform(-20, 20) for s in range(8)}
    [finding] = analyze(load_dumps([b.job(tmp_path, _job(2, 8, delays), 2)]), OPTIONS).findings
    assert finding.category is Category.STRAGGLER and finding.culprit_ranks == (1,)


def test_two_ranks_with_unsteady_jitter_are_healthy(tmp_path: Path) -> None:
    """2 ranks, jitter on both: one may be late more often by chance, but the waits vary from nothing to
    the jitter's range: no straggler."""
    for seed in range(20):
        rng = random.Random(seed)
        delays = {(r, s): rng.uniform(0, 600) for r in range(2) for s in range(10)}
        (tmp_path / str(seed)).mkdir()
        report = analyze(load_dumps([b.job(tmp_path / str(seed), _job(2, 10, delays), 2)]), OPTIONS)
        assert report.findings == [], seed
