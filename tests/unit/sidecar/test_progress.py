"""Stall tracking per (rank, group): progress as the analysis sees it, dated by the recorder's times."""

from __future__ import annotations

from typing import Any

import pytest

from frscope.records import normalize_dump
from frscope.sidecar.progress import GroupSample, StallTracker, sample_groups
from frscope.sidecar.status import arrivals_doc
from tests.unit.builders import T0, dump, entry

S = 1_000_000_000


def gloo(seqs_done: int, inflight: bool, *, created: dict[int, int] | None = None,
         timeout_ms: int = 1_800_000, pg: tuple[str, str] = ("0", "default_pg")) -> list[dict[str, Any]]:
    """Gloo-shaped entries: 'scheduled' only, done means retired."""
    out = []
    total = seqs_done + (1 if inflight else 0)
    for seq in range(1, total + 1):
        e = entry(seq, backend="gloo", pg=pg, state="scheduled", retired=seq <= seqs_done,
                  created_ns=(created or {}).get(seq, T0 + seq * S))
        e["timeout_ms"] = timeout_ms
        out.append(e)
    return out


def samples(entries: list[dict[str, Any]], rank: int = 0) -> dict[str, GroupSample]:
    return sample_groups(normalize_dump(dump(entries, world=2), "test", rank))


def test_sample_uses_the_analysis_notion_of_progress() -> None:
    got = samples(gloo(3, True) + gloo(1, False, pg=("1", "param_sync")))
    g0, g1 = got["0"], got["1"]
    assert (g0.last_enqueued_seq, g0.last_completed_seq, g0.inflight_op, g0.inflight_seq) == (4, 3, "all_reduce", 4)
    assert g0.desc == "default_pg" and g0.inflight_created_ns == T0 + 4 * S
    assert g0.inflight_timeout_ms == 1_800_000
    assert (g1.last_enqueued_seq, g1.last_completed_seq, g1.inflight) == (1, 1, False)


def test_nccl_completion_times_date_progress() -> None:
    entries = [entry(1, state="completed"), entry(2, state="started")]
    entries[0]["time_discovered_completed_ns"] = T0 + 50 * S
    got = samples(entries)["0"]
    assert got.inflight_seq == 2 and got.newest_progress_ns == T0 + 50 * S


