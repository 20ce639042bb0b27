"""Live lateness (frscope.analysis.lateness): the rank the others keep waiting for, what it costs,
quiet for even jitter, forgotten once it keeps up for the window."""

from __future__ import annotations

import random

from frscope.analysis.lateness import WINDOW_S, rank_lateness

S = 1_000_000_000


def job(steps: int, step_s: float, late: dict[int, float], *, ranks: int = 3, layers: int = 2,
        jitter_s: float = 0.0, start_s: float = 0.0, seed: int = 1) -> dict[int, dict[str, list[tuple[int, int]]]]:
    """Arrivals of a synchronous job: each step's first collective waits for the slowest rank's
    compute (step_s + its lateness + jitter), the step's other collectives follow in lockstep."""
    rng = random.Random(seed)
    out: dict[int, dict[str, list[tuple[int, int]]]] = {r: {"0": []} for r in range(ranks)}
    t = start_s
    seq = 0
    for _step in range(steps):
        arrive = {r: t + step_s + late.get(r, 0.0) + rng.uniform(0, jitter_s) for r in range(ranks)}
        for layer in range(layers):
            seq += 1
            for r in range(ranks):
                at = arrive[r] if layer == 0 else max(arrive.values()) + 0.001 * layer + 0.0001 * r
                out[r]["0"].append((seq, int(at * S)))
        t = max(arrive.values()) + 0.002 * layers
    return out


def test_a_rank_late_at_every_step_is_a_straggler_with_its_cost() -> None:
    found = rank_lateness(job(60, 0.25, {2: 0.05}))  # 1.2 x the others' step
    assert found[2].straggler and not found[0].straggler and not found[1].straggler
    assert abs(found[2].lateness_s - 0.05) < 0.002
    assert 0.15 <= found[2].share <= 0.18  # 0.05 s of each ~0.3 s step
    assert found[2].late == 60 and found[2].compared == 120 and found[2].group == "0"


def test_even_jitter_and_a_lone_rank_stay_quiet() -> None:
    found = rank_lateness(job(200, 0.2, {}, jitter_s=0.1))
    assert sorted(found) == [0, 1, 2] and not any(f.straggler for f in found.values())
    assert rank_lateness({0: {"0": [(1, S), (2, 2 * S)]}}) == {}


def test_a_rank_that_keeps_up_again_is_forgotten_after_the_window() -> None:
    late = job(60, 0.25, {1: 0.1})
    after = job(int((WINDOW_S + 5) / 0.25), 0.25, {}, start_s=60 * 0.36)
    merged = {r: {"0": late[r]["0"] + [(seq + 120, t) for seq, t in after[r]["0"]]} for r in late}
    assert rank_lateness(late)[1].straggler
    assert not rank_lateness(merged)[1].straggler


def test_only_common_collectives_are_compared() -> None:
    arrivals = job(30, 0.25, {0: 0.08}, ranks=2)
    arrivals[1]["0"] = arrivals[1]["0"][:-10]  # rank 1's recorder was read a few steps earlier
    found = rank_lateness(arrivals)
    assert found[0].straggler and found[0].compared == 50
