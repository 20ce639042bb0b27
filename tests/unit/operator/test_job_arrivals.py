"""The operator's merge of its sidecars' arrivals (engine/job_arrivals): each pod's clock offset from
the status round trips, within a bound that holds; arrivals kept bounded per job; a restarted rank's
old arrivals dropped; a pod that left forgotten."""

from __future__ import annotations

import random

from frscope.operator.engine.job_arrivals import KEPT_TOTAL, JobArrivals, PodClockEstimate, kept_each
from frscope.wire import SidecarStatus


def status(pod: str, arrivals: dict[int, dict[str, tuple[tuple[int, ...], ...]]], answered: int | None = None,
           asked: int | None = None, received: int | None = None) -> SidecarStatus:
    return SidecarStatus(pod=pod, namespace="ml", stalled=False, stalls=(), ranks_up=1, ranks_down=0,
                         arrivals=arrivals, answered_at_ns=answered, asked_ns=asked, received_ns=received)


def test_a_pods_clock_offset_is_measured_within_a_bound_that_holds() -> None:
    rng = random.Random(3)
    for _case in range(200):
        offset = rng.randint(-5 * 10**9, 5 * 10**9)  # pod minus operator
        est = PodClockEstimate()
        now = 10**18
        for _sweep in range(rng.randint(1, 12)):
            now += 15 * 10**9
            rtt = rng.choice([rng.randint(200_000, 2_000_000), rng.randint(10_000_000, 200_000_000)])
            asked = now
            answered = asked + rng.randint(0, rtt) + offset  # made at some moment of the round trip
            est.add(asked, answered, asked + rtt)
        clock = est.clock(now)
        assert clock is not None and abs(clock.offset_ns - offset) <= clock.bound_ns
        assert clock.bound_ns <= 101_000_000 + 1_200_000  # half the quickest round trip, plus the drift allowance


def test_arrivals_are_merged_per_pod_and_bounded_per_job() -> None:
    arrivals = JobArrivals()
    pods = {"a", "b"}
    arrivals.add({"a": status("a", {0: {"0": ((1, 10), (2, 20))}, 1: {"0": ((2, 25), (3, 30))}}),
                  "b": status("b", {2: {"0": ((1, 11), (2, 21, 5))}})}, pods)
    assert sorted(arrivals.arrivals()["a"]["0"]) == [2]  # only what both of its ranks reported
    assert arrivals.arrivals()["a"]["0"][2].late_rank == 1 and arrivals.ranks()["a"] == (0, 1)
    # a restarted rank: its seqs start again, the old ones go
    arrivals.add({"b": status("b", {2: {"0": ((1, 500),)}})}, pods)
    assert dict(arrivals.arrivals()["b"]["0"]).keys() == {1}
    # a pod that left is forgotten
    arrivals.add({}, {"a"})
    assert len(arrivals) == 1 and "b" not in arrivals.arrivals()
    # bounded: many pods keep fewer collectives each
    many = JobArrivals()
    names = [f"p{i}" for i in range(2048)]
    for start in range(0, 640, 64):
        many.add({p: status(p, {i: {"0": tuple((s, s * 1000) for s in range(start, start + 64))}})
                  for i, p in enumerate(names)}, set(names))
    kept = sum(len(g) for by_group in many.arrivals().values() for g in by_group.values())
    assert kept == 2048 * kept_each(2048) == KEPT_TOTAL and kept_each(2048) == 128
