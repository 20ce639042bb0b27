"""Live lateness across pods (frscope.analysis.pod_lateness): a slow node (every rank of one pod
late) is named with its cost; constant clock offsets within the skew bound and even jitter name
nobody; a pod whose ranks never meet another pod's in a group is not compared."""

from __future__ import annotations

import random

from frscope.analysis.pod_lateness import pod_lateness
from tests.unit.test_lateness import S, job

PODS = {"train-worker-0": (0, 1), "train-worker-1": (2, 3), "train-worker-2": (4, 5)}


def by_pod(arrivals: dict[int, dict[str, list[tuple[int, int]]]], offsets_s: dict[str, float] | None = None
           ) -> dict[str, dict[int, dict[str, list[tuple[int, int]]]]]:
    """The job's arrivals as each pod's sidecar reports them, each pod's clock off by its offset."""
    out: dict[str, dict[int, dict[str, list[tuple[int, int]]]]] = {}
    for pod, ranks in PODS.items():
        shift = int((offsets_s or {}).get(pod, 0.0) * S)
        out[pod] = {r: {g: [(seq, t + shift) for seq, t in pairs] for g, pairs in arrivals[r].items()} for r in ranks}
    return out


def test_a_pod_whose_ranks_are_all_late_is_named_with_its_cost() -> None:
    # a slow node: both ranks of train-worker-1 take 1.2x the others' step (one of them a little later)
    found = pod_lateness(by_pod(job(60, 0.25, {2: 0.05, 3: 0.055}, ranks=6)))
    slow = found["train-worker-1"]
    assert slow.straggler and not found["train-worker-0"].straggler and not found["train-worker-2"].straggler
    assert slow.rank == 3 and slow.ranks == (2, 3) and slow.group == "0"
    assert abs(slow.lateness_s - (0.055 - 0.02)) < 0.002  # beyond the default 20 ms skew bound
    assert slow.late == 60 and slow.compared == 120
    assert 0.09 <= slow.share <= 0.13


def test_constant_clock_offsets_within_the_bound_name_nobody() -> None:
    offsets = {"train-worker-0": -0.019, "train-worker-1": 0.0, "train-worker-2": 0.019}
    found = pod_lateness(by_pod(job(300, 0.2, {}, ranks=6, jitter_s=0.03, seed=7), offsets))
    assert sorted(found) == sorted(PODS) and not any(f.straggler for f in found.values())
    # the same offset beyond the bound reads as lateness: the bound is what the operator is told
    assert pod_lateness(by_pod(job(300, 0.2, {}, ranks=6), {"train-worker-2": 0.1}))["train-worker-2"].straggler


def test_healthy_jittery_jobs_name_nobody() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        found = pod_lateness(by_pod(job(240, rng.uniform(0.1, 1.0), {}, ranks=6, jitter_s=rng.uniform(0.0, 0.2),
                                        layers=rng.randint(1, 4), seed=seed)))
        assert not any(f.straggler for f in found.values()), (seed, found)


def test_a_group_inside_one_pod_is_not_compared() -> None:
    arrivals = job(60, 0.25, {1: 0.1}, ranks=2)
    assert pod_lateness({"train-worker-0": arrivals}) == {}
    # one rank per pod: the slow rank's pod is the slow pod
    found = pod_lateness({"a": {0: arrivals[0]}, "b": {1: arrivals[1]}})
    assert found["b"].straggler and found["b"].rank == 1 and not found["a"].straggler


def test_collectives_missed_between_sweeps_do_not_dilute_the_cost() -> None:
    full = by_pod(job(120, 0.25, {2: 0.07, 3: 0.07}, ranks=6))
    holes = {pod: {r: {g: [p for p in pairs if (p[0] // 10) % 3 != 1] for g, pairs in groups.items()}
                   for r, groups in by_rank.items()} for pod, by_rank in full.items()}
    whole, seen = pod_lateness(full)["train-worker-1"], pod_lateness(holes)["train-worker-1"]
    assert seen.straggler and seen.compared < whole.compared
    assert abs(seen.share - whole.share) < 0.02
