"""The push store in a storm: fresh evidence is held (a push past the budget or its job's quota is
refused with a retry delay), older evidence is evicted oldest first as before."""

from __future__ import annotations

import pytest

from frscope.operator.evidence import pod_evidence
from frscope.operator.evidence.pod_evidence import PodEvidence, from_snapshot
from frscope.operator.evidence.push_store import Full, PushStore
from frscope.operator.evidence.sidecars import parse_snapshot


def ev(pod: str, size: int, namespace: str = "ml") -> PodEvidence:
    snap = {"schema": "frscope.sidecar.snapshot/v1", "pod": pod, "namespace": namespace, "ranks": []}
    return from_snapshot(parse_snapshot(snap, "push", size_bytes=size), origin="push")


def test_past_the_budget_fresh_evidence_is_kept_and_the_push_refused() -> None:
    store = PushStore(max_bytes=100, hold_s=300)
    store.put(ev("p0", 40))
    store.put(ev("p1", 40))
    with pytest.raises(Full) as refused:
        store.put(ev("p2", 40))
    assert 1 <= refused.value.retry_after_s <= 300 and "budget 100" in refused.value.message
    assert store.get("ml", "p0") is not None and store.get("ml", "p1") is not None
    assert store.get("ml", "p2") is None and store.total_bytes == 80
    store.put(ev("p1", 50))  # a pod replacing its own push needs room only for the difference
    assert store.total_bytes == 90


def test_evidence_older_than_the_hold_is_evicted_oldest_first() -> None:
    store = PushStore(max_bytes=100, hold_s=0)
    for i in range(5):
        store.put(ev(f"p{i}", 40))
    assert len(store) == 2 and store.get("ml", "p4") is not None and store.get("ml", "p0") is None


def test_one_jobs_storm_cannot_take_the_whole_budget() -> None:
    store = PushStore(max_bytes=1000, hold_s=300, job_max_bytes=100)
    store.put(ev("big-0", 60), job="big")
    with pytest.raises(Full) as refused:
        store.put(ev("big-1", 60), job="big")
    assert "job ml/big" in refused.value.message and "quota 100" in refused.value.message
    store.put(ev("small-0", 60), job="small")  # another job still has room
    store.put(ev("other-ns", 60, namespace="prod"), job="big")  # same name, other namespace: another job
    assert store.get("ml", "small-0") is not None and store.get("prod", "other-ns") is not None
    assert store.get("ml", "big-1") is None


def test_a_push_counts_what_it_keeps_not_the_entries_it_drops(hang_ranks: dict[int, dict[str, object]]) -> None:
    """A sidecar pushes every rank's whole recorder; the operator keeps the newest `max_entries` of each
    rank. The budget counts what is kept, measured (tables, stacks, groups), not the body's size: a storm
    of long recorders holds as many pods as fit in memory, and kept stacks are counted whole (issue 34:
    three pushes kept 48 MiB of stacks counted as 21 KiB)."""
    snap = {"schema": "frscope.sidecar.snapshot/v1", "pod": "p0", "namespace": "ml", "ranks": [hang_ranks[0]]}
    whole = from_snapshot(parse_snapshot(snap, "push", size_bytes=10_000), origin="push", max_entries=0)
    entries = len(whole.dumps[0].entries)
    assert entries >= 4
    part = from_snapshot(parse_snapshot(snap, "push", size_bytes=10_000), origin="push", max_entries=entries // 2)
    assert part.entries_dropped == entries - entries // 2
    assert 0 < part.held_bytes < whole.held_bytes
    stacks = "Thread 0x1 (most recent call first):\n" + "  File \"train.py\", line 1 in step\n" * 200_000
    heavy = from_snapshot(parse_snapshot({**snap, "ranks": [{**hang_ranks[0], "stacks": stacks}]}, "push",
                                         size_bytes=10_000), origin="push", max_entries=entries // 2)
    kept = heavy.dumps[0].stacks
    assert kept is not None and len(kept) == pod_evidence.MAX_STACKS_CHARS < len(stacks)
    assert "thread stacks were cut" in heavy.dumps[0].warnings[-1]
    assert heavy.held_bytes > pod_evidence.MAX_STACKS_CHARS > 30 * part.held_bytes
    store = PushStore(max_bytes=5_000, hold_s=300)
    store.put(part)
    assert store.total_bytes == part.held_bytes
    with pytest.raises(Full):
        store.put(from_snapshot(parse_snapshot({**snap, "pod": "p1"}, "push", size_bytes=10_000), origin="push",
                                max_entries=0))
