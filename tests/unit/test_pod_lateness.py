"""Live lateness across pods (frscope.analysis.pod_lateness) over simulated lockstep jobs
(frscope.testing.lateness_jobs): a slow pod is named with its rank and cost, by waits where the
recorders date them (whatever the hosts' clocks) and by clocks moved onto the operator's by each pod's
measured offset otherwise; healthy jobs, whatever their clocks, name nobody. The randomized sweep
covers layouts, world sizes, clock offsets, step periods and both measures."""

from __future__ import annotations

import random

import pytest

from frscope.analysis.pod_lateness import PodClock, PodLateness, pod_arrivals, pod_lateness
from frscope.testing.lateness_jobs import LatenessJob, newest, one_rank_per_pod, pods_of, simulate


def clocks_for(job: LatenessJob, bound_ms: float, rng: random.Random | None = None) -> dict[str, PodClock]:
    """Each pod's clock as the operator would measure it: the true offset, off by at most the bound."""
    bound = int(bound_ms * 1e6)
    return {pod: PodClock(int(job.offsets_s.get(pod, 0.0) * 1e9) + (rng.randint(-bound, bound) if rng else 0), bound)
            for pod in job.pods}


def lateness(job: LatenessJob, clocks: dict[str, PodClock] | None = None, keep: int | None = None,
             **kwargs: float) -> dict[str, PodLateness]:
    sim = simulate(job)
    if keep is not None:
        sim = newest(sim, keep)
    merged = {pod: pod_arrivals(by_rank) for pod, by_rank in sim.items()}
    return pod_lateness(merged, clocks, ranks=job.pods, **kwargs)  # type: ignore[arg-type]


def named(found: dict[str, PodLateness]) -> list[str]:
    return sorted(pod for pod, late in found.items() if late.straggler)


def test_a_one_rank_pod_20_percent_slower_at_quarter_second_steps_is_named_with_its_cost() -> None:
    job = LatenessJob(one_rank_per_pod(2), 0.25, 240, slow={1: 1.2}, offsets_s={"train-worker-1": 0.4})
    found = lateness(job, clocks_for(job, 1.0))
    slow = found["train-worker-1"]
    assert named(found) == ["train-worker-1"] and slow.rank == 1 and slow.ranks == (1,)
    assert 0.04 <= slow.lateness_s <= 0.05  # 50 ms a step, less the two pods' 1 ms bounds
    assert 0.12 <= slow.share <= 0.17 and slow.by_waits == 0
    # the same job read by waits (NCCL with timing): no clock is needed, the 0.4 s offset does nothing
    job.waits = True
    by_waits = lateness(job)
    assert named(by_waits) == ["train-worker-1"] and by_waits["train-worker-1"].by_waits == by_waits[
        "train-worker-1"].compared
    assert 0.14 <= by_waits["train-worker-1"].share <= 0.18


def test_without_a_measured_clock_the_assumed_bound_hides_a_small_straggler_and_any_offset_within_it() -> None:
    job = LatenessJob(one_rank_per_pod(2), 0.25, 240, slow={1: 1.2})
    assert named(lateness(job)) == []  # 50 ms less 2 x 20 ms: under the 20 ms minimum gap
    assert named(lateness(LatenessJob(one_rank_per_pod(2), 0.25, 240, slow={1: 2.0}))) == ["train-worker-1"]
    healthy = LatenessJob(pods_of(6, 2), 0.2, 300, offsets_s={"train-worker-0": -0.019, "train-worker-2": 0.019})
    assert named(lateness(healthy)) == []


def test_an_offset_measured_away_is_no_straggler_and_one_left_in_is() -> None:
    job = LatenessJob(one_rank_per_pod(3), 0.3, 200, offsets_s={"train-worker-2": 0.15, "train-worker-0": -3.0})
    assert named(lateness(job, clocks_for(job, 2.0, random.Random(1)))) == []
    wrong = clocks_for(job, 2.0)
    wrong["train-worker-2"] = PodClock(0, 2_000_000)  # a clock 150 ms ahead, taken as exact
    assert named(lateness(job, wrong)) == ["train-worker-2"]


def test_a_slow_node_names_its_pod_and_the_rank_it_waited_for() -> None:
    job = LatenessJob(pods_of(6, 2), 0.25, 240, slow={2: 1.3, 3: 1.5}, subgroups=2)
    found = lateness(job, clocks_for(job, 1.0))
    assert named(found) == ["train-worker-1"]
    assert found["train-worker-1"].rank == 3 and found["train-worker-1"].ranks == (2, 3)


