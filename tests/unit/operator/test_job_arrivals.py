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


def test_a_hostile_status_document_is_read_within_its_totals_and_groups_are_capped() -> None:
    """Issue 34: 2 pods x 16 sweeps of documents with 1,000s of groups kept 691,968 arrivals. A document
    is read for at most STATUS_ARRIVALS_TOTAL arrivals, STATUS_MAX_GROUPS groups a rank and
    STATUS_MAX_RANKS ranks; a pod keeps at most MAX_GROUPS_PER_POD groups."""
    from frscope.operator.engine.job_arrivals import MAX_GROUPS_PER_POD
    from frscope.wire import parse_status
    from frscope.wire.status import STATUS_ARRIVALS_TOTAL, STATUS_MAX_GROUPS, STATUS_MAX_RANKS

    def document(pod: str, sweep: int) -> dict[str, object]:
        groups = {str(g): {"arrivals": [[sweep * 300 + i, 10**18 + i] for i in range(256)]} for g in range(400)}
        return {"schema": "frscope.sidecar.status/v1", "pod": pod, "namespace": "ml",
                "ranks": {str(r): {"up": True, "groups": groups} for r in range(STATUS_MAX_RANKS + 5)}}

    arrivals = JobArrivals()
    for sweep in range(16):
        parsed = {pod: parse_status(document(pod, sweep)) for pod in ("a", "b")}
        for got in parsed.values():
            assert sum(len(rows) for groups in got.arrivals.values() for rows in groups.values()) \
                <= STATUS_ARRIVALS_TOTAL
            assert all(len(groups) <= STATUS_MAX_GROUPS for groups in got.arrivals.values())
            assert len(got.ranks) == STATUS_MAX_RANKS
        arrivals.add(parsed, {"a", "b"})
    kept = sum(len(seqs) for groups in arrivals.arrivals().values() for seqs in groups.values())
    assert all(len(groups) <= MAX_GROUPS_PER_POD for groups in arrivals.arrivals().values())
    assert 0 < kept <= KEPT_TOTAL, kept