def test_stall_flagged_once_threshold_passed_since_the_hung_collective_was_enqueued() -> None:
    tracker = StallTracker(stall_after_s=10, timeout_fraction=0.5)
    poll = S // 2
    t = T0 + 3 * S + 3 * poll // 2  # first poll: 3 done, nothing in flight (#4 comes at T0+4s)
    assert tracker.update(0, samples(gloo(3, False)), t, None) == []
    # #4 enqueued at T0+4s, seen by the next polls; stall at the first poll >= T0+14s
    flagged_at = None
    prev = t
    for i in range(1, 40):
        now = t + i * poll
        newly = tracker.update(0, samples(gloo(3, True)), now, prev)
        prev = now
        if newly:
            flagged_at = now
            assert newly[0].sample.inflight_seq == 4
            break
    assert flagged_at is not None
    enqueued = T0 + 4 * S
    assert 10 * S <= flagged_at - enqueued <= 10 * S + poll
    state = tracker.groups[(0, "0")]
    assert state.stalled and state.stalled_since_ns == flagged_at and state.stall_count == 1
    assert state.inflight_age_s(flagged_at) == pytest.approx((flagged_at - enqueued) / S)
    # still stalled: not newly stalled again
    assert tracker.update(0, samples(gloo(3, True)), flagged_at + poll, flagged_at) == []
    # the collective completes and the next one is enqueued: progress, no stall
    later = flagged_at + 2 * poll
    assert tracker.update(0, samples(gloo(4, True, created={5: later - poll // 4})), later, later - poll) == []
    assert not tracker.groups[(0, "0")].stalled and tracker.groups[(0, "0")].stalled_since_ns is None


def test_a_rank_that_is_not_in_flight_never_stalls() -> None:
    tracker = StallTracker(stall_after_s=1, timeout_fraction=0.5)
    for i in range(10):
        assert tracker.update(1, samples(gloo(3, False)), T0 + (100 + i) * S, T0 + (99 + i) * S) == []
    assert not tracker.stalled


def test_threshold_capped_by_the_entries_timeout() -> None:
    tracker = StallTracker(stall_after_s=60, timeout_fraction=0.5)
    s = samples(gloo(1, True, timeout_ms=10_000))
    assert tracker.threshold(s["0"]) == 5.0
    first = T0 + 2 * S + 1
    tracker.update(0, s, first, None)
    assert tracker.update(0, s, T0 + 7 * S, first)  # 5 s after #2 was enqueued, not 60


def test_first_sight_of_an_old_hang_is_flagged_at_once() -> None:
    # A sidecar (re)started while a rank has been blocked for minutes.
    tracker = StallTracker(stall_after_s=60, timeout_fraction=0.5)
    newly = tracker.update(0, samples(gloo(3, True)), T0 + 600 * S, None)
    assert [g.sample.inflight_seq for g in newly] == [4]


def test_change_seen_without_a_recorder_date_is_dated_by_the_poll() -> None:
    tracker = StallTracker(stall_after_s=5, timeout_fraction=1.0)
    old = {seq: T0 - (100 - seq) * S for seq in range(1, 5)}
    tracker.update(0, samples(gloo(3, True, created=old)), T0, None)  # flagged: old hang
    assert tracker.stalled
    # gloo retires #4 (no completion time): progress dated by this poll, not by #4's creation
    tracker.update(0, samples(gloo(4, False, created=old)), T0 + S, T0)
    assert tracker.groups[(0, "0")].progress_ns == T0 + S
    assert not tracker.stalled


def test_restarted_process_counts_as_progress() -> None:
    tracker = StallTracker(stall_after_s=5, timeout_fraction=1.0)
    tracker.update(0, samples(gloo(50, True)), T0 + 100 * S, None)
    assert tracker.stalled
    tracker.update(0, samples(gloo(1, False, created={1: T0 + 100 * S + 1})), T0 + 101 * S, T0 + 100 * S)
    assert not tracker.stalled


def test_forget_rank() -> None:
    tracker = StallTracker(stall_after_s=5, timeout_fraction=1.0)
    tracker.update(0, samples(gloo(1, False)), T0, None)
    tracker.update(1, samples(gloo(1, False)), T0, None)
    tracker.forget_rank(0)
    assert list(tracker.groups) == [(1, "0")]


def test_arrivals_carry_the_recorded_wait_where_the_recorder_dates_one() -> None:
    # NCCL with timing: duration_ms is the collective's wait plus transfer, what the operator compares
    # across pods without their clocks; gloo dates enqueues only.
    nccl = samples([entry(1, created_ns=T0 + S, duration_ms=12.5), entry(2, created_ns=T0 + 2 * S, duration_ms=0.25),
                    entry(3, created_ns=T0 + 3 * S, state="started")])["0"]
    assert nccl.arrivals == ((1, T0 + S), (2, T0 + 2 * S), (3, T0 + 3 * S))
    assert nccl.waits == ((1, 12_500_000), (2, 250_000))
    assert samples(gloo(3, False))["0"].waits == ()


def test_a_status_answer_lists_the_newest_arrivals_with_their_waits_where_dated() -> None:
    nccl = samples([entry(seq, created_ns=T0 + seq * S, duration_ms=0.5 if seq % 2 else None) for seq in range(1, 6)])
    assert arrivals_doc(nccl["0"], 3) == [[3, T0 + 3 * S, 500_000], [4, T0 + 4 * S], [5, T0 + 5 * S, 500_000]]
    assert arrivals_doc(nccl["0"], 0) == []  # a document with too many lists carries none