def test_collectives_missed_between_sweeps_do_not_dilute_the_cost() -> None:
    job = LatenessJob(one_rank_per_pod(3), 0.25, 240, slow={2: 1.3})
    clocks = clocks_for(job, 1.0)
    sim = simulate(job)
    holes = {pod: {r: {g: [row for row in rows if (row[0] // 10) % 3 != 1] for g, rows in groups.items()}
                   for r, groups in by_rank.items()} for pod, by_rank in sim.items()}
    whole = pod_lateness({p: pod_arrivals(b) for p, b in sim.items()}, clocks)["train-worker-2"]
    seen = pod_lateness({p: pod_arrivals(b) for p, b in holes.items()}, clocks)["train-worker-2"]
    assert seen.straggler and seen.compared < whole.compared
    assert abs(seen.share - whole.share) < 0.02


def test_a_group_inside_one_pod_is_not_compared_and_a_pod_only_counts_collectives_all_its_ranks_have() -> None:
    job = LatenessJob(pods_of(2, 2), 0.25, 60, slow={1: 2.0})
    assert pod_lateness({"train-worker-0": pod_arrivals(simulate(job)["train-worker-0"])}) == {}
    by_rank = {0: {"0": [(1, 100), (2, 200)]}, 1: {"0": [(2, 250), (3, 300)]}}
    merged = pod_arrivals(by_rank)["0"]
    assert list(merged) == [2] and merged[2].created_ns == 250 and merged[2].late_rank == 1


def test_the_comparison_is_bounded_however_many_pods() -> None:
    job = LatenessJob(one_rank_per_pod(2048), 0.1, 200, slow={7: 1.5}, jitter=0.01)
    found = lateness(job, clocks_for(job, 1.0), keep=100, compare_budget=2048 * 64)
    assert named(found) == ["train-worker-7"] and found["train-worker-7"].compared == 64  # of the newest 100


@pytest.mark.parametrize("seed", range(8))
def test_randomized_sweep_over_layouts_world_sizes_clocks_and_measures(seed: int) -> None:
    """Per case: a random layout (one rank per pod, or several; with or without subgroups across
    pods), world size, step period (0.25-5 s, at least 60 s of steps), clock offsets (up to +-2 s)
    measured within a random bound (0-3 ms) or read by waits, and a straggler of 1.2, 1.5 or 2 x, or
    none. The straggler's pod, and only it, is named; healthy jobs name nobody."""
    rng = random.Random(seed)
    for case in range(25):
        per_pod = rng.choice([1, 1, 2, 4, 8])
        world = per_pod * rng.randint(2, 12 if per_pod > 2 else 24)
        pods = pods_of(world, per_pod)
        period = rng.choice([0.25, 0.5, 1.0, 2.0, 5.0])
        steps = max(30, int(60 / period))
        slow_rank = rng.randrange(world) if rng.random() < 0.6 else None
        factor = rng.choice([1.2, 1.5, 2.0])
        job = LatenessJob(pods, period, steps, slow={slow_rank: factor} if slow_rank is not None else {},
                          jitter=rng.uniform(0.0, 0.03), offsets_s={p: rng.uniform(-2, 2) for p in pods},
                          waits=rng.random() < 0.3, subgroups=rng.choice([0, 0, 2, per_pod]) if world > 2 else 0,
                          seed=rng.randrange(1 << 30))
        clocks = None if job.waits else clocks_for(job, rng.uniform(0.0, 3.0), rng)
        found = lateness(job, clocks)
        what = (seed, case, world, per_pod, period, factor, slow_rank, job.waits, job.subgroups)
        if slow_rank is None:
            assert named(found) == [], what
        else:
            pod = next(p for p, members in pods.items() if slow_rank in members)
            assert named(found) == [pod], (what, found.get(pod))
            assert found[pod].rank == slow_rank, what
            # the cost: the others wait (factor - 1) x the compute a step of (factor x compute + transfer)
            expected = (factor - 1) / factor
            assert abs(found[pod].share - expected) < 0.08 + 0.5 * job.jitter * (world // per_pod) ** 0.5, (
                what, found[pod].share, expected)
