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


def test_late_ranks_of_no_one_host_make_no_party(tmp_path: Path) -> None:
    """Ranks 0 and 3 of 4 late together at every step: a launcher numbers one host's ranks in a row, so
    these are no node; each wait has no one party to name (and nothing crashes for want of one)."""
    delays = {(r, s): 300.0 + (1.0 if r == 3 else 0.0) for r in (0, 3) for s in range(12)}
    assert analyze(load_dumps([b.job(tmp_path, _job(4, 12, delays), 4)]), OPTIONS).findings == []


def test_a_step_late_once_is_one_wait_however_many_async_collectives_follow_on_gloo(tmp_path: Path) -> None:
    """gloo, 2 ranks, 3 steps of 3 async all_reduces, each rank enqueueing its step's three at once, then 3
    blocking ones in lockstep: rank 1 comes 30 ms after rank 0 at each step (a coin toss each time between two
    ranks). Its second and third async collectives are late by the same 30 ms only because it enqueued them
    then, not because rank 0 waited for it again: 3 waits, within chance, not 9."""
    per_rank: Dumps = {0: [], 1: []}
    seq = 0
    for step in range(3):
        start = b.T0 + step * 1000 * MS
        for layer in range(6):
            seq += 1
            for rank, late_ms in ((0, 0.0), (1, 30.0)):
                created = start + int((late_ms + 0.01 * layer if layer < 3 else 100.0 + layer) * MS)
                per_rank[rank].append(b.entry(seq, created_ns=created, backend="gloo", state="scheduled", retired=True))
    assert analyze(load_dumps([b.job(tmp_path, per_rank, 2)]), OPTIONS).findings == []
